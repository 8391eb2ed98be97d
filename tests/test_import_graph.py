"""The package layering of DESIGN.md ("Layers (imports point downward only)"), checked on the
import graph of ``src/fedaug``.

Every ``import`` / ``from ... import`` statement of every module is read with :mod:`ast`, wherever
it stands: module level, inside a function (lazy imports) or under ``if TYPE_CHECKING:`` (an
annotation-only import still ties the packages together for readers and type checkers, and is the
first step to a runtime one). Doctest examples are strings, not imports, and are not counted.
Edges are then reduced to packages ``fedaug.<package>``; ``fedaug`` itself stands for the root
package (``__init__.py`` re-exports, ``__main__.py``). A package may import packages of lower
layers, and packages of its own layer as long as the package graph has no cycle.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src" / "fedaug"

#: Bottom to top, from DESIGN.md; where DESIGN.md is silent, placed by what the package imports.
LAYERS: tuple[tuple[str, ...], ...] = (
    ("core",),  # errors, registries, RNG streams, payload checks, serialisation, version
    # Building blocks; each imports only core, models also data (data.registry.check_options), config also data
    # and models (config.paths reads which of their options name files from their builders).
    # config: the declarative run config (validated with core only); layers: plug-in feature layers
    # and their pure functions; privacy: dCor, exposure, noise (metrics that methods train with).
    ("config", "data", "layers", "metrics", "models", "privacy"),
    ("methods",),
    ("engine",),
    ("analysis",),  # privacy probes and attacks of a trained federation (read simulations)
    ("cli", "report"),
    ("fedaug",),  # the root package: re-exports everything, runs the CLI
)

#: Same-layer edges that DESIGN.md rules out although they would not form a cycle.
FORBIDDEN: dict[tuple[str, str], str] = {("data", "models"): "a dataset never names a model"}

#: Upward imports allowed in the tree, as (importing module, imported package): none. A listed edge
#: that is no longer in the tree fails the test, so the list cannot go stale.
KNOWN_UPWARD: set[tuple[str, str]] = set()

Edge = tuple[str, str, str, int]  # (from package, to package, importing module, line)


def _module_name(path: Path, root: Path) -> tuple[str, bool]:
    """Dotted name of the module at ``path`` and whether it is a package ``__init__``."""
    parts = path.relative_to(root.parent).with_suffix("").parts
    if parts[-1] == "__init__":
        return ".".join(parts[:-1]), True
    return ".".join(parts), False


def _imports(path: Path, module: str, is_package: bool, root: Path) -> Iterator[tuple[str, int]]:
    """``(imported module, line)`` for every import statement of the file, relative ones resolved."""
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, node.lineno
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                here = module.split(".") if is_package else module.split(".")[:-1]
                base = ".".join(here[: len(here) - node.level + 1] + ([node.module] if node.module else []))
            else:
                base = node.module or ""
            for alias in node.names:  # `from pkg import sub` imports the submodule sub where there is one
                sub = root.parent.joinpath(*base.split("."), alias.name)
                yield (f"{base}.{alias.name}" if sub.is_dir() or sub.with_suffix(".py").is_file() else base), node.lineno


def _package(module: str, root_name: str) -> str | None:
    """The package ``root.<package>`` a module belongs to; ``root_name`` for the root package."""
    parts = module.split(".")
    if parts[0] != root_name:
        return None
    return root_name if len(parts) == 1 or parts[1] in ("__init__", "__main__") else parts[1]


def import_edges(root: Path) -> list[Edge]:
    """Every import between two different packages under ``root`` (a package directory)."""
    edges = []
    for path in sorted(root.rglob("*.py")):
        module, is_package = _module_name(path, root)
        src = _package(module, root.name)
        for target, line in _imports(path, module, is_package, root):
            dst = _package(target, root.name)
            if dst is not None and dst != src:
                edges.append((src, dst, module, line))
    return edges


def packages(root: Path) -> set[str]:
    """The root package's name and its direct subpackages and modules (``_private`` ones included)."""
    found = {p.name for p in root.iterdir() if p.is_dir() and (p / "__init__.py").is_file()}
    found |= {p.stem for p in root.glob("*.py") if p.stem not in ("__init__", "__main__")}
    return found | {root.name}


def layer_problems(edges: Sequence[Edge], layers: Sequence[Sequence[str]],
                   known: set[tuple[str, str]] = frozenset(), forbidden: dict[tuple[str, str], str] | None = None
                   ) -> list[str]:
    """One line per import that points to a higher layer (and is not in ``known``), per forbidden
    same-layer edge, and per package without a layer."""
    level = {pkg: i for i, layer in enumerate(layers) for pkg in layer}
    problems = []
    for src, dst, module, line in edges:
        if src not in level or dst not in level:
            problems.append(f"{module}:{line} imports {dst}: place {src if src not in level else dst} in a layer")
        elif level[dst] > level[src] and (module, dst) not in known:
            problems.append(f"{module}:{line} imports {dst} (layer {level[dst]}), above {src} (layer {level[src]})")
        elif (src, dst) in (forbidden or {}):
            problems.append(f"{module}:{line} imports {dst}: {forbidden[src, dst]}")
    return sorted(set(problems))


