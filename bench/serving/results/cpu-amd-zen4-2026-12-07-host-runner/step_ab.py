"""A 512-token one-token OneShot step (and 128) on the demo model: the torch runner against the one
without torch, in process, alternating. Run with PYTHONPATH=<the after tree>."""
import os
import random
import statistics
import time
from pathlib import Path

import torch

from prelude.app.runner_setup import host_runner_setup, model_runner_setup
from prelude.contract.batch import OutputSpec, PrefillRow
from prelude.contract.config import Config
from prelude.contract.sampling import GREEDY
from prelude.model.config import ModelConfig

model_dir = Path(os.path.expanduser("~/.cache/prelude/demo-v2"))
model_config = ModelConfig.from_dir(model_dir)
config = Config(model=str(model_dir))
host = host_runner_setup(config, model_dir, model_config, 4096)
assert host is not None
runners = {"torch": model_runner_setup(config, model_dir, model_config, 4096).runner, "host": host.runner}
for n in (512, 128):
    times: dict[str, list[float]] = {name: [] for name in runners}
    with torch.inference_mode():
        for i in range(40):
            rows = [PrefillRow(i, [random.randrange(1000, 2000) for _ in range(n)], 0, [], OutputSpec(sample=GREEDY))]
            for name in (list(runners) if i % 2 else list(runners)[::-1]):
                start = time.perf_counter()
                runners[name].run(rows, ())
                times[name].append(time.perf_counter() - start)
    print(n, {name: round(statistics.median(v[5:]) * 1e3, 2) for name, v in times.items()})
