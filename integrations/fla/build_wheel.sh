#!/usr/bin/env bash
# Build flash-linear-attention 0.6.0 with the Selective RoPE series applied, as two local wheels:
#   integrations/fla/build_wheel.sh [OUT_DIR]        (default: ./dist/fla; PYTHON=python3 by default)
# It downloads the two 0.6.0 sdists from PyPI (fla-core: fla/ops, fla/modules, fla/utils;
# flash-linear-attention: fla/layers, fla/models), applies each patch's files to the sdist that holds
# them, and builds fla_core-0.6.0+selectiverope and flash_linear_attention-0.6.0+selectiverope
# (a local version: flash-linear-attention's fla-core==0.6.0 requirement still matches). Install both:
#   pip install --no-deps OUT_DIR/*.whl
# tests/ and benchmarks/ of the series are not in the sdists; read them in the patches or a checkout.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
OUT=$(mkdir -p "${1:-dist/fla}" && cd "${1:-dist/fla}" && pwd)
PYTHON=${PYTHON:-python3}
LOCAL=selectiverope
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT

"$PYTHON" -m pip download --quiet --no-deps --no-binary :all: -d "$WORK" fla-core==0.6.0 flash-linear-attention==0.6.0
tar -xzf "$WORK/fla_core-0.6.0.tar.gz" -C "$WORK"
tar -xzf "$WORK/flash_linear_attention-0.6.0.tar.gz" -C "$WORK"

# Each patch touches files of one sdist or the other (or neither: tests/, benchmarks/); git apply
# --include keeps the ones the sdist holds, outside any git repository.
for patch in "$HERE"/patches/*.patch; do
    (cd "$WORK/fla_core-0.6.0" && git apply --include='fla/ops/*' --include='fla/modules/*' --include='fla/utils/*' "$patch")
    (cd "$WORK/flash_linear_attention-0.6.0" && git apply --include='fla/layers/*' --include='fla/models/*' "$patch")
done
test -f "$WORK/fla_core-0.6.0/fla/ops/selective_rope/chunk.py"
grep -q use_selective_rope "$WORK/flash_linear_attention-0.6.0/fla/layers/gla.py"

for src in fla_core-0.6.0 flash_linear_attention-0.6.0; do
    sed -i "s/^version = \"0.6.0\"$/version = \"0.6.0+$LOCAL\"/" "$WORK/$src/pyproject.toml"
    grep -q "^version = \"0.6.0+$LOCAL\"$" "$WORK/$src/pyproject.toml"
    "$PYTHON" -m pip wheel --quiet --no-deps -w "$OUT" "$WORK/$src"
done
ls "$OUT"/*"+$LOCAL"*.whl
