"""The federated-data containers: labels are integer class indices in range, checked when built."""

from __future__ import annotations

import pytest
import torch

from fedaug.core.errors import DataError
from fedaug.data.base import ClientData, FederatedData, Split


def _split(y: list) -> Split:
    y = torch.tensor(y)
    return Split(torch.zeros(len(y), 1, 2, 2), y)


def _client(name: str, train: list, val: list = (), test: list = ()) -> ClientData:
    return ClientData(name, name, _split(train), _split(list(val) or [0]), _split(list(test) or [0]))


def test_labels_in_range_are_accepted():
    data = FederatedData("toy", "classification", 3, (1, 2, 2), [_client("a", [0, 1, 2]), _client("b", [2])])
    assert data.num_clients == 2


def test_out_of_range_labels_name_the_dataset_every_client_split_and_value():
    clients = [_client("a", [0, 3, 1, 3, -1]), _client("b", [0], test=[7]), _client("c", [2])]
    with pytest.raises(DataError) as info:
        FederatedData("toy", "classification", 3, (1, 2, 2), clients)
    assert str(info.value) == (
        "toy: labels must be integer class indices in 0..2 (num_classes=3); client 'a' train has label(s) -1, 3; "
        "client 'b' test has label(s) 7. Correct the source data (a dataset generated into the cache is rebuilt "
        "once its file under $FEDAUG_CACHE is deleted)")


def test_many_bad_values_are_cut_after_ten():
    with pytest.raises(DataError, match=r"client 'a' train has label\(s\) 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, \.\.\."):
        FederatedData("toy", "classification", 2, (1, 2, 2), [_client("a", list(range(20)))])


def test_non_integer_labels_are_refused():
    client = ClientData("a", "a", Split(torch.zeros(2, 1), torch.tensor([0.0, 1.0])), _split([0]), _split([0]))
    with pytest.raises(DataError, match=r"client 'a' train labels are torch\.float32, not integer class indices"):
        FederatedData("toy", "classification", 2, (1,), [client])


def test_segmentation_masks_are_checked_voxel_by_voxel():
    mask = torch.zeros(2, 4, 4, dtype=torch.int64)
    mask[1, 2, 3] = 3
    client = ClientData("site", "site", Split(torch.zeros(2, 1, 4, 4), mask), _split([0]), _split([0]))
    with pytest.raises(DataError, match=r"seg: labels must be integer class indices in 0\.\.2 .* client 'site' train "
                                        r"has label\(s\) 3"):
        FederatedData("seg", "segmentation", 3, (1, 4, 4), [client])
