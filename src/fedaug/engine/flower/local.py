"""A loopback trial of a Flower deployment: one SuperLink and one SuperNode per client on 127.0.0.1.

:class:`LoopbackTrial` lays out a trial directory (the app, one ``FLWR_HOME`` per process, logs,
optional TLS certificates and SuperNode keys) and gives the exact commands, to print for a person
to run in separate terminals or to start here. Every process it starts runs with Flower's
telemetry off, in its own process group, and is stopped (the whole group) when the trial ends,
also on errors.
"""

from __future__ import annotations

import os
import shlex
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO

from fedaug.core.errors import FedaugError
from fedaug.core.serialize import atomic_write_text
from fedaug.engine.flower.client_app import DEVICE, NUM_PARTITIONS, PARTITION_ID
from fedaug.engine.flower.tls import SuperNodeKeys, TlsFiles, warn_readable_keys, write_supernode_keys, write_tls

FEDERATION = "fedaug-local"
HOST = "127.0.0.1"


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((HOST, 0))
        return int(s.getsockname()[1])


@dataclass(frozen=True)
class Command:
    """One process of the trial: what it is, its arguments and its ``FLWR_HOME``."""

    name: str
    argv: list[str]
    home: Path

    def env(self) -> dict[str, str]:
        """This process's environment: ours, telemetry off, its own ``FLWR_HOME``, Flower's
        executables (next to this Python) first on ``PATH``."""
        bin_dir = str(Path(sys.executable).parent)
        return {**os.environ, "FLWR_TELEMETRY_ENABLED": "0", "FLWR_HOME": str(self.home),
                "PATH": bin_dir + os.pathsep + os.environ.get("PATH", "")}

    def shell(self) -> str:
        """The command as one shell line."""
        return f"FLWR_TELEMETRY_ENABLED=0 FLWR_HOME={shlex.quote(str(self.home))} {shlex.join(self.argv)}"


