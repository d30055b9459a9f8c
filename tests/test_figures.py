"""Figures: every figure function's output passes the pre-save check, and the check rejects
figures a reader could not trust (no axis label, no legend, text off the canvas)."""

from __future__ import annotations

import inspect
import random
from pathlib import Path

import pytest
import yaml
from matplotlib.colors import to_hex
from matplotlib.text import Text

from skv.experiments import figures as F
from skv.experiments import plotstyle
from skv.experiments.config import config_from_dict, humanise_id
from skv.experiments.fidelity.study import fidelity_figure
from skv.experiments.plotstyle import (
    GREY_LINE,
    POLICY_STYLES,
    check_figure,
    exempt_axes,
    figure,
    policy_style,
    save_figure,
)
from skv.experiments.replay import capacity as C
from skv.experiments.replay.session_gap import gap_figure
from skv.experiments.repurpose import study as REP
from skv.experiments.routing.study import routing_figure
from skv.experiments.runner import PLOT_FILES, make_requests, simulate_experiment
from skv.experiments.saecache import figures as SAE
from skv.experiments.semantickv.figures import policy_comparison

ROOT = Path(__file__).resolve().parent.parent
EXPERIMENTS = ROOT / "experiments"
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _doc(ident: str, title: str | None, policies: list[str]) -> dict:
    data = yaml.safe_load((EXPERIMENTS / "semantickv" / "smoke.yaml").read_text())
    data.update(id=ident, policies=policies, capacities=["10%", "30%"], seeds=[0, 1, 2])
    data.pop("title", None)
    if title:
        data["title"] = title
    return simulate_experiment(config_from_dict(data), quick=True)


@pytest.fixture(scope="module")
def docs() -> list[dict]:
    """Two tiny real runs: one titled, one falling back to its humanised id."""
    return [
        _doc("tiny_titled", "A titled experiment", ["fifo", "lru", "adaptive_semantic", "belady"]),
        _doc("tiny_untitled", None, ["lru", "lfu", "adaptive_semantic"]),
    ]


@pytest.fixture(scope="module")
def curve():
    reqs = make_requests("shared_system_prompt", {"num_requests": 80, "seed": 0})
    pols = ["fifo", "lru", "adaptive_semantic", "saecache", "belady"]
    return C.capacity_curve(reqs, pols, ["5%", "20%"])


def _engine_results() -> tuple[dict, dict]:
    rng = random.Random(0)
    rows = []
    for i in range(30):
        p, m = rng.randint(100, 400), rng.choice([0, 32, 64])
        pred = 5 + 0.05 * (p - m)
        rows.append(
            {
                "request_id": str(i),
                "prompt_tokens": p,
                "measured_cached_tokens": m,
                "simulated_cached_tokens": m if i % 7 else 0,
                "ttft_ms": pred + rng.random(),
                "predicted_ttft_ms": pred,
            }
        )
    fid = {
        "per_request": rows,
        "measured_hit_rate": 0.31,
        "simulated_hit_rate": 0.29,
        "hit_rate_gap_pts": 2.0,
        "latency_r2": 0.9,
        "config": {"title": "Fidelity, hand-made"},
    }
    routing = {
        "policies": [
            {
                "policy": p,
                "measured_hit_rate": h,
                "simulated_hit_rate": h - 0.01,
                "prefill_tokens": k,
            }
            for p, h, k in (
                ("round_robin", 0.2, 30000),
                ("prefix_locality_50k", 0.4, 20000),
                ("precise", 0.55, 14000),
            )
        ],
        "config": {"replicas": 2, "num_gpu_blocks": 64},
    }
    return fid, routing


def _gap_sweep():
    import pandas as pd

    return pd.DataFrame(
        [
            {
                "policy": pol,
                "gap_s": gap,
                "seed": seed,
                "block_hit_rate": base + gap / 1000 + seed / 100,
            }
            for pol, base in (("lru", 0.3), ("adaptive_semantic", 0.32), ("saecache", 0.34))
            for gap in (10.0, 30.0, 100.0)
            for seed in (0, 1, 2)
        ]
    )


