"""Check the eviction plugin's block pool without starting a server (runs in the ENGINE venv).

    .venv-vllm/bin/python -m skv.experiments.vllm_eviction.plugin_check
        [--policies lru,saecache] [--requests N] [--seed S] [--blocks N] [--block-size B]
        [--output-tokens T]

Drives vLLM's own ``BlockPool`` the way its scheduler does for one request at a time (look the
prompt's block hashes up, ``touch`` the hits, ``get_new_blocks``, ``cache_full_blocks``, decode
block by block, ``free_blocks`` tail first) over a seeded typed trace
(:func:`skv.experiments.engine.synthetic_trace`, ``types: agent``) and prints JSON:

- ``stock_vs_lru``: stock vLLM against the plugin's pool with ``lru``: per-request hits and the
  final set of cached hashes must be identical;
- ``policies``: for each policy, the plugin's per-request hits against skv's simulation of the
  same trace (:func:`skv.experiments.engine.simulate_hits` with ``eviction=``); they must be
  identical;
- the time the plugin's hooks took per request, next to the whole pool call.

Exit status 0 when everything agrees, 1 otherwise. The real-engine tests
(tests/test_vllm_eviction.py) then check the same through HTTP on a served model.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from types import SimpleNamespace
from typing import Any

from skv.blocks import request_blocks
from skv.experiments.engine import (
    OUTPUT_ID_BASE,
    simulate_hits,
    synthetic_trace,
    with_output_blocks,
)
from skv.model import Request
from skv.vllm.eviction_plugin import make_pool_class, semantic_xargs


def online_policies() -> tuple[str, ...]:
    """Every policy that can order vLLM's free queue (all but ``vllm`` and offline ones)."""
    from skv.policies.registry import OFFLINE, POLICIES

    return tuple(p for p in POLICIES if p != "vllm" and p not in OFFLINE)


def trace_config(requests: int, seed: int, blocks: int, block_size: int, output: int) -> dict:
    return {
        "seed": seed,
        "num_requests": requests,
        "num_docs": 24,
        "doc_blocks": [2, 8],
        "zipf_s": 1.1,
        "own_blocks": [1, 4],
        "block_size": block_size,
        "num_gpu_blocks": blocks,
        "max_output_tokens": output,
        "types": "agent",
    }


def _hash_bytes(key: int) -> bytes:
    return key.to_bytes(8, "little")


def drive(pool: Any, trace: list[Request], block_size: int, plugin: bool) -> list[int]:
    """Per-request hit tokens of ``pool`` over ``trace``, one request at a time, as vLLM's
    scheduler calls the pool (see the module doc)."""
    bs = block_size
    hits_out: list[int] = []
    next_id = OUTPUT_ID_BASE
    for r in trace:
        rb = request_blocks(r, bs, "prefix")
        n_full = r.prompt_tokens // bs
        req = SimpleNamespace(
            request_id=r.request_id,
            block_hashes=[_hash_bytes(k) for k in rb.keys[:n_full]],
            num_prompt_tokens=r.prompt_tokens,
            sampling_params=SimpleNamespace(extra_args=semantic_xargs(r)),
        )
        if plugin:
            pool.begin(req)
        hit = []
        for h in req.block_hashes[: max(0, r.prompt_tokens - 1) // bs]:
            found = pool.get_cached_block(h, [0])
            if found is None:
                break
            hit.append(found[0])
        pool.touch(hit)
        held = hit + pool.get_new_blocks(len(rb.keys) - len(hit))
        pool.cache_full_blocks(req, held, len(hit), n_full, bs, 0)
        ext = with_output_blocks(r, bs, next_id)
        if ext is not None:
            next_id += len(ext.hash_ids)
            erb = request_blocks(ext, bs, "prefix")
            req.block_hashes = [
                _hash_bytes(k) for k, t in zip(erb.keys, erb.tokens, strict=True) if t == bs
            ]
            for i in range(n_full, len(erb.keys)):
                if i >= len(held):
                    held += pool.get_new_blocks(1)
                if erb.tokens[i] == bs:
                    pool.cache_full_blocks(req, held, i, i + 1, bs, 0)
        pool.free_blocks(reversed(held))
        hits_out.append(len(hit) * bs)
    return hits_out


def _pool(policy: str | None, blocks: int, bs: int) -> Any:
    if policy is None:
        from vllm.v1.core.block_pool import BlockPool

        return BlockPool(blocks, True, bs)
    settings = {"policy": policy, "params": {}, "log": None, "log_every": 16, "clock": "client"}
    cls = make_pool_class(settings)
    return cls(blocks, True, bs)


def check(policies: list[str], requests: int, seed: int, blocks: int, bs: int, out: int) -> dict:
    trace = synthetic_trace(trace_config(requests, seed, blocks, bs, out))
    stock = _pool(None, blocks, bs)
    t0 = time.perf_counter()
    stock_hits = drive(stock, trace, bs, plugin=False)
    stock_s = time.perf_counter() - t0
    lru = _pool("lru", blocks, bs)
    t0 = time.perf_counter()
    lru_hits = drive(lru, trace, bs, plugin=True)
    lru_s = time.perf_counter() - t0
    result: dict[str, Any] = {
        "requests": len(trace),
        "num_gpu_blocks": blocks,
        "block_size": bs,
        "stock_vs_lru": {
            "hits_equal": stock_hits == lru_hits,
            "cached_equal": set(stock.cached_block_hash_to_block._cache)
            == set(lru.cached_block_hash_to_block._cache),
            "hit_tokens": sum(stock_hits),
            "evictions": lru.skv_order.evictions,
            "stock_us_per_request": 1e6 * stock_s / len(trace),
            "plugin_us_per_request": 1e6 * lru_s / len(trace),
            "hook_us_per_request": 1e6 * lru.plugin_s / len(trace),
        },
        "policies": {},
    }
    for name in policies:
        pool = _pool(name, blocks, bs)
        got = drive(pool, trace, bs, plugin=True)
        sim = simulate_hits(trace, bs, blocks, eviction=name)
        result["policies"][name] = {
            "hits_equal": got == sim,
            "requests_disagreeing": sum(1 for a, b in zip(got, sim, strict=True) if a != b),
            "plugin_hit_tokens": sum(got),
            "simulated_hit_tokens": sum(sim),
            "evictions": pool.skv_order.evictions,
            "hook_us_per_request": 1e6 * pool.plugin_s / len(trace),
        }
    ok = result["stock_vs_lru"]["hits_equal"] and result["stock_vs_lru"]["cached_equal"]
    result["ok"] = ok and all(p["hits_equal"] for p in result["policies"].values())
    return result


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog=f"python -m {__spec__.name}", description=__doc__)
    ap.add_argument("--policies", default=",".join(online_policies()))
    ap.add_argument("--requests", type=int, default=400)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--blocks", type=int, default=64)
    ap.add_argument("--block-size", type=int, default=32)
    ap.add_argument("--output-tokens", type=int, default=40)
    a = ap.parse_args(argv)
    names = [p for p in a.policies.split(",") if p]
    res = check(names, a.requests, a.seed, a.blocks, a.block_size, a.output_tokens)
    json.dump(res, sys.stdout, indent=1, sort_keys=True)
    sys.stdout.write("\n")
    return 0 if res["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
