"""The six experiment plots: PNG, Agg canvas (no pyplot state), one colour-blind-safe style.

Policies keep one colour and marker/hatch per name in every figure (:mod:`skv.plotstyle`); the
policies a figure is about (``highlight``, default adaptive_semantic, lru and belady) are in
colour, the rest grey. Offline reference policies (Belady) are cross-hatched and labelled
"(offline)". Error bars are the 95% bootstrap intervals of :mod:`skv.experiments.stats`. Every
figure carries the experiment's title and a footnote naming the latency model that simulated
its numbers, and passes :func:`skv.plotstyle.check_figure` before it is written.
"""

from __future__ import annotations

import textwrap
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import matplotlib
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from skv.experiments.outputs import PLOTS
from skv.plotstyle import (
    DEFAULT_HIGHLIGHT,
    STYLE,
    check_figure,
    highlighted,
    order_highlighted_last,
    plain_ticks,
    policy_style,
    type_style,
)


def _figure(width: float = 7.0, height: float = 3.8) -> Figure:
    fig = Figure(figsize=(width, height))
    FigureCanvasAgg(fig)
    return fig


def _title(doc: dict[str, Any]) -> str:
    from skv.experiments.config import experiment_title

    return experiment_title(doc)


def _footnote(fig: Figure, doc: dict[str, Any], extra: str = "") -> None:
    """The latency-model note under the figure, wrapped to the figure's width by hand
    (``wrap=True`` text has no extent before drawing, so the canvas check cannot see it); the
    bottom margin the layout leaves grows with the number of lines."""
    model = doc["latency"].get("model", "?")
    text = (
        f"{_title(doc)} ({doc['experiment']}): simulated by the '{model}' latency model "
        "(not measured)"
    )
    if doc.get("quick"):
        text += "; QUICK run (scaled down)"
    if extra:
        text += f"; {extra}"
    width_in = fig.get_figwidth()
    lines = textwrap.wrap(text, max(40, int(width_in * 72 / (6.5 * 0.56))))
    fig.text(0.01, 0.01, "\n".join(lines), fontsize=6.5, color="0.3", ha="left", va="bottom")
    fig._skv_footnote_lines = len(lines)  # type: ignore[attr-defined]


def _save(fig: Figure, path: Path) -> None:
    """Lay out (leaving room for the footnote), check (:func:`check_figure`), write the PNG."""
    lines = getattr(fig, "_skv_footnote_lines", 1)
    bottom = (0.06 + lines * 6.5 * 1.25 / 72) / fig.get_figheight()
    fig.tight_layout(rect=(0, bottom, 1, 1))
    check_figure(fig, path.name)
    fig.savefig(path, format="png", metadata={"Software": None})


def _policies(doc: dict[str, Any]) -> list[tuple[str, bool]]:
    seen: dict[str, bool] = {}
    for r in doc["aggregate"]:
        seen.setdefault(r["policy"], r["offline"])
    return list(seen.items())


def _names(doc: dict[str, Any]) -> dict[str, str]:
    return {r["policy"]: r["policy_name"] for r in doc["aggregate"]}


def _caps(doc: dict[str, Any]) -> list[str]:
    return [str(c) for c in doc["config"]["capacities"]]


def _label(policy: str, offline: bool) -> str:
    return f"{policy} (offline)" if offline else policy


def bar_by_policy(
    doc: dict[str, Any],
    metric: str,
    ylabel: str,
    title: str,
    path: Path,
    highlight: Sequence[str] | None = DEFAULT_HIGHLIGHT,
) -> None:
    """Grouped bars: one group per capacity, one bar per policy; error bars = the 95% bootstrap
    interval of the across-seed mean (asymmetric; never below the smallest seed's value)."""
    pols = _policies(doc)
    names = _names(doc)
    caps = _caps(doc)
    recs = {(r["capacity"], r["policy"]): r for r in doc["aggregate"]}
    width = 0.8 / max(len(pols), 1)
    with matplotlib.rc_context(STYLE):
        fig = _figure(max(6.5, 1.2 + 0.35 * len(pols) * len(caps)), 4.1)
        ax = fig.add_subplot()
        for i, (pol, offline) in enumerate(pols):
            xs: list[float] = []
            ys: list[float] = []
            lows: list[float] = []
            highs: list[float] = []
            for j, cap in enumerate(caps):
                r = recs.get((cap, pol))
                if r is None or r[metric]["mean"] is None:
                    continue
                s = r[metric]
                xs.append(j - 0.4 + width * (i + 0.5))
                ys.append(s["mean"])
                has_ci = s.get("ci95_low") is not None and (s.get("n") or 0) > 1
                lows.append(max(0.0, s["mean"] - s["ci95_low"]) if has_ci else 0.0)
                highs.append(max(0.0, s["ci95_high"] - s["mean"]) if has_ci else 0.0)
            ax.bar(
                xs,
                ys,
                width * 0.92,
                yerr=[lows, highs] if any(lows) or any(highs) else None,
                capsize=2,
                error_kw={"elinewidth": 0.8, "ecolor": "0.2"},
                label=_label(pol, offline),
                **policy_style(
                    pol, name=names.get(pol), kind="bar", offline=offline, highlight=highlight
                ),
            )
        ax.set_xticks(range(len(caps)), [f"capacity {c}" for c in caps])
        ax.set_xlabel("cache capacity per replica")
        ax.set_ylabel(ylabel)
        plain_ticks(ax.yaxis)
        ax.set_title(f"{title}: {_title(doc)}")
        ax.legend(
            ncols=min(4, len(pols)), loc="upper center", bbox_to_anchor=(0.5, -0.16), frameon=False
        )
        n = max((r["n_seeds"] for r in doc["aggregate"]), default=1)
        _footnote(fig, doc, f"error bars: 95% bootstrap CI over {n} seeds" if n > 1 else "one seed")
        _save(fig, path)


