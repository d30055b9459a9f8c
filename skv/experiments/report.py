"""Markdown summaries of experiment results and the cross-experiment aggregate.

Everything here reads the results document that :mod:`skv.experiments.runner` builds; nothing
re-runs a simulation. Statements are mechanical: the winner is the online policy with the best
across-seed mean, "within noise" means the paired 95% CI of the difference (same seeds, same
traces) contains 0, and a seed claim is "reproduced" only where the claimed policy has the best
mean. Offline policies (Belady) are reference rows, never winners. Which interval each number
carries (bootstrap percentile for levels, Student t for paired differences) is decided in one
place, :mod:`skv.experiments.stats`.
"""

from __future__ import annotations

import csv
import io
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from skv.experiments.outputs import PLOT_FILES

METRIC_LABELS: dict[str, str] = {
    "ttft_ms_mean": "mean TTFT (ms)",
    "ttft_ms_p50": "p50 TTFT (ms)",
    "ttft_ms_p90": "p90 TTFT (ms)",
    "ttft_ms_p99": "p99 TTFT (ms)",
    "e2e_ms_mean": "mean E2E (ms)",
    "queue_ms_mean": "mean queueing (ms)",
    "token_hit_rate": "token hit rate",
    "block_hit_rate": "block hit rate",
    "cached_tokens": "tokens saved",
}
ADAPTIVE = "adaptive_semantic"


# ----------------------------------------------------------------------------------------
# formatting


def _digits(metric: str) -> int:
    if metric.endswith("hit_rate") or metric == "memory_utilisation_mean":
        return 3
    if metric in ("cached_tokens", "computed_tokens", "prompt_tokens", "evictions"):
        return 0
    return 1


def fmt_value(v: float | None, metric: str) -> str:
    if v is None or (isinstance(v, float) and not math.isfinite(v)):
        return "n/a"
    d = _digits(metric)
    return f"{v:,.{d}f}" if d == 0 else f"{v:.{d}f}"


def fmt_stat(s: dict[str, Any], metric: str) -> str:
    """``mean [low, high]`` (95% bootstrap interval, not symmetric around the mean for a skewed
    metric), or just the mean with one seed (no spread to estimate)."""
    text = fmt_value(s.get("mean"), metric)
    if s.get("ci95_low") is None or (s.get("n") or 0) < 2:
        return text
    return f"{text} [{fmt_value(s['ci95_low'], metric)}, {fmt_value(s['ci95_high'], metric)}]"


def fmt_diff(d: dict[str, Any], metric: str) -> str:
    m = d.get("mean")
    if m is None:
        return "n/a"
    text = f"{'+' if m >= 0 else ''}{fmt_value(m, metric)}"
    if d.get("ci95_low") is None:
        return text
    lo, hi = fmt_value(d["ci95_low"], metric), fmt_value(d["ci95_high"], metric)
    return f"{text} [95% CI {lo}, {hi}]"


def policy_label(rec: dict[str, Any]) -> str:
    return f"`{rec['policy']}` *(offline reference)*" if rec["offline"] else f"`{rec['policy']}`"


# ----------------------------------------------------------------------------------------
# one experiment


def _comparison(doc: dict[str, Any], capacity: str, metric: str) -> dict[str, Any] | None:
    for c in doc["comparisons"]:
        if c["capacity"] == capacity and c["metric"] == metric:
            return c
    return None


def _records(doc: dict[str, Any], capacity: str) -> list[dict[str, Any]]:
    return [r for r in doc["aggregate"] if r["capacity"] == capacity]


def capacities(doc: dict[str, Any]) -> list[str]:
    return [str(c) for c in doc["config"]["capacities"]]


def standing(doc: dict[str, Any], capacity: str, metric: str, policy: str) -> dict[str, Any]:
    """Where ``policy`` stands at ``capacity`` on ``metric`` among online policies.

    ``status``: ``best`` (best mean, every other online policy distinguishable), ``best_noisy``
    (best mean, some policy within noise), ``tied`` (identical on every seed to the best),
    ``within_noise`` (not best, but its paired difference from the best contains 0), ``worse``
    or ``absent``.
    """
    c = _comparison(doc, capacity, metric)
    if c is None or policy not in c["means"]:
        return {"status": "absent", "comparison": c}
    best = c["best_online"]
    online = {r["policy"] for r in _records(doc, capacity) if not r["offline"]}
    tied = [k for k in c.get("tied_with", []) if k in online]
    near = [
        k
        for k, d in c["diff_vs_best"].items()
        if k in online and k not in tied and d.get("distinguishable") is False
    ]
    if policy == best:
        status = "tied" if tied else "best_noisy" if near else "best"
    elif policy in tied:
        status = "tied"
    elif policy in near:
        status = "within_noise"
    else:
        status = "worse"
    return {"status": status, "best": best, "tied": tied, "near": near, "comparison": c}


