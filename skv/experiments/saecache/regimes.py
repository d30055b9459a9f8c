"""SAECache's regime map: where saecache's TTFT beats vLLM's block pool and the best baseline.

The grid (``experiments/saecache/saecache_regimes.yaml``) varies what the paper's setup fixes
or leaves unstated: capacity pressure (share of the trace's distinct prompt blocks), the
interval between new conversations, the workload mix (share of multi-turn conversations and,
of those, the share that use tools) and the think time between turns (mu of the log-normal
inter-turn gap). Everything else is the study's grid config named by ``base`` (one simulated
A40 running Qwen2.5-1.5B, the roofline latency model, 2,000 requests, vLLM's batch limits):
the same simulator the 14-setting grid ran, now over a product of the axes.

A cell generates one ``sharegpt_like``-family trace per (setting, seed) and simulates every
policy on it (:func:`simulate_policies`), so the ratios are paired within a seed; the
capacities of one setting share a task and its trace (:func:`compiled_trace`). Axis names
are the ``sae_mix`` parameters they set, except ``capacity`` (the config's capacity share)
and ``arrival_s`` (a ``[min, max]`` pair of seconds between new conversations).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, ClassVar

from pydantic import ValidationError, model_validator

from skv.experiments import regimes as R
from skv.experiments.config import ExperimentConfig, config_from_dict, load_config
from skv.experiments.saecache.study import replace_fields

#: the metrics a cell keeps per policy (from the simulator's summary)
METRICS = ("ttft_ms_mean", "ttft_ms_p99", "token_hit_rate")


class SaeRegimeConfig(R.RegimeConfig):
    """``experiments/saecache/saecache_regimes.yaml``."""

    #: the capacity does not change the trace (:func:`compiled_trace` keeps the last one):
    #: settings that differ only in it share a task, so the trace is made once for them
    shared_axes: ClassVar[tuple[str, ...]] = ("capacity",)
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


#: :func:`compiled_trace`'s last result: (its key, (the compiled run, its unique blocks))
_LAST_TRACE: dict[tuple[Any, ...], tuple[Any, int]] = {}


def compiled_trace(config: ExperimentConfig, seed: int) -> tuple[Any, int]:
    """The workload of ``config`` at ``seed`` compiled for its simulator settings
    (:func:`skv.sim.compile_run`) and its distinct prompt blocks (what a capacity share is
    of). Both depend only on the workload's name and parameters and on the compile settings
    (:func:`skv.sim.compile_key`: block size and keying), never on the policy or capacity;
    the last one is kept, so the cells of one task (the capacities of one setting) make it
    once. ``simulate`` never changes a compiled run."""
    from skv.experiments.runner import make_requests, sim_config, workload_params
    from skv.replay import trace_totals
    from skv.sim.engine import compile_key, compile_run

    params = workload_params(config, seed, False)
    settings = sim_config(config, config.policies[0], 1)
    key = (config.workload.name, json.dumps(params, sort_keys=True), compile_key(settings))
    hit = _LAST_TRACE.get(key)
    if hit is None:
        _LAST_TRACE.clear()
        run = compile_run(make_requests(config.workload.name, params), settings)
        hit = _LAST_TRACE[key] = (run, trace_totals(run.trace).unique_blocks)
    return hit


def simulate_policies(config: ExperimentConfig, seed: int) -> dict[str, dict[str, float]]:
    """Each policy of ``config`` on the same trace (one generation per seed) at its first
    capacity: policy -> :data:`METRICS`."""
    from skv.experiments.runner import sim_config
    from skv.latency import make_latency_model
    from skv.sim import simulate
    from skv.sizing import Capacity

    # compiled once for all policies (the capacity is no part of it: skv.sim.compile_key); its
    # prompt blocks are the trace's, so their distinct count sizes the capacity
    run, unique = compiled_trace(config, seed)
    blocks = Capacity.parse(config.capacities[0]).to_blocks(
        block_size=config.block_size, unique_blocks=unique, model=config.model
    )
    latency = make_latency_model(config.latency.name, **config.latency.params)
    out = {}
    for spec in config.policies:
        result = simulate(run, sim_config(config, spec, blocks), latency, columns=True)
        out[spec.key] = column_metrics(result.columns)
    return out


def column_metrics(columns: dict[str, Any]) -> dict[str, float]:
    """:data:`METRICS` from a run's request columns (``simulate(..., columns=True)``), each by
    :func:`skv.sim.results.summarize`'s own expression over the same values in the same
    order: the summary's floats, without a row per request."""
    from skv.sim.results import mean_or_nan, percentile_or_nan

    ttft = columns["ttft_ms"]
    prompt = int(columns["prompt_tokens"].sum())
    cached = int(columns["cached_tokens"].sum())
    return {
        "ttft_ms_mean": mean_or_nan(ttft),
        "ttft_ms_p99": percentile_or_nan(ttft, 99),
        "token_hit_rate": float(cached / prompt if prompt else 0.0),
    }


def cell(cfg: SaeRegimeConfig, setting: dict[str, Any], seed: int) -> dict[str, dict[str, float]]:
    return simulate_policies(setting_config(cfg, setting), seed)


def load(path: str | Path, *, quick: bool) -> SaeRegimeConfig:
    return R.load_config(path, SaeRegimeConfig, quick=quick)
