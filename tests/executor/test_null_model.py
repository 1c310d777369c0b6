"""The null model (benchmarks' `--executor null`) runs every way the runners drive a model: on the
torch runner (executor.null_model, a CUDA server's host side) and on the runner without torch
(executor.null_native, a CPU server's), each giving the same fixed token."""
import pytest
import torch

from kernels.cpu import ops as cpu_ops
from prelude.contract.batch import DecodeRow, OutputSpec, PrefillRow
from prelude.contract.sampling import GREEDY, SamplingParams
from prelude.contract.stop import StopFlag
from prelude.demo import MODEL_CONFIG
from prelude.executor.null_model import null_runner
from prelude.model.config import ModelConfig

CONFIG = ModelConfig.from_dict(MODEL_CONFIG)
AVOID = frozenset({0, 10, 11})  # the eos ids: the peak is the first token from 10 on that is not one
PEAK = 12


def _torch_runner():
    threads = torch.get_num_threads()
    try:  # null_runner sets torch to one thread, for the process it serves in
        return null_runner(CONFIG, block_size=16, avoid_tokens=AVOID)
    finally:
        torch.set_num_threads(threads)


def _host_runner():
    if not cpu_ops.built:
        pytest.skip("kernels.cpu is not built")
    from prelude.executor.null_native import null_host_runner

    return null_host_runner(CONFIG, 16, AVOID)


RUNNERS = [pytest.param(_torch_runner, id="torch"), pytest.param(_host_runner, id="native")]
ROWS = [PrefillRow(1, list(range(40)), 0, [0, 1, 2], OutputSpec(sample=GREEDY)),
        PrefillRow(2, list(range(20)), 0, [3, 4], OutputSpec(sample=GREEDY))]


@pytest.mark.parametrize("make", RUNNERS)
def test_a_resumable_step_gives_what_one_call_gives(make):
    """The resumable path is the one a long OneShot step takes to step aside for short ones."""
    runner = make()
    runner.warmup()
    whole = runner.run(ROWS, ())
    stop = StopFlag(check_every_macs=1)
    stop.set()
    progress = runner.start(ROWS, stop)
    layered = runner.advance(progress, stop)
    assert layered is not None
    assert [r.token.token_id for r in layered.rows] == [r.token.token_id for r in whole.rows] == [PEAK, PEAK]


@pytest.mark.parametrize("make", RUNNERS)
def test_every_head_answers(make):
    """Generation runs to max_tokens (the peak is no eos), and the heads a request may ask for
    answer: logprobs, a top-k draw (the torch heads on the native runner), pooling, label logprobs."""
    runner = make()
    decode = DecodeRow(3, PEAK, 40, [0, 1, 2], OutputSpec(sample=SamplingParams(temperature=0.0, logprobs=2)))
    cut = PrefillRow(4, list(range(8)), 0, [5], OutputSpec(sample=SamplingParams(temperature=1.0, top_k=1)))
    pooled = PrefillRow(5, list(range(8)), 0, [6], OutputSpec(pooling="last", normalize=True))
    labels = PrefillRow(6, list(range(8)), 0, [7], OutputSpec(label_token_ids=(PEAK, 3)))
    threads = torch.get_num_threads()
    try:  # the native runner sets torch's threads to its own as it first loads it
        result = runner.run([cut, pooled, labels], [decode])
    finally:
        torch.set_num_threads(threads)
    by_id = {r.seq_id: r for r in result.rows}
    assert by_id[3].token.token_id == PEAK and len(by_id[3].token.top) == 2
    assert by_id[4].token.token_id == PEAK
    assert by_id[5].pooled is not None and len(by_id[5].pooled) == 8  # both null models are 8 wide
    assert by_id[6].label_logprobs is not None and by_id[6].label_logprobs[0] > by_id[6].label_logprobs[1]
