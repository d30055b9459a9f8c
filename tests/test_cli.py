"""The ``skv`` command line, end to end on the small fixture traces."""

from __future__ import annotations

import csv
import json
import re
from pathlib import Path

import pytest

from skv.cli import main
from skv.traces import load_trace

DATA = Path(__file__).parent / "data"
MOONCAKE = DATA / "mooncake_tiny.jsonl"


def test_check_verifies_the_install(capsys):
    assert main(["check"]) == 0
    out = capsys.readouterr().out
    assert "policies: " in out and "lru" in out and "belady" in out
    assert "skv is installed correctly" in out


def test_every_subcommand_has_help(capsys):
    for argv in (["--help"], ["replay", "--help"], ["traces", "info", "--help"], ["check", "-h"]):
        with pytest.raises(SystemExit) as exc:
            main(argv)
        assert exc.value.code == 0
    assert "--capacity" in capsys.readouterr().out


def test_traces_info_prints_the_reuse_ceiling(capsys):
    assert main(["traces", "info", str(MOONCAKE)]) == 0
    out = capsys.readouterr().out
    assert "requests" in out and "hit ceiling" in out and "unique blocks" in out


def test_replay_writes_csv_and_json_per_policy_and_capacity(tmp_path, capsys):
    out = tmp_path / "run"
    argv = ["replay", str(MOONCAKE), "--policies", "lru", "vllm", "belady", "--quiet"]
    argv += ["--capacity", "50%", "--capacity", "2", "--output", str(out)]
    assert main(argv) == 0
    rows = list(csv.DictReader((out / "replay_results.csv").open()))
    assert [(r["capacity"], r["policy"]) for r in rows] == [
        ("50%", "lru"),
        ("50%", "vllm"),
        ("50%", "belady"),
        ("2", "lru"),
        ("2", "vllm"),
        ("2", "belady"),
    ]
    for r in rows:
        assert 0.0 <= float(r["token_hit_rate"]) <= float(r["ceiling_token_hit_rate"])
        assert 0.0 <= float(r["block_hit_rate"]) <= 1.0
    payload = json.loads((out / "replay_results.json").read_text())
    first = payload["results"][0]
    assert {"token_hit_rate", "block_hit_rate", "evictions_by_type", "hit_rate_by_type"} <= set(
        first
    )
    assert "simulated" in payload["meta"]["simulated"]
    assert "lru" in capsys.readouterr().out


def test_replay_is_byte_identical_across_runs(tmp_path):
    outs = []
    for name in ("a", "b"):
        out = tmp_path / name
        argv = ["replay", str(MOONCAKE), "--policies", "lru", "adaptive_semantic", "--quiet"]
        assert main([*argv, "--capacity", "3", "--output", str(out)]) == 0
        outs.append(((out / "replay_results.csv").read_bytes(), (out / "replay_results.json")))
    assert outs[0][0] == outs[1][0]
    assert outs[0][1].read_bytes() == outs[1][1].read_bytes()


def test_byte_capacity_needs_a_model(tmp_path, capsys):
    argv = ["replay", str(MOONCAKE), "--capacity", "30GB", "--output", str(tmp_path / "x")]
    assert main(argv) == 2
    assert "--model" in capsys.readouterr().err
    assert main([*argv, "--model", "llama-3.1-8b", "--quiet"]) == 0


def test_an_unknown_policy_is_a_clear_error(tmp_path, capsys):
    argv = ["replay", str(MOONCAKE), "--policies", "nope", "--output", str(tmp_path / "x")]
    assert main(argv) == 2
    assert "unknown policy 'nope'" in capsys.readouterr().err
    assert not (tmp_path / "x").exists()


def test_a_malformed_trace_names_the_file_and_line(tmp_path, capsys):
    bad = tmp_path / "bad.jsonl"
    bad.write_text(MOONCAKE.read_text().splitlines()[0] + "\n{not json\n")
    assert main(["traces", "info", str(bad), "--format", "mooncake"]) == 2
    assert f"{bad}:2" in capsys.readouterr().err


