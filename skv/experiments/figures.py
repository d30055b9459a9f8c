"""Figures of one simulated experiment's results document, one function per figure.

Each function reads a ``results.json`` document (never simulator objects), draws in the paper
style of :mod:`skv.experiments.plotstyle` and returns the Figure. Two callers share them: a
run's own plots (:func:`write_plots`, every capacity, with a footnote naming the latency model,
written beside ``results.json``) and the paper's notebooks (the tightest capacity by default,
saved with :func:`skv.experiments.plotstyle.save_figure`).

Comparison figures follow :class:`~skv.experiments.plotstyle.Comparison`: the method under
study (``method``, default adaptive_semantic, the SemanticKV thesis) in its colour, drawn on top
and first in the legend, the other policies grey (told apart by marker or hatch), offline
bounds (Belady) dashed and labelled "(offline)". Error bars are 95%
bootstrap intervals of the across-seed mean (:mod:`skv.experiments.stats`).
"""

from __future__ import annotations

import textwrap
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from matplotlib.figure import Figure

from skv.experiments.config import experiment_title
from skv.experiments.outputs import PLOTS
from skv.experiments.plotstyle import (
    Comparison,
    check_figure,
    exempt_axes,
    figure,
    paper_style,
    plain_ticks,
    type_style,
    wrap_title,
)

#: the policy the SemanticKV figures are about
METHOD = "adaptive_semantic"


def tightest_capacity(doc: dict[str, Any]) -> str:
    """The capacity with the fewest blocks (where policies differ most)."""
    blocks = {r["capacity"]: r["capacity_blocks"] for r in doc["aggregate"]}
    return min(blocks, key=lambda c: (blocks[c], c))


def capacities(doc: dict[str, Any]) -> list[str]:
    """Every capacity of the experiment, in config order."""
    return [str(c) for c in doc["config"]["capacities"]]


def _policies(doc: dict[str, Any]) -> list[tuple[str, bool]]:
    seen: dict[str, bool] = {}
    for r in doc["aggregate"]:
        seen.setdefault(r["policy"], r["offline"])
    return list(seen.items())


def _names(doc: dict[str, Any]) -> dict[str, str]:
    return {r["policy"]: r["policy_name"] for r in doc["aggregate"]}


def simulated_note(doc: dict[str, Any]) -> str:
    """What a simulated run's figure says it is: simulated, and by which latency model."""
    return f"simulated; latency model {doc['latency'].get('model', '?')}"


def policy_label(policy: str, offline: bool) -> str:
    return f"{policy} (offline)" if offline else policy


def yerr(stats: Sequence[dict[str, Any] | None]) -> list[list[float]] | None:
    """Asymmetric error bars (mean - low, high - mean) from 95% intervals; None with no
    interval anywhere (one seed)."""
    lows, highs = [], []
    for st in stats:
        if not st or st.get("ci95_low") is None or (st.get("n") or 0) < 2:
            lows.append(0.0)
            highs.append(0.0)
        else:
            lows.append(max(0.0, st["mean"] - st["ci95_low"]))
            highs.append(max(0.0, st["ci95_high"] - st["mean"]))
    return [lows, highs] if any(lows) or any(highs) else None


