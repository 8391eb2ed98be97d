"""The Gaussian-mechanism options of the sharing augmentations (``dp_clip``, ``dp_noise``): the
clipping bound of each artefact, calibrated noise, determinism, declared releases, option errors,
and a 2-round run whose records carry the accountant's (eps, delta)."""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
import torch

from fedaug.core.errors import ConfigError
from fedaug.data.base import Split
from fedaug.engine.records.rundir import RunDir
from fedaug.engine.run import build_simulation, run_experiment
from fedaug.layers.mixing import dataset_channel_stats, soft_labels
from fedaug.methods import METHODS, ClientCtx
from fedaug.methods.aug.fedfa import FedFA
from fedaug.methods.aug.fedmix import FedMix, batch_means
from fedaug.methods.aug.fedrdn import FedRDN, private_client_stats
from fedaug.methods.aug.flea import FLea
from fedaug.methods.aug.vfda import VFDA
from fedaug.models import build_model
from fedaug.privacy.release import GaussianRelease
from tests.methods.aug.inputs import make_ctx, tiny_cfg

SHARING = ("fedfa", "vfda", "fedrdn", "flea", "fedmix")


def gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def quiet(cls, **options):
    """The component built without the clipping-only warning."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        return cls(**options)


# --- options and declared releases ----------------------------------------------------------
@pytest.mark.parametrize("name", SHARING)
def test_off_by_default_declares_nothing(name):
    comp = METHODS.get(name)()
    assert comp.releases == () and comp.dp_clip is None


@pytest.mark.parametrize("name", SHARING)
@pytest.mark.parametrize("options, message", [
    ({"dp_noise": 1.0}, r"{n}\.dp_noise=1\.0 needs {n}\.dp_clip \(the clipping bound C"),
    ({"dp_clip": -1.0, "dp_noise": 1.0}, r"{n}\.dp_clip must be > 0, got -1\.0"),
    ({"dp_clip": 1.0, "dp_noise": -0.5}, r"{n}\.dp_noise must be >= 0, got -0\.5"),
    ({"dp_clip": 0.0, "dp_noise": math.nan}, r"{n}\.dp_clip must be > 0, got 0\.0; "
                                             r"{n}\.dp_noise must be a finite number >= 0, got nan"),
])
def test_bad_options_are_one_config_error_naming_them(name, options, message):
    with pytest.raises(ConfigError, match=message.format(n=name)):
        METHODS.get(name)(**options)


@pytest.mark.parametrize("name", SHARING)
def test_clipping_without_noise_warns_and_declares_no_release(name):
    with pytest.warns(UserWarning, match=rf"{name}\.dp_clip=2\.0 without {name}\.dp_noise > 0 .* no formal guarantee"):
        comp = METHODS.get(name)(dp_clip=2.0)
    assert comp.releases == ()


@pytest.mark.parametrize("name, expected", [
    ("fedfa", (GaussianRelease("fedfa statistics", 1.5, 2.0, "every_round", "client"),)),
    ("vfda", (GaussianRelease("vfda statistics", 1.5, 2.0, "every_round", "client"),)),
    ("fedrdn", (GaussianRelease("fedrdn statistics", 1.5, 2.0, "once", "sample"),)),
    ("flea", (GaussianRelease("flea features", 1.5, 2.0, "every_round", "sample"),)),
    ("fedmix", (GaussianRelease("fedmix mean images", 1.5, 2.0, "once", "sample"),
                GaussianRelease("fedmix mean labels", 1.5, 1.0, "once", "sample"))),
])
def test_each_mechanism_declares_its_release(name, expected):
    assert METHODS.get(name)(dp_clip=2.0, dp_noise=1.5).releases == expected


@pytest.mark.parametrize("cls, options", [(FedFA, {"variance": "client"}), (VFDA, {"global_variance": False})])
def test_variants_that_upload_nothing_warn_that_the_options_do_nothing(cls, options):
    with pytest.warns(UserWarning, match="dp_clip/dp_noise do nothing: this variant uploads no statistics"):
        comp = cls(dp_clip=1.0, dp_noise=1.0, **options)
    assert comp.releases == ()


# --- FedFA / VFDA: client-level, the whole uploaded vector ------------------------------------
def fedfa_upload(seed: int = 0, cid: int = 0, **options) -> tuple[dict[str, torch.Tensor], float]:
    """One client's FedFA upload after a forward pass, and the clean vector's norm."""
    fedfa = quiet(FedFA, at=["block1", "block2"], p=1.0, **options)
    with torch.random.fork_rng():
        torch.manual_seed(0)  # the same initial model in every call
        net = build_model("small_cnn", in_channels=1, num_classes=4, width=3)
    fedfa.setup(net, (1, 8, 8))
    x = 3 * torch.randn(8, 1, 8, 8, generator=gen(cid)) + 2
    ctx = ClientCtx(net, cid, 2, seed, Split(x, torch.zeros(8, dtype=torch.long)), component="fedfa")
    fedfa.receive(ctx, {k: torch.zeros(0) for k in ("block1.gamma_mu", "block1.gamma_sigma", "block2.gamma_mu",
                                                     "block2.gamma_sigma")}, {})
    net.train()
    net(x)
    clean = {k: getattr(fedfa.layers[k.split(".")[0]], k.split(".")[1]) for k in fedfa.uplink_spec(
        fedfa.init_server(net, 3))}
    return fedfa.reply(ctx)[0], float(torch.cat([v.flatten() for v in clean.values()]).norm())


def test_fedfa_upload_is_clipped_as_one_vector():
    up, clean_norm = fedfa_upload(dp_clip=0.5)
    assert clean_norm > 0.5  # the bound bites
    joint = float(torch.cat([v.flatten() for v in up.values()]).double().norm())
    assert joint == pytest.approx(0.5, rel=1e-6)


def test_fedfa_noise_is_seeded_per_client_and_stds_stay_valid():
    a, _ = fedfa_upload(seed=0, dp_clip=0.5, dp_noise=2.0)
    b, _ = fedfa_upload(seed=0, dp_clip=0.5, dp_noise=2.0)
    c, _ = fedfa_upload(seed=1, dp_clip=0.5, dp_noise=2.0)
    assert all(torch.equal(a[k], b[k]) for k in a) and not all(torch.equal(a[k], c[k]) for k in a)
    assert all(bool((v >= 0).all()) for k, v in a.items() if k.endswith("running_std"))


def test_fedfa_noise_std_is_z_c():
    # the noise of the means (never clamped): 2 layers x 3 and 6 channels x 1,000 draws = 9,000 values;
    # relative standard error of the std 0.7 %, tolerance 3 %
    fedfa = FedFA(dp_clip=0.5, dp_noise=2.0)
    up = {"a.running_mean": torch.full((3,), 0.1), "a.running_std": torch.ones(3),
          "b.running_mean": torch.full((6,), -0.2), "b.running_std": torch.ones(6)}
    clipped = quiet(FedFA, dp_clip=0.5).privatize(up, gen())
    noise = torch.cat([fedfa.privatize(up, gen(s))[k] - clipped[k] for s in range(1000)
                       for k in up if k.endswith("running_mean")])
    assert float(noise.std()) == pytest.approx(2.0 * 0.5, rel=0.03)


# --- FedRDN: sample-level, each image's statistics -----------------------------------------
def test_fedrdn_without_clipping_effect_is_the_dataset_statistics():
    x = torch.rand(12, 3, 5, 5, generator=gen())
    mean, std = private_client_stats(x, 1e6, 0.0, gen())
    ref_mean, ref_std = dataset_channel_stats(x)
    torch.testing.assert_close(mean, ref_mean)
    torch.testing.assert_close(std, ref_std)


def test_fedrdn_clips_each_images_statistics_before_the_average():
    x = torch.rand(12, 3, 5, 5, generator=gen()) * torch.linspace(0.1, 10, 12).reshape(-1, 1, 1, 1)
    a = x.numpy().astype(np.float64)
    rows = np.concatenate([a.mean(axis=(2, 3)), a.std(axis=(2, 3))], axis=1)  # (n, 2C), Eq. 5 per image
    c = 1.0
    norms = np.linalg.norm(rows, axis=1)
    assert (norms > c).any() and (norms < c).any()
    expected = (rows * np.minimum(1.0, c / norms)[:, None]).mean(axis=0)
    mean, std = private_client_stats(x, c, 0.0, gen())
    np.testing.assert_allclose(np.concatenate([mean.numpy(), std.numpy()]), expected, rtol=1e-6)


def test_fedrdn_noise_std_is_z_c_over_n():
    # the noise of the means (the stds meet the 1e-6 floor): 3,000 seeded releases of 3 values;
    # relative standard error of the std 0.7 %, tolerance 3 %
    x = torch.rand(10, 3, 4, 4, generator=gen()) + 5
    clean = private_client_stats(x, 2.0, 0.0, gen())[0]
    noise = torch.stack([private_client_stats(x, 2.0, 1.5, gen(s))[0] - clean for s in range(3000)])
    assert float(noise.std()) == pytest.approx(1.5 * 2.0 / 10, rel=0.03)


def test_fedrdn_uploads_the_private_statistics_once():
    x = torch.rand(16, 1, 4, 4, generator=gen())
    fedrdn = FedRDN(dp_clip=1.0, dp_noise=1.0)
    fedrdn.setup(torch.nn.Identity(), (1, 4, 4))
    empty = {"ids": torch.zeros(0, dtype=torch.int64), "mean": torch.zeros(0, 0), "std": torch.zeros(0, 0)}
    ctx = make_ctx(x, client_id=2, component="fedrdn")
    fedrdn.receive(ctx, empty, {})
    up, _ = fedrdn.reply(ctx)
    expected = private_client_stats(x, 1.0, 1.0, make_ctx(x, client_id=2, component="fedrdn").rng("dp"))
    torch.testing.assert_close((up["mean"][0], up["std"][0]), expected)
    assert not torch.allclose(up["mean"][0], dataset_channel_stats(x)[0])


# --- FLea: sample-level, each shared feature row ----------------------------------------------
def flea_query(**options) -> tuple[torch.Tensor, torch.Tensor]:
    """The features a client shares in the query (D values per row) and the clean rows."""
    flea = quiet(FLea, stage="block2", share_fraction=0.5, **options)
    net = build_model("small_cnn", in_channels=1, num_classes=4, width=4)
    flea.setup(net, (1, 8, 8))
    x = torch.randn(40, 1, 8, 8, generator=gen()) * 4
    ctx = make_ctx(x, model=net.eval(), phase="query", component="flea")
    clean, _ = quiet(FLea, stage="block2", share_fraction=0.5).reply(ctx)
    with torch.no_grad():
        shared, _ = flea.reply(make_ctx(x, model=net.eval(), phase="query", component="flea"))
    return shared["features"], clean["features"]


def test_flea_clips_each_shared_row():
    f, clean = flea_query(dp_clip=0.3)
    assert bool((clean.norm(dim=1) > 0.3).all())
    torch.testing.assert_close(f.double().norm(dim=1), torch.full((f.shape[0],), 0.3, dtype=torch.float64),
                               rtol=1e-6, atol=0)


def test_flea_noise_std_is_z_c_per_value():
    f, _ = flea_query(dp_clip=0.3, dp_noise=2.0)
    clipped, _ = flea_query(dp_clip=0.3)
    # 20 rows x D = 64 values = 1,280 draws: relative standard error of the std 2 %, tolerance 8 %
    assert f.numel() == 1280
    assert float((f - clipped).std()) == pytest.approx(0.6, rel=0.08)


# --- FedMix: sample-level, each image before its batch mean -----------------------------------
def test_fedmix_clips_each_image_before_the_mean():
    x = torch.randn(30, 1, 4, 4, generator=gen()) * 3
    y = soft_labels(torch.arange(30) % 4, 4)
    perm = torch.randperm(30, generator=gen())
    fedmix = quiet(FedMix, mean_batch=10, dp_clip=1.0)
    x_bar, y_bar = fedmix.private_means(x, y, perm, gen())
    a = x.flatten(1).numpy().astype(np.float64)
    clipped = a * np.minimum(1.0, 1.0 / np.linalg.norm(a, axis=1))[:, None]
    expected = clipped[perm.numpy()].reshape(3, 10, -1).mean(axis=1)
    np.testing.assert_allclose(x_bar.flatten(1).numpy(), expected, rtol=1e-5, atol=1e-7)
    assert bool((x_bar.flatten(1).norm(dim=1) <= 1.0 + 1e-6).all())  # a mean of vectors within C is within C
    torch.testing.assert_close(y_bar, batch_means(x, y, 10, perm)[1])  # one-hot labels: clipping at 1 is a no-op


def test_fedmix_noise_std_is_z_c_over_m_for_images_and_z_over_m_for_labels():
    x = torch.randn(400, 1, 8, 8, generator=gen())
    y = soft_labels(torch.arange(400) % 4, 4)
    perm = torch.randperm(400, generator=gen())
    clean = quiet(FedMix, mean_batch=20, dp_clip=2.0)
    fedmix = FedMix(mean_batch=20, dp_clip=2.0, dp_noise=1.5)
    x0, y0 = clean.private_means(x, y, perm, gen())
    x1, y1 = fedmix.private_means(x, y, perm, gen(1))
    assert float((x1 - x0).std()) == pytest.approx(1.5 * 2.0 / 20, rel=0.05)  # 20 means x 64 values
    assert bool(((y1 >= 0) & (y1 <= 1)).all()) and not torch.equal(y1, y0)  # noised, clamped to [0, 1]


# --- in the engine ----------------------------------------------------------------------------
def test_a_dp_run_records_epsilon_and_a_run_without_dp_records_nothing(tmp_path):
    options = {"fedfa": {"dp_clip": 5.0, "dp_noise": 1.0}}
    cfg = tiny_cfg(["fedfa"], options, rounds=2, participation=0.67, local_steps=1)
    cfg.out_dir = str(tmp_path)
    _, run_dir = run_experiment(cfg, quiet=True)
    records = RunDir.open(run_dir.path).rounds()
    privacy = [r["privacy"] for r in records]
    assert [p["releases"].keys() for p in privacy] == [{"fedfa statistics"}] * 2
    assert all(math.isfinite(p["epsilon"]) and p["delta"] == 1e-5 and p["unit"] == "client" for p in privacy)
    assert 0 < privacy[0]["epsilon"] < privacy[1]["epsilon"]
    assert not privacy[0]["model_protected"] and privacy[0]["sampling_probability"] == pytest.approx(2 / 3)
    plain = build_simulation(tiny_cfg(["fedfa"], rounds=1, local_steps=1))
    assert "privacy" not in plain.run_round(1)
