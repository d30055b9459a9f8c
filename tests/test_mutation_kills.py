"""Mutation testing support: `./reproduce.sh mutate`, scripts/mutate.py, mutation_survivors.md.

The first test guards the pure-Python mode of a mutation run; the others kill mutants that the
rest of the suite let survive.
"""

from __future__ import annotations

import importlib
import json
import math
import os
from pathlib import Path

import pytest

import skv
from skv._build import hot_path


def test_a_mutation_run_imports_no_compiled_module():
    """Under mutmut every hot-path module must come from its ``.py``: a compiled ``.so`` beside a
    mutated ``.py`` would run the unmutated code and every mutant of it would 'survive' untested.

    mutmut sets ``MUTANT_UNDER_TEST`` in its runs; a plain pytest run skips this test. mutmut stops
    at its clean-test step when this fails, e.g. when ``mutmut run`` is started in the checkout
    instead of through scripts/mutate.py.
    """
    if "MUTANT_UNDER_TEST" not in os.environ:
        pytest.skip("only meaningful inside a mutmut run")
    root = Path(skv.__file__).resolve().parent.parent
    assert root.name == "mutants", f"skv imported from {root}, not from mutmut's mutants/ copy"
    modules = hot_path(root)
    assert modules, "no hot-path module found: the .pxd files were not copied"
    for rel in modules:
        mod = importlib.import_module(rel.removesuffix(".py").replace("/", "."))
        assert mod.__file__ is not None and mod.__file__.endswith(".py"), mod.__file__


# ----------------------------------------------------------------------------------------
# skv/artifact/claims.py: exact boundaries, the rows' fields, the messages and the table

from skv.artifact import claims as C  # noqa: E402

EPS = C.EPS
STEP = "fig_hit_rate_mooncake"


def _claim(**over) -> C.Claim:
    """helpers.make_claim with expected 0 and the default unit."""
    from helpers import make_claim

    return make_claim(**{"expected": 0.0, "unit": "number", **over})


def _seeded(**over) -> C.Claim:
    return _claim(tolerance_basis="ci95 over seeds 0-4", **over)


@pytest.mark.parametrize(
    ("expr", "lo", "hi", "ok"),
    [
        # each side of each thesis exactly at its EPS-widened bound holds (t = 0 and binary-exact
        # ends, so lo - EPS and hi + EPS are computed exactly)
        ("in [0, 1]", -EPS, 0.5, True),
        ("in [0, 1]", 0.5, 1 + EPS, True),
        (">= 0", -EPS, 1.0, True),
        ("<= 0", -1.0, EPS, True),
        ("<= 0", -1.0, 0.0, True),
        ("~ 0", EPS, 1.0, True),
        ("~ 0", -1.0, -EPS, True),
        ("> 0", 0.0, 1.0, False),
        ("< 0", -1.0, 0.0, False),
    ],
)
def test_each_thesis_holds_exactly_at_its_bound(expr, lo, hi, ok):
    assert C.holds(expr, C.Produced((lo + hi) / 2, (lo, hi))) is ok


def test_a_thesis_that_does_not_parse_is_named_with_the_accepted_forms():
    with pytest.raises(ValueError, match=r"holds 'about 3': write '> 0'"):
        C.holds("about 3", C.Produced(1.0))
    with pytest.raises(ValueError, match="lower end is above its upper end"):
        _claim(holds="in [2, 1]", expected=1.5, quick={"not_checked": "n/a"})
    assert _claim(holds="in [0, 0]", quick={"not_checked": "n/a"}).holds == "in [0, 0]"


def test_a_value_at_the_tolerance_plus_eps_passes():
    c = _claim(expected=0.0, tolerance=0.5)
    assert (
        C.check_one(c, C.Produced(0.5 + EPS), quick=False, skip_reason=None, wrote=True).status
        == "ok"
    )


def test_an_interval_exactly_as_wide_as_the_tolerance_plus_eps_is_covered():
    c = _seeded(expected=0.0, tolerance=0.5)
    got = C.Produced(0.0, (-0.25, 0.5 + EPS), 5)
    row = C.check_one(c, got, quick=False, skip_reason=None, wrote=True)
    assert (row.status, row.why) == ("ok", "")