def winner_line(doc: dict[str, Any], capacity: str, metric: str) -> str:
    c = _comparison(doc, capacity, metric)
    label = METRIC_LABELS.get(metric, metric)
    if c is None:
        return f"- No online policy to rank by {label}."
    best = c["best_online"]
    st = standing(doc, capacity, metric, best)
    rec = next(r for r in _records(doc, capacity) if r["policy"] == best)
    word = "Lowest" if c["better"] == "lower" else "Highest"
    value = fmt_stat(rec[metric], metric)
    if st["tied"]:
        names = ", ".join(f"`{k}`" for k in [best, *st["tied"]])
        head = (
            f"- **{word} {label} (online policies): tie between {names}** "
            f"(identical on every seed), {value}."
        )
    else:
        head = f"- **{word} {label} (online policies): `{best}`**, {value}."
    parts = [head]
    near = [f"`{k}` {fmt_diff(c['diff_vs_best'][k], metric)}" for k in st["near"]]
    online = {r["policy"] for r in _records(doc, capacity) if not r["offline"]}
    far = [
        f"`{k}` {fmt_diff(d, metric)}"
        for k, d in c["diff_vs_best"].items()
        if k in online and k not in st["near"] and k not in st["tied"]
    ]
    if near:
        parts.append(
            "  Within noise of it (paired 95% CI of the difference contains 0): "
            + "; ".join(near)
            + "."
        )
    if far:
        parts.append("  Others, paired difference from it (same seeds): " + "; ".join(far) + ".")
    return "\n".join(parts)


def belady_line(doc: dict[str, Any], capacity: str) -> str | None:
    recs = _records(doc, capacity)
    offline = [r for r in recs if r["offline"]]
    online = [r for r in recs if not r["offline"]]
    if not offline or not online:
        return None
    lines = []
    for off in offline:
        ttft = off["ttft_ms_mean"]["mean"]
        hit = off["token_hit_rate"]["mean"]
        best_hit = max(online, key=lambda r: r["token_hit_rate"]["mean"] or -1.0)
        best_ttft = min(online, key=lambda r: r["ttft_ms_mean"]["mean"] or math.inf)
        text = (
            f"- **`{off['policy']}` (offline: evicts the block whose next use is furthest in "
            f"the future; not deployable)**: mean TTFT {fmt_value(ttft, 'ttft_ms_mean')} ms, "
            f"token hit rate {fmt_value(hit, 'token_hit_rate')}."
        )
        if hit:
            share = (best_hit["token_hit_rate"]["mean"] or 0.0) / hit
            text += (
                f" The best online hit rate (`{best_hit['policy']}`) is {share:.1%} of Belady's."
            )
        beaten = []
        if (best_hit["token_hit_rate"]["mean"] or 0.0) > (hit or 0.0):
            beaten.append(f"token hit rate (`{best_hit['policy']}`)")
        if (best_ttft["ttft_ms_mean"]["mean"] or math.inf) < (ttft or math.inf):
            beaten.append(f"mean TTFT (`{best_ttft['policy']}`)")
        if beaten:
            text += (
                " An online policy beats it on "
                + " and ".join(beaten)
                + ": the furthest-next-use rule is optimal only for block hits in a cache where "
                "any block can be evicted at any time; with prefix chains (leaf-only eviction), "
                "blocks pinned by running requests, generated-output blocks and batching it is "
                "a reference point here, not a strict bound."
            )
        lines.append(text)
    return "\n".join(lines)


_STATUS_TEXT = {
    "best": "reproduced",
    "best_noisy": "best by mean, but not distinguishable from",
    "tied": "tied for best with",
    "within_noise": "not reproduced",
    "worse": "not reproduced",
    "absent": "not evaluated",
}


