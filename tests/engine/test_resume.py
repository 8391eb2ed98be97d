"""Resume: an interrupted run (exception or SIGKILL) finishes with exactly the uninterrupted numbers."""

from __future__ import annotations

import json
import os
import shutil
import warnings
from pathlib import Path

import pytest
import torch

from fedaug.config.load import dump_toml, read_toml
from fedaug.config.schema import validate
from fedaug.core.errors import CheckpointError, ConfigError
from fedaug.core.serialize import load_tensors, save_tensors
from fedaug.engine.records.rundir import RunDir
from fedaug.engine.records.runlock import LOCK
from fedaug.engine.run import ready_to_resume, resume_experiment, run_experiment
from tests.conftest import tiny_raw
from tests.engine.runs import kill_and_resume
from tests.engine.test_runlock import holder


def comparable(run_dir: Path):
    recs = RunDir(run_dir).rounds()
    return [{k: v for k, v in r.items() if k != "time"} for r in recs]


def summary_numbers(run_dir: Path):
    s = json.loads((run_dir / "summary.json").read_text())
    return s["final"], s["best"], s["comm_total"]


def test_resume_after_an_exception_equals_uninterrupted(tmp_path, monkeypatch):
    raw = tiny_raw(rounds=5)
    raw.update(out_dir=str(tmp_path / "a"), checkpoint_every=2)
    cfg = validate(raw)
    _, full = run_experiment(cfg, quiet=True)

    from fedaug.engine import run as simulate

    original = simulate.Simulation.run_round

    def crash_in_round_4(self, r):
        if r == 4:
            raise KeyboardInterrupt
        return original(self, r)

    raw["out_dir"] = str(tmp_path / "b")
    monkeypatch.setattr(simulate.Simulation, "run_round", crash_in_round_4)
    with pytest.raises(KeyboardInterrupt):
        run_experiment(validate(raw), quiet=True)
    monkeypatch.setattr(simulate.Simulation, "run_round", original)
    (part,) = list((tmp_path / "b").iterdir())
    assert [r["round"] for r in RunDir(part).rounds()] == [1, 2, 3]
    assert not (part / LOCK).exists()  # the failed run released its lock
    resume_experiment(str(part), quiet=True)
    assert comparable(part) == comparable(full.path)
    assert summary_numbers(part) == summary_numbers(full.path)


def test_resume_after_sigkill_between_checkpoints_equals_uninterrupted(tmp_path):
    raw = tiny_raw(rounds=8)
    raw.update(out_dir=str(tmp_path / "runs"), checkpoint_every=3, name="killed")
    run_dir = kill_and_resume(validate(raw).to_dict(), tmp_path, 4)
    raw["out_dir"] = str(tmp_path / "ref")
    _, ref = run_experiment(validate(raw), quiet=True)
    assert comparable(run_dir) == comparable(ref.path)
    assert summary_numbers(run_dir) == summary_numbers(ref.path)


def test_corrupted_checkpoint_is_reported_and_nothing_is_damaged(tmp_path):
    raw = tiny_raw(rounds=2)
    raw.update(out_dir=str(tmp_path), checkpoint_every=1)
    _, run = run_experiment(validate(raw), quiet=True)
    ckpt = run.checkpoints()[-1][1]
    ckpt.write_bytes(b"garbage")
    before = (run.path / "metrics.jsonl").read_text()
    with pytest.raises(CheckpointError, match=r"round_000002.pt' is corrupt or not a fedaug checkpoint \(.*\); "
                                              r"delete it and resume again to continue from the previous "
                                              r"checkpoint, round_000001.pt$") as info:
        resume_experiment(str(run.path), quiet=True)
    assert "weights_only" not in str(info.value)
    assert (run.path / "metrics.jsonl").read_text() == before
    assert not (run.path / LOCK).exists()


def test_resume_refuses_a_directory_that_is_not_a_run(tmp_path):
    with pytest.raises(CheckpointError, match=r"is not a fedaug run directory \(no config.toml\)"):
        resume_experiment(str(tmp_path), quiet=True)


def test_checkpoints_are_pruned_to_keep(tmp_path):
    raw = tiny_raw(rounds=4)
    raw.update(out_dir=str(tmp_path), checkpoint_every=1, keep_checkpoints=2)
    _, run = run_experiment(validate(raw), quiet=True)
    assert [r for r, _ in run.checkpoints()] == [3, 4]


