"""CUDA graphs: a client's whole local step captured once and replayed for every batch of every
client (``train.cuda_graph``, issue 39), so that a small model's step costs one graph launch instead of
hundreds of kernel launches.

A worker's :class:`GraphedSteps` owns static tensors that every replay reads and writes at fixed
addresses: the worker model's own parameters and buffers (each client's ``receive`` loads its
weights into them in place), a local optimiser whose state is zeroed in place for each client
(:func:`reset_optimizer_state_`), a copy of the components' per-client tensors
(:meth:`~fedaug.methods.component.Component.group_capture`, copied in for each client:
:func:`copy_state_`), each graph's input batch, and the sums of the loss and its terms. One step
is what one client of a group computes (:mod:`fedaug.engine.client.grouped`, without ``vmap``): the forward
pass, the task loss and every component's loss terms (``group_loss_terms``), backward, every
component's ``group_before_step`` (SCAFFOLD's correction), the optimiser's step, the sums. It is
captured once per batch shape and learning rate (:func:`graph_key`: a last partial batch, a client
smaller than a batch, a scheduled learning rate each get their own graph; at most :data:`MAX_GRAPHS`
are kept), after a few warm-up steps on a side stream that are then undone (PyTorch's notes on CUDA
graphs, "whole-network capture").

A recipe is captured when it can train grouped and draws no random numbers in its steps
(:func:`graph_blockers`); otherwise its clients train eagerly, after one notice
(:func:`graphed_steps`). A step that draws from the global random stream is refused when it is
first captured. docs/engine.md, "CUDA graphs", states the expected numerics; this path has not yet
run on a GPU.
"""

from __future__ import annotations

import contextlib
import warnings
from collections import OrderedDict
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Protocol

import torch
from torch import Tensor, nn

from fedaug.config.schema import TrainConfig
from fedaug.core.device import module_device
from fedaug.core.errors import ConfigError
from fedaug.engine.client.grouped import client_loss, component_blocker, group_blockers, optimizer_step
from fedaug.engine.client.training import make_optimizer
from fedaug.methods._common import trainable
from fedaug.methods.component import ClientCtx, Component, State
from fedaug.methods.recipe import Recipe, overrides

#: graphs kept per worker (least recently used dropped first; a dropped shape is captured again)
MAX_GRAPHS = 8
#: eager steps before a capture (PyTorch's example takes 3): lazy state, cuBLAS handles, allocator pools
WARMUP_STEPS = 3

#: ``(input batch shape, target batch shape, learning rate)``: what a captured step is specific to
GraphKey = tuple[tuple[int, ...], tuple[int, ...], float]


class Capture(Protocol):
    """How :class:`GraphedSteps` warms up and captures a step (:class:`CudaGraphs` on a GPU)."""

    def warm_up(self) -> contextlib.AbstractContextManager[None]:
        """Where the warm-up steps before a capture run."""

    def capture(self, body: Callable[[], None]) -> Callable[[], None]:
        """``body`` captured without running it; returns what replays it."""

    def rng_state(self) -> Tensor:
        """The global random stream's state on the device (a step must not draw from it)."""


class CudaGraphs:
    """:class:`Capture` by :class:`torch.cuda.CUDAGraph` on ``device``: the warm-up runs on a side
    stream that waits for the current one and is waited for after, as PyTorch's notes ask."""

    def __init__(self, device: torch.device) -> None:
        self.device = device

    @contextlib.contextmanager
    def warm_up(self) -> Iterator[None]:
        stream, current = torch.cuda.Stream(self.device), torch.cuda.current_stream(self.device)
        stream.wait_stream(current)
        with torch.cuda.stream(stream):
            yield
        current.wait_stream(stream)

    def capture(self, body: Callable[[], None]) -> Callable[[], None]:
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            body()
        return graph.replay

    def rng_state(self) -> Tensor:
        return torch.cuda.get_rng_state(self.device)


def graph_blocker(c: Component) -> str:
    """Why ``c``'s client steps cannot be captured (``""``: they can): why it cannot train grouped
    (:func:`~fedaug.engine.client.grouped.component_blocker`), or that it draws random numbers in every step
    (its ``group_inputs``: not captured yet)."""
    if why := component_blocker(c):
        return why
    return "it draws random numbers in every step, which a captured step does not take yet" if overrides(
        c, "group_inputs") else ""


