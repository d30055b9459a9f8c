"""Timed trace replay (``skv replay --cache-token-budget`` / ``--timed``): files, calibration,
observed-vs-simulated, determinism, and the shipped example trace."""

from __future__ import annotations

import csv
import importlib.util
import json
import random
from pathlib import Path

import pytest

from skv.cli import main
from skv.experiments.replay.timed import PLOTS
from skv.model import Request, Segment, SemanticType, content_hash
from skv.traces import load_trace, write_skv_trace

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "traces" / "rag_serving_trace.jsonl"
POLICIES = ["lru", "adaptive_semantic", "static_semantic"]
PNG = b"\x89PNG\r\n\x1a\n"
TABLES = ("replay_results.json", "replay_metrics.csv", "replay_summary.md")

#: the known model the synthetic observations are drawn from
TRUE = {"base_ms": 12.0, "ms_per_uncached_token": 0.08, "ms_per_cached_token": 0.005}


def _replay(trace: Path, out: Path, *extra: str) -> int:
    argv = ["replay", str(trace), "--policies", *POLICIES, "--quiet", "--output", str(out)]
    return main([*argv, *extra])


def _known_model_trace(path: Path, *, observed: bool = True, n: int = 60) -> Path:
    """Sessions sharing a system prompt; observed TTFT = TRUE model + 2% noise."""
    rng = random.Random(3)
    reqs = []
    for i in range(n):
        session = i // 3
        segs = [
            Segment(SemanticType.SYSTEM, 200, content_hash=content_hash("system")),
            Segment(SemanticType.USER_QUERY, rng.randint(50, 1500), content_hash(f"q{i}")),
        ]
        prompt = sum(s.num_tokens for s in segs)
        cached = rng.choice([0, 192, min(prompt, 192 + 16 * rng.randint(0, 40))])
        ttft = (
            TRUE["base_ms"]
            + TRUE["ms_per_uncached_token"] * (prompt - cached)
            + TRUE["ms_per_cached_token"] * cached
        ) * (1 + 0.02 * rng.gauss(0, 1))
        reqs.append(
            Request(
                f"r{i}",
                0.5 * i,
                segs,
                output_tokens=8,
                session_id=f"s{session}",
                observed_ttft_ms=ttft if observed else None,
                observed_cached_tokens=cached if observed else None,
            )
        )
    write_skv_trace(path, reqs, {"source": "test: known linear TTFT model"})
    return path


def test_example_trace_timed_replay_writes_every_file(tmp_path, capsys):
    out = tmp_path / "run"
    assert _replay(EXAMPLE, out, "--cache-token-budget", "50000") == 0
    for name in (*TABLES, *PLOTS.values()):
        assert (out / name).is_file(), name
    for name in PLOTS.values():
        assert (out / name).read_bytes().startswith(PNG)
    payload = json.loads((out / "replay_results.json").read_text())
    meta, results = payload["meta"], payload["results"]
    assert "SIMULATED by the linear latency model" in meta["simulated"]
    assert meta["latency"]["model"] == "linear" and meta["calibration"] is None
    assert meta["requests"] == len(load_trace(EXAMPLE)) == 120
    assert [r["policy"] for r in results] == POLICIES
    for r in results:
        assert r["capacity"] == "50000tok" and r["capacity_blocks"] == 50000 // 16
        assert r["latency_model"] == "linear"
        assert 0 < r["tokens_saved"] <= r["prompt_tokens"]
        assert r["tokens_saved"] + r["computed_tokens"] == r["prompt_tokens"]
        assert 0 < r["token_hit_rate"] <= 1 and r["sim_ttft_ms_mean"] > 0
        assert r["sim_ttft_ms_p50"] <= r["sim_ttft_ms_p99"]
        assert r["observed_requests"] == 120 and r["ttft_mae_ms"] >= 0
    rows = list(csv.DictReader((out / "replay_metrics.csv").open()))
    assert [r["policy"] for r in rows] == POLICIES
    for row, r in zip(rows, results, strict=True):
        assert int(row["tokens_saved"]) == r["tokens_saved"]
        assert float(row["sim_ttft_ms_mean"]) == pytest.approx(r["sim_ttft_ms_mean"], abs=1e-6)
    md = (out / "replay_summary.md").read_text()
    assert "TTFT is simulated, not measured" in md and "`linear` latency model" in md
    assert "## Observed vs simulated TTFT" in md and "Invalid claim" in md
    assert all(p in md for p in POLICIES)
    assert "TTFT simulated by the linear latency model" in capsys.readouterr().out


