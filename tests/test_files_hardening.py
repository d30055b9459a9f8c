"""Files and runs (issue 16): hostile or broken inputs fail fast and name where; results never
look complete when they are not; Ctrl-C says what was finished.

Each reproduction of the issue is a test here: a trace length of 2**40 (it used to allocate
~22 GB), a Mooncake ``input_length`` of 10**15 (accepted, hit rate silently 0), a YAML alias
bomb and ``num_requests: 1e12`` in a config (MemoryError after 23 s; numpy asking for 7 TiB),
configs whose errors named no file or field, a run directory left with a valid results.json
but half its files, ``new_run_dir`` races, and a KeyboardInterrupt traceback.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
import tracemalloc
from collections.abc import Callable
from datetime import datetime
from pathlib import Path

import pytest
import yaml

# the registries a config load consults, imported here so the timed loads below import nothing
import skv.latency
import skv.policies.registry
import skv.routing
import skv.workloads  # noqa: F401
from skv.cli import main
from skv.experiments import engine, runner
from skv.experiments.config import (
    MAX_CELLS,
    MAX_CONFIG_BYTES,
    ConfigError,
    config_from_dict,
    load_config,
)
from skv.experiments.replay import capacity, session_gap, timed
from skv.replay import compile_trace, replay_trace, write_results
from skv.traces import MAX_TOKENS, TraceFormatError, load_trace

ROOT = Path(__file__).resolve().parent.parent
SMOKE = ROOT / "experiments" / "semantickv" / "smoke.yaml"
DATA = ROOT / "tests" / "data"
#: a reader's whole budget for a hostile line: time (s) and traced Python allocations (bytes)
FAST_S = 1.0
SMALL_BYTES = 32 << 20


def bounded(fn: Callable[[], object]) -> tuple[BaseException | None, float, int]:
    """Run ``fn`` twice: once timed, in this process's CPU seconds (other processes on a busy
    machine do not count, and tracemalloc, which slows allocation many times over, is off),
    once under tracemalloc; return (the exception it raised, CPU seconds, peak traced bytes).
    ``fn`` must be repeatable (every caller loads a file)."""

    def call() -> BaseException | None:
        try:
            fn()
        except Exception as exc:
            return exc
        return None

    t0 = time.process_time()
    err = call()
    elapsed = time.process_time() - t0
    tracemalloc.start()
    try:
        call()
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return err, elapsed, peak


def fails_fast(fn: Callable[[], object], exc_type: type[BaseException], match: str) -> str:
    """``fn`` raises ``exc_type`` whose message contains ``match``, within FAST_S CPU seconds
    and SMALL_BYTES of allocations; returns the message."""
    err, elapsed, peak = bounded(fn)
    assert isinstance(err, exc_type), f"expected {exc_type.__name__}, got {err!r}"
    assert match in str(err), str(err)
    assert elapsed < FAST_S, f"took {elapsed:.2f} CPU s"
    assert peak < SMALL_BYTES, f"allocated {peak / 2**20:.0f} MiB"
    return str(err)


# ---------------------------------------------------------------------------------------- traces


def native(path: Path, *records: dict) -> Path:
    lines = [json.dumps({"skv_trace": 1, "num_requests": len(records)})]
    lines += [json.dumps(r) for r in records]
    path.write_text("\n".join(lines) + "\n")
    return path


def req(rid: str = "a", arrival: float = 0.0, tokens: int = 32, **extra) -> dict:
    seg = {"stype": "user_query", "num_tokens": tokens, "content_hash": "ab"}
    return {"request_id": rid, "arrival_s": arrival, "segments": [seg], **extra}


@pytest.mark.parametrize("tokens", [2**31, 2**40])
def test_a_huge_native_num_tokens_fails_in_under_a_second_naming_file_line_field(tmp_path, tokens):
    path = native(tmp_path / "t.jsonl", req(tokens=tokens))
    msg = fails_fast(lambda: load_trace(path), TraceFormatError, "t.jsonl:2: segments.0.num_tokens")
    assert "MAX_TOKENS" in msg and str(tokens) in msg


def test_native_limits_cover_the_prompt_total_and_the_output(tmp_path):
    half = MAX_TOKENS // 2 + 1
    two = req()
    two["segments"] = [{"stype": "system", "num_tokens": half}] * 2
    path = native(tmp_path / "sum.jsonl", two)
    fails_fast(lambda: load_trace(path), TraceFormatError, "sum.jsonl:2: segments:")
    path = native(tmp_path / "out.jsonl", req(output_tokens=2**40))
    fails_fast(lambda: load_trace(path), TraceFormatError, "out.jsonl:2: output_tokens")
    ok = native(tmp_path / "ok.jsonl", req(tokens=MAX_TOKENS))  # the limit itself is fine
    assert load_trace(ok)[0].prompt_tokens == MAX_TOKENS


def mooncake(path: Path, **fields) -> Path:
    rec = {"timestamp": 0, "input_length": 1024, "output_length": 1, "hash_ids": [1, 2]}
    rec.update(fields)
    path.write_text(json.dumps(rec) + "\n")
    return path


def bailian(path: Path, **fields) -> Path:
    rec = {"chat_id": 1, "parent_chat_id": -1, "timestamp": 0.0, "input_length": 32,
           "output_length": 1, "hash_ids": [1, 2]}  # fmt: skip
    rec.update(fields)
    path.write_text(json.dumps(rec) + "\n")
    return path


def claude(path: Path, **fields) -> Path:
    entry = {"t": 0.0, "type": "s", "in": 128, "out": 1, "hash_ids": [1, 2]}
    entry.update(fields)
    doc = {"id": path.stem, "block_size": 64, "hash_id_scope": "global", "tool_tokens": 0,
           "system_tokens": 0, "requests": [entry]}  # fmt: skip
    path.write_text(json.dumps(doc))
    return path


def azure(path: Path, ctx: str = "100", gen: str = "1") -> Path:
    path.write_text(f"TIMESTAMP,ContextTokens,GeneratedTokens\n0.5,{ctx},{gen}\n")
    return path


@pytest.mark.parametrize(
    ("write", "fields", "where"),
    [
        (mooncake, {"input_length": 10**15}, "m.jsonl:1: input_length"),
        (mooncake, {"output_length": 2**40}, "m.jsonl:1: output_length"),
        (bailian, {"input_length": 2**40}, "b.jsonl:1: input_length"),
        (claude, {"in": 2**40}, "requests.0.in"),
        (claude, {"out": 2**40}, "requests.0.out"),
        (azure, {"ctx": str(2**40)}, "z.csv:2: ContextTokens"),
        (azure, {"gen": str(10**15)}, "z.csv:2: GeneratedTokens"),
    ],
)
def test_every_reader_bounds_its_length_fields(tmp_path, write, fields, where):
    name = {mooncake: "m.jsonl", bailian: "b.jsonl", claude: "c.json", azure: "z.csv"}[write]
    path = write(tmp_path / name, **fields)
    fails_fast(lambda: load_trace(path), TraceFormatError, where)


def test_the_mooncake_reproduction_through_the_cli_is_a_clear_error(tmp_path, capsys):
    path = mooncake(tmp_path / "m.jsonl", input_length=10**15, hash_ids=[1, 2, 3])
    t0 = time.perf_counter()
    assert main(["traces", "info", str(path)]) == 2
    assert main(["replay", str(path), "--output", str(tmp_path / "out"), "--quiet"]) == 2
    assert time.perf_counter() - t0 < 2 * FAST_S
    err = capsys.readouterr().err
    assert err.count("m.jsonl:1: input_length") == 2 and "Traceback" not in err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    ("write", "fields", "where"),
    [
        (mooncake, {"timestamp": -5}, "m.jsonl:1: timestamp"),
        (mooncake, {"hash_ids": [1, -2]}, "m.jsonl:1: hash_ids.1"),
        (bailian, {"timestamp": -1.0}, "b.jsonl:1: timestamp"),
        (bailian, {"hash_ids": [-1]}, "b.jsonl:1: hash_ids.0"),
        (claude, {"t": -3.0}, "requests.0.t"),
        (claude, {"hash_ids": [-7]}, "requests.0.hash_ids.0"),
    ],
)
def test_negative_arrivals_and_hash_ids_are_rejected_with_their_place(
    tmp_path, write, fields, where
):
    name = {mooncake: "m.jsonl", bailian: "b.jsonl", claude: "c.json"}[write]
    path = write(tmp_path / name, **fields)
    fails_fast(lambda: load_trace(path), TraceFormatError, where)


def test_native_negative_arrival_and_hash_id_are_rejected(tmp_path):
    path = native(tmp_path / "n.jsonl", req(), req("b", arrival=-1.0))
    fails_fast(lambda: load_trace(path), TraceFormatError, "n.jsonl:3: arrival_s")
    path = native(tmp_path / "h.jsonl", req(hash_ids=[3, -4], hash_block_size=16))
    fails_fast(lambda: load_trace(path), TraceFormatError, "h.jsonl:2: hash_ids.1")


def test_a_repeated_native_request_id_is_one_warning_naming_file_and_line(tmp_path, caplog):
    path = native(tmp_path / "d.jsonl", req("a"), req("b"), req("a", 1.0), req("b", 2.0))
    with caplog.at_level(logging.WARNING, logger="skv.traces.native"):
        assert len(load_trace(path)) == 4  # accepted: only results per request are ambiguous
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1
    assert "d.jsonl:4: request_id: 'a' already on line 2" in warnings[0]
    assert "2 repeated" in warnings[0]


def test_two_claude_code_files_with_one_session_id_are_rejected(tmp_path):
    for name in ("trace_1.json", "trace_2.json"):
        doc = json.loads(claude(tmp_path / name).read_text())
        doc["id"] = "same"
        (tmp_path / name).write_text(json.dumps(doc))
    msg = fails_fast(lambda: load_trace(tmp_path), TraceFormatError, "trace_2.json: requests.0")
    assert "'same:1'" in msg and "trace_1.json" in msg


def test_hash_ids_short_of_the_prompt_warn_once_per_file(tmp_path, caplog):
    path = tmp_path / "m.jsonl"
    lines = [
        {"timestamp": 0, "input_length": 1024, "output_length": 1, "hash_ids": [1, 2]},
        {"timestamp": 1, "input_length": 10**6, "output_length": 1, "hash_ids": [1, 2, 3]},
        {"timestamp": 2, "input_length": 10**5, "output_length": 1, "hash_ids": [1]},
    ]
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    with caplog.at_level(logging.WARNING, logger="skv.traces._common"):
        assert len(load_trace(path)) == 3
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1
    assert "m.jsonl:2: hash_ids: 3 hash ids for 1000000 tokens" in warnings[0]
    assert "2 record(s)" in warnings[0]


def test_the_shipped_fixtures_load_without_a_warning(caplog):
    with caplog.at_level(logging.WARNING):
        for name in ("mooncake_tiny.jsonl", "bailian_tiny.jsonl", "azure_tiny.csv", "claude_code"):
            assert load_trace(DATA / name)
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]


# ---------------------------------------------------------------------------------------- configs


def smoke() -> dict:
    return yaml.safe_load(SMOKE.read_text())


def write_yaml(path: Path, data: dict) -> Path:
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


@pytest.mark.parametrize("value", ["1000000000000", "1.0e+12"])
def test_num_requests_1e12_fails_at_load_naming_the_field(tmp_path, value):
    text = SMOKE.read_text().replace("num_requests: 100", f"num_requests: {value}")
    assert value in text
    path = tmp_path / "big.yaml"
    path.write_text(text)
    msg = fails_fast(lambda: load_config(path), ConfigError, str(path))
    assert "workload.params" in msg and "num_requests" in msg and "1000000" in msg


def laughs(levels: int = 9) -> str:
    """A 'billion laughs' alias bomb inside a policy's params (9**levels strings)."""
    lines = ["      l0: &l0 [lol, lol, lol, lol, lol, lol, lol, lol, lol]"]
    for i in range(1, levels):
        lines.append(f"      l{i}: &l{i} [" + ", ".join([f"*l{i - 1}"] * 9) + "]")
    return "\n".join(lines)