def _sampling_figure():
    """The SHARDS accuracy figure on a real (small) sweep of a synthetic trace: two traces x
    two rates, so every panel of the grid is drawn."""
    import pandas as pd

    from skv.experiments.replay import sampling as S
    from skv.replay import compile_trace
    from skv.workloads import make_workload

    trace = compile_trace(make_workload("multi_turn_chat", seed=1, num_requests=150))
    rows = [
        row
        for label in ("chat A", "chat B")
        for policy in ("lru", "fifo", "vllm")
        for row in S.accuracy_rows(trace, label, policy, ["5%", "20%"], [0.5, 0.2], [0, 1])
    ]
    return S.accuracy_figure(pd.DataFrame(rows), "Sampling accuracy", lines=["lru", "vllm"])


def _paper_figures(docs: list[dict], curve) -> dict[str, object]:
    fid, routing = _engine_results()
    return {
        "policy_comparison": policy_comparison(docs),
        "bar_by_policy": F.bar_by_policy(docs[0], "token_hit_rate", "token hit rate", "Hit rate"),
        "evictions_by_type": F.evictions_by_type(docs[0]),
        "evictions_by_type_all_capacities": F.evictions_by_type(docs[0], F.capacities(docs[0])),
        "adaptive_weights": F.adaptive_weights(docs[0]),
        "memory_utilisation": F.memory_utilisation(docs[0]),
        "memory_utilisation_pinned": F.memory_utilisation(
            docs[0], F.capacities(docs[0]), pinned=True
        ),
        "hit_rate_vs_capacity": C.hit_rate_vs_capacity(curve, "Synthetic shared prompts"),
        "fidelity_figure": fidelity_figure(fid),
        "routing_figure": routing_figure(routing),
        "gap_figure": gap_figure(_gap_sweep(), "Session gap", 30.0),
        "accuracy_figure": _sampling_figure(),
        **_repurpose_figures(),
        **_saecache_figures(),
        **_cacheroute_figures(),
        "eviction_figure": _vllm_eviction_figure(),
        "fidelity_load_figure": _fidelity_load_figure(),
        "verdict_figure": _verdict_figure(),
        "gap_heatmap": _leaderboard_figure(),
    }


def _leaderboard_figure():
    """The leaderboard heatmap on a hand-made ranking (a blank cell: no gap to close)."""
    import pandas as pd

    from skv.experiments.leaderboard.figures import gap_heatmap

    table = pd.DataFrame(
        {"mean": [0.3, 0.0, -0.1], "mooncake": [0.1, 0.0, float("nan")], "rag": [0.5, 0, -0.1]},
        index=["sieve", "lru", "fifo"],
    )
    return gap_heatmap(table, "Leaderboard (simulated replay)")


def _verdict_figure():
    """The eviction verdict's figure on its result against the simulated engine."""
    from skv.experiments.fidelity import eviction_verdict as EV
    from skv.experiments.fidelity.sim_engine import SimulatedEngine
    from skv.latency import CalibratedLatency

    truth = CalibratedLatency(base_ms=3.0, ms_per_uncached_token=0.07, decode_ms_per_seq=0.1)
    cfg = {**EV.DEFAULTS, "requests_per_stage": 40, "profile_repeats": 1, "ramp_requests": 20}
    res = EV.run_eviction_verdict(
        cfg, engine_factory=lambda a, w, t, env=None: SimulatedEngine(a, truth, env=env)
    )
    return EV.verdict_figure(res)


def _fidelity_load_figure():
    """The fidelity-under-load figure on the study's result against the simulated engine (the
    shape run_fidelity_load returns on the real one)."""
    from skv.experiments.fidelity import load as FL
    from skv.experiments.fidelity.sim_engine import SimulatedEngine
    from skv.latency import CalibratedLatency

    truth = CalibratedLatency(base_ms=3.0, ms_per_uncached_token=0.07, decode_ms_per_seq=0.1)
    cfg = {**FL.DEFAULTS, **FL.load_config("experiments/fidelity/fidelity_load.yaml", quick=True)}
    cfg.update(requests_per_stage=30, slo_requests=30, ramp_requests=20, warmup_requests=3)
    res = FL.run_fidelity_load(
        cfg, engine_factory=lambda args, work, t: SimulatedEngine(args, truth)
    )
    return FL.fidelity_load_figure(res)