def bar_by_policy(
    doc: dict[str, Any],
    metric: str,
    ylabel: str,
    title: str,
    method: str = METHOD,
) -> Figure:
    """Grouped bars: one group per capacity, one bar per policy (``method`` coloured and first,
    the rest grey); error bars = the 95% bootstrap interval of the across-seed mean (asymmetric;
    never below the smallest seed's value)."""
    cmp = Comparison(method)
    pols = cmp.legend_order(_policies(doc), lambda po: (po[0], _names(doc).get(po[0])))
    names = _names(doc)
    caps = capacities(doc)
    recs = {(r["capacity"], r["policy"]): r for r in doc["aggregate"]}
    width = 0.8 / max(len(pols), 1)
    with paper_style():
        fig = figure(max(4.5, 1.0 + 0.25 * len(pols) * len(caps)), 3.0)
        ax = fig.add_subplot()
        handles, labels = [], []
        for i, (pol, offline) in enumerate(pols):
            xs, stats = [], []
            for j, cap in enumerate(caps):
                r = recs.get((cap, pol))
                if r is None or r[metric]["mean"] is None:
                    continue
                xs.append(j - 0.4 + width * (i + 0.5))
                stats.append(r[metric])
            bars = ax.bar(
                xs,
                [s["mean"] for s in stats],
                width * 0.92,
                yerr=yerr(stats),
                capsize=1.5,
                error_kw={"elinewidth": 0.6, "ecolor": "0.2"},
                label=policy_label(pol, offline),
                **cmp.style(pol, name=names.get(pol), kind="bar"),
            )
            handles.append(bars)
            labels.append(policy_label(pol, offline))
        ax.set_xticks(range(len(caps)), [f"capacity {c}" for c in caps])
        ax.set_xlabel("cache capacity per replica")
        ax.set_ylabel(ylabel)
        plain_ticks(ax.yaxis)
        what = f"{title}: {experiment_title(doc)} ({simulated_note(doc)})"
        ax.set_title(wrap_title(what, max(40, int(fig.get_figwidth() * 13))), fontsize=7)
        # the legend sits under the axes, centred on them (not on the canvas: the y label
        # shifts them right); fewer columns until it fits in 80% of the canvas' width
        for ncols in range(min(4, len(pols)), 0, -1):
            leg = cmp.legend(ax, handles, labels, ncols=ncols, loc="upper center",
                             bbox_to_anchor=(0.5, -0.18), frameon=False)  # fmt: skip
            width = leg.get_window_extent(fig.canvas.get_renderer()).width
            if ncols == 1 or width <= 0.8 * fig.bbox.width:
                break
            leg.remove()
    return fig


def evictions_by_type(
    doc: dict[str, Any],
    capacities_: Sequence[str] | None = None,
    method: str = METHOD,
) -> Figure:
    """Stacked bars: mean evicted blocks per semantic type (fixed colour per type), one bar per
    policy, one panel per capacity (default: the tightest); the policies other than ``method``
    have grey names."""
    cmp = Comparison(method)
    caps = list(capacities_ or [tightest_capacity(doc)])
    pols = _policies(doc)
    names = _names(doc)
    types = sorted(
        {t for r in doc["aggregate"] if r["capacity"] in caps for t in r["evictions_by_type"]}
    )
    with paper_style():
        fig = figure("column" if len(caps) == 1 else "text", 2.6)
        axes = fig.subplots(1, len(caps), squeeze=False, sharey=True)[0]
        for ax, cap in zip(axes, caps, strict=True):
            recs = {r["policy"]: r for r in doc["aggregate"] if r["capacity"] == cap}
            shown = [(p, o) for p, o in pols if p in recs]
            bottom = [0.0] * len(shown)
            for t in types:
                vals = [recs[p]["evictions_by_type"].get(t, 0.0) for p, _ in shown]
                ax.bar(range(len(shown)), vals, 0.7, bottom=bottom, label=t, **type_style(t))
                bottom = [b + v for b, v in zip(bottom, vals, strict=True)]
            ax.set_xticks(
                range(len(shown)), [policy_label(p, o) for p, o in shown], rotation=35, ha="right"
            )
            for tick, (p, _) in zip(ax.get_xticklabels(), shown, strict=True):
                if cmp.role(p, names.get(p)) != "method":
                    tick.set_color("0.5")
            ax.set_xlabel("policy")
            if len(caps) > 1:
                ax.set_title(f"capacity {cap}", fontsize=7)
        plain_ticks(axes[0].yaxis)
        axes[0].set_ylabel("evicted blocks (seed mean)")
        title = (
            experiment_title(doc)
            if len(caps) > 1
            else f"{experiment_title(doc)}, capacity {caps[0]}"
        )
        if len(caps) > 1:
            fig.suptitle(wrap_title(f"Evictions by semantic type: {title}", 90), fontsize=8)
        else:
            axes[0].set_title(wrap_title(title, 40), fontsize=7)
        if types:
            axes[-1].legend(frameon=False, loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=6)
        else:
            axes[0].text(0.5, 0.5, "no evictions", transform=axes[0].transAxes, ha="center")
    return fig


