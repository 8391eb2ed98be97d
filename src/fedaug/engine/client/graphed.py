"""CUDA graphs: a client's whole local step captured once and replayed for every batch of every
client (``train.cuda_graph``, issue 39), so that a small model's step costs one graph launch instead of
hundreds of kernel launches.

What is captured is the one client step of :mod:`~fedaug.engine.client.step` (its loss and update); the
step's input (the batch through the components' ``transform_batch``, their draws: FFA's coin and noise) is
made before each replay, as an eager step makes it, and copied into the graph's static inputs. A worker's
:class:`GraphedSteps` owns the static tensors that every replay reads and writes at fixed addresses: the
worker model's own parameters and buffers (each client's ``receive`` loads its weights into them in place), a
local optimiser whose state is zeroed in place for each client (:func:`reset_optimizer_state_`), a copy of the
components' per-client tensors (``group_capture``, copied in for each client, :func:`copy_state_`, and handed
back before ``reply``), each graph's inputs, and the sums of the loss and its terms. A step is captured once
per input shape and learning rate (:func:`graph_key`: a last partial batch, a client smaller than a batch, a
scheduled learning rate each get their own graph; at most :data:`MAX_GRAPHS` are kept), after a few warm-up
steps that are then undone (PyTorch's notes on CUDA graphs, "whole-network capture").

A recipe is captured when every component has step forms and the run trains in float32
(:func:`capture_blockers`); otherwise its clients train eagerly, after one notice (:func:`graphed_steps`). A step
that draws from the global random stream is found when it is first captured: refused with
``train.cuda_graph = true``, trained eagerly from there on with ``"auto"`` (the default). On a CPU,
:class:`~fedaug.engine.client.capture.TracedCapture` gives a capture CUDA graphs' semantics, which is how the
tests prove every capturable method equal to eager steps; docs/engine.md, "CUDA graphs", has the table.
"""

from __future__ import annotations

import warnings
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from fedaug.config.schema import FLOAT32, TrainConfig, choice_text
from fedaug.core.device import module_device
from fedaug.core.errors import ConfigError
from fedaug.engine.client.capture import Capture, CaptureRefused, CudaGraphs
from fedaug.engine.client.step import LossFn, StepInputs, StepPlan, mini_batch, plan_for, step_blockers
from fedaug.engine.client.training import make_optimizer
from fedaug.models.walk import trainable
from fedaug.methods.component import ClientCtx, State
from fedaug.methods.recipe import Recipe

#: graphs kept per worker (least recently used dropped first; a dropped shape is captured again)
MAX_GRAPHS = 8
#: eager steps before a capture (PyTorch's example takes 3): lazy state, cuBLAS handles, allocator pools
WARMUP_STEPS = 3

#: what a captured step is specific to (:func:`graph_key`): the shapes and dtypes of its inputs (the batch,
#: the targets, each draw), then the learning rate (baked into the captured optimiser step)
GraphKey = tuple[object, ...]


def capture_blockers(recipe: Recipe, model: nn.Module, precision: str) -> list[str]:
    """What keeps ``recipe`` on ``model`` at ``precision`` from being captured, one entry each (empty: nothing):
    :func:`~fedaug.engine.client.step.step_blockers`, and a mixed precision (a captured step trains in float32)."""
    mixed = [] if precision in FLOAT32 else [f"a step at precision '{precision}' (captured steps train in float32)"]
    return step_blockers(recipe, model) + mixed


def graphed_steps(cfg: TrainConfig, recipe: Recipe, model: nn.Module, precision: str = "32") -> GraphedSteps | None:
    """A worker's :class:`GraphedSteps` where ``cfg.cuda_graph`` asks for captured steps on the model's device and
    :func:`capture_blockers` finds nothing, else ``None`` (eager steps).

    ``true`` and ``"auto"`` capture on a CUDA device; where a blocker is found there, the clients train eagerly
    after one notice (a :class:`UserWarning`) naming every reason (with ``"auto"`` and ``train.group_clients > 1``,
    which trains in float32 only, the grouping's notice names them: :func:`~fedaug.engine.client.grouped.group_size`).
    On another device ``"auto"`` trains eagerly without a notice. ``false`` never captures.

    Raises:
        ConfigError: ``true`` with ``model`` on a device other than CUDA.
    """
    mode = cfg.cuda_graph
    if mode is False:
        return None
    device = module_device(model)
    if device.type != "cuda":
        if mode == "auto":
            return None
        raise ConfigError(f"train.cuda_graph=true captures CUDA graphs, but the model is on {device}: set "
                          "device='cuda' (or 'auto' on a machine with CUDA) or train.cuda_graph=false")
    blockers = capture_blockers(recipe, model, precision)
    if blockers:
        if mode is True or cfg.group_clients == 1:
            warnings.warn(f"train.cuda_graph={choice_text(mode)}: clients train eagerly, since {'; '.join(blockers)} "
                          "cannot be captured", UserWarning, stacklevel=2)
        return None
    return GraphedSteps(recipe, model, cfg, CudaGraphs(device), strict=mode is True)


