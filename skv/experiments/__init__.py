"""Studies: experiment configs -> runs -> results, figures and the numbers the paper states.

Shared by every study (this folder's modules):

- ``config``, ``runner``, ``report``, ``outputs``, ``cli``: a simulated experiment (YAML config
  -> serving-simulator runs over seeds -> ``results.json``, summaries, plots); ``skv run`` /
  ``skv run-all``; library entry points :func:`load_config`, :func:`run_experiment`,
  :func:`run_all`. Every output says its latencies are simulated and by which latency model.
- ``figures`` (one function per figure of one experiment's results), ``plotstyle`` (one style
  and the check every figure passes), ``stats`` (intervals over seeds), ``notebook`` (what a
  paper notebook writes), ``engine`` (what studies on a real vLLM engine share).

One package per study, named like its configs (``experiments/<study>/``) and its notebooks
(``notebooks/<study>/``): ``semantickv`` (the SemanticKV suite), ``replay`` (real traces,
cache-only and timed; the routing gate), ``fidelity`` (simulator vs one real engine),
``routing`` (routers on real engines), ``saecache`` (SAECache's grid, ablation, mismatch),
``repurpose`` (KV-Repurpose's segment vs prefix reuse). Studies import the shared modules and
the layers below, never each other.
"""

from skv.experiments.config import ConfigError, ExperimentConfig, load_config
from skv.experiments.runner import run_all, run_experiment

__all__ = ["ConfigError", "ExperimentConfig", "load_config", "run_all", "run_experiment"]
