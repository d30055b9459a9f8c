"""The paper's figures and tables, as library functions the notebooks in ``notebooks/`` call.

A notebook is a recipe: it runs an experiment or a replay through this module, draws with it,
saves with :func:`skv.plotstyle.save_figure` and records the numbers the paper states with
:func:`write_claims`. Nothing here simulates on its own: runs go through
:mod:`skv.experiments` (serving simulator) and :mod:`skv.replay` (cache-only replay).
Plotting functions read results documents and tables, never simulator objects. Every one takes
``highlight`` (the policies the figure is about, drawn in colour; the rest grey; ``None`` colours
all) and titles a figure with the config's human ``title``, never a raw id.
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

from skv.experiments.config import experiment_title
from skv.plotstyle import (
    DEFAULT_HIGHLIGHT,
    figure,
    highlighted,
    order_highlighted_last,
    paper_style,
    plain_ticks,
    policy_style,
    type_style,
)

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


def _wrap(text: str, width: int) -> str:
    return "\n".join(textwrap.wrap(text, width, break_on_hyphens=False)) or text


def _yerr(stats: Sequence[dict[str, Any]]) -> list[list[float]] | None:
    """Asymmetric error bars (mean - low, high - mean) from 95% intervals; None with no
    interval anywhere (one seed)."""
    lows, highs = [], []
    for st in stats:
        if st.get("ci95_low") is None or (st.get("n") or 0) < 2:
            lows.append(0.0)
            highs.append(0.0)
        else:
            lows.append(max(0.0, st["mean"] - st["ci95_low"]))
            highs.append(max(0.0, st["ci95_high"] - st["mean"]))
    return [lows, highs] if any(lows) or any(highs) else None


def _rec_key(rec: dict[str, Any]) -> tuple[str, str]:
    return rec["policy"], rec["policy_name"]


def policy_comparison(
    docs: Sequence[dict[str, Any]], highlight: Sequence[str] | None = DEFAULT_HIGHLIGHT
) -> Figure:
    """Two rows (mean TTFT, token hit rate), one column per experiment, at each experiment's
    tightest capacity; bars = across-seed mean with its 95% bootstrap interval; the dashed line
    in the hit-rate row is Belady's (offline) hit rate, the bound online policies are measured
    against. ``highlight``: the policies in colour (the rest grey, told apart by hatch)."""
    with paper_style():
        fig = figure("text", 3.9)
        axes = fig.subplots(2, len(docs), squeeze=False)
        legend: dict[str, Any] = {}
        for col, doc in enumerate(docs):
            cap = tightest_capacity(doc)
            recs = _recs(doc, cap)
            for row, (metric, ylabel) in enumerate(
                (("ttft_ms_mean", "mean TTFT (ms, sim.)"), ("token_hit_rate", "token hit rate"))
            ):
                ax = axes[row][col]
                stats = [r[metric] for r in recs]
                err = _yerr(stats)
                for i, r in enumerate(recs):
                    bars = ax.bar(
                        i,
                        stats[i]["mean"],
                        0.8,
                        yerr=None if err is None else [[err[0][i]], [err[1][i]]],
                        capsize=1.5,
                        error_kw={"elinewidth": 0.6, "ecolor": "0.2"},
                        label=_label(r),
                        **policy_style(
                            r["policy"],
                            name=r["policy_name"],
                            kind="bar",
                            offline=r["offline"],
                            highlight=highlight,
                        ),
                    )
                    legend.setdefault(_label(r), bars)
                bel = [r for r in recs if r["policy_name"] == "belady"]
                if metric == "token_hit_rate" and bel:
                    ax.axhline(bel[0][metric]["mean"], color="0.0", linestyle="--", linewidth=0.8)
                ax.set_xticks([])
                plain_ticks(ax.yaxis)
                if col == 0:
                    ax.set_ylabel(ylabel)
                if row == 0:
                    ax.set_title(_wrap(experiment_title(doc), 22), fontsize=6.5)
                else:
                    ax.set_xlabel(f"policies, capacity {cap}", fontsize=6)
        fig.legend(
            list(legend.values()),
            list(legend),
            loc="lower center",
            ncols=min(8, len(legend)),
            frameon=False,
        )
        fig.set_layout_engine("tight", rect=(0, 0.07, 1, 1))
    return fig


def evictions_by_type(
    doc: dict[str, Any],
    capacity: str | None = None,
    highlight: Sequence[str] | None = DEFAULT_HIGHLIGHT,
) -> Figure:
    """Stacked bars: mean evicted blocks per semantic type (fixed colour per type), one bar per
    policy; policies outside ``highlight`` have grey names."""
    cap = capacity or tightest_capacity(doc)
    recs = _recs(doc, cap)
    types = sorted({t for r in recs for t in r["evictions_by_type"]})
    with paper_style():
        fig = figure("column", 2.6)
        ax = fig.add_subplot()
        bottom = [0.0] * len(recs)
        for t in types:
            vals = [r["evictions_by_type"].get(t, 0.0) for r in recs]
            ax.bar(range(len(recs)), vals, 0.7, bottom=bottom, label=t, **type_style(t))
            bottom = [b + v for b, v in zip(bottom, vals, strict=True)]
        ax.set_xticks(range(len(recs)), [_label(r) for r in recs], rotation=35, ha="right")
        for tick, r in zip(ax.get_xticklabels(), recs, strict=True):
            if not highlighted(*_rec_key(r), highlight):
                tick.set_color("0.5")
        plain_ticks(ax.yaxis)
        ax.set_xlabel("policy")
        ax.set_ylabel("evicted blocks (seed mean)")
        ax.set_title(_wrap(f"{experiment_title(doc)}, capacity {cap}", 40), fontsize=7)
        if types:
            ax.legend(frameon=False, loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=6)
    return fig


def adaptive_weights(doc: dict[str, Any], capacity: str | None = None) -> Figure:
    """Learned per-type weights of the adaptive policy over simulated time (first seed); fixed
    colour and marker per semantic type, log scale with plain tick labels."""
    cap = capacity or tightest_capacity(doc)
    series = [s for s in doc["series"]["weights"] if s["capacity"] == cap]
    if not series:
        raise ValueError(f"{doc['experiment']}: no learned weights at capacity {cap}")
    s = series[0]
    keys = sorted(k for k in s if k.startswith("w_"))
    with paper_style():
        fig = figure("column", 2.7)
        ax = fig.add_subplot()
        every = max(1, len(s["time_s"]) // 12)
        for k in keys:
            style = type_style(k[2:], kind="line")
            ax.plot(s["time_s"], s[k], label=k[2:], markevery=every, **style)
        ax.set_yscale("log")
        plain_ticks(ax.yaxis, log=True)
        ax.set_xlabel("simulated time (s)")
        ax.set_ylabel("type weight (log scale)")
        ax.set_title(
            _wrap(f"{s['policy']} weights: {experiment_title(doc)}, capacity {cap}", 48),
            fontsize=7,
        )
        ax.legend(
            frameon=False, loc="upper center", bbox_to_anchor=(0.5, -0.22), ncols=3, fontsize=6
        )
    return fig


def memory_utilisation(
    doc: dict[str, Any],
    capacity: str | None = None,
    highlight: Sequence[str] | None = DEFAULT_HIGHLIGHT,
) -> Figure:
    """Cached / usable blocks over simulated time, one line per policy (first seed); the
    ``highlight`` policies in colour, drawn on top of the grey rest."""
    cap = capacity or tightest_capacity(doc)
    series = [s for s in doc["series"]["memory"] if s["capacity"] == cap and s["time_s"]]
    names = {r["policy"]: r["policy_name"] for r in doc["aggregate"]}
    offline = {r["policy"]: r["offline"] for r in doc["aggregate"]}
    series = order_highlighted_last(
        series, lambda s: (s["policy"], names.get(s["policy"])), highlight
    )
    with paper_style():
        fig = figure("column", 2.6)
        ax = fig.add_subplot()
        handles = {}
        for s in series:
            pol = s["policy"]
            style = policy_style(
                pol, name=names.get(pol), offline=offline.get(pol, False), highlight=highlight
            )
            style["markevery"] = max(1, len(s["time_s"]) // 10)
            label = f"{pol} (offline)" if offline.get(pol) else pol
            (handles[label],) = ax.plot(s["time_s"], s["utilisation"], label=label, **style)
        ax.set_ylim(0, 1.05)
        ax.set_xlabel("simulated time (s)")
        ax.set_ylabel("cache utilisation")
        ax.set_title(_wrap(f"{experiment_title(doc)}, capacity {cap}", 48), fontsize=7)
        order = [s["policy"] for s in doc["series"]["memory"] if s["capacity"] == cap]
        labels = [k for p in dict.fromkeys(order) for k in handles if k.split(" ")[0] == p]
        ax.legend(
            [handles[k] for k in labels],
            labels,
            frameon=False,
            loc="upper center",
            bbox_to_anchor=(0.5, -0.22),
            ncols=3,
            fontsize=6,
        )
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
    ``policies``, ``capacities``, ``max_requests``, ``title`` (what its figure is called;
    default: the id, humanised); its ``quick:`` mapping overrides them."""
    from skv.experiments.config import humanise_id

    data = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    allowed = {
        "id",
        "title",
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
    data["title"] = str(data.get("title") or "").strip() or humanise_id(
        str(data.get("id") or Path(path).stem)
    )
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


def hit_rate_vs_capacity(
    df: pd.DataFrame,
    title: str,
    metric: str = "block_hit_rate",
    highlight: Sequence[str] | None = DEFAULT_HIGHLIGHT,
) -> Figure:
    """One line per policy (Belady dotted, offline) and the infinite-cache ceiling (dashed);
    ``highlight`` policies in colour on top of the grey rest, legend in the trace's order.
    ``title``: the replay config's ``title``."""
    from skv.policies.registry import OFFLINE

    with paper_style():
        fig = figure("column", 2.9)
        ax = fig.add_subplot()
        policies = list(dict.fromkeys(df["policy"]))
        handles = {}
        for pol in order_highlighted_last(policies, lambda p: (p, None), highlight):
            d = df[df["policy"] == pol].sort_values("capacity_share")
            off = pol in OFFLINE
            (handles[pol],) = ax.plot(
                100 * d["capacity_share"],
                d[metric],
                label=f"{pol} (offline)" if off else pol,
                **policy_style(pol, offline=off, highlight=highlight),
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
        ax.set_title(_wrap(title, 48), fontsize=7)
        ax.legend(
            [handles[p] for p in policies],
            [handles[p].get_label() for p in policies],
            frameon=False,
            loc="upper center",
            bbox_to_anchor=(0.5, -0.25),
            ncols=3,
        )
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


def at_repo_root() -> Path:
    """Change to the repository root when a notebook runs from ``notebooks/`` (Jupyter starts
    kernels beside the notebook; the parameters' default paths are relative to the root).
    papermill runs notebooks with ``--cwd`` at the root already, so this is then a no-op."""
    import os

    cwd = Path.cwd()
    if cwd.name == "notebooks" and (cwd.parent / "experiments").is_dir():
        os.chdir(cwd.parent)
    return Path.cwd()
