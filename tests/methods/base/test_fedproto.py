"""FedProto: the prototype regulariser, the uploaded prototypes and their weighted average."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fedaug.methods.base.fedproto import FedProto
from fedaug.methods.component import ClientCtx, Uplink
from fedaug.methods.recipe import Recipe
from tests.methods.base.tiny import W0, X, Y, Linear2, run_client, split

GLOBAL = np.array([[1.0, 0.0], [0.0, -1.0]])  # (K, D) global prototypes


def test_regulariser_and_uploaded_prototypes():
    lam = 0.5
    proto = FedProto(lam=lam)
    model = Linear2()
    proto.setup(model, (2,))
    down = {"fedproto": {"protos": torch.tensor(GLOBAL, dtype=torch.float32), "counts": torch.tensor([3.0, 0.0])}}
    result = run_client(Recipe(proto), model, down)
    z = X  # Linear2's head input is the input itself
    known = Y == 0  # only class 0 has a global prototype
    expected = lam * ((z[known] - GLOBAL[Y[known]]) ** 2).mean()
    assert result.metrics["fedproto/proto"] == pytest.approx(expected, rel=1e-6)
    part = result.message["fedproto"]
    np.testing.assert_allclose(part["protos"].numpy(), [X[Y == 0].mean(0), X[Y == 1].mean(0)], rtol=1e-6)
    assert part["counts"].tolist() == [2.0, 2.0]
    assert "head.weight" not in part  # no weights travel
    assert not np.allclose(result.state["fedproto"]["model"]["head.weight"].numpy(), W0)  # kept locally


def test_server_average_is_weighted_by_class_counts_and_keeps_unseen_classes():
    proto = FedProto()
    server = proto.init_server(Linear2(), 2)
    server["protos"][1] = torch.tensor([7.0, 7.0])
    server["counts"][1] = 4.0
    ups = [Uplink(0, 9, {"protos": torch.tensor([[1.0, 2.0], [0.0, 0.0]]), "counts": torch.tensor([1.0, 0.0])}),
           Uplink(1, 9, {"protos": torch.tensor([[4.0, -1.0], [0.0, 0.0]]), "counts": torch.tensor([3.0, 0.0])})]
    new = proto.aggregate(server, ups)
    np.testing.assert_allclose(new["protos"][0].numpy(), np.average([[1, 2], [4, -1]], axis=0, weights=[1, 3]))
    assert new["protos"][1].tolist() == [7.0, 7.0] and new["counts"].tolist() == [4.0, 4.0]


def test_each_client_is_evaluated_with_its_own_model():
    proto = FedProto()
    model = Linear2()
    proto.setup(model, (2,))
    own = {k: v + 1.0 for k, v in model.state_dict().items()}
    ctx = ClientCtx(model, 1, 1, 0, split(), phase="evaluate")
    proto.receive(ctx, proto.downlink(proto.init_server(model, 2), 1, "evaluate"), {"model": own})
    assert torch.equal(model.head.weight, own["head.weight"])
    proto.receive(ctx, {}, {})  # never trained: the initial model
    np.testing.assert_allclose(model.head.weight.detach().numpy(), W0, rtol=1e-6)
