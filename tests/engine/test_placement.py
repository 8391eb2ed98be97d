"""Every component keeps its state and its message parts on the run's device (issue 17).

Each registered method runs one round and an evaluation on the tiny federation of
``tests/conftest.py`` with ``device = "auto"``: the CPU here, CUDA on a machine that has it, where
the same test then checks CUDA placement. A spy records every random stream a component's context
creates; afterwards every tensor of the server state, of each client's per-client state, of every
message in both directions (the engine's own evaluation meters excepted: a host-side summary), of
the worker model and of the layers attached to it must be on the resolved device.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

from fedaug.config.schema import validate
from fedaug.core.device import resolve_device
from fedaug.core.payload import tensor_leaves
from fedaug.engine.protocol import METERS, Reply
from fedaug.engine.run import build_simulation
from fedaug.layers.attach import chains
from fedaug.methods import component
from fedaug.methods.recipe import METHODS
from tests.conftest import tiny_raw

#: options that make a method run on the tiny federation quickly and on every device
OPTIONS: dict[str, dict[str, Any]] = {"ccvr": {"num_virtual": 8, "epochs": 1}, "fedfa": {"kernel": "off"},
                                      "vfda": {"kernel": "off"}}


def method_raw(name: str) -> dict[str, Any]:
    raw = tiny_raw(rounds=1, participation=1.0)
    base, augs = (name, []) if METHODS.get(name).role == "server" else ("fedavg", [name])
    raw["method"] = {"base": base, "augs": augs, "options": {name: OPTIONS[name]} if name in OPTIONS else {}}
    return raw


@pytest.mark.parametrize("name", METHODS.names())
def test_state_and_messages_stay_on_the_device(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    device = resolve_device("auto")
    streams: list[torch.device] = []
    make = component.generator

    def spy_generator(*keys: Any, device: torch.device | str = "cpu") -> torch.Generator:
        g = make(*keys, device=device)
        streams.append(g.device)
        return g

    monkeypatch.setattr(component, "generator", spy_generator)
    sim = build_simulation(validate(method_raw(name)))
    seen: list[tuple[str, Any]] = []
    run = sim.fleet.run

    def spy_run(phase, r, lr, client_ids, message):  # noqa: ANN001, ANN202
        def spied(cid: int) -> dict:
            built = message(cid)
            seen.append((f"{phase} downlink to {cid}", built))
            return built

        for cid, reply in run(phase, r, lr, client_ids, spied):
            assert isinstance(reply, Reply)
            seen.append((f"{phase} reply of {cid}", {k: v for k, v in reply.message.items() if k != METERS}))
            yield cid, reply

    monkeypatch.setattr(sim.fleet, "run", spy_run)
    record = sim.run_round(1)
    assert not record["rejected"] and not record["dropped"]
    sim.round = 1
    sim.evaluate()

    assert streams and set(streams) == {device}, "a component's random stream is not on ctx.device"
    found = [*tensor_leaves(sim.server, "server"), *tensor_leaves(sim.client_states, "client_states"),
             *(t for where, message in seen for t in tensor_leaves(message, where)),
             *tensor_leaves(dict(sim.model.state_dict()), "model")]
    found += [(f"layer after {m} ({owner})", t) for m, chain in chains(sim.model).items()
              for owner, layer in chain for t in (*layer.parameters(), *layer.buffers())]
    wrong = [f"{where}: {t.device}" for where, t in found if t.device != device]
    assert not wrong, f"{name}: tensors off {device}: " + "; ".join(wrong[:10])
    assert any("reply" in where for where, _ in seen)
