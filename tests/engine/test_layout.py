"""The engine's layout (issue 47, docs/engine.md "The engine's parts"): its rooms and the arrows between them,
read from the import statements of ``src/fedaug/engine`` (every import, lazy ones too, as
tests/test_import_graph.py reads them), and every import path of the last release still working.
"""

from __future__ import annotations

import ast
import importlib
import warnings
from collections import defaultdict
from pathlib import Path

import pytest

ENGINE = Path(__file__).resolve().parents[2] / "src" / "fedaug" / "engine"

#: the public names of each engine module of release 0.1.0 (before the rooms), by old module
RELEASE_0_1: dict[str, list[str]] = {
    "simulate": ["Order", "InProcessFleet", "Simulation", "build_simulation", "run_experiment", "resume_experiment"],
    "pool": ["SPLITS", "WorkerDied", "Packed", "pack", "expected_cost", "ProcessFleet"],
    "transport": ["ALIGN", "MIN_ARENA", "ARENA_PREFIX", "ARENA_DIR", "Channel", "remove_arenas"],
    "exchange": ["WHAT", "REQUIRED_METRICS", "MAX_METRICS", "metrics_problems", "PhaseResult", "exchange"],
    # (update_norm and lower_median went with the screening rule they served: issue 48 measures per part and
    # kind against the upper median)
    "screen": ["update_norms", "screen_updates", "check_trust"],
    "schedule": ["clients_per_round", "sample_clients", "learning_rate"],
    "evaluate": ["SPLITS", "FINETUNED", "evaluate_client", "meters_part", "meters_spec", "meters_of", "summarize_eval"],
    "finetune": ["PREFIX", "TrainingSender", "finetune_senders", "finetune_meters", "with_finetuned"],
    "attack": ["UPDATE_KINDS", "SHARED_KINDS", "STEALTHY", "DEFAULT_SCALE", "DEFAULT_STD", "SPREADS", "CENTRES",
               "choose_attackers", "attacked_parts", "check_attack", "flip_labels", "poison_tensor", "poison_part",
               "Attack"],
    "local": ["LocalSteps", "make_optimizer", "LocalOptimizer", "component_views", "batch_sizes", "num_local_steps",
              "batch_indices", "train_client", "eager_steps", "train_metrics"],
    # (client_loss and optimizer_step, the grouped path's own step, became the one step's StepPlan.loss and
    # StepPlan.update, issue 45: not kept)
    "grouped": ["GROUPED_FORMS", "component_blocker", "group_blockers", "group_size", "plan_groups", "stack_states",
                "state_slice", "train_group"],
    "graphed": ["MAX_GRAPHS", "WARMUP_STEPS", "GraphKey", "Capture", "CudaGraphs", "graph_blocker", "graph_blockers",
                "graphed_steps", "graph_key", "reset_optimizer_state_", "state_leaves", "copy_state_", "Graphed",
                "GraphedSteps"],
    "worker": ["build_worker_model", "Worker"],
    "query": ["answer_query"],
    "runlock": ["LOCK", "RunLock"],
    "tracking": ["TRACKING_FILE", "TB_DIR", "PACKAGES", "round_scalars", "Backend", "TensorBoardBackend",
                 "MlflowBackend", "check_tracking", "Tracker", "log_run_files"],
    "progress": ["Progress"],
    "fleet": ["METERS", "RECORD_NAME", "Reply", "Dropped", "Malformed", "Answer", "Fleet", "StatesHere"],
    "server": ["RESUME_ENVIRONMENT", "PLACEMENT", "Federation", "state_problems", "Server"],
    "records": ["CONFIG", "METRICS", "SUMMARY", "REPORT", "CKPT_DIR", "METRICS_GZ", "ASIDE", "CHECKPOINT_FORMAT",
                "CHECKPOINT_KEYS", "checkpoint_problem", "read_records", "RunDir"],
}
#: the old paths that are packages now and re-export their old module's names as their own (no warning)
PACKAGES_KEEPING_NAMES = {"server", "records"}
#: what the old names that changed are now
RENAMED = {("evaluate", "SPLITS"): "EVAL_SPLITS", ("finetune", "PREFIX"): "FINETUNE_PREFIX",
           ("pool", "SPLITS"): "PACKED_SPLITS", ("grouped", "GROUPED_FORMS"): "STEP_FORMS",
           ("grouped", "component_blocker"): "step_blocker", ("grouped", "group_blockers"): "step_blockers",
           ("graphed", "graph_blocker"): "step_blocker", ("graphed", "graph_blockers"): "step_blockers"}

OLD_PATHS = [(m, n) for m, names in RELEASE_0_1.items() for n in names]


