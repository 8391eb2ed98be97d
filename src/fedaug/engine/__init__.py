"""Engines: the in-process simulation (default) drives the method components round by round."""

from fedaug.engine.simulate import Simulation, run_experiment

__all__ = ["Simulation", "run_experiment"]