def evictions_by_type(
    doc: dict[str, Any], path: Path, highlight: Sequence[str] | None = DEFAULT_HIGHLIGHT
) -> None:
    """Stacked bars per policy: mean evictions of each semantic type (fixed colour per type),
    one panel per capacity; policies outside ``highlight`` have grey names."""
    pols = _policies(doc)
    names = _names(doc)
    caps = _caps(doc)
    types = sorted({t for r in doc["aggregate"] for t in r["evictions_by_type"]})
    with matplotlib.rc_context(STYLE):
        fig = _figure(max(6.0, 1.5 + 0.5 * len(pols) * len(caps)), 4.4)
        axes = fig.subplots(1, len(caps), squeeze=False, sharey=True)[0]
        for ax, cap in zip(axes, caps, strict=True):
            recs = {r["policy"]: r for r in doc["aggregate"] if r["capacity"] == cap}
            bottom = [0.0] * len(pols)
            for t in types:
                vals = [
                    recs[p]["evictions_by_type"].get(t, 0.0) if p in recs else 0.0 for p, _ in pols
                ]
                ax.bar(range(len(pols)), vals, 0.7, bottom=bottom, label=t, **type_style(t))
                bottom = [b + v for b, v in zip(bottom, vals, strict=True)]
            ax.set_xticks(
                range(len(pols)), [_label(p, o) for p, o in pols], rotation=35, ha="right"
            )
            for tick, (p, _) in zip(ax.get_xticklabels(), pols, strict=True):
                if not highlighted(p, names.get(p), highlight):
                    tick.set_color("0.5")
            ax.set_title(f"capacity {cap}")
            ax.set_xlabel("policy")
        axes[0].set_ylabel("evicted blocks (mean over seeds)")
        plain_ticks(axes[0].yaxis)
        if types:
            axes[-1].legend(
                title="semantic type", loc="upper left", bbox_to_anchor=(1.0, 1.0), frameon=False
            )
        else:
            axes[0].text(0.5, 0.5, "no evictions", transform=axes[0].transAxes, ha="center")
        fig.suptitle(f"Evictions by semantic type: {_title(doc)}", fontsize=10)
        _footnote(fig, doc)
        _save(fig, path)


def adaptive_weights(doc: dict[str, Any], path: Path) -> None:
    """Learned per-type weights over simulated time (first seed; one panel per adaptive entry
    at the most constrained capacity); fixed colour and marker per semantic type."""
    series = [s for s in doc["series"]["weights"] if any(k.startswith("w_") for k in s)]
    caps = _caps(doc)
    blocks = {r["capacity"]: r["capacity_blocks"] for r in doc["aggregate"]}
    with matplotlib.rc_context(STYLE):
        if not series:
            fig = _figure(6.0, 3.0)
            ax = fig.add_subplot()
            ax.axis("off")
            ax.text(
                0.5,
                0.5,
                "no adaptive policy in this experiment\n(no learned weights)",
                ha="center",
                va="center",
                transform=ax.transAxes,
            )
            _footnote(fig, doc)
            _save(fig, path)
            return
        tight = min(caps, key=lambda c: (blocks.get(c, 0), caps.index(c)))
        chosen = [s for s in series if s["capacity"] == tight] or series[:1]
        fig = _figure(7.0, 3.2 * len(chosen) + 0.9)
        axes = fig.subplots(len(chosen), 1, squeeze=False)[:, 0]
        for ax, s in zip(axes, chosen, strict=True):
            keys = sorted(k for k in s if k.startswith("w_"))
            every = max(1, len(s["time_s"]) // 15)
            for k in keys:
                style = type_style(k[2:], kind="line")
                ax.plot(s["time_s"], s[k], label=k[2:], markevery=every, **style)
            ax.set_title(
                f"{s['policy']}: learned type weights (capacity {s['capacity']}, "
                f"seed {doc['series']['seed']}, replica 0)",
                fontsize=9,
            )
            ax.set_ylabel("weight (log scale)")
            ax.set_yscale("log")
            plain_ticks(ax.yaxis, log=True)
            ax.grid(True, axis="both", which="major")
            ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), frameon=False)
        axes[-1].set_xlabel("simulated time (s)")
        fig.suptitle(f"Learned weights: {_title(doc)}", fontsize=10)
        _footnote(fig, doc)
        _save(fig, path)


