"""The CPU runner's draws without torch (executor.host_runner): fp32 logits rows as numpy arrays
in, tokens and their logprobs out, as executor.sampler.sample gives them. A grammar's mask, argmax,
the draw with its cuts and seed, and the logprobs run on the native kernels; the restrictions
(allowed ids, logit bias, min_tokens, penalties) change the rows in numpy, in float32 as torch
does. Reported logprobs are the model's own distribution, before any restriction (vLLM's default),
except a grammar's: the distribution over the tokens it allows, as in vLLM."""
from __future__ import annotations

import math
from array import array
from typing import Callable, Sequence

import numpy as np

from kernels.cpu.addresses import address_of
from prelude.contract.batch import DecodeRow, OutputSpec, PrefillRow, TokenLogprob
from prelude.contract.sampling import SamplingParams, seeded_uniform
from prelude.executor import native_heads
from prelude.structured.masks import StepMasks, few_allowed


# A sampled row that can only take a few tokens gets the logits of just those: their rows of the
# LM head, as label rows do, and -inf elsewhere, as its restriction would leave them. A grammar
# allowing at most this many tokens now (a choice's or an enum's first tokens: its distribution,
# sampled or reported, is over those; executor.heads), or as many allowed_token_ids (a choice of
# single tokens) on a row that reports no logprobs (those are over the whole vocabulary). On the
# CPU one row of the head reads all of its weight (Qwen3's: 5 ms in bf16, 11 ms in fp32 on the
# dev machine).
NARROW_HEAD_TOKENS = 1024


def narrow_ids(spec: OutputSpec, seq_id: int, masks: StepMasks | None) -> Sequence[int] | None:
    """The few token ids a sampled row can take (NARROW_HEAD_TOKENS): its allowed ids on a row that
    reports no logprobs, or what its grammar allows now (`masks`: the step's); None when it needs
    the whole vocabulary's logits."""
    params = spec.sample
    if params is None or spec.label_token_ids is not None:
        return None
    if params.allowed_token_ids is not None:
        ids = params.allowed_token_ids
        return ids if params.logprobs is None and len(ids) <= NARROW_HEAD_TOKENS else None
    at = None if masks is None else masks.rows.get(seq_id)
    return None if masks is None or at is None else few_allowed(masks.bitmask[at], NARROW_HEAD_TOKENS)


def forced_tokens(spec: OutputSpec, row: PrefillRow | DecodeRow, token: int) -> tuple[int, ...]:
    """The tokens a row's grammar forces after its drawn `token` (consumed by its state; the
    answer takes them unsampled); none on a row without a grammar, nor on one that reports
    logprobs: forced tokens have no sampled distribution to report, so it samples every token."""
    params = spec.sample
    if spec.grammar is None or params is None or params.logprobs is not None:
        return ()
    return spec.grammar.forced_after(row.sample_step, token, params.max_tokens - row.sample_step - 1)


def sample(logits: np.ndarray, params: Sequence[SamplingParams], row_of: Callable[[int], PrefillRow | DecodeRow],
           rng: np.random.Generator, threads: int, masks: StepMasks | None = None) -> list[TokenLogprob]:
    """Each row's token and, where asked, its logprobs; `row_of(k)`: the step's row that logits
    row k is (its seq_id for its grammar's mask in `masks`, its sample step for a seed, its
    history for penalties). Masked and restricted rows change in place; the reported rows are
    copied first, when any row is restricted."""
    rows, vocab = logits.shape
    if masks is not None:
        _mask(logits, masks, row_of, threads)
    restricted = [k for k, p in enumerate(params) if p.restricts_logits]
    reported = [k for k, p in enumerate(params) if p.logprobs is not None]
    raw = None
    if reported:
        raw = logits if len(reported) == rows and not restricted else logits[reported]  # a copy, if indexed
    for k in restricted:
        row = row_of(k)
        restrict(logits[k], params[k], row.sample_step, row.history)
    drawn = [k for k, p in enumerate(params) if not p.greedy]
    tokens = native_heads.greedy(address_of(logits), rows, vocab, vocab, threads) if len(drawn) < rows else \
        array("q", bytes(8 * rows))
    if drawn:
        subset = logits if len(drawn) == rows else np.ascontiguousarray(logits[drawn])
        uniforms = rng.random(len(drawn))
        for i, k in enumerate(drawn):
            if (seed := params[k].seed) is not None:
                uniforms[i] = seeded_uniform(seed, row_of(k).sample_step)
        for k, token in zip(drawn, native_heads.draw(address_of(subset), len(drawn), vocab, vocab,
                                                     [params[k] for k in drawn], address_of(uniforms), threads)):
            tokens[k] = token
    results = [TokenLogprob(t, 0.0, []) for t in tokens]
    if raw is not None:
        asked = [params[k].logprobs or 0 for k in reported]
        entries = native_heads.logprobs(address_of(raw), len(reported), vocab, vocab,
                                        [tokens[k] for k in reported], max(asked), threads)
        for r, (k, entry, wanted) in enumerate(zip(reported, entries, asked)):
            if (allowed := params[k].allowed_token_ids) is not None:
                _allowed_alternatives(entry, raw[r], allowed, wanted)
            del entry.top[wanted:]  # the rows share one count, the most any of them asked for
            results[k] = entry
    return results


def _mask(logits: np.ndarray, masks: StepMasks, row_of: Callable[[int], PrefillRow | DecodeRow],
          threads: int) -> None:
    """Applies each row's grammar mask (the rows under a grammar now), in place."""
    lined = masks.lined_up([row_of(k).seq_id for k in range(len(logits))])
    if lined is not None:
        bitmask, logits_rows = lined
        vocab = logits.shape[1]
        native_heads.mask(address_of(logits), vocab, vocab, address_of(bitmask), bitmask.shape[1], logits_rows,
                          threads)


def _allowed_alternatives(entry: TokenLogprob, raw: np.ndarray, allowed: Sequence[int], top: int) -> None:
    """A row restricted to allowed_token_ids lists the best of those as its alternatives (a token
    it may not answer is no alternative), with their logprobs under the whole row's log-softmax:
    its normalizer is the chosen token's logit less its logprob (in float64, so the chosen token
    lists its own logprob exactly), or, where a grammar forbade that token, the row's logsumexp."""
    ids = np.asarray(allowed, np.int64)
    chosen = float(raw[entry.token_id])
    with np.errstate(invalid="ignore"):  # a row with no token left: NaN, as torch's log_softmax gives
        if math.isfinite(chosen):
            normalizer = chosen - entry.logprob
        else:
            top_logit = float(raw.max())
            normalizer = top_logit + math.log(float(np.exp(raw.astype(np.float64) - top_logit).sum()))
        values = raw[ids].astype(np.float64) - normalizer
    best = np.argsort(-values, kind="stable")[:top]
    entry.top[:] = list(zip(ids[best].tolist(), values[best].tolist()))


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
