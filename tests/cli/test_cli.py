"""The command line: help, list, run, resume and error exits."""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from fedaug.cli.main import CLOSED_PIPE, build_parser, main
from fedaug.cli.run_cmd import finish
from fedaug.config.load import dump_toml
from fedaug.config.schema import validate
from fedaug.core.version import RETIRED_ENV
from fedaug.engine.records.rundir import RunDir
from tests.conftest import tiny_raw
from tests.engine.test_runlock import holder


def write_cfg(tmp_path, **train):
    raw = tiny_raw(**train)
    raw["out_dir"] = str(tmp_path / "runs")
    path = tmp_path / "tiny.toml"
    path.write_text(dump_toml(validate(raw).to_dict()))
    return path


def test_no_arguments_prints_help(capsys):
    assert main([]) == 0
    assert "usage: fedaug" in capsys.readouterr().out


def test_python_dash_m_works():
    out = subprocess.run([sys.executable, "-m", "fedaug", "--help"], capture_output=True, text=True, check=True)
    assert "run" in out.stdout and "resume" in out.stdout and "list" in out.stdout


@pytest.mark.parametrize("sub", ["run", "resume", "list"])
def test_every_subcommand_has_help(sub, capsys):
    with pytest.raises(SystemExit) as info:
        main([sub, "--help"])
    assert info.value.code == 0 and "usage: fedaug " + sub in capsys.readouterr().out


def through_a_closed_pipe(args: list[str], stream: str = "stdout") -> subprocess.CompletedProcess[str]:
    """``python -m fedaug ARGS`` with ``stream`` a pipe whose reader is gone before it starts (``fedaug ... | head -1``
    once ``head`` has its line; the other stream captured): its first write there meets the closed pipe."""
    read, write = os.pipe()
    os.close(read)
    streams = {"stdout": subprocess.PIPE, "stderr": subprocess.PIPE, stream: write}
    try:
        return subprocess.run([sys.executable, "-m", "fedaug", *args], text=True, timeout=600, **streams)
    finally:
        os.close(write)


def quiet_end(out: subprocess.CompletedProcess[str], statuses: tuple[int, ...] = (CLOSED_PIPE,)) -> None:
    """The command ended as a shell tool killed by SIGPIPE does (status 141: it wrote to the closed pipe), or as
    one whose failed write was let go (0), and said nothing about it on stderr."""
    assert out.returncode in statuses, (out.returncode, out.stderr)
    assert "Traceback" not in out.stderr and "BrokenPipe" not in out.stderr and "Exception ignored" not in out.stderr


SUBCOMMAND_NAMES = sorted(next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)).choices)


@pytest.mark.parametrize("args", [["--help"], ["--version"], *([name, "--help"] for name in SUBCOMMAND_NAMES)],
                         ids=" ".join)
def test_every_command_s_help_ends_quietly_on_a_closed_pipe(args):
    """argparse lets a failed write of a long help go (0); a short text fails at the last flush (141)."""
    assert CLOSED_PIPE == 141
    quiet_end(through_a_closed_pipe(args), (0, CLOSED_PIPE))


@pytest.mark.parametrize("args", [["list"], ["list", "keys"], ["list", "methods", "fedfa"], ["env"]], ids=" ".join)
def test_listing_commands_end_quietly_on_a_closed_pipe(args):
    quiet_end(through_a_closed_pipe(args))


def test_a_run_ends_quietly_on_a_closed_pipe_after_writing_its_run(tmp_path):
    quiet_end(through_a_closed_pipe(["run", str(write_cfg(tmp_path, rounds=1)), "-q"]))
    (run,) = (tmp_path / "runs").iterdir()
    assert json.loads(Path(run, "summary.json").read_text())["rounds"] == 1  # the table is printed last


