"""Reuse rate by token type on the synthetic workloads, beside SAECache's table.

SAECache reports, per token type, the share of tokens that real traces reuse (REFERENCE.md
section 3). Here the reuse rate of a type is the share of its prompt tokens an unbounded cache
serves: each grid config's workload is run through the serving simulator with ``lru`` and a
capacity of :data:`UNBOUNDED_BLOCKS` blocks (more than any trace here needs: every run is
checked to evict nothing), so a token is a hit exactly when an earlier request (prompt, or
answer cached as output blocks) held the same prefix. The paper's types map onto skv's:
system prompt = ``system``, user query = ``user_query``, model response =
``assistant_history`` (earlier answers quoted in a prompt), tool output = ``tool_output``,
chain of thought = ``reasoning`` (no synthetic workload here generates it); ``template`` and
``tool_schema`` have no row in the paper.

Which configs: the grid's slower arrival setting (``*_slow.yaml``: the same 2,000 requests
span more time, so more follow-up turns fall inside the trace); seeds as the configs (quick:
:func:`skv.experiments.saecache.study.study_config`).

Beside them, a real trace: the Claude Code sessions (:data:`REAL_TRACE`, with the replay
study's reader settings), reuse by type under an infinite prefix cache
(:func:`skv.experiments.type_reuse.reuse_by_type`: cache-only, the trace's own prompts, no
answers added). The column is empty, with the reason, where the trace is absent; the table's
other columns do not need it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from skv.experiments.saecache.numbers import WORKLOAD_TITLES
from skv.experiments.saecache.study import GRID_DIR, replace_fields, study_config
from skv.experiments.stats import mean_ci

#: a capacity no trace of the study fills (blocks); runs that evict anything are rejected
UNBOUNDED_BLOCKS = 10_000_000
#: SAECache's reuse rates by token type (percent), under skv's type names
PAPER_REUSE_PCT: dict[str, float] = {
    "system": 92.3,
    "user_query": 30.8,
    "assistant_history": 27.8,
    "tool_output": 23.0,
    "reasoning": 2.2,
}
#: skv type -> the paper's name for it
PAPER_TYPE_NAMES: dict[str, str] = {
    "system": "system prompt",
    "user_query": "user query",
    "assistant_history": "model response",
    "tool_output": "tool output",
    "reasoning": "chain of thought",
}


#: the real trace of the table's last column, read as experiments/replay/claude_code_capacity.yaml
#: reads it (quick: its quick sessions)
REAL_TRACE = "weka_cc"
REAL_TITLE = "Claude Code (real)"
REAL_OPTIONS: dict[str, Any] = {"session_interval_s": 30.0}
REAL_QUICK_OPTIONS: dict[str, Any] = {"session_interval_s": 30.0, "max_sessions": 6}


def real_trace_rates(*, quick: bool) -> tuple[dict[str, float] | None, str | None]:
    """The real trace's reuse rate per skv type (fractions), or ``(None, why)`` when the trace
    is absent (``why`` says where to get it)."""
    from skv.experiments.type_reuse import reuse_by_type
    from skv.traces import find_trace, load_trace

    try:
        path = find_trace(REAL_TRACE)
    except FileNotFoundError as exc:
        return None, str(exc)
    reqs = load_trace(path, **(REAL_QUICK_OPTIONS if quick else REAL_OPTIONS))
    table = reuse_by_type(reqs)
    return dict(zip(table.semantic_type, table.reuse_rate, strict=True)), None


def reuse_configs(config_dir: str | Path = GRID_DIR) -> list[Path]:
    """The grid configs the table reads (the slower arrival setting of each workload)."""
    paths = sorted(Path(config_dir).glob("*_slow.yaml"))
    if not paths:
        raise FileNotFoundError(f"{config_dir}: no *_slow.yaml grid configs")
    return paths


def reuse_runs(paths: Sequence[str | Path], *, quick: bool) -> list[dict[str, Any]]:
    """One results document per config: ``lru`` at :data:`UNBOUNDED_BLOCKS` blocks, every
    seed of the (quick) config."""
    from skv.experiments.runner import simulate_experiment

    docs = []
    for path in paths:
        cfg = study_config(path, quick=quick)
        cfg = replace_fields(
            cfg, id=f"{cfg.id}_unbounded", policies=["lru"], capacities=[UNBOUNDED_BLOCKS]
        )
        doc = simulate_experiment(cfg)
        evicted = [r["seed"] for r in doc["runs"] if r["evictions"]]
        if evicted:
            raise ValueError(f"{cfg.id}: seeds {evicted} evicted blocks; raise UNBOUNDED_BLOCKS")
        docs.append(doc)
    return docs


def reuse_rows(docs: Sequence[dict[str, Any]]) -> pd.DataFrame:
    """Per workload and semantic type: the reuse rate (mean over seeds, with its 95% bootstrap
    interval) and the type's share of prompt tokens; long form."""
    rows = []
    for doc in docs:
        wl = doc["config"]["workload"]["name"]
        runs = doc["runs"]
        types = sorted({t for r in runs for t in r["prompt_tokens_by_type"]})
        for t in types:
            rate = mean_ci([r["hit_rate_by_type"].get(t, 0.0) for r in runs])
            share = [r["prompt_tokens_by_type"].get(t, 0) / r["prompt_tokens"] for r in runs]
            rows.append(
                {
                    "workload": wl,
                    "semantic_type": t,
                    "reuse_rate": rate["mean"],
                    "ci_low": rate["ci95_low"],
                    "ci_high": rate["ci95_high"],
                    "token_share": math.fsum(share) / len(share),
                    "seeds": rate["n"],
                }
            )
    return pd.DataFrame(rows)


