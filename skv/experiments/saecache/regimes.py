"""SAECache's regime map: where saecache's TTFT beats vLLM's block pool and the best baseline.

The grid (``experiments/saecache/saecache_regimes.yaml``) varies what the paper's setup fixes
or leaves unstated: capacity pressure (share of the trace's distinct prompt blocks), the
interval between new conversations, the workload mix (share of multi-turn conversations and,
of those, the share that use tools) and the think time between turns (mu of the log-normal
inter-turn gap). Everything else is the study's grid config named by ``base`` (one simulated
A40 running Qwen2.5-1.5B, the roofline latency model, 2,000 requests, vLLM's batch limits):
the same simulator the 14-setting grid ran, now over a product of the axes.

A cell generates one ``sharegpt_like``-family trace per (setting, seed) and simulates every
policy on it (:func:`simulate_policies`), so the ratios are paired within a seed. Axis names
are the ``sae_mix`` parameters they set, except ``capacity`` (the config's capacity share)
and ``arrival_s`` (a ``[min, max]`` pair of seconds between new conversations).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import ValidationError, model_validator

from skv.experiments import regimes as R
from skv.experiments.config import ExperimentConfig, config_from_dict, load_config
from skv.experiments.saecache.study import replace_fields

#: the metrics a cell keeps per policy (from the simulator's summary)
METRICS = ("ttft_ms_mean", "ttft_ms_p99", "token_hit_rate")


class SaeRegimeConfig(R.RegimeConfig):
    """``experiments/saecache/saecache_regimes.yaml``."""

    base: str
    num_requests: int = 2000

    @model_validator(mode="after")
    def _check_base(self) -> SaeRegimeConfig:
        """Every setting must make a valid config: a bad value is named here, not by a run."""
        from skv.experiments.config import _flatten

        for m in (self.metric, *self.secondary):
            if m not in METRICS:
                raise ValueError(f"metric {m!r}: a cell records {', '.join(METRICS)}")
        base = load_config(self.base)
        for where, setting in self.checked_settings():
            try:
                setting_config(self, setting, base=base)
            except ValidationError as exc:
                raise ValueError(f"{where}: {_flatten(exc)}") from None
            except ValueError as exc:
                raise ValueError(f"{where}: {exc}") from None
        return self


def setting_config(
    cfg: SaeRegimeConfig, setting: dict[str, Any], *, base: ExperimentConfig | None = None
) -> ExperimentConfig:
    """The experiment config of one setting: ``base`` with the axes' values, the policies and
    any ``config.`` paths (:func:`skv.experiments.regimes.with_paths`)."""
    base = base or load_config(cfg.base)
    params = dict(base.workload.params)
    params["num_requests"] = cfg.num_requests
    capacities = list(base.capacities)
    axes, paths = R.split_setting(setting)
    for name, value in axes.items():
        if name == "capacity":
            capacities = [str(value)]
        elif name == "arrival_s":
            params["arrival_min_s"], params["arrival_max_s"] = (float(v) for v in value)
        else:
            params[name] = value
    config = replace_fields(
        base,
        id=f"{cfg.id}_cell",
        workload={"name": base.workload.name, "params": params},
        capacities=capacities,
        policies=cfg.policies,
    )
    if not paths:
        return config
    data = R.with_paths(config.model_dump(mode="json"), paths)
    return config_from_dict(data, source=f"{cfg.id} (toggled: {', '.join(paths)})")


def simulate_policies(config: ExperimentConfig, seed: int) -> dict[str, dict[str, float]]:
    """Each policy of ``config`` on the same trace (one generation per seed) at its first
    capacity: policy -> :data:`METRICS`."""
    from skv.experiments.runner import make_requests, sim_config, workload_params
    from skv.latency import make_latency_model
    from skv.replay import trace_totals
    from skv.sim import compile_run, simulate
    from skv.sizing import Capacity

    requests = make_requests(config.workload.name, workload_params(config, seed, False))
    # compiled once for all policies (the capacity is no part of it: skv.sim.compile_key); its
    # prompt blocks are the trace's, so their distinct count sizes the capacity
    run = compile_run(requests, sim_config(config, config.policies[0], 1))
    blocks = Capacity.parse(config.capacities[0]).to_blocks(
        block_size=config.block_size,
        unique_blocks=trace_totals(run.trace).unique_blocks,
        model=config.model,
    )
    latency = make_latency_model(config.latency.name, **config.latency.params)
    out = {}
    for spec in config.policies:
        summary = simulate(run, sim_config(config, spec, blocks), latency).summary
        out[spec.key] = {m: float(summary[m]) for m in METRICS}
    return out


def cell(cfg: SaeRegimeConfig, setting: dict[str, Any], seed: int) -> dict[str, dict[str, float]]:
    return simulate_policies(setting_config(cfg, setting), seed)


def load(path: str | Path, *, quick: bool) -> SaeRegimeConfig:
    return R.load_config(path, SaeRegimeConfig, quick=quick)
