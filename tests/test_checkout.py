"""The clean-checkout check (tests/checkout.py) run on a session of its own, in a git checkout made here."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.checkout import checkout_entries

ROOT = Path(__file__).resolve().parents[1]

CLEAN = """
def test_writes_under_tmp_path(tmp_path):
    (tmp_path / "fine.txt").write_text("x")
"""
DIRTY = CLEAN + """
def test_writes_into_the_checkout():
    from pathlib import Path

    here = Path(__file__).parent
    (here / "leftover.txt").write_text("x")
    (here / "runs").mkdir()
    (here / "runs" / "r.json").write_text("{}")
    (here / ".hypothesis").mkdir()  # a tool cache: not counted
    (here / ".hypothesis" / "db").write_text("x")
"""


def session(tmp_path: Path, test: str, name: str) -> subprocess.CompletedProcess[str]:
    """A pytest session in a fresh git checkout whose conftest takes the two hooks."""
    repo = tmp_path / name
    repo.mkdir()
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    (repo / "pyproject.toml").write_text("[tool.pytest.ini_options]\n")
    (repo / ".gitignore").write_text("runs/\n")
    (repo / "conftest.py").write_text("from tests.checkout import pytest_sessionfinish, pytest_sessionstart\n")
    (repo / "existing.txt").write_text("untracked before the session: not counted")
    (repo / "test_it.py").write_text(test)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(repo)], cwd=repo,
                          env=env, capture_output=True, text=True, timeout=120)


def test_a_session_that_writes_into_the_checkout_fails_naming_the_new_entries(tmp_path):
    out = session(tmp_path, DIRTY, "dirty")
    assert out.returncode == 1, out.stdout + out.stderr
    assert "2 passed" in out.stdout
    assert (f"the test session left new files in the checkout {tmp_path / 'dirty'}: leftover.txt, runs/; a test "
            "writes under its tmp_path (or a temporary directory), never into the working tree") in out.stdout


def test_a_session_that_writes_under_tmp_path_passes(tmp_path):
    out = session(tmp_path, CLEAN, "clean")
    assert out.returncode == 0, out.stdout + out.stderr
    assert "1 passed" in out.stdout


def test_no_git_checkout_means_no_check(tmp_path):
    assert checkout_entries(tmp_path) is None
    assert ".venv/" not in (checkout_entries(ROOT) or set())  # make test's environment is a tool cache