def test_a_billion_laughs_config_fails_fast_with_a_short_message(tmp_path):
    path = tmp_path / "laughs.yaml"
    path.write_text(
        "workload: {name: shared_system_prompt}\ncapacities: ['10%']\n"
        f"policies:\n  - name: lru\n    params:\n{laughs()}\n"
    )
    msg = fails_fast(lambda: load_config(path), ConfigError, f"{path}: policies[0].params.")
    assert len(msg) < 400 and "10000 values" in msg


@pytest.mark.parametrize(
    ("content", "field"),
    [
        (b"\x89PNG\r\n\x1a\n\x00\x00binary\xff\xfe", "not UTF-8"),
        (b"a: [" * 5000, "invalid YAML"),
        (b"x: " + b"[" * 40 + b"]" * 40, "nesting deeper than 32"),
    ],
)
def test_unreadable_config_files_name_the_file(tmp_path, content, field):
    path = tmp_path / "odd.yaml"
    path.write_bytes(content)
    msg = fails_fast(lambda: load_config(path), ConfigError, str(path))
    assert field in msg


def test_a_config_file_over_a_mebibyte_is_refused_before_it_is_parsed(tmp_path):
    path = tmp_path / "huge.yaml"
    path.write_text("# " + "x" * MAX_CONFIG_BYTES + "\n")
    fails_fast(lambda: load_config(path), ConfigError, f"{path}: {path.stat().st_size} bytes, over")


