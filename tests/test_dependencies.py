"""Every package that ``src/`` uses is declared in pyproject.toml, in the extra that needs it (issue 52).

Two checks, as a fresh ``pip install`` would see the package:

- statically, every third-party module that a module of ``src/fedaug`` imports (at any depth) or looks
  up with ``find_spec("name")`` belongs to a distribution pyproject.toml declares: in the core
  dependencies, or in an extra; where the module (or a package above it) tells the user to
  ``pip install 'fedaug[<extra>]'``, in that extra or the core. A package that only arrives with
  another one (Pillow with matplotlib, cryptography with Flower) is not declared and fails here.
- dynamically, every module of ``src/fedaug`` is imported in a fresh interpreter that sees only the
  installed distributions a ``pip install fedaug`` would bring (the core dependencies and, recursively,
  theirs): each imports but the Flower adapter and the Triton kernel, which fail naming what is
  missing. (With every extra, every module imports: the doctest collection of ``src/fedaug`` imports
  each one in the test environment.)
"""

from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
import tomllib
from collections.abc import Iterable
from functools import cache
from importlib import metadata
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src"
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
#: what fedaug looks up but deliberately does not declare, and why
UNDECLARED: dict[str, str] = {}
#: the modules that a core install cannot import: module -> (the distribution it lacks, what its error names).
#: A CUDA build of torch requires triton itself: with one, the Triton kernel's module imports too.
NEEDS_EXTRA = {"fedaug.engine.flower": ("flwr", "pip install 'fedaug[flower]'"),
               "fedaug.layers.triton_ffa": ("triton", "'triton'"),
               "fedaug.layers.triton_op": ("triton", "'triton'")}
_HINT = re.compile(r"fedaug\[(\w+)\]")


def groups() -> dict[str, list[Requirement]]:
    """pyproject's requirements by group: ``""`` for the core dependencies, else the extra's name."""
    out = {"": [Requirement(r) for r in PROJECT["dependencies"]]}
    out.update({k: [Requirement(r) for r in v] for k, v in PROJECT["optional-dependencies"].items()})
    return out


def declared() -> dict[str, set[str]]:
    """Canonical distribution name -> the groups that declare it."""
    out: dict[str, set[str]] = {}
    for group, reqs in groups().items():
        for r in reqs:
            out.setdefault(canonicalize_name(r.name), set()).add(group)
    return out


@cache
def modules() -> dict[str, Path]:
    """Every module of ``src/fedaug`` (``fedaug.__main__`` runs the CLI: left out) -> its file."""
    out = {}
    for path in sorted((SRC / "fedaug").rglob("*.py")):
        parts = path.relative_to(SRC).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        if name != "fedaug.__main__":
            out[name] = path
    return out