def test_a_run_whose_progress_pipe_closes_stops_quietly_and_resume_finishes_it(tmp_path, capsys):
    cfg = write_cfg(tmp_path, rounds=3)
    out = through_a_closed_pipe(["run", str(cfg)], stream="stderr")
    assert (out.returncode, out.stdout) == (CLOSED_PIPE, "")  # stopped at its first progress line, no table
    assert not (tmp_path / "runs").exists()  # that line says what is about to run: nothing was written yet
    # 'fedaug run 2>&1 | head -1': the reader takes that first line and goes; the round line after it stops the run
    proc = subprocess.Popen([sys.executable, "-m", "fedaug", "run", str(cfg)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        first = proc.stderr.readline()
        proc.stderr.close()
        stdout = proc.stdout.read()
        proc.wait(timeout=600)
    finally:
        proc.kill()
    assert first.startswith("fedaug: ") and (proc.returncode, stdout) == (CLOSED_PIPE, ""), first
    (run,) = (tmp_path / "runs").iterdir()
    assert not (run / "summary.json").exists()
    assert main(["resume", str(run), "-q", "--format", "json"]) == 0
    assert json.loads(capsys.readouterr().out)["rounds"] == 3


def test_list_shows_registries_with_one_line_each(capsys):
    assert main(["list"]) == 0
    out = capsys.readouterr().out
    for word in ("methods:", "fedavg", "datasets:", "digits4", "synthetic", "models:", "small_cnn", "presets:"):
        assert word in out
    assert main(["list", "keys", "--format", "json"]) == 0
    assert "train.lr" in json.loads(capsys.readouterr().out)["keys"]


def test_run_prints_table_and_run_dir_then_resume_reports_the_same(tmp_path, capsys):
    cfg = write_cfg(tmp_path, rounds=2)
    assert main(["run", str(cfg), "-q"]) == 0
    out = capsys.readouterr().out
    assert "| client0 |" in out and "mean over clients" in out and "pooled test set" in out
    run_dir = out.strip().splitlines()[-1].removeprefix("run directory: ")
    for name in ("config.toml", "metrics.jsonl", "summary.json", "report.md", "checkpoints"):
        assert (tmp_path / "runs").glob("*") and __import__("pathlib").Path(run_dir, name).exists()
    assert main(["resume", run_dir, "-q", "--format", "json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["rounds"] == 2 and summary["run_dir"] == run_dir
    assert main(["resume", run_dir, "-q", "--format", "json", "--device", "mps:3"]) == 2  # the flag reaches the run
    assert "'device' must be auto, cpu, cuda, cuda:N or mps, got 'mps:3'" in capsys.readouterr().err
    assert main(["resume", run_dir, "-q", "--fleet", "ray", "--device", "cuda"]) == 2  # --fleet reaches it too
    assert "device = 'cuda' with fleet = 'ray' needs ray.num_gpus > 0" in capsys.readouterr().err


def test_resume_with_a_time_limit_exits_75_until_the_same_command_finishes_the_run(tmp_path, capsys, monkeypatch):
    """The clock's readings (tests/report/conftest.py's TickClock), from the one that sets the limit (12 s: less the
    10 s reserve, the deadline is 2 s after it): +1 the reserve, +2 the watch, +3 the end of the invocation's first
    round, whose next round would end past the deadline: it stops there, checkpointed. A resume trains one round
    at least; the last round is not asked about."""
    from fedaug.core.errors import RunStopped
    from fedaug.engine.run import run_experiment
    from fedaug.report import deadline
    from tests.engine.test_resume import comparable, summary_numbers
    from tests.report.conftest import TickClock

    raw = tiny_raw(rounds=4)
    raw.update(out_dir=str(tmp_path / "full"), checkpoint_every=3)
    _, full = run_experiment(validate(raw), quiet=True)
    raw["out_dir"] = str(tmp_path / "part")
    with pytest.raises(RunStopped) as info:
        run_experiment(validate(raw), quiet=True, stop=lambda r: r == 1)
    run_dir = info.value.run_dir
    monkeypatch.setattr(deadline, "time", SimpleNamespace(time=TickClock()))
    args = ["resume", run_dir, "-q", "--time-limit", "12s"]
    assert [main(args) for _ in range(3)] == [75, 75, 0]
    captured = capsys.readouterr()
    assert captured.err.splitlines() == [
        f"fedaug resume: stopped at the time limit (--time-limit 12s) after round {r} of 4, its checkpoint saved. "
        f"Exit status 75: continue with the same command: fedaug resume {run_dir} -q --time-limit 12s" for r in (2, 3)]
    assert comparable(run_dir) == comparable(full.path)
    assert summary_numbers(Path(run_dir)) == summary_numbers(full.path)


def test_overrides_only_use_the_default_preset_and_bad_key_exits_2(tmp_path, capsys):
    assert main(["run", "train.lrr=0.1", "-q"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("fedaug: error: invalid configuration") and "did you mean 'lr'" in err


@pytest.mark.parametrize(
    "args, match",
    [
        (["train.lr=-0.1"], "'train.lr' must be > 0.0, got -0.1"),
        (["method.base=fedfaa"], "unknown method 'fedfaa'"),
        (["data.name=digits5"], "unknown dataset 'digits5'; choose from"),
        (["data.options.samples=3"], "dataset 'synthetic' has no option 'samples'"),
        (["train.participation=0.01"], "samples 0 of 3 clients"),
        (["method.options.fedprox.mu=0.1"], "options given for method component(s) not in the recipe: fedprox"),
        (["data.name=fashion_mnist", "data.options={}", "data.options.root=/nonexistent/fmnist"],
         "/nonexistent/fmnist"),
        (["train.lr=nan"], "'train.lr' must be a finite number, got nan"),
        (["train.participation=nan"], "'train.participation' must be a finite number, got nan"),
        (["train.momentum=inf"], "'train.momentum' must be a finite number, got inf"),
        (["train.min_clients=1.5"], "'train.min_clients' must be an integer, got 1.5"),
        (["data.options.num_clients=2.5"], "data.options.num_clients must be an integer, got 2.5 (dataset 'synthetic')"),
        (["method.augs=[fedprox]", "method.options.fedprox.mu=inf"],
         "method.options.fedprox.mu must be a finite number, got inf"),
        (["method.augs=[fedrdn]", "method.options.fedrdn.share_noise=nan"],
         "method.options.fedrdn.share_noise must be a finite number, got nan"),
    ],
)
def test_bad_input_exits_2_with_one_message_and_writes_nothing(tmp_path, capsys, args, match):
    cfg = write_cfg(tmp_path)
    assert main(["run", str(cfg), "-q", *args]) == 2
    err = capsys.readouterr().err
    assert match in err and err.count("fedaug: error:") == 1
    assert not (tmp_path / "runs").exists()


def test_missing_config_file_and_non_run_dir(tmp_path, capsys):
    assert main(["run", str(tmp_path / "nope.toml")]) == 2
    assert "does not exist" in capsys.readouterr().err
    assert main(["resume", str(tmp_path)]) == 2
    assert "not a fedaug run directory" in capsys.readouterr().err


def test_resume_of_a_run_another_process_writes_exits_2_naming_it(tmp_path, capsys):
    assert main(["run", str(write_cfg(tmp_path, rounds=1)), "-q"]) == 0
    run_dir = capsys.readouterr().out.strip().splitlines()[-1].removeprefix("run directory: ")
    proc = holder(run_dir, "wait")
    try:
        assert main(["resume", run_dir, "-q"]) == 2
    finally:
        proc.communicate("\n", timeout=60)
    err = capsys.readouterr().err
    assert err.startswith(f"fedaug: error: run directory '{run_dir}' is in use by pid {proc.pid} on host ")
    assert f"stop it (kill {proc.pid}) and then run 'fedaug resume {run_dir}' again" in err


def test_finish_writes_the_name_literally_and_strict_json(tmp_path, capsys):
    ev = {"clients": {"c0": {"test": {"acc": math.nan, "n": 4}}}, "mean": {"test_acc": math.nan},
          "pooled": {"test_acc": 0.25, "n": 4}}
    summary = {"name": "a|b *c*\n# d", "metric": "acc", "final": {"round": 1, "eval": ev},
               "best": {"round": 1, "by": "val", "eval": ev}}
    assert finish(summary, RunDir(tmp_path), "json") == 0
    assert (tmp_path / "report.md").read_text().splitlines()[0] == r"# a\|b \*c\* \# d"
    printed = json.loads(capsys.readouterr().out, parse_constant=lambda name: pytest.fail(f"bare {name}"))
    assert printed["final"]["eval"]["mean"]["test_acc"] is None


def test_kernel_prints_the_cached_library_and_the_retired_variable_only_warns(tmp_path, capsys, monkeypatch):
    from fedaug.layers import kernel

    from fedaug.core import local_sgd, server_ops

    try:
        libs = [kernel.build(), server_ops.build(), local_sgd.build()]
    except kernel.KernelBuildError as exc:
        pytest.skip(f"the compiled libraries cannot be built here: {exc}")
    assert main(["kernel"]) == 0
    assert capsys.readouterr().out.splitlines() == [str(lib) for lib in libs]
    # FEDAUG_FFA_KERNEL used to choose the FFA path; now the config does, and the CLI says so
    cfg = write_cfg(tmp_path, rounds=1)
    runs = {}
    for env in (None, "on", "off"):
        if env is not None:
            monkeypatch.setenv(RETIRED_ENV, env)
        assert main(["run", str(cfg), "-q", "--format", "json", "method.augs=[fedfa]"]) == 0
        captured = capsys.readouterr()
        runs[env] = json.loads(captured.out)
        assert ("FEDAUG_FFA_KERNEL is no longer read" in captured.err) == (env is not None)
    assert runs[None]["final"] == runs["on"]["final"] == runs["off"]["final"]