def _vllm_eviction_figure():
    """The plugin study's figure on a hand-made result (the shape run_vllm_eviction returns;
    tests/test_vllm_eviction.py runs the real one on the engine)."""
    from skv.experiments.vllm_eviction import study as VE

    rows = [
        {"variant": v, "measured_hit_rate": h, "simulated_hit_rate": h, "exact_agreement": 1.0,
         "ttft_median_ms": 13.0 + i, "ttft_p90_ms": 20.0 + i}
        | ({"concurrent_hit_rate": h - 0.02} if v in ("stock", "saecache") else {})
        for i, (v, h) in enumerate((("stock", 0.52), ("lru", 0.52), ("saecache", 0.56)))
    ]  # fmt: skip
    return VE.eviction_figure({"rows": rows, "min_exact_agreement": 1.0, "config": {}})


def _cacheroute_figures() -> dict[str, object]:
    """The CacheRoute study's figures on hand-made sweeps (the shapes run_qps and run_load
    return; tests/test_cacheroute_study.py checks the values)."""
    import pandas as pd

    from skv.experiments.cacheroute import study as CR

    cfg = CR.CacheRouteConfig.model_validate({
        "id": "t", "workloads": [{"name": "aggregate"}, {"name": "dominant_key"}],
        "routers": [{"name": "least_loaded"}, {"name": "sglang_cache_aware"},
                    {"name": "cacheroute"}],
        "seeds": [0, 1], "rates": [40.0, 80.0, 120.0],
    })  # fmt: skip
    qps = pd.DataFrame(
        {"workload": w.key, "router": r.key, "seed": s, "qps": 100 + 30 * i + s,
         "hit_rate": 0.6 + 0.1 * i, "ttft_ms_p99": 3000.0}
        for w in cfg.workloads for i, r in enumerate(cfg.routers) for s in cfg.seeds
    )  # fmt: skip
    load = pd.DataFrame(
        {"workload": w.key, "router": r.key, "seed": s, "rate": rate,
         "ttft_ms_p99": 400.0 * (1 + i) * (rate / 40) ** 2 + s}
        for w in cfg.workloads[:1] for i, r in enumerate(cfg.routers) for s in cfg.seeds
        for rate in cfg.rates
    )  # fmt: skip
    load_cfg = cfg.model_copy(update={"workloads": cfg.workloads[:1]})
    return {
        "qps_figure": CR.qps_figure(qps, cfg, "Max QPS at SLO"),
        "load_figure": CR.load_figure(load, load_cfg, "p99 TTFT vs load"),
    }


