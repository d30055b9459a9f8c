"""The leaderboard figure: policies (rows, ranked) x traces (columns), the colour the share of
the LRU -> Belady gap closed; every cell printed, so the figure reads without the colour bar."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
from matplotlib.colors import TwoSlopeNorm
from matplotlib.figure import Figure

from skv.experiments.plotstyle import exempt_axes, figure, paper_style, wrap_title


def gap_heatmap(table: pd.DataFrame, title: str) -> Figure:
    """``table``: :func:`skv.experiments.leaderboard.study.ranking` (a ``mean`` column, then one
    column per trace). Diverging colours centred on 0 (= LRU): blue closes the gap, red falls
    behind LRU; blank cells have no gap to close."""
    cols = list(table.columns)
    data = 100 * table[cols].to_numpy(dtype=float)
    finite = data[np.isfinite(data)]
    lo = min(-5.0, float(finite.min()) if finite.size else -5.0)
    hi = max(5.0, float(finite.max()) if finite.size else 5.0)
    with paper_style():
        fig = figure("text", 1.2 + 0.16 * len(table))
        ax = fig.add_subplot()
        img = ax.imshow(
            np.ma.masked_invalid(data),
            cmap="RdBu",
            norm=TwoSlopeNorm(vcenter=0.0, vmin=lo, vmax=hi),
            aspect="auto",
        )
        for i in range(data.shape[0]):
            for j in range(data.shape[1]):
                v = data[i, j]
                if math.isfinite(v):
                    dark = abs(v) > 0.6 * (hi if v > 0 else -lo)
                    ax.text(j, i, f"{v:.0f}", ha="center", va="center", fontsize=5.5,
                            color="white" if dark else "0.1")  # fmt: skip
        ax.set_xticks(range(len(cols)), [c.replace("_", " ") for c in cols], rotation=30,
                      ha="right")  # fmt: skip
        ax.set_yticks(range(len(table)), list(table.index))
        ax.set_xlabel("trace (mean: over the traces with a gap)")
        ax.set_ylabel("policy (ranked)")
        ax.axvline(0.5, color="0.2", linewidth=0.6)
        bar = fig.colorbar(img, ax=ax, fraction=0.04, pad=0.02)
        bar.set_label("gap closed (%)")
        exempt_axes(bar.ax, "a colour bar")
        ax.set_title(wrap_title(title, 90), fontsize=7)
    return fig