def interrupted(tmp_path: Path, raw: dict, after: int) -> tuple[Path, Path]:
    """A finished run of ``raw`` (a checkpoint every round, all kept) and a copy of it as a kill
    after round ``after`` leaves it."""
    raw.update(out_dir=str(tmp_path / "full"), checkpoint_every=1, keep_checkpoints=raw["train"]["rounds"])
    _, full = run_experiment(validate(raw), quiet=True)
    part = tmp_path / "part" / full.path.name
    part.parent.mkdir()
    shutil.copytree(full.path, part)
    (part / "summary.json").unlink()
    for r, ckpt in RunDir(part).checkpoints():
        if r > after:
            ckpt.unlink()
    RunDir(part).truncate_rounds(after)
    return full.path, part


def test_a_second_writer_is_refused_and_nothing_is_touched(tmp_path):
    _, part = interrupted(tmp_path, tiny_raw(rounds=3), 2)
    before = {p.name: p.read_bytes() for p in [part / "metrics.jsonl", *(c for _, c in RunDir(part).checkpoints())]}
    with RunDir.open(part, write=True):  # a run or resume still going
        with pytest.raises(CheckpointError, match=rf"run directory '{part}' is in use by pid {os.getpid()} \(this "
                                                  r"process\).*; only one process may write a run directory: wait "
                                                  rf"for that one to finish, or stop it \(kill {os.getpid()}\) and "
                                                  rf"then run 'fedaug resume {part}' again"):
            resume_experiment(str(part), quiet=True)
    assert before == {p.name: p.read_bytes() for p in [part / "metrics.jsonl",
                                                       *(c for _, c in RunDir(part).checkpoints())]}
    assert not (part / "summary.json").exists()


def test_a_corrupt_record_line_is_moved_aside_and_the_resumed_run_equals_uninterrupted(tmp_path):
    full, part = interrupted(tmp_path, tiny_raw(rounds=4), 3)
    lines = (part / "metrics.jsonl").read_text().splitlines(keepends=True)
    (part / "metrics.jsonl").write_text(lines[0] + "\x00\x00 damaged\n" + "".join(lines[1:]))
    orphan = part / "checkpoints" / ".round_000004.pt.0f1e2d3c.tmp"  # a kill during the save of round 4
    orphan.write_bytes(b"half a checkpoint")
    with pytest.warns(UserWarning, match=r"moved line 2: not JSON to metrics\.aside\.jsonl"):
        resume_experiment(str(part), quiet=True)
    assert comparable(part) == comparable(full)  # rounds 2 and 3, after the bad line, were kept
    assert summary_numbers(part) == summary_numbers(full)
    assert json.loads((part / "metrics.aside.jsonl").read_text()) == {
        "file": "metrics.jsonl", "line": 2, "reason": "not JSON", "text": "\x00\x00 damaged"}
    assert not orphan.exists()


def test_resume_refuses_when_records_the_checkpoint_covers_are_missing(tmp_path):
    _, part = interrupted(tmp_path, tiny_raw(rounds=4), 3)
    lines = (part / "metrics.jsonl").read_text().splitlines(keepends=True)
    (part / "metrics.jsonl").write_text(lines[0] + lines[2])  # round 2 lost
    before = (part / "metrics.jsonl").read_text()
    with pytest.raises(CheckpointError, match=r"its newest checkpoint is at round 3, but metrics\.jsonl has no record "
                                              r"of round 2, which the finished run would lack; delete the "
                                              r"checkpoints after round 1 in checkpoints/ to resume from an earlier "
                                              r"one \(with none left the run starts again from round 1\), or "
                                              r"restore the missing records"):
        resume_experiment(str(part), quiet=True)
    assert (part / "metrics.jsonl").read_text() == before and [r for r, _ in RunDir(part).checkpoints()] == [1, 2, 3]
    for r in (2, 3):  # what the message says to do
        (part / "checkpoints" / f"round_00000{r}.pt").unlink()
    resume_experiment(str(part), quiet=True)
    assert [r["round"] for r in RunDir(part).rounds()] == [1, 2, 3, 4]