def test_expectations_add_min_seeds_only_to_seeded_claims():
    det = _claim()
    assert det.expectation(quick=True).min_seeds is None
    assert det.expectation(quick=False).min_seeds is None
    assert _seeded().expectation(quick=True).min_seeds == 2
    assert _seeded().expectation(quick=False).min_seeds == C.MIN_SEEDS_FULL
    q = {"expected": 2.0, "tolerance": 1.0, "min_seeds": 4}
    assert _claim(quick=q).expectation(quick=True).min_seeds == 4  # given: kept, seeded or not
    assert _seeded(quick=q).expectation(quick=True).min_seeds == 4


def test_two_seeds_are_enough_in_quick_mode_and_an_unknown_count_is_zero_seeds():
    c = _seeded(quick={"expected": 0.0, "tolerance": 1.0})
    two = C.check_one(c, C.Produced(0.0, (-0.1, 0.1), 2), quick=True, skip_reason=None, wrote=True)
    assert two.status == "ok"
    c1 = _seeded(quick={"expected": 0.0, "tolerance": 1.0, "min_seeds": 1})
    row = C.check_one(c1, C.Produced(0.0, (-0.1, 0.1)), quick=True, skip_reason=None, wrote=True)
    assert (row.status, row.why) == ("FAIL", "the interval rests on 0 seeds; needs 1")


def test_rows_carry_the_expectation_and_what_was_produced():
    c = _claim(quick={"not_checked": "too small"})
    got = C.Produced(0.25)
    row = C.check_one(c, got, quick=True, skip_reason=None, wrote=True)
    assert (row.status, row.expected, row.tolerance, row.got, row.why) == (
        "not checked",
        None,
        None,
        got,
        "quick mode: too small",
    )
    c = _claim()
    for kw, status in [
        ({"skip_reason": "no trace"}, "skipped"),
        ({"skip_reason": None}, "ok"),
    ]:
        row = C.check_one(c, got, quick=False, wrote=True, **kw)
        assert (row.status, row.expected, row.tolerance, row.got) == (status, 0.0, 0.5, got)
    row = C.check_one(c, None, quick=False, skip_reason=None, wrote=True)
    assert (row.status, row.expected, row.tolerance, row.got) == ("missing", 0.0, 0.5, None)
    bad = C.Produced(3.0)
    row = C.check_one(c, bad, quick=False, skip_reason=None, wrote=True)
    assert (row.status, row.expected, row.tolerance, row.got) == ("FAIL", 0.0, 0.5, bad)


def test_a_missing_value_says_the_command_that_produces_it():
    c = _claim()
    full = C.check_one(c, None, quick=False, skip_reason=None, wrote=False)
    quick = C.check_one(c, None, quick=True, skip_reason=None, wrote=False)
    assert full.why == f"{STEP} has not run: ./reproduce.sh {STEP}"
    assert quick.why == f"{STEP} has not run: ./reproduce.sh --quick {STEP}"


def test_failure_reasons_are_joined_and_name_the_value_or_the_interval():
    c = _seeded(expected=0.5, tolerance=0.1, holds="> 0", quick={"not_checked": "n/a"})
    row = C.check_one(c, C.Produced(-1.0), quick=False, skip_reason=None, wrote=True)
    assert row.why == (
        "|-1 - 0.5| > tolerance 0.1; thesis '> 0' false on the value; "
        "tolerance basis is the seed spread, but the step wrote no interval; "
        "the interval rests on 0 seeds; needs 5"
    )
    row = C.check_one(
        c, C.Produced(0.5, (-0.25, 1.0), 5), quick=False, skip_reason=None, wrote=True
    )
    assert row.why == (
        "thesis '> 0' false on the interval [-0.25, 1]; "
        "tolerance 0.1 is narrower than the 95% interval (±0.75)"
    )


def test_produced_parse_without_an_interval():
    assert C.Produced.parse({"value": 2, "n": 3}) == C.Produced(2.0, None, 3)
    assert C.Produced.parse({"value": 2, "ci95": [1, 3]}) == C.Produced(2.0, (1.0, 3.0), None)


def test_a_claims_file_without_values_reads_as_no_values(tmp_path):
    (tmp_path / C.CLAIMS_FILE).write_text(json.dumps({"step": STEP}))
    assert C.read_values(tmp_path) == {}
    assert C.read_values(tmp_path / "absent") is None


def _write(tmp_path, claims) -> Path:
    import yaml

    f = tmp_path / "claims.yaml"
    f.write_text(yaml.safe_dump({"claims": claims}))
    return f


def _raw(**over) -> dict:
    return {
        **_claim().model_dump(exclude_none=True, exclude={"quick"}),
        "quick": {"expected": 2.0, "tolerance": 0.1},
        **over,
    }


