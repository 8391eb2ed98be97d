"""The developer doc's example component runs as written and aggregates what it claims."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

DOC = Path(__file__).parents[2] / "docs" / "writing_components.md"

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


def test_doc_example_runs_and_averages_the_means(tmp_path):
    blocks = re.findall(r"```python\n(.*?)```", DOC.read_text(), flags=re.S)
    assert len(blocks) == 2
    component_lines = len(blocks[0][blocks[0].index("@METHODS"):].strip().splitlines())  # the class, imports aside
    assert component_lines < 40, f"the example component must stay under 40 lines, it has {component_lines}"
    assert f"({component_lines} lines)" in DOC.read_text(), "the page's heading states the example's length"
    script = tmp_path / "example.py"
    script.write_text("\n".join(blocks) + CHECK)
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1].startswith("OK")