def test_convert_round_trips_through_the_native_format(tmp_path):
    native = tmp_path / "t.jsonl"
    assert main(["traces", "convert", str(MOONCAKE), "--to", "skv", str(native)]) == 0
    oracle = tmp_path / "t.bin"
    assert main(["traces", "convert", str(native), "--to", "oracle_general", str(oracle)]) == 0
    assert oracle.stat().st_size % 24 == 0 and oracle.stat().st_size > 0


def test_check_builds_the_four_service_apps(capsys, monkeypatch):
    import skv.cli

    assert main(["check"]) == 0
    out = capsys.readouterr().out
    for name in ("mock backend", "telemetry proxy", "router", "simulation API"):
        assert f"ok      app {name}\n" in out
    assert "HTTP Request" not in out

    apps = skv.cli._service_apps()

    def broken():
        raise RuntimeError("router config broken")

    monkeypatch.setattr(skv.cli, "_service_apps", lambda: {**apps, "router": broken})
    assert main(["check"]) == 1
    out = capsys.readouterr().out
    assert "FAILED  app router: router config broken" in out
    assert "ok      app simulation API" in out  # one broken app does not hide the others


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--policies", "lru", "nope"], "unknown policy 'nope'; known: fifo, lru"),
        (["--capacity", "10parsecs"], "capacity '10parsecs': unknown unit"),
        (["--capacity", "ten"], "capacity 'ten': expected e.g. 4096"),
        (["--capacity", "30GB"], "give a model (--model)"),
        (["--capacity", "30GB", "--model", "gpt-17"], "unknown model preset 'gpt-17'"),
        (["--timed", "--policies", "nope"], "unknown policy 'nope'"),
    ],
)
def test_replay_names_are_checked_before_the_trace_loads(tmp_path, capsys, extra, message):
    """The trace does not exist: the argument error must come first, as a clean exit 2."""
    missing = tmp_path / "never_loaded.jsonl"
    assert main(["replay", str(missing), *extra, "--output", str(tmp_path / "x")]) == 2
    err = capsys.readouterr().err
    assert message in err
    assert "no such file" not in err and "Traceback" not in err


