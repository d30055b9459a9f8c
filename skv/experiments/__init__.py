"""Experiment configs (YAML) -> serving-simulator runs -> results, summaries and plots.

``skv run CONFIG`` / ``skv run-all``; library entry points :func:`load_config`,
:func:`run_experiment` and :func:`run_all`. Every output says its latencies are simulated and by
which latency model.
"""

from skv.experiments.config import ConfigError, ExperimentConfig, load_config
from skv.experiments.runner import run_all, run_experiment

__all__ = ["ConfigError", "ExperimentConfig", "load_config", "run_all", "run_experiment"]