def graph_key(inputs: StepInputs, lr: float) -> GraphKey:
    """The key of the graph that steps on ``inputs`` at learning rate ``lr``: the shape and dtype of every
    input tensor, then ``lr``.

    >>> from fedaug.engine.client.step import StepInputs
    >>> graph_key(StepInputs(torch.zeros(32, 3, 28, 28), torch.zeros(32, dtype=torch.long), {}), 0.05)
    (((32, 3, 28, 28), torch.float32), ((32,), torch.int64), 0.05)
    """
    return (*((tuple(t.shape), t.dtype) for t in _input_leaves(inputs)), float(lr))


def _input_leaves(inputs: StepInputs) -> list[Tensor]:
    """The tensors of a step's input, in a fixed order (draws that are Python scalars made tensors)."""
    return [inputs.x, inputs.y, *(torch.as_tensor(v) for v in state_leaves(inputs.drawn))]


def reset_optimizer_state_(optimizer: torch.optim.Optimizer) -> None:
    """Zero every tensor of ``optimizer``'s state in place: what a captured step reads stays where it
    is, and the next step is a fresh optimiser's. SGD's momentum buffer ``b`` then takes
    ``b = rho * 0 + g = g`` where a fresh one takes ``b = g``; Adam's step count and moments start at 0
    in a fresh one too. An optimiser without state (no step yet) is left so."""
    tensors = [v for s in optimizer.state.values() for v in s.values() if isinstance(v, Tensor)]
    if tensors:
        torch._foreach_zero_(tensors)


def state_leaves(state: State) -> list[Tensor]:
    """The leaves (tensors, or Python scalars of a step's draws) of a nested dict, in its order."""
    return [t for v in state.values() for t in (state_leaves(v) if isinstance(v, dict) else [v])]


def copy_state_(dst: State, src: State) -> None:
    """Copy ``src``'s tensors into ``dst``'s, in place, where both have one structure and shapes.

    Raises:
        ValueError: another structure or a shape (a component's ``group_capture`` must give every
            client of a run the same one), naming where.
    """
    def check(a: State, b: State, where: str) -> None:
        if a.keys() != b.keys():
            raise ValueError(f"captured state{where} has keys {sorted(b)}, the graph's copy {sorted(a)}: a "
                             "component's group_capture must give every client the same structure")
        for k, v in a.items():
            if isinstance(v, dict):
                check(v, b[k], f"{where}/{k}")
            elif v.shape != b[k].shape:
                raise ValueError(f"captured state{where}/{k} has shape {tuple(b[k].shape)}, the graph's copy "
                                 f"{tuple(v.shape)}: a component's group_capture must give every client the same shapes")

    check(dst, src, "")
    leaves = state_leaves(dst)
    if leaves:
        torch._foreach_copy_(leaves, state_leaves(src))


@dataclass
class Graphed:
    """One captured step: its static inputs (the batch ``(B, *shape)``, the targets, the draws) and replay."""

    inputs: StepInputs
    replay: Callable[[], None]

    def load(self, inputs: StepInputs) -> None:
        """Copy a step's input into the static one (Python scalars of the draws by ``fill_``)."""
        with torch.no_grad():
            for static, value in zip(_static_leaves(self.inputs), [inputs.x, inputs.y, *state_leaves(inputs.drawn)]):
                if isinstance(value, Tensor):
                    static.copy_(value)
                else:
                    static.fill_(value)


def _static_leaves(inputs: StepInputs) -> list[Tensor]:
    return [inputs.x, inputs.y, *state_leaves(inputs.drawn)]


def _as_static(inputs: StepInputs, device: torch.device) -> StepInputs:
    """Tensors of their own for a step's input (the graph's static inputs), Python scalars made tensors."""
    def own(v: object) -> object:
        if isinstance(v, dict):
            return {k: own(w) for k, w in v.items()}
        return v.detach().clone() if isinstance(v, Tensor) else torch.tensor(v, device=device)

    return StepInputs(inputs.x.detach().clone(), inputs.y.detach().clone(), own(inputs.drawn))  # type: ignore[arg-type]