def test_a_zero_block_capacity_names_file_and_field_at_load(tmp_path):
    data = smoke()
    data["capacities"] = ["0"]
    msg = fails_fast(
        lambda: load_config(write_yaml(tmp_path / "c.yaml", data)), ConfigError, "c.yaml"
    )
    assert "capacities[0]" in msg and "0 blocks" in msg
    data["capacities"] = ["8tok"]  # less than one 16-token block
    with pytest.raises(ConfigError, match=r"capacities\[0\]: capacity '8tok' resolves to 0"):
        load_config(write_yaml(tmp_path / "c.yaml", data))


def test_a_share_that_resolves_to_no_block_names_file_and_field_at_run(tmp_path):
    data = smoke()
    data.update(capacities=["0.0001%"], seeds=[0])
    del data["id"]  # the file's stem
    path = write_yaml(tmp_path / "tiny_share.yaml", data)
    where = r"tiny_share\.yaml: experiment tiny_share: capacities\[0\]"
    with pytest.raises(ConfigError, match=where):
        runner.run_experiment(path, tmp_path / "out")
    assert not list((tmp_path / "out").glob("*"))


def test_experiment_sizes_are_bounded(tmp_path):
    data = smoke()
    data["seeds"] = list(range(101))
    with pytest.raises(ConfigError, match=r"seeds: List should have at most 100 items"):
        config_from_dict(data)
    data = smoke()
    data["seeds"] = list(range(100))
    data["capacities"] = [f"{i + 1}%" for i in range(60)]
    with pytest.raises(ConfigError, match=f"12000 simulations; at most {MAX_CELLS}"):
        config_from_dict(data)
    data = smoke()
    data["workload"]["params"]["system_tokens"] = 2**21
    with pytest.raises(ConfigError, match=r"workload\.params: .*system_tokens"):
        config_from_dict(data)
    data = smoke()
    data["batch"]["max_batch_tokens"] = 2**40
    with pytest.raises(ConfigError, match=r"batch\.max_batch_tokens"):
        config_from_dict(data)


