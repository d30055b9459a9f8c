"""Serving simulator: requests -> router -> replicas (cache + continuous batching) -> metrics."""

from skv.sim.config import SimConfig
from skv.sim.engine import simulate
from skv.sim.results import SimResult

__all__ = ["SimConfig", "SimResult", "simulate"]
