"""The SemanticKV suite's own figure: every experiment side by side.

The per-experiment figures (evictions by type, learned weights, memory over time) are
:mod:`skv.experiments.figures`, shared with every simulated experiment; this module holds what
only the suite draws.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from matplotlib.figure import Figure

from skv.experiments.config import experiment_title
from skv.experiments.figures import METHOD, policy_label, simulated_note, tightest_capacity, yerr
from skv.experiments.plotstyle import Comparison, figure, paper_style, plain_ticks, wrap_title


def policy_comparison(docs: Sequence[dict[str, Any]], method: str = METHOD) -> Figure:
    """Two rows (mean TTFT, token hit rate), one column per experiment, at each experiment's
    tightest capacity; bars = across-seed mean with its 95% bootstrap interval; the dashed line
    in the hit-rate row is Belady's (offline) hit rate, the bound online policies are measured
    against. ``method`` (adaptive_semantic) in colour, the first bar of each panel and first in
    the legend; the rest grey, told apart by hatch; Belady dashed. The title says the numbers
    are simulated and by which latency model(s)."""
    cmp = Comparison(method)
    with paper_style():
        fig = figure("text", 3.9)
        axes = fig.subplots(2, len(docs), squeeze=False)
        legend: dict[str, Any] = {}
        for col, doc in enumerate(docs):
            cap = tightest_capacity(doc)
            recs = cmp.legend_order(
                [r for r in doc["aggregate"] if r["capacity"] == cap],
                lambda r: (r["policy"], r["policy_name"]),
            )
            for row, (metric, ylabel) in enumerate(
                (("ttft_ms_mean", "mean TTFT (ms, sim.)"), ("token_hit_rate", "token hit rate"))
            ):
                ax = axes[row][col]
                stats = [r[metric] for r in recs]
                err = yerr(stats)
                for i, r in enumerate(recs):
                    bars = ax.bar(
                        i,
                        stats[i]["mean"],
                        0.8,
                        yerr=None if err is None else [[err[0][i]], [err[1][i]]],
                        capsize=1.5,
                        error_kw={"elinewidth": 0.6, "ecolor": "0.2"},
                        label=policy_label(r["policy"], r["offline"]),
                        **cmp.style(r["policy"], name=r["policy_name"], kind="bar"),
                    )
                    legend.setdefault(policy_label(r["policy"], r["offline"]), bars)
                bel = [r for r in recs if r["policy_name"] == "belady"]
                if metric == "token_hit_rate" and bel:
                    ax.axhline(bel[0][metric]["mean"], **cmp.style("belady", kind="rule"))
                ax.set_xticks([])
                plain_ticks(ax.yaxis)
                if col == 0:
                    ax.set_ylabel(ylabel)
                if row == 0:
                    ax.set_title(wrap_title(experiment_title(doc), 22), fontsize=6.5)
                else:
                    ax.set_xlabel(f"policies, capacity {cap}", fontsize=6)
        models = sorted({simulated_note(doc) for doc in docs})
        fig.suptitle(
            wrap_title(f"{method} vs baselines, every experiment ({'; '.join(models)})", 140),
            fontsize=7,
        )
        cmp.legend(
            fig,
            list(legend.values()),
            list(legend),
            loc="lower center",
            ncols=min(8, len(legend)),
            frameon=False,
        )
        fig.set_layout_engine("tight", rect=(0, 0.07, 1, 1))
    return fig
