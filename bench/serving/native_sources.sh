#!/usr/bin/env bash
# One line naming the native extensions' sources as they are now (gpu_prebuild.sh, gpu_check.sh,
# gpu_table2.py --against), in this checkout or the one given.
cd "${1:-$(dirname "$0")/../..}"
export LC_ALL=C  # the same glob order on every machine
cat setup.py prelude/_fasttoken/*.pyx prelude/_fasttoken/*.pxd prelude/_fasttoken/*.hpp kernels/cpu/*.pyx \
  kernels/cpu/*.pxi kernels/cpu/*.hpp 2>/dev/null | sha256sum | cut -c1-16