def third_party(path: Path) -> set[str]:
    """The top-level names of the non-stdlib, non-fedaug modules that ``path`` imports anywhere in its
    code or passes to ``find_spec`` as a literal."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.add(node.module)
        elif (isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", None)) == "find_spec"
              and node.args and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)):
            found.add(node.args[0].value)
    tops = {name.split(".")[0] for name in found}
    return {t for t in tops if t not in sys.stdlib_module_names and t != "fedaug"}


def hinted_extras(name: str) -> set[str]:
    """The extras that module ``name``, or a package above it, tells the user to install."""
    files = modules()
    parts = name.split(".")
    chain = {".".join(parts[:i]) for i in range(2, len(parts) + 1)}
    return {e for m in chain if m in files for e in _HINT.findall(files[m].read_text())}


@cache
def _providers() -> dict[str, list[str]]:
    return metadata.packages_distributions()


def distribution_of(module: str) -> str | None:
    """The canonical name of the installed distribution that provides top-level ``module`` (``None``
    where none is installed here)."""
    dists = _providers().get(module)
    return canonicalize_name(dists[0]) if dists else None


def test_every_imported_package_is_declared_in_the_extra_that_needs_it():
    imports = {name: sorted(third_party(path) - set(UNDECLARED)) for name, path in modules().items()}
    absent = sorted({top for tops in imports.values() for top in tops if distribution_of(top) is None})
    if absent:
        pytest.skip(f"an import's distribution is known only where it is installed; not installed here: "
                    f"{', '.join(absent)}. This check needs every extra (make test installs them)")
    decl = declared()
    problems = []
    for name, path in modules().items():
        extras = hinted_extras(name)
        for top in imports[name]:
            dist = distribution_of(top)
            where = decl.get(dist, set())
            if not where:
                problems.append(f"{path.relative_to(ROOT)} imports {top} (distribution {dist}), which pyproject.toml "
                                f"does not declare: add it to the extra {' or '.join(sorted(extras)) or 'that needs it'}")
            elif extras and "" not in where and not where & extras:
                problems.append(f"{path.relative_to(ROOT)} imports {top} (distribution {dist}), declared in "
                                f"{sorted(where)}, but its install hint names fedaug[{','.join(sorted(extras))}]")
    assert problems == []


def test_each_undeclared_lookup_is_one_that_src_makes():
    """The exceptions above are real: each name is looked up by some module and not declared."""
    used = set().union(*(third_party(p) for p in modules().values()))
    assert set(UNDECLARED) <= used and not set(UNDECLARED) & set(declared())


def closure(reqs: Iterable[Requirement]) -> set[str]:
    """The installed distributions that installing ``reqs`` brings: each of them (where its marker holds)
    and, recursively, their requirements (with the extras asked for). Uninstalled ones are left out."""
    todo, seen = list(reqs), set()
    while todo:
        req = todo.pop()
        name = canonicalize_name(req.name)
        if (req.marker is not None and not req.marker.evaluate({"extra": ""})) or name in seen:
            continue
        try:
            dist = metadata.distribution(name)
        except metadata.PackageNotFoundError:
            continue
        seen.add(name)
        for text in dist.requires or ():
            sub = Requirement(text)
            if sub.marker is None or any(sub.marker.evaluate({"extra": e}) for e in req.extras | {""}):
                todo.append(Requirement(str(sub).split(";")[0]))
    return seen


def shadow_site(dists: Iterable[str], into: Path) -> Path:
    """A directory of links to the files of ``dists`` only (their top-level packages, modules and
    metadata), to stand for a site-packages where nothing else is installed."""
    site = into / "site-packages"
    site.mkdir(parents=True)
    for name in sorted(dists):
        dist = metadata.distribution(name)
        base = Path(dist.locate_file(""))
        for top in sorted({f.parts[0] for f in dist.files or () if f.parts[0] != ".."}):
            if (base / top).exists() and not (site / top).exists():
                (site / top).symlink_to(base / top)
    return site


IMPORT_ALL = """
import importlib, json, sys
sys.path[:0] = [sys.argv[1], sys.argv[2]]
failed = {}
for name in json.loads(sys.argv[3]):
    try:
        importlib.import_module(name)
    except Exception as exc:
        failed[name] = f"{type(exc).__name__}: {exc}"
print(json.dumps(failed))
"""


def import_failures(reqs: Iterable[Requirement], tmp_path: Path) -> dict[str, str]:
    """Module -> its import error, for every module of src/fedaug in a fresh interpreter (``-I -S``: no
    site-packages, no environment) that sees only the distributions ``reqs`` install."""
    site = shadow_site(closure(reqs), tmp_path)
    out = subprocess.run([sys.executable, "-I", "-S", "-c", IMPORT_ALL, str(site), str(SRC), json.dumps(list(modules()))],
                         capture_output=True, text=True, timeout=300, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_a_core_install_imports_every_module_but_those_of_the_extras(tmp_path):
    core = closure(groups()[""])
    failed = import_failures(groups()[""], tmp_path)
    owner = {name: next((m for m in NEEDS_EXTRA if name == m or name.startswith(m + ".")), None) for name in failed}
    assert {name: m for name, m in owner.items() if m is None} == {}, failed
    assert set(owner.values()) == {m for m, (dist, _) in NEEDS_EXTRA.items() if dist not in core}
    for name, m in owner.items():
        assert NEEDS_EXTRA[m][1] in failed[name], failed[name]
