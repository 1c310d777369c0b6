#!/usr/bin/env bash
# Builds the native extensions (fasttoken, the CPU kernels) for the device's Python into .so/,
# for gpu_check.sh to carry: built there they cost ~45 s of each device call. They take no
# -march (the kernels pick their SIMD at run time), so any x86-64 machine with a matching
# Python builds them; .so/SOURCES records which sources they were built from, and gpu_check.sh
# builds afresh where those changed since.
#   usage (repo root): bash bench/serving/gpu_prebuild.sh PYTHON   (e.g. a Python 3.12 with Cython)
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=${1:?usage: gpu_prebuild.sh PYTHON}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
git ls-files -z setup.py pyproject.toml prelude/_fasttoken kernels/cpu | xargs -0 cp --parents -t "$work"
(cd "$work" && "$PY" setup.py -q build_ext --inplace -j 2 > build.log 2>&1) || { tail -20 "$work/build.log"; exit 1; }
rm -rf .so && mkdir .so
cp "$work"/prelude/_fasttoken/*.so "$work"/kernels/cpu/*.so .so/
strip --strip-unneeded .so/*.so  # 8 MB of symbols the device call would carry (64 MiB in all)
bash bench/serving/native_sources.sh > .so/SOURCES
ls -la .so
