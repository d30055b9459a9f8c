"""Hit-rate cost of tenant isolation (vLLM ``cache_salt``, skv's ``salt_by_tenant``).

Cache-only replay (:func:`skv.replay.replay_trace`, prefix keying, the ``lru`` policy) of each
workload twice: shared cache (salt off) and one salt per tenant (salt on). The cost is the token
hit rate off minus on, in points, at the same ABSOLUTE capacity: the capacities are fractions of
the UNSALTED trace's unique blocks, turned into block counts once (isolation replicates shared
prefixes per tenant, so a fraction of the salted trace's own unique blocks would be a bigger
cache). ``inf`` is the infinite-cache ceiling (a block hits if its key was seen before).

Neither workload has tenant ids, so tenants are assigned deterministically: tenant
``t<k>`` with ``k = int(sha256(unit)) mod N``, where the unit is the top-level session for the
Claude Code traces (a subagent stays in its parent's tenant) and the request for RAG (no
sessions). Claude Code files use local hash ids (``hash_id_scope: "local"``), which skv tags per
file, so sessions share no block and isolation by session-aligned tenants cannot cost anything
there: the row is a check that the salt changes nothing within a tenant. Real Claude Code
sessions do share their tool/system prefix, which these traces cannot show.

Run: ``python benchmarks/isolation_cost.py [--traces ../shared/traces/weka_cc]
[--rag-requests 4000] [--tenants 4 16] [--capacities 0.02 0.1]``.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import logging
from collections.abc import Sequence
from pathlib import Path

from skv.blocks import compile_trace
from skv.model import Request
from skv.replay import replay_trace, trace_totals
from skv.traces import load_trace
from skv.workloads import make_workload

log = logging.getLogger("bench")

DEFAULT_CC = Path(__file__).resolve().parent.parent.parent / "shared" / "traces" / "weka_cc"


def tenant_of(unit: str, tenants: int) -> str:
    """A deterministic tenant for ``unit`` (same in every process: sha256, not ``hash``)."""
    return f"t{int(hashlib.sha256(unit.encode()).hexdigest(), 16) % tenants}"


def with_tenants(requests: Sequence[Request], tenants: int, by_session: bool) -> list[Request]:
    """Copies of ``requests`` with a tenant each: per top-level session or per request."""
    out = []
    for r in requests:
        unit = (r.session_id or r.request_id).split("/")[0] if by_session else r.request_id
        out.append(dataclasses.replace(r, tenant_id=tenant_of(unit, tenants)))
    return out


def cost_rows(
    name: str,
    requests: Sequence[Request],
    tenants: Sequence[int],
    fractions: Sequence[float],
    by_session: bool,
) -> list[dict]:
    """One row per (tenants, capacity): hit rates off and on, and the cost in points."""
    off = compile_trace(requests, None, "prefix")
    totals = trace_totals(off)
    caps = [str(max(1, round(f * totals.unique_blocks))) for f in fractions]
    base = {r["capacity"]: r["token_hit_rate"] for r in replay_trace(off, ["lru"], caps)}
    rows = []
    for n in tenants:
        salted = compile_trace(with_tenants(requests, n, by_session), None, "prefix",
                               salt_by_tenant=True)  # fmt: skip
        on = {r["capacity"]: r["token_hit_rate"] for r in replay_trace(salted, ["lru"], caps)}
        on_totals = trace_totals(salted)
        for f, cap in zip(fractions, caps, strict=True):
            rows.append(_row(name, n, f"{f:.0%} ({cap} blk)", base[cap], on[cap]))
        rows.append(_row(name, n, "inf", totals.ceiling_token_hit_rate,
                         on_totals.ceiling_token_hit_rate))  # fmt: skip
    return rows


def _row(name: str, tenants: int, capacity: str, off: float, on: float) -> dict:
    return {"workload": name, "tenants": tenants, "capacity": capacity,
            "off": off, "on": on, "cost_pts": 100 * (off - on)}  # fmt: skip


def print_table(rows: Sequence[dict]) -> None:
    head = (
        f"{'workload':<22} {'tenants':>7} {'capacity (lru)':>18} {'off':>7} {'on':>7} {'cost':>7}"
    )
    print(head)
    print("-" * len(head))
    for r in rows:
        print(
            f"{r['workload']:<22} {r['tenants']:>7} {r['capacity']:>18} {r['off']:>7.1%} "
            f"{r['on']:>7.1%} {r['cost_pts']:>6.1f}p"
        )


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--traces", type=Path, default=DEFAULT_CC, help="Claude Code session dir")
    p.add_argument("--rag-requests", type=int, default=4000)
    p.add_argument("--tenants", type=int, nargs="+", default=[4, 16])
    p.add_argument("--capacities", type=float, nargs="+", default=[0.02, 0.1],
                   help="fractions of the unsalted trace's unique blocks")  # fmt: skip
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    rows = []
    if args.traces.exists():
        cc = load_trace(args.traces)
        rows += cost_rows(f"claude_code ({len(cc)} req)", cc, args.tenants, args.capacities, True)
    else:
        log.warning("no Claude Code traces at %s: skipped", args.traces)
    rag = make_workload("rag", num_requests=args.rag_requests, seed=0)
    rows += cost_rows(f"rag ({len(rag)} req)", rag, args.tenants, args.capacities, False)
    print_table(rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