@dataclass
class LoopbackTrial:
    """A SuperLink and ``num_nodes`` SuperNodes on loopback, for the Flower app in ``app``.

    Args:
        app: the Flower app directory (``fedaug flower app``).
        workdir: the trial's directory (homes, logs, certificates, keys).
        num_nodes: one SuperNode per client; node ``k`` serves ``partition-id=k``.
        tls: TLS with a self-signed CA made for the trial (else ``--insecure``).
        auth: SuperNode authentication: each SuperNode gets a key pair, registered with the SuperLink.
        data_dirs: a ``data-dir`` per SuperNode (a real site's local data), or none.
        device: every SuperNode's ``device`` node config (``""``: the config's ``device``).
    """

    app: Path
    workdir: Path
    num_nodes: int
    tls: bool = False
    auth: bool = False
    data_dirs: Sequence[str] = ()
    device: str = ""
    link_port: int = field(default_factory=free_port)
    node_ports: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.num_nodes < 1:
            raise FedaugError(f"a trial needs at least one SuperNode, got {self.num_nodes}")
        if self.data_dirs and len(self.data_dirs) != self.num_nodes:
            raise FedaugError(f"give one data dir per SuperNode: {self.num_nodes} nodes, {len(self.data_dirs)} dirs")
        self.app, self.workdir = Path(self.app).resolve(), Path(self.workdir).resolve()
        self.node_ports = self.node_ports or [free_port() for _ in range(self.num_nodes)]

    # --- files ------------------------------------------------------------------------------
    @property
    def certs(self) -> TlsFiles:
        return TlsFiles.under(self.workdir / "certs")

    @property
    def keys(self) -> list[SuperNodeKeys]:
        return [SuperNodeKeys.under(self.workdir / "keys", k) for k in range(self.num_nodes)]

    def prepare(self) -> None:
        """Write the CLI's connection config and, as asked, the certificates and SuperNode keys (private
        keys 0600); warn about older keys in the trial that other users can read."""
        if self.tls:
            write_tls(self.certs.directory)
        if self.auth:
            for keys in self.keys:
                write_supernode_keys(keys)
        warn_readable_keys(self.certs.directory, self.workdir / "keys")
        security = f'root-certificates = "{self.certs.ca_cert}"' if self.tls else "insecure = true"
        atomic_write_text(self.workdir / "cli" / "config.toml",
                          f'[superlink]\ndefault = "{FEDERATION}"\n\n[superlink.{FEDERATION}]\n'
                          f'address = "{HOST}:{self.link_port}"\n{security}\n')

    # --- commands ---------------------------------------------------------------------------
    def superlink(self) -> Command:
        argv = ["flower-superlink", "--disable-runtime-dependency-installation", "--host", HOST,
                "--port", str(self.link_port)]
        if self.tls:
            c = self.certs
            argv += ["--ssl-ca-certfile", str(c.ca_cert), "--ssl-certfile", str(c.server_cert),
                     "--ssl-keyfile", str(c.server_key)]
        else:
            argv.append("--insecure")
        if self.auth:
            argv.append("--enable-supernode-auth")
        return Command("superlink", argv, self.workdir / "superlink")

    def register(self, k: int) -> Command:
        """Register SuperNode ``k``'s public key with the SuperLink (SuperNode authentication)."""
        return Command(f"register-{k}", ["flwr", "supernode", "register", str(self.keys[k].public), FEDERATION],
                       self.workdir / "cli")

    def supernode(self, k: int) -> Command:
        node_config = f"{PARTITION_ID}={k} {NUM_PARTITIONS}={self.num_nodes}"
        if self.data_dirs:
            node_config += f' data-dir="{self.data_dirs[k]}"'
        if self.device:
            node_config += f' {DEVICE}="{self.device}"'
        argv = ["flower-supernode", "--superlink", f"{HOST}:{self.link_port}", "--node-config", node_config,
                "--port", str(self.node_ports[k])]
        argv += ["--root-certificates", str(self.certs.ca_cert)] if self.tls else ["--insecure"]
        if self.auth:
            argv += ["--auth-supernode-private-key", str(self.keys[k].private)]
        return Command(f"supernode-{k}", argv, self.workdir / f"supernode-{k}")

    def flwr_run(self, stream: bool = True) -> Command:
        argv = ["flwr", "run", str(self.app), FEDERATION] + (["--stream"] if stream else [])
        return Command("run", argv, self.workdir / "cli")

    def commands(self) -> list[Command]:
        """Every command of the trial, in the order to run them."""
        registrations = [self.register(k) for k in range(self.num_nodes)] if self.auth else []
        return [self.superlink(), *registrations, *(self.supernode(k) for k in range(self.num_nodes)), self.flwr_run()]

    # --- running ----------------------------------------------------------------------------
    @contextmanager
    def running(self, startup_s: float = 60.0) -> Iterator[list[subprocess.Popen[bytes]]]:
        """Start the SuperLink and the SuperNodes; stop all of them (process groups) on exit.

        Raises:
            FedaugError: a process exited during start-up (its log's tail is in the message).
        """
        self.prepare()
        procs: list[subprocess.Popen[bytes]] = []
        try:
            link = self.superlink()
            procs.append(self.spawn(link))
            self._wait_listening(link, self.link_port, procs[0], startup_s)
            if self.auth:  # the registrations at once (each a CLI process of a few seconds)
                with ThreadPoolExecutor(self.num_nodes) as pool:
                    list(pool.map(lambda k: self.call(self.register(k), timeout=startup_s), range(self.num_nodes)))
            nodes = [self.supernode(k) for k in range(self.num_nodes)]
            procs += [self.spawn(node) for node in nodes]
            for node, port, proc in zip(nodes, self.node_ports, procs[1:]):
                self._wait_listening(node, port, proc, startup_s)
            yield procs
        finally:
            stop(procs)

    def call(self, command: Command, timeout: float | None = None,
             echo: TextIO | None = None) -> subprocess.CompletedProcess[str]:
        """Run ``command`` to its end, its output in ``<name>.log`` (and on ``echo``); raise if it fails
        or runs past ``timeout`` seconds (then its process group is stopped)."""
        log = self.workdir / f"{command.name}.log"
        proc = subprocess.Popen(command.argv, env=command.env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                start_new_session=True, text=True)
        expired = threading.Event()

        def expire() -> None:
            expired.set()
            stop([proc])

        timer = threading.Timer(timeout, expire) if timeout is not None else None
        try:
            if timer is not None:
                timer.start()
            with open(log, "w") as out:
                for line in proc.stdout:  # type: ignore[union-attr]
                    out.write(line)
                    if echo is not None:
                        echo.write(line)
                        echo.flush()
            rc = proc.wait()
        finally:
            if timer is not None:
                timer.cancel()
            stop([proc])
        text = log.read_text()
        if expired.is_set():
            raise FedaugError(f"'{command.shell()}' did not finish in {timeout:g} s; see {log}")
        if rc != 0:
            raise FedaugError(f"'{command.shell()}' failed (exit {rc}); last lines of {log}:\n{_tail(text)}")
        return subprocess.CompletedProcess(command.argv, rc, text)

    def spawn(self, command: Command) -> subprocess.Popen[bytes]:
        """Start ``command`` in its own process group, its output in ``<name>.log``."""
        command.home.mkdir(parents=True, exist_ok=True)
        out = open(self.workdir / f"{command.name}.log", "wb")  # noqa: SIM115 - the child owns it
        try:
            return subprocess.Popen(command.argv, env=command.env(), stdout=out, stderr=subprocess.STDOUT,
                                    start_new_session=True)
        finally:
            out.close()

    def _wait_listening(self, command: Command, port: int, proc: subprocess.Popen[bytes], timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                log = self.workdir / f"{command.name}.log"
                raise FedaugError(f"{command.name} exited with {proc.returncode} during start-up; last lines of "
                                  f"{log}:\n{_tail(log.read_text())}")
            with socket.socket() as s:
                if s.connect_ex((HOST, port)) == 0:
                    return
            time.sleep(0.2)
        raise FedaugError(f"nothing listens on {HOST}:{port} after {timeout:g} s; see the logs in {self.workdir}")


def stop(procs: Sequence[subprocess.Popen], grace_s: float = 10.0) -> None:
    """Stop each process: SIGTERM to it (it stops its own children), then SIGKILL to its whole
    process group for whatever is left after ``grace_s``; return once no member runs any more."""
    for proc in procs:
        if proc.poll() is None:
            proc.terminate()
    deadline = time.monotonic() + grace_s
    for proc in procs:
        try:
            proc.wait(timeout=max(deadline - time.monotonic(), 0.1))
        except subprocess.TimeoutExpired:
            pass
        _signal_group(proc, signal.SIGKILL)  # children (flwr-serverapp, flwr-clientapp) too
        proc.wait()
    while any(running_members(proc.pid) for proc in procs) and time.monotonic() < deadline + grace_s:
        time.sleep(0.05)  # SIGKILL is delivered asynchronously


def running_members(pgid: int) -> list[int]:
    """Process ids of the group's members that still run (zombies excluded; Linux ``/proc``, else empty)."""
    out = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
        except OSError:  # it ended while we looked
            continue
        state, _, pgrp = text[text.rindex(")") + 2:].split()[:3]
        if int(pgrp) == pgid and state not in ("Z", "X"):
            out.append(int(stat.parent.name))
    return out


def _signal_group(proc: subprocess.Popen, sig: int) -> None:
    try:
        os.killpg(proc.pid, sig)  # the process leads its own group (start_new_session)
    except ProcessLookupError:
        pass


def _tail(text: str, lines: int = 15) -> str:
    return "\n".join(text.splitlines()[-lines:])
