"""A test session leaves no new file in the checkout (issue 52): tests write under their ``tmp_path``.

The root ``conftest.py`` takes these two hooks: at the start of the session they note the checkout's
untracked and ignored entries (``git status --porcelain --ignored``: an untracked or ignored directory
counts as one entry), at the end they fail the session, naming each entry that appeared since. The
caches of the tools themselves (a virtual environment, ``__pycache__``, ``.pytest_cache``,
``.hypothesis``, an ``.egg-info``, ...) are left out; so is every check where the tests do not run in
a git checkout or git is missing.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

#: directory names of tool caches that a test session or ``make test`` may create in the checkout (also
#: ``.venv-torch-<version>``, ``make test-torch``'s environments, and any ``<name>.egg-info``)
TOOL_CACHES = frozenset({".venv", "__pycache__", ".pytest_cache", ".hypothesis", ".ruff_cache", ".mypy_cache"})
_BEFORE = pytest.StashKey[frozenset[str]]()


def _is_cache(entry: str) -> bool:
    parts = Path(entry).parts
    return any(p in TOOL_CACHES or p.startswith(".venv-torch-") or p.endswith(".egg-info") for p in parts)


def checkout_entries(root: Path) -> frozenset[str] | None:
    """The untracked and ignored entries (paths relative to the checkout's top) of the git checkout
    holding ``root``, tool caches left out; ``None`` where ``root`` is not in one or git is missing."""
    try:
        out = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "-z", "--ignored"],
                             capture_output=True, check=True).stdout.decode()
    except (OSError, subprocess.CalledProcessError):
        return None
    return frozenset(e[3:] for e in out.split("\0") if e[:3] in ("?? ", "!! ") and not _is_cache(e[3:]))


def pytest_sessionstart(session: pytest.Session) -> None:
    before = checkout_entries(session.config.rootpath)
    if before is not None:
        session.config.stash[_BEFORE] = before


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    before = session.config.stash.get(_BEFORE, None)
    after = checkout_entries(session.config.rootpath) if before is not None else None
    new = sorted(after - before) if after is not None and before is not None else []
    if new:
        reporter = session.config.pluginmanager.get_plugin("terminalreporter")
        message = (f"the test session left new files in the checkout {session.config.rootpath}: {', '.join(new)}; "
                   "a test writes under its tmp_path (or a temporary directory), never into the working tree")
        if reporter is not None:
            reporter.write_line(message, red=True, bold=True)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
