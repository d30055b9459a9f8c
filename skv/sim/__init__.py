"""Serving simulator: requests -> router -> replicas (cache + continuous batching) -> metrics."""

from skv.sim.engine import SimConfig, simulate
from skv.sim.results import SimResult

__all__ = ["SimConfig", "SimResult", "simulate"]
