"""What a CPU server process without torch would cost to start and hold: the prelude modules that
import no torch (listed by `--discover`), uvicorn and numpy imported; a checkpoint's weights read
from its memory map and stored by the native kernels (packed panels, the embedding by rows) with
no torch; the tokenizer loaded. Prints one JSON line: seconds per phase, RSS after the map is
closed, bytes stored.

    python probe.py --discover > torch_free_modules.txt   # once, from the repository root's env
    python probe.py <model dir> fp32|bf16|int8
"""
import time

START = time.perf_counter()
import importlib  # noqa: E402
import json  # noqa: E402
import mmap  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
from pathlib import Path  # noqa: E402

HERE = Path(__file__).parent
FORMATS = {"fp32": 0, "bf16": 1, "int8": 2}
BYTES = {0: 4, 1: 2, 2: 1}


def discover() -> None:
    import pkgutil

    import prelude
    for info in pkgutil.walk_packages(prelude.__path__, "prelude."):
        if info.name in ("prelude.__main__", "prelude.demo") or info.name.startswith("prelude._fasttoken."):
            continue
        run = subprocess.run([sys.executable, "-c", f"import sys, {info.name}; print('torch' in sys.modules)"],
                             capture_output=True, text=True)
        if run.returncode == 0 and run.stdout.strip() == "False":
            print(info.name)


def main(model: Path, fmt: int) -> None:
    import numpy as np
    import uvicorn.protocols.http.httptools_impl  # noqa: F401
    import uvloop  # noqa: F401

    for name in (HERE / "torch_free_modules.txt").read_text().split():
        importlib.import_module(name)
    from kernels.cpu import _native
    from prelude import tokenizer as tokenizers
    imported = time.perf_counter()
    assert "torch" not in sys.modules
    tokenizers.load(model)
    tokenized = time.perf_counter()
    stored = []
    with open(model / "model.safetensors", "rb") as f:
        n = int.from_bytes(f.read(8), "little")
        header, base = json.loads(f.read(n)), 8 + n
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
            raw = np.frombuffer(mm, dtype=np.uint8)
            for name, meta in header.items():
                if name == "__metadata__":
                    continue
                lo, hi = meta["data_offsets"]
                source = {"F32": 0, "BF16": 1}[meta["dtype"]]
                view = raw[base + lo:base + hi]
                if len(meta["shape"]) != 2:  # norms: widened to fp32
                    bits = view.view(np.uint16).astype(np.uint32) << 16 if source else view.view(np.uint32).copy()
                    stored.append(bits.view(np.float32))
                    continue
                outputs, inputs = meta["shape"]
                if "embed" in name:  # by rows, as the embedding (and a tied head) are kept
                    data = np.empty(outputs * inputs * BYTES[fmt], np.uint8)
                    scales = np.empty(outputs, np.float32)
                    _native.convert_weight(view.ctypes.data, outputs, inputs, fmt, data.ctypes.data,
                                           scales.ctypes.data, 2, source)
                else:
                    data = np.empty(_native.packed_size(outputs, inputs) * BYTES[fmt], np.uint8)
                    scales = np.empty(_native.scales_size(outputs), np.float32)
                    _native.pack_linear(view.ctypes.data, outputs, inputs, fmt, data.ctypes.data,
                                        scales.ctypes.data, 2, source)
                stored += [data, scales]
            del raw, view
    loaded = time.perf_counter()
    rss = {line.split(":")[0]: int(line.split()[1]) // 1024 for line in open("/proc/self/smaps_rollup")
           if line.startswith(("Rss", "Anonymous"))}
    print(json.dumps({"model": str(model), "format": fmt, "imports_s": round(imported - START, 3),
                      "tokenizer_s": round(tokenized - imported, 3), "weights_s": round(loaded - tokenized, 3),
                      "total_s": round(loaded - START, 3), "rss_mib": rss["Rss"], "anonymous_mib": rss["Anonymous"],
                      "stored_mib": round(sum(a.nbytes for a in stored) / 2**20, 1)}))


if __name__ == "__main__":
    if sys.argv[1:] == ["--discover"]:
        discover()
    else:
        main(Path(sys.argv[1]), FORMATS[sys.argv[2]])
