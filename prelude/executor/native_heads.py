"""The native kernels of the output heads (kernels/cpu/sample.hpp, logprobs.hpp), called on rows
of fp32 logits by address: executor.sampler calls them on a tensor's, executor.host_runner on
an array's, neither needing the other's library."""
from __future__ import annotations

from array import array
from typing import Callable, Sequence

from prelude.contract.batch import TokenLogprob
from prelude.contract.sampling import SamplingParams

sample_tokens: Callable[..., None] | None
greedy_tokens: Callable[..., None] | None
native_logprobs: Callable[..., None] | None
mask_logits: Callable[..., None] | None
try:
    from kernels.cpu._native import greedy_tokens, mask_logits, sample_tokens
    from kernels.cpu._native import token_logprobs as native_logprobs
except ImportError:  # the extension is not built (a source checkout before `pip install -e .`)
    sample_tokens = greedy_tokens = native_logprobs = mask_logits = None


def mask(logits: int, vocab: int, stride: int, bitmask: int, words: int, rows: Sequence[int], threads: int) -> None:
    """Sets to -inf, in place, the logits of `rows` whose bit in the matching row of the grammar
    bitmask (int32 words, structured.masks) is 0."""
    assert mask_logits is not None
    logits_rows = array("q", rows)
    mask_logits(logits, len(rows), vocab, stride, bitmask, words, logits_rows.buffer_info()[0], threads)


def greedy(logits: int, rows: int, vocab: int, stride: int, threads: int) -> array:
    """Each row's argmax (the first of equal values), int64."""
    assert greedy_tokens is not None
    tokens = array("q", bytes(8 * rows))
    greedy_tokens(logits, rows, vocab, stride, tokens.buffer_info()[0], threads)
    return tokens


def draw(logits: int, rows: int, vocab: int, stride: int, params: Sequence[SamplingParams], uniforms: int,
         threads: int) -> array:
    """Each row's token (int64) drawn from its tempered distribution, cut by its min-p, top-k and
    top-p, by inverse CDF at its uniform (`uniforms`: the address of one float64 per row)."""
    assert sample_tokens is not None
    inverse = array("f", [1.0 / p.temperature for p in params])
    drawn = array("q", bytes(8 * rows))
    cuts = (array("f", [p.min_p for p in params]) if any(p.min_p > 0.0 for p in params) else None,
            array("q", [p.top_k for p in params]) if any(p.top_k > 0 for p in params) else None,
            array("f", [p.top_p for p in params]) if any(p.top_p < 1.0 for p in params) else None)
    sample_tokens(logits, rows, vocab, stride, inverse.buffer_info()[0], uniforms, drawn.buffer_info()[0], threads,
                  *(0 if cut is None else cut.buffer_info()[0] for cut in cuts))
    return drawn


def logprobs(logits: int, rows: int, vocab: int, stride: int, targets: Sequence[int], top: int,
             threads: int) -> list[TokenLogprob]:
    """For each row its target token's logprob under the row's log-softmax, its rank (the tokens
    at least as likely, itself included) and the row's `top` most likely tokens."""
    assert native_logprobs is not None
    ids, ranks = array("q", targets), array("q", bytes(8 * rows))
    values, top_ids, top_values = array("f", bytes(4 * rows)), array("q", bytes(8 * rows * top)), \
        array("f", bytes(4 * rows * top))
    native_logprobs(logits, rows, vocab, stride, ids.buffer_info()[0], top, values.buffer_info()[0],
                    ranks.buffer_info()[0], top_ids.buffer_info()[0], top_values.buffer_info()[0], threads)
    return [TokenLogprob(t, lp, [(top_ids[k], top_values[k]) for k in range(r * top, r * top + top)
                                 if top_ids[k] >= 0], rank)
            for r, (t, lp, rank) in enumerate(zip(targets, values, ranks))]
