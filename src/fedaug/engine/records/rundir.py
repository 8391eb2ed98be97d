"""The run directory: resolved config, per-round JSON Lines, checkpoints, summary and report.

One process at a time writes a run directory: :meth:`RunDir.start` and ``RunDir.open(path,
write=True)`` take its :class:`~fedaug.engine.records.runlock.RunLock` (released by :meth:`RunDir.close`,
at the end of a ``with`` block, when the object is collected, or when the process ends) and clear
the temporary files a killed writer left. Readers (reports, ``fedaug compare``) take no lock.
"""

from __future__ import annotations

import errno
import gzip
import json
import os
import re
import time
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import TracebackType
from typing import Any

from fedaug.config.load import dump_toml, parse_config, read_toml
from fedaug.config.schema import RunConfig, run_name, with_legacy
from fedaug.core.errors import CheckpointError, FedaugError, RunStopped, StorageError
from fedaug.core.serialize import (atomic_write_json, atomic_write_text, load_tensors, remove_temporaries,
                                   save_tensors, to_json)
from fedaug.engine.records.runlock import RunLock

CONFIG, METRICS, SUMMARY, REPORT, CKPT_DIR = "config.toml", "metrics.jsonl", "summary.json", "report.md", "checkpoints"
#: the per-round records of an archived run (:mod:`fedaug.report.archive`): ``metrics.jsonl`` gzipped
METRICS_GZ = METRICS + ".gz"
#: where a resume keeps the ``metrics.jsonl`` lines it does not carry on (one JSON object per line)
ASIDE = "metrics.aside.jsonl"
#: one line per process that trained the run (its start, each resume): ``fedaug env``'s report
ENVIRONMENT = "environment.jsonl"
_CKPT = re.compile(r"round_(\d{6})\.pt$")
#: the layout version of a checkpoint (:meth:`fedaug.engine.server.loop.Server.checkpoint`) and the keys it holds
CHECKPOINT_FORMAT = 1
CHECKPOINT_KEYS = ("format", "round", "config", "server", "clients", "best", "last_eval", "comm_total")


def stored_config(run: Path) -> RunConfig:
    """The config of the run directory ``run`` as the run ran: its ``config.toml``, each key whose default became
    ``"auto"`` that it lacks set to its legacy value (:func:`~fedaug.config.schema.with_legacy`).

    Raises:
        ConfigError: the file is not a valid config.
        OSError: it cannot be read.
    """
    return parse_config(with_legacy(read_toml(Path(run) / CONFIG)))


def checkpoint_problem(payload: object) -> str | None:
    """Why ``payload`` is not a checkpoint this fedaug writes (``None`` when it is one): not a dict,
    another ``format``, or a dict without one of :data:`CHECKPOINT_KEYS`."""
    if not isinstance(payload, dict):
        return f"it holds a {type(payload).__name__}, not a dict"
    if payload.get("format") != CHECKPOINT_FORMAT:
        return f"its format is {payload.get('format')!r}, not {CHECKPOINT_FORMAT}"
    missing = [k for k in CHECKPOINT_KEYS if k not in payload]
    return f"it lacks {', '.join(map(repr, missing))}" if missing else None


