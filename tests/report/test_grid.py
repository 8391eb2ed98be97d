"""Grid files and command-line grids: merge order, validation messages."""

from __future__ import annotations

import pytest

from fedaug.config.load import parse_config
from fedaug.core.errors import ConfigError
from fedaug.report.grid import (DEFAULT_SETTING, PaperScale, deep_merge, grid_from_args, load_grid, parse_grid, select,
                                slug)
from tests.report.conftest import tiny_grid_raw, tiny_spec


def test_deep_merge_replaces_values_and_lists_merges_tables():
    base = {"train": {"lr": 0.1, "rounds": 5}, "method": {"augs": ["a"], "options": {"x": {"p": 1}}}}
    top = {"train": {"rounds": 2}, "method": {"augs": ["b"], "options": {"y": {}}}}
    assert deep_merge(base, top) == {"train": {"lr": 0.1, "rounds": 2},
                                     "method": {"augs": ["b"], "options": {"x": {"p": 1}, "y": {}}}}
    assert base["train"]["rounds"] == 5  # inputs untouched


def test_cells_merge_base_common_setting_method_then_overrides():
    spec = parse_grid({"base": "digits4", "common": {"train": {"rounds": 4, "lr": 0.1}},
                       "settings": {"scarce": {"data": {"options": {"train_fraction": 0.5}}, "train": {"lr": 0.2}}},
                       "methods": {"A": {}, "B": {"train": {"lr": 0.3}, "method": {"augs": ["fedfa"]}}}},
                      "g", overrides=["train.rounds=2"])
    a = parse_config(spec.raw("scarce", "A", 5))
    b = parse_config(spec.raw("scarce", "B", 5))
    assert (a.seed, a.train.rounds, a.train.lr, a.data.options, a.train.batch_size) == (5, 2, 0.2, {"train_fraction": 0.5}, 32)
    assert (b.train.lr, b.method.augs) == (0.3, ["fedfa"])
    assert spec.baseline == "A" and spec.seeds == [0]


def test_a_settings_augs_after_is_appended_to_every_methods_augs():
    spec = parse_grid({"base": "digits4",
                       "settings": {"plain": {}, "with CCVR": {"augs_after": ["ccvr"]}},
                       "methods": {"none": {}, "FedRDN": {"method": {"augs": ["fedrdn"]}}}}, "g")
    augs = {(s, m): parse_config(spec.raw(s, m, 0)).method.augs for s in spec.settings for m in spec.methods}
    assert augs == {("plain", "none"): [], ("plain", "FedRDN"): ["fedrdn"],
                    ("with CCVR", "none"): ["ccvr"], ("with CCVR", "FedRDN"): ["fedrdn", "ccvr"]}
    assert spec.settings["with CCVR"] == {"augs_after": ["ccvr"]}  # the spec itself is not changed


def test_command_line_grid():
    spec = grid_from_args("digits4", [["FedAvg"], ["FedFA", "method.augs=[fedfa]", "method.options.fedfa.p=0.2"]],
                          [["half", "data.options.train_fraction=0.5"]], [0, 1], baseline="FedFA",
                          overrides=["train.rounds=2"])
    assert spec.methods == {"FedAvg": {}, "FedFA": {"method": {"augs": ["fedfa"], "options": {"fedfa": {"p": 0.2}}}}}
    assert list(spec.settings) == ["half"] and spec.baseline == "FedFA" and spec.seeds == [0, 1]
    cfg = parse_config(spec.raw("half", "FedFA", 1))
    assert (cfg.train.rounds, cfg.method.options["fedfa"]["p"], cfg.data.options["train_fraction"]) == (2, 0.2, 0.5)
    with pytest.raises(ConfigError, match=r"--method takes a label first.*'method.augs=\[fedfa\]'"):
        grid_from_args(None, [["method.augs=[fedfa]"]], [], [0])
    with pytest.raises(ConfigError, match="label 'A' is given twice"):
        grid_from_args(None, [["A"], ["A"]], [], [0])


def test_no_settings_means_one_default_setting():
    assert list(tiny_spec().settings) == [DEFAULT_SETTING]


