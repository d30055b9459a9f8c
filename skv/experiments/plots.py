"""The six experiment plots: PNG, Agg canvas (no pyplot state), one greyscale-safe style.

Bars tell policies apart by grey level *and* hatch, lines by dash pattern *and* marker, so every
figure stays readable printed in black and white. Offline reference policies (Belady) are drawn
white with a cross hatch and labelled "(offline)". Every figure carries a footnote naming the
latency model that simulated its numbers.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from skv.plotstyle import STYLE
from skv.plotstyle import bar_style as _bar_style
from skv.plotstyle import line_style as _line_style


def _figure(width: float = 7.0, height: float = 3.8) -> Figure:
    fig = Figure(figsize=(width, height))
    FigureCanvasAgg(fig)
    return fig


def _footnote(fig: Figure, doc: dict[str, Any], extra: str = "") -> None:
    model = doc["latency"].get("model", "?")
    text = f"{doc['experiment']}: simulated by the '{model}' latency model (not measured)"
    if doc.get("quick"):
        text += "; QUICK run (scaled down)"
    if extra:
        text += f"; {extra}"
    fig.text(0.01, 0.01, text, fontsize=6.5, color="0.3", ha="left", va="bottom", wrap=True)


def _save(fig: Figure, path: Path) -> None:
    fig.tight_layout(rect=(0, 0.04, 1, 1))
    fig.savefig(path, format="png", metadata={"Software": None})


def _policies(doc: dict[str, Any]) -> list[tuple[str, bool]]:
    seen: dict[str, bool] = {}
    for r in doc["aggregate"]:
        seen.setdefault(r["policy"], r["offline"])
    return list(seen.items())


def _caps(doc: dict[str, Any]) -> list[str]:
    return [str(c) for c in doc["config"]["capacities"]]


def _label(policy: str, offline: bool) -> str:
    return f"{policy} (offline)" if offline else policy


def bar_by_policy(doc: dict[str, Any], metric: str, ylabel: str, title: str, path: Path) -> None:
    """Grouped bars: one group per capacity, one bar per policy; error bars = 95% CI."""
    pols = _policies(doc)
    caps = _caps(doc)
    recs = {(r["capacity"], r["policy"]): r for r in doc["aggregate"]}
    width = 0.8 / max(len(pols), 1)
    with matplotlib.rc_context(STYLE):
        fig = _figure(max(6.5, 1.2 + 0.35 * len(pols) * len(caps)), 3.9)
        ax = fig.add_subplot()
        for i, (pol, offline) in enumerate(pols):
            xs: list[float] = []
            ys: list[float] = []
            errs: list[tuple[float, float]] = []
            for j, cap in enumerate(caps):
                r = recs.get((cap, pol))
                if r is None or r[metric]["mean"] is None:
                    continue
                s = r[metric]
                xs.append(j - 0.4 + width * (i + 0.5))
                ys.append(s["mean"])
                half = 0.0 if s["ci95_high"] is None else s["ci95_high"] - s["mean"]
                errs.append((min(half, s["mean"]), half))  # these metrics are never negative
            ax.bar(
                xs,
                ys,
                width * 0.92,
                yerr=[[e[0] for e in errs], [e[1] for e in errs]] if any(errs) else None,
                capsize=2,
                ecolor="0.0",
                linewidth=0.6,
                label=_label(pol, offline),
                **_bar_style(i, offline),
            )
        ax.set_xticks(range(len(caps)), [f"capacity {c}" for c in caps])
        ax.set_ylabel(ylabel)
        ax.set_title(title)
        ax.legend(
            ncols=min(4, len(pols)), loc="upper center", bbox_to_anchor=(0.5, -0.1), frameon=False
        )
        n = max((r["n_seeds"] for r in doc["aggregate"]), default=1)
        _footnote(fig, doc, f"error bars: 95% CI over {n} seeds" if n > 1 else "one seed")
        _save(fig, path)


def evictions_by_type(doc: dict[str, Any], path: Path) -> None:
    """Stacked bars per policy: mean evictions of each semantic type, one panel per capacity."""
    pols = _policies(doc)
    caps = _caps(doc)
    types = sorted({t for r in doc["aggregate"] for t in r["evictions_by_type"]})
    with matplotlib.rc_context(STYLE):
        fig = _figure(max(6.0, 1.5 + 0.5 * len(pols) * len(caps)), 4.2)
        axes = fig.subplots(1, len(caps), squeeze=False, sharey=True)[0]
        for ax, cap in zip(axes, caps, strict=True):
            recs = {r["policy"]: r for r in doc["aggregate"] if r["capacity"] == cap}
            bottom = [0.0] * len(pols)
            for k, t in enumerate(types):
                vals = [
                    recs[p]["evictions_by_type"].get(t, 0.0) if p in recs else 0.0 for p, _ in pols
                ]
                ax.bar(
                    range(len(pols)),
                    vals,
                    0.7,
                    bottom=bottom,
                    label=t,
                    linewidth=0.6,
                    **_bar_style(k, False),
                )
                bottom = [b + v for b, v in zip(bottom, vals, strict=True)]
            ax.set_xticks(
                range(len(pols)), [_label(p, o) for p, o in pols], rotation=35, ha="right"
            )
            ax.set_title(f"capacity {cap}")
        axes[0].set_ylabel("evicted blocks (mean over seeds)")
        if types:
            axes[-1].legend(
                title="semantic type", loc="upper left", bbox_to_anchor=(1.0, 1.0), frameon=False
            )
        else:
            axes[0].text(0.5, 0.5, "no evictions", transform=axes[0].transAxes, ha="center")
        fig.suptitle("Evictions by semantic type", fontsize=10)
        _footnote(fig, doc)
        _save(fig, path)


def adaptive_weights(doc: dict[str, Any], path: Path) -> None:
    """Learned per-type weights over simulated time (first seed; one panel per adaptive entry
    at the most constrained capacity)."""
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
        fig = _figure(7.0, 3.2 * len(chosen) + 0.6)
        axes = fig.subplots(len(chosen), 1, squeeze=False)[:, 0]
        for ax, s in zip(axes, chosen, strict=True):
            keys = sorted(k for k in s if k.startswith("w_"))
            every = max(1, len(s["time_s"]) // 15)
            for i, k in enumerate(keys):
                ax.plot(s["time_s"], s[k], label=k[2:], markevery=every, **_line_style(i))
            ax.set_title(
                f"{s['policy']}: learned type weights (capacity {s['capacity']}, "
                f"seed {doc['series']['seed']}, replica 0)"
            )
            ax.set_ylabel("weight")
            ax.set_yscale("log")
            ax.grid(True, axis="both", which="major")
            ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), frameon=False)
        axes[-1].set_xlabel("simulated time (s)")
        _footnote(fig, doc)
        _save(fig, path)


def memory_utilisation(doc: dict[str, Any], path: Path) -> None:
    """Per capacity (rows): cache utilisation (cached / usable blocks) and the share of the
    capacity pinned by running requests, over simulated time (first seed, mean over replicas)."""
    caps = _caps(doc)
    pols = _policies(doc)
    series = {(s["capacity"], s["policy"]): s for s in doc["series"]["memory"]}
    with matplotlib.rc_context(STYLE):
        fig = _figure(9.0, 2.4 * len(caps) + 0.9)
        axes = fig.subplots(len(caps), 2, squeeze=False, sharex=True)
        for row, cap in zip(axes, caps, strict=True):
            for i, (pol, offline) in enumerate(pols):
                s = series.get((cap, pol))
                if not s or not s["time_s"]:
                    continue
                style = {**_line_style(i), "markevery": max(1, len(s["time_s"]) // 12)}
                row[0].plot(s["time_s"], s["utilisation"], label=_label(pol, offline), **style)
                if "pinned_share" in s:
                    row[1].plot(s["time_s"], s["pinned_share"], **style)
            row[0].set_ylim(0, 1.05)
            row[1].set_ylim(0, 1.05)
            row[0].set_ylabel(f"capacity {cap}")
            row[0].set_title("cached / usable blocks", fontsize=9)
            row[1].set_title("pinned by running requests / capacity", fontsize=9)
            for ax in row:
                ax.grid(True, axis="both")
        handles, labels = axes[0][0].get_legend_handles_labels()
        axes[0][1].legend(
            handles, labels, loc="upper left", bbox_to_anchor=(1.0, 1.0), frameon=False
        )
        for ax in axes[-1]:
            ax.set_xlabel("simulated time (s)")
        fig.suptitle(
            f"Memory utilisation over time (seed {doc['series']['seed']}, mean over replicas)",
            fontsize=10,
        )
        _footnote(fig, doc)
        _save(fig, path)


def write_plots(doc: dict[str, Any], out_dir: Path) -> list[Path]:
    out_dir = Path(out_dir)
    model = doc["latency"].get("model", "?")
    paths = {
        "ttft": out_dir / "policy_comparison_avg_ttft.png",
        "hit": out_dir / "policy_comparison_hit_rate.png",
        "saved": out_dir / "tokens_saved_by_policy.png",
        "evict": out_dir / "evictions_by_semantic_type.png",
        "weights": out_dir / "adaptive_weights_over_time.png",
        "memory": out_dir / "memory_utilization_over_time.png",
    }
    bar_by_policy(
        doc,
        "ttft_ms_mean",
        f"mean TTFT (ms, simulated: {model})",
        "Average TTFT by policy",
        paths["ttft"],
    )
    bar_by_policy(
        doc, "token_hit_rate", "prompt-token hit rate", "Cache hit rate by policy", paths["hit"]
    )
    bar_by_policy(
        doc,
        "cached_tokens",
        "prompt tokens served from cache",
        "Tokens saved (prefill skipped) by policy",
        paths["saved"],
    )
    evictions_by_type(doc, paths["evict"])
    adaptive_weights(doc, paths["weights"])
    memory_utilisation(doc, paths["memory"])
    return list(paths.values())
