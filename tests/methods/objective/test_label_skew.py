"""FedLC and FedRS: one local step with the calibrated / restricted softmax, against numpy."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fedaug.methods.objective.label_skew import FedLC, FedRS, calibrated_logits, restricted_logits
from tests.methods.base.tiny import B0, LR, W0, X, Linear2, ce_grads, server_round, split


def test_calibrated_and_restricted_logits_golden():
    z = torch.tensor([[1.0, 2.0, 3.0]])
    counts = torch.tensor([16.0, 1.0, 0.0])
    # tau * n^(-1/4): 16 -> 0.5 tau, 1 -> tau, 0 -> inf (the class leaves the softmax)
    assert calibrated_logits(z, counts, 2.0).tolist() == [[0.0, 0.0, float("-inf")]]
    assert restricted_logits(z, counts, 0.25).tolist() == [[1.0, 2.0, 0.75]]


def test_fedlc_one_step():
    tau, y = 1.0, np.array([0, 1, 1, 1])  # counts (1, 3)
    _, _, result = server_round(FedLC(tau=tau), Linear2(), data=split(X, y))
    shift = tau * np.array([1.0, 3.0]) ** -0.25
    gw, gb = ce_grads(W0, B0, X, y, logit_map=lambda z: z - shift)
    part = result.message["fedavg"]
    np.testing.assert_allclose(part["head.weight"].numpy(), W0 - LR * gw, rtol=1e-5)
    np.testing.assert_allclose(part["head.bias"].numpy(), B0 - LR * gb, rtol=1e-5)


def test_fedlc_class_absent_from_client_leaves_the_softmax():
    _, _, result = server_round(FedLC(), Linear2(), data=split(X, np.array([1, 1, 1, 1])))
    assert result.metrics["task"] == pytest.approx(0.0)  # one class left: nothing to learn
    np.testing.assert_allclose(result.message["fedavg"]["head.weight"].numpy(), W0, rtol=1e-6)


def test_fedrs_one_step():
    alpha, y = 0.3, np.array([0, 0, 0, 0])  # class 1 missing: its logit is scaled by alpha
    _, _, result = server_round(FedRS(alpha=alpha), Linear2(), data=split(X, y))
    m = np.array([1.0, alpha])
    gw, gb = ce_grads(W0, B0, X, y, logit_map=lambda z: z * m, dlogit=lambda z, g: g * m)
    np.testing.assert_allclose(result.message["fedavg"]["head.weight"].numpy(), W0 - LR * gw, rtol=1e-5)
    np.testing.assert_allclose(result.message["fedavg"]["head.bias"].numpy(), B0 - LR * gb, rtol=1e-5)


def test_identity_settings_warn():
    with pytest.warns(UserWarning, match=r"fedrs.alpha=1 makes FedRS identical to FedAvg"):
        FedRS(alpha=1.0)
    with pytest.warns(UserWarning, match=r"fedlc.tau=0 makes FedLC identical to FedAvg"):
        FedLC(tau=0.0)
