"""``fedaug list``: every option of a method, dataset or model from the source the validator reads; the
shipped catalog equals the registries; ``--help``, ``--version`` and ``list`` import no torch."""

from __future__ import annotations

import inspect
import json
import subprocess
import sys
import typing
import warnings
from collections import defaultdict

import pytest

from fedaug.cli import catalog
from fedaug.cli.main import main
from fedaug.core.errors import ConfigError
from fedaug.core.options import first_sentence, option_types
from fedaug.core.typecheck import choices
from fedaug.data.registry import COMMON_OPTIONS, DATASETS, check_options
from fedaug.methods.aug.fedfa import FedFA
from fedaug.methods.recipe import METHODS, build_component


def test_the_shipped_catalog_is_the_registries():
    assert catalog.load() == catalog.build(builtin_only=True), (
        "src/fedaug/cli/catalog.json is stale: rewrite it with 'python -m fedaug.cli.catalog' and commit it")


def listed(args: list[str], capsys: pytest.CaptureFixture[str]) -> dict:
    assert main(["list", *args, "--format", "json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_list_methods_fedfa_is_what_the_validator_accepts(capsys):
    options = listed(["methods", "fedfa"], capsys)["fedfa"]["options"]
    signature = inspect.signature(FedFA.__init__).parameters
    hints = typing.get_type_hints(FedFA.__init__)
    assert list(options) == list(option_types(FedFA.__init__))  # every option the validator accepts, in order
    for name, o in options.items():
        assert o["default"] == (list(d) if isinstance(d := signature[name].default, tuple) else d), name
        assert o["choices"] == list(choices(hints[name])) and o["help"], name
        check_options("method", "fedfa", FedFA.__init__, {name: o["default"]} if o["default"] is not None else {})
    assert options["variance"]["choices"] == ["fused", "direct", "client", "fixed"]
    assert (options["p"]["type"], options["p"]["default"]) == ("float", 0.5)
    assert options["p"]["help"] == "probability of augmenting at each layer per forward pass (paper 0.5)."
    with pytest.raises(ConfigError, match=r"method 'fedfa' has no option 'pp' \(did you mean 'p'\?\)"):
        check_options("method", "fedfa", FedFA.__init__, {"pp": 0.5})


def test_no_two_options_of_a_method_dataset_or_model_share_a_help_text():
    """Every option has a help of its own, as ``fedaug list`` shows it (the first sentence). A docstring entry
    ``a, b: text`` gave two options one text (issue 61: fedfa's share_noise_scale, dp_noise and stats_beta
    showed the text of the option above them); fedaug has no option aliases, the one reason to share one."""
    built = catalog.build(builtin_only=True)
    shared = {}
    for kind in catalog.KINDS:
        for name, entry in built[kind].items():
            by_text = defaultdict(list)
            for option, o in entry["options"].items():
                by_text[first_sentence(o["help"])].append(option)
            shared.update({f"{kind} {name}: {', '.join(opts)}": text for text, opts in by_text.items()
                           if len(opts) > 1 or not text})
    assert shared == {}
    fedfa = built["methods"]["fedfa"]["options"]
    assert fedfa["stats_beta"]["help"].startswith('beta of stats_rule="trimmed_mean", the fraction of the clients '
                                                  "trimmed at each end")
    assert built["methods"]["scaffold"]["options"]["bn"] == built["methods"]["fedavg"]["options"]["bn"]


def test_every_choice_a_method_lists_builds_and_nothing_else_does():
    """The listed choices (the options' ``Literal`` annotations) are exactly what the components accept."""
    for name in METHODS:
        for option, tp in option_types(METHODS.get(name).__init__).items():
            if not choices(tp):
                continue
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # a choice may do nothing with the other defaults: a warning
                for value in choices(tp):
                    build_component(name, {option: value})
                with pytest.raises(ConfigError, match=rf"{name}\.{option} must be one of"):
                    build_component(name, {option: "not-a-choice"})


def test_list_text_shows_each_option_with_type_default_allowed_and_help(capsys):
    assert main(["list", "methods", "fedfa"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "fedfa (augmentation): " + METHODS.help("fedfa")
    assert out[1] == "options: method.options.fedfa.<option>, e.g. fedaug run method.augs=[fedfa] method.options.fedfa.p=0.5"
    rows = {line.split()[0]: line.split(None, 3) for line in out[3:]}
    assert rows["option"][:3] == ["option", "type", "default"]
    assert rows["variance"][:3] == ["variance", "str", '"fused"'] and "fused, direct, client, fixed" in rows["variance"][3]
    assert rows["lam"][:3] == ["lam", "float", "unset"]
    assert main(["list", "datasets", "image_folder"]) == 0
    out = capsys.readouterr().out
    # root, sites and classes have no default to show: the example sets the first option that has one
    assert "e.g. fedaug run data.name=image_folder data.options.size=32\n" in out
    assert "channels" in out and "1, 3" in out and "held_out" in out
    assert main(["list", "models", "small_cnn"]) == 0
    out = capsys.readouterr().out
    assert "width" in out and "in_channels" not in out  # the dataset sets in_channels and num_classes


def test_datasets_list_their_options_and_the_common_ones(capsys):
    options = listed(["datasets", "digits4"], capsys)["digits4"]["options"]
    assert list(options) == [*option_types(DATASETS.get("digits4")), *COMMON_OPTIONS]
    assert options["domains"]["choices"] == ["mnist", "usps_like", "mnistm_like", "synth_like"]
    assert options["usps_style"] == {"type": "str", "default": "v1", "choices": ["v1", "v2"], "bounds": "",
                                     "help": options["usps_style"]["help"], "required": False}


def test_list_keys_shows_each_default_once(capsys):
    assert main(["list", "keys"]) == 0
    lines = {line.split()[0]: line for line in capsys.readouterr().out.splitlines()}
    assert lines["name"].split(None, 3)[1:3] == ["str", '""'] and "(default" not in lines["name"]
    assert listed(["keys", "train"], capsys)["train.lr"]["bounds"] == "> 0"
    assert main(["list", "keys", "trian"]) == 2
    assert "no config key is 'trian' or starts with 'trian.'; sections: attack, data, eval" in capsys.readouterr().err


def test_unknown_names_and_a_preset_file(capsys):
    assert main(["list", "methods", "fedfaa"]) == 2
    assert "unknown method 'fedfaa'; choose from" in capsys.readouterr().err
    assert main(["list", "presets", "digits4"]) == 0
    assert capsys.readouterr().out.startswith("# Digits-4 feature shift")


def test_help_version_and_list_import_no_torch():
    script = """
import sys
from fedaug.cli.main import main
for argv in (["--help"], ["--version"], ["run", "--help"]):
    try:
        main(argv)
    except SystemExit:
        pass
for argv in (["list"], ["list", "methods", "fedfa"], ["list", "datasets", "digits4"], ["list", "keys"]):
    assert main(argv) == 0, argv
print(sorted(m for m in ("torch", "numpy") if m in sys.modules))
"""
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.splitlines()[-1] == "[]"
