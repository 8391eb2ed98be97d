"""Feature exposure eps(t) (FLea Sec. 4.4) on hand-made schedules."""

from __future__ import annotations

import pytest
import torch

from fedaug.core.errors import ConfigError
from fedaug.privacy.exposure import exchange_matrices, feature_exposure, flea_schedule, pool_schedule


def test_hand_made_schedule():
    # 4 clients; round 1 samples {0, 1}, round 2 {2}, round 3 {1, 3}, round 4 {0}
    contributors, receivers = flea_schedule([[0, 1], [2], [1, 3], [0]])
    assert contributors == [[], [0, 1], [2], [1, 3]]
    eps = feature_exposure(contributors, receivers, 4)
    # round 1: nothing shared; round 2: 0-2, 1-2; round 3: + 2-1 (known), 2-3; round 4: + 1-0, 3-0
    pairs = [0, 2, 3, 5]
    assert eps == pytest.approx([p * 2 / 12 for p in pairs])


def test_pool_schedule_passes_every_earlier_share_to_each_later_client():
    # 4 clients; round 1 samples {0, 1}, round 2 {2}, round 3 {1, 3}, round 4 {0}
    contributors, receivers = pool_schedule([[0, 1], [2], [1, 3], [0]])
    assert contributors == [[], [0, 1], [0, 1, 2], [0, 1, 2, 3]] and receivers == [[0, 1], [2], [1, 3], [0]]
    # round 2: 0-2, 1-2; round 3: + 0-1 (own pair), 0-3, 1-3, 2-3 (2-1 known); round 4: nothing new
    assert feature_exposure(contributors, receivers, 4) == pytest.approx([0.0, 2 / 6, 6 / 6, 6 / 6])


def test_full_participation_pool_exposes_everyone_after_one_round():
    assert feature_exposure(*pool_schedule([[0, 1, 2]] * 3), 3) == [0.0, 1.0, 1.0]


def test_nothing_shared_is_zero_exposure():
    assert feature_exposure([[], []], [[0, 1, 2], [0, 1, 2]], 3) == [0.0, 0.0]


def test_matrices_are_symmetric_cumulative_without_diagonal():
    xi = exchange_matrices([[], [0, 1], []], [[0, 1], [0, 2], [1]], 3)  # round 2: 0 and 2 receive 0's and 1's
    assert not xi[0].any()
    assert xi[1].tolist() == [[False, True, True], [True, False, True], [True, True, False]]
    assert torch.equal(xi[2], xi[1])


def test_everyone_with_everyone_is_one():
    assert feature_exposure([[0, 1, 2]], [[0, 1, 2]], 3) == [1.0]


def test_bad_ids_and_lengths_are_config_errors():
    with pytest.raises(ConfigError, match=r"client ids \[5\] are outside 0..3"):
        feature_exposure([[5]], [[0]], 4)
    with pytest.raises(ConfigError, match=r"one contributor list per receiver list"):
        feature_exposure([[0]], [], 4)
