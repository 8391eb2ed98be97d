"""Privacy toolkit for shared representations: distance correlation, feature exposure, Gaussian
noise, reconstruction and context-identification attacks (FLea, KDD 2024, Sec. 4.4, App. B and D)."""

from fedaug.privacy.attacks import FeatureDecoder, context_attack, plant_marker, reconstruction_attack
from fedaug.privacy.dcor import distance_correlation
from fedaug.privacy.exposure import exchange_matrices, feature_exposure, flea_schedule
from fedaug.privacy.noise import add_gaussian_noise

__all__ = ["FeatureDecoder", "add_gaussian_noise", "context_attack", "distance_correlation", "exchange_matrices",
           "feature_exposure", "flea_schedule", "plant_marker", "reconstruction_attack"]
