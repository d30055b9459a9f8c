"""What skv's vLLM eviction plugin costs: per pool call, and end to end on a served engine.

1. Pool level (no server): ``python -m skv.experiments.vllm_eviction.plugin_check`` in the
   engine venv drives vLLM's own ``BlockPool`` and the plugin's subclass through the same
   400-request typed trace; it reports microseconds per request for the whole pool work
   (stock vs plugin ``lru``) and the time spent in the plugin's hooks for each policy.
2. Served (needs the engine venv; engines start one at a time): the vllm_eviction study's
   trace (``experiments/vllm_eviction/vllm_eviction.yaml``) sent sequentially to ``stock`` and
   to the plugin with each ``--policies`` entry, ``--repeats`` times in alternating order
   (stock, lru, ..., stock, lru, ...) so drift on the machine hits every variant alike. Per
   variant: median TTFT and E2E over all repeats' requests, the mean replay wall time, and the
   plugin's own time per request (its side file's ``hook_s``) as a share of serving time.

The tiny model makes every step short, so shares measured here are upper bounds for a real model.

Run: ``python benchmarks/vllm_plugin_overhead.py [--repeats 2] [--policies lru saecache]
[--requests 160] [--skip-served] [--json OUT]``.
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import subprocess
import tempfile
from pathlib import Path

log = logging.getLogger("bench")


def pool_level(requests: int) -> dict:
    from skv.vllm.server import checkout_root, engine_env, find_engine_python, setup_hint

    py = find_engine_python()
    if py is None:
        raise SystemExit(f"no engine venv: {setup_hint()}")
    env = {**engine_env(), "PYTHONPATH": str(checkout_root())}
    p = subprocess.run(
        [str(py), "-m", "skv.experiments.vllm_eviction.plugin_check", "--requests", str(requests)],
        capture_output=True, text=True, env=env, cwd=checkout_root(), timeout=600,
    )  # fmt: skip
    if p.returncode not in (0, 1):
        raise SystemExit(p.stderr[-3000:])
    return json.loads(p.stdout)


def served(policies: list[str], repeats: int, requests: int | None) -> dict:
    from skv.experiments.engine import synthetic_trace
    from skv.experiments.vllm_eviction import study

    cfg = study.load_config("experiments/vllm_eviction/vllm_eviction.yaml")
    if requests:
        cfg["num_requests"] = requests
    trace = synthetic_trace(cfg)
    runs: dict[str, list[dict]] = {}
    with tempfile.TemporaryDirectory(prefix="skv-plugin-bench-") as tmp:
        for rep in range(repeats):
            for variant in [study.STOCK, *policies]:
                log.info("repeat %d: %s", rep + 1, variant)
                m = study.measure(cfg, trace, Path(tmp), variant)
                ok = [r for r in m["results"] if r.ok]
                states = [x for x in m["plugin_log"] if x.get("event") == "state"]
                last = states[-1] if states else {}
                runs.setdefault(variant, []).append({
                    "ttft_ms": [1e3 * r.ttft for r in ok],
                    "e2e_ms": [1e3 * r.e2e for r in ok],
                    "replay_s": m["replay_s"],
                    "hook_s_per_request": (
                        last["hook_s"] / last["requests"] if last.get("requests") else None
                    ),
                })  # fmt: skip
    out = {}
    for variant, rs in runs.items():
        ttft = [x for r in rs for x in r["ttft_ms"]]
        e2e = [x for r in rs for x in r["e2e_ms"]]
        hooks = [r["hook_s_per_request"] for r in rs if r["hook_s_per_request"] is not None]
        hook_ms = 1e3 * statistics.fmean(hooks) if hooks else None
        out[variant] = {
            "ttft_median_ms": statistics.median(ttft),
            "e2e_median_ms": statistics.median(e2e),
            "replay_s_mean": statistics.fmean(r["replay_s"] for r in rs),
            "replay_s_each": [round(r["replay_s"], 3) for r in rs],
            "plugin_ms_per_request": hook_ms,
            "plugin_share_of_e2e": hook_ms / statistics.median(e2e) if hook_ms else None,
        }
    base = out[study.STOCK]["replay_s_mean"]
    for v in out.values():
        v["replay_vs_stock"] = v["replay_s_mean"] / base
    return {"requests": cfg["num_requests"], "repeats": repeats, "variants": out}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--policies", nargs="+", default=["lru", "saecache"])
    ap.add_argument("--requests", type=int, default=None, help="default: the study's config")
    ap.add_argument("--pool-requests", type=int, default=400)
    ap.add_argument("--skip-served", action="store_true")
    ap.add_argument("--json", default=None, help="also write the results here")
    a = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)
    res = {"pool": pool_level(a.pool_requests)}
    s = res["pool"]["stock_vs_lru"]
    print(f"pool level ({res['pool']['requests']} requests, {s['evictions']} evictions):")
    print(f"  stock vLLM BlockPool      {s['stock_us_per_request']:8.1f} us/request")
    print(f"  plugin lru (whole pool)   {s['plugin_us_per_request']:8.1f} us/request")
    for name, p in res["pool"]["policies"].items():
        print(f"  plugin hooks, {name:18} {p['hook_us_per_request']:6.1f} us/request")
    if not a.skip_served:
        res["served"] = served(a.policies, a.repeats, a.requests)
        print(f"served ({res['served']['requests']} requests x {a.repeats} repeats, sequential):")
        for name, v in res["served"]["variants"].items():
            share = v["plugin_share_of_e2e"]
            print(
                f"  {name:18} TTFT p50 {v['ttft_median_ms']:6.2f} ms  E2E p50 "
                f"{v['e2e_median_ms']:6.2f} ms  replay {v['replay_s_mean']:6.2f} s "
                f"({v['replay_vs_stock']:.3f}x stock)  plugin "
                + (f"{v['plugin_ms_per_request']:.3f} ms/request = {100 * share:.2f}% of E2E"
                   if share is not None else "-")
            )  # fmt: skip
    if a.json:
        Path(a.json).write_text(json.dumps(res, indent=1) + "\n")


if __name__ == "__main__":
    main()
