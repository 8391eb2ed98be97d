"""``scripts/setup.sh`` (issue 50): on a machine without g++ it installs the Debian packages, g++ among
them, before it builds fedaug's compiled libraries, so the first ``make run`` has them; what it cannot
install or build it names, with what that costs. The system's tools are stand-ins here (``dpkg``,
``apt-get``, ``id``, the virtual environment's ``fedaug``), each logging its call; nothing is installed."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

SETUP = Path(__file__).resolve().parents[2] / "scripts" / "setup.sh"
DEBS = ["dataset-fashion-mnist", "espeak-ng", "mricron-data", "chromium", "g++"]

STUBS = {
    # installed packages are files in state/installed
    "dpkg": "sys.exit(0 if len(args) == 2 and (state / 'installed' / args[1]).exists() else 1)",
    # logs its call; fails when state/apt-fails exists; 'installs' packages, g++ as a program on PATH
    "apt-get": """log(' '.join(['apt-get', *args]))
if (state / 'apt-fails').exists():
    sys.exit(100)
if 'install' in args:
    for pkg in [a for a in args[args.index('install') + 1:] if not a.startswith('-')]:
        (state / 'installed' / pkg).touch()
        if pkg == 'g++':
            gxx = Path(__file__).with_name('g++')
            gxx.write_text('#!/bin/sh\\n')
            gxx.chmod(0o755)""",
    "id": "print((state / 'uid').read_text())",
}
#: the virtual environment's fedaug: `fedaug kernel` builds where a C++ compiler is on PATH
FEDAUG = """log(' '.join(['fedaug', *args]) + (' with g++' if shutil.which('g++') else ' without a compiler'))
if not shutil.which('g++'):
    print('fedaug kernel: ffa_kernel NOT built: no C++ compiler found', file=sys.stderr)
    sys.exit(2)
print('/cache/ffa_restyle.so')"""


def stub(path: Path, body: str, state: Path) -> None:
    path.write_text(f"#!{sys.executable}\nimport shutil, sys\nfrom pathlib import Path\n"
                    f"state = Path({str(state)!r})\nargs = sys.argv[1:]\n"
                    f"def log(line):\n    with open(state / 'log', 'a') as f:\n        f.write(line + '\\n')\n{body}\n")
    path.chmod(0o755)


def run_setup(tmp_path: Path, *, uid: int = 0, apt_fails: bool = False) -> tuple[subprocess.CompletedProcess[str],
                                                                                   list[str]]:
    state, bin_dir, venv = tmp_path / "state", tmp_path / "bin", tmp_path / "venv"
    for d in (state / "installed", bin_dir, venv / "bin"):
        d.mkdir(parents=True)
    (state / "uid").write_text(str(uid))
    if apt_fails:
        (state / "apt-fails").touch()
    for name, body in STUBS.items():
        stub(bin_dir / name, body, state)
    stub(venv / "bin" / "fedaug", FEDAUG, state)
    stub(venv / "bin" / "python", "sys.exit('python is not run: the environment is installed')", state)
    (venv / ".fedaug-installed").touch()  # newer than pyproject.toml: the pip step is skipped
    (bin_dir / "dirname").symlink_to(shutil.which("dirname"))
    done = subprocess.run([shutil.which("bash"), str(SETUP)], capture_output=True, text=True, timeout=60,
                          env={"PATH": str(bin_dir), "VENV": str(venv), "HOME": str(tmp_path)})
    log = (state / "log").read_text().splitlines() if (state / "log").exists() else []
    return done, log


def test_without_gxx_the_debian_packages_are_installed_before_the_libraries_are_built(tmp_path):
    done, log = run_setup(tmp_path)
    assert done.returncode == 0 and done.stderr == "", done.stderr
    assert log == ["apt-get update -qq", f"apt-get install -y -qq {' '.join(DEBS)}", "fedaug kernel with g++"]


@pytest.mark.parametrize(("uid", "apt_fails", "why"), [(0, True, "apt-get failed"), (1000, False, "not root")])
def test_what_could_not_be_installed_or_built_is_named_with_what_it_costs(tmp_path, uid, apt_fails, why):
    done, log = run_setup(tmp_path, uid=uid, apt_fails=apt_fails)
    assert done.returncode == 0
    assert log == (["apt-get update -qq"] if apt_fails else []) + ["fedaug kernel without a compiler"]
    assert done.stderr.splitlines() == [
        f"setup: Debian package dataset-fashion-mnist is missing ({why}; apt-get install dataset-fashion-mnist): "
        "the fashion_mnist data set and its tests are skipped",
        f"setup: Debian package espeak-ng is missing ({why}; apt-get install espeak-ng): the spoken_digits data set "
        "and its tests are skipped",
        f"setup: Debian package mricron-data is missing ({why}; apt-get install mricron-data): brain_mri's colin27 "
        "and inia19 sites and their tests are skipped",
        f"setup: Debian package chromium is missing ({why}; apt-get install chromium): tests/report/test_browser.py "
        "fails",
        f"setup: Debian package g++ is missing ({why}; apt-get install g++): fedaug's compiled CPU libraries cannot be "
        "built (below)",
        "fedaug kernel: ffa_kernel NOT built: no C++ compiler found",
        "setup: fedaug's compiled libraries are not all built (above: which, why, and what runs do without them); "
        "their tests are skipped; fix that (apt-get install g++) and run make setup again",
    ]
