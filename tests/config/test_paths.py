"""Paths in a config (docs/cli.md, "Paths in a config"): the options declared to name files are made absolute once,
when the config is read: a TOML file's against its folder, the command line's against the current directory."""

from __future__ import annotations

import inspect
from pathlib import Path

import pytest

from fedaug.config.load import load_config, parse_config
from fedaug.config.paths import path_keys, resolve_paths
from fedaug.core.paths import PathOption, path_options
from fedaug.data.registry import DATASETS
from fedaug.report.grid import load_grid

IMAGE_FOLDER = '[data]\nname = "image_folder"\n[data.options]\nroot = "my images"\nsplit = "split.csv"\n'


@pytest.fixture
def folders(tmp_path, monkeypatch) -> tuple[Path, Path]:
    """``(exp, cwd)``: a folder for the config files and another one, the current directory."""
    exp, cwd = tmp_path.resolve() / "exp", tmp_path.resolve() / "cwd"
    exp.mkdir()
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    return exp, cwd


def test_a_toml_files_paths_are_taken_from_its_folder_and_the_command_lines_from_the_current_one(folders):
    exp, cwd = folders
    (exp / "run.toml").write_text(IMAGE_FOLDER + '[log]\nmlflow = "sqlite:///mlflow.db"\n')
    cfg, _ = load_config("../exp/run.toml")
    assert cfg.data.options == {"root": str(exp / "my images"), "split": str(exp / "my images" / "split.csv")}
    assert cfg.log.mlflow == f"sqlite:///{exp / 'mlflow.db'}"
    cfg, _ = load_config("../exp/run.toml", ["data.options.root=images", "log.mlflow=file:./mlruns"])
    # split stays the file's, inside whichever root: root's directory is where it is taken from
    assert cfg.data.options == {"root": str(cwd / "images"), "split": str(cwd / "images" / "split.csv")}
    assert cfg.log.mlflow == (cwd / "mlruns").as_uri()
    cfg, _ = load_config(None, ["data.name=image_folder", "data.options.root=/srv/images", "data.options.split=s.csv"])
    assert cfg.data.options == {"root": "/srv/images", "split": "/srv/images/s.csv"}  # absolute: as written


def test_resolving_again_changes_nothing_and_names_the_dataset_does_not_know_are_left_alone(folders):
    exp, _ = folders
    (exp / "run.toml").write_text(IMAGE_FOLDER)
    cfg, _ = load_config(str(exp / "run.toml"))
    stored = cfg.to_dict()  # what config.toml holds
    assert resolve_paths(stored) == stored and parse_config(stored) == cfg
    unknown = {"data": {"name": "no_such_dataset", "options": {"root": "x"}}}
    assert resolve_paths(unknown) == unknown  # the dataset's name is reported when it is built
    other = {"data": {"name": "synthetic", "options": {"root": "x"}}}
    assert resolve_paths(other) == other  # synthetic has no root: check_options names it


def test_a_grid_takes_its_bases_paths_from_that_file_its_tables_from_the_grid_file_and_set_from_cwd(folders):
    exp, cwd = folders
    (exp / "base").mkdir()
    (exp / "base" / "base.toml").write_text(IMAGE_FOLDER)
    (exp / "grid.toml").write_text('base = "base/base.toml"\nseeds = [0]\n[methods.A]\n'
                                   '[methods.B]\ndata.options.root = "b images"\n')
    spec = load_grid("../exp/grid.toml", overrides=["log.mlflow=sqlite:///m.db"])
    a, b = (spec.raw("default", m, 0) for m in ("A", "B"))
    assert a["data"]["options"] == {"root": str(exp / "base" / "my images"),
                                    "split": str(exp / "base" / "my images" / "split.csv")}
    assert b["data"]["options"]["root"] == str(exp / "b images")
    assert a["log"]["mlflow"] == b["log"]["mlflow"] == f"sqlite:///{cwd / 'm.db'}"


MINE = '''"""A dataset and a component of the tests' own, each with an option that names a file."""
from fedaug.core.paths import LocalPath
from fedaug.data import DATASETS
from fedaug.data.synthetic import synthetic
from fedaug.methods import METHODS, Component


@DATASETS.register("listed_synthetic", "synthetic data and a file (a test's own)")
def listed_synthetic(*, seed: int, listing: LocalPath = "", num_clients: int = 2):
    """Args:
        listing: a file.
        num_clients: clients.
    """
    return synthetic(seed=seed, num_clients=num_clients)


@METHODS.register("file_weights", "weights from a file (a test's own)")
class FileWeights(Component):
    """Args:
        table: a file.
    """

    name = "file_weights"

    def __init__(self, *, table: LocalPath = "", scale: float = 1.0) -> None:
        self.table, self.scale = table, scale
'''


def test_your_own_dataset_and_component_declare_their_paths_by_annotation(folders, own_registries):
    exp, _ = folders
    (exp / "mine.py").write_text(MINE)
    (exp / "run.toml").write_text('imports = ["mine.py"]\n[data]\nname = "listed_synthetic"\n'
                                  '[data.options]\nlisting = "lists/a.csv"\n[method]\naugs = ["file_weights"]\n'
                                  '[method.options.file_weights]\ntable = "w.csv"\nscale = 2.0\n')
    cfg, _ = load_config(str(exp / "run.toml"))
    assert cfg.data.options == {"listing": str(exp / "lists" / "a.csv")}
    assert cfg.method.options == {"file_weights": {"table": str(exp / "w.csv"), "scale": 2.0}}
    assert path_keys(cfg.to_dict()) == {("log", "mlflow"): PathOption(uri=True),
                                        ("data", "options", "listing"): PathOption(),
                                        ("method", "options", "file_weights", "table"): PathOption()}


def test_every_shipped_dataset_that_reads_a_directory_declares_its_root_a_path():
    reads = {n for n in DATASETS.names() if "root" in inspect.signature(DATASETS.get(n)).parameters}
    assert reads and {n for n in reads if "root" in path_options(DATASETS.get(n))} == reads
