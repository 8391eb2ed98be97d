"""A client's local step, defined once (issue 45; DESIGN.md, "One step, several executions").

One step of local training is, in every execution:

1. **the input** (:meth:`StepPlan.prepare`), eagerly, for one client: its mini-batch, each component's
   ``transform_batch`` in recipe order (FedRDN's normalisation, mixup), then each component's draws of the
   step from the client's own streams (``group_inputs``: FFA's coin and noise), in the order a forward
   pass would draw them;
2. **the loss** (:meth:`StepPlan.loss`): the model's forward pass under the parameters given, inside every
   component's ``group_forward`` context (FFA layers on the drawn noise and the client's statistics), the
   task loss, each component's loss terms;
3. **the update** (:meth:`StepPlan.update`): backward from the total, each component's gradient adjustment
   (SCAFFOLD's correction), the optimiser's step.

The executions are ways of running this one definition: **eager** (:func:`~fedaug.engine.client.training.eager_steps`:
one client, the model's own parameters), **grouped** (:mod:`~fedaug.engine.client.grouped`: 2 under
:func:`torch.func.vmap` over the clients' stacked parameters, 3 on the stack) and **captured**
(:mod:`~fedaug.engine.client.graphed`: 2 and 3 captured once in a CUDA graph, 1 run before each replay and
copied into the graph's static inputs). What a step changes lives in tensors: the per-client tensors a
component's ``group_capture`` returns after ``receive`` are what the step reads and updates in place, and
``group_restore`` hands them back before ``reply``; never a Python attribute, which a replay would not
update.

A component that overrides a client hook without a step form (it replaces the task loss or the optimiser
step, or has only the eager ``forward`` / ``loss_terms`` / ``before_step``) still trains, eagerly: its hook
runs there as written, and :func:`step_blockers` says why it cannot be grouped or captured. A forward pass
replaced in its step form (``group_replace_forward``: FLea's split forward and feature mixing) runs in every
execution.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Mapping, Sequence
from contextlib import ExitStack
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn
from torch.func import functional_call

from fedaug.methods.component import Batch, ClientCtx, Component, Runner, State, transform_inputs
from fedaug.methods.recipe import Recipe, defining_class, overrides, replaces
from fedaug.models.walk import trainable

#: each client hook a component may override, and its step form (``None``: none exists; ``""``: the hook
#: itself runs in the step's eager input stage, so every execution can take it)
STEP_FORMS: dict[str, str | None] = {
    "receive": "group_capture", "reply": "group_restore", "loss_terms": "group_loss_terms",
    "before_step": "group_before_step", "transform_batch": "", "forward": "group_replace_forward",
    "task_loss": None, "step": None,
}

#: the hooks through which a component takes part in a step's loss or update (the batched part of grouped steps):
#: the rest of its client hooks run per client, around the step (``receive``, ``reply``, ``transform_batch``,
#: ``group_inputs``, ``group_capture``, ``group_restore``)
STEP_HOOKS = ("forward", "task_loss", "loss_terms", "before_step", "step", "group_forward", "group_replace_forward",
              "group_loss_terms", "group_before_step")

#: one client's loss: ``(params, consts, captured, inputs, x, y) -> (total, {term: value})``
LossFn = Callable[..., tuple[Tensor, dict[str, Tensor]]]


def step_blocker(c: Component) -> str:
    """Why ``c``'s client steps cannot run grouped or captured (``""``: they can): its own
    :meth:`~fedaug.methods.component.Component.group_blocker`, or a client hook it overrides below both the
    class that gives the hook's step form and the class that declared the component steppable (its
    ``group_blocker``): a subclass of a steppable component that changes what its clients compute, e.g.
    FedDyn's loss term on FedAvg. A replaced forward pass, task loss or optimiser step has no step form."""
    why = c.group_blocker()
    if why:
        return why
    cls = type(c)
    vouched = defining_class(cls, "group_blocker")

    def vouched_for(hook: str, form: str | None) -> bool:
        own = defining_class(cls, hook)
        return form is not None and any(issubclass(k, own) for k in (defining_class(cls, form), vouched))

    missing = [h for h, form in STEP_FORMS.items() if overrides(c, h) and form != "" and not vouched_for(h, form)]
    return f"it overrides {', '.join(missing)} without a step form" if missing else ""


