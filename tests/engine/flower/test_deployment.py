"""A real Flower deployment on loopback: a SuperLink and SuperNodes started here, rounds run with ``flwr
run``, every process stopped afterwards: FedFA under the median over three SuperNodes, one of them attacking,
with TLS (a trial CA) and SuperNode authentication. Slow (each message starts a ClientApp process that imports
torch)."""

from __future__ import annotations

import time

import pytest

pytest.importorskip("flwr", reason="the Flower adapter's tests need the flower extra: pip install 'fedaug[flower]'")

from fedaug.config.schema import validate  # noqa: E402
from fedaug.engine.flower.app import write_app  # noqa: E402
from fedaug.engine.flower.local import Command, LoopbackTrial, free_port, running_members, stop  # noqa: E402
from fedaug.engine.flower.tls import SuperNodeKeys, write_supernode_keys  # noqa: E402
from fedaug.engine.run import run_experiment  # noqa: E402
from tests.conftest import tiny_raw  # noqa: E402
from tests.engine.flower.conftest import records  # noqa: E402

pytestmark = pytest.mark.slow


def test_stop_ends_a_process_group_and_running_members_sees_it(tmp_path):
    trial = LoopbackTrial(tmp_path / "app", tmp_path, 1)
    proc = trial.spawn(Command("sleeper", ["sh", "-c", "sleep 60 & wait"], tmp_path / "home"))
    try:
        for _ in range(600):  # until the shell has started its child
            if len(running_members(proc.pid)) == 2:
                break
            time.sleep(0.05)
        assert proc.pid in running_members(proc.pid) and len(running_members(proc.pid)) == 2
    finally:
        stop([proc], grace_s=1.0)
    assert running_members(proc.pid) == []


def run_trial(tmp_path, cfg, nodes, **security):
    """``cfg`` over ``nodes`` SuperNodes (each message starts a ClientApp process that imports torch: a round
    costs tens of seconds); the run's directory."""
    app = write_app(cfg, tmp_path / "app", round_timeout=300, connect_timeout=120)
    trial = LoopbackTrial(app, tmp_path, nodes, **security)
    with trial.running() as procs:
        assert len(procs) == nodes + 1 and all(p.poll() is None for p in procs)
        trial.call(trial.flwr_run(), timeout=420)
        intruder = None
        if security.get("auth"):  # a SuperNode whose key was never registered is turned away
            keys = write_supernode_keys(SuperNodeKeys.under(tmp_path / "keys", 9))
            argv = trial.supernode(1).argv
            argv[argv.index("--auth-supernode-private-key") + 1] = str(keys.private)
            argv[argv.index("--port") + 1] = str(free_port())
            intruder = trial.spawn(Command("intruder", argv + ["--max-retries", "1"], tmp_path / "intruder"))
            try:
                assert intruder.wait(timeout=120) != 0
            finally:
                stop([intruder])
    assert not any(running_members(p.pid) for p in procs + ([intruder] if intruder else []))  # all stopped
    (run_dir,) = (tmp_path / "runs").iterdir()
    return run_dir


def in_process_records(cfg, tmp_path):
    cfg.out_dir = str(tmp_path / "in-process")
    _, run_dir = run_experiment(cfg, quiet=True)
    return records(run_dir.path)


def test_loopback_deployment_with_tls_authentication_and_an_attacking_supernode_gives_the_in_process_numbers(tmp_path):
    """Two rounds of FedFA (its statistics travel beside the weights) under the median, over three SuperNodes, with
    TLS (a trial CA) and SuperNode authentication (a SuperNode whose key was never registered is turned away);
    ``[attack]`` travels in the run config, so the SuperNode of partition 2 scales its update by 100 by itself
    (update screening off: nothing is rejected), and the median keeps the run going. Evaluated after the last
    round only. (The clear trial's commands differ only in their flags: tests/cli/test_flower_cmd.py.)"""
    raw = tiny_raw(rounds=2, local_steps=2)
    raw.update(out_dir=str(tmp_path / "runs"), method={"base": "median", "augs": ["fedfa"]}, trust={"screen": "off"},
               attack={"kind": "scale", "clients": [2], "scale": 100.0}, eval={"every": 2})
    cfg = validate(raw)
    got = records(run_trial(tmp_path, cfg, 3, tls=True, auth=True))
    assert [r["round"] for r in got] == [1, 2] and "eval" not in got[0] and "eval" in got[1]
    assert all(r["attack"] == {"kind": "scale", "clients": [2]} and r["rejected"] == [] and r["dropped"] == []
               for r in got)
    assert got == in_process_records(cfg, tmp_path)
    assert (tmp_path / "certs" / "ca.crt").is_file()
    assert all("registered successfully" in (tmp_path / f"register-{k}.log").read_text() for k in range(3))