def _saecache_figures() -> dict[str, object]:
    """The SAECache study's figures on hand-made tables (the shapes of
    skv.experiments.saecache.numbers' rows; tests/test_saecache_study.py draws real ones)."""
    import pandas as pd

    grid = [
        {"setting": f"{w}_{a}", "workload": w, "arrival": a, "label": f"{w}\n{a}"}
        for w in ("Balanced", "Tool use")
        for a in ("0.02-0.05 s", "0.05-0.08 s")
    ]
    series = (("saecache", "saecache", 1.2), ("best other online", "lfu", 1.1))
    series += (("belady (offline)", "belady", 2.0),)
    ttft = pd.DataFrame(
        {**g, "series": name, "policy": pol, "metric": m, "value": v, "ci_low": v - 0.1}
        | {"ci_high": v + 0.1}
        for g in grid
        for name, pol, v in series
        for m in ("ttft_ms_mean", "ttft_ms_p99")
    )
    hit = pd.DataFrame(
        {**g, "series": name, "policy": pol, "baseline": "adaptive_semantic", "value": v}
        | {"ci_low": v - 0.5, "ci_high": v + 0.5}
        for g in grid
        for name, pol, v in (("saecache", "saecache", -0.3), ("belady (offline)", "belady", 5.0))
    )
    ablation = pd.DataFrame(
        {"component": c, "ttft_pct": v, "ttft_ci_low": v - 3, "ttft_ci_high": v + 3}
        for c, v in (("queue weights", 11.0), ("type weights", 2.0), ("position decay", -2.0))
    )
    mismatch = pd.DataFrame(
        {"target": t, "fitted_on": f, "variant": k, "value": v, "ci_low": v - 0.05}
        | {"ci_high": v + 0.05}
        for t, o in (("tool_use", "sharegpt_like"), ("sharegpt_like", "tool_use"))
        for k, f, v in (("matched", t, 0.99), ("mismatched", o, 1.02))
    )
    learned = pd.DataFrame(
        {"time_s": float(t), "gamma": 1 / (t + 1), "w_system": 8 - t / 4, "w_user_query": 1.0}
        | {f"alpha_{q}": 1 + t / 20 for q in ("evict_first", "chat", "agentic", "structural")}
        | {f"{k}_{q}": 2.28 - t / 40 for k in ("mu", "sigma") for q in ("chat", "agentic")}
        for t in range(20)
    )
    return {
        "ttft_ratio_figure": SAE.ttft_ratio_figure(ttft, "TTFT speedup"),
        "hit_vs_best_figure": SAE.hit_vs_best_figure(hit, "Hit rate"),
        "ablation_figure": SAE.ablation_figure(ablation, mismatch, "Ablation"),
        "learned_params_figure": SAE.learned_params_figure(learned, "Learned parameters"),
    }


def _repurpose_figures() -> dict[str, object]:
    """The KV-Repurpose study's figures on hand-made sweeps (the shapes study.sweep returns;
    tests/test_repurpose.py draws real ones)."""
    import pandas as pd

    caps = ["10GB", "30GB", "100GB", "1TB", "inf"]
    hits = pd.DataFrame(
        {"seed": s, "mode": m, "capacity": c, "token_hit_rate": base + 0.05 * i + 0.01 * s}
        for s in (0, 1)
        for m, base in (("prefix", 0.15), ("segment", 0.5))
        for i, c in enumerate(caps)
    )
    ttfts = pd.DataFrame(
        {"seed": s, "scheme": k, "capacity": c, "mean_ttft_ms": base - 5 * i + s}
        for s in (0, 1)
        for k, base in (("prefix", 90.0), ("naive", 50.0), ("epic", 52.0), ("cacheblend", 58.0))
        for i, c in enumerate(caps)
    )
    meta = pd.DataFrame({"seed": [0, 1], "prefix_ceiling": [0.3, 0.31]})
    meta["no_cache_ttft_ms"] = 110.0
    return {
        "hit_rate_figure": REP.hit_rate_figure(hits, meta, "Zipfian RAG"),
        "ttft_figure": REP.ttft_figure(ttfts, meta, "Zipfian RAG"),
        "sensitivity_figure": _repurpose_sensitivity_figure(),
        "quality_figure": _repurpose_quality_figure(),
        "repurpose_vllm_figure": _repurpose_vllm_figure(),
        "regime_figure": _regime_figure(),
    }


def _regime_figure():
    """A 3-axis map whose third axis makes two panels (tests/test_regimes.py checks the
    numbers; here only that it draws and passes the check)."""
    from skv.experiments import regimes as R

    cfg = R.RegimeConfig(
        id="toy", seeds=[0, 1], axes={"a": [1, 2], "b": ["x", "y"], "c": [0.1, 0.2]},
        method="m", baselines=["r"], reference="r", metric="t", better="lower",
        headline=1.4, paper_setup={"a": [1]}, rows="a", cols="b",
    )  # fmt: skip

    def cell(c, setting, seed):
        return {"m": {"t": 10.0}, "r": {"t": 10.0 * setting["a"] + seed}}

    rows = R.run_grid(cfg, cell, jobs=1)
    return R.regime_figure(cfg, R.summary(cfg, rows), "toy regime map (simulated)")