def test_replay_config_errors_name_file_and_field(tmp_path):
    base = "id: r\ntrace: x.jsonl\npolicies: [lru]\ncapacities: ['1%']\n"
    path = tmp_path / "r.yaml"
    path.write_text(base.replace("['1%']", "['0']"))
    fails_fast(lambda: capacity.load_replay_config(path, quick=False), ConfigError, "capacities[0]")
    path.write_text(base + "quick:\n  max_requests: 0\n")
    with pytest.raises(ConfigError, match=r"r\.yaml: quick\.max_requests"):
        capacity.load_replay_config(path, quick=True)
    path.write_text(base.replace("policies: [lru]", "policies:\n  - lru\n  - params:\n" + laughs()))
    fails_fast(lambda: capacity.load_replay_config(path, quick=False), ConfigError, "r.yaml")
    path.write_bytes(b"\xff\xfe\x00binary")
    fails_fast(lambda: capacity.load_replay_config(path, quick=False), ConfigError, "UTF-8")
    path.write_text(base)
    assert capacity.load_replay_config(path, quick=False)["title"] == "R"


def test_gap_and_engine_configs_are_bounded_and_name_the_field(tmp_path):
    gap = ROOT / "experiments" / "replay" / "claude_code_session_gap.yaml"
    path = tmp_path / "g.yaml"
    path.write_text(gap.read_text().replace("seeds: [0, 1, 2, 3, 4]", "seeds: [-1]"))
    with pytest.raises(ConfigError, match=r"g\.yaml: seeds\[0\]"):
        session_gap.load_gap_config(path, quick=False)
    path.write_text(gap.read_text().replace("gaps_s: [5,", "gaps_s: [1.0e+300,"))
    with pytest.raises(ConfigError, match=r"g\.yaml: gaps_s\[0\]"):
        session_gap.load_gap_config(path, quick=False)

    defaults = {"seed": 7, "num_requests": 80, "num_docs": 24, "doc_blocks": [4, 10]}
    path = tmp_path / "e.yaml"
    for body, field in [
        ("num_requests: 1000000000000", "num_requests"),
        ("num_docs: 100000000", "num_docs"),
        ("doc_blocks: [4, 1000000]", "doc_blocks"),
        ("num_requests: lots", "num_requests"),
    ]:
        path.write_text(f"fidelity:\n  {body}\n")
        msg = fails_fast(
            lambda: engine.load_section(path, "fidelity", defaults), ConfigError, "e.yaml"
        )
        assert f"fidelity.{field}" in msg
    with pytest.raises(ConfigError, match=r"override\.num_docs"):
        engine.load_section(None, "fidelity", defaults, overrides={"num_docs": 10**9})
    path.write_text("fidelity:\n  num_requests: 40\n")
    assert engine.load_section(path, "fidelity", defaults)["num_requests"] == 40


