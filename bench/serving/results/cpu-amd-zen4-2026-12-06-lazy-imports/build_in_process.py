"""TREE=<checkout> PYTHONPATH=<checkout> python build_in_process.py: seconds to import torch,
then the server's modules, then to build the demo model's server (no HTTP), as `python -m
prelude` does it (the collector paused, torch's environment as that checkout's __main__ sets
it). Prints the three, space-separated."""
import gc
import os
import time

gc.disable()
started = time.perf_counter()
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
if "TORCH_DEVICE_BACKEND_AUTOLOAD" in open(os.path.join(os.environ["TREE"], "prelude/__main__.py")).read():
    os.environ.setdefault("TORCH_DEVICE_BACKEND_AUTOLOAD", "0")
import torch  # noqa: E402,F401

torch_done = time.perf_counter()
import uvloop  # noqa: E402,F401

from prelude.app.assembly import build  # noqa: E402
from prelude.contract.config import Config  # noqa: E402

imports_done = time.perf_counter()
build(Config(model=os.path.expanduser("~/.cache/prelude/demo-v2")))
built = time.perf_counter()
print(f"{torch_done - started:.4f} {imports_done - torch_done:.4f} {built - imports_done:.4f}")