def _repurpose_sensitivity_figure():
    """One-at-a-time sweep rows (the shape sensitivity.sweep returns;
    tests/test_repurpose_sensitivity.py draws a real sweep)."""
    import pandas as pd

    from skv.experiments.repurpose import sensitivity as SS

    table = pd.DataFrame(
        {"parameter": name, "value": v, "seed": s, "prefix_hit_rate": 0.2 + 0.01 * s,
         "segment_hit_rate": 0.5 + 0.1 * i, "prefix_ceiling": 0.3,
         "prefix_inf_hit_rate": 0.28}
        for name, values in (("zipf_alpha", (0.6, 0.9, 1.2)), ("k", (2.0, 4.0, 8.0)))
        for i, v in enumerate(values)
        for s in (0, 1, 2)
    )  # fmt: skip
    return SS.sensitivity_figure(table, "Sensitivity", {"zipf_alpha": 0.9, "k": 4.0})


def _repurpose_quality_figure():
    """Per-item probe rows (the shape quality_probe writes; tests/test_repurpose_quality.py
    runs the real model)."""
    from skv.experiments.repurpose import probe_tasks as pt
    from skv.experiments.repurpose import quality as Q

    rows = [
        {"task": task, "item": i, "scheme": scheme, "answer": "1234", "chance": 1e-4,
         "text": x, "extracted": x, "recomputed": 0 if scheme != "full" else 10,
         "doc_tokens": 10}
        for task in pt.TASKS
        for scheme in Q.SCHEMES
        for i, x in enumerate(("1234", "1234", "99"))
    ]  # fmt: skip
    return Q.quality_figure(Q.summary(Q.frame(rows)), {"model": {"source": "x"}})


def _repurpose_vllm_figure():
    """Per-request cached tokens (the shape run_repurpose_vllm returns;
    tests/test_repurpose_vllm.py builds one from a real simulation)."""
    from skv.experiments.repurpose import engine as RE

    per_request = [
        {"measured_cached_tokens": 16 * (i % 3), "simulated_cached_tokens": 16 * (i % 3),
         "segment_cached_tokens": 32, "unbounded_prefix_cached_tokens": 48}
        for i in range(12)
    ]  # fmt: skip
    result = {"per_request": per_request, "exact_agreement": 1.0, "measured_hit_rate": 0.25,
              "simulated_hit_rate": 0.25, "segment_gain_pts": 20.0,
              "segment_lru_hit_rate": 0.45, "config": {"title": "Zipfian RAG on vLLM"}}  # fmt: skip
    return RE.repurpose_vllm_figure(result)


def _texts(fig) -> list[str]:
    return [t.get_text() for t in fig.findobj(Text) if t.get_visible() and t.get_text()]


# ----------------------------------------------------------------------------------------
# every figure passes


def test_every_figure_function_is_covered_here():
    """A new figure function anywhere in skv.experiments must be added to _paper_figures."""
    import importlib
    import pkgutil

    import skv.experiments as pkg

    drawn = set()
    for info in pkgutil.walk_packages(pkg.__path__, pkg.__name__ + "."):
        mod = importlib.import_module(info.name)
        if mod is plotstyle:  # plotstyle.figure is the blank canvas the others draw on
            continue
        drawn |= {
            name
            for name, fn in inspect.getmembers(mod, inspect.isfunction)
            if fn.__module__ == mod.__name__
            and not name.startswith("_")
            and inspect.signature(fn).return_annotation in ("Figure", "Figure | None")
        }
    assert drawn == {
        "policy_comparison",
        "bar_by_policy",
        "evictions_by_type",
        "adaptive_weights",
        "memory_utilisation",
        "hit_rate_vs_capacity",
        "fidelity_figure",
        "routing_figure",
        "gap_figure",
        "accuracy_figure",
        "hit_rate_figure",
        "ttft_figure",
        "ttft_ratio_figure",
        "hit_vs_best_figure",
        "ablation_figure",
        "learned_params_figure",
        "qps_figure",
        "load_figure",
        "eviction_figure",
        "sensitivity_figure",
        "quality_figure",
        "repurpose_vllm_figure",
        "fidelity_load_figure",
        "verdict_figure",
        "gap_heatmap",
        "regime_figure",
        "figure_ratios",  # saved through the check in tests/test_repurpose_tiered.py
        "figure_tiers",  # and in tests/test_claude_code_tiered.py
        "tuning_figure",  # and in tests/test_equal_tuning.py
    }


