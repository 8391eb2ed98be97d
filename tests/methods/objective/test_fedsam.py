"""FedSAM: one sharpness-aware step against numpy."""

from __future__ import annotations

import numpy as np
import pytest

from fedaug.methods.objective.fedsam import FedSAM
from tests.methods.base.tiny import B0, LR, W0, Linear2, ce_grads, server_round


def test_one_sam_step():
    rho = 0.2
    _, _, result = server_round(FedSAM(rho=rho), Linear2(), steps=1)
    gw, gb = ce_grads(W0, B0)
    norm = np.sqrt((gw**2).sum() + (gb**2).sum())
    gw2, gb2 = ce_grads(W0 + rho * gw / norm, B0 + rho * gb / norm)  # gradient at w + eps
    part = result.message["fedavg"]
    np.testing.assert_allclose(part["head.weight"].numpy(), W0 - LR * gw2, rtol=1e-5)
    np.testing.assert_allclose(part["head.bias"].numpy(), B0 - LR * gb2, rtol=1e-5)
    assert not np.allclose(part["head.weight"].numpy(), W0 - LR * gw)


def test_rho_zero_warns():
    with pytest.warns(UserWarning, match=r"fedsam.rho=0 makes FedSAM identical to FedAvg"):
        FedSAM(rho=0)