def test_load_claims_errors_name_file_claim_and_field(tmp_path):
    bad = _raw(id="alpha", tolerance=-1.0)
    del bad["text"]
    noid = _raw()
    del noid["id"]
    f = _write(tmp_path, [bad, noid])
    with pytest.raises(ValueError) as exc:
        C.load_claims(f, [STEP])
    lines = str(exc.value).split("\n")
    assert lines[0] == f"{f}: claim alpha.text: Field required"
    assert lines[1].startswith(f"{f}: claim alpha.tolerance: Input should be greater than")
    assert lines[2] == f"{f}: claim ?.id: Field required"
    f.write_text("claims: [unclosed")
    with pytest.raises(ValueError, match=f"^{f}: not valid YAML: "):
        C.load_claims(f, [STEP])


def test_load_claims_errors_outside_a_claim_name_their_field(tmp_path):
    import yaml

    f = tmp_path / "claims.yaml"
    f.write_text(yaml.safe_dump({"no_claims": {STEP: 3}}))
    with pytest.raises(ValueError) as exc:
        C.load_claims(f, [STEP])
    assert str(exc.value).split("\n") == [
        f"{f}: claims: Field required",
        f"{f}: no_claims.{STEP}: Input should be a valid string",
    ]


def test_load_claims_rejects_unknown_steps_and_duplicate_ids_by_name(tmp_path):
    f = _write(tmp_path, [_raw(id="a"), _raw(id="b"), _raw(id="a")])
    with pytest.raises(ValueError, match=f"^{f}: claim a: duplicate id$"):
        C.load_claims(f, [STEP])
    f = _write(tmp_path, [_raw(id="a", step="nope")])
    with pytest.raises(ValueError, match=f"^{f}: claim a: unknown step 'nope'$"):
        C.load_claims(f, [STEP])
    assert [
        c.id for c in C.load_claims(_write(tmp_path, [_raw(id="a"), _raw(id="b")]), [STEP]).claims
    ] == ["a", "b"]


def test_format_rows_exactly():
    a = _claim(id="a", quick={"not_checked": "small"})
    b = _seeded(id="b", expected=1.0, tolerance=0.5, quick={"not_checked": "small"})
    rows = [
        C.check_one(a, None, quick=True, skip_reason=None, wrote=False),
        C.check_one(b, C.Produced(1.25, (1.0, 1.5), 5), quick=False, skip_reason=None, wrote=True),
    ]
    assert C.format_rows(rows).split("\n") == [
        "claim   expected     tol       got              95% CI  status",
        "a              -       -         -                   -  not checked",
        "b              1     0.5      1.25            [1, 1.5]  ok",
        "",
        "  a (not checked): quick mode: small",
    ]


# ----------------------------------------------------------------------------------------
# skv/routing: the view without a cache, max_imbalance, one matched block, semantic weights

from skv.blocks import request_blocks  # noqa: E402
from skv.model import Request, Segment, SemanticType, content_hash  # noqa: E402
from skv.routing import FixedView, make_router  # noqa: E402

T = SemanticType


def _rb(*segments):
    segs = [Segment(t, n, content_hash(f"{t.value}-{n}-{i}")) for i, (t, n) in enumerate(segments)]
    return request_blocks(Request("r", 0.0, segs), 16, "prefix")


RB = _rb((T.SYSTEM, 64), (T.USER_QUERY, 64))  # 4 system blocks, then 4 user-query blocks


def test_a_view_without_a_cache_matches_nothing_and_a_lookup_is_a_float():
    assert FixedView(3).match(RB) == 0.0
    m = FixedView(3, lookup=lambda _rb: 2).match(RB)
    assert m == 2.0 and isinstance(m, float)


@pytest.mark.parametrize("name", ["prefix_locality", "semantic_locality", "precise"])
def test_max_imbalance_zero_is_allowed_and_negative_is_refused(name):
    assert make_router(name, max_imbalance=0).max_imbalance == 0
    with pytest.raises(ValueError, match="max_imbalance must be >= 0 or None, got -1"):
        make_router(name, max_imbalance=-1)


@pytest.mark.parametrize("name", ["prefix_locality", "semantic_locality", "precise"])
def test_max_imbalance_reaches_every_locality_router(name):
    views = [FixedView(10, 0, lambda _rb: 4.0), FixedView(0, 0, None)]
    r = make_router(name, max_imbalance=2).rank(RB, views)
    assert r.order == [1, 0] and r.reason == f"{name}: imbalance > 2, least loaded"


