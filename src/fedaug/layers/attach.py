"""Attach layers after named modules of any ``nn.Module`` with forward hooks (no wrapping).

Wrapping a module renames its ``state_dict`` keys (opacus' ``_module.``), which breaks weight
averaging across clients; a forward hook that returns the layer's output leaves the model's
structure, parameters and keys untouched. Attached layers are not children of the model: their
buffers belong to the component that owns them (its uplink), never to the model's ``state_dict``.

Several layers after one module form a chain, in attach order (PyTorch runs a module's forward
hooks in registration order, each on the output of the one before): a recipe's components attach
in recipe order. :func:`check_chains` refuses chains that cannot compose.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import torch
from torch import Tensor, nn
from torch.utils.hooks import RemovableHandle

from fedaug.core.device import module_device
from fedaug.core.errors import AttachError, ConfigError, suggest

_MAX_LISTED = 40


class _AttachedLayer:
    """Forward hook running ``layer`` on a module's output, in the host model's train/eval mode."""

    def __init__(self, host: nn.Module, layer: nn.Module, owner: str) -> None:
        self.host = host
        self.layer = layer
        self.owner = owner

    def __call__(self, module: nn.Module, args: tuple[Any, ...], output: Tensor) -> Tensor:
        if self.layer.training != self.host.training:
            self.layer.train(self.host.training)
        ref = next(iter(self.layer.parameters()), None)
        if ref is None:
            ref = next(iter(self.layer.buffers()), None)
        # under autocast the output's dtype is the autocast one: the layer keeps its float32 state
        cast = ref is not None and ref.is_floating_point() and ref.dtype != output.dtype and not (
            torch.is_autocast_enabled(output.device.type))
        if ref is not None and (ref.device != output.device or cast):
            self.layer.to(device=output.device, dtype=output.dtype if cast else None)
        return self.layer(output)


class AttachHandle:
    """The layers attached by one :func:`attach` call; :meth:`detach` removes all their hooks.

    Also a context manager: ``with attach(model, {...}):`` detaches on exit.

    Attributes:
        layers: module name -> attached layer, in attach order.
    """

    def __init__(self, layers: dict[str, nn.Module], handles: list[RemovableHandle]) -> None:
        self.layers = layers
        self._handles = handles

    def detach(self) -> None:
        """Remove every hook this handle added (idempotent); the model is as before :func:`attach`."""
        for h in self._handles:
            h.remove()
        self._handles = []

    @property
    def attached(self) -> bool:
        """Whether the hooks are still in place."""
        return bool(self._handles)

    def __enter__(self) -> AttachHandle:
        return self

    def __exit__(self, *exc: object) -> None:
        self.detach()


def _names_hint(model: nn.Module, names: list[str]) -> str:
    stages = getattr(model, "feature_stages", ())
    listed = names if len(names) <= _MAX_LISTED else [n for n, _ in model.named_children()]
    more = "" if len(names) <= _MAX_LISTED else f" (top level of {len(names)}; see model.named_modules())"
    hint = f"its modules are: {', '.join(listed)}{more}"
    return hint + (f"; default attach points: {', '.join(stages)}" if stages else "")


def attach(model: nn.Module, layers: Mapping[str, nn.Module], *, owner: str = "") -> AttachHandle:
    """Insert each layer after the named module of ``model``, using forward hooks.

    The module's output ``(B, C, *spatial)`` is replaced by ``layer(output)``; a module that already
    has layers gets this one at the end of its chain. Each layer is moved to the model's device
    here; before each call it is put in the host's mode (``layer.train(model.training)``, since
    ``model.eval()`` does not reach non-children) and moved to the output's device and floating
    dtype if needed (not to an autocast dtype: under :func:`torch.autocast` it keeps its own).
    ``model.state_dict()`` and ``model.parameters()`` are unchanged.

    Args:
        model: the host network.
        layers: module name (as in ``model.named_modules()``) -> layer to run after it.
        owner: who attaches (a component's name), for :func:`check_chains`' messages.

    Returns:
        A handle whose :meth:`AttachHandle.detach` removes the hooks.

    Raises:
        AttachError: unknown names (all listed at once, with the closest match and the model's
            module names).

    >>> import torch
    >>> from fedaug.models import build_model
    >>> model = build_model("small_cnn", in_channels=1, num_classes=10)
    >>> handle = attach(model, {"block1": torch.nn.Identity()})
    >>> model(torch.zeros(2, 1, 28, 28)).shape
    torch.Size([2, 10])
    >>> handle.detach()
    """
    modules = dict(model.named_modules())
    del modules[""]
    problems = []
    for name in layers:
        if name not in modules:
            problems.append(f"'{name}'{suggest(name, modules)}")
    if problems:
        raise AttachError(
            f"cannot attach to {type(model).__name__}: no module named {', '.join(problems)}; "
            f"{_names_hint(model, list(modules))}. Fix: use names from dict(model.named_modules())"
        )
    device = module_device(model)
    handles = [modules[n].register_forward_hook(_AttachedLayer(model, layer.to(device), owner))
               for n, layer in layers.items()]
    return AttachHandle(dict(layers), handles)


def chains(model: nn.Module) -> dict[str, list[tuple[str, nn.Module]]]:
    """``{module name: [(owner, layer), ...]}`` of every module with attached layers, in run order."""
    out = {}
    for name, module in model.named_modules():
        chain = [(h.owner, h.layer) for h in module._forward_hooks.values() if isinstance(h, _AttachedLayer)]
        if chain:
            out[name] = chain
    return out


def check_chains(model: nn.Module) -> None:
    """Refuse chains that cannot compose: a layer whose class sets ``must_be_last`` (e.g. MoEx's, whose
    label mix describes the moments it exchanged) followed by another layer at the same module.

    Raises:
        ConfigError: naming both owners, the module and the fix (all problems at once).
    """
    problems = []
    for name, chain in chains(model).items():
        for i, (owner, layer) in enumerate(chain[:-1]):
            if getattr(layer, "must_be_last", False):
                after = chain[i + 1][0]
                problems.append(f"'{after}' attaches a layer after '{owner}' at module '{name}', but '{owner}' must "
                                f"run last there ({type(layer).__name__}); list '{after}' before '{owner}' in "
                                "method.augs, or attach it elsewhere")
    if problems:
        raise ConfigError("layers that cannot compose: " + "; ".join(problems))


class _Probe(nn.Module):
    def __init__(self, found: dict[str, int], name: str) -> None:
        super().__init__()
        self.found = found
        self.name = name

    def forward(self, x: Tensor) -> Tensor:
        self.found[self.name] = int(x.shape[1])
        return x


def stage_channels(model: nn.Module, example_input: Tensor, names: list[str] | None = None, *,
                   call_order: bool = False) -> dict[str, int]:
    """Channels (dim 1) of the output of each named module, from one dry forward pass.

    The pass runs without gradients in eval mode, so BatchNorm running statistics are not
    updated; each module's train/eval flag is restored afterwards.

    Args:
        model: the network.
        example_input: an input the model accepts, e.g. ``(2, C, H, W)``.
        names: module names; ``model.feature_stages`` when ``None``.
        call_order: order the result as the forward pass reaches the modules (leaving out any it
            does not reach) instead of as ``names``.

    Returns:
        Name -> channel count, in the order of ``names`` (or of the forward pass).

    Raises:
        AttachError: an unknown name (as :func:`attach`).
    """
    names = list(getattr(model, "feature_stages", ()) if names is None else names)
    found: dict[str, int] = {}
    handle = attach(model, {n: _Probe(found, n) for n in names})
    try:
        with dry_run(model):
            model(example_input)
    finally:
        handle.detach()
    return dict(found) if call_order else {n: found[n] for n in names}


@contextlib.contextmanager
def dry_run(model: nn.Module) -> Iterator[None]:
    """Run ``model`` inside without gradients in eval mode (BatchNorm running statistics are not
    updated, nothing random is drawn); each module's train/eval flag is restored afterwards."""
    flags = [(m, m.training) for m in model.modules()]
    try:
        model.eval()
        with torch.no_grad():
            yield
    finally:
        for m, flag in flags:
            m.training = flag


def output_shape(model: nn.Module, input_shape: tuple[int, ...]) -> tuple[int, ...]:
    """The shape of ``model``'s output for one sample of ``input_shape`` (from a :func:`dry_run` on
    zeros): ``(num_classes,)`` for a classifier, ``(num_classes, *spatial)`` for a segmenter."""
    with dry_run(model):
        return tuple(model(torch.zeros(2, *input_shape, device=module_device(model))).shape[1:])


def attach_default(
    model: nn.Module, make_layer: Callable[[str, int], nn.Module], example_input: Tensor
) -> AttachHandle:
    """Attach ``make_layer(name, channels)`` after each of ``model.feature_stages``.

    Args:
        model: a network declaring ``feature_stages`` (every zoo model does).
        make_layer: builds the layer for one stage from its name and channel count.
        example_input: an input the model accepts, for :func:`stage_channels`.

    Raises:
        AttachError: ``model`` declares no ``feature_stages``.

    >>> import torch
    >>> from fedaug.models import build_model
    >>> model = build_model("alexnet_bn", in_channels=3, num_classes=10)
    >>> handle = attach_default(model, lambda name, c: torch.nn.Identity(), torch.zeros(2, 3, 64, 64))
    >>> list(handle.layers)
    ['conv1', 'conv2', 'conv3', 'conv4', 'conv5']
    """
    if not getattr(model, "feature_stages", ()):
        raise AttachError(
            f"{type(model).__name__} declares no feature_stages; pass module names to attach() instead"
        )
    channels = stage_channels(model, example_input)
    return attach(model, {n: make_layer(n, c) for n, c in channels.items()})
