#!/usr/bin/env bash
# Fill a wheelhouse for the silofl images: the silofl wheel built from this project tree, torch 2.13.0 (CPU) and
# every dependency, for the Python inside the image.
#
#   docker/wheels.sh [--out DIR] [--python-version X.Y] [--python PYTHON]
#
# DIR defaults to docker/wheels (the images' build context copies it; git ignores it). X.Y is the image's Python:
# 3.11 for the local Debian bookworm base (build_base.sh); use the Python of the official flwr/* image you build
# from otherwise (its tag names it, e.g. py3.13). Wheels are chosen for CPython X.Y on manylinux x86_64 whatever
# Python runs this script, so nothing is compiled and the images install with `pip install --no-index`. PYTHON's pip
# (default python3) does the work and must see the CPU torch build: with a plain PyPI index, export
# PIP_EXTRA_INDEX_URL=https://download.pytorch.org/whl/cpu first.
set -euo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
project="$(cd "$here/.." && pwd)"
OUT="$here/wheels"
PYVER="3.11"
PYTHON="python3"

while [[ $# -gt 0 ]]; do
    case "$1" in
        --out) OUT="$2"; shift 2 ;;
        --python-version) PYVER="$2"; shift 2 ;;
        --python) PYTHON="$2"; shift 2 ;;
        -h|--help) sed -n '2,12p' "$0"; exit 0 ;;
        *) echo "wheels.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
    esac
done
if [[ ! "$PYVER" =~ ^3\.[0-9]+$ ]]; then
    echo "wheels.sh: --python-version must look like 3.11, got '$PYVER'" >&2
    exit 2
fi

start=$(date +%s)
mkdir -p "$OUT"
rm -f "$OUT"/silofl-*.whl   # always rebuilt from the tree; the others are reused when already present
# A throwaway build dir keeps setuptools' build/ and egg-info out of the project tree.
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
cp -r "$project/pyproject.toml" "$project/README.md" "$project/server" "$project/client" "$project/strategies" \
    "$project/protocols" "$tmp/"
find "$tmp" -name __pycache__ -prune -exec rm -rf {} +
"$PYTHON" -m pip wheel --quiet --no-deps --no-build-isolation --wheel-dir "$OUT" "$tmp" \
    || "$PYTHON" -m pip wheel --quiet --no-deps --wheel-dir "$OUT" "$tmp"
wheel="$(ls "$OUT"/silofl-*.whl)"

abi="cp${PYVER/./}"
platforms=()
for p in manylinux_2_36_x86_64 manylinux_2_35_x86_64 manylinux_2_34_x86_64 manylinux_2_31_x86_64 \
         manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_24_x86_64 manylinux_2_17_x86_64 \
         manylinux2014_x86_64 manylinux2010_x86_64 manylinux1_x86_64 linux_x86_64; do
    platforms+=(--platform "$p")
done
# torch first pinned: a bare `torch` requirement could resolve to a CUDA build (several GB).
"$PYTHON" -m pip download --quiet --dest "$OUT" --only-binary=:all: --python-version "$PYVER" --implementation cp \
    --abi "$abi" "${platforms[@]}" "torch==2.13.0" "$wheel" 2> >(grep -v '^WARNING: Location' >&2)

echo "$PYVER" > "$OUT/PYTHON_VERSION"
echo "wheels.sh: $(ls "$OUT"/*.whl | wc -l) wheels for CPython $PYVER in $OUT ($(du -sh "$OUT" | cut -f1)) in $(( $(date +%s) - start )) s"
