"""The paper's figures and tables, as library functions the notebooks in ``notebooks/`` call.

A notebook is a recipe: it runs an experiment or a replay through this module, draws with it,
saves with :func:`skv.plotstyle.save_figure` and records the numbers the paper states with
:func:`write_claims`. Nothing here simulates on its own: runs go through
:mod:`skv.experiments` (serving simulator) and :mod:`skv.replay` (cache-only replay).
Plotting functions read results documents and tables, never simulator objects.
"""

from __future__ import annotations

import json
import math
import shutil
import textwrap
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import matplotlib.ticker
import pandas as pd
import yaml
from matplotlib.figure import Figure

from skv.plotstyle import bar_style, figure, line_style, paper_style

CLAIMS_FILE = "claims.json"


# ----------------------------------------------------------------------------------------
# claims


def write_claims(output_dir: str | Path, step: str, values: dict[str, float | None]) -> Path:
    """Write the numbers a notebook produces for ``experiments/claims.yaml`` to
    ``<output_dir>/claims.json`` (``{"step": ..., "values": {name: number}}``)."""
    out = Path(output_dir)
    out.mkdir(parents=True, exist_ok=True)
    clean = {}
    for k, v in values.items():
        clean[k] = None if v is None or (isinstance(v, float) and not math.isfinite(v)) else v
    path = out / CLAIMS_FILE
    path.write_text(json.dumps({"step": step, "values": clean}, indent=2, sort_keys=True) + "\n")
    return path


# ----------------------------------------------------------------------------------------
# the SemanticKV suite (serving simulator)


def run_suite(
    out_dir: str | Path, *, quick: bool, config_dir: str | Path = "experiments"
) -> dict[str, Path]:
    """Run the experiment suite of ``config_dir`` (``skv run-all``) into ``out_dir``, which is
    emptied first; returns experiment id -> run directory."""
    from skv.experiments import run_all

    out = Path(out_dir)
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    run_all(None, out, config_dir=config_dir, quick=quick)
    return suite_runs(out)


def suite_runs(suite_dir: str | Path) -> dict[str, Path]:
    """Experiment id -> run directory for the run directories under ``suite_dir`` (or under
    its ``suite/`` folder: the output directory of the tab_aggregate_summary step)."""
    root = Path(suite_dir)
    if (root / "suite").is_dir():
        root = root / "suite"
    runs = {}
    for d in sorted(root.iterdir()) if root.is_dir() else []:
        f = d / "results.json"
        if f.is_file():
            runs[json.loads(f.read_text(encoding="utf-8"))["experiment"]] = d
    if not runs:
        raise FileNotFoundError(f"{suite_dir}: no experiment runs (run tab_aggregate_summary)")
    return runs


def load_results(suite_dir: str | Path, experiment: str) -> dict[str, Any]:
    """The ``results.json`` document of one experiment of the suite."""
    runs = suite_runs(suite_dir)
    if experiment not in runs:
        raise KeyError(f"{suite_dir}: no run of experiment {experiment!r}; have {sorted(runs)}")
    return json.loads((runs[experiment] / "results.json").read_text(encoding="utf-8"))


def tightest_capacity(doc: dict[str, Any]) -> str:
    """The capacity with the fewest blocks (where policies differ most)."""
    blocks = {r["capacity"]: r["capacity_blocks"] for r in doc["aggregate"]}
    return min(blocks, key=lambda c: (blocks[c], c))


def _recs(doc: dict[str, Any], capacity: str) -> list[dict[str, Any]]:
    return [r for r in doc["aggregate"] if r["capacity"] == capacity]


def _label(rec: dict[str, Any]) -> str:
    return f"{rec['policy']} (offline)" if rec["offline"] else rec["policy"]


