"""Attack scenarios: what the clients that ``[attack]`` names do to their uploads (docs/engine.md,
"Attack scenarios").

An attack runs on the client side, in :meth:`fedaug.engine.client.worker.Worker.run`, so the same code runs
in the in-process engine and on a Flower SuperNode whose partition id is an attacker: a label flip
changes the training split before the phase, every other kind rewrites parts of the phase's reply
after it (training and the post-aggregation query; evaluation replies are never changed). Parts
are addressed by component name (``attack.parts``) or by role (the server rule's part): nothing
here names a method. Integer tensors (counts, labels, ``num_batches_tracked``) are never changed.

Kinds, per floating tensor ``w_k`` of an attacked part, with ``w_g`` the tensor of the same name and
shape in the part the client received in that phase (zero where it received none, e.g. a delta it
computed itself):

- ``sign_flip``: ``2 w_g - w_k`` (its update ``w_k - w_g`` negated);
- ``scale``: ``w_g + s (w_k - w_g)``;
- ``gaussian``: ``w_g + N(0, std^2)`` per coordinate (an update of pure noise);
- ``free_ride``: ``w_g``, buffers included: the received model sent back unchanged, the commonest
  misbehaviour of real clients (a client that does not train; its update is 0 in every tensor);
- ``fill``: every value ``s``, buffers included (default ``s``: half the part's magnitude bound,
  ``trust.max_abs``, so the upload passes it: the in-bound scaling attack of issue 41);
- ``nan`` / ``inf``: every value NaN / +inf (the trust boundary rejects the reply);
- ``stats``: a tensor whose last dotted name segment contains ``std`` or ``var`` (a spread) times
  ``s``; one whose last segment contains ``mean`` plus ``s``; others unchanged;
- ``features``: zero-mean Gaussian noise of the same shape with std ``s`` times the tensor's own
  (population) std;
- ``label_flip``: the client trains on ``K - 1 - y`` (classification only).

``sign_flip``, ``scale`` and ``gaussian`` leave the worker model's buffers (BatchNorm running
statistics and counters) as the client trained them: a poisoned running variance can turn negative,
which the trust boundary refuses, so an attacker that wants its update accepted poisons the
parameters only and the server rule has to cope with it.

Randomness comes from the client's own stream (seed, "attack", round, client id, phase, part), so
runs are deterministic and do not depend on the order in which clients run (DESIGN.md invariant 1).
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence

import torch
from torch import Tensor

from fedaug.config.schema import AttackConfig, RunConfig
from fedaug.core.errors import ConfigError, suggest
from fedaug.core.payload import Message, Part
from fedaug.core.rng import generator
from fedaug.data.base import Split
from fedaug.engine.protocol import Reply
from fedaug.methods.component import Phase
from fedaug.methods.recipe import Recipe
from fedaug.metrics.tasks import Task
from fedaug.privacy.noise import add_gaussian_noise

#: kinds that change the server rule's part by default: the model update
UPDATE_KINDS = ("sign_flip", "scale", "gaussian", "free_ride", "fill", "nan", "inf")
#: kinds that change every other component's part by default: what augmentations share
SHARED_KINDS = ("stats", "features")
#: update kinds that keep an attacked upload valid: they leave the model's buffers as trained (:class:`Attack`)
STEALTHY = ("sign_flip", "scale", "gaussian")
#: ``attack.scale`` where it is not set, by kind
DEFAULT_SCALE = {"scale": 10.0, "stats": 1e4, "features": 1.0}
#: ``attack.std`` where it is not set
DEFAULT_STD = 1.0
#: name fragments that mark a spread and a centre (``stats``), matched in a key's last dotted segment
SPREADS, CENTRES = ("std", "var"), ("mean",)


def choose_attackers(cfg: AttackConfig, seed: int, num_clients: int) -> tuple[int, ...]:
    """The attacking clients' ids, ascending: ``attack.clients``, or the first ``round(fraction * N)``
    (halves up) of a permutation of ``0..N-1`` drawn from (seed, "attack", "clients"); none for
    kind ``"none"``. A function of the config and ``num_clients`` only, so the server and every
    SuperNode agree.

    >>> choose_attackers(AttackConfig(kind="nan", clients=[2, 0]), 0, 3)
    (0, 2)
    """
    if cfg.kind == "none":
        return ()
    if cfg.fraction is None:
        return tuple(sorted(cfg.clients))
    count = math.floor(cfg.fraction * num_clients + 0.5)
    order = torch.randperm(num_clients, generator=generator(seed, "attack", "clients"))
    return tuple(sorted(order[:count].tolist()))


def attacked_parts(cfg: AttackConfig, recipe: Recipe) -> tuple[str, ...]:
    """The component names whose parts the attack changes: ``attack.parts``, else the server rule's
    (update kinds) or every other component's (``stats``, ``features``); none for ``label_flip``."""
    if cfg.kind in UPDATE_KINDS + SHARED_KINDS and cfg.parts:
        return tuple(cfg.parts)
    if cfg.kind in UPDATE_KINDS:
        return (recipe.base.name,)
    if cfg.kind in SHARED_KINDS:
        return tuple(c.name for c in recipe.components if c.role != "server")
    return ()


