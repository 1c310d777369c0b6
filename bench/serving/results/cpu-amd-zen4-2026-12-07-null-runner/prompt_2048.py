"""The demo model's 2,048-token prompt step on the runner without torch: the median of 25 steps, in ms.
Run once per tree, alternating: PYTHONPATH=<tree> python prompt_2048.py."""
import os
import random
import statistics
import time
from pathlib import Path

from prelude.app.runner_setup import host_runner_setup
from prelude.contract.batch import OutputSpec, PrefillRow
from prelude.contract.config import Config
from prelude.contract.sampling import GREEDY
from prelude.model.config import ModelConfig

model_dir = Path(os.path.expanduser("~/.cache/prelude/demo-v2"))
setup = host_runner_setup(Config(model=str(model_dir)), model_dir, ModelConfig.from_dir(model_dir), 4096)
assert setup is not None
runner = setup.runner
rng = random.Random(0)
times = []
for _ in range(30):
    rows = [PrefillRow(0, [rng.randrange(100, 2000) for _ in range(2048)], 0, list(range(128)),
                       OutputSpec(sample=GREEDY))]
    start = time.perf_counter()
    runner.run(rows, ())
    times.append(time.perf_counter() - start)
print(f"{statistics.median(times[5:]) * 1e3:.1f}")
