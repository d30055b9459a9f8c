"""Latency models: the seed's linear formula, the roofline's regimes, and the calibrated fit."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from helpers import req, seg

from skv.latency import (
    LATENCY_MODELS,
    CalibratedLatency,
    Iteration,
    LatencyModel,
    LinearLatency,
    PrefillChunk,
    RooflineLatency,
    fit,
    fit_from_requests,
    get_gpu,
    make_latency_model,
)
from skv.model import SemanticType

DECODE_HEAVY = Iteration.with_decodes(decode_contexts=(2000,) * 32)
PREFILL_HEAVY = Iteration(prefill=(PrefillChunk(4096, 0),))


def all_models() -> list[LatencyModel]:
    return [
        LinearLatency(),
        RooflineLatency(),
        RooflineLatency(model="llama-3.1-8b", gpu="A100", tp=2),
        CalibratedLatency(base_ms=25.0, ms_per_uncached_token=0.04, ms_per_cached_token=0.002),
    ]


# --- base --------------------------------------------------------------------------------------


def test_iteration_helpers_count_tokens_and_sequences():
    it = Iteration.with_decodes(
        prefill=(PrefillChunk(100, 50), PrefillChunk(30)), decode_contexts=(10, 20, 5)
    )
    assert it.prefill_tokens == 130
    assert it.prefill_context_tokens == 50
    assert it.decode_seqs == 3
    assert it.decode_context_tokens == 35
    assert it.batch_tokens == 133
    assert Iteration().is_empty and not it.is_empty


def test_negative_token_counts_are_rejected():
    with pytest.raises(ValueError, match="must be >= 0"):
        PrefillChunk(-1, 0)
    with pytest.raises(ValueError, match="must be >= 0"):
        PrefillChunk(1, -5)
    with pytest.raises(ValueError, match="decode_contexts"):
        Iteration.with_decodes(decode_contexts=(3, -1))
    with pytest.raises(ValueError, match="both must be >= 0"):
        Iteration(decode_seqs=-1)
    with pytest.raises(ValueError, match="both must be >= 0"):
        Iteration(decode_seqs=2, decode_context_tokens=-1)
    with pytest.raises(ValueError, match="without decoding requests"):
        Iteration(decode_context_tokens=5)


#: one model of each kind (two roofline shapes), for the tests that every pricing path of a
#: model gives ``iteration_ms``'s value bit for bit
PRICED_MODELS = [
    LinearLatency(base_ttft_ms=3.0, token_latency_ms=0.1, decode_ms_per_seq=0.7),
    CalibratedLatency(
        base_ms=2.0, ms_per_uncached_token=0.05, ms_per_cached_token=0.01, decode_ms_per_seq=0.3
    ),
    RooflineLatency(),
    RooflineLatency(model="llama-3.3-70b-fp8", gpu="H100", tp=4),
]
PRICED_IDS = ["linear", "calibrated", "roofline", "roofline-70b-tp4"]


@pytest.mark.parametrize("model", PRICED_MODELS, ids=PRICED_IDS)
@pytest.mark.parametrize("seqs,context", [(1, 0), (1, 5), (8, 8_000), (200, 3_000_000)])
def test_decode_ms_is_the_price_of_a_decode_only_iteration(model, seqs, context):
    """The simulator prices runs of decode-only iterations with ``decode_ms``: it must equal
    ``iteration_ms`` bit for bit (the results must not depend on which path priced a step)."""
    contexts = [context // seqs] * seqs
    contexts[0] += context - sum(contexts)
    it = Iteration.with_decodes(decode_contexts=contexts)
    assert model.decode_ms(seqs, context) == model.iteration_ms(it)
    # a run of them: each iteration's context grows by one token per request
    want, t = [], 12.5
    for i in range(40):
        t = t + model.iteration_ms(Iteration((), seqs, context + i * seqs)) / 1000.0
        want.append(t)
    assert model.decode_run_ends(seqs, context, 40, 12.5) == want


@pytest.mark.parametrize("model", PRICED_MODELS, ids=PRICED_IDS)
@pytest.mark.parametrize(
    "tokens,contexts",
    [([], []), ([1], [0]), ([4096], [0]), ([512, 3, 8191], [1000, 0, 123_457]),
     ([7] * 5, [0, 1, 2, 3, 2_000_001])],
)  # fmt: skip
@pytest.mark.parametrize("seqs,context", [(0, 0), (1, 5), (200, 3_000_000)])
def test_prefill_ms_is_the_price_of_the_iteration_of_those_chunks(
    model, tokens, contexts, seqs, context
):
    """The simulator prices an iteration with prefill by ``prefill_ms`` (no Iteration built):
    bit for bit ``iteration_ms`` of the Iteration of those chunks, in the model's override (the
    roofline's compiled sums) and the base class's definition alike."""
    it = Iteration(tuple(map(PrefillChunk, tokens, contexts)), seqs, context)
    want = model.iteration_ms(it)
    assert model.prefill_ms(tokens, contexts, seqs, context) == want
    assert LatencyModel.prefill_ms(model, tokens, contexts, seqs, context) == want
    with pytest.raises(ValueError, match="chunk sizes"):
        model.prefill_ms([*tokens, 1], contexts, seqs, context)


#: TTFT of 700 uncached tokens after 300 cached ones, by hand from each of ``all_models()``'s
#: formula and constants (not from the models' own code)
TTFT_700_AFTER_300 = {
    # linear: base + per uncached token; the cached 300 are free
    "linear": 20.0 + 0.05 * 700,
    # qwen2.5-1.5b on an A40, compute-bound (memory: (3.08e9 + 28672 * 1000) B at 556.8 GB/s
    # = 5.58 ms): (2 P t + 4 L H t (c + t / 2)) / (149.7 TFLOPS * 0.5) + 1 ms overhead
    "roofline-qwen-a40": (2 * 1.54e9 * 700 + 4 * 28 * 1536 * 700 * (300 + 350))
    / (149.7e12 * 0.5)
    * 1e3
    + 1.0,
    # llama-3.1-8b on 2 A100s, compute-bound, plus 2 * 32 ring all-reduces of 700 tokens'
    # bf16 activations over one direction (300 GB/s) of NVLink
    "roofline-llama8b-a100-tp2": (2 * 8.03e9 * 700 + 4 * 32 * 4096 * 700 * (300 + 350))
    / (2 * 312e12 * 0.5)
    * 1e3
    + 2 * 32 * (0.01 + 2 * (2 - 1) / 2 * 700 * 4096 * 2 / 300e9 * 1e3)
    + 1.0,
    # calibrated: base + b * uncached + c * cached
    "calibrated": 25.0 + 0.04 * 700 + 0.002 * 300,
}


@pytest.mark.parametrize(
    ("model", "expected"),
    list(zip(all_models(), TTFT_700_AFTER_300.values(), strict=True)),
    ids=list(TTFT_700_AFTER_300),
)
def test_ttft_is_a_lone_prefill_worked_out_by_hand(model: LatencyModel, expected: float):
    assert model.ttft_ms(700, 300) == pytest.approx(expected, rel=1e-12)
    lone = model.iteration_ms(Iteration(prefill=(PrefillChunk(700, 300),)))
    assert lone == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize("model", all_models(), ids=lambda m: m.name)
def test_iteration_time_grows_with_prefill_tokens_and_decode_seqs(model: LatencyModel):
    # big enough steps that the roofline leaves its memory-bound floor
    small = Iteration.with_decodes(prefill=(PrefillChunk(512, 0),), decode_contexts=(1000,) * 4)
    more_prefill = Iteration.with_decodes(
        prefill=(PrefillChunk(8192, 0),), decode_contexts=(1000,) * 4
    )
    more_decode = Iteration.with_decodes(
        prefill=(PrefillChunk(512, 0),), decode_contexts=(1000,) * 1024
    )
    assert model.iteration_ms(more_prefill) > model.iteration_ms(small)
    assert model.iteration_ms(more_decode) > model.iteration_ms(small)


@pytest.mark.parametrize("model", all_models(), ids=lambda m: m.name)
def test_describe_states_model_formula_and_constants_as_json(model: LatencyModel):
    d = model.describe()
    assert d["model"] == model.name
    assert "iteration_ms" in d["formula"]
    assert d["constants"]
    json.dumps(d)  # written next to every simulated result


# --- linear ------------------------------------------------------------------------------------


def test_linear_ttft_is_the_seed_formula_exactly():
    m = LinearLatency(base_ttft_ms=12.5, token_latency_ms=0.03, decode_ms_per_seq=0.4)
    for uncached, cached in [(0, 0), (1, 0), (1000, 0), (1000, 50_000), (123_457, 7)]:
        assert m.ttft_ms(uncached, cached) == 12.5 + uncached * 0.03


def test_linear_iteration_adds_prefill_tokens_and_decode_seqs():
    m = LinearLatency(base_ttft_ms=20.0, token_latency_ms=0.05, decode_ms_per_seq=0.2)
    it = Iteration.with_decodes(
        prefill=(PrefillChunk(100, 900), PrefillChunk(300)), decode_contexts=(5,) * 10
    )
    assert m.iteration_ms(it) == pytest.approx(20.0 + 0.05 * 400 + 0.2 * 10)
    assert m.iteration_ms(Iteration()) == 20.0


def test_linear_rejects_negative_constants():
    with pytest.raises(ValueError, match="token_latency_ms"):
        LinearLatency(token_latency_ms=-0.1)


# --- roofline ----------------------------------------------------------------------------------


def test_roofline_decode_heavy_iteration_is_memory_bound():
    b = RooflineLatency(model="llama-3.1-8b", gpu="A100").breakdown(DECODE_HEAVY)
    assert b["bound"] == "memory"
    assert b["memory_ms"] > 3 * b["compute_ms"]


def test_roofline_prefill_heavy_iteration_is_compute_bound():
    b = RooflineLatency(model="llama-3.1-8b", gpu="A100").breakdown(PREFILL_HEAVY)
    assert b["bound"] == "compute"
    assert b["compute_ms"] > 5 * b["memory_ms"]


def test_roofline_lone_prefill_matches_the_formula_by_hand():
    m = RooflineLatency(model="qwen2.5-1.5b", gpu="A40", mfu=0.5, mbu=0.8, overhead_ms=1.0)
    flops = 2 * 1.54e9 * 1000 + 4 * 28 * 1536 * 1000 * (200 + 1000 / 2)
    compute_ms = flops / (149.7e12 * 0.5) * 1e3
    assert m.ttft_ms(1000, 200) == pytest.approx(compute_ms + 1.0, rel=1e-12)


def test_roofline_attention_cost_grows_with_context():
    m = RooflineLatency(model="llama-3.1-8b", gpu="A100")
    short, long = (
        m.breakdown(Iteration.lone_prefill(512, 0)),
        m.breakdown(Iteration.lone_prefill(512, 32_000)),
    )
    assert long["compute_ms"] > short["compute_ms"]
    assert m.ttft_ms(512, 32_000) > m.ttft_ms(512, 0)
    # a decode over a long context reads more KV than over a short one
    assert m.iteration_ms(Iteration.with_decodes(decode_contexts=(100_000,) * 8)) > m.iteration_ms(
        Iteration.with_decodes(decode_contexts=(100,) * 8)
    )
    # a cache hit still beats recomputing those tokens
    assert m.ttft_ms(512, 32_000) < m.ttft_ms(32_512, 0)


@pytest.mark.parametrize("it", [DECODE_HEAVY, PREFILL_HEAVY], ids=["decode", "prefill"])
def test_roofline_tp2_is_faster_than_tp1_but_less_than_twice(it: Iteration):
    t1 = RooflineLatency(model="llama-3.1-8b", gpu="A100", tp=1).iteration_ms(it)
    t2 = RooflineLatency(model="llama-3.1-8b", gpu="A100", tp=2).iteration_ms(it)
    assert t2 < t1 < 2 * t2


@pytest.mark.parametrize("it", [DECODE_HEAVY, PREFILL_HEAVY], ids=["decode", "prefill"])
def test_roofline_h100_beats_a100_beats_a40(it: Iteration):
    t = {
        g: RooflineLatency(model="llama-3.1-8b", gpu=g).iteration_ms(it)
        for g in ("H100", "A100", "A40")
    }
    assert t["H100"] < t["A100"] < t["A40"]


def test_roofline_uses_fp8_peak_only_where_the_gpu_has_fp8_units():
    h100 = RooflineLatency(model="llama-3.3-70b-fp8", gpu="H100").describe()["constants"]
    a100 = RooflineLatency(model="llama-3.3-70b-fp8", gpu="A100").describe()["constants"]
    bf16 = RooflineLatency(model="llama-3.1-8b", gpu="H100").describe()["constants"]
    assert h100["peak_tflops"] == 1979.0
    assert a100["peak_tflops"] == 312.0
    assert bf16["peak_tflops"] == 989.5


def test_roofline_rejects_weights_that_do_not_fit_and_bad_settings():
    with pytest.raises(ValueError, match="raise tp"):
        RooflineLatency(model="llama-3.3-70b-fp8", gpu="A40", tp=1)
    RooflineLatency(model="llama-3.3-70b-fp8", gpu="A40", tp=2)  # 35 GB per GPU fits
    with pytest.raises(ValueError, match="unknown GPU"):
        RooflineLatency(gpu="V100")
    with pytest.raises(ValueError, match="mfu"):
        RooflineLatency(mfu=1.5)
    with pytest.raises(ValueError, match="tp"):
        RooflineLatency(tp=0)


def test_gpu_presets_are_dense_datasheet_numbers():
    assert get_gpu("a40").bf16_tflops == 149.7 and get_gpu("A40").fp8_tflops is None
    assert get_gpu("A100-80GB").hbm_gbs == 2039.0
    h100 = get_gpu("h100")
    assert (h100.bf16_tflops, h100.fp8_tflops, h100.hbm_gbs) == (989.5, 1979.0, 3350.0)


# --- calibrated --------------------------------------------------------------------------------


def synthetic(n: int = 200, a: float = 25.0, b: float = 0.04, c: float = 0.002, sd: float = 2.0):
    rng = np.random.default_rng(7)
    uncached = rng.integers(16, 4096, n)
    cached = rng.integers(0, 16_384, n) * (rng.random(n) < 0.7)
    ttft = a + b * uncached + c * cached + rng.normal(0, sd, n)
    return np.column_stack([uncached, cached, ttft])


def test_calibrated_fit_recovers_known_coefficients_from_noisy_data():
    f = fit(synthetic())
    assert f.r2 > 0.95
    assert f.base_ms == pytest.approx(25.0, abs=1.5)
    assert f.ms_per_uncached_token == pytest.approx(0.04, rel=0.02)
    assert f.ms_per_cached_token == pytest.approx(0.002, rel=0.1)
    assert f.n == 200 and f.residuals_ms.shape == (200,)
    assert abs(f.residuals_ms.mean()) < 0.5  # unbiased


def test_calibrated_fit_keeps_coefficients_non_negative():
    obs = synthetic(c=0.0)
    obs[:, 2] -= 0.001 * obs[:, 1]  # cached context appears to *save* time: clip, do not fit it
    f = fit(obs)
    assert f.ms_per_cached_token == 0.0
    assert min(f.params.values()) >= 0.0


def test_calibrated_fit_can_fix_the_cached_term_at_zero():
    f = fit(synthetic(), cached_term=False)
    assert f.ms_per_cached_token == 0.0 and not f.cached_term
    # and fixes it by itself when no observation has cached tokens
    no_hits = synthetic()
    no_hits[:, 1] = 0
    assert fit(no_hits).ms_per_cached_token == 0.0


@pytest.mark.parametrize("n", [0, 1, 2])
def test_calibrated_fit_rejects_fewer_than_three_observations(n: int):
    with pytest.raises(ValueError, match="at least 3"):
        fit(synthetic()[:n])


def test_calibrated_fit_rejects_malformed_observations():
    with pytest.raises(ValueError, match="rows"):
        fit([(1, 2), (3, 4), (5, 6)])
    with pytest.raises(ValueError, match="NaN"):
        fit([(1, 0, 5.0), (2, 0, math.nan), (3, 0, 7.0)])


def test_calibrated_model_reproduces_fitted_ttfts():
    obs = synthetic()
    f = fit(obs)
    m = f.to_model()
    fitted = obs[:, 2] - f.residuals_ms
    for (u, c, _), want in zip(obs, fitted, strict=True):
        assert m.ttft_ms(int(u), int(c)) == pytest.approx(want, rel=1e-9)
    assert m.decode_ms_per_seq == f.ms_per_uncached_token  # documented default
    assert f.to_model(decode_ms_per_seq=0.3).iteration_ms(
        Iteration.with_decodes(decode_contexts=(10,) * 10)
    ) == pytest.approx(f.base_ms + 3.0)
    assert m.describe()["fit"]["r2"] == f.r2


def test_calibrated_report_summarises_fit_and_residuals():
    rep = fit(synthetic()).report()
    json.dumps(rep)
    assert rep["n"] == 200 and rep["r2"] > 0.95
    assert set(rep["params"]) == {"base_ms", "ms_per_uncached_token", "ms_per_cached_token"}
    r = rep["residuals"]
    assert r["p50_abs_ms"] <= r["p95_abs_ms"] <= r["max_abs_ms"]
    assert 0.5 < r["p50_abs_ms"] < 3.0  # noise sd 2 ms -> median |residual| ~1.35 ms


def test_fit_from_requests_uses_observations_and_skips_requests_without_them():
    rng = np.random.default_rng(3)
    requests = []
    for i in range(30):
        prompt = int(rng.integers(100, 3000))
        cached = int(rng.integers(0, prompt))
        requests.append(
            req(
                seg(SemanticType.USER_QUERY, prompt, f"q{i}"),
                request_id=f"r{i}",
                arrival_s=float(i),  # one at a time: each finds the engine idle
                observed_ttft_ms=10.0 + 0.05 * (prompt - cached) + 0.001 * cached,
                observed_cached_tokens=cached,
            )
        )
    requests.append(req(seg(SemanticType.USER_QUERY, 50, "x"), request_id="no-obs"))
    requests.append(
        req(seg(SemanticType.USER_QUERY, 50, "y"), request_id="no-hit", observed_ttft_ms=99.0)
    )
    f = fit_from_requests(requests)
    assert f.n == 30
    assert f.base_ms == pytest.approx(10.0, abs=1e-6)
    assert f.ms_per_uncached_token == pytest.approx(0.05, rel=1e-6)
    assert f.ms_per_cached_token == pytest.approx(0.001, rel=1e-6)


def test_fit_from_requests_errors_when_too_few_carry_observations():
    requests = [
        req(
            seg(SemanticType.USER_QUERY, 100, "a"), observed_ttft_ms=20.0, observed_cached_tokens=0
        ),
        req(seg(SemanticType.USER_QUERY, 100, "b"), arrival_s=1.0),
        req(seg(SemanticType.USER_QUERY, 100, "c"), arrival_s=2.0, observed_ttft_ms=20.0),
    ]
    with pytest.raises(ValueError, match=r"only 1 request.*2 without observations"):
        fit_from_requests(requests)


def _loaded_run(n: int = 40, gap_s: float = 0.01) -> list:
    """Requests every ``gap_s`` whose TTFT (50 ms and up) keeps the engine busy past the next
    arrival, except every tenth, which comes after a pause: a run that queued."""
    out, t = [], 0.0
    for i in range(n):
        t += 1.0 if i % 10 == 0 else gap_s
        out.append(
            req(
                seg(SemanticType.USER_QUERY, 100 + i, f"q{i}"),
                request_id=f"r{i}",
                arrival_s=t,
                observed_ttft_ms=50.0 + 0.1 * (100 + i) + (0.0 if i % 10 == 0 else 500.0),
                observed_cached_tokens=0,
            )
        )
    return out


def test_idle_requests_keeps_only_those_that_found_the_engine_idle():
    from skv.latency.calibrated import idle_requests

    run = _loaded_run()
    kept, dropped = idle_requests(run)
    assert [r.request_id for r in kept] == ["r0", "r10", "r20", "r30"]
    assert dropped == 36
    # a recorded end-to-end time extends the busy span beyond the first token
    a = req(seg(SemanticType.USER_QUERY, 10, "a"), request_id="a", observed_ttft_ms=5.0)
    a.extra["observed_e2e_ms"] = 2000.0
    b = req(seg(SemanticType.USER_QUERY, 10, "b"), request_id="b", arrival_s=1.0)
    assert [r.request_id for r in idle_requests([a, b])[0]] == ["a"]
    a.extra.clear()
    assert [r.request_id for r in idle_requests([b, a])[0]] == ["a", "b"]
    # a sequential replay: planned 10 ms apart, each sent after the previous one finished
    seq = [
        req(seg(SemanticType.USER_QUERY, 10, f"s{i}"), request_id=f"s{i}", arrival_s=0.01 * i,
            observed_ttft_ms=40.0, extra={"sent_s": 0.1 * i, "observed_e2e_ms": 50.0})
        for i in range(5)
    ]  # fmt: skip
    assert idle_requests(seq) == (seq, 0)
    for r in seq:
        del r.extra["sent_s"]
    assert idle_requests(seq)[1] == 4


def test_fit_from_requests_fits_only_idle_requests_of_a_loaded_run(caplog):
    run = _loaded_run()
    f = fit_from_requests(run, cached_term=False)
    # the 500 ms of queueing in the busy requests never reaches the fit
    assert f.n == 4 and f.excluded_busy == 36
    assert f.base_ms == pytest.approx(50.0, abs=1e-6)
    assert f.ms_per_uncached_token == pytest.approx(0.1, rel=1e-6)
    assert "fitting only the 4 that found it idle" in caplog.text
    assert f.report()["excluded_busy"] == 36
    with pytest.raises(ValueError, match=r"only 2 request.*18 more arrived while.*sequential run"):
        fit_from_requests(run[:20])
    assert fit_from_requests(run, idle_only=False).n == 40


def test_fit_iterations_recovers_known_step_costs_and_refuses_one_sided_data():
    from skv.latency.calibrated import IterationObservation, fit_iterations

    truth = CalibratedLatency(
        base_ms=4.0,
        ms_per_uncached_token=0.5,
        ms_per_cached_token=0.02,
        decode_ms_per_seq=0.3,
        ms_per_decode_context_token=0.001,
        ms_per_prefill_attention_kpair=0.05,
    )
    rows = []
    for u, c in [(10, 0), (100, 0), (200, 256), (400, 64), (50, 512), (300, 128), (500, 700)]:
        it = Iteration((PrefillChunk(u, c),))
        rows.append(IterationObservation(u, c, 0, 0, truth.iteration_ms(it)))
    for b, ctx in [(1, 100), (4, 800), (16, 4000), (32, 2000), (8, 6000)]:
        rows.append(IterationObservation(0, 0, b, ctx, truth.decode_ms(b, ctx)))
    f = fit_iterations(rows)
    for key, value in f.params.items():
        assert value == pytest.approx(getattr(truth, key), rel=1e-6, abs=1e-9), key
    assert f.mape_pct < 1e-6 and f.r2 == pytest.approx(1.0)
    m = f.to_model()
    assert m.iteration_ms(Iteration((PrefillChunk(77, 33),), 3, 900)) == pytest.approx(
        truth.iteration_ms(Iteration((PrefillChunk(77, 33),), 3, 900))
    )
    assert f.report()["params"] == f.params
    with pytest.raises(ValueError, match="prefill tokens and steps with decodes"):
        fit_iterations([r for r in rows if r.decode_seqs == 0])
    with pytest.raises(ValueError, match="at least 6 steps"):
        fit_iterations(rows[:5])


def test_calibrated_decode_context_term_prices_decode_steps():
    m = CalibratedLatency(
        base_ms=2.0, ms_per_uncached_token=0.1, decode_ms_per_seq=0.5,
        ms_per_decode_context_token=0.01,
    )  # fmt: skip
    assert m.decode_ms(4, 1000) == pytest.approx(2.0 + 0.5 * 4 + 0.01 * 1000)
    assert m.describe()["constants"]["ms_per_decode_context_token"] == 0.01
    # prefill attention: (query, key) pairs, causal within the chunk, per thousand
    a = CalibratedLatency(
        base_ms=1.0, ms_per_uncached_token=0.0, ms_per_prefill_attention_kpair=2.0
    )
    it = Iteration((PrefillChunk(100, 300), PrefillChunk(10, 0)))
    assert a.iteration_ms(it) == pytest.approx(1.0 + 2.0 * (100 * 350 + 10 * 5) / 1000)


def test_fit_from_requests_rejects_more_cached_than_prompt_tokens():
    bad = [
        req(
            seg(SemanticType.USER_QUERY, 100, str(i)),
            request_id=f"r{i}",
            observed_ttft_ms=20.0,
            observed_cached_tokens=500,
        )
        for i in range(3)
    ]
    with pytest.raises(ValueError, match="r0: observed_cached_tokens=500"):
        fit_from_requests(bad)


# --- registry ----------------------------------------------------------------------------------


def test_registry_builds_every_model_by_name():
    assert set(LATENCY_MODELS) == {"linear", "roofline", "calibrated"}
    assert isinstance(make_latency_model("linear", base_ttft_ms=5.0), LinearLatency)
    assert make_latency_model("roofline", gpu="H100", tp=2).describe()["constants"]["tp"] == 2
    m = make_latency_model("calibrated", base_ms=1.0, ms_per_uncached_token=0.1)
    assert m.ttft_ms(10) == pytest.approx(2.0)


def test_registry_errors_name_the_bad_input_and_the_choices():
    with pytest.raises(ValueError, match=r"unknown latency model 'gpt'.*linear, roofline"):
        make_latency_model("gpt")
    with pytest.raises(ValueError, match=r"unknown parameter\(s\) speed.*accepted: base_ttft_ms"):
        make_latency_model("linear", speed=3)
    with pytest.raises(ValueError, match=r"missing required.*base_ms.*fit"):
        make_latency_model("calibrated")