def test_resume_takes_over_the_lock_of_a_killed_writer(tmp_path):
    full, part = interrupted(tmp_path, tiny_raw(rounds=3), 2)
    proc = holder(part, "kill")
    proc.wait(timeout=60)
    with pytest.warns(UserWarning, match=rf"was locked by pid {proc.pid} on host .*, which ended without releasing "
                                         r"it \(killed\?\); taking the lock over"):
        resume_experiment(str(part), quiet=True)
    assert comparable(part) == comparable(full) and not (part / LOCK).exists()


def interrupted_fedfa_run(tmp_path: Path) -> tuple[Path, Path]:
    """A finished 3-round FedFA run and a copy of it as a kill after round 2 leaves it."""
    raw = tiny_raw(rounds=3)
    raw["method"] = {"base": "fedavg", "augs": ["fedfa"]}
    return interrupted(tmp_path, raw, 2)


def set_kernel(run: Path, value: str | None) -> None:
    """Write ``method.options.fedfa.kernel = value`` into the run's config.toml (``None``: remove it)."""
    raw = read_toml(run / "config.toml")
    options = raw["method"].setdefault("options", {}).setdefault("fedfa", {})
    options.pop("kernel", None)
    if value is not None:
        options["kernel"] = value
    (run / "config.toml").write_text(dump_toml(raw))


def test_a_run_records_its_kernel_mode_in_config_and_checkpoints(tmp_path):
    full, part = interrupted_fedfa_run(tmp_path)
    assert read_toml(full / "config.toml")["method"]["options"] == {"fedfa": {"kernel": "off"}}  # not set: default
    assert load_tensors(part / "checkpoints" / "round_000002.pt")["config"]["method"]["options"] == {
        "fedfa": {"kernel": "off"}}
    raw = tiny_raw(rounds=1)
    raw["out_dir"] = str(tmp_path / "fedavg")
    _, run = run_experiment(validate(raw), quiet=True)
    assert read_toml(run.path / "config.toml")["method"].get("options", {}) == {}  # nothing to record


def test_resume_refuses_a_different_kernel_mode(tmp_path):
    _, part = interrupted_fedfa_run(tmp_path)
    set_kernel(part, "on")
    before = (part / "metrics.jsonl").read_text()
    with pytest.raises(ConfigError, match=r"cannot resume '.*': method\.options\.fedfa\.kernel: the run's checkpoints "
                                          r"were made with 'off' but its config\.toml now gives 'on'; a run continues "
                                          r"on the path it started on: set kernel = 'off'"):
        resume_experiment(str(part), quiet=True)
    assert (part / "metrics.jsonl").read_text() == before  # nothing was touched


def test_a_run_from_before_the_record_resumes_only_once_its_config_says_how_it_ran(tmp_path):
    full, part = interrupted_fedfa_run(tmp_path)
    # what a run started before the option existed holds: no kernel key in its config or checkpoints
    set_kernel(part, None)
    for ckpt in (part / "checkpoints").glob("*.pt"):
        payload = load_tensors(ckpt)
        del payload["config"]["method"]["options"]["fedfa"]
        save_tensors(ckpt, payload)
    with pytest.raises(ConfigError, match=r"method\.options\.fedfa\.kernel is not recorded: the run was started "
                                          r"before fedaug recorded it and ran with kernel = 'auto' \(.*\); write the "
                                          r"value it ran with into .*config\.toml \(\[method\.options\.fedfa\] "
                                          r"kernel = \.\.\.\) and resume again"):
        resume_experiment(str(part), quiet=True)
    set_kernel(part, "off")  # the user says which path it took (this one did take "off")
    resume_experiment(str(part), quiet=True)
    assert comparable(part) == comparable(full)
    assert summary_numbers(part) == summary_numbers(full)