def claim_verdict(doc: dict[str, Any]) -> tuple[str, list[str]] | None:
    """(one-line verdict, per-capacity lines) for the config's seed claim, if it has one."""
    claim = doc["config"].get("seed_claim")
    if not claim:
        return None
    winner, metric = claim["winner"], claim["metric"]
    label = METRIC_LABELS.get(metric, metric)
    lines, best_at, clear_at = [], 0, 0
    for cap in capacities(doc):
        st = standing(doc, cap, metric, winner)
        c = st["comparison"]
        if c is None or st["status"] == "absent":
            continue
        means = c["means"]
        w = fmt_value(means.get(winner), metric)
        status = st["status"]
        if status == "best":
            best_at += 1
            clear_at += 1
            lines.append(
                f"- `{cap}`: reproduced. `{winner}` is best ({label} {w}) and ahead of every "
                "other online policy beyond noise (paired 95% CIs exclude 0)."
            )
        elif status in ("best_noisy", "tied"):
            best_at += 1
            others = st["tied"] if status == "tied" else st["near"]
            if status == "tied" and winner != st["best"]:
                others = [st["best"], *[k for k in st["tied"] if k != winner]]
            names = ", ".join(f"`{k}`" for k in others)
            why = (
                "identical on every seed"
                if status == "tied"
                else ("paired 95% CI of the difference contains 0")
            )
            lines.append(
                f"- `{cap}`: {_STATUS_TEXT[status]} {names} ({why}). `{winner}` {label} {w}."
            )
        else:
            best = st["best"]
            d = c["diff_vs_best"].get(winner, {})
            noise = ""
            if status == "within_noise":
                noise = " (the gap is within noise: paired 95% CI of the difference contains 0)"
            lines.append(
                f"- `{cap}`: **not reproduced**. `{best}` is best with {label} "
                f"{fmt_value(means.get(best), metric)}; `{winner}` has {w}, difference "
                f"{fmt_diff(d, metric)}{noise}."
            )
    n = len(lines)
    if best_at == 0:
        verdict = f"NOT reproduced at any of the {n} capacities"
    elif clear_at == n:
        verdict = f"reproduced at all {n} capacities"
    else:
        verdict = (
            f"`{winner}` has the best (or tied-best) mean at {best_at} of {n} capacities, "
            f"clearly ahead (beyond noise) at {clear_at}"
        )
    return verdict, lines


def claim_cell(doc: dict[str, Any], capacity: str) -> str:
    claim = doc["config"].get("seed_claim")
    if not claim:
        return "-"
    st = standing(doc, capacity, claim["metric"], claim["winner"])["status"]
    text = {
        "best": "yes",
        "best_noisy": "yes, within noise",
        "tied": "tied",
        "within_noise": "**no** (within noise)",
        "worse": "**no**",
        "absent": "-",
    }[st]
    return f"`{claim['winner']}` wins: {text}"


def adaptive_line(doc: dict[str, Any]) -> str | None:
    """Where adaptive semantic eviction has the best mean TTFT, in plain words."""
    recs = [r for r in doc["aggregate"] if r["policy_name"] == ADAPTIVE]
    if not recs:
        return None
    keys = list(dict.fromkeys(r["policy"] for r in recs))
    wins, losses = [], []
    for cap in capacities(doc):
        sts = {k: standing(doc, cap, "ttft_ms_mean", k) for k in keys}
        good = [k for k, st in sts.items() if st["status"] in ("best", "best_noisy", "tied")]
        if good:
            st = sts[good[0]]
            online = [r for r in _records(doc, cap) if not r["offline"]]
            if st["status"] == "tied" and len(st["tied"]) + 1 >= len(online):
                note = " (every online policy identical: the policy does not matter here)"
            elif st["status"] == "tied":
                note = " (tied)"
            elif st["status"] == "best_noisy":
                note = " (not beyond noise)"
            else:
                note = ""
            wins.append(f"`{cap}`{note}")
        else:
            k = keys[0]
            st = sts[k]
            c = st["comparison"]
            if c is None:
                continue
            losses.append(
                f"`{cap}` (best `{st['best']}` "
                f"{fmt_value(c['means'][st['best']], 'ttft_ms_mean')} ms vs `{k}` "
                f"{fmt_value(c['means'].get(k), 'ttft_ms_mean')} ms"
                + (", within noise" if st["status"] == "within_noise" else "")
                + ")"
            )
    text = "- Adaptive semantic eviction has the lowest mean TTFT at: "
    text += ", ".join(wins) if wins else "no capacity"
    if losses:
        text += "; it does not at: " + ", ".join(losses)
    return text + "."


