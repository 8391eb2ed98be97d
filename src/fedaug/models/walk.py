"""One walk of a model's module tree, kept between clients and checked before each use.

A worker model serves every client in turn, and each client's call walks its tree several times:
loading the global weights and replying with its own (``state_dict``'s entries), listing the
trainable parameters, setting training mode. On small models those walks are a good part of a
client's fixed cost (W2's MLP: ~120 us of walks a client on a 2-core AMD EPYC; mobilenetv2_cifar's
214 modules: ~3 ms), and the tree does not change between clients. :func:`walk` keeps one
:class:`ModelWalk` per model and uses it again while the tree is unchanged: no module, parameter or
buffer was registered anywhere since (torch's global registration hooks, which every ``setattr``,
``register_*`` and ``add_module`` of a module, parameter or buffer calls; :data:`GENERATION` counts
them), and every module of the tree still has as many children, parameters and buffers as it had
(what ``del`` changes without a hook). State-dict hooks are looked for at each use of the entries.
What it gives is what torch's own walks give, in their order.
"""

from __future__ import annotations

import operator
import weakref
from collections.abc import Iterator

from torch import Tensor, nn
from torch.nn.modules import module as _module
from torch.nn.modules.batchnorm import _NormBase

#: how many modules, parameters and buffers were registered in this process since fedaug was imported: a
#: kept walk is used again only while this is the count it was made at
GENERATION = [0]


def _registered(*_: object) -> None:
    """A registration hook (any module's): a module, parameter or buffer was registered."""
    GENERATION[0] += 1


for _register in (_module.register_module_module_registration_hook, _module.register_module_parameter_registration_hook,
                  _module.register_module_buffer_registration_hook):
    _register(_registered)

#: ``_load_from_state_dict`` of the modules whose entries :meth:`ModelWalk.state_entries` gives: the default,
#: and BatchNorm's (whose own step only fills in a missing batch counter, which then keeps its value)
_PLAIN_LOADERS = (nn.Module._load_from_state_dict, _NormBase._load_from_state_dict)


#: each module's children, parameters and buffers (the dicts themselves, read afresh at each use)
_CHILDREN, _PARAMETERS, _BUFFERS = (operator.attrgetter(a) for a in ("_modules", "_parameters", "_buffers"))


def _sizes(modules: list[nn.Module]) -> tuple[list[int], list[int], list[int]]:
    """How many children, parameters and buffers each of ``modules`` has."""
    return ([*map(len, map(_CHILDREN, modules))], [*map(len, map(_PARAMETERS, modules))],
            [*map(len, map(_BUFFERS, modules))])


def _hooked(m: nn.Module) -> bool:
    """Whether ``m`` has a state-dict hook (registering one calls no registration hook)."""
    return bool(m._load_state_dict_pre_hooks or m._load_state_dict_post_hooks or m._state_dict_hooks
                or m._state_dict_pre_hooks)


def _plain_state(m: nn.Module) -> bool:
    """Whether ``m``'s ``state_dict`` and ``load_state_dict`` only read and copy its own parameters and
    persistent buffers: no state-dict hook, no saving, loading (BatchNorm's aside) or extra state of its own."""
    cls = type(m)
    return (cls._load_from_state_dict in _PLAIN_LOADERS and cls._save_to_state_dict is nn.Module._save_to_state_dict
            and cls.get_extra_state is nn.Module.get_extra_state and not _hooked(m))


class ModelWalk:
    """``model.named_modules(remove_duplicate=False)`` once, and what follows from it.

    Args:
        model: the model walked.
    """

    def __init__(self, model: nn.Module) -> None:
        named = list(model.named_modules(remove_duplicate=False))
        self._root = weakref.ref(model)  # (the model itself held weakly: :func:`walk` keeps one per live model)
        self._rest = named[1:]
        self._generation = GENERATION[0]
        self._modules = [m for _, m in named[1:]]
        self._sizes = _sizes([model, *self._modules])
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
        return self._generation == GENERATION[0] and _sizes([self._root(), *self._modules]) == self._sizes

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
        if self._state is None or any(_hooked(m) for _, m in self.modules):
            return None
        return dict(self._state)

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