def check_attack(cfg: RunConfig, recipe: Recipe, num_clients: int, task: str) -> tuple[int, ...]:
    """Check ``[attack]`` against the federation and the method; return :func:`choose_attackers`.

    Raises:
        ConfigError: client ids not below ``num_clients``, ``label_flip`` on a task that is not
            classification, or ``attack.parts`` naming a component not in the recipe (one sentence each).
    """
    a = cfg.attack
    problems = []
    beyond = sorted(c for c in a.clients if c >= num_clients)
    if beyond:
        problems.append(f"attack.clients names client(s) {', '.join(map(str, beyond))}, but the federation has "
                        f"{num_clients} clients (ids 0..{num_clients - 1})")
    if a.kind == "label_flip" and task != "classification":
        problems.append(f"attack.kind='label_flip' flips class labels, but this is a {task} task; choose "
                        f"another kind ({', '.join(UPDATE_KINDS)}, ...)")
    for name in a.parts:
        if name not in recipe.names:
            problems.append(f"attack.parts names '{name}', which is not a component of the method; choose from "
                            f"{', '.join(recipe.names)}{suggest(name, recipe.names)}")
    if problems:
        raise ConfigError("invalid [attack]: " + "; ".join(problems))
    chosen = choose_attackers(a, cfg.seed, num_clients)
    if a.kind != "none" and a.fraction and not chosen:
        warnings.warn(f"attack.fraction={a.fraction} of {num_clients} clients rounds to no attacker", stacklevel=2)
    return chosen


def flip_labels(y: Tensor, num_classes: int) -> Tensor:
    """``num_classes - 1 - y``: class indices ``(N,)`` int64 mirrored, a fresh tensor."""
    return num_classes - 1 - y


def poison_tensor(kind: str, key: str, t: Tensor, received: Tensor | None, g: torch.Generator, *,
                  scale: float, std: float) -> Tensor:
    """One floating tensor of an attacked part, as the module docstring defines each kind.

    Args:
        kind: an attack kind other than ``none`` and ``label_flip``.
        key: the tensor's name in its part (``stats`` reads it).
        t: the honest tensor, any shape; not modified.
        received: the tensor of the same name the client received (``w_g``), same shape, or ``None``.
        g: the client's attack stream.
        scale, std: ``attack.scale`` and ``attack.std`` with their defaults filled in.

    Returns:
        A new tensor of ``t``'s shape, dtype and device.
    """
    if kind == "nan":
        return torch.full_like(t, math.nan)
    if kind == "inf":
        return torch.full_like(t, math.inf)
    if kind == "fill":
        return torch.full_like(t, scale)
    if kind == "stats":
        segment = key.rsplit(".", 1)[-1].lower()
        if any(s in segment for s in SPREADS):
            return t * scale
        return t + scale if any(s in segment for s in CENTRES) else t
    if kind == "features":
        return add_gaussian_noise(torch.zeros_like(t), float(scale * t.float().std(correction=0)), g)
    w_g = torch.zeros_like(t) if received is None else received.to(device=t.device, dtype=t.dtype)
    if kind == "sign_flip":
        return 2 * w_g - t
    if kind == "scale":
        return w_g + scale * (t - w_g)
    if kind == "gaussian":
        return add_gaussian_noise(w_g, std, g)
    if kind == "free_ride":
        return w_g.clone()  # never the received tensor itself
    raise ValueError(f"unknown attack kind '{kind}'")