def test_one_matched_block_is_a_match_not_the_least_loaded_fallback():
    views = [FixedView(5, 0, lambda _rb: 1.0), FixedView(0, 0, None)]
    r = make_router("prefix_locality").rank(RB, views)
    assert (r.order, r.reason) == ([0, 1], "prefix_locality")


def test_semantic_types_without_a_weight_count_one_and_scores_keep_three_decimals():
    sem = make_router("semantic_locality", weights={T.SYSTEM: 1 / 3})
    views = [FixedView(0, 0, lambda _rb: 6.0)]  # 4 system blocks, 2 user-query blocks
    assert sem.rank(RB, views).scores == [round(64 / 3 + 32 * 1.0, 3)] == [53.333]
    # block types come as indices (the simulator's blocks) or as types/names
    assert sem._weight(T.SYSTEM) == sem._weight("system") == 1 / 3
    assert sem._weight(T.CODE) == 1.0


# ----------------------------------------------------------------------------------------
# skv/latency: multi-chunk iterations, describe() keys, the calibrated fit's edges and messages

import logging  # noqa: E402
from types import SimpleNamespace  # noqa: E402

import numpy as np  # noqa: E402

from skv.latency import (  # noqa: E402
    CalibratedFit,
    CalibratedLatency,
    Iteration,
    LinearLatency,
    PrefillChunk,
    RooflineLatency,
    fit,
    fit_from_requests,
    get_gpu,
    make_latency_model,
)
from skv.sizing import get_model  # noqa: E402

TWO_CHUNKS = Iteration(prefill=(PrefillChunk(100, 50), PrefillChunk(30, 0)))


def test_every_prefill_chunk_counts_in_the_calibrated_model():
    m = CalibratedLatency(base_ms=10.0, ms_per_uncached_token=0.5, ms_per_cached_token=0.25)
    assert m.iteration_ms(TWO_CHUNKS) == 10.0 + 0.5 * 130 + 0.25 * 50


def test_every_prefill_chunk_counts_in_the_roofline():
    m = RooflineLatency()
    alone = [m.breakdown(Iteration(prefill=(c,))) for c in TWO_CHUNKS.prefill]
    both, empty = m.breakdown(TWO_CHUNKS), m.breakdown(Iteration())
    for key in ("compute_ms", "memory_ms"):
        extra = sum(a[key] - empty[key] for a in alone)
        assert both[key] - empty[key] == pytest.approx(extra, rel=1e-12)


def test_roofline_breakdown_adds_comm_and_overhead_and_an_empty_step_has_no_comm():
    m = RooflineLatency(tp=2, overhead_ms=3.0)
    b = m.breakdown(Iteration.lone_prefill(64))
    assert b["comm_ms"] > 0
    assert b["total_ms"] == max(b["compute_ms"], b["memory_ms"]) + b["comm_ms"] + 3.0
    e = m.breakdown(Iteration())
    assert e["comm_ms"] == 0.0 and e["total_ms"] == e["memory_ms"] + 3.0
    assert set(b) == {"compute_ms", "memory_ms", "comm_ms", "overhead_ms", "total_ms", "bound"}


def test_roofline_accepts_a_preset_object_and_validates_its_bounds():
    preset = get_model("qwen2.5-1.5b")
    assert RooflineLatency(model=preset).describe() == RooflineLatency().describe()
    RooflineLatency(mfu=1.0, mbu=1.0, overhead_ms=0.0, allreduce_latency_ms=0.0)  # all allowed
    for bad in ({"mfu": 0.0}, {"mbu": 1.5}):
        with pytest.raises(ValueError, match="must be in \\(0, 1\\]"):
            RooflineLatency(**bad)
    for bad in ({"overhead_ms": -1.0}, {"allreduce_latency_ms": math.inf}):
        (key,) = bad
        with pytest.raises(ValueError, match=f"roofline latency: {key} must be finite and >= 0"):
            RooflineLatency(**bad)