def _adaptive_metric(doc: dict[str, Any], key: str) -> str:
    """The metric adaptive semantic eviction is judged on: the seed claim's, when the claim
    names it, else mean TTFT (the report's headline)."""
    claim = doc["config"].get("seed_claim") or {}
    if claim.get("winner") == key and claim.get("metric"):
        return str(claim["metric"])
    return "ttft_ms_mean"


def _pts(a: float, b: float) -> str:
    d = round((a - b) * 100.0, 1)
    return f"{'+' if d > 0 else '-' if d < 0 else ''}{abs(d):.1f} pts"


def _pct_text(v: float) -> str:
    return f"{v:.1%}"


def _signed(v: float, digits: int = 0) -> str:
    return f"{'+' if v >= 0 else '-'}{abs(v):,.{digits}f}"


def why_adaptive_loses(doc: dict[str, Any], capacity: str) -> list[str]:
    """A short, data-only account of why ``adaptive_semantic`` is not clearly the best online
    policy at ``capacity``: per-type hit rates and evictions next to the policy it is compared
    with, and its learned type weights (initial -> last logged, seed mean). Empty where it is
    clearly best, tied on every seed, or absent."""
    recs = {r["policy"]: r for r in _records(doc, capacity)}
    out: list[str] = []
    for key, ad in recs.items():
        if ad["policy_name"] != ADAPTIVE or ad["offline"]:
            continue
        metric = _adaptive_metric(doc, key)
        st = standing(doc, capacity, metric, key)
        status = st["status"]
        if status in ("best", "tied", "absent"):
            continue
        c = st["comparison"]
        if status == "best_noisy":
            # compare with the runner-up: the online policy closest to it
            near = st["near"]
            other = min(near, key=lambda k: (abs(c["diff_vs_best"][k].get("mean") or 0.0), k))
            head = f"### Why `{key}` is not clearly ahead at `{capacity}` (vs `{other}`)"
            lead = (
                f"`{key}` has the best {METRIC_LABELS.get(metric, metric)} but `{other}` is "
                f"within noise of it (`{other}` minus `{key}`: "
                f"{fmt_diff(c['diff_vs_best'][other], metric)})."
            )
        else:
            other = st["best"]
            head = f"### Why `{key}` does not win at `{capacity}` (vs `{other}`)"
            lead = (
                f"`{other}` has the best {METRIC_LABELS.get(metric, metric)}; `{key}` minus "
                f"`{other}`: {fmt_diff(c['diff_vs_best'].get(key, {}), metric)}"
                + (" (within noise)" if status == "within_noise" else "")
                + "."
            )
        behind = status != "best_noisy"
        out += [head, "", *_why_body(key, ad, other, recs[other], metric, lead, behind), ""]
    return out