def test_calibrate_from_trace_recovers_the_known_model(tmp_path, capsys):
    trace = _known_model_trace(tmp_path / "known.jsonl")
    out = tmp_path / "cal"
    assert _replay(trace, out, "--cache-token-budget", "4000", "--calibrate-from-trace") == 0
    meta = json.loads((out / "replay_results.json").read_text())["meta"]
    cal = meta["calibration"]
    assert cal["n"] == 60 and cal["r2"] > 0.9
    for key, value in TRUE.items():
        assert cal["params"][key] == pytest.approx(value, rel=0.1), key
    assert cal["params"]["ms_per_uncached_token"] == pytest.approx(0.08, rel=0.05)
    assert set(cal["residuals"]) >= {"mean_ms", "mean_abs_ms", "p95_abs_ms", "max_abs_ms"}
    # the simulation ran with exactly the fitted model
    assert meta["latency"]["model"] == "calibrated"
    assert meta["latency"]["constants"]["base_ms"] == cal["params"]["base_ms"]
    assert "SIMULATED by the calibrated latency model" in meta["simulated"]
    md = (out / "replay_summary.md").read_text()
    assert "## Calibration (fitted from the trace's observed TTFT)" in md
    assert f"| R^2 | {cal['r2']:.4f} |" in md
    assert f"| ms_per_uncached_token | {cal['params']['ms_per_uncached_token']:.6g} |" in md
    assert "Residuals (observed - fitted)" in md
    assert "R^2=" in capsys.readouterr().out
    rows = list(csv.DictReader((out / "replay_metrics.csv").open()))
    assert {r["latency_model"] for r in rows} == {"calibrated"}


def test_observed_plot_only_when_the_trace_has_observations(tmp_path):
    trace = _known_model_trace(tmp_path / "bare.jsonl", observed=False)
    out = tmp_path / "bare"
    assert _replay(trace, out, "--timed", "--capacity", "2000tok", "--capacity", "50%") == 0
    assert not (out / PLOTS["observed"]).exists()
    for name in (*TABLES, PLOTS["avg_ttft"], PLOTS["tokens_saved"], PLOTS["hit_rate"]):
        assert (out / name).is_file()
    payload = json.loads((out / "replay_results.json").read_text())
    assert payload["meta"]["observed_requests"] == 0
    assert [(r["capacity"], r["policy"]) for r in payload["results"]] == [
        (c, p) for c in ("2000tok", "50%") for p in POLICIES
    ]
    assert all("ttft_mae_ms" not in r for r in payload["results"])
    md = (out / "replay_summary.md").read_text()
    assert "Observed vs simulated" not in md and PLOTS["observed"] not in md
    rows = list(csv.DictReader((out / "replay_metrics.csv").open()))
    assert {r["observed_ttft_ms_mean"] for r in rows} == {""}


def test_calibration_needs_observations_and_the_calibrated_model(tmp_path, capsys):
    bare = _known_model_trace(tmp_path / "bare.jsonl", observed=False)
    assert _replay(bare, tmp_path / "x", "--calibrate-from-trace") == 2
    assert "observed_ttft_ms" in capsys.readouterr().err
    known = _known_model_trace(tmp_path / "known.jsonl")
    argv = ["--calibrate-from-trace", "--latency-model", "linear"]
    assert _replay(known, tmp_path / "y", *argv) == 2
    assert "conflicts" in capsys.readouterr().err


def test_latency_model_choice_and_params_are_recorded(tmp_path):
    trace = _known_model_trace(tmp_path / "known.jsonl", n=20)
    out = tmp_path / "lin"
    argv = ["--cache-token-budget", "3000", "--latency-param", "base_ttft_ms=7.5"]
    assert _replay(trace, out, *argv, "--latency-param", "token_latency_ms=0.02") == 0
    meta = json.loads((out / "replay_results.json").read_text())["meta"]
    assert meta["latency"]["constants"]["base_ttft_ms"] == 7.5
    assert meta["latency"]["constants"]["token_latency_ms"] == 0.02
    out = tmp_path / "roof"
    assert _replay(trace, out, "--cache-token-budget", "3000", "--latency-model", "roofline") == 0
    payload = json.loads((out / "replay_results.json").read_text())
    assert payload["meta"]["latency"]["model"] == "roofline"
    assert "roofline" in (out / "replay_summary.md").read_text()