def test_a_missing_relative_trace_says_no_such_file_first(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("SKV_TRACE_DIR", str(tmp_path))
    monkeypatch.chdir(tmp_path)
    assert main(["traces", "info", "mooncake/typo.jsonl"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("skv: error: no such file: mooncake/typo.jsonl")
    assert f"not found under trace directory {tmp_path}" in err


def test_an_undetectable_format_names_the_cli_flag(tmp_path, capsys):
    odd = tmp_path / "odd.csv"
    odd.write_text("a,b\n1,2\n")
    assert main(["traces", "info", str(odd)]) == 2
    assert "--format" in capsys.readouterr().err


def test_traces_info_says_when_a_format_has_no_sessions(capsys):
    assert main(["traces", "info", str(MOONCAKE)]) == 0  # Mooncake carries no session ids
    assert "sessions          -\n" in capsys.readouterr().out
    assert main(["traces", "info", str(DATA / "bailian_tiny.jsonl")]) == 0
    out = capsys.readouterr().out
    assert re.search(r"^sessions +[1-9][0-9,]*$", out, re.M)


# --------------------------------------------------------------------------- commands by domain


def _leaf_commands(parser, prefix=()):
    """Every command path of ``skv`` (sub-subcommands included), hidden aliases too."""
    import argparse

    subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if not subs:
        yield prefix
        return
    for name, child in subs[0].choices.items():
        yield from _leaf_commands(child, (*prefix, name))


def test_every_command_and_alias_answers_help(capsys):
    from skv.cli import build_parser

    paths = list(_leaf_commands(build_parser()))
    assert ("services", "mock") in paths and ("serve-mock",) in paths
    assert ("traces", "info") in paths and ("pipeline",) in paths
    for path in paths:
        with pytest.raises(SystemExit) as exc:
            main([*path, "--help"])
        assert exc.value.code == 0, path
        assert "usage:" in capsys.readouterr().out, path


def test_help_lists_the_commands_by_domain_and_hides_the_old_spellings(capsys):
    with pytest.raises(SystemExit):
        main(["--help"])
    out = capsys.readouterr().out
    titles = ["install:", "traces and cache-only replay:", "serving simulation:"]
    titles += ["paper pipeline:", "services (servers bind 127.0.0.1):", "real vLLM engine:"]
    at = [out.index(f"\n  {t}\n") for t in titles]
    assert at == sorted(at)
    listed = re.findall(r"^    ([a-z-]+)  ", out, re.M)
    commands = ["check", "traces", "replay", "shadow", "leaderboard", "run", "run-all"]
    commands += ["collect-mock", "pipeline"]
    assert listed == [*commands, "services", "vllm"]
    assert "skv serve-mock|proxy|router|sim-api|demo-router" in out


def test_pipeline_list_delegates_to_the_pipeline(capsys):
    from skv.artifact.pipeline import STEPS
    from skv.artifact.pipeline import main as pipeline_main

    assert main(["pipeline", "list"]) == 0
    out = capsys.readouterr().out
    assert [line.split()[0] for line in out.splitlines()] == list(STEPS)
    assert pipeline_main(["list"]) == 0  # `python -m skv.artifact.pipeline list` prints the same
    assert capsys.readouterr().out == out
    for argv in (["pipeline", "--help"], ["pipeline", "run", "--help"]):
        with pytest.raises(SystemExit) as exc:
            main(argv)
        assert exc.value.code == 0
    assert "--quick" in capsys.readouterr().out


def test_services_group_and_old_spellings_parse_alike(capsys):
    from skv.cli import build_parser
    from skv.services import cli as services_cli

    parser = build_parser()
    with pytest.raises(SystemExit):
        main(["services", "--help"])
    out = capsys.readouterr().out
    for name in ("mock", "proxy", "router", "sim-api", "demo-router"):
        assert name in out
    pairs = [
        (["serve-mock", "--port", "8111", "--policy", "vllm"], ["services", "mock"]),
        (["router", "--replicas", "http://a,http://b", "--policy", "prefix_locality"],
         ["services", "router"]),
        (["proxy", "--upstream", "http://u", "--no-redact"], ["services", "proxy"]),
        (["sim-api", "--cache-tokens", "9"], ["services", "sim-api"]),
    ]  # fmt: skip
    for old, new in pairs:
        a, b = vars(parser.parse_args(old)), vars(parser.parse_args([*new, *old[1:]]))
        assert a.pop("command") == old[0] and b.pop("command") == "services"
        assert b.pop("services_command") == new[1]
        assert a == b, old
    assert parser.parse_args(["serve-mock"]).func is services_cli.cmd_serve_mock
    assert parser.parse_args(["router"]).func is services_cli.cmd_router


def test_demo_router_prints_the_same_under_both_spellings(capsys):
    argv = ["--requests", "6", "--replicas", "2", "--policies", "round_robin", "prefix_locality"]
    assert main(["demo-router", *argv]) == 0
    old = capsys.readouterr().out
    assert main(["services", "demo-router", *argv]) == 0
    assert capsys.readouterr().out == old
    assert "prefix_locality" in old and "%" in old


def test_traces_info_runs_from_the_traces_module(capsys):
    from skv.cli import build_parser
    from skv.traces import cli as traces_cli

    args = build_parser().parse_args(["traces", "info", str(MOONCAKE), "--limit", "3"])
    assert args.func is traces_cli.cmd_traces_info
    assert args.func(args) == 0
    assert re.search(r"^requests +3$", capsys.readouterr().out, re.M)
    chains, bs = traces_cli.load_compiled(MOONCAKE, None, 3, None, "prefix", False)
    assert len(chains) == 3 and bs == load_trace(MOONCAKE)[0].hash_block_size
    compact, bs2 = traces_cli.load_compiled(MOONCAKE, None, 3, None, "prefix", False, compact=True)
    assert list(compact) == chains and bs2 == bs