def has_learned_weights(doc: dict[str, Any]) -> bool:
    return any(k.startswith("w_") for s in doc["series"]["weights"] for k in s)


def adaptive_weights(doc: dict[str, Any], capacity: str | None = None) -> Figure:
    """Learned per-type weights of the adaptive policy over simulated time (first seed, first
    adaptive entry at ``capacity``, default the tightest); fixed colour and marker per semantic
    type, log scale with plain tick labels."""
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
            wrap_title(f"{s['policy']} weights: {experiment_title(doc)}, capacity {cap}", 48),
            fontsize=7,
        )
        ax.legend(
            frameon=False, loc="upper center", bbox_to_anchor=(0.5, -0.22), ncols=3, fontsize=6
        )
    return fig


def memory_utilisation(
    doc: dict[str, Any],
    capacities_: Sequence[str] | None = None,
    method: str = METHOD,
    *,
    pinned: bool = False,
) -> Figure:
    """Cached / usable blocks over simulated time, one line per policy (first seed, mean over
    replicas), one row per capacity (default: the tightest); with ``pinned`` a second column
    shows the share of the capacity pinned by running requests. ``method`` in colour, drawn on
    top of the grey rest and first in the legend; Belady dashed."""
    cmp = Comparison(method)
    caps = list(capacities_ or [tightest_capacity(doc)])
    pols = _policies(doc)
    names = _names(doc)
    offline = dict(pols)
    series = {(s["capacity"], s["policy"]): s for s in doc["series"]["memory"] if s["time_s"]}
    drawn = cmp.draw_order([p for p, _ in pols], lambda p: (p, names.get(p)))
    cols = 2 if pinned else 1
    with paper_style():
        fig = figure("column" if cols == 1 else "text", 2.0 * len(caps) + 0.6)
        axes = fig.subplots(len(caps), cols, squeeze=False, sharex=True)
        handles: dict[str, Any] = {}
        for row, cap in zip(axes, caps, strict=True):
            for pol in drawn:
                s = series.get((cap, pol))
                if s is None:
                    continue
                style = {
                    **cmp.style(pol, name=names.get(pol)),
                    "markevery": max(1, len(s["time_s"]) // 10),
                }
                label = policy_label(pol, offline[pol])
                (line,) = row[0].plot(s["time_s"], s["utilisation"], label=label, **style)
                handles.setdefault(label, line)
                if pinned and "pinned_share" in s:
                    row[1].plot(s["time_s"], s["pinned_share"], **style)
            for ax in row:
                ax.set_ylim(0, 1.05)
            row[0].set_ylabel("cache utilisation" if len(caps) == 1 else f"utilisation\n({cap})")
            if pinned:
                row[1].set_ylabel("pinned share")
        for ax in axes[-1]:
            ax.set_xlabel("simulated time (s)")
        where = f", capacity {caps[0]}" if len(caps) == 1 else ""
        axes[0][0].set_title(
            wrap_title(f"{experiment_title(doc)}{where} ({simulated_note(doc)})", 48), fontsize=7
        )
        if pinned:
            axes[0][1].set_title("pinned by running requests / capacity", fontsize=7)
        labels = [policy_label(p, o) for p, o in pols if policy_label(p, o) in handles]
        where = (
            {"loc": "upper center", "bbox_to_anchor": (0.5, -0.22), "ncols": 3}
            if axes.size == 1
            else {"loc": "upper left", "bbox_to_anchor": (1.0, 1.0)}
        )
        cmp.legend(
            axes[0][-1], [handles[k] for k in labels], labels, frameon=False, fontsize=6, **where
        )
    return fig


# ----------------------------------------------------------------------------------------
# a run's own plots


def _footnote(fig: Figure, doc: dict[str, Any], extra: str = "") -> None:
    """The latency-model note under the figure, wrapped to the figure's width by hand
    (``wrap=True`` text has no extent before drawing, so the canvas check cannot see it); the
    bottom margin the layout leaves grows with the number of lines."""
    model = doc["latency"].get("model", "?")
    text = (
        f"{experiment_title(doc)} ({doc['experiment']}): simulated by the '{model}' latency "
        "model (not measured)"
    )
    if doc.get("quick"):
        text += "; QUICK run (scaled down)"
    if extra:
        text += f"; {extra}"
    lines = textwrap.wrap(text, max(40, int(fig.get_figwidth() * 72 / (5.5 * 0.56))))
    fig.text(0.01, 0.01, "\n".join(lines), fontsize=5.5, color="0.3", ha="left", va="bottom")
    bottom = (0.06 + len(lines) * 5.5 * 1.25 / 72) / fig.get_figheight()
    engine = fig.get_layout_engine()
    rect = engine.get()["rect"] if engine is not None and "rect" in engine.get() else (0, 0, 1, 1)
    fig.set_layout_engine("tight", rect=(rect[0], rect[1] + bottom, rect[2], rect[3]))


def _save(fig: Figure, path: Path) -> None:
    """Check (:func:`check_figure`), then write the PNG (no timestamp in the metadata)."""
    with paper_style():
        check_figure(fig, path.name)
        fig.savefig(path, format="png", metadata={"Software": None})


def _no_weights(doc: dict[str, Any]) -> Figure:
    with paper_style():
        fig = figure("column", 1.6)
        ax = fig.add_subplot()
        ax.axis("off")
        exempt_axes(ax, "a text panel")
        ax.text(
            0.5,
            0.5,
            "no adaptive policy in this experiment\n(no learned weights)",
            ha="center",
            va="center",
            transform=ax.transAxes,
        )
    return fig


def write_plots(doc: dict[str, Any], out_dir: Path, method: str = METHOD) -> list[Path]:
    """The six PNGs of one run (every capacity); ``method``: the policy drawn in colour."""
    out_dir = Path(out_dir)
    model = doc["latency"].get("model", "?")
    caps = capacities(doc)
    n = max((r["n_seeds"] for r in doc["aggregate"]), default=1)
    bars = f"error bars: 95% bootstrap CI over {n} seeds" if n > 1 else "one seed"
    figs = {
        "ttft": (
            bar_by_policy(
                doc,
                "ttft_ms_mean",
                f"mean TTFT (ms, simulated: {model})",
                "Mean TTFT by policy",
                method,
            ),
            bars,
        ),
        "hit": (
            bar_by_policy(
                doc,
                "token_hit_rate",
                "prompt-token hit rate",
                "Cache hit rate by policy",
                method,
            ),
            bars,
        ),
        "saved": (
            bar_by_policy(
                doc,
                "cached_tokens",
                "prompt tokens served from cache",
                "Tokens saved (prefill skipped)",
                method,
            ),
            bars,
        ),
        "evict": (evictions_by_type(doc, caps, method), ""),
        "weights": (adaptive_weights(doc) if has_learned_weights(doc) else _no_weights(doc), ""),
        "memory": (memory_utilisation(doc, caps, method, pinned=True), ""),
    }
    paths = []
    for key, (fig, extra) in figs.items():
        _footnote(fig, doc, extra)
        path = out_dir / PLOTS[key]
        _save(fig, path)
        paths.append(path)
    return paths
