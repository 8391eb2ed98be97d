"""FedMix / NaiveMix: the loss against a hand computation, the shared means, the share-once protocol
and its byte counts (shared images are large; FedRDN's statistics are a few numbers)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from fedaug.core.errors import ConfigError
from fedaug.engine.run import build_simulation
from fedaug.methods.aug.fedmix import FedMix, batch_means, fedmix_loss
from fedaug.methods.component import Batch
from fedaug.methods.recipe import build_recipe
from tests.methods.aug.inputs import make_ctx, tiny_cfg

W = np.array([[0.5, -0.25], [-0.5, 0.75]])  # (K=2, D=2)


def np_ce(logits, target):
    """Cross-entropy of one sample against a soft or one-hot target (numpy, float64)."""
    logp = logits - np.log(np.exp(logits).sum())
    return -(target * logp).sum()


def test_fedmix_loss_matches_a_hand_computation_on_a_linear_model():
    lam = 0.2
    x = np.array([[1.0, 2.0], [-1.0, 0.5]])
    y = np.array([0, 1])
    x_bar = np.array([[0.3, -0.4], [0.6, 0.1]])
    y_bar = np.array([[0.7, 0.3], [0.4, 0.6]])
    expected = []
    for i in range(2):
        xs = (1 - lam) * x[i]
        logits = W @ xs
        onehot = np.eye(2)[y[i]]
        p = np.exp(logits) / np.exp(logits).sum()
        grad = (1 - lam) * W.T @ (p - onehot)  # d[(1 - lam) CE(W x, y_i)] / dx
        expected.append((1 - lam) * np_ce(logits, onehot) + lam * np_ce(logits, y_bar[i]) + lam * grad @ x_bar[i])
    model = nn.Linear(2, 2, bias=False).double()
    with torch.no_grad():
        model.weight.copy_(torch.tensor(W))
    xs = ((1 - lam) * torch.tensor(x)).requires_grad_()
    loss = fedmix_loss(model(xs), xs, torch.tensor(y), torch.tensor(x_bar), torch.tensor(y_bar), lam)
    assert loss.item() == pytest.approx(np.mean(expected), rel=1e-12)
    loss.backward()  # double backward through the input gradient reaches the weights
    assert model.weight.grad is not None and bool(torch.isfinite(model.weight.grad).all())


def test_batch_means_golden():
    x = torch.arange(10, dtype=torch.float32).view(5, 2)
    y = torch.eye(2)[torch.tensor([0, 1, 1, 0, 1])]
    mx, my = batch_means(x, y, 2, torch.tensor([4, 0, 1, 2, 3]))
    assert torch.equal(mx, torch.tensor([[4.0, 5.0], [3.0, 4.0]]))  # rows (4, 0) and (1, 2); 3 dropped
    assert torch.equal(my, torch.tensor([[0.5, 0.5], [0.0, 1.0]]))
    mx, _ = batch_means(x, y, 10, torch.arange(5))  # M_k >= n: the whole set
    assert torch.equal(mx, x.mean(0, keepdim=True))


def shared_part() -> dict[str, torch.Tensor]:
    """A downlink holding three means of clients 1 and 2 (3x3 images, 4 classes)."""
    return {"start": torch.tensor(0), "x": torch.rand(3, 9), "y": torch.eye(4)[torch.tensor([1, 2, 3])],
            "owner": torch.tensor([1, 1, 2])}


def shared_fedmix(mode: str) -> tuple[FedMix, object]:
    fedmix = FedMix(lam=0.25, mean_batch=2, mode=mode)
    x = torch.rand(6, 1, 3, 3)
    ctx = make_ctx(x, torch.tensor([0, 1, 2, 3, 0, 1]), client_id=0, model=nn.Sequential(nn.Flatten(), nn.Linear(9, 4)))
    fedmix.receive(ctx, shared_part(), {})
    return fedmix, ctx


def test_naivemix_labels_are_soft_and_sum_to_one():
    fedmix, ctx = shared_fedmix("naive")
    out, target = fedmix.forward(ctx, Batch(ctx.data.x, ctx.data.y))
    assert out.shape == (6, 4) and target.y.shape == (6, 4)
    assert torch.allclose(target.y.sum(1), torch.ones(6))
    assert torch.all(target.y.max(1).values >= 0.75 - 1e-6)


def test_fedmix_forward_scales_the_input_and_its_loss_is_finite():
    fedmix, ctx = shared_fedmix("fedmix")
    out, target = fedmix.forward(ctx, Batch(ctx.data.x, ctx.data.y))
    x, x_bar, y_bar = fedmix._pair
    assert torch.allclose(x, 0.75 * ctx.data.x) and x_bar.shape == (6, 1, 3, 3) and y_bar.shape == (6, 4)
    assert torch.isfinite(fedmix.task_loss(ctx, out, target))
    up, state = fedmix.reply(ctx)
    assert up["x"].shape == (3, 9) and up["y"].shape == (3, 4) and int(up["have"]) == 3  # 6 samples / M_k=2
    assert state["owner"].tolist() == [1, 1, 2]


@pytest.mark.parametrize("losses, warned", [((0.4, -0.1), False), ((0.1, -0.4), True)])
def test_a_round_whose_taylor_loss_sums_below_zero_warns_at_the_reply(monkeypatch, losses, warned):
    """The Taylor loss is unbounded below: a client whose round of steps sums it below 0 warns (once, at
    its reply: one synchronisation per client and round, none per step); a positive sum does not."""
    import warnings

    from fedaug.methods.aug import fedmix as module

    fedmix, ctx = shared_fedmix("fedmix")
    values = iter(losses)
    monkeypatch.setattr(module, "fedmix_loss", lambda out, *rest: out.sum() * 0 + next(values))
    for _ in losses:
        out, target = fedmix.forward(ctx, Batch(ctx.data.x, ctx.data.y))
        fedmix.task_loss(ctx, out, target)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fedmix.reply(ctx)
    assert [str(w.message) for w in caught] == ([module.NEGATIVE_LOSS] if warned else [])
    fedmix.receive(ctx, shared_part(), {})  # the next round starts a new sum
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fedmix.reply(ctx)
    assert caught == []


def test_share_once_protocol_and_byte_counts():
    k, d, classes, m = 3, 64, 4, 8  # clients, values per image (1x8x8), classes, M_k
    sim = build_simulation(tiny_cfg(["fedmix"], {"fedmix": {"mean_batch": m}}, participation=1.0))
    recs = [sim.run_round(r) for r in (1, 2, 3)]
    means = 48 // m  # 48 training samples per client
    row = (d + classes) * 4
    assert recs[0]["comm"]["up"]["fedmix"] == k * (means * row + 8)  # means + labels + 'have', once
    assert recs[1]["comm"]["up"]["fedmix"] == k * 8
    assert recs[0]["comm"]["down"]["fedmix"] == k * 8  # nothing to send yet
    assert recs[1]["comm"]["down"]["fedmix"] == k * (8 + k * means * (row + 8))  # the whole pool, once
    assert recs[2]["comm"]["down"]["fedmix"] == k * 8
    assert sim.server["fedmix"]["x"].shape == (k * means, d)
    rdn = build_simulation(tiny_cfg(["fedrdn"], participation=1.0))
    rdn_bytes = sum(r["comm"]["up"]["fedrdn"] + r["comm"]["down"]["fedrdn"] for r in (rdn.run_round(1), rdn.run_round(2)))
    fedmix_bytes = sum(r["comm"]["up"]["fedmix"] + r["comm"]["down"]["fedmix"] for r in recs[:2])
    assert rdn_bytes == 24 + 3 * (24 + 24) and fedmix_bytes > 100 * rdn_bytes


def test_options_are_validated():
    with pytest.raises(ConfigError, match=r"fedmix\.lam"):
        FedMix(lam=1.5)
    with pytest.raises(ConfigError, match=r"fedmix\.mean_batch"):
        FedMix(mean_batch=0)
    with pytest.raises(ConfigError, match=r"fedmix\.mode"):
        FedMix(mode="global")


@pytest.mark.parametrize("ffa", ["fedfa", "vfda"])
def test_fedmix_trains_through_ffa_layers(ffa):
    """FedMix's loss differentiates an input gradient (double backward) through every layer of the
    model, the FFA layers of FedFA and VFDA included (FedRDN Table 1's FedFA + FedMix row)."""
    def weights(augs: list[str]) -> dict[str, torch.Tensor]:
        sim = build_simulation(tiny_cfg(augs, {ffa: {"kernel": "off"}} if ffa in augs else {}, participation=1.0))
        for r in (1, 2, 3):  # FedMix's first round trains without means (none shared yet)
            rec = sim.run_round(r)
        assert np.isfinite(rec["train"]["loss"])
        return {k: v.clone() for k, v in sim.server["fedavg"]["weights"].items()}

    both, alone = weights(["fedmix", ffa]), weights(["fedmix"])
    assert all(bool(torch.isfinite(v).all()) for v in both.values())
    assert any(not torch.equal(both[k], alone[k]) for k in alone)  # the FFA layers changed the training


def test_fedmix_refuses_ffa_layers_on_the_compiled_kernel():
    """The compiled kernel's gradient is not differentiable: FedMix's gradient term would be lost."""
    with pytest.raises(ConfigError, match=r"'fedmix' differentiates a gradient again.*'fedfa'.*"
                                          r"method\.options\.fedfa\.kernel='off'"):
        build_recipe("fedavg", ["fedmix", "fedfa"], {"fedfa": {"kernel": "on"}})
    build_recipe("fedavg", ["fedmix", "vfda"], {"fedmix": {"mode": "naive"}, "vfda": {"kernel": "on"}})  # one backward
