"""The README's Python quickstart runs as written."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

README = Path(__file__).parents[2] / "README.md"


def test_readme_python_quickstart_runs(tmp_path):
    (block,) = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)
    script = tmp_path / "quickstart.py"
    script.write_text(block)
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert "'test_acc'" in out.stdout