def test_describe_names_every_constant():
    r = RooflineLatency().describe()
    assert set(r) == {"model", "formula", "constants", "source"}
    assert set(r["constants"]) == {
        "llm", "num_params", "num_layers", "hidden_size", "weight_dtype_bytes",
        "kv_bytes_per_token", "gpu", "peak_tflops", "hbm_gbs", "interconnect_gbs", "tp", "mfu",
        "mbu", "overhead_ms", "allreduce_latency_ms",
    }  # fmt: skip
    assert r["constants"]["llm"] == "qwen2.5-1.5b" and r["constants"]["gpu"] == "A40"
    assert r["source"].endswith("; model preset skv.sizing.qwen2.5-1.5b")
    lin = LinearLatency().describe()
    assert lin["source"] == "SemanticKV seed README (formula); constants illustrative unless set"
    c = CalibratedLatency(base_ms=1.0, ms_per_uncached_token=0.5).describe()
    assert c["constants"] == {
        "base_ms": 1.0, "ms_per_uncached_token": 0.5, "ms_per_cached_token": 0.0,
        "decode_ms_per_seq": 0.5, "ms_per_decode_context_token": 0.0,
        "ms_per_prefill_attention_kpair": 0.0,
    }  # fmt: skip
    assert "fit" not in c


def test_lone_prefill_and_ttft_default_to_no_cached_context():
    assert Iteration.lone_prefill(8) == Iteration(prefill=(PrefillChunk(8, 0),))
    m = RooflineLatency()
    assert m.ttft_ms(512) == m.iteration_ms(Iteration(prefill=(PrefillChunk(512, 0),)))
    assert (
        Iteration.with_decodes(decode_contexts=(0, 3)).decode_seqs == 2
    )  # a zero context is valid
    with pytest.raises(ValueError, match=r"PrefillChunk\(tokens=-1, context_before=0\): both"):
        PrefillChunk(-1)


def test_unknown_and_missing_latency_parameters_are_listed():
    with pytest.raises(ValueError) as exc:
        make_latency_model("linear", zeta=1, alpha=2)
    assert str(exc.value) == (
        "latency model 'linear': unknown parameter(s) alpha, zeta; "
        "accepted: base_ttft_ms, token_latency_ms, decode_ms_per_seq"
    )
    with pytest.raises(ValueError) as exc:
        make_latency_model("calibrated", base_ms=1.0)
    assert str(exc.value) == (
        "latency model 'calibrated': missing required parameter(s) ms_per_uncached_token"
        " (fit one with skv.latency.fit(...).to_model())"
    )
    with pytest.raises(ValueError, match="unknown GPU preset 'X1'; known: A40, "):
        get_gpu("X1")


def _hand_fit() -> CalibratedFit:
    return CalibratedFit(
        base_ms=10.0,
        ms_per_uncached_token=0.5,
        ms_per_cached_token=0.25,
        r2=0.75,
        residuals_ms=np.arange(11, dtype=float),
        n=11,
        cached_term=True,
    )


def test_calibrated_prediction_residuals_report_and_model_by_hand():
    f = _hand_fit()
    assert f.predict_ms(100, 40) == 10.0 + 50.0 + 10.0
    assert f.predict_ms(100) == 60.0
    assert list(f.predict_ms([0, 2], [4, 0])) == [11.0, 11.0]
    s = f.residual_summary()
    assert (s["p50_abs_ms"], s["p95_abs_ms"]) == (5.0, 9.5)
    rep = f.report()
    assert rep["model"] == "calibrated"
    assert rep["formula"] == (
        "ttft_ms = base_ms + ms_per_uncached_token * uncached + ms_per_cached_token * cached"
    )
    fixed = CalibratedFit(**{**f.__dict__, "cached_term": False}).report()["formula"]
    assert fixed == "ttft_ms = base_ms + ms_per_uncached_token * uncached (cached term fixed 0)"
    assert f.to_model().describe()["fit"] == {"r2": 0.75, "n": 11.0}


# rows (uncached, cached, ttft): ttft = 10 + uncached, off by +-1 -> residuals known exactly
_ROWS = [(0, 0, 11.0), (10, 0, 19.0), (20, 0, 31.0), (30, 0, 39.0)]


def test_calibrated_fit_r2_exact_and_degenerate_cases(caplog):
    with caplog.at_level(logging.INFO, logger="skv.latency.calibrated"):
        f = fit(_ROWS)
    # least squares on 4 points: slope 0.96, intercept 10.6; r2 = 1 - ss_res / ss_tot
    ttft = np.array([r[2] for r in _ROWS])
    res = ttft - (f.base_ms + f.ms_per_uncached_token * np.array([r[0] for r in _ROWS]))
    want = 1 - (res @ res) / ((ttft - ttft.mean()) @ (ttft - ttft.mean()))
    assert f.r2 == pytest.approx(want, rel=1e-9) and 0.9 < f.r2 < 1
    assert f.cached_term is False and f.ms_per_cached_token == 0.0
    msgs = [r.getMessage() for r in caplog.records]
    assert msgs[0] == (
        "calibrated fit: no observation has cached tokens; fixing ms_per_cached_token=0"
    )
    assert msgs[-1] == f.report_text()
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
    flat = fit([(5, 0, 7.0)] * 3)  # nothing varies: r2 = 1 when the fit is exact
    assert flat.r2 == 1.0
    with pytest.raises(ValueError, match="need at least 3 observations, got 0"):
        fit([])
    with pytest.raises(ValueError, match=r"^calibrated fit: token counts and TTFTs must be >= 0$"):
        fit([(1, 0, 5.0), (2, 0, -1.0), (3, 0, 7.0)])
    with pytest.raises(ValueError, match=r"^calibrated fit: observations contain NaN or infinite"):
        fit([(1, 0, 5.0), (2, 0, math.inf), (3, 0, 7.0)])


