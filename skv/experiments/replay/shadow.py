"""The shadow-replay gate: should a deployment switch its router? Ask the recorded traffic first.

Cache-affinity routing can lose (CacheRoute's counterexamples: one dominant key, skew that
shifts faster than the plan, a burst on a key pinned to few replicas), so a candidate router is
enabled only after a shadow replay: the same recorded requests, at their recorded arrival times
(optionally sped up), through the serving simulator once with the baseline router and once
with the candidate, same replicas, cache, eviction policy and latency model. The numbers are
SIMULATED predictions, not measurements.

Decision (:func:`decide`): enable the candidate iff its predicted p99 TTFT meets the SLO and is
no higher than the baseline's minus ``min_gain_ms`` (default 0: not worse). Otherwise keep the
baseline, with the reason. ``skv shadow`` exits 0 for enable, 3 for keep (for automation).

Any trace skv reads works, including one the telemetry proxy wrote (``skv services proxy``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from skv.latency import LatencyModel
from skv.model import Request

#: exit status of ``skv shadow`` when it recommends keeping the baseline
KEEP_EXIT = 3


@dataclass(frozen=True)
class RouterPrediction:
    """One router's simulated outcome on the replayed traffic."""

    router: str
    ttft_ms_p99: float
    ttft_ms_mean: float
    throughput_rps: float
    token_hit_rate: float

    @classmethod
    def from_summary(cls, router: str, s: dict[str, Any]) -> RouterPrediction:
        return cls(
            router,
            float(s["ttft_ms_p99"]),
            float(s["ttft_ms_mean"]),
            float(s["throughput_rps"]),
            float(s["token_hit_rate"]),
        )


@dataclass(frozen=True)
class Verdict:
    """The gate's answer: ``enable`` (switch to the candidate) or keep the baseline, and why."""

    enable: bool
    reason: str
    margin_ms: float  # baseline p99 TTFT minus candidate p99 TTFT (positive: candidate faster)
    baseline: RouterPrediction
    candidate: RouterPrediction
    slo_p99_ms: float
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def exit_code(self) -> int:
        return 0 if self.enable else KEEP_EXIT


def decide(
    baseline: RouterPrediction,
    candidate: RouterPrediction,
    slo_p99_ms: float,
    *,
    min_gain_ms: float = 0.0,
) -> Verdict:
    """Enable iff the candidate meets the SLO and its p99 TTFT is at most the baseline's minus
    ``min_gain_ms``; a NaN prediction (no requests) never enables."""
    margin = baseline.ttft_ms_p99 - candidate.ttft_ms_p99
    if math.isnan(candidate.ttft_ms_p99) or math.isnan(baseline.ttft_ms_p99):
        enable, reason = False, "no prediction (the replay had no requests)"
    elif candidate.ttft_ms_p99 > slo_p99_ms:
        enable = False
        reason = (
            f"{candidate.router} misses the SLO: p99 TTFT {candidate.ttft_ms_p99:.0f} ms "
            f"> {slo_p99_ms:.0f} ms"
        )
    elif margin < min_gain_ms:
        enable = False
        reason = (
            f"{candidate.router} is not better than {baseline.router}: p99 TTFT "
            f"{candidate.ttft_ms_p99:.0f} ms vs {baseline.ttft_ms_p99:.0f} ms "
            f"(needs a gain of at least {min_gain_ms:g} ms)"
        )
    else:
        enable = True
        reason = (
            f"{candidate.router} meets the SLO ({candidate.ttft_ms_p99:.0f} ms <= "
            f"{slo_p99_ms:.0f} ms) and beats {baseline.router} by {margin:.0f} ms at p99"
        )
    return Verdict(enable, reason, margin, baseline, candidate, slo_p99_ms)


def time_scaled(requests: Sequence[Request], time_scale: float) -> list[Request]:
    """The requests with arrival times divided by ``time_scale`` (2 = twice the rate), sorted."""
    if not time_scale > 0:
        raise ValueError(f"time_scale must be > 0, got {time_scale}")
    from dataclasses import replace

    out = [replace(r, arrival_s=r.arrival_s / time_scale) for r in requests]
    return sorted(out, key=lambda r: r.arrival_s)


def shadow_replay(
    requests: Sequence[Request],
    *,
    candidate: str,
    baseline: str,
    slo_p99_s: float,
    latency: LatencyModel,
    replicas: int,
    capacity_blocks: int,
    policy: str = "lru",
    block_size: int | None = None,
    candidate_params: dict[str, Any] | None = None,
    baseline_params: dict[str, Any] | None = None,
    max_batch_tokens: int = 8192,
    min_gain_ms: float = 0.0,
) -> Verdict:
    """Simulate ``requests`` once per router (everything else equal) and :func:`decide`."""
    from skv.routing.registry import router_class
    from skv.sim import SimConfig, simulate

    if not requests:
        raise ValueError("shadow replay: the trace has no requests")
    if replicas < 2:
        raise ValueError(f"shadow replay compares routers: needs >= 2 replicas, got {replicas}")
    for name in (candidate, baseline):
        router_class(name)  # a clear error for an unknown router before anything runs
    ordered = sorted(requests, key=lambda r: r.arrival_s)
    predictions = []
    for router, params in ((baseline, baseline_params), (candidate, candidate_params)):
        config = SimConfig(
            policy=policy,
            capacity_blocks=capacity_blocks,
            block_size=block_size,
            replicas=replicas,
            router=router,
            router_params=dict(params or {}),
            max_batch_tokens=max_batch_tokens,
        )
        res = simulate(ordered, config, latency, progress=False)
        predictions.append(RouterPrediction.from_summary(router, res.summary))
    verdict = decide(*predictions, slo_p99_s * 1000.0, min_gain_ms=min_gain_ms)
    verdict.meta.update(
        requests=len(ordered),
        replicas=replicas,
        capacity_blocks_per_replica=capacity_blocks,
        policy=policy,
        latency=latency.describe(),
        simulated=f"predictions SIMULATED by the {latency.name} latency model (not measured)",
    )
    return verdict


def format_verdict(v: Verdict) -> str:
    """The gate's report: one line per router, the margin and the recommendation."""
    lines = [
        f"shadow replay of {v.meta.get('requests', '?')} requests on "
        f"{v.meta.get('replicas', '?')} replicas ({v.meta.get('simulated', 'simulated')})",
        f"{'router':<22}{'p99 TTFT ms':>13}{'mean TTFT ms':>14}{'req/s':>9}{'hit rate':>10}",
    ]
    for role, p in (("baseline", v.baseline), ("candidate", v.candidate)):
        lines.append(
            f"{p.router + ' (' + role + ')':<22}{p.ttft_ms_p99:>13.1f}{p.ttft_ms_mean:>14.1f}"
            f"{p.throughput_rps:>9.2f}{p.token_hit_rate:>10.3f}"
        )
    lines.append(
        f"SLO: p99 TTFT <= {v.slo_p99_ms:.0f} ms; margin (baseline - candidate) "
        f"{v.margin_ms:.1f} ms"
    )
    action = f"ENABLE {v.candidate.router}" if v.enable else f"KEEP {v.baseline.router}"
    lines.append(f"recommendation: {action} ({v.reason})")
    return "\n".join(lines)
