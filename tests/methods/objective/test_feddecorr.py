"""FedDecorr: the decorrelation loss equals numpy's correlation matrix norm; it is a local objective."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fedaug.methods.objective.feddecorr import FedDecorr, decorrelation_loss
from fedaug.methods.base.fedavg import FedAvg
from fedaug.methods.recipe import Recipe
from tests.methods.base.tiny import C0, V0, X, Deep2, run_client


@pytest.mark.parametrize("shape", [(8, 3), (5, 2), (16, 6)])  # (B, D)
def test_loss_is_the_squared_frobenius_norm_of_the_correlation_over_d2(shape):
    z = np.random.default_rng(sum(shape)).normal(size=shape)
    expected = (np.corrcoef(z, rowvar=False) ** 2).sum() / shape[1] ** 2
    assert decorrelation_loss(torch.tensor(z)).item() == pytest.approx(expected, rel=1e-6)


def test_term_in_a_local_step_on_the_head_input():
    beta = 0.3
    model = Deep2()
    decorr = FedDecorr(beta=beta)
    fedavg = FedAvg()
    decorr.setup(model, (2,))
    down = {"fedavg": fedavg.downlink(fedavg.init_server(model, 1), 0)}
    result = run_client(Recipe(fedavg, [decorr]), model, down)
    z = X @ V0.T + C0
    expected = beta * (np.corrcoef(z, rowvar=False) ** 2).sum() / 4
    assert result.metrics["feddecorr/decorr"] == pytest.approx(expected, rel=1e-4)
    assert FedDecorr.role == "objective"