def in_step(c: Component) -> bool:
    """Whether ``c`` takes part in a step's loss or update (it overrides one of :data:`STEP_HOOKS`): a server
    rule that only sends and receives weights does not."""
    return any(overrides(c, hook) for hook in STEP_HOOKS)


def step_blockers(recipe: Recipe, model: nn.Module, blocker: Callable[[Component], str] = step_blocker) -> list[str]:
    """What keeps ``recipe`` on ``model`` from training grouped or captured, one entry per component that
    ``blocker`` gives a reason for and one for a model with dropout (empty: nothing)."""
    out = [f"'{c.name}' ({why})" for c in recipe.components if (why := blocker(c))]
    if any(isinstance(m, nn.modules.dropout._DropoutNd) for m in model.modules()):
        out.append(f"the model ({type(model).__name__}: its dropout draws from the global random stream)")
    return out


def mini_batch(x: Tensor, y: Tensor, idx: Tensor) -> Batch:
    """The samples ``idx`` (a 1-D index tensor on ``x``'s device) of inputs ``x`` and targets ``y``: ``x[idx]`` and
    ``y[idx]``, taken by ``index_select`` (the same values; a third of advanced indexing's cost on the CPU, where
    W2's client spends ~10 us a step on it)."""
    return Batch(x.index_select(0, idx), y.index_select(0, idx))


@dataclass(frozen=True)
class StepInputs:
    """What one step of one client consumes (:meth:`StepPlan.prepare`).

    Args:
        x: the inputs ``(B, C, *spatial)`` after every ``transform_batch``.
        y: the targets (class indices ``(B,)``, soft labels ``(B, K)`` or masks).
        drawn: each drawing component's draws of the step, ``{component name: {...}}``.
    """

    x: Tensor
    y: Tensor
    drawn: State


