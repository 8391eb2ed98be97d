"""Privacy analyses of a trained federation (FLea, KDD 2024, Sec. 4.4 and App. D): probing the
global model (:mod:`~fedaug.analysis.probe`), reconstruction and context-identification attacks
on shared representations (:mod:`~fedaug.analysis.attacks`) and their figures
(:mod:`~fedaug.analysis.figures`).

This package sits above the engine (it reads simulations and run directories); the measures and
perturbations that methods use during training (distance correlation, feature exposure, Gaussian
noise) stay below them in :mod:`fedaug.privacy`.
"""

from fedaug.analysis.attacks import FeatureDecoder, context_attack, plant_marker, reconstruction_attack
from fedaug.analysis.probe import feature_dcor, global_model, pooled

__all__ = ["FeatureDecoder", "context_attack", "feature_dcor", "global_model", "plant_marker", "pooled",
           "reconstruction_attack"]
