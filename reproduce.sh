#!/usr/bin/env bash
# One entry point for users, reviewers and CI.
#   ./reproduce.sh          bootstrap .venv, then regenerate every result table
#   ./reproduce.sh test     bootstrap .venv, then run the test suite (lint + pytest)
#   ./reproduce.sh bench    bootstrap .venv, then run the replay speed benchmark
# Needs only Python >= 3.11 with pip and venv. Real traces are read from $SKV_TRACE_DIR
# (default ../shared/traces when present); steps that need a missing trace say so and skip.
set -euo pipefail
cd "$(dirname "$0")"

PYTHON=${PYTHON:-python3}
VENV=.venv
STAMP="$VENV/.skv-installed"

bootstrap() {
    local want
    want=$(cat pyproject.toml setup.py | sha256sum | cut -c1-16)
    if [[ ! -x "$VENV/bin/python" ]]; then
        echo "[reproduce] creating $VENV"
        "$PYTHON" -m venv "$VENV"
    fi
    if [[ ! -f "$STAMP" || "$(cat "$STAMP")" != "$want" ]]; then
        echo "[reproduce] installing skv with dev extras into $VENV"
        "$VENV/bin/python" -m pip install --quiet --upgrade pip
        "$VENV/bin/python" -m pip install --quiet -e ".[dev]"
        echo "$want" > "$STAMP"
    fi
    # the replay hot path is compiled in place; rebuild it when a source is newer than its build
    if ! "$VENV/bin/python" skv/_build.py > /dev/null; then
        echo "[reproduce] rebuilding compiled hot path"
        "$VENV/bin/python" setup.py -q build_ext --inplace > /dev/null
    fi
}

run_tests() {
    "$VENV/bin/ruff" check skv tests benchmarks
    "$VENV/bin/python" -m pytest -q "$@"
}

run_main() {
    local out=build/replay
    mkdir -p "$out"
    "$VENV/bin/skv" check
    local tdir
    tdir=$("$VENV/bin/python" -c 'from skv.traces import trace_dir; print(trace_dir() or "")')
    local mooncake="$tdir/mooncake/conversation_trace.jsonl"
    local weka="$tdir/weka_cc"
    if [[ -n "$tdir" && -f "$mooncake" ]]; then
        echo "[reproduce] replay: Mooncake conversation trace"
        "$VENV/bin/skv" replay "$mooncake" --quiet \
            --policies fifo lru lfu slru gdsf sglang_lru vllm static_semantic adaptive_semantic belady \
            --capacity 2% 5% 10% 20% 40% --output "$out/mooncake"
    else
        echo "[reproduce] SKIPPED mooncake replay: trace not found (set SKV_TRACE_DIR)"
    fi
    if [[ -n "$tdir" && -d "$weka" ]]; then
        echo "[reproduce] replay: Claude Code sessions"
        "$VENV/bin/skv" replay "$weka" --quiet \
            --policies fifo lru lfu slru gdsf sglang_lru vllm static_semantic adaptive_semantic belady \
            --capacity 0.2% 0.5% 1% 2% 5% --output "$out/claude_code"
    else
        echo "[reproduce] SKIPPED claude_code replay: trace not found (set SKV_TRACE_DIR)"
    fi
}

cmd=${1:-all}
[[ $# -gt 0 ]] && shift
bootstrap
case "$cmd" in
    test) run_tests "$@" ;;
    bench) "$VENV/bin/python" benchmarks/replay_speed.py "$@" ;;
    all) run_main ;;
    *) echo "usage: $0 [test|bench]" >&2; exit 2 ;;
esac
