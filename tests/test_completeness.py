"""The completeness check (tests/completeness.py) on sessions of their own: a pytest-xdist run whose other
processes die while collecting fails instead of passing with "no tests ran"; deselected, skipped and
expected-to-fail tests still count as reported."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

#: every process but the first aborts while importing the module (as ``dcor`` did, its numba cache corrupted)
CRASHING = """
import os

if os.environ.get("PYTEST_XDIST_WORKER", "gw0") != "gw0":
    os.abort()


def test_one():
    pass


def test_two():
    pass
"""
MIXED = """
import pytest


def test_passes():
    pass


@pytest.mark.skip(reason="stated")
def test_skipped():
    pass


@pytest.mark.xfail(reason="stated", strict=True)
def test_expected_to_fail():
    assert False


def test_deselected_by_k():
    pass
"""


def session(tmp_path: Path, test: str, *args: str) -> subprocess.CompletedProcess[str]:
    (tmp_path / "conftest.py").write_text('pytest_plugins = ("tests.completeness",)\n')
    (tmp_path / "test_it.py").write_text(test)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}
    env.pop("PYTEST_XDIST_WORKER", None)  # this suite's own process name must not reach the session's
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "xdist.plugin",
                           "--rootdir", str(tmp_path), *args, str(tmp_path)], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=300)


def test_a_session_whose_processes_crash_while_collecting_fails(tmp_path):
    out = session(tmp_path, CRASHING, "-n", "2")
    assert "no tests ran" in out.stdout, out.stdout[-2000:]
    assert out.returncode == 1, out.stdout[-2000:]
    assert ("2 tests were collected but only 0 reported an outcome: 2 never ran (a pytest process crashed? "
            "look for 'node down' above); the session fails") in out.stdout


def test_deselected_skipped_and_expected_failures_count_as_reported(tmp_path):
    for args in (("-n", "2"), ()):
        out = session(tmp_path, MIXED, "-k", "not deselected", *args)
        assert out.returncode == 0, out.stdout[-2000:]
        assert "1 passed, 1 skipped" in out.stdout and "1 xfailed" in out.stdout, out.stdout[-2000:]  # (xdist's
        # summary leaves the deselected test out)


def test_a_failing_session_keeps_its_own_exit_status(tmp_path):
    out = session(tmp_path, "def test_fails():\n    assert False\n")
    assert out.returncode == 1 and "1 failed" in out.stdout and "never ran" not in out.stdout
