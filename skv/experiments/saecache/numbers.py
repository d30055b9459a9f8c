"""The SAECache study's numbers, from the runs' ``results.json`` documents.

Every comparison is paired over seeds (same seed = same trace, so the trace-to-trace spread
both policies share cancels; a policy that ran other seeds than its comparator is an error,
not a mispairing) and reported as ``{"value", "ci95": [lo, hi], "n"}``, the Student-t interval
of the mean per-seed value (:func:`skv.experiments.stats.interval`):

- TTFT **speedup** of a policy over vLLM's block pool: per seed ``ttft(vllm) / ttft(policy)``
  (> 1: the policy is faster; the paper's "1.4-2.7x over vLLM LRU"), for the mean and the p99
  TTFT; across the grid, per seed the geometric mean over settings, then its interval;
- **hit-rate difference** in points: per seed ``100 (hit(a) - hit(b))`` (token hit rate);
  across the grid, per seed the mean over settings;
- **ablation**: per seed ``100 (ttft(variant) / ttft(saecache) - 1)``: how much slower
  saecache gets with one component off (> 0: the component helps);
- **mismatch**: per seed ``ttft(fixed, fitted on A) / ttft(fixed, fitted on B)`` on workload
  B (> 1: the mismatched fit is slower), and each fixed variant against saecache learning.

A grid setting is one config (one workload x arrival setting) with one capacity.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import pandas as pd

from skv.experiments.saecache.study import FIT_PREFIX
from skv.experiments.stats import interval

POLICY = "saecache"
BASELINE = "vllm"
#: the display names of the workloads (skv/workloads/sae_mix.py presets)
WORKLOAD_TITLES: dict[str, str] = {
    "sharegpt_like": "ShareGPT-like",
    "lmsys_like": "LMSys-like",
    "arena_like": "Arena-like",
    "tool_use": "Tool use",
    "multi_turn_dominant": "Multi-turn dom.",
    "balanced": "Balanced",
    "single_turn_dominant": "Single-turn dom.",
}
#: ablation variant (config label) -> the component it switches off
ABLATIONS: dict[str, str] = {
    "no_queue_weights": "queue weights",
    "no_type_weights": "type weights",
    "no_timing": "log-normal timing",
    "no_decay": "position decay",
}

Docs = Mapping[str, dict[str, Any]] | Sequence[dict[str, Any]]


def _docs(docs: Docs) -> list[dict[str, Any]]:
    return list(docs.values()) if isinstance(docs, Mapping) else list(docs)


def capacity(doc: dict[str, Any]) -> str:
    """The one capacity of a study run (the study's configs have one each)."""
    caps = sorted({r["capacity"] for r in doc["runs"]})
    if len(caps) != 1:
        raise ValueError(f"{doc['experiment']}: expected one capacity, got {caps}")
    return caps[0]


def by_seed(doc: dict[str, Any], policy: str, metric: str) -> dict[int, float]:
    """seed -> ``metric`` of ``policy``."""
    out = {int(r["seed"]): float(r[metric]) for r in doc["runs"] if r["policy"] == policy}
    if not out:
        raise ValueError(f"{doc['experiment']}: no runs of {policy!r}")
    return out


def paired(doc: dict[str, Any], a: str, b: str, metric: str) -> list[tuple[float, float]]:
    """(a, b) per seed, in seed order; both policies must have run the same seeds."""
    xa, xb = by_seed(doc, a, metric), by_seed(doc, b, metric)
    if set(xa) != set(xb):
        raise ValueError(
            f"{doc['experiment']}: {a} ran seeds {sorted(xa)}, {b} ran {sorted(xb)}: a paired "
            "comparison needs the same seeds"
        )
    return [(xa[s], xb[s]) for s in sorted(xa)]


def _seeds(docs: list[dict[str, Any]], policy: str, metric: str) -> list[int]:
    seeds = sorted(by_seed(docs[0], policy, metric))
    for d in docs[1:]:
        if sorted(by_seed(d, policy, metric)) != seeds:
            raise ValueError(f"{d['experiment']}: other seeds than {docs[0]['experiment']}")
    return seeds


def setting(doc: dict[str, Any]) -> dict[str, str]:
    """What a grid run is: its key (the id without ``saecache_``), workload (name and display
    title), arrival range (``0.02-0.05 s``) and a two-line label."""
    cfg = doc["config"]
    params = cfg["workload"]["params"]
    wl = cfg["workload"]["name"]
    arrival = f"{params['arrival_min_s']:.2f}-{params['arrival_max_s']:.2f} s"
    title = WORKLOAD_TITLES.get(wl, wl)
    return {
        "key": doc["experiment"].removeprefix("saecache_"),
        "workload": wl,
        "title": title,
        "arrival": arrival,
        "label": f"{title}\n{arrival}",
    }


def run_facts(docs: Docs) -> dict[str, Any]:
    """What every run of ``docs`` shares, for titles and the paper: model and GPU of the
    latency model, the capacity spec, seeds and requests per trace (one value each; an error
    when the runs disagree)."""
    ds = _docs(docs)
    facts: dict[str, set] = {"model": set(), "gpu": set(), "capacity": set(), "seeds": set()}
    facts["requests"] = set()
    for d in ds:
        params = d["config"]["latency"]["params"]
        facts["model"].add(str(params.get("model", "?")))
        facts["gpu"].add(str(params.get("gpu", "?")))
        facts["capacity"].add(capacity(d))
        facts["seeds"].add(len({r["seed"] for r in d["runs"]}))
        facts["requests"].update(t["requests"] for t in d["traces"])
    out = {}
    for k, v in facts.items():
        if len(v) != 1:
            raise ValueError(f"the runs differ in {k}: {sorted(v)}")
        out[k] = next(iter(v))
    return out


def describe(docs: Docs) -> str:
    """One line for a figure title: model, GPU, capacity, seeds (simulated)."""
    f = run_facts(docs)
    return (
        f"{f['model']} on one {f['gpu']} (simulated), capacity {f['capacity']} of the unique "
        f"prompt blocks, {f['requests']} requests, {f['seeds']} seeds"
    )


def online_policies(doc: dict[str, Any]) -> list[str]:
    """The online policies of a run, in config order."""
    return list(dict.fromkeys(r["policy"] for r in doc["runs"] if not r["offline"]))


def offline_policies(doc: dict[str, Any]) -> list[str]:
    return list(dict.fromkeys(r["policy"] for r in doc["runs"] if r["offline"]))


def _mean(xs: Sequence[float]) -> float:
    return math.fsum(xs) / len(xs)


# ----------------------------------------------------------------------------------------
# TTFT speedups over vLLM's pool


def speedup(
    doc: dict[str, Any], policy: str, metric: str = "ttft_ms_mean", baseline: str = BASELINE
) -> dict[str, Any]:
    """Per seed ``metric(baseline) / metric(policy)``, mean and 95% interval."""
    return interval([b / a for a, b in paired(doc, policy, baseline, metric)])


def geomean_speedup(
    docs: Docs, policy: str, metric: str = "ttft_ms_mean", baseline: str = BASELINE
) -> dict[str, Any]:
    """Per seed the geometric mean over settings of ``metric(baseline) / metric(policy)``;
    mean and 95% interval over seeds."""
    ds = _docs(docs)
    seeds = _seeds(ds, policy, metric)
    logs = {s: [] for s in seeds}  # type: dict[int, list[float]]
    for d in ds:
        a, b = by_seed(d, policy, metric), by_seed(d, baseline, metric)
        for s in seeds:
            logs[s].append(math.log(b[s] / a[s]))
    return interval([math.exp(_mean(logs[s])) for s in seeds])


def best_by(doc: dict[str, Any], metric: str, exclude: Sequence[str] = (POLICY,)) -> str:
    """The online policy not in ``exclude`` with the best across-seed mean of ``metric``
    (lowest TTFT, highest hit rate; ties: config order)."""
    cands = [p for p in online_policies(doc) if p not in exclude]
    sign = 1.0 if "ttft" in metric else -1.0
    return min(cands, key=lambda p: sign * _mean(list(by_seed(doc, p, metric).values())))


def ttft_rows(docs: Docs, policy: str = POLICY) -> pd.DataFrame:
    """Figure data: per setting and TTFT metric (mean, p99), the speedup over vllm of
    ``policy``, of the best other online policy of that setting (by that metric) and of each
    offline policy; columns setting, label, series, policy, metric, value, ci_low, ci_high."""
    rows = []
    for d in _docs(docs):
        st = setting(d)
        for metric in ("ttft_ms_mean", "ttft_ms_p99"):
            best = best_by(d, metric, exclude=(policy, BASELINE))
            series = [(policy, policy), ("best other online", best)]
            series += [(f"{p} (offline)", p) for p in offline_policies(d)]
            for name, pol in series:
                rows.append(_row(st, name, pol, speedup(d, pol, metric), metric=metric))
    return pd.DataFrame(rows)


def _row(st: dict[str, Any], series: str, policy: str, s: dict[str, Any], **extra: Any):
    """One figure row: the setting, the series and its policy, ``extra`` columns, then the
    interval ``s`` (value, ci_low, ci_high, n)."""
    return {
        "setting": st["key"],
        "label": st["label"],
        "workload": st["title"],
        "arrival": st["arrival"],
        "series": series,
        "policy": policy,
        **extra,
        "value": s["value"],
        "ci_low": s["ci95"][0],
        "ci_high": s["ci95"][1],
        "n": s["n"],
    }


def ttft_values(docs: Docs, policy: str = POLICY) -> dict[str, Any]:
    """Claim values: ``ttft_{mean,p99}_speedup_geomean`` of ``policy`` and of every other
    online policy (``<p>_ttft_..._geomean``), ``policy``'s speedup over each other online
    policy (``ttft_..._speedup_vs_<p>_geomean``), per setting ``ttft_{mean,p99}_speedup_<key>``,
    and the setting with the largest mean speedup (``best_setting``, text)."""
    ds = _docs(docs)
    out: dict[str, Any] = {}
    for metric, short in (("ttft_ms_mean", "mean"), ("ttft_ms_p99", "p99")):
        out[f"ttft_{short}_speedup_geomean"] = geomean_speedup(ds, policy, metric)
        for p in online_policies(ds[0]):
            if p not in (policy, BASELINE):
                out[f"{p}_ttft_{short}_speedup_geomean"] = geomean_speedup(ds, p, metric)
                out[f"ttft_{short}_speedup_vs_{p}_geomean"] = geomean_speedup(
                    ds, policy, metric, baseline=p
                )
        for d in ds:
            out[f"ttft_{short}_speedup_{setting(d)['key']}"] = speedup(d, policy, metric)
    keys = [setting(d)["key"] for d in ds]
    out["best_setting"] = max(keys, key=lambda k: out[f"ttft_mean_speedup_{k}"]["value"])
    out["settings"] = len(ds)
    return out


# ----------------------------------------------------------------------------------------
# hit rate against the strongest baseline


def hit_pts(doc: dict[str, Any], a: str, b: str) -> dict[str, Any]:
    """Token hit rate of ``a`` minus ``b`` in points, per seed; mean and 95% interval."""
    return interval([100 * (x - y) for x, y in paired(doc, a, b, "token_hit_rate")])


def mean_hit_pts(docs: Docs, a: str, b: str) -> dict[str, Any]:
    """Per seed the mean over settings of ``100 (hit(a) - hit(b))``; its 95% interval."""
    ds = _docs(docs)
    seeds = _seeds(ds, a, "token_hit_rate")
    per = {s: [] for s in seeds}  # type: dict[int, list[float]]
    for d in ds:
        for s, (x, y) in zip(seeds, paired(d, a, b, "token_hit_rate"), strict=True):
            per[s].append(100 * (x - y))
    return interval([_mean(per[s]) for s in seeds])


def strongest_overall(docs: Docs, exclude: Sequence[str] = (POLICY,)) -> str:
    """The online policy not in ``exclude`` with the highest token hit rate averaged over every
    setting and seed (ties: config order)."""
    ds = _docs(docs)
    cands = [p for p in online_policies(ds[0]) if p not in exclude]
    means = {
        p: _mean([_mean(list(by_seed(d, p, "token_hit_rate").values())) for d in ds]) for p in cands
    }
    return max(cands, key=lambda p: (means[p], -cands.index(p)))


def hit_rows(docs: Docs, policy: str = POLICY) -> pd.DataFrame:
    """Figure data: per setting, ``policy``'s and each offline policy's token hit rate minus
    the strongest other online policy's of that setting (named in ``baseline``), in points."""
    rows = []
    for d in _docs(docs):
        st = setting(d)
        best = best_by(d, "token_hit_rate", exclude=(policy,))
        for name, pol in [(policy, policy)] + [(f"{p} (offline)", p) for p in offline_policies(d)]:
            rows.append(_row(st, name, pol, hit_pts(d, pol, best), baseline=best))
    return pd.DataFrame(rows)


def hit_values(docs: Docs, policy: str = POLICY) -> dict[str, Any]:
    """Claim values: ``hit_pts_vs_<p>`` (mean over settings, paired per seed) against every
    other online policy, Belady's headroom over ``policy`` (``<offline>_vs_<policy>_hit_pts``),
    the strongest baseline overall (``strongest_baseline``, text), and per setting
    ``hit_pts_vs_best_<key>`` against that setting's strongest (``best_baseline_<key>``)."""
    ds = _docs(docs)
    out: dict[str, Any] = {"strongest_baseline": strongest_overall(ds, (policy,))}
    for p in online_policies(ds[0]):
        if p != policy:
            out[f"hit_pts_vs_{p}"] = mean_hit_pts(ds, policy, p)
    for p in offline_policies(ds[0]):
        out[f"{p}_vs_{policy}_hit_pts"] = mean_hit_pts(ds, p, policy)
    for d in ds:
        key = setting(d)["key"]
        best = best_by(d, "token_hit_rate", exclude=(policy,))
        out[f"best_baseline_{key}"] = best
        out[f"hit_pts_vs_best_{key}"] = hit_pts(d, policy, best)
    return out


def grid_table(docs: Docs, policy: str = POLICY) -> pd.DataFrame:
    """One row per setting: mean TTFT of vllm and ``policy`` (ms, means over seeds), the
    speedups (mean and p99) with their 95% intervals, token hit rates of ``policy``, of the
    setting's strongest other online policy and of Belady."""
    rows = []
    for d in _docs(docs):
        st = setting(d)
        best = best_by(d, "token_hit_rate", exclude=(policy,))
        sm, sp = speedup(d, policy, "ttft_ms_mean"), speedup(d, policy, "ttft_ms_p99")
        hit = {p: _mean(list(by_seed(d, p, "token_hit_rate").values())) for p in (policy, best)}
        row = {
            "workload": WORKLOAD_TITLES.get(st["workload"], st["workload"]),
            "arrival": st["arrival"],
            "vllm_ttft_ms": _mean(list(by_seed(d, BASELINE, "ttft_ms_mean").values())),
            f"{policy}_ttft_ms": _mean(list(by_seed(d, policy, "ttft_ms_mean").values())),
            "speedup_mean": sm["value"],
            "speedup_mean_ci": f"[{sm['ci95'][0]:.2f}, {sm['ci95'][1]:.2f}]",
            "speedup_p99": sp["value"],
            "speedup_p99_ci": f"[{sp['ci95'][0]:.2f}, {sp['ci95'][1]:.2f}]",
            f"{policy}_hit": hit[policy],
            "strongest_baseline": best,
            "strongest_hit": hit[best],
        }
        for p in offline_policies(d):
            row[f"{p}_hit"] = _mean(list(by_seed(d, p, "token_hit_rate").values()))
        row["seeds"] = sm["n"]
        rows.append(row)
    return pd.DataFrame(rows)


# ----------------------------------------------------------------------------------------
# ablation and fixed-parameter mismatch


def ablation_rows(doc: dict[str, Any], policy: str = POLICY) -> pd.DataFrame:
    """Per ablation variant of the run: the component it switches off, the mean-TTFT increase
    over ``policy`` in percent and the token hit rate change in points (95% intervals)."""
    rows = []
    for label, component in ABLATIONS.items():
        if label not in online_policies(doc):
            continue
        ttft = interval([100 * (v / f - 1) for v, f in paired(doc, label, policy, "ttft_ms_mean")])
        hit = hit_pts(doc, label, policy)
        rows.append(
            {
                "variant": label,
                "component": component,
                "ttft_pct": ttft["value"],
                "ttft_ci_low": ttft["ci95"][0],
                "ttft_ci_high": ttft["ci95"][1],
                "hit_pts": hit["value"],
                "hit_ci_low": hit["ci95"][0],
                "hit_ci_high": hit["ci95"][1],
                "n": ttft["n"],
            }
        )
    return pd.DataFrame(rows)


def ablation_values(doc: dict[str, Any], policy: str = POLICY) -> dict[str, Any]:
    """Claim values ``ablation_<variant>_ttft_pct`` and ``ablation_<variant>_hit_pts``."""
    out: dict[str, Any] = {}
    for r in ablation_rows(doc, policy).itertuples(index=False):
        out[f"ablation_{r.variant}_ttft_pct"] = {
            "value": r.ttft_pct,
            "ci95": [r.ttft_ci_low, r.ttft_ci_high],
            "n": r.n,
        }
        out[f"ablation_{r.variant}_hit_pts"] = {
            "value": r.hit_pts,
            "ci95": [r.hit_ci_low, r.hit_ci_high],
            "n": r.n,
        }
    return out


def _ttft_ratio(doc: dict[str, Any], a: str, b: str) -> dict[str, Any]:
    return interval([x / y for x, y in paired(doc, a, b, "ttft_ms_mean")])


def mismatch(doc: dict[str, Any], policy: str = POLICY) -> dict[str, Any] | None:
    """One mismatch run (workload B, fixed variants fitted on B and on another workload A):
    ``matched`` / ``mismatched`` (each fixed variant's mean TTFT over ``policy``'s, learning)
    and ``mismatch`` (mismatched over matched); None for a run without two fitted variants."""
    target = doc["config"]["workload"]["name"]
    fits = [p for p in online_policies(doc) if p.startswith(FIT_PREFIX)]
    other = [p for p in fits if p != FIT_PREFIX + target]
    if FIT_PREFIX + target not in fits or len(other) != 1:
        return None
    matched, mismatched = FIT_PREFIX + target, other[0]
    return {
        "target": target,
        "fitted_on": mismatched.removeprefix(FIT_PREFIX),
        "matched": _ttft_ratio(doc, matched, policy),
        "mismatched": _ttft_ratio(doc, mismatched, policy),
        "mismatch": _ttft_ratio(doc, mismatched, matched),
    }


def mismatch_rows(docs: Docs, policy: str = POLICY) -> pd.DataFrame:
    """Figure data: per mismatch run, each fixed variant's mean TTFT relative to ``policy``
    learning online (``variant`` matched: fitted on the workload it runs on; mismatched:
    fitted on ``fitted_on``)."""
    rows = []
    for d in _docs(docs):
        m = mismatch(d, policy)
        if m is None:
            continue
        for variant in ("matched", "mismatched"):
            s = m[variant]
            rows.append(
                {
                    "target": m["target"],
                    "fitted_on": m["target"] if variant == "matched" else m["fitted_on"],
                    "variant": variant,
                    "value": s["value"],
                    "ci_low": s["ci95"][0],
                    "ci_high": s["ci95"][1],
                    "n": s["n"],
                }
            )
    return pd.DataFrame(rows)


def mismatch_values(docs: Docs, policy: str = POLICY) -> dict[str, Any]:
    """Claim values per mismatch run on workload B: ``mismatch_<B>_ttft_ratio`` (fitted
    elsewhere over fitted on B), ``fixed_<B>_vs_adaptive_ttft_ratio`` and
    ``mismatched_<B>_vs_adaptive_ttft_ratio``, and the fits' source (``mismatch_<B>_fitted_on``,
    text); over all runs, ``mismatch_worst_ttft_ratio``: per seed the largest mismatch ratio
    of any run (the paper's "up to"), then its interval over seeds."""
    out: dict[str, Any] = {}
    worst: dict[int, float] = {}
    for d in _docs(docs):
        m = mismatch(d, policy)
        if m is None:
            continue
        b = m["target"]
        out[f"mismatch_{b}_ttft_ratio"] = m["mismatch"]
        out[f"fixed_{b}_vs_adaptive_ttft_ratio"] = m["matched"]
        out[f"mismatched_{b}_vs_adaptive_ttft_ratio"] = m["mismatched"]
        out[f"mismatch_{b}_fitted_on"] = m["fitted_on"]
        a, f = FIT_PREFIX + m["fitted_on"], FIT_PREFIX + b
        xa, xf = by_seed(d, a, "ttft_ms_mean"), by_seed(d, f, "ttft_ms_mean")
        if worst and set(worst) != set(xa):
            raise ValueError(f"{d['experiment']}: other seeds than the other mismatch runs")
        for s in sorted(xa):
            worst[s] = max(worst.get(s, -math.inf), xa[s] / xf[s])
    if worst:
        out["mismatch_worst_ttft_ratio"] = interval([worst[s] for s in sorted(worst)])
    return out
