"""privacy/clip.py: the update a client made, bounded in L2 norm, against hand-computed values."""

from __future__ import annotations

import torch

from fedaug.privacy.clip import clip_update, update_entries

REFERENCE = {"w": torch.tensor([1.0, 2.0]), "b": torch.tensor([0.0])}


def test_update_entries_are_the_floating_entries_with_a_same_shaped_floating_counterpart():
    weights = {"w": torch.tensor([4.0, 6.0]), "b": torch.tensor([1.0, 1.0]), "n": torch.tensor(3),
               "dc": torch.tensor([9.0])}
    assert update_entries(weights, REFERENCE) == ["w"]  # b: another shape; n: integer; dc: nothing sent


def test_clip_update_bounds_the_update_over_its_entries_together():
    weights = {"w": torch.tensor([4.0, 6.0]), "b": torch.tensor([12.0]), "n": torch.tensor(9)}  # Delta (3, 4, 12): 13
    clipped, norm = clip_update(weights, REFERENCE, 6.5)
    assert norm == 13.0 and clipped["w"].tolist() == [2.5, 4.0] and clipped["b"].tolist() == [6.0]
    assert clipped["n"] is weights["n"]  # integer entries as received


def test_named_keys_bound_only_those_and_an_entry_without_counterpart_is_its_own_update():
    weights = {"w": torch.tensor([4.0, 6.0]), "b": torch.tensor([0.0]), "dc": torch.tensor([-6.0, 8.0])}
    clipped, norm = clip_update(weights, REFERENCE, 5.0, keys=["dc"])  # ||dc - 0|| = 10
    assert norm == 10.0 and clipped["dc"].tolist() == [-3.0, 4.0]
    assert clipped["w"] is weights["w"] and clipped["b"] is weights["b"]  # not named: as received
    same, _ = clip_update(weights, REFERENCE, 20.0, keys=["w", "dc"])
    assert torch.equal(same["w"], weights["w"]) and torch.equal(same["dc"], weights["dc"])  # within: unchanged