class GraphedSteps:
    """A worker's local steps by captured graphs (:data:`~fedaug.engine.client.training.LocalSteps`, module docstring).

    Args:
        recipe: the method; :func:`~fedaug.engine.client.step.step_blockers` finds nothing.
        model: the worker model, on the device ``capture`` captures on; its trainable parameters
            must stay the same tensors (they are the graphs' static parameters).
        cfg: local training options (SGD or Adam; float32).
        capture: how steps are warmed up and captured (:class:`~fedaug.engine.client.capture.CudaGraphs`;
            :class:`~fedaug.engine.client.capture.TracedCapture` on a CPU).
        max_graphs: graphs kept (:data:`MAX_GRAPHS`).
        strict: a step refused when it is first captured (:class:`~fedaug.engine.client.capture.CaptureRefused`)
            fails (``train.cuda_graph = true``); else (``"auto"``) it is stepped eagerly, after one notice, and so
            is every later step (:attr:`refused` says why; the worker then trains eagerly).
    """

    def __init__(self, recipe: Recipe, model: nn.Module, cfg: TrainConfig, capture: Capture,
                 max_graphs: int = MAX_GRAPHS, strict: bool = True) -> None:
        self.recipe, self.model, self.capture, self.max_graphs = recipe, model, capture, max_graphs
        self.strict = strict
        #: why a capture was refused (the steps since then were eager), or ``""``
        self.refused = ""
        self.params = trainable(model)
        self.optimizer = make_optimizer(list(self.params.values()), cfg, cfg.lr)
        self.graphs: OrderedDict[GraphKey, Graphed] = OrderedDict()
        self.captured: State | None = None  # the components' per-client tensors, static
        self.total: Tensor | None = None  # the sum of the steps' total losses, static
        self.sums: dict[str, Tensor] = {}  # the sums of each loss term, static
        self.num_captures = 0
        self._loss: LossFn | None = None

    def __call__(self, ctx: ClientCtx, views: dict[str, ClientCtx],
                 steps: list[Tensor]) -> tuple[Tensor, dict[str, Tensor]]:
        """The client's steps (after every ``receive``): its tensors into the static ones, then per
        batch, the step's input into its graph's static one and a replay (an eager step on the static tensors
        once a capture was refused, :attr:`refused`); the components' tensors handed back at the end.

        Returns:
            The sums of the steps' total losses and of each loss term: static tensors, valid until
            the next call.
        """
        plan = plan_for(self.recipe, self.model, ctx.task.loss)
        captured = plan.capture(views)
        if self.captured is None or _layout(self.captured) != _layout(captured):
            self.captured = _cloned(captured)  # a new layout (FLea's buffer grew): new static tensors, new graphs
            self.graphs.clear()
        else:
            copy_state_(self.captured, captured)
        reset_optimizer_state_(self.optimizer)
        if self.total is None:
            self.total = torch.zeros((), device=ctx.device)
        torch._foreach_zero_([self.total, *self.sums.values()])
        x, y = ctx.data.x, ctx.data.y
        for idx in steps:
            inputs = plan.prepare(views, mini_batch(x, y, idx))
            graph = None if self.refused else self._graph(ctx, inputs)
            if graph is None:
                self._step_eagerly(plan, ctx.lr, inputs)
                continue
            graph.load(inputs)
            graph.replay()
        plan.restore(views, self.captured)
        return self.total, self.sums if steps else {}

    def _graph(self, ctx: ClientCtx, inputs: StepInputs) -> Graphed | None:
        """The graph that steps on ``inputs`` at ``ctx.lr``, captured where there is none yet; ``None`` where the
        capture is refused and the steps are not :attr:`strict` (:attr:`refused` set, one notice)."""
        key = graph_key(inputs, ctx.lr)
        graph = self.graphs.get(key)
        if graph is not None:
            self.graphs.move_to_end(key)
            return graph
        try:
            return self._capture(key, ctx, inputs)
        except CaptureRefused as exc:
            if self.strict:
                raise
            self.refused = exc.reason
        warnings.warn(f"train.cuda_graph=auto: clients train eagerly, since {self.refused}", UserWarning, stacklevel=3)
        return None

    def _step_eagerly(self, plan: StepPlan, lr: float, inputs: StepInputs) -> None:
        """The step a graph would replay, run eagerly on the same static tensors (its sums added the same way)."""
        total, terms = self._update(plan, lr, inputs)
        self.sums = self.sums or {k: torch.zeros_like(v) for k, v in terms.items()}
        add_step_sums(self.total, self.sums, total, terms)  # type: ignore[arg-type]

    def _update(self, plan: StepPlan, lr: float, inputs: StepInputs) -> tuple[Tensor, dict[str, Tensor]]:
        """One local step on ``inputs`` at ``lr`` on the static tensors: what a graph captures (and replays), and
        what runs eagerly once a capture was refused. Its total loss and terms."""
        if self._loss is None:
            self._loss = plan.loss()
        self.optimizer.param_groups[0]["lr"] = lr  # read (and baked in) when the step is captured
        return plan.update(self._loss, self.optimizer, self.params, self.captured,  # type: ignore[arg-type]
                           (None, None, self.captured, inputs.drawn, inputs.x, inputs.y))

    def _static(self) -> list[Tensor]:
        """Every tensor a step writes or reads across steps, as far as it exists yet."""
        opt = [v for s in self.optimizer.state.values() for v in s.values() if isinstance(v, Tensor)]
        sums = [] if self.total is None else [self.total, *self.sums.values()]
        model = [t for t in (*self.model.parameters(), *self.model.buffers())]
        return [*model, *state_leaves(self.captured or {}), *opt, *sums]

    def _capture(self, key: GraphKey, ctx: ClientCtx, inputs: StepInputs) -> Graphed:
        """Capture the step on ``inputs`` at ``ctx.lr`` as ``key``'s graph: warm-up steps on them, undone
        after (the model, optimiser state and sums as they were), then the capture."""
        plan = plan_for(self.recipe, self.model, ctx.task.loss)
        lr, static = ctx.lr, Graphed(_as_static(inputs, ctx.device), lambda: None)
        static.replay, self.sums = capture_step(self.capture, lambda: self._update(plan, lr, static.inputs),
                                                self._static(), self.optimizer, self.total,
                                                self.sums)  # type: ignore[arg-type]
        self.num_captures += 1
        self.graphs[key] = static
        if len(self.graphs) > self.max_graphs:
            self.graphs.popitem(last=False)
        return static


