#!/usr/bin/env bash
# Everything one device call needs: install carried wheels (.whl/: flashinfer-python,
# apache-tvm-ffi, and the server's starlette/hypercorn stack, which the GPU image lacks), run
# the CUDA tests, the kernel micro-benchmark and the serving table. Results go to $OUT.
#   usage (repo root): bash bench/serving/gpu_check.sh [gpu_table2.py flags]
# Each stage has a time limit (TEST_TIMEOUT / BENCH_TIMEOUT / TABLE_TIMEOUT / PROFILE_TIMEOUT /
# MULTI_TIMEOUT / CPU_TIMEOUT, seconds), cut to what is left of BUDGET (570 s: the device kills a call at 600 s)
# less RESERVE (40 s) for saving the flashinfer modules and the logs at exit, so a slow stage
# costs the later ones their time, never the results already written.
#
# Preparing the carried folders on a machine with network access (the device has none):
#   pip download --no-deps --only-binary=:all: --python-version 3.12 \
#     --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
#     --platform manylinux_2_12_x86_64 --platform manylinux_2_31_x86_64 -d .whl flashinfer-python==0.6.6 \
#     "apache-tvm-ffi>=0.1.6,<0.2,!=0.1.8,!=0.1.8.post0" starlette hypercorn h2 hpack hyperframe \
#     priority wsproto orjson cython nvidia-ml-py ninja tokenizers py-spy uvicorn httptools \
#     "llguidance>=1.7" aiohttp aiohappyeyeballs aiosignal attrs frozenlist multidict propcache yarl idna
#   mkdir -p .tok && cp ../shared/tokenizers/qwen3/tokenizer*.json .tok/
#   bash bench/serving/gpu_prebuild.sh python3.12   # optional: the native extensions, into .so/
# then run this with carry [".whl", ".tok", ".so"] (and ".fi-cache", below). flashinfer-python 0.6.6 (7.8 MB) rather than 0.7.x
# (62 MB): the device call carries at most 64 MiB. uvicorn and httptools are the default HTTP
# server's, aiohttp and the rest of that line the benchmarks' client's; llguidance's newer wheels are manylinux_2_31 (without that tag pip picks 1.6, which
# the structured-output tests refuse). py-spy samples the table's servers (which thread
# holds the GIL, doing what). nvidia-ml-py and ninja are carried and installed
# where the image lacks them; its other requirements are in the GPU image (einops, numpy,
# requests, click, tqdm, tabulate) or only imported by
# paths Prelude does not use (cudnn frontend, cutlass DSL).
#
# flashinfer's JIT modules outlive the call: at exit every module compiled here (with those
# restored) goes to $OUT/fi-aot.tar.xz.NN (15 MiB parts). Copy those files into .fi-cache/ and
# carry it on the next call: they are unpacked into flashinfer's AOT folder, where flashinfer
# loads a module instead of compiling it. At exit the logs are packed into $OUT/logs.tar.xz,
# since a device call returns at most 8 files.
set -u
cd "$(dirname "$0")/../.."
OUT=${OUT:-bench-results}
mkdir -p "$OUT"
export OUT PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
export MAX_JOBS=${MAX_JOBS:-16}  # parallel nvcc jobs for flashinfer's JIT
export XZ_OPT=${XZ_OPT:--T0}  # the modules and logs are packed in the reserve: every core
PY=${PY:-python3}
start=$(date +%s)
BUDGET=${BUDGET:-570}; RESERVE=${RESERVE:-40}
stage() { echo "== $1 (t=$(( $(date +%s) - start ))s)"; }
# The stage's own limit, or what the budget has left if that is less (at least 1 s).
limit() {
  local left=$(( BUDGET - RESERVE - ($(date +%s) - start) ))
  (( left < 1 )) && left=1
  echo $(( $1 < left ? $1 : left ))
}

stage "wheels"
# flashinfer's own imports (pynvml from nvidia-ml-py; ninja for its JIT), HF tokenizers (the
# table's checkpoint builder) and aiohttp's attrs and idna are installed only where the image lacks them: replacing the
# image's copies could break what it pinned them for (transformers pins tokenizers).
wheels=()
for whl in .whl/*.whl; do
  [ -f "$whl" ] || continue
  case "$(basename "$whl")" in
    nvidia_ml_py-*) $PY -c "import pynvml" 2>/dev/null && continue ;;
    ninja-*) $PY -c "import ninja" 2>/dev/null && continue ;;
    tokenizers-*) $PY -c "import tokenizers" 2>/dev/null && continue ;;
    attrs-*) $PY -c "import attrs" 2>/dev/null && continue ;;
    idna-*) $PY -c "import idna" 2>/dev/null && continue ;;
  esac
  wheels+=("$whl")
done
if (( ${#wheels[@]} )); then
  $PY -m pip install -q --no-deps --no-index --disable-pip-version-check "${wheels[@]}" 2>&1 | grep -v WARNING
fi
stage "flashinfer modules of earlier runs"
FI_AOT=; FI_JIT=; FI_KEEP=/tmp/fi-aot  # FI_KEEP: every module to save, as <name>/<name>.so
read -r FI_AOT FI_JIT < <($PY -c "import flashinfer.jit.env as e; print(e.FLASHINFER_AOT_DIR, e.FLASHINFER_JIT_DIR)" 2>/dev/null)
mkdir -p "$FI_KEEP"
if [ -n "$FI_AOT" ] && compgen -G ".fi-cache/fi-aot.tar.xz*" > /dev/null; then
  cat .fi-cache/fi-aot.tar.xz* | tar -xJ -C "$FI_KEEP" && mkdir -p "$FI_AOT" && cp -r "$FI_KEEP"/. "$FI_AOT"/
  echo "restored $(ls "$FI_KEEP" | wc -l) modules into $FI_AOT"
fi
finish() {
  if [ -n "$FI_JIT" ] && [ -d "$FI_JIT" ]; then
    for so in "$FI_JIT"/*/*.so; do
      [ -f "$so" ] || continue
      name=$(basename "$(dirname "$so")")
      [ "$(basename "$so")" = "$name.so" ] && mkdir -p "$FI_KEEP/$name" && cp "$so" "$FI_KEEP/$name/"
    done
  fi
  if [ -n "$(ls "$FI_KEEP")" ]; then
    tar -C "$FI_KEEP" -cJf /tmp/fi-aot.tar.xz . && split -b 15m -d /tmp/fi-aot.tar.xz "$OUT/fi-aot.tar.xz."
    echo "saved $(ls "$FI_KEEP" | wc -l) flashinfer modules: $(du -h /tmp/fi-aot.tar.xz | cut -f1) in $OUT/fi-aot.tar.xz.*"
  fi
  (cd "$OUT" && ls | grep -v -E '\.json$|^fi-aot\.tar\.xz\.|^logs\.tar\.xz$' | tar -cJf logs.tar.xz -T - --remove-files)
}
trap finish EXIT

