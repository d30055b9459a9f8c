#!/usr/bin/env bash
# Regenerate requirements.lock: the exact versions that `pip install -e ".[dev]"` resolves today,
# so that ./reproduce.sh installs the same environment next year.
#   bash scripts/lock.sh            # uses python3 (or $PYTHON); takes a few minutes
# It installs into a fresh temporary venv (never into .venv), then writes `pip freeze` of it,
# sorted, without skv itself and without pip, under a header naming the Python it was made for.
# Commit the result; ./reproduce.sh reinstalls .venv when the lock changes.
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3}
OUT=${1:-requirements.lock}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

"$PYTHON" -m venv "$tmp/venv"
"$tmp/venv/bin/python" -m pip install --quiet --upgrade pip
"$tmp/venv/bin/python" -m pip install --quiet -e ".[dev]"
pyver=$("$tmp/venv/bin/python" -c 'import platform; print(platform.python_version())')
plat=$("$tmp/venv/bin/python" -c 'import platform; print(platform.system(), platform.machine())')
# --all keeps setuptools (the in-place rebuild of the hot path needs it); pip is upgraded anyway
frozen=$("$tmp/venv/bin/python" -m pip freeze --all --exclude-editable | grep -v -i '^pip==' \
    | LC_ALL=C sort -f)
if grep -q -E '^[^#].*(@ |\+)' <<< "$frozen"; then
    echo "lock.sh: a pin is not a plain PyPI release (local version or URL):" >&2
    grep -E '^[^#].*(@ |\+)' <<< "$frozen" >&2
    exit 1
fi
{
    echo "# Exact versions of skv's dependencies with the dev extra, for Python ${pyver%.*}"
    echo "# (made with CPython $pyver on $plat, $(date -u +%Y-%m-%d))."
    echo "# Produced by scripts/lock.sh: pip install -e \".[dev]\" into a fresh venv, then"
    echo "# pip freeze --all --exclude-editable, sorted, pip itself left out."
    echo "# ./reproduce.sh installs it: pip install -r requirements.lock; pip install --no-deps -e ."
    echo "# Without the lock, pip install -e \".[dev]\" still works (newest matching versions)."
    echo "$frozen"
} > "$OUT"
echo "lock.sh: wrote $OUT ($(grep -c -v '^#' "$OUT") pins, Python $pyver)"