def capture_step(capture: Capture, step: Callable[[], tuple[Tensor, dict[str, Tensor]]], static: list[Tensor],
                 optimizer: torch.optim.Optimizer, total: Tensor, sums: dict[str, Tensor]
                 ) -> tuple[Callable[[], None], dict[str, Tensor]]:
    """A step captured by the protocol of PyTorch's notes on CUDA graphs: :data:`WARMUP_STEPS` warm-up steps of
    ``step`` (on a side stream), undone after (every tensor of ``static``, the optimiser's state where it had
    none), the global random stream checked untouched, then the capture of ``step`` adding its total and loss terms
    to ``total`` and ``sums`` (made from the warm-up's terms where empty).

    Returns:
        What replays the step, and the sums it adds to.

    Raises:
        CaptureRefused: the step drew from the global random stream (the warm-up undone, the stream put back).
    """
    saved = [(t, t.detach().clone()) for t in static]
    fresh, rng = not optimizer.state, capture.rng_state()
    with capture.warm_up():
        for _ in range(WARMUP_STEPS):
            _, terms = step()
    drew = not torch.equal(capture.rng_state(), rng)
    sums = sums or {k: torch.zeros_like(v) for k, v in terms.items()}
    with torch.no_grad():
        torch._foreach_copy_([t for t, _ in saved], [v for _, v in saved])
    if fresh:
        reset_optimizer_state_(optimizer)
    if drew:
        capture.set_rng_state(rng)
        raise CaptureRefused("a training step of this model draws from the global random stream (a random layer "
                             "other than dropout), which a captured step would replay with other numbers")

    def body() -> None:
        add_step_sums(total, sums, *step())

    return capture.capture(body), sums


def add_step_sums(total: Tensor, sums: dict[str, Tensor], step_total: Tensor, terms: dict[str, Tensor]) -> None:
    """Add a step's total loss and its terms to the running ``total`` and ``sums`` (in place; ``sums``' keys)."""
    torch._foreach_add_([total, *sums.values()], [step_total, *(terms[k] for k in sums)])


def _layout(state: State) -> object:
    """The structure, shapes and dtypes of a nested dict of tensors (what a graph's static copy depends on)."""
    return {k: _layout(v) if isinstance(v, dict) else (tuple(v.shape), v.dtype) for k, v in state.items()}


def _cloned(state: State) -> State:
    """Detached copies of a nested dict of tensors."""
    return {k: _cloned(v) if isinstance(v, dict) else v.detach().clone() for k, v in state.items()}
