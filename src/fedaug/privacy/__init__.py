"""Privacy measures and perturbations of shared representations, used by methods during training:
distance correlation, feature exposure and Gaussian noise (FLea, KDD 2024, Sec. 4.4, App. B).
The attacks and probes of a trained federation are in :mod:`fedaug.analysis`."""

from fedaug.privacy.dcor import distance_correlation
from fedaug.privacy.exposure import exchange_matrices, feature_exposure, flea_schedule
from fedaug.privacy.noise import add_gaussian_noise

__all__ = ["add_gaussian_noise", "distance_correlation", "exchange_matrices", "feature_exposure", "flea_schedule"]