def cycles(edges: Sequence[Edge], skip: set[tuple[str, str]] = frozenset()) -> list[list[str]]:
    """The package cycles (strongly connected components of more than one package), each sorted;
    edges whose (module, package) is in ``skip`` are left out."""
    graph: dict[str, set[str]] = defaultdict(set)
    for src, dst, module, _ in edges:
        if (module, dst) not in skip:
            graph[src].add(dst)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found = []

    def visit(v: str) -> None:  # Tarjan's algorithm
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(list(graph)):
        if v not in index:
            visit(v)
    return sorted(found)


# ---------------------------------------------------------------------------------- fedaug itself

EDGES = import_edges(SRC)


def test_every_package_has_exactly_one_layer():
    declared = [pkg for layer in LAYERS for pkg in layer]
    assert len(declared) == len(set(declared)), "a package is declared in two layers"
    assert packages(SRC) == set(declared), "place new packages in LAYERS (and remove deleted ones)"


def test_no_import_points_upward():
    problems = layer_problems(EDGES, LAYERS, KNOWN_UPWARD, FORBIDDEN)
    assert not problems, "imports against DESIGN.md's layers:\n" + "\n".join(problems)


def test_known_upward_imports_are_still_in_the_tree():
    present = {(module, dst) for _, dst, module, _ in EDGES}
    assert not KNOWN_UPWARD - present, f"fixed, delete from KNOWN_UPWARD: {sorted(KNOWN_UPWARD - present)}"


def test_no_cycle_between_packages():
    assert cycles(EDGES, KNOWN_UPWARD) == []


# ------------------------------------------------------------------ the checker on a fake package


def _tree(root: Path, files: dict[str, str]) -> Path:
    pkg = root / "fake"
    for name, text in {"__init__.py": "", **files}.items():
        path = pkg / name
        path.parent.mkdir(parents=True, exist_ok=True)
        for parent in path.relative_to(pkg).parents:
            (pkg / parent / "__init__.py").touch()
        path.write_text(text)
    return pkg


FAKE_LAYERS = (("core",), ("data", "models"), ("methods",), ("fake",))


@pytest.mark.parametrize("code", [
    "import fake.methods.fedavg",
    "from fake.methods import fedavg",
    "from fake import methods",
    "from ..methods.fedavg import FedAvg",  # relative
    "def f():\n    from fake.methods import fedavg",  # lazy
    "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from fake.methods.fedavg import FedAvg",
])
def test_an_upward_import_is_reported_with_its_line(tmp_path, code):
    pkg = _tree(tmp_path, {"core/rng.py": "import torch\n\n" + code, "methods/fedavg.py": "from fake.core import rng"})
    lines = len(code.splitlines()) + 2
    assert layer_problems(import_edges(pkg), FAKE_LAYERS) == [
        f"fake.core.rng:{lines} imports methods (layer 2), above core (layer 0)"]


def test_downward_and_root_imports_are_fine_and_known_edges_are_skipped(tmp_path):
    pkg = _tree(tmp_path, {"__init__.py": "from fake import methods", "methods/fedavg.py": "from . import _common\n"
                           "from fake.data.base import Split", "methods/_common.py": "", "data/base.py": "",
                           "core/rng.py": "from fake import __version__"})
    edges = import_edges(pkg)
    assert {(s, d) for s, d, _, _ in edges} == {("fake", "methods"), ("methods", "data"), ("core", "fake")}
    assert layer_problems(edges, FAKE_LAYERS) == ["fake.core.rng:1 imports fake (layer 3), above core (layer 0)"]
    assert layer_problems(edges, FAKE_LAYERS, known={("fake.core.rng", "fake")}) == []


def test_a_same_layer_cycle_a_forbidden_edge_and_an_unplaced_package_are_reported(tmp_path):
    pkg = _tree(tmp_path, {"data/base.py": "from fake.models import split", "models/split.py": "import fake.data",
                           "extra/x.py": "from fake.core import rng", "core/rng.py": ""})
    edges = import_edges(pkg)
    assert cycles(edges) == [["data", "models"]]
    assert cycles(edges, skip={("fake.models.split", "data")}) == []
    assert packages(pkg) == {"fake", "core", "data", "extra", "models"}
    assert layer_problems(edges, FAKE_LAYERS, forbidden={("data", "models"): "a dataset never names a model"}) == [
        "fake.data.base:1 imports models: a dataset never names a model",
        "fake.extra.x:1 imports core: place extra in a layer",
    ]
