"""Serving simulator: requests -> router -> replicas (cache + continuous batching) -> metrics."""

from skv.sim.config import SimConfig
from skv.sim.engine import CompiledRun, compile_run, simulate
from skv.sim.results import SimResult

__all__ = ["CompiledRun", "SimConfig", "SimResult", "compile_run", "simulate"]