@pytest.mark.parametrize("change, message", [
    ({"method": "x"}, r"unknown grid key 'method' \(did you mean 'methods'\?\); valid keys: description, kind"),
    ({"kind": "standin"}, r"'kind' must be one of paper, stand-in, got 'standin' \(did you mean 'stand-in'\?\)"),
    ({"seeds": [0, 0]}, r"'seeds' must be a non-empty list of distinct integers >= 0, got \[0, 0\]"),
    ({"seeds": []}, r"'seeds' must be a non-empty list"),
    ({"baseline": "FedAvgg"}, r"baseline 'FedAvgg' is not a method of the grid; choose from FedAvg, FedAvg lr 0.2 "
                              r"\(did you mean 'FedAvg'\?\)"),
    ({"methods": {}}, r"the grid has no methods; add at least one \[methods.LABEL\] table"),
    ({"methods": {"A": ["train.lr=0.1"]}}, r"'methods.A' must be a table \(a partial config\), got \['train.lr=0.1'\]"),
    ({"methods": {"A": {"seed": 3}}}, r"'methods.A' sets 'seed', which the grid sets per cell"),
    ({"methods": {"Fed A": {}, "fed-a": {}}}, r"methods 'Fed A' and 'fed-a' map to the same directory 'fed-a'"),
    ({"settings": {"S": {"augs_after": "ccvr"}}}, r"'settings.S.augs_after' must be a list of component names"),
    ({"methods": {"A": {"augs_after": ["ccvr"]}}}, r"'methods.A.augs_after' must be a list of component names in a "
                                                   r"settings table"),
    ({"base": "digit4"}, r"'base' = 'digit4' is neither a preset nor a TOML file .*\(did you mean 'digits4'\?\)"),
])
def test_bad_grid_files_name_the_problem(change, message):
    with pytest.raises(ConfigError, match=message):
        parse_grid(tiny_grid_raw(**change), "tiny")


PAPER = {"paper_rounds": 400, "paper_local_epochs": 1, "paper_datasets": ["office_caltech10", "domainnet"]}


@pytest.mark.parametrize("keys, scale, text", [
    ({}, None, None),
    (PAPER, PaperScale((400,), (1,), ("office_caltech10", "domainnet")), "400 x 1"),
    ({**PAPER, "paper_rounds": [500, 400]}, PaperScale((400, 500), (1,), ("office_caltech10", "domainnet")),
     "400/500 x 1"),
    ({"paper_rounds": "not stated", "paper_local_epochs": "not stated", "paper_datasets": []},
     PaperScale((), (), ()), "not stated"),
    ({"paper_rounds": 100, "paper_local_epochs": "not stated", "paper_datasets": []},
     PaperScale((100,), (), ()), "100 x not stated"),
])
def test_the_papers_scale_is_read_from_the_grid_file(keys, scale, text):
    spec = parse_grid(tiny_grid_raw(**keys), "tiny")
    assert spec.paper == scale
    assert (spec.paper.text() if spec.paper else None) == text


@pytest.mark.parametrize("change, message", [
    ({"paper_rounds": 0}, r"'paper_rounds' must be a count >= 1, a list of distinct counts \(one per count the "
                          r"paper's datasets use\) or \"not stated\" \(the paper does not give it\), got 0"),
    ({"paper_local_epochs": [1, 1]}, r"'paper_local_epochs' must be a count >= 1, .*, got \[1, 1\]"),
    ({"paper_rounds": "400"}, r"'paper_rounds' must be a count >= 1, .*, got '400'"),
    ({"paper_rounds": [[400]]}, r"'paper_rounds' must be a count >= 1, .*, got \[\[400\]\]"),
    ({"paper_rounds": True}, r"'paper_rounds' must be a count >= 1, .*, got True"),
    ({"paper_datasets": "cifar10"}, r"'paper_datasets' must be a list of dataset names \(fedaug list datasets; \[\] "
                                    r"when fedaug loads none of the paper's datasets\), got 'cifar10'"),
    ({"paper_datasets": ["cifar100"]}, r"'paper_datasets': unknown dataset 'cifar100'.*\(did you mean 'cifar10'\?\)"),
])
def test_a_bad_paper_scale_names_the_key_and_the_allowed_values(change, message):
    with pytest.raises(ConfigError, match=message):
        parse_grid(tiny_grid_raw(**{**PAPER, **change}), "tiny")


def test_the_papers_scale_keys_go_together():
    with pytest.raises(ConfigError, match=r"the paper's scale needs paper_rounds, paper_local_epochs, paper_datasets "
                                          r"together; add paper_local_epochs, paper_datasets "
                                          r"\(or remove paper_rounds\)"):
        parse_grid(tiny_grid_raw(paper_rounds=400), "tiny")


