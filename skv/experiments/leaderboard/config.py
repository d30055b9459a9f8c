"""The leaderboard's config (``experiments/leaderboard/*.yaml``): which traces, policies,
capacities, the TTFT setting and the tuning budget. Every error names the file and the field.

A trace entry is either a real trace (``trace:``, a name under the trace directory or a path, with
``format_options``) or a synthetic workload (``workload: {name, params}``) replayed once per seed
in ``seeds``. The tuning traces must be workloads whose seeds the evaluation never uses for the
same workload (checked here): a policy's parameters are chosen on data it is not judged on.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from skv.experiments.config import (
    BatchSpec,
    ConfigError,
    LatencySpec,
    PolicySpec,
    WorkloadSpec,
    _flatten,
    read_with_quick,
)

#: bounds that keep one config from asking for days of replay
MAX_TRACES = 16
MAX_SEEDS = 10
MAX_CAPACITIES = 8
MAX_BUDGET = 8


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class TraceEntry(_Strict):
    """One column of the leaderboard: a real trace or a seeded synthetic workload."""

    label: str = Field(min_length=1, max_length=40, pattern=r"^[A-Za-z0-9_.-]+$")
    trace: str | None = None
    format_options: dict[str, Any] = Field(default_factory=dict)
    max_requests: int | None = Field(default=None, ge=1)
    workload: WorkloadSpec | None = None
    seeds: list[int] = Field(default_factory=lambda: [0], min_length=1, max_length=MAX_SEEDS)
    #: tokens per block for workloads (a real trace keeps its own)
    block_size: int = Field(default=16, ge=1, le=4096)

    @model_validator(mode="after")
    def _one_source(self) -> TraceEntry:
        if (self.trace is None) == (self.workload is None):
            raise ValueError(f"trace {self.label!r}: give exactly one of 'trace' or 'workload'")
        if self.trace is not None and self.seeds != [0]:
            raise ValueError(f"trace {self.label!r}: seeds apply to workloads, not real traces")
        return self

    @property
    def synthetic(self) -> bool:
        return self.workload is not None


class TtftSpec(_Strict):
    """The one load at which every policy's simulated TTFT is reported: one simulated replica
    at ``capacity``, each trace's arrivals stretched or compressed by one factor so that
    serving the whole trace back to back (every arrival at once) with the baseline policy takes
    ``load`` x the scaled arrival span (``load`` 0.8: the baseline's engine would be 80% busy).
    A trace's own arrival rate is kept only in its shape: real traces and workloads come at
    rates no single simulated GPU matches (Mooncake's is many times one A40's)."""

    capacity: str = "10%"
    load: float = Field(default=0.8, gt=0, le=4)
    latency: LatencySpec = Field(default_factory=LatencySpec)
    batch: BatchSpec = Field(default_factory=BatchSpec)


class TuningSpec(_Strict):
    """The same tuning budget for every policy: at most ``budget`` parameter settings each (the
    default counts as one), scored by mean block hit rate over ``traces`` x ``capacities``."""

    budget: int = Field(default=4, ge=1, le=MAX_BUDGET)
    traces: list[TraceEntry] = Field(default_factory=list, max_length=MAX_TRACES)
    capacities: list[str] = Field(default_factory=lambda: ["5%", "10%"], max_length=MAX_CAPACITIES)
    #: policy -> settings other than its default (each a parameter mapping)
    grids: dict[str, list[dict[str, Any]]] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _within_budget(self) -> TuningSpec:
        for policy, settings in self.grids.items():
            if len(settings) + 1 > self.budget:
                raise ValueError(
                    f"tuning.grids.{policy}: {len(settings)} settings + the default exceed the "
                    f"budget of {self.budget}"
                )
            for params in settings:  # a bad name fails here, not mid-sweep
                PolicySpec(name=policy, params=params)
        return self


class LeaderboardConfig(_Strict):
    id: str = "policy_leaderboard"
    title: str = "Policy leaderboard"
    baseline: str = "lru"
    bound: str = "belady"
    #: the online policies ranked ("all": every registered one except ``exclude``)
    policies: list[str] | str = "all"
    exclude: list[str] = Field(default_factory=list)
    capacities: list[str] = Field(min_length=1, max_length=MAX_CAPACITIES)
    #: a trace x capacity whose Belady beats LRU by less than this has no gap to close (blank)
    min_gap_pts: float = Field(default=1.0, ge=0)
    traces: list[TraceEntry] = Field(min_length=1, max_length=MAX_TRACES)
    ttft: TtftSpec = Field(default_factory=TtftSpec)
    tuning: TuningSpec = Field(default_factory=TuningSpec)

    @model_validator(mode="after")
    def _consistent(self) -> LeaderboardConfig:
        from skv.policies.registry import OFFLINE, POLICIES

        names = self.policy_names
        for name in [*names, self.baseline, self.bound, *self.exclude, *self.tuning.grids]:
            if name not in POLICIES:
                raise ValueError(f"unknown policy {name!r}; known: {', '.join(POLICIES)}")
        if self.bound not in OFFLINE:
            raise ValueError(f"bound {self.bound!r} is not an offline policy")
        labels = [t.label for t in self.traces]
        if len(set(labels)) != len(labels):
            raise ValueError(f"trace labels repeat: {labels}")
        for t in self.tuning.traces:
            if not t.synthetic:
                raise ValueError(f"tuning trace {t.label!r}: tuning uses synthetic workloads only")
            for e in self.traces:
                same = e.synthetic and e.workload.name == t.workload.name  # type: ignore[union-attr]
                if same and set(e.seeds) & set(t.seeds):
                    shared = sorted(set(e.seeds) & set(t.seeds))
                    raise ValueError(
                        f"tuning trace {t.label!r} shares seeds {shared} with evaluation trace "
                        f"{e.label!r}: tune on data the ranking never sees"
                    )
        return self

    @property
    def policy_names(self) -> list[str]:
        """The ranked online policies, in registry order (baseline included)."""
        from skv.policies.registry import OFFLINE, POLICIES

        if self.policies == "all":
            chosen = [p for p in POLICIES if p not in OFFLINE]
        elif isinstance(self.policies, str):
            raise ValueError("policies: a list of names or 'all'")
        else:
            chosen = list(self.policies)
        out = [p for p in chosen if p not in self.exclude]
        if self.baseline not in out:
            out.insert(0, self.baseline)
        return out


def load_config(path: str | Path, *, quick: bool = False) -> LeaderboardConfig:
    """The config at ``path`` with its ``quick:`` overrides applied when ``quick``: a key replaces
    the full run's value, except a mapping over a mapping (``tuning``, ``ttft``), whose keys
    replace the full run's one by one (so quick tuning can shrink the traces, keep the grids)."""
    data = read_with_quick(path, "leaderboard config", quick=quick)
    try:
        return LeaderboardConfig.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(f"{path}: {_flatten(exc)}") from None
