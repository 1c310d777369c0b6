"""The demo model's steps on the runner without torch, in process: a 2,048-token prompt, a
512-token prompt with prompt logprobs (the torch heads), 16 prompts of 128 tokens, 64 decode rows.
Medians in ms. Run once per tree, alternating: PYTHONPATH=<tree> python step_times.py."""
import os
import random
import statistics
import time
from pathlib import Path

from prelude.app.runner_setup import host_runner_setup
from prelude.contract.batch import DecodeRow, OutputSpec, PrefillRow
from prelude.contract.config import Config
from prelude.contract.sampling import GREEDY
from prelude.model.config import ModelConfig

model_dir = Path(os.path.expanduser("~/.cache/prelude/demo-v2"))
setup = host_runner_setup(Config(model=str(model_dir)), model_dir, ModelConfig.from_dir(model_dir), 4096)
assert setup is not None
runner, rng = setup.runner, random.Random(0)


def prompt(i: int, n: int, spec: OutputSpec) -> PrefillRow:
    return PrefillRow(i, [rng.randrange(100, 2000) for _ in range(n)], 0, list(range(i * 128, i * 128 + -(-n // 16))),
                      spec)


steps = {
    "2048 prompt": lambda: ([prompt(0, 2048, OutputSpec(sample=GREEDY))], ()),
    "512 prompt_logprobs": lambda: ([prompt(0, 512, OutputSpec(sample=GREEDY, prompt_logprobs=1))], ()),
    "16 x 128 prompts": lambda: ([prompt(i, 128, OutputSpec(sample=GREEDY)) for i in range(16)], ()),
    "64 decode rows": lambda: ((), [DecodeRow(i, 7, 150, list(range(10 * i, 10 * i + 10)), OutputSpec(sample=GREEDY))
                                    for i in range(64)]),
}
for name, make in steps.items():
    times = []
    for _ in range(25):
        prefills, decodes = make()
        start = time.perf_counter()
        runner.run(prefills, decodes)
        times.append(time.perf_counter() - start)
    print(f"{name}: median {statistics.median(times[5:]) * 1e3:.2f} ms, best {min(times[5:]) * 1e3:.2f}")
