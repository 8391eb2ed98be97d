"""A session passes only when every test it collected reported an outcome.

pytest-xdist schedules nothing until every process has collected, and replaces a process that dies;
when the replacements die too (a library aborting at import, as ``dcor``'s numba cache did when two
processes compiled it at once), it stops with "maximum crashed workers reached" and "no tests ran" and,
once one process had collected, pytest exits 0: a CI run that tested nothing would pass. The root
``conftest.py`` takes this hook: on the controller (or a session without ``-n``) it counts the tests that
reported passed, failed, skipped, xfailed, xpassed or an error, and fails the session, naming the
shortfall, when fewer reported than were collected (after deselection) while the exit status says success.
"""

from __future__ import annotations

import pytest

#: the terminal reporter's outcome categories that a test's reports fall in
OUTCOMES = ("passed", "failed", "skipped", "xfailed", "xpassed", "error")


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    if reporter is None or hasattr(session.config, "workerinput") or exitstatus != pytest.ExitCode.OK:
        return
    reported = {r.nodeid for key in OUTCOMES for r in reporter.stats.get(key, [])}
    missing = session.testscollected - len(reported)
    if missing > 0:
        reporter.write_line(
            f"{session.testscollected} tests were collected but only {len(reported)} reported an outcome: "
            f"{missing} never ran (a pytest process crashed? look for 'node down' above); the session fails",
            red=True, bold=True)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
