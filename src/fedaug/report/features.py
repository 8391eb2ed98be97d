"""Feature analysis of a finished run (FLea, KDD 2024, Sec. 2.3 and App. A): the global model's
features on every client's test data, a 2-D embedding (PCA or t-SNE) coloured by client, and the
Davies-Bouldin score of the features clustered by client and by class."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from fedaug.analysis.probe import global_model
from fedaug.config.load import parse_config
from fedaug.core.errors import CheckpointError, ConfigError, DataError
from fedaug.engine.records.rundir import RunDir
from fedaug.engine.run import build_simulation
from fedaug.methods.component import Batch, ClientCtx, transform_inputs
from fedaug.models.split import extract_features, split_stages
from fedaug.report.results import Run
from fedaug.report.stats import davies_bouldin, pca_2d

EMBEDDINGS = ("pca", "tsne")


def run_features(run: Run, *, stage: str | None = None, per_client: int = 100, split: str = "test") -> dict[str, Any]:
    """The final global model's features of up to ``per_client`` samples of each client's ``split``,
    each client's inputs passed through the components' evaluation transforms and its model set up
    as in evaluation (e.g. its own BatchNorm statistics).

    Args:
        run: a finished run with a checkpoint of its last round.
        stage: split stage whose output is taken (default: the model's penultimate stage, as FLea);
            spatial features ``(B, C, *spatial)`` are averaged over space to ``(B, C)``.
        per_client: the first this many samples of each client's split.
        split: ``"test"`` (default), ``"val"`` or ``"train"``.

    Returns:
        ``{"features": (N, D) float tensor, "clients": N client names, "classes": (N,) int64 labels
        or None (segmentation), "stage": str, "round": int}``.

    Raises:
        CheckpointError: the run has no checkpoint.
    """
    if split not in ("train", "val", "test"):
        raise ConfigError(f"split must be one of train, val, test, got {split!r}")
    sim = build_simulation(parse_config(run.config))
    payload = RunDir(run.path).load_latest()
    if payload is None:
        raise CheckpointError(f"'{run.path}' holds no checkpoint, so its model cannot be analysed")
    sim.restore(payload)
    stage = stage or split_stages(sim.model)[-2]
    feats, names, classes = [], [], []
    for cid, client in enumerate(sim.data.clients):
        part = getattr(client, split)
        model = global_model(sim, cid)
        ctx = ClientCtx(sim.model, cid, sim.round, sim.cfg.seed, client.train.to(sim.device), phase="evaluate",
                        task=sim.task, device=sim.device)
        transforms = sim.recipe.per_batch["transform_batch"]
        batch = transform_inputs(transforms, {c.name: ctx.view(c.name) for c in transforms},
                                 Batch(part.x[:per_client].to(sim.device), part.y[:per_client].to(sim.device)))
        with torch.no_grad():
            f = extract_features(model, batch.x, stage)
        f = f[0] if isinstance(f, tuple) else f  # U-Nets carry (h, skips)
        feats.append((f.flatten(2).mean(2) if f.dim() > 2 else f).cpu())
        names += [client.name] * len(f)
        classes.append(batch.y.cpu())
    y = torch.cat(classes)
    return {"features": torch.cat(feats).float(), "clients": names,
            "classes": y if y.dim() == 1 else None, "stage": stage, "round": sim.round}


def embed(x: torch.Tensor, method: str = "pca", seed: int = 0) -> np.ndarray:
    """``(N, D)`` features -> ``(N, 2)`` coordinates by PCA (exact, :func:`pca_2d`) or t-SNE
    (scikit-learn, PCA-initialised, ``random_state=seed``)."""
    if method == "pca":
        return pca_2d(x).numpy()
    if method == "tsne":
        try:
            from sklearn.manifold import TSNE
        except ImportError:
            raise DataError("t-SNE needs scikit-learn; install it (pip install 'fedaug[data]') or use pca") from None
        perplexity = float(min(30.0, max(2.0, (x.shape[0] - 1) / 3)))
        return TSNE(2, perplexity=perplexity, init="pca", random_state=seed).fit_transform(x.double().numpy())
    raise ConfigError(f"unknown embedding {method!r}; choose from {', '.join(EMBEDDINGS)}")


def feature_analysis(run: Run, *, embedding: str = "pca", stage: str | None = None,
                     per_client: int = 100) -> dict[str, Any]:
    """:func:`run_features` plus the 2-D embedding and the Davies-Bouldin scores (by client: how
    separated the clients' features still are; by class: FLea's class separation; lower = more
    separated; ``None`` when there is only one cluster or no class labels)."""
    f = run_features(run, stage=stage, per_client=per_client)
    x = f["features"].numpy()
    clients = np.asarray(f["clients"])
    classes = f["classes"]
    return {
        "method": run.method, "seed": run.seed, "run_dir": str(run.path), "stage": f["stage"], "round": f["round"],
        "samples": len(x), "embedding": embedding, "coords": embed(f["features"], embedding, run.seed),
        "clients": f["clients"],
        "db_client": davies_bouldin(x, clients) if len(set(clients.tolist())) > 1 else None,
        "db_class": davies_bouldin(x, classes.numpy()) if classes is not None and len(classes.unique()) > 1 else None,
    }
