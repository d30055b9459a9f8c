#!/usr/bin/env bash
# One entry point for users, reviewers and CI.
#   ./reproduce.sh                bootstrap .venv, then execute every paper notebook (figures/,
#                                 paper/tables/, build/); unchanged steps are cached
#   ./reproduce.sh --quick        reduced sizes (<= 5 min) into build/quick/
#   ./reproduce.sh fig_NAME ...   only those steps (and what they need); --force, -j N also work
#   ./reproduce.sh check [--quick]  compare produced numbers with experiments/claims.yaml
#   ./reproduce.sh list           the notebook steps
#   ./reproduce.sh paper          build paper/main.pdf (needs latexmk or tectonic)
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

build_paper() {
    if command -v latexmk > /dev/null; then
        (cd paper && latexmk -pdf -interaction=nonstopmode main.tex)
    elif command -v tectonic > /dev/null; then
        (cd paper && tectonic main.tex)
    else
        echo "[reproduce] no LaTeX engine found: install latexmk (Debian: apt-get install latexmk" \
            "texlive-latex-recommended texlive-latex-extra) or tectonic, then rerun ./reproduce.sh paper" >&2
        exit 1
    fi
}

cmd=${1:-all}
case "$cmd" in
    test | bench | check | list | paper | all) [[ $# -gt 0 ]] && shift ;;
    -* | fig_* | tab_*) cmd=all ;;  # options and step names go to the pipeline
    *) echo "usage: $0 [test|bench|check|list|paper] | [--quick] [--force] [-j N] [STEP ...]" >&2; exit 2 ;;
esac
bootstrap
case "$cmd" in
    test) run_tests "$@" ;;
    bench) "$VENV/bin/python" benchmarks/replay_speed.py "$@" ;;
    check) "$VENV/bin/python" -m skv.pipeline check "$@" ;;
    list) "$VENV/bin/python" -m skv.pipeline list ;;
    paper) build_paper ;;
    all) "$VENV/bin/skv" check && "$VENV/bin/python" -m skv.pipeline run "$@" ;;
esac