class StepPlan:
    """A recipe's client step on one worker model: which component runs which part (module docstring).

    Args:
        recipe: the method.
        model: the worker model.
        task_loss: the task's loss ``(out, y) -> scalar``.
    """

    def __init__(self, recipe: Recipe, model: nn.Module, task_loss: Callable[[Tensor, Tensor], Tensor]) -> None:
        self.recipe, self.model, self.task_loss = recipe, model, task_loss
        train = recipe.participants("train")
        #: the components whose per-client tensors the step reads (``group_capture``), in recipe order
        self.stateful = tuple(c for c in train if overrides(c, "group_capture"))
        #: the names of the components that take part in the step's loss or update (:func:`in_step`)
        self.in_step = frozenset(c.name for c in recipe.components if in_step(c))
        self.transforms = recipe.per_batch["transform_batch"]
        self.drawers = tuple(c for c in train if overrides(c, "group_inputs"))
        self.forwarders = tuple(c for c in train if overrides(c, "group_forward"))
        self.loss_terms = tuple(c for c in recipe.components if overrides(c, "loss_terms")
                                or overrides(c, "group_loss_terms") or overrides(c, "group_replace_forward"))
        self.adjusters = tuple(c for c in recipe.components
                               if overrides(c, "before_step") or overrides(c, "group_before_step"))
        replaced = {hook: c for hook, c in recipe.replacer.items() if replaces(c, hook)}
        self.forwarder, self.task_replacer, self.stepper = (replaced.get(h) for h in ("forward", "task_loss", "step"))
        #: whether the forward pass is replaced by a step form (``group_replace_forward``)
        self.functional_forward = self.forwarder is not None and overrides(self.forwarder, "group_replace_forward")
        #: whether the loss is the task's loss of the model's output and nothing else (no component takes part)
        self.plain = not (self.forwarders or self.loss_terms) and self.forwarder is None and self.task_replacer is None
        #: whether a step's total is its task term alone, evaluated once a step (no loss terms, no replaced step):
        #: the sum of the totals is then the task term's sum, the same additions
        self.task_only = not self.loss_terms and self.stepper is None

    # --- 1. the input, eagerly ---------------------------------------------------------------
    def prepare(self, views: Mapping[str, ClientCtx], batch: Batch) -> StepInputs:
        """One client's step input from its raw ``batch``: every ``transform_batch``, then every draw. (Grouped
        training receives every client of a group before its steps: a component that transforms batches keeps
        what it needs per client id, as FedRDN does.)"""
        batch = transform_inputs(self.transforms, views, batch)
        drawn = {c.name: c.group_inputs(views[c.name], batch.x.shape[0]) for c in self.drawers}
        return StepInputs(batch.x, batch.y, drawn)

    def capture(self, views: Mapping[str, ClientCtx]) -> State:
        """Right after every ``receive``: the per-client tensors of the step (``group_capture``)."""
        return {c.name: c.group_capture(views[c.name]) for c in self.stateful}

    def restore(self, views: Mapping[str, ClientCtx], captured: State) -> None:
        """Before ``reply``: each component's per-client state as the steps left it (``group_restore``)."""
        for c in self.stateful:
            c.group_restore(views[c.name], captured[c.name])

    # --- 2. the loss --------------------------------------------------------------------------
    def loss(self, views: Mapping[str, ClientCtx] | None = None) -> LossFn:
        """One client's loss ``(params, consts, captured, drawn, x, y) -> (total, terms)``.

        ``params`` and ``consts`` (the other parameters and buffers) replace the model's own for the forward
        pass (:func:`torch.func.functional_call`); ``None`` for both runs the model as it is (eager). With
        ``views`` (eager only) a component without a step form runs its own ``forward`` / ``task_loss`` /
        ``loss_terms`` hook; without them, every component must have step forms (:func:`step_blockers`).
        """
        model, task_loss = self.model, self.task_loss
        forwarder, task_replacer = self.forwarder, self.task_replacer

        def plain(params: dict[str, Tensor] | None, consts: dict[str, Tensor] | None, captured: State,
                  drawn: State, x: Tensor, y: Tensor) -> tuple[Tensor, dict[str, Tensor]]:
            out = model(x) if params is None else functional_call(model, (params, consts), (x,))
            task = task_loss(out, y)
            return task, {"task": task}

        if self.plain:
            return plain

        def loss(params: dict[str, Tensor] | None, consts: dict[str, Tensor] | None, captured: State,
                 drawn: State, x: Tensor, y: Tensor) -> tuple[Tensor, dict[str, Tensor]]:
            batch, own_terms = Batch(x, y), {}
            with ExitStack() as stack:
                for c in self.forwarders:
                    stack.enter_context(c.group_forward(captured.get(c.name, {}), drawn.get(c.name, {})))
                if self.functional_forward:
                    out, batch, own_terms = forwarder.group_replace_forward(  # type: ignore[union-attr]
                        _runner(model, params, consts), captured.get(forwarder.name, {}),  # type: ignore[union-attr]
                        drawn.get(forwarder.name, {}), batch)  # type: ignore[union-attr]
                elif forwarder is not None:
                    out, batch = forwarder.forward(views[forwarder.name], batch)  # type: ignore[index]
                elif params is None:
                    out = model(x)
                else:
                    out = functional_call(model, (params, consts), (x,))
            terms = {"task": task_loss(out, batch.y) if task_replacer is None
                     else task_replacer.task_loss(views[task_replacer.name], out, batch)}  # type: ignore[index]
            for c in self.loss_terms:
                if c is forwarder and self.functional_forward:
                    own = own_terms
                elif overrides(c, "group_loss_terms"):
                    own = c.group_loss_terms(params if params is not None else trainable(model),
                                             captured.get(c.name, {}), batch, out)
                else:
                    own = c.loss_terms(views[c.name], batch, out)  # type: ignore[index]
                for k, v in own.items():
                    terms[f"{c.name}/{k}"] = v
            total = sum(terms.values()) if len(terms) > 1 else terms["task"]
            return total, terms  # type: ignore[return-value]

        return loss

    # --- 3. the update ------------------------------------------------------------------------
    def adjust(self, optimizer: torch.optim.Optimizer, params: Mapping[str, Tensor], captured: State,
               views: Mapping[str, ClientCtx] | None = None) -> None:
        """After backward: each component's gradient adjustment on the gradients of ``params`` (its step
        form ``group_before_step``, or, eagerly, its ``before_step``)."""
        if not self.adjusters:
            return
        grads = {k: p.grad for k, p in params.items() if p.grad is not None}
        for c in self.adjusters:
            if overrides(c, "group_before_step"):
                c.group_before_step(grads, captured.get(c.name, {}), optimizer)
            else:
                c.before_step(views[c.name], optimizer)  # type: ignore[index]

    def update(self, loss: LossFn, optimizer: torch.optim.Optimizer, params: Mapping[str, Tensor], captured: State,
               args: tuple[Any, ...]) -> tuple[Tensor, dict[str, Tensor]]:
        """One step of ``loss(*args)`` (batched or not) that trains ``params``: backward from the sum of its
        totals, the adjustments, the optimiser's step (the steps of grouped and captured training; the eager
        step adds mixed precision and replaced steps, :func:`~fedaug.engine.client.training.eager_steps`).

        Returns:
            The totals and the loss terms, detached.
        """
        optimizer.zero_grad(set_to_none=True)
        totals, terms = loss(*args)
        totals.sum().backward()
        self.adjust(optimizer, params, captured)
        optimizer.step()
        return totals.detach(), {k: v.detach() for k, v in terms.items()}