def read_records(path: Path) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The round records of a ``metrics.jsonl`` file and the lines that are not among them; where
    the file is absent, those of its gzipped copy ``metrics.jsonl.gz`` (an archived run), if any.

    A line that is not JSON, or not an object with an integer ``round`` >= 1, is left out; so is
    a torn last line (no newline: the writer was killed mid-line), and every record of a round
    that a later line records again (the last record of a round is the one kept: the newest
    write; an older copy only comes from a second writer, which the run lock now prevents).

    Returns:
        ``(records, left_out)``: one record per round, by round; and ``{"line": 1-based number,
        "reason": why, "text": the line}`` for each line left out (blank lines are skipped).
    """
    if not path.is_file():
        packed = path.with_name(path.name + ".gz")
        if not packed.is_file():
            return [], []
        data = gzip.decompress(packed.read_bytes())
    else:
        data = path.read_bytes()
    lines = data.split(b"\n")
    by_round: dict[int, tuple[int, dict[str, Any]]] = {}
    left_out = []
    for number, raw in enumerate(lines, 1):
        if not raw.strip():
            continue
        text = raw.decode("utf-8", "backslashreplace")
        try:
            rec = json.loads(raw.decode())
        except ValueError:  # JSONDecodeError and UnicodeDecodeError
            torn = number == len(lines)  # the file does not end with a newline
            left_out.append({"line": number, "reason": "torn last line" if torn else "not JSON", "text": text})
            continue
        r = rec.get("round") if isinstance(rec, dict) else None
        if not isinstance(r, int) or isinstance(r, bool) or r < 1:
            left_out.append({"line": number, "reason": "not a round record", "text": text})
            continue
        if r in by_round:
            earlier, _ = by_round[r]
            left_out.append({"line": earlier, "reason": f"round {r} is recorded again at line {number}",
                             "text": lines[earlier - 1].decode("utf-8", "backslashreplace")})
        by_round[r] = number, rec
    return [by_round[r][1] for r in sorted(by_round)], sorted(left_out, key=lambda e: e["line"])


def _load_checkpoint(path: Path, fix: str) -> dict[str, Any]:
    """The payload of the checkpoint at ``path`` (:func:`~fedaug.core.serialize.load_tensors`).

    Raises:
        CheckpointError: it is unreadable, or not a checkpoint this fedaug writes
            (:func:`checkpoint_problem`); the message names it and ends with ``fix``.
    """
    payload = load_tensors(path, fix=fix)
    problem = checkpoint_problem(payload)
    if problem:
        raise CheckpointError(f"checkpoint '{path}' is not a fedaug checkpoint ({problem}); {fix}")
    return payload


def _spans(rounds: list[int]) -> str:
    """``[1, 2, 3, 7]`` -> ``"1-3, 7"``."""
    out: list[list[int]] = []
    for r in rounds:
        if out and r == out[-1][1] + 1:
            out[-1][1] = r
        else:
            out.append([r, r])
    return ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in out)


def _lines(left_out: list[dict[str, Any]]) -> str:
    return "; ".join(f"line {e['line']}: {e['reason']}" for e in left_out)


class RunDir:
    """One run's directory (DESIGN.md, "Run directory"); every write is atomic or append-fsynced.

    What :func:`~fedaug.engine.run.run_experiment` returns beside the summary. Its files:
    ``config.toml`` (the resolved config), ``metrics.jsonl`` (one record per round:
    :meth:`rounds`), ``summary.json`` (:meth:`read_summary`, once the run is finished),
    ``report.md`` and ``checkpoints/round_XXXXXX.pt`` (:meth:`checkpoints`).

    Args:
        path: the directory (created if missing).

    Attributes:
        path: the directory, a :class:`~pathlib.Path` (``fedaug resume <path>`` continues the run;
            ``os.fspath(run_dir)`` gives it too).

    >>> RunDir("runs/digits4-fedavg-20260101-120000")
    RunDir('runs/digits4-fedavg-20260101-120000')
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self._lock: RunLock | None = None

    def __repr__(self) -> str:
        return f"RunDir({str(self.path)!r})"

    def __fspath__(self) -> str:
        return str(self.path)

    @classmethod
    def create(cls, out_dir: str | os.PathLike[str], name: str) -> "RunDir":
        """A new, unique ``out_dir/name-YYYYmmdd-HHMMSS[-k]`` directory (not locked)."""
        base = Path(out_dir) / f"{re.sub(r'[^A-Za-z0-9_.+-]', '_', name)}-{time.strftime('%Y%m%d-%H%M%S')}"
        path, k = base, 1
        while True:
            try:
                path.mkdir(parents=True)
                return cls(path)
            except FileExistsError:
                path, k = base.with_name(f"{base.name}-{k}"), k + 1

    @classmethod
    def start(cls, cfg: RunConfig, out_dir: str | os.PathLike[str] | None = None) -> "RunDir":
        """A new run directory for ``cfg`` under ``out_dir`` (default ``cfg.out_dir``), locked for
        this process (:meth:`lock`), holding its resolved config."""
        run = cls.create(out_dir if out_dir is not None else cfg.out_dir, run_name(cfg))
        run.lock()
        run.write_config(cfg)
        return run

    @classmethod
    def open(cls, path: str | os.PathLike[str], *, write: bool = False) -> "RunDir":
        """An existing run directory; it must hold a ``config.toml``.

        Args:
            path: the directory.
            write: lock it for this process (:meth:`lock`), to continue the run.

        Raises:
            CheckpointError: ``path`` is not a run directory, or (``write``) another process
                writes it.
        """
        run = cls(path)
        if not (run.path / CONFIG).is_file():
            raise CheckpointError(
                f"'{run.path}' is not a fedaug run directory (no {CONFIG}); "
                "give the directory that 'fedaug run' printed"
            )
        return run.lock() if write else run

    # --- the writer lock ----------------------------------------------------------------------
    def lock(self, *, tidy: bool = True) -> "RunDir":
        """Take the directory's writer lock (:class:`~fedaug.engine.records.runlock.RunLock`), then (with
        ``tidy``) delete the temporary files a killed writer left (:meth:`tidy`).

        Raises:
            CheckpointError: another process, or another :class:`RunDir` of this one, holds it.
        """
        if self._lock is None or not self._lock.held:
            self._lock = RunLock.acquire(self.path)
            if tidy:
                self.tidy()
        return self

    def tidy(self) -> None:
        """Delete the temporary files a killed writer left here and in ``checkpoints/``."""
        remove_temporaries(self.path)
        remove_temporaries(self.path / CKPT_DIR)

    def close(self) -> None:
        """Release the writer lock, if this object holds it (idempotent)."""
        if self._lock is not None:
            self._lock.release()

    @contextmanager
    def untouched_if_refused(self) -> Iterator[None]:
        """A block that only reads the directory (a resume's checks): where it raises, the writer lock
        is released leaving the lock file as :meth:`lock` found it
        (:meth:`~fedaug.engine.records.runlock.RunLock.release_untouched`), so a refused resume leaves
        the directory byte for byte as it was."""
        try:
            yield
        except BaseException as exc:
            self._name_in(exc)
            if self._lock is not None:
                self._lock.release_untouched()
            raise

    def _name_in(self, exc: BaseException | None) -> None:
        """Let an interruption or a stop name this run directory (the CLI says: 'fedaug resume <it>')."""
        if isinstance(exc, (KeyboardInterrupt, RunStopped)) and not hasattr(exc, "run_dir"):
            exc.run_dir = str(self.path)  # type: ignore[attr-defined]

    def __enter__(self) -> "RunDir":
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self._name_in(exc)
        self.close()

    @contextmanager
    def _writing(self, path: Path) -> Iterator[None]:
        """Turn an ``OSError`` of a write to ``path`` (a full disk, ``ENOSPC``) into one message.

        Raises:
            StorageError: naming ``path``, the cause, and that the run resumes once it is fixed
                (every write is atomic or an fsynced append: what was written before is intact).
        """
        try:
            yield
        except FedaugError:
            raise
        except OSError as exc:
            fix = "free space on its disk" if exc.errno in (errno.ENOSPC, errno.EDQUOT) else "fix that"
            raise StorageError(
                f"cannot write '{path}': {exc.strerror or exc}; the records and checkpoints written before are intact "
                f"and the run is resumable: {fix}, then run 'fedaug resume {self.path}'") from None

    def _append(self, name: str, lines: str) -> None:
        """Append ``lines`` to the file ``name`` and fsync it."""
        with self._writing(self.path / name), open(self.path / name, "a") as f:
            f.write(lines)
            f.flush()
            os.fsync(f.fileno())

    def _replace(self, name: str, text: str) -> None:
        """Write the file ``name`` atomically."""
        with self._writing(self.path / name):
            atomic_write_text(self.path / name, text)

    # --- config -------------------------------------------------------------------------------
    def write_config(self, cfg: RunConfig) -> None:
        self._replace(CONFIG, dump_toml(cfg.to_dict()))

    # --- per-round records --------------------------------------------------------------------
    def append_round(self, record: dict[str, Any]) -> None:
        """Append one strict JSON line (non-finite floats as ``null``) and fsync it."""
        self._append(METRICS, to_json(record) + "\n")

    def rounds(self) -> list[dict[str, Any]]:
        """One record per round, by round (:func:`read_records`): a line that cannot be read is
        skipped with a warning (a torn last line from a killed run silently), the valid records
        after it are kept; of a round recorded twice, the last record counts."""
        records, left_out = read_records(self.path / METRICS)
        shown = [e for e in left_out if e["reason"] != "torn last line"]
        if shown:
            warnings.warn(f"'{self.path / METRICS}': skipped {_lines(shown)}; the other records are used "
                          f"('fedaug resume' moves such lines to {ASIDE})", stacklevel=2)
        return records

    def check_records(self, last: int) -> None:
        """Check that ``metrics.jsonl`` records every round ``1..last`` (those a checkpoint at ``last``
        covers), which a resume from it keeps.

        Raises:
            CheckpointError: a round in ``1..last`` has no record; the message names them and the fix.
        """
        records, _ = read_records(self.path / METRICS)
        missing = sorted(set(range(1, last + 1)) - {r["round"] for r in records})
        if missing:
            fix = (f"delete the checkpoints after round {missing[0] - 1} in {CKPT_DIR}/ to resume from an earlier "
                   "one (with none left the run starts again from round 1)" if missing[0] > 1
                   else f"delete {CKPT_DIR}/ to run it again from round 1")
            raise CheckpointError(
                f"cannot resume '{self.path}': its newest checkpoint is at round {last}, but {METRICS} has no "
                f"record of round {_spans(missing)}, which the finished run would lack; {fix}, or restore the "
                "missing records")

    def truncate_rounds(self, last: int) -> None:
        """Keep the records of rounds ``1..last`` (the rounds a checkpoint at ``last`` covers) and
        drop later ones, which the resumed run records again; lines that are not kept records
        (:func:`read_records`) are appended to ``metrics.aside.jsonl`` first, with a warning.
        ``metrics.jsonl`` is rewritten atomically.

        Raises:
            CheckpointError: a round in ``1..last`` has no record (:meth:`check_records`; nothing is
                changed then).
        """
        self.check_records(last)
        records, left_out = read_records(self.path / METRICS)
        if left_out:
            self._append(ASIDE, "".join(to_json({**e, "file": METRICS}) + "\n" for e in left_out))
            shown = [e for e in left_out if e["reason"] != "torn last line"]
            if shown:
                warnings.warn(f"'{self.path / METRICS}': moved {_lines(shown)} to {ASIDE}; the valid records "
                              "around them are kept", stacklevel=2)
        self._keep_records(records, last)

    def _keep_records(self, records: list[dict[str, Any]], last: int) -> None:
        """Rewrite ``metrics.jsonl`` atomically with the ``records`` of rounds ``1..last``."""
        self._replace(METRICS, "".join(to_json(r) + "\n" for r in records if r["round"] <= last))

    def append_environment(self, from_round: int, report: dict[str, Any]) -> None:
        """Append this process's installation (``report``: :func:`fedaug.engine.records.installation.installation`,
        what ``fedaug env`` prints) to ``environment.jsonl``, with the round it trains from (0: the start)
        and the time (UTC)."""
        now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        self._append(ENVIRONMENT, to_json({"from_round": from_round, "at": now, **report}) + "\n")

    # --- checkpoints --------------------------------------------------------------------------
    def checkpoints(self) -> list[tuple[int, Path]]:
        """``(round, path)`` of every checkpoint, oldest first."""
        d = self.path / CKPT_DIR
        found = [(int(m.group(1)), p) for p in d.glob("round_*.pt") if (m := _CKPT.search(p.name))]
        return sorted(found)

    def save_checkpoint(self, round: int, payload: dict[str, Any], keep: int) -> None:
        """Write ``checkpoints/round_XXXXXX.pt`` atomically, then delete all but the ``keep`` newest."""
        path = self.path / CKPT_DIR / f"round_{round:06d}.pt"
        with self._writing(path):
            save_tensors(path, payload)
        for _, old in self.checkpoints()[:-keep]:
            old.unlink()

    def load_latest(self) -> dict[str, Any] | None:
        """The newest checkpoint's payload, or ``None`` when there is none.

        Raises:
            CheckpointError: the newest checkpoint is corrupt or not a fedaug checkpoint; the
                message names it and the checkpoint a resume falls back to once it is deleted.
        """
        found = self.checkpoints()
        if not found:
            return None
        fallback = (f"the previous checkpoint, {found[-2][1].name}" if len(found) > 1
                    else "round 1 (it is the only checkpoint)")
        return _load_checkpoint(found[-1][1], f"delete it and resume again to continue from {fallback}")

    def _checkpoints_for(self, round: int) -> dict[int, Path]:
        """Every checkpoint by round, once ``round`` is known to have one (or is 0, the start).

        Raises:
            CheckpointError: ``round`` has no checkpoint (the message lists the rounds that have one).
        """
        found = dict(self.checkpoints())
        if round and round not in found:
            have = ", ".join(map(str, found)) or "none"
            raise CheckpointError(
                f"'{self.path}' has no checkpoint of round {round} (it keeps the newest keep_checkpoints; rounds with "
                f"one: {have}); resume from one of them, or from round 0 to run it again from round 1")
        return found

    def load_round(self, round: int) -> dict[str, Any] | None:
        """The payload of ``round``'s checkpoint (``None`` for round 0, the start); nothing is changed.

        Raises:
            CheckpointError: ``round`` has no checkpoint (the message lists the rounds that have one),
                or it is unreadable or not a fedaug checkpoint.
        """
        found = self._checkpoints_for(round)
        return _load_checkpoint(found[round], "resume from another round") if round else None

    def rewind(self, round: int) -> None:
        """Go back to the end of ``round`` (0: the start; :meth:`load_round` gives its payload): every
        later checkpoint is deleted and the records of later rounds are moved to ``metrics.aside.jsonl``
        (reason ``"abandoned: resumed from round K"``), so a state that no client can train from
        (docs/engine.md, "The trust boundary") is never the only way forward.

        Raises:
            CheckpointError: ``round`` has no checkpoint (nothing is changed then).
        """
        found = self._checkpoints_for(round)
        records, _ = read_records(self.path / METRICS)
        later = [r for r in records if r["round"] > round]
        if later:
            self._append(ASIDE, "".join(to_json({"round": r["round"], "reason": f"abandoned: resumed from round {round}",
                                                 "file": METRICS, "record": r}) + "\n" for r in later))
            self._keep_records(records, round)
        for r, path in found.items():
            if r > round:
                path.unlink()

    # --- summary and report -------------------------------------------------------------------
    def write_summary(self, summary: dict[str, Any]) -> None:
        with self._writing(self.path / SUMMARY):
            atomic_write_json(self.path / SUMMARY, summary)

    def write_report(self, markdown: str) -> None:
        self._replace(REPORT, markdown)

    def read_summary(self) -> dict[str, Any] | None:
        path = self.path / SUMMARY
        return json.loads(path.read_text()) if path.is_file() else None