def test_every_paper_and_engine_figure_passes_the_check_and_is_saved(docs, curve, tmp_path):
    for name, fig in _paper_figures(docs, curve).items():
        pdf, png = save_figure(fig, tmp_path, name)
        assert png.read_bytes()[:8] == PNG_MAGIC, name
        assert pdf.read_bytes()[:5] == b"%PDF-", name


def test_every_run_plot_passes_the_check(docs, tmp_path):
    for k, doc in enumerate(docs):
        out = tmp_path / str(k)
        out.mkdir()
        paths = F.write_plots(doc, out)
        assert [p.name for p in paths] == list(PLOT_FILES)
        assert all(p.read_bytes()[:8] == PNG_MAGIC for p in paths)
    no_adaptive = _doc("no_adaptive", None, ["lru", "fifo"])  # the "no learned weights" panel
    assert not F.has_learned_weights(no_adaptive)
    (tmp_path / "none").mkdir()
    paths = F.write_plots(no_adaptive, tmp_path / "none")
    assert all(p.is_file() for p in paths)


def test_a_run_with_seven_policies_and_a_long_title_keeps_its_legends_on_the_canvas(tmp_path):
    # the full run's legal_review_long_context: a 4-column legend under the axes ran 2 px off
    # the canvas's right edge (the y label shifts the axes, and the legend with them)
    doc = _doc("legal_review_long_context", "Legal review, long context",
               ["fifo", "lru", "lfu", "size_lru", "static_semantic", "adaptive_semantic",
                "belady"])  # fmt: skip
    for r in doc["aggregate"]:  # the full run's token counts: wider tick labels
        r["cached_tokens"] = {k: v * 1000 if k != "n" else v
                              for k, v in r["cached_tokens"].items()}  # fmt: skip
    paths = F.write_plots(doc, tmp_path)
    assert all(p.is_file() for p in paths)


def test_figures_show_the_config_title_not_the_raw_id(docs):
    assert docs[0]["config"]["title"] == "A titled experiment"
    assert docs[1]["config"]["title"] == humanise_id("tiny_untitled") == "Tiny untitled"
    fig = policy_comparison(docs)
    texts = " ".join(_texts(fig)).replace("\n", " ")
    assert "A titled experiment" in texts and "Tiny untitled" in texts
    assert "tiny_titled" not in texts and "tiny_untitled" not in texts
    for fn in (F.evictions_by_type, F.memory_utilisation, F.adaptive_weights):
        texts = " ".join(_texts(fn(docs[0]))).replace("\n", " ")
        assert "A titled experiment" in texts and "tiny_titled" not in texts, fn.__name__


def test_experiment_and_engine_configs_have_titles():
    from skv.experiments.config import load_config
    from skv.experiments.fidelity import study as fidelity
    from skv.experiments.routing import study as routing_vllm

    for path in sorted((EXPERIMENTS / "semantickv").glob("*.yaml")):
        cfg = load_config(path)
        assert cfg.title != humanise_id(cfg.id), f"{path.name}: write a title"
    assert fidelity.load_config(EXPERIMENTS / "fidelity" / "fidelity_vllm.yaml")["title"]
    assert routing_vllm.load_config(EXPERIMENTS / "routing" / "routing_vllm.yaml")["title"]


def test_replay_configs_have_titles(tmp_path):
    for path in sorted((EXPERIMENTS / "replay").glob("*.yaml")):
        data = yaml.safe_load(path.read_text())
        assert data.get("title") and data["title"] != data["id"], path.name
    for name in ("mooncake_capacity", "claude_code_capacity"):
        cfg = C.load_replay_config(EXPERIMENTS / "replay" / f"{name}.yaml", quick=True)
        assert (
            cfg["title"]
            == yaml.safe_load((EXPERIMENTS / "replay" / f"{name}.yaml").read_text())["title"]
        )
    bare = tmp_path / "bare_replay.yaml"
    bare.write_text("id: my_replay\ntrace: x.jsonl\npolicies: [lru]\ncapacities: ['1%']\n")
    assert C.load_replay_config(bare, quick=False)["title"] == "My replay"