def test_timed_replay_is_byte_identical_across_runs(tmp_path):
    outs = [tmp_path / "a", tmp_path / "b"]
    for out in outs:
        assert _replay(EXAMPLE, out, "--cache-token-budget", "20000", "--calibrate-from-trace") == 0
    names = sorted(p.name for p in outs[0].iterdir())
    assert names == sorted(p.name for p in outs[1].iterdir())
    assert set(TABLES) <= set(names)
    for name in names:
        assert (outs[0] / name).read_bytes() == (outs[1] / name).read_bytes(), name


def test_default_output_dir_carries_the_timestamp(tmp_path, monkeypatch):
    trace = _known_model_trace(tmp_path / "known.jsonl", n=12)
    monkeypatch.chdir(tmp_path)
    argv = ["replay", str(trace), "--cache-token-budget", "2000", "--quiet"]
    assert main([*argv, "--output-name", "demo"]) == 0
    (run,) = (tmp_path / "outputs" / "traces").iterdir()
    assert run.name.endswith("_demo") and run.name[:8].isdigit()
    assert (run / "replay_summary.md").is_file()


def test_cache_only_replay_is_unchanged_without_timed_options(tmp_path):
    out = tmp_path / "cache_only"
    assert _replay(EXAMPLE, out, "--capacity", "2000") == 0
    assert (out / "replay_results.csv").is_file()
    assert not (out / "replay_metrics.csv").exists()


def test_example_trace_is_small_and_regenerates_identically(tmp_path):
    assert EXAMPLE.stat().st_size < 200_000
    spec = importlib.util.spec_from_file_location(
        "make_example_trace", ROOT / "examples" / "make_example_trace.py"
    )
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    fresh = mod.main(tmp_path / "again.jsonl")
    assert fresh.read_bytes() == EXAMPLE.read_bytes()
    reqs = load_trace(EXAMPLE)
    assert all(s.text is None for r in reqs for s in r.segments)  # redacted
    assert all(r.observed_ttft_ms is not None for r in reqs)


def test_run_timed_takes_typed_parameters_and_matches_the_cli(tmp_path, capsys):
    """The library entry has no argparse Namespace: keyword arguments in, result + dir out;
    the same settings through ``skv replay`` give byte-identical files."""
    import inspect

    from skv.experiments.replay.timed import TimedReplay, run_timed

    assert "args" not in inspect.signature(run_timed).parameters
    out = tmp_path / "lib"
    result, where = run_timed(
        EXAMPLE,
        ["lru", "adaptive_semantic"],
        cache_token_budget=20_000,
        latency_params={"base_ttft_ms": 7.5},
        limit=40,
        output=out,
        progress=False,
    )
    assert isinstance(result, TimedReplay) and where == out
    assert [r["policy"] for r in result.rows] == ["lru", "adaptive_semantic"]
    assert {r["capacity"] for r in result.rows} == {"20000tok"}
    assert result.meta["requests"] == 40 and result.meta["cache_token_budget"] == 20_000
    assert result.latency.describe()["constants"]["base_ttft_ms"] == 7.5
    assert capsys.readouterr().out == ""  # the library prints nothing; the CLI prints the table
    cli = tmp_path / "cli"
    argv = ["replay", str(EXAMPLE), "--policies", "lru", "adaptive_semantic", "--limit", "40"]
    argv += ["--cache-token-budget", "20000", "--latency-param", "base_ttft_ms=7.5"]
    assert main([*argv, "--quiet", "--output", str(cli)]) == 0
    for name in TABLES:
        assert (out / name).read_bytes() == (cli / name).read_bytes(), name
    with pytest.raises(ValueError, match="not both"):
        run_timed(EXAMPLE, ["lru"], cache_token_budget=100, capacities=["2000"], output=out)