def test_a_run_from_before_a_default_changed_resumes_with_the_value_it_ran_with(tmp_path):
    # VFDA's noise_scale was "variance" before it was recorded and its default became "std"
    raw = tiny_raw(rounds=3)
    raw["method"] = {"base": "fedavg", "augs": ["vfda"], "options": {"vfda": {"noise_scale": "variance"}}}
    full, part = interrupted(tmp_path, raw, 2)
    stored = read_toml(part / "config.toml")
    del stored["method"]["options"]["vfda"]["noise_scale"]
    (part / "config.toml").write_text(dump_toml(stored))
    for ckpt in (part / "checkpoints").glob("*.pt"):
        payload = load_tensors(ckpt)
        del payload["config"]["method"]["options"]["vfda"]["noise_scale"]
        save_tensors(ckpt, payload)
    resume_experiment(str(part), quiet=True)
    assert comparable(part) == comparable(full)
    assert summary_numbers(part) == summary_numbers(full)
    default = tiny_raw(rounds=1)
    default["method"] = {"base": "fedavg", "augs": ["vfda"]}
    default["out_dir"] = str(tmp_path / "default")
    _, run = run_experiment(validate(default), quiet=True)
    assert read_toml(run.path / "config.toml")["method"]["options"]["vfda"] == {"kernel": "off", "noise_scale": "std"}


@pytest.mark.parametrize("kept", ["false", "absent"])
def test_a_run_from_before_the_auto_defaults_resumes_with_false_to_the_uninterrupted_numbers(tmp_path, kept):
    """train.cuda_graph and data.on_device became "auto": a run written before holds them false in its config.toml
    and checkpoints, or, older, not at all (it ran with false); either resumes with false (on CUDA too: the steps it
    began with) to the numbers of the run not interrupted."""
    raw = tiny_raw(rounds=3, cuda_graph=False)
    raw["data"]["on_device"] = False
    full, part = interrupted(tmp_path, raw, 2)
    if kept == "absent":
        stored = read_toml(part / "config.toml")
        del stored["train"]["cuda_graph"], stored["data"]["on_device"]
        (part / "config.toml").write_text(dump_toml(stored))
        for ckpt in (part / "checkpoints").glob("*.pt"):
            payload = load_tensors(ckpt)
            del payload["config"]["train"]["cuda_graph"], payload["config"]["data"]["on_device"]
            save_tensors(ckpt, payload)
    _, cfg, sim = ready_to_resume(RunDir(part))
    sim.close()
    assert (cfg.train.cuda_graph, cfg.data.on_device) == (False, False)
    resume_experiment(str(part), quiet=True)
    assert comparable(part) == comparable(full)
    assert summary_numbers(part) == summary_numbers(full)


def test_resume_warns_when_the_checkpoint_was_written_on_other_cpu_kernels(tmp_path):
    """A checkpoint records where the run computed; resuming under another CPU capability or thread count
    warns, naming what moved (the rounds after it are another sample). The same environment is silent."""
    raw = tiny_raw(rounds=3)
    full, part = interrupted(tmp_path, raw, 2)
    ckpt = part / "checkpoints" / "round_000002.pt"
    here = load_tensors(ckpt)["environment"]
    assert here["cpu_capability"] == torch.backends.cpu.get_cpu_capability() and here["threads"] >= 1
    payload = load_tensors(ckpt)
    payload["environment"] = {**here, "cpu_capability": "AVX2-elsewhere", "threads": here["threads"] + 3}
    save_tensors(ckpt, payload)
    moved = (f"cpu_capability 'AVX2-elsewhere' -> '{here['cpu_capability']}', "
             f"threads {here['threads'] + 3} -> {here['threads']}")
    with pytest.warns(UserWarning, match=rf"round 2's checkpoint was written elsewhere \({moved}\): the rounds"):
        resume_experiment(str(part), quiet=True)
    # the model is restored as written: on this machine the rounds after it are the uninterrupted run's
    assert summary_numbers(part) == summary_numbers(full)

    _, again = interrupted(tmp_path / "same", raw, 2)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        resume_experiment(str(again), quiet=True)