def _line_colours(fig) -> dict[str, str]:
    ax = fig.axes[0]
    return {
        line.get_label().split(" ")[0]: to_hex(line.get_color())
        for line in ax.get_lines()
        if not line.get_label().startswith("_")
    }


def test_the_method_is_coloured_and_the_baselines_grey(docs, curve):
    """Issue 34: the method under study in its colour, every other online policy grey, the
    bounds (Belady, the infinite-cache ceiling) dashed; the method first in the legend."""
    grey = to_hex(GREY_LINE)
    for fig, method in (
        (F.memory_utilisation(docs[0]), "adaptive_semantic"),
        (C.hit_rate_vs_capacity(curve, "t"), "saecache"),
    ):
        colours = _line_colours(fig)
        assert colours[method] == POLICY_STYLES[method][0].lower()
        assert colours["lru"] == grey and colours["fifo"] == grey
        ax = fig.axes[0]
        assert ax.get_legend().get_texts()[0].get_text() == method
        assert fig.__dict__[plotstyle.METHOD_ATTR] == (method,)
        for line in ax.get_lines():
            if line.get_label().startswith(("belady", "infinite cache")):
                assert line.get_linestyle() == "--", line.get_label()
    # the method is a parameter: fifo alone in colour, saecache grey
    colours = _line_colours(C.hit_rate_vs_capacity(curve, "t", method="fifo"))
    assert colours["fifo"] == POLICY_STYLES["fifo"][0].lower() and colours["saecache"] == grey
    # the hit-rate figure says it is simulated
    assert "simulated" in C.hit_rate_vs_capacity(curve, "t").axes[0].get_title()
    # bars: the same colour for the same policy, the rest grey-filled and told apart by hatch
    bar = policy_style("lru", kind="bar")
    assert to_hex(bar["color"]) == POLICY_STYLES["lru"][0].lower()
    others = [policy_style(p, kind="bar") for p in ("fifo", "lfu", "static_semantic", "vllm")]
    assert len({o["hatch"] for o in others}) == len(others)
    assert len({o["color"] for o in others}) == 1
    # no two known policies look alike: (colour, marker) and hatch are unique per name
    assert len({(c, m) for c, m, _ in POLICY_STYLES.values()}) == len(POLICY_STYLES)
    assert len({h for _, _, h in POLICY_STYLES.values()}) == len(POLICY_STYLES)


#: the comparison figures and the method each is about (issue 34)
COMPARISON_FIGURES = {
    "policy_comparison": "adaptive_semantic",
    "bar_by_policy": "adaptive_semantic",
    "memory_utilisation": "adaptive_semantic",
    "memory_utilisation_pinned": "adaptive_semantic",
    "hit_rate_vs_capacity": "saecache",
    "gap_figure": "saecache",
    "ttft_ratio_figure": "saecache",
    "hit_vs_best_figure": "saecache",
    "eviction_figure": "saecache",
    "qps_figure": "cacheroute",
    "load_figure": "cacheroute",
    "hit_rate_figure": "segment",
    "ttft_figure": "segment",
    "sensitivity_figure": "segment",
}


def test_every_comparison_figure_declares_its_method(docs, curve):
    """The checker verifies the style rule only for figures that declare their method: every
    comparison figure must (so the rule cannot be skipped by forgetting it)."""
    figs = _paper_figures(docs, curve)
    for name, method in COMPARISON_FIGURES.items():
        declared = getattr(figs[name], plotstyle.METHOD_ATTR, None)
        assert declared and method in declared, f"{name}: declares {declared}, not {method}"
        assert not plotstyle._comparison_problems(figs[name]), name


def test_log_ticks_are_plain_numbers(docs):
    fig = F.adaptive_weights(docs[0])
    fig.canvas.draw()
    labels = [t.get_text() for t in fig.axes[0].get_yticklabels() if t.get_text()]
    assert labels, "no y tick labels"
    for label in labels:
        float(label.replace(",", ""))  # "0.5", "2", not "$\\mathdefault{10^{0}}$"


