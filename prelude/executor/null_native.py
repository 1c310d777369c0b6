"""The benchmarks' null model on the runner without torch (executor.host_runner): what
`--executor null` runs where a CPU server would serve its model on that runner, so the CPU it
measures around the model is what a served model's requests cost around the model there
(executor.null_model is the torch runner's, for a CUDA server's host side).

It runs no layers: each token's hidden state is its embedding, the same unit vector for every
token, and the LM head maps that state to fixed logits peaking on one ordinary (non-eos) token, so
greedy generation runs to max_tokens, as on executor.null_model. The step's flattening, arguments,
embedding lookup, heads and sampling are the real runner's."""
from __future__ import annotations

import dataclasses

import numpy as np

from prelude.executor.host_runner import HostKVCache, HostRunner
from prelude.model.checkpoint_arrays import SOURCES, Source
from prelude.model.config import ModelConfig
from prelude.model.native_decoder import FLOAT32, NativeDecoder, NativeWeight, store
from prelude.model.rotary import rotary_table
from prelude.model.weight_formats import BY_ROWS

_WIDTH = 8


class _Finished:
    """A resumable forward with nothing to run."""

    @staticmethod
    def advance(stop_ptr: int) -> bool:
        return True


@dataclasses.dataclass(frozen=True, slots=True)
class _FixedHead(NativeWeight):
    """The head's logits for the null model's one state: `logits`, copied per row (the product
    the stored weight gives for that state, without computing it)."""

    logits: np.ndarray

    def matmul(self, x: np.ndarray, threads: int) -> np.ndarray:
        out = np.empty((x.shape[0], self.outputs), np.float32)
        out[:] = self.logits
        return out


class NullDecoder(NativeDecoder):
    """A NativeDecoder whose step runs nothing: the states stay the embeddings."""

    def forward(self, arguments: tuple) -> None:
        pass

    def begin(self, arguments: tuple, check_every_macs: int) -> _Finished:
        return _Finished()


def null_host_runner(config: ModelConfig, block_size: int, avoid_tokens: frozenset[int]) -> HostRunner:
    vocab = config.vocab_size
    embedding = np.zeros((vocab, _WIDTH), np.float32)
    embedding[:, 0] = 1.0
    logits = np.random.default_rng(0).standard_normal(vocab).astype(np.float32)
    logits[next(t for t in range(10, vocab) if t not in avoid_tokens)] = 20.0
    head = np.zeros((vocab, _WIDTH), np.float32)
    head[:, 0] = logits
    stored = store(Source(head, SOURCES["F32"]), FLOAT32, BY_ROWS, 1)
    shape = dataclasses.replace(config, num_layers=0, hidden_size=_WIDTH)
    model = NullDecoder(shape, [], store(Source(embedding, SOURCES["F32"]), FLOAT32, BY_ROWS, 1),
                        _FixedHead(stored.data, None, FLOAT32, BY_ROWS, vocab, _WIDTH, logits),
                        np.ones(_WIDTH, np.float32), rotary_table(config.rope, config.head_dim, 1))
    # One thread: its steps are tiny, and a second one only fights the event loop for a core.
    return HostRunner(model, HostKVCache(1, 1, block_size, 1, 1), 1)  # a cache no layer reads