def graph_blockers(recipe: Recipe, model: nn.Module) -> list[str]:
    """What keeps ``recipe`` on ``model`` from training by CUDA graphs, one entry per component (its
    :func:`graph_blocker`) and one for a model with dropout (empty: nothing)."""
    return group_blockers(recipe, model, graph_blocker)


def graphed_steps(cfg: TrainConfig, recipe: Recipe, model: nn.Module) -> GraphedSteps | None:
    """A worker's :class:`GraphedSteps` where ``cfg.cuda_graph`` is on and the recipe can be captured;
    ``None`` (eager steps) where it is off, or, with one notice (a :class:`UserWarning`) naming every
    reason, where :func:`graph_blockers` finds one.

    Raises:
        ConfigError: ``cfg.cuda_graph`` with ``model`` on a device other than CUDA.
    """
    if not cfg.cuda_graph:
        return None
    device = module_device(model)
    if device.type != "cuda":
        raise ConfigError(f"train.cuda_graph=true captures CUDA graphs, but the model is on {device}: set "
                          "device='cuda' (or 'auto' on a machine with CUDA) or train.cuda_graph=false")
    blockers = graph_blockers(recipe, model)
    if blockers:
        warnings.warn(f"train.cuda_graph=true: clients train eagerly, since {'; '.join(blockers)} cannot be "
                      "captured", UserWarning, stacklevel=2)
        return None
    return GraphedSteps(recipe, model, cfg, CudaGraphs(device))


def graph_key(batch_size: int, x: Tensor, y: Tensor, lr: float) -> GraphKey:
    """The key of the graph that steps on a batch of ``batch_size`` samples of ``x`` ``(N, *shape)``
    with targets from ``y`` ``(N, *target shape)`` at learning rate ``lr`` (baked into the captured
    optimiser step).

    >>> graph_key(32, torch.zeros(100, 3, 28, 28), torch.zeros(100, dtype=torch.long), 0.05)
    ((32, 3, 28, 28), (32,), 0.05)
    """
    return (batch_size, *x.shape[1:]), (batch_size, *y.shape[1:]), float(lr)


def reset_optimizer_state_(optimizer: torch.optim.Optimizer) -> None:
    """Zero every tensor of ``optimizer``'s state in place: what a captured step reads stays where it
    is, and the next step is a fresh optimiser's. SGD's momentum buffer ``b`` then takes
    ``b = rho * 0 + g = g`` where a fresh one takes ``b = g``; Adam's step count and moments start at 0
    in a fresh one too. An optimiser without state (no step yet) is left so."""
    tensors = [v for s in optimizer.state.values() for v in s.values() if isinstance(v, Tensor)]
    if tensors:
        torch._foreach_zero_(tensors)


def state_leaves(state: State) -> list[Tensor]:
    """The tensors of a nested dict of tensors, in its order."""
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
    """One captured step: its static input batch ``(B, *shape)``, targets and replay."""

    x: Tensor
    y: Tensor
    replay: Callable[[], None]