def test_calibrated_fit_warns_when_a_coefficient_cannot_be_identified(caplog):
    with caplog.at_level(logging.WARNING, logger="skv.latency.calibrated"):
        fit([(5, 1, 7.0), (5, 1, 8.0), (5, 1, 9.0)])
    assert any("do not vary enough" in r.getMessage() for r in caplog.records)


def _req(i, prompt, cached, ttft):
    # one second apart: each finds the engine idle (fit_from_requests fits only those)
    return SimpleNamespace(request_id=f"r{i}", prompt_tokens=prompt, arrival_s=float(i), extra={},
                           observed_cached_tokens=cached, observed_ttft_ms=ttft)  # fmt: skip


def test_fit_from_requests_edges(caplog):
    reqs = [_req(0, 10, 10, 12.0), _req(1, 20, 0, 30.0), _req(2, 30, 5, 37.0)]
    f = fit_from_requests(reqs, cached_term=False)  # exactly 3; a fully cached prompt is fine
    assert f.n == 3 and f.cached_term is False and f.ms_per_cached_token == 0.0
    with caplog.at_level(logging.INFO, logger="skv.latency.calibrated"):
        fit_from_requests([*reqs, _req(3, 5, None, 1.0), _req(4, 5, 1, None)])
    assert "calibrated fit: skipped 2 request(s) without observations" in [
        r.getMessage() for r in caplog.records
    ]
    with pytest.raises(ValueError, match=r"only 2 request\(s\) .* \(1 without observations\)"):
        fit_from_requests([*reqs[:2], _req(3, 5, None, 1.0)])


def test_latency_constants_may_be_zero_but_not_negative():
    LinearLatency(base_ttft_ms=0.0, token_latency_ms=0.0, decode_ms_per_seq=0.0)
    CalibratedLatency(base_ms=0.0, ms_per_uncached_token=0.0)
    with pytest.raises(ValueError, match=r"^calibrated latency: base_ms must be finite and >= 0, "):
        CalibratedLatency(base_ms=-1.0, ms_per_uncached_token=0.5)
    with pytest.raises(ValueError, match=r"decode_ms_per_seq must be finite and >= 0, got -0\.5"):
        CalibratedLatency(base_ms=1.0, ms_per_uncached_token=0.5, decode_ms_per_seq=-0.5)
    with pytest.raises(ValueError, match="missing required parameter\\(s\\) base_ms, ms_per_unc"):
        make_latency_model("calibrated")


def test_calibrated_fit_r2_when_the_ttfts_vary_by_less_than_one_ms():
    rows = [(0, 0, 1.0), (1, 0, 1.5), (2, 0, 1.0), (3, 0, 1.5)]  # ss_tot = 0.25
    f = fit(rows)
    ttft = np.array([r[2] for r in rows])
    res = ttft - (f.base_ms + f.ms_per_uncached_token * np.arange(4))
    assert f.r2 == pytest.approx(1 - (res @ res) / 0.25, rel=1e-9)
    assert 0 < f.r2 < 1


def test_the_unidentifiable_fit_warning_in_full(caplog):
    with caplog.at_level(logging.WARNING, logger="skv.latency.calibrated"):
        fit([(5, 1, 7.0), (5, 1, 8.0), (5, 1, 9.0)])
    assert [r.getMessage() for r in caplog.records] == [
        "calibrated fit: the observations do not vary enough to identify every coefficient "
        "(e.g. all prompts the same length); the fit is one of many equally good ones"
    ]


def test_calibrated_fit_takes_any_iterable_of_rows():
    rows = [(0, 0, 11.0), (10, 0, 19.0), (20, 0, 31.0), (30, 0, 39.0)]
    assert fit(r for r in rows).params == fit(np.array(rows)).params == fit(rows).params