@pytest.mark.parametrize(("module", "name"), OLD_PATHS, ids=[f"{m}.{n}" for m, n in OLD_PATHS])
def test_every_import_path_of_the_last_release_still_works(module: str, name: str) -> None:
    old = f"fedaug.engine.{module}"
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        value = getattr(importlib.import_module(old), name)
    moved = [w for w in caught if issubclass(w.category, DeprecationWarning) and old in str(w.message)]
    if module in PACKAGES_KEEPING_NAMES or (module == "fleet" and name == "StatesHere"):
        assert not moved, f"{old}.{name} is still its home and must not warn"
        return
    assert len(moved) == 1, f"importing {old}.{name} must warn once, naming the new home; got {caught}"
    home = str(moved[0].message).rsplit(" from ", 1)[1]
    new_name = RENAMED.get((module, name), name)
    assert new_name in str(moved[0].message)
    assert getattr(importlib.import_module(home), new_name) is value


def test_an_unknown_name_at_an_old_path_is_an_attribute_error() -> None:
    old = importlib.import_module("fedaug.engine.local")
    with pytest.raises(AttributeError, match="'fedaug.engine.local' has no attribute 'no_such_thing'"):
        old.no_such_thing  # noqa: B018


def _room(module: str) -> str:
    """The room of an engine module: ``protocol``, ``run``, ``server``, ``client``, ``fleet``, ``records``,
    ``flower`` or ``engine`` (the package itself and the old paths)."""
    parts = module.split(".")
    return parts[2] if len(parts) > 2 and parts[2] in (
        "protocol", "run", "server", "client", "fleet", "records", "flower") else "engine"


def _engine_imports() -> dict[str, set[str]]:
    """``{engine module: engine modules it imports}``, every import statement of every module."""
    graph: dict[str, set[str]] = defaultdict(set)
    for path in sorted(ENGINE.rglob("*.py")):
        rel = path.relative_to(ENGINE.parents[1]).with_suffix("").parts
        module = ".".join(rel[:-1] if rel[-1] == "__init__" else rel)
        graph[module]
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                     [node.module] if isinstance(node, ast.ImportFrom) and node.module and not node.level else [])
            for name in names:
                if name.startswith("fedaug.engine."):
                    graph[module].add(name)
    return graph


def _cycle(graph: dict[str, set[str]]) -> list[str]:
    """One import cycle of ``graph``, or []."""
    def deps(m: str) -> set[str]:
        return {d for d in graph.get(m, ()) if d in graph}

    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(m: str) -> list[str]:
        state[m] = 1
        stack.append(m)
        for d in sorted(deps(m)):
            if state.get(d) == 1:
                return stack[stack.index(d):] + [d]
            if d not in state and (found := visit(d)):
                return found
        stack.pop()
        state[m] = 2
        return []

    for m in sorted(graph):
        if m not in state and (found := visit(m)):
            return found
    return []


def test_the_engine_has_no_import_cycle() -> None:
    graph = {m: {d for d in deps if _room(d) != "engine"} for m, deps in _engine_imports().items()
             if m != "fedaug.engine"}  # the package's own __init__ imports run (the entry point), nothing imports it back
    assert _cycle(graph) == []


@pytest.mark.parametrize(("room", "may_not"), [
    ("client", {"fleet", "server", "records", "run", "flower"}),
    ("fleet", {"server", "records", "run"}),
    ("server", {"fleet", "run", "flower"}),
    ("records", {"client", "fleet", "server", "run", "flower"}),
    ("protocol", {"client", "fleet", "server", "records", "run", "flower"}),
])
def test_no_arrow_runs_against_the_layout(room: str, may_not: set[str]) -> None:
    wrong = sorted(f"{m} -> {d}" for m, deps in _engine_imports().items() if _room(m) == room
                   for d in deps if _room(d) in may_not)
    assert wrong == []


def test_the_protocol_is_the_only_module_the_client_and_fleet_sides_share() -> None:
    graph = _engine_imports()
    used_by = {room: {d for m, deps in graph.items() if _room(m) == room for d in deps
                      if _room(d) not in ("client", "fleet")} for room in ("client", "fleet")}
    assert used_by["client"] & used_by["fleet"] == {"fedaug.engine.protocol"}


def test_the_record_types_of_a_round_live_in_the_protocol() -> None:
    from fedaug.engine import protocol
    from fedaug.engine.server import exchange

    assert {t.__module__ for t in (protocol.Dropped, protocol.Rejected, protocol.Malformed, protocol.Reply)} == {
        "fedaug.engine.protocol"}
    assert not [n for n, v in vars(exchange).items() if isinstance(v, type) and v.__module__ == exchange.__name__
                and n in ("Dropped", "Rejected", "Malformed")]