def _why_body(
    key: str,
    ad: dict[str, Any],
    other: str,
    ot: dict[str, Any],
    metric: str,
    lead: str,
    behind: bool,
) -> list[str]:
    hit_a, hit_o = ad.get("hit_rate_by_type", {}), ot.get("hit_rate_by_type", {})
    ev_a, ev_o = ad.get("evictions_by_type", {}), ot.get("evictions_by_type", {})
    toks = ad.get("prompt_tokens_by_type") or ot.get("prompt_tokens_by_type") or {}
    w0, w1 = ad.get("initial_weights") or {}, ad.get("final_weights") or {}
    total_tokens = sum(toks.values())
    types = sorted(
        set(hit_a) | set(hit_o) | set(ev_a) | set(ev_o),
        key=lambda t: (-toks.get(t, 0.0), t),
    )
    lines: list[str] = []
    worse: list[str] = []
    if types:
        lines += [
            f"| semantic type | share of prompt tokens | token hit rate: `{key}` | `{other}` "
            f"| difference | evictions: `{key}` | `{other}` "
            f"| `{key}` weight, initial → last logged |",
            "|---|---:|---:|---:|---:|---:|---:|---:|",
        ]
        for t in types:
            share = _pct_text(toks[t] / total_tokens) if total_tokens and t in toks else "-"
            ha, ho = hit_a.get(t), hit_o.get(t)
            in_prompt = t in hit_a or t in hit_o
            cells = [
                f"`{t}`",
                share,
                _pct_text(ha or 0.0) if in_prompt else "-",
                _pct_text(ho or 0.0) if in_prompt else "-",
                _pts(ha or 0.0, ho or 0.0) if in_prompt else "-",
                f"{ev_a.get(t, 0.0):,.0f}",
                f"{ev_o.get(t, 0.0):,.0f}",
                f"{w0[t]:.2f} → {w1[t]:.2f}" if t in w0 and t in w1 else "-",
            ]
            lines.append("| " + " | ".join(cells) + " |")
        lines.append("")
    else:
        lines += ["No per-type hit rates or evictions were recorded for these runs.", ""]
    # 1: the headline numbers side by side
    parts = [lead]

    def m(rec: dict[str, Any], name: str) -> float | None:
        return (rec.get(name) or {}).get("mean")

    tr_a, tr_o = m(ad, "token_hit_rate"), m(ot, "token_hit_rate")
    if tr_a is not None and tr_o is not None:
        parts.append(
            f"Token hit rate {_pct_text(tr_a)} vs {_pct_text(tr_o)} ({_pts(tr_a, tr_o)}); "
            f"mean TTFT {fmt_value(m(ad, 'ttft_ms_mean'), 'ttft_ms_mean')} vs "
            f"{fmt_value(m(ot, 'ttft_ms_mean'), 'ttft_ms_mean')} ms; mean queueing "
            f"{fmt_value(m(ad, 'queue_ms_mean'), 'queue_ms_mean')} vs "
            f"{fmt_value(m(ot, 'queue_ms_mean'), 'queue_ms_mean')} ms."
        )
    lines.append("- " + " ".join(parts))
    # 2: where the hit-token gap comes from
    ht_a, ht_o = ad.get("hit_tokens_by_type"), ot.get("hit_tokens_by_type")
    if ht_a is not None and ht_o is not None and types:
        gaps = {t: ht_a.get(t, 0.0) - ht_o.get(t, 0.0) for t in types if t in toks}
        total = math.fsum(gaps.values())
        worse = sorted((t for t in gaps if gaps[t] < -0.5), key=lambda t: gaps[t])
        better = sorted((t for t in gaps if gaps[t] > 0.5), key=lambda t: -gaps[t])
        more_less = "more" if total >= 0 else "fewer"
        text = (
            f"Over a run, `{key}` hits {abs(total):,.0f} {more_less} prompt tokens than "
            f"`{other}` (seed mean)"
        )

        def gap(t: str) -> str:
            return f"`{t}` ({_signed(gaps[t])}, {_pts(hit_a.get(t, 0.0), hit_o.get(t, 0.0))})"

        if worse:
            text += "; fewer on " + ", ".join(gap(t) for t in worse[:3])
        if better:
            text += "; more on " + ", ".join(gap(t) for t in better[:3])
        if not worse and not better:
            text += "; the same on every type"
        text += "."
        if behind and total >= 0 and metric != "token_hit_rate":
            text += (
                f" It hits no fewer tokens, so its {METRIC_LABELS.get(metric, metric)} gap does "
                "not come from a lower overall hit count."
            )
        lines.append("- " + text)
    # 3: evictions by type
    if ev_a or ev_o:
        diffs = {t: ev_a.get(t, 0.0) - ev_o.get(t, 0.0) for t in set(ev_a) | set(ev_o)}
        top = sorted((t for t in diffs if abs(diffs[t]) >= 0.5), key=lambda t: (-abs(diffs[t]), t))
        text = (
            f"Evictions: `{key}` {sum(ev_a.values()):,.0f} vs `{other}` {sum(ev_o.values()):,.0f}"
        )
        if top:
            text += "; by type " + ", ".join(f"`{t}` {_signed(diffs[t])}" for t in top[:4])
        lines.append("- " + text + ".")
    # 4: learned weights
    if w0 and w1:
        moved = sorted((t for t in w1 if t in w0), key=lambda t: (-abs(math.log(w1[t] / w0[t])), t))
        text = "Learned weights (initial → last logged, seed mean): " + ", ".join(
            f"`{t}` {w0[t]:.2f} → {w1[t]:.2f}" for t in moved
        )
        lost = [t for t in worse if t in w0 and t in w1]
        if lost:
            t = lost[0]
            verb = "rose" if w1[t] > w0[t] else "fell" if w1[t] < w0[t] else "stayed"
            text += (
                f". Its weight for `{t}`, the type it loses most tokens on, {verb} "
                f"({w0[t]:.2f} → {w1[t]:.2f})"
            )
        lines.append("- " + text + ".")
    return lines


