"""The null model (benchmarks' `--executor null`) runs every way the runner drives a model."""
import torch

from prelude.contract.batch import OutputSpec, PrefillRow
from prelude.contract.sampling import GREEDY
from prelude.contract.stop import StopFlag
from prelude.demo import MODEL_CONFIG
from prelude.executor.null_model import null_runner
from prelude.model.config import ModelConfig


def test_a_resumable_step_gives_what_one_call_gives():
    """The resumable path is the one a long OneShot step takes to step aside for short ones."""
    threads = torch.get_num_threads()
    try:  # null_runner sets torch to one thread, for the process it serves in
        runner = null_runner(ModelConfig.from_dict(MODEL_CONFIG), block_size=16, avoid_tokens=frozenset({0}))
    finally:
        torch.set_num_threads(threads)
    runner.warmup()
    rows = [PrefillRow(1, list(range(40)), 0, [0, 1, 2], OutputSpec(sample=GREEDY)),
            PrefillRow(2, list(range(20)), 0, [3, 4], OutputSpec(sample=GREEDY))]
    whole = runner.run(rows, ())
    stop = StopFlag(check_every_macs=1)
    stop.set()
    progress = runner.start(rows, stop)
    layered = runner.advance(progress, stop)
    assert layered is not None
    assert [r.token.token_id for r in layered.rows] == [r.token.token_id for r in whole.rows]
