"""FedAvg aggregation against hand-computed averages, and its options."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from fedaug.core.errors import ConfigError
from fedaug.methods.component import Uplink
from fedaug.methods.base.fedavg import FedAvg, norm_stat_keys, weighted_average


class Tiny(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(2, 1)
        self.bn = nn.BatchNorm1d(1)


def uplink(cid, n, w, b, mean):
    return Uplink(cid, n, {"fc.weight": torch.tensor([w]), "fc.bias": torch.tensor([b]),
                           "bn.weight": torch.ones(1), "bn.bias": torch.zeros(1),
                           "bn.running_mean": torch.tensor([mean]), "bn.running_var": torch.ones(1),
                           "bn.num_batches_tracked": torch.tensor(cid + 3)})


UPLINKS = [uplink(0, 10, [1.0, 2.0], 0.5, 1.0), uplink(1, 30, [3.0, -2.0], -0.5, 3.0),
           uplink(2, 60, [0.0, 1.0], 1.5, -1.0)]


def test_sample_weighted_average_equals_numpy():
    fedavg = FedAvg()
    server = fedavg.init_server(Tiny(), 3)
    new = fedavg.aggregate(server, UPLINKS)["weights"]
    n = [10, 30, 60]
    np.testing.assert_allclose(new["fc.weight"].numpy(), np.average([[[1, 2]], [[3, -2]], [[0, 1]]], axis=0, weights=n), rtol=1e-6)
    np.testing.assert_allclose(new["fc.bias"].numpy(), [np.average([0.5, -0.5, 1.5], weights=n)], rtol=1e-6)
    np.testing.assert_allclose(new["bn.running_mean"].numpy(), [np.average([1.0, 3.0, -1.0], weights=n)], rtol=1e-6)
    assert int(new["bn.num_batches_tracked"]) == 5  # integers: the maximum
    assert new["fc.weight"].dtype == torch.float32


def test_uniform_weighting_is_the_plain_mean():
    fedavg = FedAvg(weighting="uniform")
    new = fedavg.aggregate(fedavg.init_server(Tiny(), 3), UPLINKS)["weights"]
    np.testing.assert_allclose(new["fc.bias"].numpy(), [np.mean([0.5, -0.5, 1.5])], rtol=1e-6)


def test_weighted_average_golden_table():
    # (tensors, weights) -> expected ; shapes (2,)
    cases = [
        ([torch.tensor([1.0, 1.0]), torch.tensor([3.0, 5.0])], [1, 1], [2.0, 3.0]),
        ([torch.tensor([1.0, 1.0]), torch.tensor([3.0, 5.0])], [3, 1], [1.5, 2.0]),
        ([torch.tensor([2.0, -2.0])], [7], [2.0, -2.0]),
    ]
    for tensors, weights, expected in cases:
        assert torch.allclose(weighted_average(tensors, weights), torch.tensor(expected))


def test_local_bn_keeps_statistics_out_of_the_shared_weights():
    model = Tiny()
    assert norm_stat_keys(model) == ["bn.running_mean", "bn.running_var", "bn.num_batches_tracked"]
    server = FedAvg(bn="local").init_server(model, 3)
    assert set(server["weights"]) == {"fc.weight", "fc.bias", "bn.weight", "bn.bias"}


@pytest.mark.parametrize("kwargs, match", [({"weighting": "size"}, r"fedavg.weighting must be one of samples, uniform, got 'size'"),
                                           ({"bn": "keep"}, r"fedavg.bn must be one of average, local, drop, got 'keep'")])
def test_bad_options(kwargs, match):
    with pytest.raises(ConfigError, match=match):
        FedAvg(**kwargs)


def test_a_negative_batchnorm_running_variance_or_counter_fails_the_uplink_spec_other_weights_may_be_negative():
    from fedaug.core.errors import PayloadError
    from fedaug.core.payload import validate_part

    fedavg = FedAvg()
    spec = fedavg.uplink_spec(fedavg.init_server(Tiny(), 3))
    good = dict(UPLINKS[1].part)  # fc.weight holds -2.0, bn.bias 0: signed weights pass
    validate_part(good, spec, "up")
    for key, bad in (("bn.running_var", torch.tensor([-0.5])), ("bn.num_batches_tracked", torch.tensor(-1))):
        with pytest.raises(PayloadError, match=f"'{key}' holds -0.5|'{key}' holds -1, below its smallest allowed value 0"):
            validate_part({**good, key: bad}, spec, "up")


def test_the_uplink_spec_declares_parameters_and_normalisation_statistics_from_the_model():
    """The update screening measures each kind apart (engine/screen.py); FedAvg learns which entries are
    parameters and which buffers from the model it starts the server from, never from the names."""
    fedavg = FedAvg()
    assert {k: s.kind for k, s in fedavg.uplink_spec({"weights": {"fc.weight": torch.zeros(1, 2)}}).items()} == {
        "fc.weight": "parameters"}  # before init_server: every entry counts as a parameter
    spec = fedavg.uplink_spec(fedavg.init_server(Tiny(), 3))
    assert {k: s.kind for k, s in spec.items()} == {
        "fc.weight": "parameters", "fc.bias": "parameters", "bn.weight": "parameters", "bn.bias": "parameters",
        "bn.running_mean": "statistics", "bn.running_var": "statistics", "bn.num_batches_tracked": "statistics"}
    local = FedAvg(bn="local")
    assert {s.kind for s in local.uplink_spec(local.init_server(Tiny(), 3)).values()} == {"parameters"}


@pytest.mark.parametrize("seed", range(5))
def test_weighted_average_rounds_as_the_textbook_loop_does(seed):
    """Bit for bit ``acc += t.double() * w_k`` (FedAvg's records before its buffer reuse, issue 38)."""
    g = torch.Generator().manual_seed(seed)
    tensors = [torch.randn(37, 5, generator=g) * 10 ** float(torch.randint(-3, 4, (), generator=g)) for _ in range(9)]
    weights = torch.randint(1, 50, (9,), generator=g).double().tolist()
    w = torch.tensor(weights, dtype=torch.float64)
    acc = torch.zeros(37, 5, dtype=torch.float64)
    for wk, t in zip((w / w.sum()).tolist(), tensors):
        acc += t.double() * wk
    assert torch.equal(weighted_average(tensors, weights), acc.float())