def summary_markdown(doc: dict[str, Any]) -> str:
    cfg = doc["config"]
    lat = doc["latency"]
    seeds = cfg["seeds"]
    n = len(seeds)
    head = f"Experiment `{doc['experiment']}`"
    if cfg.get("title"):
        head = f"{cfg['title']} (experiment `{doc['experiment']}`)"
    out = [f"# {head}", ""]
    if doc.get("description"):
        out += [doc["description"].strip(), ""]
    constants = lat.get("constants") or lat.get("params") or {}
    const_text = ", ".join(f"{k}={v}" for k, v in constants.items()) if constants else ""
    out += [
        f"> **Simulated, not measured.** Every latency in this report (TTFT, TPOT, E2E, "
        f"queueing) was simulated by the `{lat.get('model', '?')}` latency model"
        + (f": `{lat['formula']}`" if lat.get("formula") else "")
        + (f" with {const_text}" if const_text else "")
        + ". No GPU ran; hit rates and evictions are those of the simulated cache.",
        "",
    ]
    if doc.get("quick"):
        out += [
            "> **Quick run**: `num_requests` scaled down for a smoke test; "
            "numbers are not the experiment's.",
            "",
        ]
    params = dict(cfg["workload"]["params"])
    traces = doc["traces"]
    reqs = sorted({t["requests"] for t in traces})
    uniq = ", ".join(f"{t['unique_blocks']:,}" for t in traces)
    rep = cfg["replicas"]
    batch = cfg["batch"]
    out += [
        "## Setup",
        "",
        f"- Workload `{cfg['workload']['name']}` with {_params_text(params)}; "
        f"{'/'.join(str(r) for r in reqs)} requests per seed.",
        f"- Seeds {', '.join(str(s) for s in seeds)}: "
        + (
            f"values are mean [95% CI] over {n} seeds (bootstrap percentile interval of "
            "the mean; paired differences: Student t)."
            if n > 1
            else "one seed, so no confidence intervals."
        ),
        f"- {rep['count']} replica(s), router `{rep['router']}`; per iteration at most "
        f"{batch['max_batch_tokens']} batched tokens and {batch['max_running']} running "
        f"requests; block size {cfg['block_size']} tokens; keying `{cfg['keying']}`"
        + ("; cache salted by tenant" if cfg.get("salt_by_tenant") else "")
        + ".",
        f"- Capacities are per replica; a share (`%`) is of the trace's unique prompt blocks "
        f"({uniq} for seed(s) {', '.join(str(t['seed']) for t in traces)}).",
        "",
    ]
    for cap in capacities(doc):
        recs = _records(doc, cap)
        if not recs:
            continue
        blocks = recs[0]["capacity_blocks"]
        out += [f"## Capacity `{cap}` ({blocks:,.0f} blocks per replica, seed mean)", ""]
        out += [
            "| policy | mean TTFT (ms) | p99 TTFT (ms) | token hit rate | tokens saved "
            "| evictions | mean queueing (ms) |",
            "|---|---:|---:|---:|---:|---:|---:|",
        ]
        for r in recs:
            out.append(
                f"| {policy_label(r)} | {fmt_stat(r['ttft_ms_mean'], 'ttft_ms_mean')} "
                f"| {fmt_stat(r['ttft_ms_p99'], 'ttft_ms_p99')} "
                f"| {fmt_stat(r['token_hit_rate'], 'token_hit_rate')} "
                f"| {fmt_stat(r['cached_tokens'], 'cached_tokens')} "
                f"| {fmt_stat(r['evictions'], 'evictions')} "
                f"| {fmt_stat(r['queue_ms_mean'], 'queue_ms_mean')} |"
            )
        out.append("")
        out.append(winner_line(doc, cap, "ttft_ms_mean"))
        out.append(winner_line(doc, cap, "token_hit_rate"))
        bl = belady_line(doc, cap)
        if bl:
            out.append(bl)
        out.append("")
        out += why_adaptive_loses(doc, cap)
    out += ["## Verdict", ""]
    verdict = claim_verdict(doc)
    if verdict is not None:
        claim = cfg["seed_claim"]
        out.append(
            f"Seed claim (SemanticKV README): `{claim['winner']}` wins on "
            f"{METRIC_LABELS.get(claim['metric'], claim['metric'])}"
            + (f': "{claim["text"].strip()}"' if claim.get("text") else "")
        )
        out.append("")
        out.append(f"**Here: {verdict[0]}.**")
        out.append("")
        out += verdict[1]
        out.append("")
    else:
        out += ["No seed claim for this scenario: the seed names no winner for it.", ""]
    al = adaptive_line(doc)
    if al:
        out.append(al)
    out += [
        "- Winners are by across-seed mean among online policies; Belady is a reference only. "
        "Nothing was tuned toward a winner: policies run with the parameters in the config.",
        "",
        "## Files",
        "",
        "`results.json` (everything below, plus time series), `metrics.csv` (one row per "
        "policy x capacity x seed), `metrics_summary.csv` (mean, std, 95% CI per policy x "
        "capacity), plots: " + ", ".join(f"`{p}`" for p in PLOT_FILES) + ". Wall-clock "
        "timings are only in `run.log`.",
        "",
        f"*{doc['simulated']}.*",
        "",
    ]
    return "\n".join(out)


