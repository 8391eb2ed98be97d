"""fedaug's data in Flower records: parts and nested states arrive bit for bit through the wire format."""

from __future__ import annotations

import math

import pytest

pytest.importorskip("flwr", reason="the Flower adapter's tests need the flower extra: pip install 'fedaug[flower]'")

import torch  # noqa: E402
from flwr.app import RecordDict  # noqa: E402
from flwr.common.serde import recorddict_from_proto, recorddict_to_proto  # noqa: E402

from fedaug.core.errors import PayloadError  # noqa: E402
from fedaug.engine.flower.codec import drop_tree, get_parts, get_tree, has_tree, put_parts, put_tree  # noqa: E402


def over_the_wire(content: RecordDict) -> RecordDict:
    return recorddict_from_proto(recorddict_to_proto(content))


def test_parts_arrive_bit_for_bit_with_their_dtypes_and_shapes():
    g = torch.Generator().manual_seed(0)
    message = {
        "fedavg": {"conv.weight": torch.randn(4, 3, 3, 3, generator=g), "bn.num_batches_tracked": torch.tensor(7)},
        "flea": {"features": torch.randn(5, 12, generator=g), "labels": torch.tensor([0, 3, 1, 1, 2])},
        "fedfa": {},  # an empty part is still a part
    }
    content = RecordDict()
    put_parts(content, message)
    got = get_parts(over_the_wire(content))
    assert set(got) == set(message)
    for name, part in message.items():
        assert set(got[name]) == set(part)
        for key, t in part.items():
            assert got[name][key].dtype == t.dtype and torch.equal(got[name][key], t), (name, key)


def test_a_part_that_is_not_a_dict_of_tensors_is_left_out():
    content = RecordDict()
    put_parts(content, {"good": {"x": torch.ones(1)}, "bad": [1, 2], "worse": {"x": 3.0}})
    assert set(get_parts(content)) == {"good"}


def test_nested_state_keeps_structure_key_types_and_scalars():
    state = {
        3: {"fedavg": {"bn": {"running_mean": torch.arange(4.0)}}},       # int client id as a key
        "fedrdn": {"n": 40, "ratio": 0.25, "nan": float("nan"), "on": True, "name": "x", "none": None},
        "buffers": [torch.zeros(0, 5, dtype=torch.int64), (torch.ones(2, dtype=torch.float64), 1)],
    }
    content = RecordDict()
    put_tree(content, "state", state)
    got = get_tree(over_the_wire(content), "state")
    assert list(got) == [3, "fedrdn", "buffers"]
    assert torch.equal(got[3]["fedavg"]["bn"]["running_mean"], torch.arange(4.0))
    scalars = got["fedrdn"]
    assert (scalars["n"], scalars["ratio"], scalars["on"], scalars["name"], scalars["none"]) == (40, 0.25, True, "x", None)
    assert math.isnan(scalars["nan"]) and isinstance(scalars["n"], int)
    empty, (doubles, one) = got["buffers"]
    assert empty.shape == (0, 5) and empty.dtype == torch.int64
    assert doubles.dtype == torch.float64 and one == 1 and isinstance(got["buffers"][1], tuple)


def test_a_live_object_in_state_is_refused_naming_where():
    with pytest.raises(PayloadError, match=r"cannot send 'state/fedfa/layer': a Linear"):
        put_tree(RecordDict(), "state", {"fedfa": {"layer": torch.nn.Linear(2, 2)}})
    with pytest.raises(PayloadError, match=r"key \(1, 2\) is a tuple; keys are str or int"):
        put_tree(RecordDict(), "state", {(1, 2): 0})


def test_trees_can_be_dropped_and_missing_ones_are_named():
    content = RecordDict()
    put_tree(content, "state", {"a": 1})
    assert has_tree(content, "state")
    drop_tree(content, "state")
    assert not has_tree(content, "state") and len(content) == 0
    with pytest.raises(PayloadError, match=r"the message holds no 'state'"):
        get_tree(content, "state")