# ------------------------------------------------------------------------------ results on disk


def visible_runs(root: Path) -> list[Path]:
    return [p for p in root.iterdir() if (p / "results.json").exists()] if root.exists() else []


@pytest.fixture(scope="module")
def smoke_doc() -> dict:
    config = config_from_dict({**smoke(), "seeds": [0]}, source="smoke")
    return runner.simulate_experiment(config)


@pytest.mark.parametrize("error", [RuntimeError("disk full"), KeyboardInterrupt()])
def test_a_run_interrupted_while_writing_leaves_nothing_that_looks_complete(
    tmp_path, monkeypatch, smoke_doc, error
):
    import skv.experiments.figures

    config = config_from_dict({**smoke(), "seeds": [0]}, source="smoke")
    monkeypatch.setattr(runner, "simulate_experiment", lambda *a, **k: smoke_doc)
    written: list[Path] = []

    def plots_then_fail(doc, out_dir):
        written.extend(p for p in out_dir.iterdir())  # metrics.csv ... already there
        raise error

    monkeypatch.setattr(skv.experiments.figures, "write_plots", plots_then_fail)
    with pytest.raises(type(error)):
        runner.run_experiment(config, tmp_path / "out")
    assert len(written) >= 3  # it did fail mid-way
    assert list((tmp_path / "out").iterdir()) == []  # no run dir, no staging dir
    with pytest.raises(type(error)):
        runner.write_outputs(smoke_doc, tmp_path / "direct")
    assert not (tmp_path / "direct").exists()
    assert [p.name for p in tmp_path.iterdir()] == ["out"]


def test_a_finished_run_directory_holds_every_output_and_no_staging(
    tmp_path, monkeypatch, smoke_doc
):
    config = config_from_dict({**smoke(), "seeds": [0]}, source="smoke")
    monkeypatch.setattr(runner, "simulate_experiment", lambda *a, **k: smoke_doc)
    out = runner.run_experiment(config, tmp_path)
    assert [p.name for p in tmp_path.iterdir()] == [out.name]
    assert sorted(p.name for p in out.iterdir()) == sorted(runner.OUTPUT_FILES)
    assert json.loads((out / "results.json").read_text()) == smoke_doc


def test_replay_results_are_written_whole_or_not_at_all(tmp_path, monkeypatch):
    import skv.replay

    trace = compile_trace(load_trace(DATA / "mooncake_tiny.jsonl"))
    rows = replay_trace(trace, ["lru"], ["2"], progress=False)

    def half_written(f, header, lines):
        f.write("capacity,")
        raise KeyboardInterrupt

    monkeypatch.setattr(skv.replay, "_write_csv", half_written)
    with pytest.raises(KeyboardInterrupt):
        write_results(rows, tmp_path / "r", {})
    assert list(tmp_path.iterdir()) == []
    monkeypatch.undo()

    old = tmp_path / "reused"  # an existing --output: files replaced, others kept
    old.mkdir()
    (old / "notes.txt").write_text("mine")
    (old / "replay_results.json").write_text("stale")
    write_results(rows, old, {"k": 1})
    assert sorted(p.name for p in old.iterdir()) == [
        "notes.txt",
        "replay_results.csv",
        "replay_results.json",
    ]
    assert json.loads((old / "replay_results.json").read_text())["meta"] == {"k": 1}
    assert [p.name for p in tmp_path.iterdir()] == ["reused"]


def test_timed_replay_outputs_are_written_whole_or_not_at_all(tmp_path, monkeypatch):
    result, out = timed.run_timed(
        DATA / "mooncake_tiny.jsonl", ["lru"], capacities=["50%"], output=tmp_path / "ok"
    )
    assert (out / "replay_results.json").exists() and (out / "replay_summary.md").exists()

    def broken(_result):
        raise RuntimeError("formatting failed")

    monkeypatch.setattr(timed, "format_summary", broken)
    with pytest.raises(RuntimeError):
        timed.write_outputs(result, tmp_path / "bad")
    assert [p.name for p in tmp_path.iterdir()] == ["ok"]