def _params_text(params: dict[str, Any]) -> str:
    if not params:
        return "default parameters"
    return ", ".join(f"{k}={v}" for k, v in params.items())


# ----------------------------------------------------------------------------------------
# aggregate over experiments

AGGREGATE_COLUMNS: tuple[str, ...] = (
    "experiment",
    "workload",
    "latency_model",
    "quick",
    "capacity",
    "capacity_blocks",
    "policy",
    "policy_name",
    "offline",
    "n_seeds",
    "ttft_ms_mean",
    "ttft_ms_mean_ci95_low",
    "ttft_ms_mean_ci95_high",
    "ttft_ms_p99",
    "token_hit_rate",
    "token_hit_rate_ci95_low",
    "token_hit_rate_ci95_high",
    "cached_tokens",
    "evictions",
    "best_online_ttft",
    "best_online_hit_rate",
    "run_dir",
)


def aggregate_rows(docs: Sequence[dict[str, Any]], run_dirs: Sequence[Path]) -> list[dict]:
    rows = []
    for doc, run_dir in zip(docs, run_dirs, strict=True):
        for rec in doc["aggregate"]:
            cap = rec["capacity"]
            ct = _comparison(doc, cap, "ttft_ms_mean")
            ch = _comparison(doc, cap, "token_hit_rate")
            rows.append(
                {
                    "experiment": doc["experiment"],
                    "workload": doc["config"]["workload"]["name"],
                    "latency_model": doc["latency"].get("model", ""),
                    "quick": doc.get("quick", False),
                    "capacity": cap,
                    "capacity_blocks": rec["capacity_blocks"],
                    "policy": rec["policy"],
                    "policy_name": rec["policy_name"],
                    "offline": rec["offline"],
                    "n_seeds": rec["n_seeds"],
                    "ttft_ms_mean": rec["ttft_ms_mean"]["mean"],
                    "ttft_ms_mean_ci95_low": rec["ttft_ms_mean"]["ci95_low"],
                    "ttft_ms_mean_ci95_high": rec["ttft_ms_mean"]["ci95_high"],
                    "ttft_ms_p99": rec["ttft_ms_p99"]["mean"],
                    "token_hit_rate": rec["token_hit_rate"]["mean"],
                    "token_hit_rate_ci95_low": rec["token_hit_rate"]["ci95_low"],
                    "token_hit_rate_ci95_high": rec["token_hit_rate"]["ci95_high"],
                    "cached_tokens": rec["cached_tokens"]["mean"],
                    "evictions": rec["evictions"]["mean"],
                    "best_online_ttft": bool(ct and ct["best_online"] == rec["policy"]),
                    "best_online_hit_rate": bool(ch and ch["best_online"] == rec["policy"]),
                    "run_dir": Path(run_dir).name,
                }
            )
    return rows


def aggregate_csv(rows: list[dict[str, Any]]) -> str:
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=list(AGGREGATE_COLUMNS), lineterminator="\n")
    w.writeheader()
    for r in rows:
        w.writerow(
            {k: ("" if v is None else repr(v) if isinstance(v, float) else v) for k, v in r.items()}
        )
    return buf.getvalue()