class GraphedSteps:
    """A worker's local steps by captured graphs (:data:`~fedaug.engine.client.training.LocalSteps`, module docstring).

    Args:
        recipe: the method; :func:`graph_blockers` finds nothing.
        model: the worker model, on the device ``capture`` captures on; its trainable parameters
            must stay the same tensors (they are the graphs' static parameters).
        cfg: local training options (SGD or Adam; float32).
        capture: how steps are warmed up and captured (:class:`CudaGraphs`).
        max_graphs: graphs kept (:data:`MAX_GRAPHS`).
    """

    def __init__(self, recipe: Recipe, model: nn.Module, cfg: TrainConfig, capture: Capture,
                 max_graphs: int = MAX_GRAPHS) -> None:
        self.recipe, self.model, self.capture, self.max_graphs = recipe, model, capture, max_graphs
        self.params = trainable(model)
        self.consts = {k: t for k, t in (*model.named_parameters(), *model.named_buffers()) if k not in self.params}
        self.optimizer = make_optimizer(list(self.params.values()), cfg, cfg.lr,
                                        capturable=module_device(model).type == "cuda")
        self.adjusters = recipe.per_batch["before_step"]
        self.graphs: OrderedDict[GraphKey, Graphed] = OrderedDict()
        self.captured: State | None = None  # the components' per-client tensors, static
        self.total: Tensor | None = None  # the sum of the steps' total losses, static
        self.sums: dict[str, Tensor] = {}  # the sums of each loss term, static
        self.num_captures = 0
        self._loss: Callable[..., tuple[Tensor, dict[str, Tensor]]] | None = None

    def __call__(self, ctx: ClientCtx, views: dict[str, ClientCtx],
                 steps: list[Tensor]) -> tuple[Tensor, dict[str, Tensor]]:
        """The client's steps (after every ``receive``): its tensors into the static ones, then per
        batch, the batch into its graph's static input and a replay.

        Returns:
            The sums of the steps' total losses and of each loss term: static tensors, valid until
            the next call.
        """
        captured = {c.name: c.group_capture(views[c.name]) for c in self.recipe.participants("train")}
        if self.captured is None:
            self.captured = _cloned(captured)
        else:
            copy_state_(self.captured, captured)
        reset_optimizer_state_(self.optimizer)
        if self.total is None:
            self.total = torch.zeros((), device=ctx.device)
        torch._foreach_zero_([self.total, *self.sums.values()])
        x, y = ctx.data.x, ctx.data.y
        for idx in steps:
            key = graph_key(len(idx), x, y, ctx.lr)
            graph = self.graphs.get(key)
            if graph is None:
                graph = self._capture(key, ctx, x[idx], y[idx])
            else:
                self.graphs.move_to_end(key)
            torch.index_select(x, 0, idx, out=graph.x)
            torch.index_select(y, 0, idx, out=graph.y)
            graph.replay()
        return self.total, self.sums if steps else {}

    def _static(self) -> list[Tensor]:
        """Every tensor a step writes or reads across steps, as far as it exists yet."""
        opt = [v for s in self.optimizer.state.values() for v in s.values() if isinstance(v, Tensor)]
        sums = [] if self.total is None else [self.total, *self.sums.values()]
        return [*self.params.values(), *self.consts.values(), *state_leaves(self.captured or {}), *opt, *sums]

    def _capture(self, key: GraphKey, ctx: ClientCtx, x: Tensor, y: Tensor) -> Graphed:
        """Capture the step on batch ``x``, ``y`` at ``ctx.lr`` as ``key``'s graph: warm-up steps on the
        batch, undone after (the model, optimiser state and sums as they were), then the capture."""
        if self._loss is None:
            self._loss = client_loss(self.recipe, self.model, ctx.task.loss)
        lr, static = ctx.lr, Graphed(x.clone(), y.clone(), lambda: None)
        saved = [(t, t.detach().clone()) for t in self._static()]
        fresh = not self.optimizer.state
        rng = self.capture.rng_state()

        def step() -> tuple[Tensor, dict[str, Tensor]]:
            self.optimizer.param_groups[0]["lr"] = lr  # read (and baked in) when the step is captured
            return optimizer_step(self._loss, self.optimizer, self.adjusters, self.params, self.captured,
                                  (self.consts, self.captured, {}, static.x, static.y))

        with self.capture.warm_up():
            for _ in range(WARMUP_STEPS):
                total, terms = step()
        if not torch.equal(self.capture.rng_state(), rng):
            raise ConfigError("train.cuda_graph=true: a training step of this model draws from the global random "
                              "stream (a random layer other than dropout), which a captured step would replay with "
                              "other numbers; set train.cuda_graph=false")
        if not self.sums:
            self.sums = {k: torch.zeros_like(v) for k, v in terms.items()}
        with torch.no_grad():
            torch._foreach_copy_([t for t, _ in saved], [v for _, v in saved])
        if fresh:
            reset_optimizer_state_(self.optimizer)

        def body() -> None:
            total, terms = step()
            torch._foreach_add_([self.total, *self.sums.values()], [total, *(terms[k] for k in self.sums)])

        static.replay = self.capture.capture(body)
        self.num_captures += 1
        self.graphs[key] = static
        if len(self.graphs) > self.max_graphs:
            self.graphs.popitem(last=False)
        return static


def _cloned(state: State) -> State:
    """Detached copies of a nested dict of tensors."""
    return {k: _cloned(v) if isinstance(v, dict) else v.detach().clone() for k, v in state.items()}
