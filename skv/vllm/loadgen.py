"""Open-loop load against an in-process vLLM engine, timed by the engine itself (engine venv).

Runs in the ENGINE venv and imports only the standard library and vLLM (as
:mod:`skv.vllm.tiny_model`); :class:`skv.vllm.engine_load.EngineLoad` starts it and talks to it.
It builds vLLM's ``AsyncLLM`` (the object vLLM's OpenAI server wraps; its engine core runs in a
child process) once, then serves commands, one JSON object per line on stdin, each answered by
one JSON line on the reply stream (the process's original stdout; everything vLLM prints goes
to stderr):

- ``{"cmd": "start", "engine": {...AsyncEngineArgs...}}`` -> ``{"ok": true, "vllm": version,
  "ready_s": s}``;
- ``{"cmd": "stage", "name": N, "requests": [{"id", "prompt_token_ids", "max_tokens",
  "arrival_s", "extra_args"?}], "reset_cache": true}`` (``extra_args`` go to
  ``SamplingParams.extra_args``, as an OpenAI request's ``vllm_xargs`` do) -> ``{"ok": true,
  "requests": [...], "steps": [...]}``;
  with ``"sequential_gap_s": G`` the requests go one at a time instead, each ``G`` seconds after
  the previous one finished (``arrival_s`` ignored): isolated requests for a profiling run;
- ``{"cmd": "quit"}`` -> ``{"ok": true}``, and the engine shuts down.

A stage sends its requests open loop at ``arrival_s`` (seconds from the stage's start) from the
frontend's own asyncio loop: no HTTP server and no HTTP client, so the 36-108 ms of client and
HTTP time measured on top of vLLM's own TTFT on a shared 2-core machine are not in these
numbers. The prefix cache is reset before a stage unless ``reset_cache`` is false, so each stage
starts cold, as a fresh simulation does. Per request (times in seconds from the stage's start):

- ``scheduled`` (when it was meant to go), ``sent`` (when it was handed to vLLM), ``arrival``
  (vLLM's own ``arrival_time``);
- the engine core's timestamps (vLLM's ``RequestStateStats``, monotonic, shifted to the same
  origin): ``queued``, ``scheduled_engine``, ``first_token``, ``last_token``;
- ``token_times``: when each output token reached the frontend (``RequestOutputKind.DELTA``);
- ``ttft_vllm``: vLLM's own first-token latency (frontend arrival to the output processing of
  the first token: what its ``time_to_first_token_seconds`` histogram records);
- ``prompt_tokens``, ``output_tokens``, ``cached_tokens``, ``preemptions``, ``error``.

Per engine step (``enable_logging_iteration_details``, read by a stat logger): when the frontend
saw it (``t``), the context (prefill) requests and tokens, the generation requests and tokens,
the step's model time (``model_ms``), and the running and waiting counts after it.

``--cpus LIST`` pins this process (the frontend) to those CPUs before vLLM starts; the engine
core's compute threads go where ``VLLM_CPU_OMP_THREADS_BIND`` says, so the two do not share a
core.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import sys
import time
import traceback
from typing import Any


def _stat_logger(sink: dict[str, Any]):
    """A vLLM stat logger class that appends every real step's details to ``sink["steps"]``
    while ``sink["on"]`` is true (``t`` is the frontend's wall clock; the caller rebases it)."""
    from vllm.v1.metrics.loggers import StatLoggerBase

    class StepLogger(StatLoggerBase):
        def __init__(self, vllm_config, engine_index: int = 0) -> None:
            pass

        def record(self, scheduler_stats, iteration_stats, mm_cache_stats=None, engine_idx=0):
            details = getattr(scheduler_stats, "iteration_details", None)
            if not sink["on"] or details is None or details.is_dummy:
                return
            sink["steps"].append(
                {
                    "t": time.time(),
                    "ctx_requests": details.num_ctx_requests,
                    "ctx_tokens": details.num_ctx_tokens,
                    "gen_requests": details.num_generation_requests,
                    "gen_tokens": details.num_generation_tokens,
                    "model_ms": details.elapsed_ms,
                    "running": scheduler_stats.num_running_reqs,
                    "waiting": scheduler_stats.num_waiting_reqs,
                }
            )

        def log_engine_initialized(self) -> None:
            pass

    return StepLogger


async def _one(
    engine, req: dict[str, Any], t0: float, mono0: float, at: float | None = None
) -> dict[str, Any]:
    """Send one request at ``at`` (default its ``arrival_s``), seconds after ``t0``, and record
    what it measured (see the module doc)."""
    from vllm import SamplingParams
    from vllm.sampling_params import RequestOutputKind

    at = float(req["arrival_s"]) if at is None else at
    delay = t0 + at - time.time()
    if delay > 0:
        await asyncio.sleep(delay)
    params = SamplingParams(
        max_tokens=int(req["max_tokens"]),
        ignore_eos=True,
        temperature=0.0,
        output_kind=RequestOutputKind.DELTA,
        extra_args=req.get("extra_args"),
    )
    row: dict[str, Any] = {
        "id": req["id"],
        "scheduled": at,
        "sent": time.time() - t0,
        "prompt_tokens": len(req["prompt_token_ids"]),
        "max_tokens": int(req["max_tokens"]),
        "error": None,
    }
    token_times: list[float] = []
    last = None
    try:
        async for o in engine.generate(
            {"prompt_token_ids": list(req["prompt_token_ids"])}, params, str(req["id"])
        ):
            now = time.time() - t0
            token_times.extend([now] * sum(len(c.token_ids) for c in o.outputs))
            last = o
    except Exception as exc:  # recorded on the row, never raised: one bad request is data
        row["error"] = f"{type(exc).__name__}: {exc}"
    row["token_times"] = token_times
    row["output_tokens"] = len(token_times)
    row["cached_tokens"] = getattr(last, "num_cached_tokens", None)
    m = getattr(last, "metrics", None)
    if m is not None:

        def rel(ts: float) -> float | None:
            return ts - mono0 if ts else None

        row.update(
            arrival=m.arrival_time - t0,
            queued=rel(m.queued_ts),
            scheduled_engine=rel(m.scheduled_ts),
            first_token=rel(m.first_token_ts),
            last_token=rel(m.last_token_ts),
            ttft_vllm=m.first_token_latency,
            preemptions=m.num_preemptions,
        )
    return row


class Session:
    """One engine and the commands it serves."""

    def __init__(self) -> None:
        self.engine = None
        self.sink: dict[str, Any] = {"on": False, "steps": []}

    async def start(self, engine_args: dict[str, Any]) -> dict[str, Any]:
        import vllm
        from vllm.engine.arg_utils import AsyncEngineArgs
        from vllm.v1.engine.async_llm import AsyncLLM

        t = time.time()
        logger = _stat_logger(self.sink)
        args = AsyncEngineArgs(
            **{
                "enforce_eager": True,
                "enable_prefix_caching": True,
                "enable_logging_iteration_details": True,
                "disable_log_stats": False,
                **engine_args,
            }
        )
        self.engine = AsyncLLM.from_engine_args(args, stat_loggers=[logger])
        return {"ok": True, "vllm": vllm.__version__, "ready_s": time.time() - t}

    async def stage(self, cmd: dict[str, Any]) -> dict[str, Any]:
        engine = self.engine
        if engine is None:
            return {"ok": False, "error": "stage before start"}
        if cmd.get("reset_cache", True):
            await engine.reset_prefix_cache()
        self.sink["steps"] = []
        self.sink["on"] = True
        t0 = time.time() + 0.2  # every task reaches its sleep before the first arrival
        mono0 = time.monotonic() + (t0 - time.time())
        gap = cmd.get("sequential_gap_s")
        try:
            if gap is None:
                rows = await asyncio.gather(*(_one(engine, r, t0, mono0) for r in cmd["requests"]))
            else:
                rows = []
                for r in cmd["requests"]:
                    at = max(0.0, time.time() - t0) + float(gap)
                    rows.append(await _one(engine, r, t0, mono0, at))
        finally:
            self.sink["on"] = False
        steps = self.sink["steps"]
        for s in steps:
            s["t"] -= t0
        return {"ok": True, "name": cmd.get("name"), "requests": list(rows), "steps": steps}

    def close(self) -> None:
        if self.engine is not None:
            self.engine.shutdown()
            self.engine = None


async def _serve(reply) -> None:
    session = Session()
    loop = asyncio.get_running_loop()
    try:
        while True:
            line = await loop.run_in_executor(None, sys.stdin.readline)
            if not line:
                break
            cmd: Any = {}
            try:
                cmd = json.loads(line)
                if not isinstance(cmd, dict):
                    raise ValueError("a command is a JSON object")
                kind = cmd.get("cmd")
                if kind == "start":
                    out = await session.start(cmd["engine"])
                elif kind == "stage":
                    out = await session.stage(cmd)
                elif kind == "quit":
                    out = {"ok": True}
                else:
                    out = {"ok": False, "error": f"unknown command {kind!r}"}
            except Exception as exc:
                traceback.print_exc()
                out = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
            out["seq"] = cmd.get("seq") if isinstance(cmd, dict) else None
            reply.write(json.dumps(out) + "\n")
            reply.flush()
            if isinstance(cmd, dict) and cmd.get("cmd") == "quit":
                break
    finally:
        session.close()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--cpus", default="", help="CPUs for this process, e.g. 0,1 (default: all)")
    a = ap.parse_args(argv)
    if a.cpus:
        os.sched_setaffinity(0, {int(c) for c in a.cpus.split(",")})
    # replies go to the original stdout; everything else (vLLM's logs, prints) to stderr
    reply = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)

    def stop(signum, frame):  # SIGTERM: unwind, so the engine core is shut down, not orphaned
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, stop)
    asyncio.run(_serve(reply))
    return 0


if __name__ == "__main__":
    sys.exit(main())
