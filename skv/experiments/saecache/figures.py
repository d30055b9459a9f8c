"""The SAECache study's figures, drawn from the tidy tables of
:mod:`skv.experiments.saecache.numbers` (and :func:`~skv.experiments.saecache.study.
learned_series`), never from simulator objects.

The comparison figures follow :class:`~skv.experiments.plotstyle.Comparison`: ``saecache`` in
its colour, first in the legend, the other baselines grey (told apart by hatch), Belady (the
offline bound) dashed. Error bars are 95% Student-t intervals
of paired per-seed values (the tables carry ``ci_low`` / ``ci_high``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pandas as pd
from matplotlib.axes import Axes
from matplotlib.figure import Figure

from skv.experiments.plotstyle import (
    OKABE_ITO,
    Comparison,
    figure,
    paper_style,
    plain_ticks,
    policy_style,
    type_style,
    wrap_title,
)

#: the policies drawn in colour (the ablation figure)
HIGHLIGHT: tuple[str, ...] = ("saecache", "belady")
#: the method under study: the comparison figures' style rule
METHOD = Comparison("saecache")
#: the workload's true inter-turn gap distribution (skv/workloads/sae_mix.py; log-seconds)
TRUE_GAP_MU, TRUE_GAP_SIGMA = 2.28, 1.34
QUEUE_STYLES: dict[str, tuple[str, str]] = {
    "evict_first": (OKABE_ITO["vermillion"], "v"),
    "structural": (OKABE_ITO["sky_blue"], "D"),
    "chat": (OKABE_ITO["blue"], "s"),
    "agentic": (OKABE_ITO["green"], "^"),
}


def _err(d: pd.DataFrame) -> list[list[float]]:
    return [
        [max(0.0, v - lo) for v, lo in zip(d["value"], d["ci_low"], strict=True)],
        [max(0.0, hi - v) for v, hi in zip(d["value"], d["ci_high"], strict=True)],
    ]


def _series_style(series: str, policy: str) -> dict[str, Any]:
    """Bar style of a series (:data:`METHOD`): saecache coloured, an offline policy a dashed
    bound, anything else (the best other online policy) a grey baseline."""
    offline = series.endswith("(offline)")
    name = policy if series == policy or offline else series
    return METHOD.style(name, name=policy if offline else None, kind="bar")


def _grouped_bars(ax: Axes, d: pd.DataFrame, groups: list[str], order: list[str]) -> dict:
    """One group of bars per ``groups`` entry (column ``setting``), one bar per ``order``
    entry (column ``series``), with error bars; returns series -> bar container."""
    policy_of = dict(zip(d["series"], d["policy"], strict=True))
    order = METHOD.legend_order(order, lambda name: (name, policy_of.get(name)))
    width = 0.8 / len(order)
    handles = {}
    for i, name in enumerate(order):
        s = d[d["series"] == name].set_index("setting").reindex(groups).dropna(subset=["value"])
        xs = [groups.index(g) - 0.4 + width * (i + 0.5) for g in s.index]
        handles[name] = ax.bar(
            xs,
            s["value"],
            width * 0.9,
            yerr=_err(s),
            capsize=1.2,
            error_kw={"elinewidth": 0.5, "ecolor": "0.2"},
            label=name,
            **_series_style(name, str(s["policy"].iloc[0]) if len(s) else name),
        )
    return handles


#: short names of baselines under the hit-rate figure's groups
SHORT_NAMES: dict[str, str] = {
    "adaptive_semantic": "adaptive",
    "static_semantic": "static",
    "sglang_lru": "sglang",
}


def _setting_axis(
    ax: Axes, rows: pd.DataFrame, groups: list[str], extra: str = "", extra_label: str = ""
) -> None:
    """x ticks: each setting's arrival range (and ``extra`` column's value on a second line,
    ``extra_label`` in the axis label), the workload's name once under each run of settings
    of the same workload."""
    first = rows.drop_duplicates("setting").set_index("setting").loc[groups]
    ticks = [a.removesuffix(" s") for a in first["arrival"]]
    if extra:
        ticks = [f"{t}\n{v}" for t, v in zip(ticks, first[extra], strict=True)]
    ax.set_xticks(range(len(groups)), ticks, fontsize=5)
    runs: list[tuple[str, list[int]]] = []
    for i, wl in enumerate(first["workload"]):
        if runs and runs[-1][0] == wl:
            runs[-1][1].append(i)
        else:
            runs.append((wl, [i]))
    for wl, idx in runs:
        ax.annotate(
            wl,
            xy=(sum(idx) / len(idx), 0),
            xycoords=("data", "axes fraction"),
            xytext=(0, -14 if not extra else -20),
            textcoords="offset points",
            ha="center",
            va="top",
            fontsize=6,
        )
    ax.set_xlabel(
        "interval between new conversations (s)"
        + (f", {extra_label}" if extra_label else "")
        + "; workload",
        labelpad=14,
    )


def ttft_ratio_figure(rows: pd.DataFrame, title: str = "") -> Figure:
    """Two rows (mean TTFT, p99 TTFT): per grid setting, the speedup over vLLM's block pool
    (``ttft(vllm) / ttft(policy)``, 1 = vLLM) of each series of ``rows``
    (:func:`~skv.experiments.saecache.numbers.ttft_rows`: saecache, the best other online
    policy of that setting, Belady), with 95% intervals over seeds."""
    groups = list(dict.fromkeys(rows["setting"]))
    order = list(dict.fromkeys(rows["series"]))
    with paper_style():
        fig = figure("text", 4.6)
        axes = fig.subplots(2, 1, sharex=True)
        handles: dict[str, Any] = {}
        for ax, (metric, what) in zip(
            axes, (("ttft_ms_mean", "mean TTFT"), ("ttft_ms_p99", "p99 TTFT")), strict=True
        ):
            handles |= _grouped_bars(ax, rows[rows["metric"] == metric], groups, order)
            ref = ax.axhline(1.0, color="0.3", linestyle="-", linewidth=0.8, label="vllm (= 1)")
            handles["vllm (= 1)"] = ref
            plain_ticks(ax.yaxis)
            ax.set_ylabel(f"speedup over vllm\n({what}, simulated)")
        _setting_axis(axes[1], rows, groups)
        if title:
            axes[0].set_title(wrap_title(title, 110), fontsize=7)
        METHOD.legend(
            fig,
            list(handles.values()),
            list(handles),
            loc="lower center",
            ncols=len(handles),
            frameon=False,
        )
        fig.set_layout_engine("tight", rect=(0, 0.05, 1, 1))
    return fig


def hit_vs_best_figure(rows: pd.DataFrame, title: str = "") -> Figure:
    """Per grid setting: saecache's token hit rate minus the strongest other online policy's
    of that setting (named under each group), and Belady's headroom over the same policy, in
    points, with 95% intervals over seeds (:func:`~skv.experiments.saecache.numbers.
    hit_rows`)."""
    groups = list(dict.fromkeys(rows["setting"]))
    order = list(dict.fromkeys(rows["series"]))
    rows = rows.assign(versus=[SHORT_NAMES.get(b, b) for b in rows["baseline"]])
    with paper_style():
        fig = figure("text", 3.0)
        ax = fig.add_subplot()
        handles = _grouped_bars(ax, rows, groups, order)
        ax.axhline(0.0, color="0.15", linewidth=0.6)
        _setting_axis(ax, rows, groups, "versus", "strongest other online policy")
        ax.set_ylabel("token hit rate minus the\nstrongest baseline's (points)")
        plain_ticks(ax.yaxis)
        if title:
            ax.set_title(wrap_title(title, 110), fontsize=7)
        METHOD.legend(ax, list(handles.values()), list(handles), frameon=False, fontsize=6)
    return fig


def ablation_figure(ablation: pd.DataFrame, mismatch: pd.DataFrame, title: str = "") -> Figure:
    """(a) the mean-TTFT increase over saecache of each ablation variant (one component off;
    :func:`~skv.experiments.saecache.numbers.ablation_rows`); (b) per mismatch workload, the
    mean TTFT of ``saecache_fixed`` fitted on the same workload and fitted on another one,
    relative to saecache learning online (:func:`~skv.experiments.saecache.numbers.
    mismatch_rows`); 95% intervals over seeds."""
    from skv.experiments.saecache.numbers import WORKLOAD_TITLES

    with paper_style():
        fig = figure("text", 2.8)
        left, right = fig.subplots(1, 2, gridspec_kw={"width_ratios": [1, 1.4]})
        xs = range(len(ablation))
        left.bar(
            xs,
            ablation["ttft_pct"],
            0.6,
            yerr=[
                (ablation["ttft_pct"] - ablation["ttft_ci_low"]).clip(lower=0),
                (ablation["ttft_ci_high"] - ablation["ttft_pct"]).clip(lower=0),
            ],
            capsize=1.5,
            error_kw={"elinewidth": 0.6, "ecolor": "0.2"},
            **policy_style("saecache", kind="bar", highlight=HIGHLIGHT),
        )
        left.axhline(0.0, color="0.15", linewidth=0.6)
        left.set_xticks(list(xs), [c.replace(" ", "\n", 1) for c in ablation["component"]])
        left.set_xlabel("component switched off")
        left.set_ylabel("mean TTFT increase over\nfull saecache (%, simulated)")
        left.set_title("(a) ablation", fontsize=7)
        plain_ticks(left.yaxis)

        targets = list(dict.fromkeys(mismatch["target"]))

        def name(workload: str) -> str:
            return WORKLOAD_TITLES.get(workload, workload)

        styles = {
            "matched": (
                "fixed, fitted on the same workload",
                policy_style("saecache_fixed", highlight=None),
            ),
            "mismatched": (
                "fixed, fitted on the other workload",
                {**policy_style("saecache_fixed", highlight=()), "marker": "s"},
            ),
        }
        for i, (variant, (label, style)) in enumerate(styles.items()):
            d = mismatch[mismatch["variant"] == variant].set_index("target").reindex(targets)
            right.errorbar(
                [t - 0.12 + 0.24 * i for t in range(len(targets))],
                d["value"],
                yerr=_err(d),
                capsize=1.5,
                elinewidth=0.6,
                label=label,
                **{**style, "linestyle": "none", "markersize": 4.0},
            )
        right.set_xlim(-0.5, len(targets) - 0.5)
        other = mismatch[mismatch["variant"] == "mismatched"].set_index("target")["fitted_on"]
        right.set_xticks(
            range(len(targets)),
            [f"{name(t)}\nother fit:\n{name(other[t])}" for t in targets],
            fontsize=5.5,
        )
        right.axhline(1.0, color="0.15", linestyle="--", linewidth=0.8)
        right.set_xlabel("workload run on")
        right.set_ylabel("mean TTFT relative to\nsaecache learning online")
        right.set_title("(b) fixed parameters under mismatch", fontsize=7)
        plain_ticks(right.yaxis)
        fig.legend(*right.get_legend_handles_labels(), loc="lower right", ncols=2, frameon=False)
        if title:
            fig.suptitle(wrap_title(title, 110), fontsize=7)
        fig.set_layout_engine("tight", rect=(0, 0.06, 1, 1))
    return fig


def learned_params_figure(
    series: pd.DataFrame, title: str = "", types: Sequence[str] | None = None
) -> Figure:
    """What saecache learns over one run (:func:`~skv.experiments.saecache.study.
    learned_series`): (a) queue weights alpha_q, (b) type weights w_type (``types``, default:
    the types whose weight moved), (c) the Chat and Agentic log-normal gap fits mu and sigma
    beside the workload's true values, (d) the position-decay exponent gamma."""
    t = series["time_s"]
    every = max(1, len(series) // 10)
    mark = {"markevery": every, "markersize": 3.0, "linewidth": 1.0}
    if types is None:
        cols = [c for c in series if c.startswith("w_")]
        types = [c[2:] for c in cols if series[c].max() != series[c].min()] or [c[2:] for c in cols]
    with paper_style():
        fig = figure("text", 4.4)
        axes = fig.subplots(2, 2, sharex=True)
        (a, b), (c, d) = axes
        for q, (colour, marker) in QUEUE_STYLES.items():
            a.plot(t, series[f"alpha_{q}"], label=q, color=colour, marker=marker, **mark)
        a.set_yscale("log")
        plain_ticks(a.yaxis, log=True)
        a.set_ylabel("queue weight alpha (log)")
        a.set_title("(a) queue weights", fontsize=7)
        a.legend(frameon=False, fontsize=5, ncols=2, loc="best")
        for ty in types:
            style = {**type_style(ty, kind="line"), **mark}
            b.plot(t, series[f"w_{ty}"], label=ty, **style)
        b.set_yscale("log")
        plain_ticks(b.yaxis, log=True)
        b.set_ylabel("type weight w (log)")
        b.set_title("(b) type weights", fontsize=7)
        top = max(float(series[f"w_{ty}"].max()) for ty in types) if types else 1.0
        b.set_ylim(top=top * 3.0)  # room for the legend above the lines
        b.legend(frameon=False, fontsize=5, ncols=4, loc="upper center")
        for q in ("chat", "agentic"):
            colour, marker = QUEUE_STYLES[q]
            c.plot(t, series[f"mu_{q}"], color=colour, marker=marker, label=f"mu, {q}", **mark)
            c.plot(
                t,
                series[f"sigma_{q}"],
                color=colour,
                marker=marker,
                linestyle="--",
                label=f"sigma, {q}",
                **mark,
            )
        c.axhline(TRUE_GAP_MU, color="0.3", linestyle=":", linewidth=0.8, label="true mu")
        c.axhline(TRUE_GAP_SIGMA, color="0.6", linestyle=":", linewidth=0.8, label="true sigma")
        c.set_ylabel("gap fit (log-seconds)")
        c.set_xlabel("simulated time (s)")
        c.set_title("(c) inter-turn gap fits", fontsize=7)
        top = max(
            float(
                series[[f"{k}_{q}" for k in ("mu", "sigma") for q in ("chat", "agentic")]]
                .max()
                .max()
            ),
            TRUE_GAP_MU,
        )
        c.set_ylim(top=top + 0.8)  # room for the legend above the lines
        c.legend(frameon=False, fontsize=5, ncols=3, loc="upper center")
        d.plot(t, series["gamma"], color=QUEUE_STYLES["structural"][0], marker="D", **mark)
        d.set_ylabel("position-decay gamma")
        d.set_xlabel("simulated time (s)")
        d.set_title("(d) position decay", fontsize=7)
        plain_ticks(d.yaxis)
        if title:
            fig.suptitle(wrap_title(title, 110), fontsize=7)
    return fig
