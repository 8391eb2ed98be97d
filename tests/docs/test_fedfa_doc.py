"""docs/fedfa.md's stand-alone layer example runs as written and does what its comments say."""

from __future__ import annotations

import re
from pathlib import Path

import torch

DOC = Path(__file__).parents[2] / "docs" / "fedfa.md"


def test_layer_example_runs_and_augments_in_training_only():
    block = re.findall(r"```python\n(.*?)```", DOC.read_text(), flags=re.S)[0]
    scope: dict = {}
    exec(compile(block, str(DOC), "exec"), scope)  # noqa: S102 - the doc's own example
    layer, x = scope["layer"], scope["x"]
    assert layer.shared_mu.shape == (64,) and torch.isclose(layer.shared_mu.sum(), torch.tensor(64.0))  # gamma, Eq. 6
    augmented = layer.train()
    augmented.p = 1.0
    y = augmented(x)
    assert y.shape == x.shape and not torch.equal(y, x)
    assert layer.eval()(x) is x