def aggregate_markdown(docs: Sequence[dict[str, Any]], run_dirs: Sequence[Path]) -> str:
    models = sorted({d["latency"].get("model", "?") for d in docs})
    out = [
        "# Aggregate summary",
        "",
        f"> **Simulated, not measured.** Latencies come from the {', '.join(models)} latency "
        "model(s) named in each experiment's summary; workloads are deterministic synthetic "
        "traces. Use these numbers to compare policies with each other, not as GPU speedups.",
        "",
    ]
    if any(d.get("quick") for d in docs):
        out += ["> **Quick run**: request counts were scaled down; not the suite's numbers.", ""]
    out += [
        "Mean TTFT in ms (mean [95% bootstrap CI] over seeds). Best = lowest mean among online "
        "policies; Belady is an offline reference.",
        "",
        "| experiment | capacity | best online (TTFT) | adaptive_semantic | lru | "
        "belady (offline) | best online (token hit rate) | seed claim |",
        "|---|---|---|---:|---:|---:|---|---|",
    ]
    for doc in docs:
        for cap in capacities(doc):
            recs = {r["policy"]: r for r in _records(doc, cap)}
            ct = _comparison(doc, cap, "ttft_ms_mean")
            ch = _comparison(doc, cap, "token_hit_rate")

            def cell(key: str, recs: dict = recs) -> str:
                r = recs.get(key)
                return fmt_stat(r["ttft_ms_mean"], "ttft_ms_mean") if r else "-"

            best = ct["best_online"] if ct else None
            best_txt = f"`{best}` {cell(best)}" if best else "-"
            hit_txt = "-"
            if ch:
                hb = ch["best_online"]
                hit_txt = f"`{hb}` {fmt_stat(recs[hb]['token_hit_rate'], 'token_hit_rate')}"
            claim_txt = claim_cell(doc, cap)
            if ct and standing(doc, cap, "ttft_ms_mean", best)["tied"]:
                best_txt += " (tied)"
            out.append(
                f"| `{doc['experiment']}` | `{cap}` | {best_txt} | {cell(ADAPTIVE)} "
                f"| {cell('lru')} | {cell('belady')} | {hit_txt} | {claim_txt} |"
            )
    out += ["", "## Where each policy has the best mean TTFT", ""]
    wins: dict[str, list[str]] = {}
    for doc in docs:
        for cap in capacities(doc):
            c = _comparison(doc, cap, "ttft_ms_mean")
            if c is None:
                continue
            st = standing(doc, cap, "ttft_ms_mean", c["best_online"])
            note = {"tied": " (tie)", "best_noisy": " (not beyond noise)"}.get(st["status"], "")
            for k in [c["best_online"], *st["tied"]]:
                wins.setdefault(k, []).append(f"`{doc['experiment']}` @ `{cap}`{note}")
    for k, where in wins.items():
        out.append(f"- `{k}`: " + "; ".join(where))
    out += [
        "",
        '"Not beyond noise": some other online policy\'s paired 95% CI of the difference '
        "from the best contains 0.",
        "",
        "## Verdicts",
        "",
    ]
    for doc, run_dir in zip(docs, run_dirs, strict=True):
        out.append(f"### `{doc['experiment']}` ({doc['latency'].get('model', '?')} latency model)")
        out.append("")
        verdict = claim_verdict(doc)
        if verdict is not None:
            claim = doc["config"]["seed_claim"]
            out.append(
                f"Seed claim: `{claim['winner']}` wins on "
                f"{METRIC_LABELS.get(claim['metric'], claim['metric'])}. "
                f"**Here: {verdict[0]}.**"
            )
            out.append("")
            out += verdict[1]
        else:
            out.append("No seed claim for this scenario.")
            out.append("")
        al = adaptive_line(doc)
        if al:
            out.append(al)
        out.append(f"- Details: `{Path(run_dir).name}/summary.md`")
        out.append("")
    return "\n".join(out)


def write_aggregate(
    docs: Sequence[dict[str, Any]], run_dirs: Sequence[Path], output_root: Path
) -> list[Path]:
    output_root.mkdir(parents=True, exist_ok=True)
    csv_path = output_root / "aggregate_summary.csv"
    md_path = output_root / "aggregate_summary.md"
    csv_path.write_text(aggregate_csv(aggregate_rows(docs, run_dirs)), encoding="utf-8")
    md_path.write_text(aggregate_markdown(docs, run_dirs), encoding="utf-8")
    return [csv_path, md_path]