stage "native extensions"
# fasttoken and the CPU kernels for the device's Python (3.12): carried prebuilt in .so/
# (gpu_prebuild.sh) when built from these sources, else built here (~45 s; without Cython the
# server falls back to HF tokenizers).
suffix=$($PY -c "import importlib.machinery as m; print(m.EXTENSION_SUFFIXES[0])")
if [ "$(cat .so/SOURCES 2>/dev/null)" = "$(bash bench/serving/native_sources.sh)" ] && compgen -G ".so/*$suffix" > /dev/null; then
  cp .so/core*"$suffix" prelude/_fasttoken/ && cp .so/_native*"$suffix" kernels/cpu/ && echo "carried: $(ls .so)"
elif $PY -c "import Cython" 2>/dev/null; then
  $PY setup.py -q build_ext --inplace -j 2 2>&1 | tail -3
fi
# The modules' bytecode, as an install compiles it (setup.py): the startup figures below are of
# a server that does not compile its modules, whether or not this machine lets Python write it.
$PY -m compileall -q -j 0 "$PWD/prelude" "$PWD/kernels" > /dev/null
$PY - <<'PY'
import importlib, importlib.metadata, torch
print("torch", torch.__version__, "cuda", torch.version.cuda, torch.cuda.get_device_name() if torch.cuda.is_available() else "NO GPU")
for name in ("triton", "flashinfer", "starlette", "hypercorn", "aiohttp"):
    try:
        module = importlib.import_module(name)  # hypercorn has no __version__
        print(name, getattr(module, "__version__", None) or importlib.metadata.version(name))
    except Exception as exc:
        print(name, "NOT IMPORTABLE:", exc)
        if name == "flashinfer" and torch.cuda.is_available():  # the backend would fall back quietly
            print("ERROR: without flashinfer the CUDA executor runs the torch reference attention; "
                  "the table below does not measure Prelude's CUDA path")
PY

stage "import times"
# What the server imports before it builds anything (the startup issue's largest phase on the
# device): torch with CUDA, triton, flashinfer and Prelude's own, cumulative, largest first.
$PY -X importtime -c "import torch, triton, flashinfer; import prelude.app.assembly" 2> "$OUT/importtime.txt"
sort -t'|' -k2 -n -r "$OUT/importtime.txt" | head -n 25

stage "CUDA tests"
timeout "$(limit "${TEST_TIMEOUT:-240}")" $PY -m pytest tests/kernels tests/executor \
  tests/model/test_encoder_parity.py::test_flashinfer_encoder_states_on_the_gpu_match_transformers -q -rs --maxfail=5 -p no:cacheprovider \
  > "$OUT/pytest.log" 2>&1
echo "pytest exit $?"; tail -n 15 "$OUT/pytest.log"

stage "kernel micro-benchmark"
timeout "$(limit "${BENCH_TIMEOUT:-60}")" $PY -m kernels.bench --json "$OUT/kernels.json" 2>&1 | tee "$OUT/kernels.txt"

stage "serving table"
tok=.tok
[ -f "$tok/tokenizer.json" ] || tok=shared/tokenizers/qwen3
spy=(--py-spy); [ "${PY_SPY:-1}" = 0 ] && spy=()  # PY_SPY=0: no second pass under py-spy
timeout "$(limit "${TABLE_TIMEOUT:-330}")" $PY bench/serving/gpu_table2.py --tokenizer "$tok" "${spy[@]}" "$@"
echo "gpu_table2 exit $?"

stage "step profile"
# The executor alone on the same checkpoints: each batch's step time and its top kernels.
timeout "$(limit "${PROFILE_TIMEOUT:-150}")" $PY -m bench.serving.gpu_profile --tokenizer "$tok" --out "$OUT"

stage "multi-item scoring"
# /v1/score with 1-200 short items: one masked forward (flashinfer's custom mask) against a row
# per item, on the random-weight 0.6B; after the table, so its figures come back even if this fails.
timeout "$(limit "${MULTI_TIMEOUT:-90}")" $PY -m bench.kernels.multi_item --size 0.6B --repeats 2 \
  --json "$OUT/multi_item.json"

stage "server CPU per request"
# The null executor's server on this host's CPU (#14 item 5), to set beside the table's step times.
timeout "$(limit "${CPU_TIMEOUT:-60}")" $PY -m bench.serving.cpu_cost --num-requests 300 --no-progress \
  --log-dir /tmp/cpu-cost-logs --json "$OUT/cpu_cost.json"
stage "done"
