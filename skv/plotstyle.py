"""One plot style for every skv figure: greyscale-safe, sized for a two-column paper.

Policies are told apart by grey level *and* hatch (bars) or dash pattern *and* marker (lines),
so a figure reads the same printed in black and white. Offline reference policies (Belady) are
white bars with a cross hatch. :mod:`skv.experiments.plots` (per-run PNGs) and the paper
figures (:mod:`skv.figures`, PDF + PNG) share these constants.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import matplotlib
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

#: widths of an ACM/IEEE two-column page, inches
COLUMN_WIDTH_IN = 3.33
TEXT_WIDTH_IN = 7.0

STYLE: dict[str, Any] = {
    "font.size": 9,
    "axes.titlesize": 10,
    "axes.labelsize": 9,
    "legend.fontsize": 7.5,
    "xtick.labelsize": 8,
    "ytick.labelsize": 8,
    "axes.grid": True,
    "axes.axisbelow": True,
    "axes.grid.axis": "y",
    "grid.color": "0.85",
    "grid.linewidth": 0.6,
    "axes.spines.top": False,
    "axes.spines.right": False,
    "axes.edgecolor": "0.2",
    "hatch.linewidth": 0.6,
    "hatch.color": "0.1",
    "savefig.dpi": 120,
    "figure.dpi": 120,
}
#: the paper's variant: smaller type for column-wide figures, print resolution, embedded fonts
PAPER_STYLE: dict[str, Any] = {
    **STYLE,
    "font.size": 7.5,
    "axes.titlesize": 8,
    "axes.labelsize": 7.5,
    "legend.fontsize": 6.5,
    "xtick.labelsize": 6.5,
    "ytick.labelsize": 6.5,
    "lines.linewidth": 1.0,
    "savefig.dpi": 300,
    "figure.dpi": 150,
    "pdf.fonttype": 42,
    "ps.fonttype": 42,
}
GREYS = ("0.15", "0.5", "0.8", "0.3", "0.65", "0.95", "0.4", "0.9")
HATCHES = ("", "//", "..", "\\\\", "xx", "--", "++", "oo", "**", "||")
LINESTYLES = ("-", "--", ":", "-.", (0, (5, 1, 1, 1)), (0, (1, 1)), (0, (3, 1, 3, 3)))
MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*", "<", ">")
OFFLINE_STYLE = {"color": "white", "hatch": "xxx", "edgecolor": "0.1"}


def bar_style(i: int, offline: bool = False) -> dict[str, Any]:
    """Fill, hatch and edge of the i-th bar series."""
    if offline:
        return dict(OFFLINE_STYLE)
    return {
        "color": GREYS[i % len(GREYS)],
        "hatch": HATCHES[(i // len(GREYS) + i) % len(HATCHES)],
        "edgecolor": "0.1",
    }


def line_style(i: int, offline: bool = False) -> dict[str, Any]:
    """Grey level, dash pattern and marker of the i-th line series."""
    if offline:
        return {"color": "0.0", "linestyle": (0, (1, 1)), "marker": "x", "markersize": 3.5}
    return {
        "color": str(round(0.55 * (i % 3) / 2, 2)),
        "linestyle": LINESTYLES[i % len(LINESTYLES)],
        "marker": MARKERS[i % len(MARKERS)],
        "markersize": 3.5,
        "linewidth": 1.2,
    }


def figure(width: float | str = "column", height: float = 2.2) -> Figure:
    """A Figure on an Agg canvas (no pyplot state); width ``"column"``, ``"text"`` or inches."""
    w = {"column": COLUMN_WIDTH_IN, "text": TEXT_WIDTH_IN}.get(width, width)  # type: ignore[arg-type]
    fig = Figure(figsize=(float(w), height))
    FigureCanvasAgg(fig)
    return fig


@contextmanager
def paper_style() -> Iterator[None]:
    with matplotlib.rc_context(PAPER_STYLE):
        yield


def save_figure(fig: Figure, out_dir: str | Path, name: str) -> list[Path]:
    """Write ``name.pdf`` and ``name.png`` (no timestamps in the metadata); returns both paths."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    with paper_style():
        if fig.get_layout_engine() is None:  # a figure that set its own layout keeps it
            fig.tight_layout()
        pdf, png = out / f"{name}.pdf", out / f"{name}.png"
        fig.savefig(pdf, format="pdf", metadata={"CreationDate": None, "Producer": None})
        fig.savefig(png, format="png", metadata={"Software": None})
    return [pdf, png]
