"""One walk of a model's module tree, kept between clients and checked before each use.

A worker model serves every client in turn, and each client's call walks its tree several times:
loading the global weights and replying with its own (``state_dict``'s entries), listing the
trainable parameters, setting training mode. On small models those walks are a good part of a
client's fixed cost (W2's MLP: ~120 us of walks a client on a 2-core AMD EPYC; mobilenetv2_cifar's
214 modules: ~3 ms), and the tree does not change between clients. :func:`walk` keeps one
:class:`ModelWalk` per model and checks it in one flat pass before every use (~half a walk's cost):
every module's children, parameters and buffers must be the very objects recorded, under the same
names, in the same order, and its non-persistent buffer names the same; otherwise the model is walked
again. What it gives is what torch's own walks give, in their order.
"""

from __future__ import annotations

import weakref
from collections.abc import Iterator

from torch import Tensor, nn
from torch.nn.modules.batchnorm import _NormBase

#: ``_load_from_state_dict`` of the modules whose entries :meth:`ModelWalk.state_entries` gives: the default,
#: and BatchNorm's (whose own step only fills in a missing batch counter, which then keeps its value)
_PLAIN_LOADERS = (nn.Module._load_from_state_dict, _NormBase._load_from_state_dict)


def _fingerprint(m: nn.Module) -> tuple[object, ...]:
    """What of ``m`` the walk's results depend on: the names and identities of its children, parameters
    and buffers, its non-persistent buffer names (identities, never tensor equality), and how many
    state-dict hooks it has."""
    return (tuple(m._modules), tuple(map(id, m._modules.values())), tuple(m._parameters),
            tuple(map(id, m._parameters.values())), tuple(m._buffers), tuple(map(id, m._buffers.values())),
            frozenset(m._non_persistent_buffers_set), len(m._state_dict_hooks), len(m._state_dict_pre_hooks),
            len(m._load_state_dict_pre_hooks), len(m._load_state_dict_post_hooks))


def _plain_state(m: nn.Module) -> bool:
    """Whether ``m``'s ``state_dict`` and ``load_state_dict`` only read and copy its own parameters and
    persistent buffers: no state-dict hook, no saving, loading (BatchNorm's aside) or extra state of its own."""
    cls = type(m)
    return (cls._load_from_state_dict in _PLAIN_LOADERS and cls._save_to_state_dict is nn.Module._save_to_state_dict
            and cls.get_extra_state is nn.Module.get_extra_state and not m._load_state_dict_pre_hooks
            and not m._load_state_dict_post_hooks and not m._state_dict_hooks and not m._state_dict_pre_hooks)


class ModelWalk:
    """``model.named_modules(remove_duplicate=False)`` once, and what follows from it.

    Args:
        model: the model walked.
    """

    def __init__(self, model: nn.Module) -> None:
        named = list(model.named_modules(remove_duplicate=False))
        self._root = weakref.ref(model)  # (the model itself held weakly: :func:`walk` keeps one per live model)
        self._rest = named[1:]
        self._prints = [_fingerprint(m) for _, m in named]
        self._objects = [(*m._modules.values(), *m._parameters.values(), *m._buffers.values())
                         for _, m in named]  # held, so that no recorded id is reused
        self._parameters: list[tuple[str, nn.Parameter]] | None = None
        self._state = ({key: t for key, _, t in self.entries()} if all(_plain_state(m) for _, m in named)
                       else None)
        #: whether setting training mode is a walk of ``Module.train`` (no module overrides it)
        self.plain_train = all(type(m).train is nn.Module.train for _, m in named)

    @property
    def modules(self) -> list[tuple[str, nn.Module]]:
        """``(prefix, module)``: every module under every name it has, in ``named_modules`` order."""
        return [("", self._root()), *self._rest]

    def unchanged(self) -> bool:
        """Whether the tree is still the one walked (see the module docstring)."""
        return all(_fingerprint(m) == f for (_, m), f in zip(self.modules, self._prints))

    def named_parameters(self) -> list[tuple[str, nn.Parameter]]:
        """``list(model.named_parameters())``: each parameter once, under its first name."""
        if self._parameters is None:
            seen: set[int] = set()
            out = []
            for prefix, m in self.modules:
                for name, p in m._parameters.items():
                    if p is not None and id(p) not in seen:
                        seen.add(id(p))
                        out.append((f"{prefix}.{name}" if prefix else name, p))
            self._parameters = out
        return self._parameters

    def training(self) -> bool:
        """Whether every module is in training mode."""
        return all(m.training for _, m in self.modules)

    def state_entries(self) -> dict[str, Tensor] | None:
        """``model.state_dict(keep_vars=True)`` (a new dict of the model's own tensors), or ``None`` where
        ``state_dict`` or ``load_state_dict`` would do anything else: a module with a state-dict hook, its
        own saving or extra state, or its own loading (BatchNorm's aside)."""
        return None if self._state is None else dict(self._state)

    def entries(self) -> Iterator[tuple[str, nn.Module, Tensor]]:
        """``(state_dict key, module, tensor)`` of every parameter, then persistent buffer, of every module
        under every name, in ``state_dict`` order (``None`` entries left out)."""
        for prefix, m in self.modules:
            dot = f"{prefix}." if prefix else ""
            for name, p in m._parameters.items():
                if p is not None:
                    yield dot + name, m, p
            skip = m._non_persistent_buffers_set
            for name, b in m._buffers.items():
                if b is not None and name not in skip:
                    yield dot + name, m, b


_WALKS: weakref.WeakKeyDictionary[nn.Module, ModelWalk] = weakref.WeakKeyDictionary()


def walk(model: nn.Module) -> ModelWalk:
    """``model``'s :class:`ModelWalk`: the one kept, where :meth:`ModelWalk.unchanged`, else a new one."""
    kept = _WALKS.get(model)
    if kept is None or not kept.unchanged():
        kept = _WALKS[model] = ModelWalk(model)
    return kept


def train_mode(model: nn.Module) -> None:
    """``model.train()``, skipped where every module is in training mode already and none overrides
    ``train`` (setting the flags again would change nothing)."""
    w = walk(model)
    if not (w.plain_train and w.training()):
        model.train()


def trainable(model: nn.Module) -> dict[str, nn.Parameter]:
    """``model``'s parameters that require gradients, by ``named_parameters`` name."""
    return {k: p for k, p in walk(model).named_parameters() if p.requires_grad}