def test_all_problems_are_reported_at_once():
    with pytest.raises(ConfigError) as info:
        parse_grid(tiny_grid_raw(kind="x", seeds="0", extra=1), "tiny")
    assert str(info.value).count("\n  ") == 3


@pytest.mark.parametrize("method, message", [
    ({"method": {"augs": ["fedfaa"]}}, r"method 'B': unknown method 'fedfaa'; choose from .* \(did you mean 'fedfa'\?\)"),
    ({"method": {"bas": "fedprox"}}, r"method 'B': invalid configuration:\n +unknown key 'method.bas' \(did you mean 'base'\?\)"),
    ({"data": {"options": {"num_client": 3}}}, r"method 'B': dataset 'synthetic' has no option 'num_client' \(did you mean 'num_clients'\?\)"),
    ({"model": {"name": "small_cn"}}, r"method 'B': unknown model 'small_cn'.*\(did you mean 'small_cnn'\?\)"),
    ({"train": {"lr": -1}}, r"method 'B': invalid configuration:\n +'train.lr' must be > 0.0, got -1"),
])
def test_bad_cells_name_the_method_and_the_value(method, message):
    with pytest.raises(ConfigError, match=message):
        parse_grid(tiny_grid_raw(methods={"A": {}, "B": method}), "tiny")


def test_bad_cell_in_a_setting_names_the_setting():
    with pytest.raises(ConfigError, match=r"method 'A' in setting 'half': dataset 'synthetic' has no option 'train_fraction'"):
        parse_grid(tiny_grid_raw(methods={"A": {}}, settings={"half": {"data": {"options": {"train_fraction": 0.5}}}}),
                   "tiny")


def test_load_grid_errors(tmp_path):
    with pytest.raises(ConfigError, match=r"'nope' is neither a shipped grid nor a grid file; grids: "):
        load_grid("nope")
    with pytest.raises(ConfigError, match=r"grid file '.*missing.toml' does not exist"):
        load_grid(str(tmp_path / "missing.toml"))
    bad = tmp_path / "bad.toml"
    bad.write_text("[methods\n")
    with pytest.raises(ConfigError, match=r"grid file '.*bad.toml' is not valid TOML"):
        load_grid(str(bad))


def test_load_grid_resolves_a_relative_base_next_to_the_file(tmp_path):
    (tmp_path / "cfg.toml").write_text('[train]\nrounds = 7\n')
    (tmp_path / "g.toml").write_text('base = "cfg.toml"\nseeds = [1]\n[methods.A]\n')
    spec = load_grid(str(tmp_path / "g.toml"), seeds=[2, 3], overrides=["train.lr=0.5"])
    cfg = parse_config(spec.raw(DEFAULT_SETTING, "A", 2))
    assert (spec.name, spec.seeds, cfg.train.rounds, cfg.train.lr) == ("g", [2, 3], 7, 0.5)


def test_slug():
    assert slug("FedFA (p=0.2)") == "fedfa-p-0.2" and slug("FedAvg+FedRDN") == "fedavg+fedrdn" and slug("???") == "x"


def test_select_keeps_the_grids_order_its_baseline_and_its_cells_configs():
    spec = parse_grid({"settings": {"s1": {"train": {"lr": 0.1}}, "s2": {}, "s3": {"train": {"lr": 0.3}}},
                       "methods": {"A": {}, "B": {"train": {"rounds": 2}}, "C": {"train": {"rounds": 3}}},
                       "baseline": "B", "seeds": [0, 1]}, "g")
    part = select(spec, methods=["C", "A"], settings=["s3", "s1"])
    assert list(part.methods) == ["A", "B", "C"] and list(part.settings) == ["s1", "s3"]
    assert part.baseline == "B" and part.seeds == [0, 1] and part.name == "g"
    assert part.raw("s3", "C", 1) == spec.raw("s3", "C", 1)
    assert select(spec) == spec and list(spec.methods) == ["A", "B", "C"]  # the grid itself is unchanged


def test_select_names_every_unknown_label():
    with pytest.raises(ConfigError) as info:
        select(tiny_spec(), methods=["FedAvg", "FedAVG"], settings=["x"])
    lines = str(info.value).splitlines()
    assert len(lines) == 2 and "'FedAVG' is not a method of grid 'tiny'" in lines[0] and "did you mean" in lines[0]
    assert "--only-settings: 'x' is not a setting of grid 'tiny'; choose from 'default'" in lines[1]
