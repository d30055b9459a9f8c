"""An "engine" made of skv's own simulator, answering as :class:`skv.vllm.engine_load.EngineLoad`.

The fidelity-under-load study's check on itself: driven against an engine whose cost model is
known (:class:`SimulatedEngine`), the study must recover that model from its profiling run and
find (almost) no error between "engine" and simulator at every stage, and the same max QPS at
the SLO. A bug in the study's own code (a statistic taken on the wrong requests, arrivals shifted,
the SLO searched on the wrong percentile, the calibration reading evaluation stages) shows up
there, with no engine installed.

Each stage is simulated as one trace from a cold cache (the study resets the engine's prefix
cache before every stage). Requests keep their token ids; a block's key chains the previous
block's key and its tokens, so two prompts share a block exactly when their token prefixes
agree, as in vLLM. The frontend is a constant: the request reaches the engine core
``frontend_in_ms`` after it arrives, and each token reaches the frontend ``frontend_out_ms``
after the step that made it. Decode tokens are spread evenly between the first and the last
(the simulator reports a request's first and last token times, not each one).
"""

from __future__ import annotations

from typing import Any

from skv.latency.base import LatencyModel
from skv.model import Request, Segment, SemanticType
from skv.vllm.engine_load import StageResult
from skv.vllm.eviction_plugin import parse_xargs


def block_keys(tokens: list[int], block_size: int) -> list[int]:
    """Prefix-chained keys of the blocks of ``tokens`` (the last one may be partial)."""
    keys: list[int] = []
    parent = 0
    for start in range(0, len(tokens), block_size):
        parent = hash((parent, tuple(tokens[start : start + block_size])))
        keys.append(parent)
    return keys


class SimulatedEngine:
    """What :func:`skv.experiments.fidelity.load.measure_engine` drives, computed by the
    simulator with ``latency`` and ``engine_args``' knobs (see the module doc); an ``env`` that
    names an eviction policy (``SKV_EVICTION``, as skv's plugin reads it) orders its pool by
    that policy, and requests' ``extra_args`` give their typed segments and session as the
    plugin reads them (:func:`skv.vllm.eviction_plugin.parse_xargs`)."""

    def __init__(
        self,
        engine_args: dict[str, Any],
        latency: LatencyModel,
        *,
        frontend_in_ms: float = 1.5,
        frontend_out_ms: float = 0.5,
        env: dict[str, str] | None = None,
    ) -> None:
        import json

        from skv.sim import SimConfig

        env = env or {}
        policy = env.get("SKV_EVICTION")  # what skv's plugin would run inside the engine
        params = (
            {
                "eviction": policy,
                "eviction_params": json.loads(env.get("SKV_EVICTION_PARAMS", "{}")),
            }
            if policy
            else {}
        )

        self.block_size = int(engine_args["block_size"])
        self.latency = latency
        self.fin = frontend_in_ms / 1000.0
        self.fout = frontend_out_ms / 1000.0
        self.config = SimConfig(
            policy="vllm",
            policy_params=params,
            capacity_blocks=int(engine_args["num_gpu_blocks_override"]),
            block_size=self.block_size,
            max_batch_tokens=int(engine_args["max_num_batched_tokens"]),
            max_running=int(engine_args["max_num_seqs"]),
            sample_every_s=1e9,
            policy_metrics_every=0,
        )
        self.info = {"vllm": "simulated", "ready_s": 0.0}
        self.frontend_cpus: list[int] = []
        self.engine_cpus: list[int] = []
        self.shared_cpu = False
        self.stages: list[str] = []

    def __enter__(self) -> SimulatedEngine:
        return self

    def __exit__(self, *exc: Any) -> None:
        pass

    def run_stage(
        self,
        name: str,
        requests: list[dict[str, Any]],
        *,
        reset_cache: bool = True,
        sequential_gap_s: float | None = None,
    ) -> StageResult:
        from skv.sim import simulate

        if not reset_cache:
            raise NotImplementedError("the simulated engine starts every stage cold")
        self.stages.append(name)
        at = [
            1000.0 * i if sequential_gap_s is not None else float(r["arrival_s"])
            for i, r in enumerate(requests)
        ]
        trace = []
        for r, a in zip(requests, at, strict=True):
            n = len(r["prompt_token_ids"])
            segments, fields = parse_xargs(r.get("extra_args"), n)
            trace.append(
                Request(
                    str(r["id"]),
                    a + self.fin,
                    segments or [Segment(SemanticType.USER_QUERY, n)],
                    output_tokens=int(r["max_tokens"]),
                    hash_ids=block_keys(list(r["prompt_token_ids"]), self.block_size),
                    hash_block_size=self.block_size,
                    session_id=fields.get("session_id"),
                    turn=fields.get("turn"),
                )
            )
        steps: list[dict[str, Any]] = []

        def hook(replica: int, start: float, end: float, it: Any) -> None:
            steps.append(
                {
                    "t": end + self.fout,
                    "ctx_requests": len(it.prefill),
                    "ctx_tokens": it.prefill_tokens,
                    "gen_requests": it.decode_seqs,
                    "gen_tokens": it.decode_seqs,
                    "model_ms": (end - start) * 1000.0,
                }
            )

        res = simulate(trace, self.config, self.latency, progress=False, on_iteration=hook)
        by_id = {r["request_id"]: r for r in res.requests}
        rows = []
        for r, a in zip(requests, at, strict=True):
            s = by_id[str(r["id"])]
            queued = a + self.fin
            first = queued + s["ttft_ms"] / 1000.0
            last = queued + s["e2e_ms"] / 1000.0
            n = int(s["output_tokens"])
            gap = (last - first) / (n - 1) if n > 1 else 0.0
            rows.append(
                {
                    "id": r["id"],
                    "scheduled": a,
                    "sent": a,
                    "arrival": a,
                    "prompt_tokens": len(r["prompt_token_ids"]),
                    "max_tokens": int(r["max_tokens"]),
                    "error": None,
                    # a token reaches its stream just after the step's record (vLLM's order)
                    "token_times": [first + self.fout + 1e-6 + k * gap for k in range(n)],
                    "output_tokens": n,
                    "cached_tokens": s["cached_tokens"],
                    "queued": queued,
                    "scheduled_engine": queued + s["queue_ms"] / 1000.0,
                    "first_token": first,
                    "last_token": last,
                    "ttft_vllm": first + self.fout - a,
                    "preemptions": 0,
                }
            )
        steps.sort(key=lambda x: x["t"])
        return StageResult(name, rows, steps)
