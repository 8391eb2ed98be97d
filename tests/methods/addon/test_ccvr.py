"""CCVR: merged class statistics equal the pooled ones; virtual features follow them; the
calibrated head is used for evaluation, identically for every client."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fedaug.core.errors import ConfigError
from fedaug.core.rng import generator
from fedaug.methods.aug.norm import Normalize
from fedaug.methods.addon import ccvr as ccvr_module
from fedaug.methods.addon.ccvr import CCVR, class_statistics, merge_statistics, sample_gaussian
from fedaug.methods.component import ClientCtx, Uplink
from fedaug.methods.base.fedavg import FedAvg
from fedaug.methods.recipe import Recipe
from tests.conftest import imports_torch_dynamo
from tests.methods.base.tiny import X, Deep2, Linear2, run_client, split


def test_merged_statistics_equal_the_pooled_ones():
    g = np.random.default_rng(0)
    clients = [(g.normal(size=(n, 3)), g.integers(0, 2, size=n)) for n in (7, 12, 4)]  # (N_k, D=3), K=2
    stats = [class_statistics(torch.tensor(z), torch.tensor(y), 2) for z, y in clients]
    mean, cov, count = merge_statistics(*(torch.stack([s[i] for s in stats]) for i in range(3)))
    z_all = np.concatenate([z for z, _ in clients])
    y_all = np.concatenate([y for _, y in clients])
    for c in range(2):
        np.testing.assert_allclose(mean[c].numpy(), z_all[y_all == c].mean(0), rtol=1e-5)
        np.testing.assert_allclose(cov[c].numpy(), np.cov(z_all[y_all == c], rowvar=False), rtol=1e-4, atol=1e-6)
        assert count[c] == (y_all == c).sum()


def test_virtual_features_follow_the_gaussian():
    mean, cov = torch.tensor([1.0, -2.0]), torch.tensor([[2.0, 0.6], [0.6, 0.5]])
    z = sample_gaussian(mean, cov, 20000, generator(0, "t")).double().numpy()
    np.testing.assert_allclose(z.mean(0), mean.numpy(), atol=0.05)
    np.testing.assert_allclose(np.cov(z, rowvar=False), cov.numpy(), atol=0.05)


def test_client_uploads_statistics_of_the_received_model():
    ccvr, fedavg = CCVR(), FedAvg()
    model = Deep2()
    ccvr.setup(model, (2,))
    down = {"fedavg": fedavg.downlink(fedavg.init_server(model, 1), 0), "ccvr": {}}
    features = model.body(split().x).detach()  # before the local step
    result = run_client(Recipe(fedavg, [ccvr]), model, down)
    mean, cov, count = class_statistics(features, split().y, 2)
    assert torch.allclose(result.message["ccvr"]["mean"], mean) and torch.allclose(result.message["ccvr"]["cov"], cov)
    assert result.message["ccvr"]["count"].tolist() == [2.0, 2.0]


def test_calibration_fixes_a_biased_head_for_every_client_alike():
    ccvr = CCVR(num_virtual=200, epochs=20, lr=0.1)
    model = Linear2()  # head input = 2-D features
    server = ccvr.init_server(model, 2)
    ups = [Uplink(0, 1, {"mean": torch.tensor([[3.0, 0.0], [0.0, 0.0]]), "cov": 0.1 * torch.eye(2).repeat(2, 1, 1),
                         "count": torch.tensor([50.0, 0.0])}),
           Uplink(1, 1, {"mean": torch.tensor([[0.0, 0.0], [-3.0, 0.0]]), "cov": 0.1 * torch.eye(2).repeat(2, 1, 1),
                         "count": torch.tensor([0.0, 50.0])})]
    server = ccvr.aggregate(server, ups)
    biased = {"head.weight": torch.zeros(2, 2), "head.bias": torch.tensor([0.0, 5.0])}  # always predicts 1
    heads = []
    for cid in (0, 1):
        model.load_state_dict(biased)
        ccvr.receive(ClientCtx(model, cid, 3, 0, split(), phase="evaluate"), ccvr.downlink(server, cid, "evaluate"), {})
        heads.append(model.head.weight.detach().clone())
        logits = model(torch.tensor([[3.0, 0.0], [-3.0, 0.0]]))
        assert logits.argmax(1).tolist() == [0, 1]
    assert torch.equal(heads[0], heads[1])


def _calibrated(ccvr: CCVR, server, head: dict, cid: int, rnd: int = 3) -> torch.Tensor:
    model = Linear2()
    model.load_state_dict(head)
    ctx = ClientCtx(model, cid, rnd, 0, split(), phase="evaluate")
    ccvr.receive(ctx, ccvr.downlink(server, cid, "evaluate"), {})
    return torch.cat([model.head.weight.detach().flatten(), model.head.bias.detach()])


def test_reused_calibration_equals_a_fresh_one_and_follows_its_inputs():
    """The memo of the last calibration gives bit for bit what a fresh instance computes; another
    head, round or set of statistics is calibrated anew (not served the memo)."""
    g = torch.Generator().manual_seed(0)
    z, y = torch.randn(40, 2, generator=g), torch.arange(40) % 2
    options = {"num_virtual": 30, "epochs": 3, "lr": 0.1}
    ccvr = CCVR(**options)
    stats = dict(zip(("mean", "cov", "count"), class_statistics(z, y, 2)))
    server = ccvr.aggregate(ccvr.init_server(Linear2(), 1), [Uplink(0, 1, stats)])
    head = {"head.weight": torch.tensor([[0.5, -1.0], [0.2, 0.3]]), "head.bias": torch.tensor([0.1, -0.4])}
    other = {"head.weight": -head["head.weight"], "head.bias": head["head.bias"]}
    first, again = _calibrated(ccvr, server, head, 0), _calibrated(ccvr, server, head, 1)
    assert torch.equal(first, again) and torch.equal(first, _calibrated(CCVR(**options), server, head, 1))
    assert torch.equal(_calibrated(ccvr, server, other, 2), _calibrated(CCVR(**options), server, other, 2))
    assert not torch.equal(_calibrated(ccvr, server, other, 2), first)
    assert not torch.equal(_calibrated(ccvr, server, head, 0, rnd=4), first)  # another round, other draws
    shifted = {**server, "mean": server["mean"] + 1.0}
    assert torch.equal(_calibrated(ccvr, shifted, head, 0), _calibrated(CCVR(**options), shifted, head, 0))
    assert not torch.equal(_calibrated(ccvr, shifted, head, 0), first)


def test_the_head_is_fitted_with_torchs_sgd_arithmetic_without_importing_torch_dynamo(monkeypatch, tmp_path):
    """The head's SGD is :class:`~fedaug.core.local_sgd.LocalSGD`: bit for bit the head torch.optim.SGD fits
    from the same draws, and a process that calibrates (a whole CCVR run here) never imports torch._dynamo,
    which torch.optim.SGD would (4-6 CPU-seconds of every CCVR process, docs/engine.md)."""
    g = torch.Generator().manual_seed(1)
    z, y = torch.randn(60, 2, generator=g), torch.arange(60) % 2
    options = {"num_virtual": 40, "epochs": 4, "lr": 0.1, "batch_size": 16}
    stats = dict(zip(("mean", "cov", "count"), class_statistics(z, y, 2)))
    server = CCVR(**options).aggregate(CCVR(**options).init_server(Linear2(), 1), [Uplink(0, 1, stats)])
    head = {"head.weight": torch.tensor([[0.5, -1.0], [0.2, 0.3]]), "head.bias": torch.tensor([0.1, -0.4])}
    ours = _calibrated(CCVR(**options), server, head, 0)
    monkeypatch.setattr(ccvr_module, "LocalSGD", torch.optim.SGD)
    assert torch.equal(ours, _calibrated(CCVR(**options), server, head, 0))
    assert not torch.equal(ours, torch.cat([head["head.weight"].flatten(), head["head.bias"]]))
    assert not imports_torch_dynamo(
        "from fedaug.config.schema import validate\n"
        "from fedaug.engine.run import run_experiment\n"
        "from tests.conftest import tiny_raw\n"
        f"raw = tiny_raw(rounds=2); raw['out_dir'] = {str(tmp_path)!r}\n"
        "raw['method'] = {'base': 'fedavg', 'augs': ['ccvr']}\n"
        "run_experiment(validate(raw), quiet=True)")


def test_options_are_checked():
    with pytest.raises(ConfigError, match=r"ccvr.num_virtual must be an integer >= 1, got 0"):
        CCVR(num_virtual=0)


@pytest.mark.parametrize("ccvr_first", [False, True])
def test_statistics_are_of_the_inputs_as_evaluation_transforms_them(ccvr_first):
    """Under an input augmentation before it, CCVR's statistics are of the inputs evaluation feeds
    the model ((x - m) / s here), not of the raw ones; placed before the augmentation, of the raw."""
    m, s = np.array([0.5, -1.0]), np.array([2.0, 0.5])
    ccvr, fedavg, norm = CCVR(), FedAvg(), Normalize(mean=m.tolist(), std=s.tolist())
    model = Deep2()
    ccvr.setup(model, (2,))
    down = {"fedavg": fedavg.downlink(fedavg.init_server(model, 1), 0), "ccvr": {}, "norm": {}}
    x = X if ccvr_first else (X - m) / s
    features = model.body(torch.tensor(x, dtype=torch.float32)).detach()
    result = run_client(Recipe(fedavg, [ccvr, norm] if ccvr_first else [norm, ccvr]), model, down)
    mean, cov, _ = class_statistics(features, split().y, 2)
    assert torch.allclose(result.message["ccvr"]["mean"], mean, atol=1e-6)
    assert torch.allclose(result.message["ccvr"]["cov"], cov, atol=1e-5)