def poison_part(kind: str, part: Part, received: Part, g: torch.Generator, *, scale: float, std: float,
                keep: frozenset[str] = frozenset()) -> Part:
    """``part`` with every non-empty floating tensor through :func:`poison_tensor`; ``received`` is the
    part the client received for the same component (its tensors of equal shape are ``w_g``). The
    kinds in :data:`STEALTHY` leave the entries named in ``keep`` as trained."""
    out = {}
    for key, t in part.items():
        if not t.is_floating_point() or t.numel() == 0 or (key in keep and kind in STEALTHY):
            out[key] = t
            continue
        ref = received.get(key)
        ref = ref if isinstance(ref, Tensor) and ref.shape == t.shape and ref.is_floating_point() else None
        out[key] = poison_tensor(kind, key, t, ref, g, scale=scale, std=std)
    return out


class Attack:
    """The ``[attack]`` of a run, as a worker applies it to the clients it runs.

    Args:
        cfg: the run configuration (its ``attack`` section and seed).
        recipe: the method (the server rule's name and the component names).
        task: the task (label flips need its class count).
        num_clients: the federation's size (attackers chosen by fraction depend on it).
        buffers: the worker model's buffer names (``model.named_buffers()``: BatchNorm running
            statistics and counters), which sign_flip, scale and gaussian send as trained: a
            negative running variance would be refused at the trust boundary, so an attacker that
            wants its update accepted keeps them valid and poisons the parameters only.

    Raises:
        ConfigError: see :func:`check_attack`.

    >>> from fedaug.config.schema import validate
    >>> from fedaug.methods.recipe import build_recipe
    >>> from fedaug.metrics.tasks import make_task
    >>> cfg = validate({"attack": {"kind": "sign_flip", "clients": [1], "start_round": 2}})
    >>> attack = Attack(cfg, build_recipe("fedavg"), make_task("classification", 4), num_clients=3)
    >>> attack.parts, attack.active(1, 1), attack.active(1, 2), attack.active(0, 2)
    (('fedavg',), False, True, False)
    """

    def __init__(self, cfg: RunConfig, recipe: Recipe, task: Task, num_clients: int,
                 buffers: frozenset[str] = frozenset()) -> None:
        self.cfg, self.seed, self.num_classes, self.buffers = cfg.attack, cfg.seed, task.num_classes, buffers
        self.clients = frozenset(check_attack(cfg, recipe, num_clients, task.name))
        self.parts: Sequence[str] = attacked_parts(cfg.attack, recipe)
        self.scale = cfg.attack.scale if cfg.attack.scale is not None else DEFAULT_SCALE.get(cfg.attack.kind, 1.0)
        self.trust = cfg.trust
        self.std = cfg.attack.std if cfg.attack.std is not None else DEFAULT_STD

    def _scale(self, part: str) -> float:
        """``attack.scale`` for ``part``; for ``fill`` without it, half the part's magnitude bound
        (``trust.max_abs_parts``, else ``trust.max_abs``)."""
        if self.cfg.kind != "fill" or self.cfg.scale is not None:
            return self.scale
        return 0.5 * float(self.trust.max_abs_parts.get(part, self.trust.max_abs))

    def active(self, client_id: int, r: int) -> bool:
        """Whether ``client_id`` attacks in round ``r``."""
        return client_id in self.clients and r >= self.cfg.start_round

    def training_split(self, phase: Phase, client_id: int, r: int, split: Split) -> Split:
        """The split the phase runs on: for an active label flip in training, ``split`` with
        :func:`flip_labels` labels (same inputs); else ``split`` itself."""
        if phase != "train" or self.cfg.kind != "label_flip" or not self.active(client_id, r):
            return split
        return Split(split.x, flip_labels(split.y, self.num_classes))

    def reply(self, phase: Phase, client_id: int, r: int, received: Message, reply: Reply) -> Reply:
        """``reply`` with the attacked parts rewritten (:func:`poison_part`) where ``client_id``
        attacks in round ``r`` and the phase is training or the query; else ``reply`` itself.

        Args:
            received: the phase's message the client received (``{component name: part}``).
        """
        if phase == "evaluate" or not self.parts or not self.active(client_id, r):
            return reply
        message = dict(reply.message)
        for name in self.parts:
            if message.get(name):
                g = generator(self.seed, "attack", r, client_id, phase, name)
                message[name] = poison_part(self.cfg.kind, message[name], received.get(name, {}), g,
                                            scale=self._scale(name), std=self.std, keep=self.buffers)
        return Reply(message, reply.metrics, reply.state)
