"""The CPU runner's draws without torch (executor.host_runner): fp32 logits rows as numpy arrays
in, tokens and their logprobs out, as executor.sampler.sample gives them. The restrictions
(allowed ids, logit bias, min_tokens, penalties) change a copy of the rows in numpy, in float32 as
torch does; argmax, the draw with its cuts and seed, and the logprobs run on the native kernels.
Reported logprobs are the model's own distribution, before any restriction (vLLM's default)."""
from __future__ import annotations

from array import array
from typing import Callable, Sequence

import numpy as np

from prelude.contract.batch import DecodeRow, PrefillRow, TokenLogprob
from prelude.contract.sampling import SamplingParams, seeded_uniform
from prelude.executor import native_heads


# A sampled row that can only take a few tokens gets the logits of just those: their rows of the
# LM head, as label rows do, and -inf elsewhere, as its restriction would leave them. A grammar
# allowing at most this many tokens now (a choice's or an enum's first tokens: its distribution,
# sampled or reported, is over those; executor.heads), or as many allowed_token_ids (a choice of
# single tokens) on a row that reports no logprobs (those are over the whole vocabulary). On the
# CPU one row of the head reads all of its weight (Qwen3's: 5 ms in bf16, 11 ms in fp32 on the
# dev machine).
NARROW_HEAD_TOKENS = 1024


def narrow_ids(params: SamplingParams) -> tuple[int, ...] | None:
    """The allowed ids whose logits alone a row needs (NARROW_HEAD_TOKENS); None: the whole
    vocabulary's."""
    ids = params.allowed_token_ids
    return ids if ids is not None and params.logprobs is None and len(ids) <= NARROW_HEAD_TOKENS else None


def takes(params: SamplingParams) -> bool:
    """Whether these draws take the row: all but allowed ids with reported logprobs, whose
    alternatives are the best allowed tokens (executor.sampler.token_logprob's)."""
    return params.allowed_token_ids is None or params.logprobs is None


def sample(logits: np.ndarray, params: Sequence[SamplingParams], row_of: Callable[[int], PrefillRow | DecodeRow],
           rng: np.random.Generator, threads: int) -> list[TokenLogprob]:
    """Each row's token and, where asked, its logprobs; `row_of(k)`: the step's row that logits
    row k is (its sample step for a seed, its history for penalties). Restricted rows are
    restricted in place; the reported rows are copied first, when any row is restricted."""
    rows, vocab = logits.shape
    restricted = [k for k, p in enumerate(params) if p.restricts_logits]
    reported = [k for k, p in enumerate(params) if p.logprobs is not None]
    raw = None
    if reported:
        raw = logits if len(reported) == rows and not restricted else logits[reported]  # a copy, if indexed
    for k in restricted:
        row = row_of(k)
        restrict(logits[k], params[k], row.sample_step, row.history)
    drawn = [k for k, p in enumerate(params) if not p.greedy]
    tokens = native_heads.greedy(logits.ctypes.data, rows, vocab, vocab, threads) if len(drawn) < rows else \
        array("q", bytes(8 * rows))
    if drawn:
        subset = logits if len(drawn) == rows else np.ascontiguousarray(logits[drawn])
        uniforms = rng.random(len(drawn))
        for i, k in enumerate(drawn):
            if (seed := params[k].seed) is not None:
                uniforms[i] = seeded_uniform(seed, row_of(k).sample_step)
        for k, token in zip(drawn, native_heads.draw(subset.ctypes.data, len(drawn), vocab, vocab,
                                                     [params[k] for k in drawn], uniforms.ctypes.data, threads)):
            tokens[k] = token
    results = [TokenLogprob(t, 0.0, []) for t in tokens]
    if raw is not None:
        asked = [params[k].logprobs or 0 for k in reported]
        entries = native_heads.logprobs(raw.ctypes.data, len(reported), vocab, vocab,
                                        [tokens[k] for k in reported], max(asked), threads)
        for k, entry, wanted in zip(reported, entries, asked):
            del entry.top[wanted:]  # the rows share one count, the most any of them asked for
            results[k] = entry
    return results


def restrict(logits: np.ndarray, p: SamplingParams, step: int, history: Sequence[int]) -> None:
    """allowed_token_ids, logit_bias, min_tokens and the penalties on one row, in place
    (executor.sampler.restrict_logits' order and float32 arithmetic). `history`: the prompt and
    the `step` tokens generated so far."""
    if p.allowed_token_ids is not None:
        keep = np.asarray(p.allowed_token_ids, np.int64)
        kept = logits[keep]
        logits.fill(-np.inf)
        logits[keep] = kept
    if p.logit_bias:
        logits[np.asarray([t for t, _ in p.logit_bias], np.int64)] += np.asarray([b for _, b in p.logit_bias],
                                                                                 np.float32)
    if step < p.min_tokens and p.min_tokens_blocked:
        logits[np.asarray(p.min_tokens_blocked, np.int64)] = -np.inf
    if p.penalizes and len(history):
        tokens = np.asarray(history, np.int64)
        if p.repetition_penalty != 1.0:
            seen = np.unique(tokens)
            values = logits[seen]
            penalty = np.float32(p.repetition_penalty)
            logits[seen] = np.where(values > 0, values / penalty, values * penalty)
        generated = tokens[len(tokens) - step:] if step else tokens[:0]
        if len(generated):
            ids, counts = np.unique(generated, return_counts=True)
            logits[ids] -= (np.float32(p.frequency_penalty) * counts.astype(np.float32)
                            + np.float32(p.presence_penalty))
