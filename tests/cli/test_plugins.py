"""Your own component from the command line: a module outside fedaug runs through ``fedaug run --import``
and through an installed entry point (group ``fedaug.plugins``), and ``fedaug resume`` (a fresh process,
elsewhere) imports it again from the run's config.

A plugin registers into the process's registries: the runs here put them back afterwards
(``own_registries``), and each resume runs in a fresh process, which has to import the plugin itself."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from fedaug.cli.main import main
from fedaug.config.load import dump_toml, load_config
from fedaug.config.schema import validate
from fedaug.core.errors import ConfigError
from fedaug.core.plugins import GROUP, import_plugin, resolve_import
from fedaug.engine.records.rundir import RunDir
from tests.conftest import tiny_raw

#: a component in a module of its own: Gaussian noise on the training inputs, from the client's stream
GNOISE = '''"""Gaussian input noise: a component outside fedaug."""
import torch

from fedaug.methods import METHODS, Batch, Component


@METHODS.register("gnoise", "Gaussian noise on every training input (a plugin of the tests)")
class GaussianNoise(Component):
    """Adds N(0, std^2) to each training input.

    Args:
        std: the noise's standard deviation.
    """

    name = "gnoise"

    def __init__(self, *, std: float = 0.5) -> None:
        self.std = std

    def transform_batch(self, ctx, batch):
        if not ctx.training:
            return batch
        g = ctx.rng("noise")
        return Batch(batch.x + self.std * torch.randn(batch.x.shape, generator=g, device=g.device), batch.y)
'''


def fedaug_process(*args: str, cwd: Path, path: tuple[Path, ...] = ()) -> dict:
    """Run ``python -m fedaug ARGS -q --format json`` in a fresh process in ``cwd`` (``path`` added to its
    PYTHONPATH), which has imported nothing of the test's; its summary."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([*map(str, path), *sys.path])}
    out = subprocess.run([sys.executable, "-m", "fedaug", *args, "-q", "--format", "json"], cwd=cwd, env=env,
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def fedaug(*args: str, capsys: pytest.CaptureFixture[str]) -> dict:
    """Run ``fedaug ARGS --format json`` in this process; what it printed, as JSON."""
    assert main([*args, "--format", "json"]) == 0, capsys.readouterr().err
    return json.loads(capsys.readouterr().out)


def records(run_dir: str) -> list[dict]:
    return [{k: r[k] for k in ("round", "train", "eval")} for r in RunDir(run_dir).rounds()]


@pytest.fixture
def experiment(tmp_path, monkeypatch) -> Path:
    """``exp/gnoise.py`` next to ``exp/tiny.toml`` (3 rounds, a checkpoint every round, the last 2 kept),
    outside fedaug; the test runs in ``tmp_path``."""
    exp = tmp_path / "exp"
    exp.mkdir()
    (exp / "gnoise.py").write_text(GNOISE)
    raw = tiny_raw()
    raw["out_dir"] = str(tmp_path / "runs")
    (exp / "tiny.toml").write_text(dump_toml(validate(raw).to_dict()))
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path)
    return exp


@pytest.mark.slow
def test_import_option_runs_a_component_of_your_own_and_resume_imports_it_again(experiment, tmp_path,
                                                                                own_registries, capsys):
    done = fedaug("run", "exp/tiny.toml", "--import", "exp/gnoise.py", "method.augs=[gnoise]",
                  "method.options.gnoise.std=0.3", "-q", capsys=capsys)
    config = tomllib.loads((Path(done["run_dir"]) / "config.toml").read_text())
    assert config["imports"] == [str(experiment / "gnoise.py")]  # recorded, absolute: found from anywhere
    assert config["method"]["augs"] == ["gnoise"] and done["name"] == "synthetic-fedavg+gnoise"
    again = fedaug_process("resume", done["run_dir"], "--from-round", "2", cwd=tmp_path / "elsewhere")
    assert again["final"] == done["final"] and len(records(done["run_dir"])) == 3


@pytest.mark.slow
def test_an_installed_entry_point_is_found_by_list_run_and_resume(tmp_path, experiment, own_registries, capsys,
                                                                  monkeypatch):
    site = tmp_path / "site-packages"
    (site / "gnoise_plugin-0.1.dist-info").mkdir(parents=True)
    (site / "gnoise_plugin.py").write_text(GNOISE)
    (site / "gnoise_plugin-0.1.dist-info" / "METADATA").write_text("Metadata-Version: 2.1\nName: gnoise-plugin\n"
                                                                  "Version: 0.1\n")
    (site / "gnoise_plugin-0.1.dist-info" / "entry_points.txt").write_text(f"[{GROUP}]\ngnoise = gnoise_plugin\n")
    monkeypatch.syspath_prepend(str(site))  # as if pip had installed it
    gnoise = fedaug("list", "methods", "gnoise", capsys=capsys)["gnoise"]
    assert gnoise["module"] == "gnoise_plugin" and gnoise["options"]["std"]["default"] == 0.5
    assert gnoise["options"]["std"]["help"] == "the noise's standard deviation."
    done = fedaug("run", "exp/tiny.toml", "method.augs=[gnoise]", "-q", capsys=capsys)
    assert tomllib.loads((Path(done["run_dir"]) / "config.toml").read_text())["imports"] == []  # found, not named
    again = fedaug_process("resume", done["run_dir"], "--from-round", "2", cwd=tmp_path / "elsewhere", path=(site,))
    assert again["final"] == done["final"]


def test_a_module_next_to_the_config_is_recorded_by_its_path(experiment, tmp_path):
    assert resolve_import("gnoise", experiment) == str(experiment / "gnoise.py")
    assert resolve_import("json", experiment) == "json"  # on sys.path: kept as a name
    assert resolve_import("plugins/x.py", tmp_path) == str(tmp_path / "plugins" / "x.py")
    (experiment / "cfg.toml").write_text('imports = ["missing_module_x"]\n')
    with pytest.raises(ConfigError, match=r"imports: cannot find the module 'missing_module_x'; give a module name on "
                                          r"sys.path \(PYTHONPATH\), or the path of its .py file"):
        load_config(str(experiment / "cfg.toml"))


def test_import_errors_name_the_module_and_the_cause(tmp_path):
    (tmp_path / "broken_plugin_x.py").write_text("raise RuntimeError('boom')\n")
    with pytest.raises(ConfigError, match=r"imports: importing '.*broken_plugin_x.py' failed: RuntimeError: boom"):
        import_plugin(str(tmp_path / "broken_plugin_x.py"))
    assert "broken_plugin_x" not in sys.modules
    (tmp_path / "json.py").write_text("")
    with pytest.raises(ConfigError, match=r"would be the module 'json', but a module of that name is already imported"):
        import_plugin(str(tmp_path / "json.py"))
    with pytest.raises(ConfigError, match=r"'.*nothing_here.py' is neither a .py file nor a package directory"):
        import_plugin(str(tmp_path / "nothing_here.py"))
