#!/usr/bin/env bash
# One entry point for users, reviewers and CI.
#   ./reproduce.sh                bootstrap .venv, then execute every paper notebook (figures/,
#                                 paper/tables/, build/); unchanged steps are cached
#   ./reproduce.sh --quick        reduced sizes into build/quick/ (how long each command takes,
#                                 measured: ARTIFACT.md, "Times"; experiments/timings.json)
#   ./reproduce.sh fig_NAME ...   only those steps (and what they need); --force, -j N also work
#   ./reproduce.sh check [--quick]  compare produced numbers with experiments/claims.yaml
#   ./reproduce.sh list           the notebook steps
#   ./reproduce.sh paper [--quick]  write paper/generated/values.tex from the runs and build
#                                 paper/main.pdf (needs latexmk or tectonic); --quick: from the
#                                 quick run, into build/quick/paper/
#   ./reproduce.sh test [ARGS]  bootstrap .venv, then lint + the test suite (engine tests last,
#                                 alone); ARGS go to pytest as they are
#   ./reproduce.sh bench    bootstrap .venv, then run the replay speed benchmark
#   ./reproduce.sh mutate [MODULE ...]  mutation testing of the core with mutmut (pure Python,
#                                 slow, not in CI): scores in build/mutation/scores.md
# Needs only Python >= 3.11 with pip and venv. Real traces are read from $SKV_TRACE_DIR
# (default ../shared/traces when present); steps that need a missing trace say so and skip.
set -euo pipefail
cd "$(dirname "$0")"

PYTHON=${PYTHON:-python3}
VENV=.venv
STAMP="$VENV/.skv-installed"

bootstrap() {
    # Installs the pinned environment (requirements.lock, made by scripts/lock.sh) so a rerun next
    # year gets what this one did; without the lock it falls back to the newest matching versions.
    # Reinstalls whenever pyproject.toml, setup.py or the lock change (the stamp is their hash).
    local want lock=requirements.lock from_lock=true start
    [[ -f "$lock" ]] || from_lock=false
    want=$(cat pyproject.toml setup.py $([[ $from_lock == true ]] && echo "$lock") \
        | sha256sum | cut -c1-16)
    start=$(date +%s.%N)
    if [[ ! -x "$VENV/bin/python" ]]; then
        echo "[reproduce] creating $VENV"
        "$PYTHON" -m venv "$VENV"
    fi
    if [[ ! -f "$STAMP" || "$(cat "$STAMP")" != "$want" ]]; then
        "$VENV/bin/python" -m pip install --quiet --upgrade pip
        if [[ $from_lock == true ]]; then
            echo "[reproduce] installing the pinned environment ($lock) and skv into $VENV"
            "$VENV/bin/python" -m pip install --quiet -r "$lock"
            # the lock holds the build requirements too (setuptools, Cython): build with them
            "$VENV/bin/python" -m pip install --quiet --no-deps --no-build-isolation -e .
        else
            echo "[reproduce] no $lock: installing skv with dev extras (newest versions) into $VENV"
            "$VENV/bin/python" -m pip install --quiet -e ".[dev]"
        fi
        echo "$want" > "$STAMP"
        # the install time, for the docs' times (skv/artifact/timings.py)
        "$VENV/bin/python" -m skv.artifact.timings mark install --start "$start" \
            --note "python $("$VENV/bin/python" -c 'import platform; print(platform.python_version())'), $([[ $from_lock == true ]] && echo "from $lock" || echo "newest versions")" > /dev/null
    fi
    # the replay hot path is compiled in place; rebuild it when a source is newer than its build
    if ! "$VENV/bin/python" skv/_build.py > /dev/null; then
        echo "[reproduce] rebuilding compiled hot path"
        "$VENV/bin/python" setup.py -q build_ext --inplace > /dev/null
    fi
}

run_mutate() {
    # mutation testing of the core (not in CI: slow); mutmut is pinned here, not in the lock, and
    # installed into .venv on first use (the lock constrains its dependencies); scripts/mutate.py
    if [[ "$("$VENV/bin/python" -m pip show mutmut 2>/dev/null | sed -n 's/^Version: //p')" != 3.8.1 ]]
    then
        echo "[reproduce] installing mutmut 3.8.1 into $VENV"
        "$VENV/bin/python" -m pip install --quiet "mutmut==3.8.1" \
            $([[ -f requirements.lock ]] && echo -c requirements.lock)
    fi
    "$VENV/bin/python" scripts/mutate.py "$@"
}

run_tests() {
    # With no arguments, the whole suite in two runs: every test but the real-engine ones on all
    # cores (pytest-xdist, a file's tests in one worker), then the real-engine tests alone, one at
    # a time (engines sharing the cores stall each other). Its time goes into the docs
    # (skv/artifact/timings.py); a selection's (arguments go to pytest as they are) does not.
    local start rc=0
    start=$(date +%s.%N)
    "$VENV/bin/ruff" check skv tests benchmarks
    if [[ $# -gt 0 ]]; then
        "$VENV/bin/python" -m pytest -q "$@"
        return
    fi
    "$VENV/bin/python" -m pytest -q -n auto --dist loadfile -m "not vllm and not smollm2" || rc=$?
    "$VENV/bin/python" -m pytest -q -m "vllm or smollm2" || rc=$?
    "$VENV/bin/python" -m skv.artifact.timings mark test --start "$start" --exit "$rc" > /dev/null
    return $rc
}

cmd=${1:-all}
case "$cmd" in
    test | bench | check | list | paper | all) [[ $# -gt 0 ]] && shift ;;
    -* | fig_* | tab_*) cmd=all ;;  # options and step names go to the pipeline
    mutate) shift ;;  # mutation testing: ./reproduce.sh mutate [MODULE ...] (scripts/mutate.py)
    *) echo "usage: $0 [test|bench|check|list|paper] | [--quick] [--force] [-j N] [STEP ...]" >&2; exit 2 ;;
esac
bootstrap
case "$cmd" in
    test) run_tests "$@" ;;
    bench) "$VENV/bin/python" benchmarks/replay_speed.py "$@" ;;
    mutate) run_mutate "$@" ;;
    check) "$VENV/bin/python" -m skv.artifact.pipeline check "$@" ;;
    list) "$VENV/bin/python" -m skv.artifact.pipeline list ;;
    paper) "$VENV/bin/python" -m skv.artifact.pipeline paper "$@" ;;
    all) "$VENV/bin/skv" check && "$VENV/bin/python" -m skv.artifact.pipeline run "$@" ;;
esac