def policy_comparison(docs: Sequence[dict[str, Any]]) -> Figure:
    """Two rows (mean TTFT, token hit rate), one column per experiment, at each experiment's
    tightest capacity; bars = across-seed mean with 95% CI; the dashed line in the hit-rate row
    is Belady's (offline) hit rate, the bound online policies are measured against."""
    with paper_style():
        fig = figure("text", 3.8)
        axes = fig.subplots(2, len(docs), squeeze=False)
        for col, doc in enumerate(docs):
            cap = tightest_capacity(doc)
            recs = _recs(doc, cap)
            for row, (metric, ylabel) in enumerate(
                (("ttft_ms_mean", "mean TTFT (ms, sim.)"), ("token_hit_rate", "token hit rate"))
            ):
                ax = axes[row][col]
                for i, r in enumerate(recs):
                    s = r[metric]
                    half = 0.0 if s["ci95_high"] is None else s["ci95_high"] - s["mean"]
                    ax.bar(
                        i,
                        s["mean"],
                        0.8,
                        yerr=half,
                        capsize=1.5,
                        ecolor="0.0",
                        linewidth=0.5,
                        label=_label(r),
                        **bar_style(i, r["offline"]),
                    )
                bel = [r for r in recs if r["policy_name"] == "belady"]
                if metric == "token_hit_rate" and bel:
                    ax.axhline(bel[0][metric]["mean"], color="0.0", linestyle="--", linewidth=0.8)
                ax.set_xticks([])
                if col == 0:
                    ax.set_ylabel(ylabel)
                if row == 0:
                    name = textwrap.fill(doc["experiment"].replace("_", " "), 20)
                    ax.set_title(f"{name}\n(capacity {cap})", fontsize=6.5)
        handles, labels = axes[1][0].get_legend_handles_labels()
        fig.legend(handles, labels, loc="lower center", ncols=min(8, len(labels)), frameon=False)
        fig.set_layout_engine("tight", rect=(0, 0.07, 1, 1))
    return fig


