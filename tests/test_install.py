"""fedaug installs beside the torch a user already has (issue 52).

pyproject's torch range runs from the lowest release CI tests to the newest (``make test-torch``, the
Makefile's ``TORCH_ENDS``), and pip, asked to install fedaug's requirements into this environment with a
constraint that pins the torch installed here, finds them met: it keeps this torch, whichever build it
is (the CPU wheel of ``make setup``, or each end's build in ``make test-torch``).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tomllib
from importlib import metadata
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[1]
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def torch_requirement() -> Requirement:
    (req,) = [Requirement(r) for r in PROJECT["dependencies"] if Requirement(r).name == "torch"]
    return req


def torch_ends() -> list[Version]:
    """The torch releases that ``make test-torch`` tests (the Makefile's ``TORCH_ENDS``)."""
    (line,) = re.findall(r"^TORCH_ENDS \?= (.+)$", (ROOT / "Makefile").read_text(), re.MULTILINE)
    return [Version(v) for v in line.split()]


def test_the_torch_range_runs_from_the_lowest_tested_release_to_the_newest():
    spec = torch_requirement().specifier
    low, high = torch_ends()
    assert str(spec) == f"<{high.major}.{high.minor + 1},>={low.major}.{low.minor}"
    assert all(spec.contains(v) for v in ("2.11.0", "2.11.0+cu130", "2.13.0+cpu", "2.14.1", "2.15.0", "2.15.9"))
    assert not any(spec.contains(v) for v in ("2.10.0", "2.16.0", "3.0.0"))


def installed_extras() -> list[str]:
    """The extras whose every requirement is installed here in a version it admits."""
    def met(text: str) -> bool:
        req = Requirement(text)
        try:
            return req.specifier.contains(metadata.version(req.name), prereleases=True)
        except metadata.PackageNotFoundError:
            return False

    return sorted(e for e, reqs in PROJECT["optional-dependencies"].items() if all(met(r) for r in reqs))


def test_installing_fedaug_with_a_constraint_on_the_installed_torch_changes_nothing(tmp_path):
    """An offline resolution (``--no-index``, ``--dry-run``) of fedaug's requirements, the core ones and
    those of every extra installed here, constrained to this torch: pip finds them all met and would
    install nothing (out of the range, the constraint makes the resolution fail instead). The project's
    metadata is these requirements (its build adds none); they are resolved without building it, which
    would need a setuptools that reads pyproject.toml's licence expression in this environment."""
    torch_version = metadata.version("torch")
    extras = installed_extras()
    reqs = PROJECT["dependencies"] + [r for e in extras for r in PROJECT["optional-dependencies"][e]]
    (tmp_path / "requirements.txt").write_text("\n".join(reqs) + "\n")
    (tmp_path / "constraints.txt").write_text(f"torch=={torch_version}\n")
    report = tmp_path / "report.json"
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
    env.update(PIP_CONFIG_FILE=os.devnull, PIP_CONSTRAINT=str(tmp_path / "constraints.txt"))  # no machine-wide cap
    out = subprocess.run([sys.executable, "-m", "pip", "install", "--dry-run", "--no-index", "--disable-pip-version-check",
                          "--report", str(report), "-r", str(tmp_path / "requirements.txt")],
                         capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr
    installs = {canonicalize_name(i["metadata"]["name"]): i["metadata"]["version"]
                for i in json.loads(report.read_text())["install"]}
    assert installs == {}, f"torch {torch_version}, extras {extras}"
    assert "test" in extras  # this test runs with the test extra, at least