def test_a_checkpoint_written_on_another_device_resumes_here_with_a_warning(tmp_path):
    """The config's ``device`` says where a run computes, not what it computes: a run configured for and
    checkpointed on CUDA is refused here naming ``--device``, then finishes on the CPU with it (warning
    that the device moved) with the numbers the weights imply; any other key still refuses."""
    raw = tiny_raw(rounds=3)
    full, part = interrupted(tmp_path, raw, 2)
    ckpt = part / "checkpoints" / "round_000002.pt"
    payload = load_tensors(ckpt)
    payload["config"] = {**payload["config"], "device": "cuda:7"}
    payload["environment"] = {**payload["environment"], "device": "cuda:7"}
    save_tensors(ckpt, payload)
    (part / "config.toml").write_text(dump_toml({**read_toml(part / "config.toml"), "device": "cuda:7"}))
    with pytest.raises(ConfigError, match=rf"device 'cuda:7' is not available on this machine; available: cpu.*; "
                                          rf"the run was configured for it: finish it here with 'fedaug resume "
                                          rf"{part} --device cpu'"):
        resume_experiment(str(part), quiet=True)
    with pytest.warns(UserWarning, match=r"round 2's checkpoint was written elsewhere \(device 'cuda:7' -> 'cpu'"):
        resume_experiment(str(part), quiet=True, device="cpu")
    assert summary_numbers(part) == summary_numbers(full)  # the weights came back as written
    assert read_toml(part / "config.toml")["device"] == "cuda:7"  # the run's own config is kept

    _, other = interrupted(tmp_path / "other", tiny_raw(rounds=3), 2)
    ckpt = other / "checkpoints" / "round_000002.pt"
    payload = load_tensors(ckpt)
    payload["config"] = {**payload["config"], "device": "cuda", "precision": "bf16-mixed"}
    save_tensors(ckpt, payload)
    with pytest.raises(CheckpointError, match=r"written by a different config \(precision: 'bf16-mixed' -> '32'\)"):
        resume_experiment(str(other), quiet=True)


class ClosedAs:
    """A tracking backend (:class:`~fedaug.engine.records.tracking.Backend`) that notes the rounds it was given
    and the status its run ended with."""

    name = "recorded"

    def __init__(self) -> None:
        self.rounds: list[int] = []
        self.status: str | None = None

    def log_params(self, params):
        pass

    def log_round(self, step, scalars):
        self.rounds.append(step)

    def log_files(self, paths):
        pass

    def close(self, status):
        self.status = status


def test_a_run_stopped_by_its_predicate_is_checkpointed_there_and_resumes_to_the_uninterrupted_numbers(tmp_path):
    """The server hook of a time limit: ``stop`` is asked after each round but the last; where it says True, the
    round is checkpointed although checkpoint_every skips it, the tracked run ends KILLED, and a resume equals
    the run that was not stopped."""
    from fedaug.core.errors import RunStopped
    from fedaug.engine.records.tracking import Tracker
    from fedaug.engine.run import build_simulation

    raw = tiny_raw(rounds=5)
    raw.update(out_dir=str(tmp_path / "full"), checkpoint_every=3, keep_checkpoints=5)
    _, full = run_experiment(validate(raw), quiet=True)
    raw["out_dir"] = str(tmp_path / "part")
    cfg = validate(raw)
    asked, backend = [], ClosedAs()
    with build_simulation(cfg) as sim, RunDir.start(cfg) as run_dir:
        with pytest.raises(RunStopped, match=r"^stopped after round 2 of 5$") as info:
            sim.run(run_dir, tracker=Tracker([backend], sim.task.metric), stop=lambda r: asked.append(r) or r == 2)
    assert (info.value.round, info.value.rounds) == (2, 5)
    assert asked == [1, 2] and backend.rounds == [1, 2] and backend.status == "KILLED"
    assert [r for r, _ in run_dir.checkpoints()] == [2]  # checkpoint_every = 3 would have skipped it
    assert [r["round"] for r in run_dir.rounds()] == [1, 2]
    assert not (run_dir.path / "summary.json").exists() and not (run_dir.path / LOCK).exists()
    asked.clear()
    resume_experiment(str(run_dir.path), quiet=True, stop=lambda r: asked.append(r) or False)
    assert asked == [3, 4]  # never after the last round
    assert comparable(run_dir.path) == comparable(full.path)
    assert summary_numbers(run_dir.path) == summary_numbers(full.path)
    assert [r for r, _ in run_dir.checkpoints()] == [2, 3, 5]


def test_a_stop_on_a_checkpointed_round_saves_it_once(tmp_path):
    raw = tiny_raw(rounds=3)
    raw.update(out_dir=str(tmp_path), checkpoint_every=1, keep_checkpoints=1)
    from fedaug.core.errors import RunStopped

    with pytest.raises(RunStopped) as info:
        run_experiment(validate(raw), quiet=True, stop=lambda r: r == 1)
    run = RunDir(info.value.run_dir)  # named as the exception left the run directory
    (saved,) = run.checkpoints()
    assert saved[0] == 1 and load_tensors(saved[1])["round"] == 1