def evictions_by_type(doc: dict[str, Any], capacity: str | None = None) -> Figure:
    """Stacked bars: mean evicted blocks per semantic type, one bar per policy."""
    cap = capacity or tightest_capacity(doc)
    recs = _recs(doc, cap)
    types = sorted({t for r in recs for t in r["evictions_by_type"]})
    with paper_style():
        fig = figure("column", 2.4)
        ax = fig.add_subplot()
        bottom = [0.0] * len(recs)
        for k, t in enumerate(types):
            vals = [r["evictions_by_type"].get(t, 0.0) for r in recs]
            ax.bar(
                range(len(recs)), vals, 0.7, bottom=bottom, label=t, linewidth=0.5, **bar_style(k)
            )
            bottom = [b + v for b, v in zip(bottom, vals, strict=True)]
        ax.set_xticks(range(len(recs)), [_label(r) for r in recs], rotation=35, ha="right")
        ax.set_ylabel("evicted blocks")
        ax.set_title(f"{doc['experiment']} (capacity {cap})", fontsize=7)
        ax.legend(frameon=False, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    return fig


def adaptive_weights(doc: dict[str, Any], capacity: str | None = None) -> Figure:
    """Learned per-type weights of the adaptive policy over simulated time (first seed)."""
    cap = capacity or tightest_capacity(doc)
    series = [s for s in doc["series"]["weights"] if s["capacity"] == cap]
    if not series:
        raise ValueError(f"{doc['experiment']}: no learned weights at capacity {cap}")
    s = series[0]
    keys = sorted(k for k in s if k.startswith("w_"))
    with paper_style():
        fig = figure("column", 2.3)
        ax = fig.add_subplot()
        every = max(1, len(s["time_s"]) // 12)
        for i, k in enumerate(keys):
            ax.plot(s["time_s"], s[k], label=k[2:], markevery=every, **line_style(i))
        ax.set_yscale("log")
        ax.set_xlabel("simulated time (s)")
        ax.set_ylabel("type weight")
        ax.set_title(f"{s['policy']}, {doc['experiment']} (capacity {cap})", fontsize=7)
        ax.legend(frameon=False, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    return fig


def memory_utilisation(doc: dict[str, Any], capacity: str | None = None) -> Figure:
    """Cached / usable blocks over simulated time, one line per policy (first seed)."""
    cap = capacity or tightest_capacity(doc)
    series = [s for s in doc["series"]["memory"] if s["capacity"] == cap and s["time_s"]]
    offline = {r["policy"]: r["offline"] for r in doc["aggregate"]}
    with paper_style():
        fig = figure("column", 2.3)
        ax = fig.add_subplot()
        for i, s in enumerate(series):
            style = {**line_style(i, offline.get(s["policy"], False))}
            style["markevery"] = max(1, len(s["time_s"]) // 10)
            ax.plot(s["time_s"], s["utilisation"], label=s["policy"], **style)
        ax.set_ylim(0, 1.05)
        ax.set_xlabel("simulated time (s)")
        ax.set_ylabel("cache utilisation")
        ax.set_title(f"{doc['experiment']} (capacity {cap})", fontsize=7)
        ax.legend(frameon=False, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    return fig


def aggregate_table(suite_dir: str | Path) -> pd.DataFrame:
    """The suite's ``aggregate_summary.csv`` as a DataFrame."""
    return pd.read_csv(Path(suite_dir) / "aggregate_summary.csv")


def write_table(df: pd.DataFrame, out_dir: str | Path, name: str, digits: int = 3) -> list[Path]:
    """``name.csv`` and a booktabs ``name.tex`` (no jinja2 needed)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    csv_path, tex_path = out / f"{name}.csv", out / f"{name}.tex"
    df.to_csv(csv_path, index=False, lineterminator="\n")

    def cell(v: Any) -> str:
        if isinstance(v, float):
            return "--" if not math.isfinite(v) else f"{v:.{digits}f}"
        return str(v).replace("_", r"\_").replace("%", r"\%")

    lines = [
        r"\begin{tabular}{" + "l" * len(df.columns) + "}",
        r"\toprule",
        " & ".join(cell(c) for c in df.columns) + r" \\",
        r"\midrule",
        *(" & ".join(cell(v) for v in row) + r" \\" for row in df.itertuples(index=False)),
        r"\bottomrule",
        r"\end{tabular}",
    ]
    tex_path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return [csv_path, tex_path]


# ----------------------------------------------------------------------------------------
# real traces (cache-only replay)


def load_replay_config(path: str | Path, *, quick: bool) -> dict[str, Any]:
    """A replay config (``experiments/replay/*.yaml``): ``trace``, ``format_options``,
    ``policies``, ``capacities``, ``max_requests``; its ``quick:`` mapping overrides them."""
    data = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    allowed = {
        "id",
        "description",
        "trace",
        "format_options",
        "policies",
        "capacities",
        "max_requests",
        "reuse_policy",
        "reuse_capacity",
        "quick",
    }
    unknown = set(data) - allowed
    if unknown:
        raise ValueError(f"{path}: unknown keys {sorted(unknown)}; allowed: {sorted(allowed)}")
    over = data.pop("quick", None) or {}
    if quick:
        data.update(over)
    data.setdefault("format_options", {})
    data.setdefault("max_requests", None)
    return data


def load_real_trace(name: str, *, max_requests: int | None = None, **options: Any) -> list:
    """Requests of a real trace found through :func:`skv.traces.find_trace` (raises
    FileNotFoundError saying where to get it); the first ``max_requests`` in arrival order."""
    from skv.traces import find_trace, load_trace

    reqs = load_trace(find_trace(name), **options)
    return reqs[:max_requests] if max_requests else reqs


def capacity_curve(
    requests: Sequence, policies: Sequence[str], capacities: Sequence[str]
) -> pd.DataFrame:
    """Cache-only replay of every policy at every capacity: one row per (capacity, policy)
    with ``capacity_share`` (of the trace's unique blocks), hit rates and the ceiling."""
    from skv.replay import compile_trace, replay_trace

    trace = compile_trace(requests)
    rows = replay_trace(trace, policies, capacities, progress=False)
    df = pd.DataFrame(
        [{k: v for k, v in r.items() if not isinstance(v, dict | list)} for r in rows]
    )
    df["capacity_share"] = [_share(c) for c in df["capacity"]]
    return df


def _share(spec: str) -> float:
    s = str(spec).strip()
    if not s.endswith("%"):
        raise ValueError(f"capacity {spec!r}: hit-rate curves need shares like '10%'")
    return float(s[:-1]) / 100.0


def hit_rate_vs_capacity(df: pd.DataFrame, title: str, metric: str = "block_hit_rate") -> Figure:
    """One line per policy (Belady dotted, offline) and the infinite-cache ceiling (dashed)."""
    from skv.policies.registry import OFFLINE

    with paper_style():
        fig = figure("column", 2.9)
        ax = fig.add_subplot()
        policies = list(dict.fromkeys(df["policy"]))
        for i, pol in enumerate(policies):
            d = df[df["policy"] == pol].sort_values("capacity_share")
            off = pol in OFFLINE
            ax.plot(
                100 * d["capacity_share"],
                d[metric],
                label=f"{pol} (offline)" if off else pol,
                **line_style(i, off),
            )
        ceiling = float(df[f"ceiling_{metric}"].iloc[0])
        ax.axhline(ceiling, color="0.0", linestyle="--", linewidth=0.8)
        ax.text(
            0.01,
            ceiling,
            "infinite cache",
            transform=ax.get_yaxis_transform(),
            fontsize=6,
            va="bottom",
        )
        shares = sorted(set(df["capacity_share"]))
        ax.set_xscale("log")
        ax.set_xticks([100 * s for s in shares], [f"{100 * s:g}" for s in shares])
        ax.xaxis.set_minor_locator(matplotlib.ticker.NullLocator())
        ax.set_ylim(0, None)
        ax.set_xlabel("capacity (% of unique blocks)")
        ax.set_ylabel(metric.replace("_", " "))
        ax.set_title(title, fontsize=7)
        ax.legend(frameon=False, loc="upper center", bbox_to_anchor=(0.5, -0.25), ncols=3)
    return fig


def curve_value(df: pd.DataFrame, policy: str, capacity: str, metric: str = "block_hit_rate"):
    """One cell of a capacity curve (None when that row was not run)."""
    d = df[(df["policy"] == policy) & (df["capacity"] == capacity)]
    return None if d.empty else float(d[metric].iloc[0])


def reuse_by_type(requests: Sequence, block_size: int | None = None) -> pd.DataFrame:
    """Per semantic type: prompt tokens, their share, and the share an infinite prefix cache
    would serve (a block reused along its chain, the ceiling of :func:`skv.replay.trace_totals`),
    the analogue of SAECache's reuse-by-token-type table. Sorted by tokens, descending."""
    from skv.model import TYPES
    from skv.replay import compile_trace

    trace = compile_trace(requests, block_size)
    tokens = [0] * len(TYPES)
    reused = [0] * len(TYPES)
    seen: set[int] = set()
    for rb in trace:
        in_run = False
        for key, parent, tok, st in zip(rb.keys, rb.parents, rb.tokens, rb.stypes, strict=True):
            tokens[st] += tok
            if parent is None:
                in_run = True
            if in_run and key in seen:
                reused[st] += tok
            else:
                in_run = False
                seen.add(key)
    total = sum(tokens) or 1
    rows = [
        {
            "semantic_type": TYPES[i].value,
            "prompt_tokens": tokens[i],
            "token_share": tokens[i] / total,
            "reused_tokens": reused[i],
            "reuse_rate": reused[i] / tokens[i],
        }
        for i in range(len(TYPES))
        if tokens[i]
    ]
    return pd.DataFrame(rows).sort_values("prompt_tokens", ascending=False, ignore_index=True)


def hit_rate_by_type(requests: Sequence, policy: str, capacity: str) -> dict[str, float]:
    """Token hit rate per semantic type of one policy at one capacity (cache-only replay)."""
    from skv.replay import compile_trace, replay_trace

    rows = replay_trace(compile_trace(requests), [policy], [capacity], progress=False)
    return dict(rows[0]["hit_rate_by_type"])