def test_160_concurrent_new_run_dir_calls_get_distinct_directories(tmp_path, monkeypatch):
    # every mkdir waits 1 ms first, so any check-then-create gap is hit by the other threads
    # (the old exists()-then-mkdir code raised FileExistsError here)
    real_mkdir = Path.mkdir

    def slow_mkdir(self, *args, **kwargs):
        time.sleep(0.001)
        return real_mkdir(self, *args, **kwargs)

    monkeypatch.setattr(Path, "mkdir", slow_mkdir)
    now = datetime(2025, 1, 2, 3, 4, 5)
    n = 160
    barrier = threading.Barrier(n)
    made: list[Path] = []
    errors: list[BaseException] = []

    def worker() -> None:
        try:
            barrier.wait()
            made.append(runner.new_run_dir(tmp_path, "race", now))
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=worker) for _ in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert len(made) == n and len(set(made)) == n
    assert all(p.is_dir() and not any(p.iterdir()) for p in made)
    assert "20250102_030405_race" in {p.name for p in made}


# ---------------------------------------------------------------------------------------- Ctrl-C


def test_ctrl_c_during_run_all_says_which_experiments_finished(tmp_path, monkeypatch, capsys):
    configs = tmp_path / "configs"
    configs.mkdir()
    for name in ("tiny_a", "tiny_b"):
        data = smoke()
        data.update(id=name, seeds=[0], in_suite=True)
        data["workload"]["params"]["num_requests"] = 50
        write_yaml(configs / f"{name}.yaml", data)
    real = runner.simulate_experiment
    calls = []

    def second_interrupted(config, *a, **k):
        calls.append(config.id)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return real(config, *a, **k)

    # the configs run in this process (one at a time), where the patch and the Ctrl-C reach
    monkeypatch.setenv("SKV_JOBS", "1")
    monkeypatch.delenv("SKV_DASK", raising=False)
    monkeypatch.setattr(runner, "simulate_experiment", second_interrupted)
    out = tmp_path / "out"
    rc = main(["run-all", "--config-dir", str(configs), "--output-root", str(out)])
    err = capsys.readouterr().err
    assert rc == 130 and "Traceback" not in err
    (done,) = visible_runs(out)
    assert "run-all: 1 of 2 experiments finished" in err and str(done) in err
    assert "aggregate summary not written" in err


def test_ctrl_c_in_traces_info_and_replay_exits_130_saying_nothing_was_written(
    tmp_path, monkeypatch, capsys
):
    import skv.replay
    import skv.traces.info

    def interrupted(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr(skv.traces.info, "trace_info", interrupted)
    assert main(["traces", "info", str(DATA / "mooncake_tiny.jsonl")]) == 130
    err = capsys.readouterr().err
    assert "interrupted while summarising" in err and "Traceback" not in err

    monkeypatch.setattr(skv.replay, "replay_one", interrupted)
    argv = ["replay", str(DATA / "mooncake_tiny.jsonl"), "--output", str(tmp_path / "r")]
    assert main([*argv, "--quiet"]) == 130
    err = capsys.readouterr().err
    assert "replay: interrupted after 0 of 1" in err and "nothing written" in err
    assert not (tmp_path / "r").exists()


def test_sigint_during_skv_run_exits_130_without_a_traceback(tmp_path):
    data = smoke()
    data.update(id="slow", seeds=[0, 1, 2, 3])
    data["workload"]["params"]["num_requests"] = 4000
    config = write_yaml(tmp_path / "slow.yaml", data)
    out = tmp_path / "out"
    proc = subprocess.Popen(
        [sys.executable, "-m", "skv.cli", "run", str(config), "--output-root", str(out)],
        cwd=ROOT,
        stderr=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    assert proc.stderr is not None
    started = ""
    while "experiment slow:" not in started:  # the run has begun (imports done, in main)
        line = proc.stderr.readline()
        assert line, f"child ended early: {proc.wait()}"
        started += line
    time.sleep(0.3)
    proc.send_signal(signal.SIGINT)
    _, rest = proc.communicate(timeout=60)
    err = started + rest
    assert proc.returncode == 130, err
    assert "Traceback" not in err and "KeyboardInterrupt" not in err
    assert "skv: interrupted" in err and "experiment slow: interrupted after" in err
    assert "nothing written" in err
    assert visible_runs(out) == []