def memory_utilisation(
    doc: dict[str, Any], path: Path, highlight: Sequence[str] | None = DEFAULT_HIGHLIGHT
) -> None:
    """Per capacity (rows): cache utilisation (cached / usable blocks) and the share of the
    capacity pinned by running requests, over simulated time (first seed, mean over replicas);
    ``highlight`` policies in colour on top of the grey rest."""
    caps = _caps(doc)
    pols = _policies(doc)
    names = _names(doc)
    drawn = order_highlighted_last(pols, lambda po: (po[0], names.get(po[0])), highlight)
    series = {(s["capacity"], s["policy"]): s for s in doc["series"]["memory"]}
    with matplotlib.rc_context(STYLE):
        fig = _figure(9.0, 2.4 * len(caps) + 1.2)
        axes = fig.subplots(len(caps), 2, squeeze=False, sharex=True)
        handles: dict[str, Any] = {}
        for row, cap in zip(axes, caps, strict=True):
            for pol, offline in drawn:
                s = series.get((cap, pol))
                if not s or not s["time_s"]:
                    continue
                style = {
                    **policy_style(pol, name=names.get(pol), offline=offline, highlight=highlight),
                    "markevery": max(1, len(s["time_s"]) // 12),
                }
                label = _label(pol, offline)
                (line,) = row[0].plot(s["time_s"], s["utilisation"], label=label, **style)
                handles.setdefault(label, line)
                if "pinned_share" in s:
                    row[1].plot(s["time_s"], s["pinned_share"], **style)
            row[0].set_ylim(0, 1.05)
            row[1].set_ylim(0, 1.05)
            row[0].set_ylabel(f"share of capacity\n(capacity {cap})")
            row[0].set_title("cached / usable blocks", fontsize=9)
            row[1].set_title("pinned by running requests / capacity", fontsize=9)
            for ax in row:
                ax.grid(True, axis="both")
        order = [_label(p, o) for p, o in pols if _label(p, o) in handles]
        axes[0][1].legend(
            [handles[k] for k in order],
            order,
            loc="upper left",
            bbox_to_anchor=(1.0, 1.0),
            frameon=False,
        )
        for ax in axes[-1]:
            ax.set_xlabel("simulated time (s)")
        fig.suptitle(
            f"Memory utilisation over time: {_title(doc)} "
            f"(seed {doc['series']['seed']}, mean over replicas)",
            fontsize=10,
        )
        _footnote(fig, doc)
        _save(fig, path)


def write_plots(
    doc: dict[str, Any], out_dir: Path, highlight: Sequence[str] | None = DEFAULT_HIGHLIGHT
) -> list[Path]:
    """The six PNGs of one run; ``highlight``: the policies drawn in colour."""
    out_dir = Path(out_dir)
    model = doc["latency"].get("model", "?")
    paths = {key: out_dir / name for key, name in PLOTS.items()}
    bar_by_policy(
        doc,
        "ttft_ms_mean",
        f"mean TTFT (ms, simulated: {model})",
        "Mean TTFT by policy",
        paths["ttft"],
        highlight,
    )
    bar_by_policy(
        doc,
        "token_hit_rate",
        "prompt-token hit rate",
        "Cache hit rate by policy",
        paths["hit"],
        highlight,
    )
    bar_by_policy(
        doc,
        "cached_tokens",
        "prompt tokens served from cache",
        "Tokens saved (prefill skipped)",
        paths["saved"],
        highlight,
    )
    evictions_by_type(doc, paths["evict"], highlight)
    adaptive_weights(doc, paths["weights"])
    memory_utilisation(doc, paths["memory"], highlight)
    return list(paths.values())
