"""Leave one domain out (``held_out``, any dataset): FedFA Table 4's protocol."""

from __future__ import annotations

import pytest
import torch

from fedaug.core.errors import ConfigError
from fedaug.data.base import hold_out_group
from fedaug.data.registry import load_dataset

OPTS = {"num_clients": 4, "samples_per_client": 8, "num_classes": 3, "size": 4}


def test_held_out_group_leaves_training_and_is_every_clients_test_set():
    full = load_dataset("synthetic", 0, **OPTS)
    held = load_dataset("synthetic", 0, held_out="client2", **OPTS)
    assert [c.name for c in held.clients] == ["client0", "client1", "client3"]
    for c, orig in zip(held.clients, [full.clients[i] for i in (0, 1, 3)]):
        assert torch.equal(c.train.x, orig.train.x) and torch.equal(c.val.y, orig.val.y)  # in-domain train/val
        assert torch.equal(c.test.x, full.clients[2].test.x) and torch.equal(c.test.y, full.clients[2].test.y)
    assert held.info["held_out"] == "client2"


def test_a_group_of_several_clients_is_left_out_whole():
    data = load_dataset("synthetic", 0, **OPTS)
    regrouped = type(data)(data.name, data.task, data.num_classes, data.input_shape,
                           [type(c)(c.name, "a" if i < 2 else "b", c.train, c.val, c.test)
                            for i, c in enumerate(data.clients)], data.info)
    held = hold_out_group(regrouped, "a")
    assert [c.name for c in held.clients] == ["client2", "client3"]
    assert torch.equal(held.clients[0].test.x, torch.cat([data.clients[0].test.x, data.clients[1].test.x]))


def test_unknown_group_names_the_groups_and_the_closest():
    with pytest.raises(ConfigError, match=r"held_out must be one of its client groups \(client0, .*'client9'"):
        load_dataset("synthetic", 0, held_out="client9", **OPTS)
    with pytest.raises(ConfigError, match="at least 2 are needed"):
        load_dataset("synthetic", 0, held_out="client0", **{**OPTS, "num_clients": 1})
    with pytest.raises(ConfigError, match=r"no option 'held_ou' \(did you mean 'held_out'\?\)"):
        load_dataset("synthetic", 0, held_ou="client0", **OPTS)
