"""The developer doc's example component runs as written and aggregates what it claims; every other Python block of
the page runs and prints what the page says; every function the page names is shown with its signature."""

from __future__ import annotations

import importlib
import inspect
import json
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from fedaug.methods.component import ClientCtx, Component

DOC = Path(__file__).parents[2] / "docs" / "writing_components.md"
BLOCKS = re.findall(r"```python\n(.*?)```", DOC.read_text(), flags=re.S)

CHECK = '''
import torch
from fedaug.config.schema import validate
from fedaug.engine.run import build_simulation

sim = build_simulation(cfg)
rec = sim.run_round(1)
data = sim.data
n = torch.tensor([float(len(c.train)) for c in data.clients])
means = torch.stack([c.train.x.mean(dim=(0, 2, 3)) for c in data.clients])
expected = (n[:, None] * means).sum(0) / n.sum()
assert torch.allclose(sim.server["meannorm"]["mean"], expected, atol=1e-6), (sim.server, expected)
for cid, c in enumerate(data.clients):
    assert torch.allclose(sim.server["meannorm"]["drift"][cid], c.train.x.mean(dim=(0, 2, 3)) - expected, atol=1e-6)
mean_bytes = 4 * len(expected)
assert rec["after_aggregate"]["up"] == {"meannorm": len(data.clients) * mean_bytes}
assert sim.evaluate()["comm"]["down"]["meannorm"] == len(data.clients) * mean_bytes
assert summary["final"]["eval"]["mean"]["test_acc"] > 0
print("OK", sim.server["meannorm"]["mean"].tolist())
'''


def run_script(path: Path, text: str) -> str:
    path.write_text(text)
    out = subprocess.run([sys.executable, str(path)], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    return out.stdout


def test_doc_example_runs_and_averages_the_means(tmp_path):
    blocks = BLOCKS[:2]  # the component, then the run that uses it
    assert "class MeanNorm(Component)" in blocks[0] and "run_experiment" in blocks[1]
    component_lines = len(blocks[0][blocks[0].index("@METHODS"):].strip().splitlines())  # the class, imports aside
    assert component_lines < 40, f"the example component must stay under 40 lines, it has {component_lines}"
    assert f"({component_lines} lines)" in DOC.read_text(), "the page's heading states the example's length"
    out = run_script(tmp_path / "example.py", "\n".join(blocks) + CHECK)
    assert out.strip().splitlines()[-1].startswith("OK")


@pytest.mark.parametrize("block", BLOCKS[2:], ids=lambda b: b.splitlines()[-1])
def test_every_other_block_runs_and_prints_what_its_closing_comments_say(block, tmp_path):
    said = [line.removeprefix("# ") for line in block.splitlines() if line.startswith("# ")]
    assert said, "a block ends with what it prints, as '# ' comments"
    assert run_script(tmp_path / "block.py", block).splitlines() == said


def signature_text(name: str, fn: Callable[..., Any]) -> str:
    """``name(a, b, *, c=None, kind="shared")``: ``fn``'s parameters as the page writes them (no annotations)."""
    parts, keyword_only = [], False
    for p in inspect.signature(fn).parameters.values():
        if p.kind is p.KEYWORD_ONLY and not keyword_only:
            parts.append("*")
        keyword_only = keyword_only or p.kind in (p.KEYWORD_ONLY, p.VAR_POSITIONAL)
        star = {p.VAR_POSITIONAL: "*", p.VAR_KEYWORD: "**"}.get(p.kind, "")
        default = "" if p.default is p.empty else "=" + (json.dumps(p.default) if isinstance(p.default, str)
                                                         else repr(p.default))
        parts.append(f"{star}{p.name}{default}")
    return f"{name}({', '.join(parts)})"


def resolve(dotted: str) -> Any:
    """The object a dotted path names: the longest importable module, then attributes."""
    parts = dotted.split(".")
    for i in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        for attr in parts[i:]:
            obj = getattr(obj, attr)
        return obj
    raise ImportError(dotted)


def test_every_function_the_page_names_is_shown_with_its_signature():
    """A dotted ``fedaug.`` name of a function (or of a class that takes arguments) appears with its whole
    signature, ``check_choice(owner, key, value, allowed)``: the obvious ``check_choice("axis", axis, (...))``
    is a TypeError (issue 61). A hook or context method the page writes with parameter names has Component's."""
    page = DOC.read_text()
    named = set(re.findall(r"`(fedaug(?:\.\w+)+)[`(]", page)) - {"fedaug.plugins"}  # an entry-point group
    assert "fedaug.methods.options.check_choice" in named
    checked = 0
    for dotted in sorted(named):
        obj = resolve(dotted)
        if not callable(obj) or inspect.isclass(obj) and (issubclass(obj, BaseException)
                                                          or not inspect.signature(obj).parameters):
            continue  # a module, an error, or a class the page names to subclass or use, not to call with arguments
        assert f"`{signature_text(dotted, obj)}`" in page, (dotted, signature_text(dotted, obj))
        checked += 1
    assert checked == 7  # check_choice, check_probability, check_range, range_problem, TensorSpec(.like), register
    for owner, pattern in ((Component, r"`(\w+)\(([\w, ]*)\)`"), (ClientCtx, r"`ctx\.(\w+)\(([\w, ]*)\)`")):
        for name, args in re.findall(pattern, page):
            if inspect.isfunction(getattr(owner, name, None)):
                shown = [a for a in args.split(", ") if a]
                assert shown == list(inspect.signature(getattr(owner, name)).parameters)[1:], (name, shown)