class _Apply(nn.Module):
    """``fn(module, *args)`` as a module's forward, so that :func:`torch.func.functional_call` can run any part
    of ``module`` with other parameters."""

    def __init__(self, module: nn.Module, fn: Callable[..., Any]) -> None:
        super().__init__()
        self.module, self.fn = module, fn

    def forward(self, *args: Any) -> Any:
        return self.fn(self.module, *args)


def _runner(model: nn.Module, params: dict[str, Tensor] | None, consts: dict[str, Tensor] | None) -> Runner:
    """The ``run`` of :meth:`~fedaug.methods.component.Component.group_replace_forward` for one step: eagerly
    (``params`` ``None``) the modules as they are; batched, the step's parameters, or the ``state`` given."""
    if params is None:
        return lambda fn, *args, module=None, state=None: fn(model if module is None else module, *args)
    own = {f"module.{k}": v for k, v in (*params.items(), *(consts or {}).items())}

    def run(fn: Callable[..., Any], *args: Any, module: nn.Module | None = None, state: State | None = None) -> Any:
        if module is None:
            return functional_call(_Apply(model, fn), own, args)
        return functional_call(_Apply(module, fn), {f"module.{k}": v for k, v in (state or {}).items()}, args)

    return run


def stack_states(states: Sequence[State], device: torch.device | None = None) -> State:
    """Nested dicts of tensors (or Python scalars, made tensors on ``device``) with one structure, stacked
    leaf by leaf along a new dim 0 (``(G, *shape)``)."""
    return {k: stack_states([s[k] for s in states], device) if isinstance(v, dict)
            else torch.stack([torch.as_tensor(s[k], device=device) for s in states]) for k, v in states[0].items()}


_PLANS: weakref.WeakKeyDictionary[nn.Module, tuple[Recipe, Callable[..., Any], StepPlan]] = weakref.WeakKeyDictionary()


def plan_for(recipe: Recipe, model: nn.Module, task_loss: Callable[[Tensor, Tensor], Tensor]) -> StepPlan:
    """The :class:`StepPlan` of ``recipe`` on the worker ``model`` (made once per worker, not per client)."""
    kept = _PLANS.get(model)
    if kept is None or kept[0] is not recipe or kept[1] != task_loss:
        kept = _PLANS[model] = (recipe, task_loss, StepPlan(recipe, model, task_loss))
    return kept[2]


def state_slice(state: State, i: int) -> State:
    """Client ``i``'s entries of :func:`stack_states`' output (views)."""
    return {k: state_slice(v, i) if isinstance(v, dict) else v[i] for k, v in state.items()}
