"""The native kernels pick their variants once per process from the CPU's features, so on a wide
CPU (AVX-512, AMX) the rest of the suite runs only the widest. Here the tests of the kernels, the
stored weight formats and the CPU executor run again, each in a process of its own capped by
PRELUDE_CPU_MAX_ISA: as an AVX2 host picks them, and as a host without AVX2 does (the baseline
bodies, which are also what an ARM build compiles)."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

_native = pytest.importorskip("kernels.cpu._native", reason="the native CPU kernels are not built")

ROOT = Path(__file__).resolve().parents[1]
NATIVE_TESTS = ["tests/kernels", "tests/model", "tests/executor/test_prefill_attention.py",
                "tests/executor/test_paged_decode.py", "tests/executor/test_fused_step.py",
                "tests/executor/test_sampler.py", "tests/executor/test_heads.py"]

# Inside the capped process: no sixteen-lane, bf16 or tile products left, int8 products only on
# AVX2's (kernels/cpu/maddubs_gemm.hpp), then the tests.
RUN_CAPPED = """
import os
import sys
import pytest
from kernels.cpu import _native
assert not any(has() for has in (_native.wide_vectors, _native.bf16_products, _native.amx_products)), \
    "PRELUDE_CPU_MAX_ISA was not honoured"
assert _native.int8_products() == (os.environ["PRELUDE_CPU_MAX_ISA"] == "avx2")
sys.exit(pytest.main(["-q", "-p", "no:cacheprovider", *sys.argv[1:]]))
"""


@pytest.mark.parametrize("isa", ["avx2", "baseline"])
def test_the_native_paths_pass_their_tests_on_narrower_instruction_sets(isa: str):
    if isa == "avx2" and not _native.wide_vectors():
        pytest.skip("this CPU has no AVX-512: the rest of the suite already runs its AVX2 variants")
    env = dict(os.environ, PRELUDE_CPU_MAX_ISA=isa)
    done = subprocess.run([sys.executable, "-c", RUN_CAPPED, *NATIVE_TESTS], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-2000:]
