"""The simulated cluster of the CacheRoute study, one load point on it, and the QPS-at-SLO search.

Cluster (:class:`ClusterSpec`, defaults = the paper's deployment): 15 replicas, each
Llama-3.3-70B fp8 on 4 H100s (tensor parallel 4), priced by the roofline latency model
(:mod:`skv.latency.roofline`); open-loop arrivals (the workload's times, whatever the cluster
does). KV capacity per replica = the memory left after the weights:
``tp * memory_gb * gpu_memory_utilization - weight bytes``, divided by the model's KV bytes per
token (163,840 B for this model) and by the block size: 4 x 80 GB x 0.9 - 70.6 GB = 217.4 GB,
1.33M tokens, 2,591 blocks of 512 tokens. ``gpu_memory_utilization`` 0.9 is vLLM's default;
activation and CUDA-graph memory are not subtracted (a few GB at this batch size: an
assumption that errs towards a larger cache for every router alike). Eviction in each replica:
``vllm`` (vLLM's V1 block pool, exact).

One point (:func:`simulate_point`): a workload at one offered rate and seed through the cluster
with one router. Requests arriving in the first ``warmup_s`` seconds warm the caches, queues
and router state and are not measured; p99 TTFT, the served hit rate (cached prompt tokens /
prompt tokens), mean TTFT and throughput are over the rest. Warm-up is in time, not in
requests, because router state converges in time: ``cacheroute`` plans every 10 s from an
EWMA that starts at zero, and its first plans (rates still ramping up) can overload a replica
for tens of seconds (measured: a 12 s queue on one replica at 160 req/s, gone after 60 s);
60 s is six periods, when the EWMA's start-up weight is 1/64. All latencies are SIMULATED.

The search (:func:`skv.experiments.slo_search.max_qps`): the highest offered rate whose
measured p99 TTFT (or the config's ``slo_percentile``) is at most the SLO, by bisection on the
rate. Common random numbers (the same seed at every rate is the same requests, compressed in
time: :mod:`skv.experiments.cacheroute.workloads`) make p99 TTFT nearly monotone in the rate.
A finite run at a rate just above capacity queues only part of its backlog, so QPS is slightly
overestimated near the knee, the same way for every router.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from skv.blocks import retimed
from skv.latency import make_latency_model
from skv.latency.gpus import get_gpu
from skv.model import Request
from skv.runtime import no_cyclic_gc
from skv.sim import CompiledRun, SimConfig, compile_run, simulate
from skv.sizing import get_model

log = logging.getLogger(__name__)


class ClusterSpec(BaseModel):
    """The deployment every router is compared on (see the module docstring)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    replicas: int = Field(default=15, ge=1, le=1024)
    model: str = "llama-3.3-70b-fp8"
    gpu: str = "H100"
    tp: int = Field(default=4, ge=1, le=64)
    gpu_memory_utilization: float = Field(default=0.9, gt=0, le=1)
    mfu: float = Field(default=0.5, gt=0, le=1)
    mbu: float = Field(default=0.8, gt=0, le=1)
    policy: str = "vllm"
    max_batch_tokens: int = Field(default=8192, ge=1)
    max_running: int = Field(default=256, ge=1)
    capacity_blocks: int | None = Field(default=None, ge=1, description="None: from memory")

    def latency(self) -> Any:
        return make_latency_model(
            "roofline", model=self.model, gpu=self.gpu, tp=self.tp, mfu=self.mfu, mbu=self.mbu
        )

    def kv_capacity_blocks(self, block_tokens: int) -> int:
        """Blocks of ``block_tokens`` tokens that fit in one replica's KV memory."""
        if self.capacity_blocks is not None:
            return self.capacity_blocks
        preset, gpu = get_model(self.model), get_gpu(self.gpu)
        weights = preset.num_params * preset.weight_dtype_bytes
        budget = self.tp * gpu.memory_gb * 1e9 * self.gpu_memory_utilization - weights
        if budget <= 0:
            raise ValueError(
                f"cluster: {self.model} weights ({weights / 1e9:.1f} GB) leave no KV memory on "
                f"{self.tp} x {gpu.name} at gpu_memory_utilization {self.gpu_memory_utilization}"
            )
        return max(1, int(budget / preset.kv_bytes_per_token // block_tokens))


def point_config(
    requests: Sequence[Any],
    cluster: ClusterSpec,
    router: str,
    router_params: dict[str, Any],
    router_view: str = "exact",
) -> SimConfig:
    """The simulator settings of one point: the cluster's caches and batches, the router, and
    the requests' own block size (hash-id blocks)."""
    block_tokens = requests[0].hash_block_size or 16
    return SimConfig(
        policy=cluster.policy,
        capacity_blocks=cluster.kv_capacity_blocks(block_tokens),
        block_size=block_tokens,
        replicas=cluster.replicas,
        router=router,
        router_params=dict(router_params),
        max_batch_tokens=cluster.max_batch_tokens,
        max_running=cluster.max_running,
        sample_every_s=1e9,  # no memory series needed
        policy_metrics_every=0,
        router_view=router_view,
    )


def compile_point(requests: Sequence[Any]) -> CompiledRun:
    """``requests`` compiled as :func:`simulate_point` serves them on any cluster with any
    router (a compile depends on the block size only): one compile serves every router."""
    return compile_run(requests, point_config(requests, ClusterSpec(), "round_robin", {}))


def retime_point(run: CompiledRun, arrivals: Sequence[float]) -> CompiledRun:
    """The first ``len(arrivals)`` requests of ``run`` (a :func:`compile_point` run) at new
    arrival times: what :func:`compile_point` gives for those requests with those times, without
    generating or keying them again. Exact because the times never decrease (the compile's sort by
    (time, index) keeps the run's order), a hash-id request's blocks depend only on its ids and
    the requests before it (``compile_trace`` keys in order) and hash-id requests cache no
    answers. The new requests and blocks share the run's lists, which nothing mutates; each
    request is built from its fields in :class:`~skv.model.Request`'s order (what
    ``dataclasses.replace(r, arrival_s=t)`` builds, with ``extra`` copied; a test checks) and
    the blocks by :func:`skv.blocks.retimed`, both without per-field keyword passing."""
    n = len(arrivals)
    if n > len(run.requests):
        raise ValueError(f"retime_point: {n} times for a run of {len(run.requests)} requests")
    times = np.asarray(arrivals, dtype=np.float64)
    if n > 1 and bool((times[1:] < times[:-1]).any()):
        raise ValueError("retime_point: arrival times must never decrease")
    if run.answers and any(ext is not None for ext, _ in run.answers[:n]):
        raise ValueError("retime_point: requests with answer blocks (not hash-id requests)")
    with no_cyclic_gc():  # plain data, as compile_run builds it
        requests = tuple(
            Request(
                r.request_id, t, r.segments, r.output_tokens, r.session_id, r.tenant_id,
                r.turn, r.parent_id, r.templated, r.hash_ids, r.hash_block_size,
                r.observed_ttft_ms, r.observed_cached_tokens, r.output_hash, dict(r.extra),
            )
            for r, t in zip(run.requests[:n], arrivals, strict=True)
        )  # fmt: skip
        trace = tuple(retimed(run.trace, arrivals))
    return CompiledRun(run.key, requests, trace, run.answers[:n])


def simulate_point(
    requests: Sequence[Any] | CompiledRun,
    cluster: ClusterSpec,
    router: str,
    router_params: dict[str, Any],
    *,
    warmup_s: float = 60.0,
    router_view: str = "exact",
    slo_percentile: float = 99.0,
) -> dict[str, float]:
    """Serve ``requests`` (or their :func:`compile_point`) on the cluster with ``router``;
    metrics over the requests arriving at or after ``warmup_s`` (seconds from the first
    arrival). ``ttft_ms_slo`` is the TTFT percentile the SLO is on (``slo_percentile``,
    default the p99)."""
    if not warmup_s >= 0:
        raise ValueError(f"warmup_s must be >= 0, got {warmup_s}")
    reqs = requests.requests if isinstance(requests, CompiledRun) else requests
    config = point_config(reqs, cluster, router, router_params, router_view)
    col = simulate(requests, config, cluster.latency(), progress=False, columns=True).columns
    arrival = col["arrival_s"]
    kept = arrival - arrival[0] >= warmup_s
    n = int(kept.sum())
    if not n:
        raise ValueError(f"no request arrives after the {warmup_s} s warm-up")
    ttft = col["ttft_ms"][kept]
    prompt = int(col["prompt_tokens"][kept].sum())
    cached = int(col["cached_tokens"][kept].sum())
    start = float(arrival[kept].min())
    end = float((arrival + col["e2e_ms"] / 1e3)[kept].max())
    per_replica = np.bincount(col["replica"][kept], minlength=cluster.replicas)
    return {
        "ttft_ms_slo": float(np.percentile(ttft, slo_percentile)),
        "ttft_ms_p99": float(np.percentile(ttft, 99)),
        "ttft_ms_p50": float(np.percentile(ttft, 50)),
        "ttft_ms_mean": float(ttft.mean()),
        "hit_rate": cached / prompt if prompt else 0.0,
        "throughput_rps": n / max(end - start, 1e-9),
        "max_replica_share": float(per_replica.max() / max(1, per_replica.sum())),
        "measured_requests": n,
    }