def test_the_fidelity_figure_draws_measured_as_markers_over_simulated_as_a_line():
    fid, _ = _engine_results()
    fig = fidelity_figure(fid)
    for ax in fig.axes:
        lines = {line.get_label(): line for line in ax.get_lines()}
        measured = [line for label, line in lines.items() if "measured" in label]
        model = [line for label, line in lines.items() if "measured" not in label]
        assert len(measured) == 1 and len(model) == 1
        assert measured[0].get_linestyle() == "None" and measured[0].get_marker() not in (
            None,
            "None",
            "",
        )
        assert model[0].get_linestyle() == "-"
        assert measured[0].get_zorder() > model[0].get_zorder()


# ----------------------------------------------------------------------------------------
# the check rejects


def test_a_missing_axis_label_is_rejected(tmp_path):
    fig = figure()
    ax = fig.add_subplot()
    ax.plot([1, 2, 3], [1, 4, 9])
    ax.set_xlabel("x")
    with pytest.raises(ValueError, match=r"figure 'unlabelled': axes 0 has data but no y label"):
        save_figure(fig, tmp_path, "unlabelled")
    assert not list(tmp_path.iterdir()), "a rejected figure must not be written"
    exempt_axes(ax, "a sketch")
    save_figure(fig, tmp_path, "exempt")


def test_a_missing_legend_is_rejected(tmp_path):
    fig = figure()
    ax = fig.add_subplot()
    ax.plot([1, 2], [1, 2], label="lru")
    ax.plot([1, 2], [2, 1], label="fifo")
    ax.set_xlabel("x")
    ax.set_ylabel("y")
    with pytest.raises(
        ValueError, match=r"figure 'no_legend': .*no legend shows \['lru', 'fifo'\]"
    ):
        save_figure(fig, tmp_path, "no_legend")
    ax.legend(handles=ax.get_lines()[:1])  # a legend missing one series is no better
    with pytest.raises(ValueError, match=r"no legend shows \['fifo'\]"):
        check_figure(fig, "half_legend")
    ax.legend()
    check_figure(fig, "legend")


def test_run_plots_are_checked_before_they_are_written(tmp_path, docs):
    fig = figure()
    ax = fig.add_subplot()
    ax.plot([1, 2], [1, 2], label="a")
    ax.plot([1, 2], [2, 1], label="b")
    F._footnote(fig, docs[0])
    with pytest.raises(ValueError, match=r"figure 'bad.png': axes 0 has data but no x or y label"):
        F._save(fig, tmp_path / "bad.png")
    assert not (tmp_path / "bad.png").exists()


def test_one_labelled_series_needs_no_legend():
    fig = figure()
    ax = fig.add_subplot()
    ax.plot([1, 2], [1, 2], label="only")
    ax.set_xlabel("x")
    ax.set_ylabel("y")
    fig.tight_layout()
    check_figure(fig, "one_series")


def test_a_clipped_title_is_rejected(tmp_path):
    fig = figure("column", 2.0)
    ax = fig.add_subplot()
    ax.plot([1, 2], [1, 2])
    ax.set_xlabel("x")
    ax.set_ylabel("y")
    ax.set_title("a title far too long for a single column figure, so it runs off both sides")
    with pytest.raises(
        ValueError, match=r"figure 'clipped': title of axes 0 .* outside the canvas"
    ):
        save_figure(fig, tmp_path, "clipped")


def test_text_off_the_canvas_and_wrapped_text_are_rejected():
    fig = figure()
    ax = fig.add_subplot()
    ax.plot([1, 2], [1, 2])
    ax.set_xlabel("x")
    ax.set_ylabel("y")
    fig.tight_layout()
    fig.text(0.99, 0.5, "a note past the right edge")
    with pytest.raises(ValueError, match=r"figure text 'a note past the right edge' .*right by"):
        check_figure(fig, "note")
    fig.texts[-1].set_visible(False)
    check_figure(fig, "note_hidden")
    fig.text(0.0, 0.0, "wrapped", wrap=True)
    with pytest.raises(ValueError, match="wrap=True"):
        check_figure(fig, "wrapped")