def reuse_table(rows: pd.DataFrame, real: dict[str, float] | None = None) -> pd.DataFrame:
    """The paper's rows first (its name, its rate), then skv's other types; one column per
    workload (reuse rate in percent, mean over seeds; empty where the workload has no such
    tokens), and last the real trace's column (:func:`real_trace_rates`; empty where the trace
    has no such tokens, or entirely when ``real`` is None: the trace is absent)."""
    extra = set(rows["semantic_type"]) | set(real or {})
    types = list(PAPER_REUSE_PCT) + sorted(extra - set(PAPER_REUSE_PCT))
    workloads = list(dict.fromkeys(rows["workload"]))
    rates = rows.set_index(["semantic_type", "workload"])["reuse_rate"]
    out = []
    for t in types:
        row: dict[str, Any] = {
            "token type": PAPER_TYPE_NAMES.get(t, f"({t})"),
            "skv type": t,
            "paper %": PAPER_REUSE_PCT.get(t, float("nan")),
        }
        for wl in workloads:
            v = rates.get((t, wl))
            row[WORKLOAD_TITLES.get(wl, wl)] = float("nan") if v is None else 100 * float(v)
        r = (real or {}).get(t)
        row[REAL_TITLE] = float("nan") if r is None else 100 * float(r)
        out.append(row)
    return pd.DataFrame(out)


def _per_seed(doc: dict[str, Any], t: str) -> dict[int, float]:
    return {int(r["seed"]): 100 * float(r["hit_rate_by_type"].get(t, 0.0)) for r in doc["runs"]}


def reuse_values(docs: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Claim values: per workload and paper type it has, ``reuse_<type>_<workload>`` (a
    fraction, mean over seeds, bootstrap interval); and the thesis that system prompts are the
    most reused type: per seed the smallest, over workloads, of the system prompt's reuse minus
    the highest other paper type's (points; Student t over seeds), ``system_reuse_margin_pts``."""
    from skv.experiments.stats import interval

    out: dict[str, Any] = {}
    margins: dict[int, list[float]] = {}
    for doc in docs:
        wl = doc["config"]["workload"]["name"]
        present = {t for r in doc["runs"] for t in r["prompt_tokens_by_type"]}
        for t in PAPER_REUSE_PCT:
            if t in present:
                rates = [v / 100 for v in _per_seed(doc, t).values()]
                out[f"reuse_{t}_{wl}"] = interval(rates, method="bootstrap")
        others = [t for t in PAPER_REUSE_PCT if t in present and t != "system"]
        if "system" in present and others:
            sys_rate = _per_seed(doc, "system")
            for s, v in sys_rate.items():
                best = max(_per_seed(doc, t)[s] for t in others)
                margins.setdefault(s, []).append(v - best)
    if margins:
        out["system_reuse_margin_pts"] = interval([min(m) for _, m in sorted(margins.items())])
    return out
