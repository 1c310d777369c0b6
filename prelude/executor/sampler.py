"""Turns last-position logits into tokens: logit restrictions, greedy or seeded sampling,
and the logprobs a request asked for."""
from __future__ import annotations

from typing import NamedTuple, Sequence

import torch

from prelude.contract.batch import TokenLogprob
from prelude.contract.sampling import SamplingParams, seeded_uniform
from prelude.executor import native_heads
from prelude.executor.native_heads import greedy_tokens, mask_logits, native_logprobs, sample_tokens


class RowMasks(NamedTuple):
    """Grammar token masks of some rows: bitmask row i masks logits row rows[i]."""

    bitmask: torch.Tensor  # [len(rows), words] int32, on the host
    rows: list[int]


def apply_token_bitmask(logits: torch.Tensor, bitmask: torch.Tensor, rows: list[int]) -> None:
    """Sets to -inf, in place, the logits of `rows` whose bit in the matching bitmask row is 0."""
    if mask_logits is not None and _native_rows(logits):
        bitmask = bitmask.contiguous()
        native_heads.mask(logits.data_ptr(), logits.shape[-1], logits.stride(0), bitmask.data_ptr(), bitmask.shape[1],
                          rows, torch.get_num_threads())
        return
    forbidden = ~unpack_bitmask(bitmask.to(logits.device, non_blocking=True), logits.shape[-1])
    if rows == list(range(logits.shape[0])):
        logits.masked_fill_(forbidden, float("-inf"))
        return
    index = torch.tensor(rows, device=logits.device)
    logits[index] = logits[index].masked_fill(forbidden, float("-inf"))


def unpack_bitmask(bitmask: torch.Tensor, vocab: int) -> torch.Tensor:
    """[rows, words] int32 -> [rows, vocab] bool, with tensor ops on the bitmask's device (the
    CUDA path; the CPU's fp32 logits are masked by the native kernel, kernels/cpu/sample.hpp)."""
    shifts = torch.arange(32, dtype=torch.int32, device=bitmask.device)
    return ((bitmask.unsqueeze(-1) >> shifts) & 1).bool().flatten(1)[:, :vocab]


def restrict_logits(logits: torch.Tensor, params: Sequence[SamplingParams], steps: Sequence[int],
                    histories: Sequence[Sequence[int]]) -> None:
    """Applies allowed_token_ids, logit_bias, min_tokens and the penalties in place. A row's
    history is its prompt followed by its `step` generated tokens."""
    device = logits.device
    for row, (p, step, history) in enumerate(zip(params, steps, histories)):
        if p.allowed_token_ids is not None:
            keep = torch.tensor(p.allowed_token_ids, dtype=torch.long, device=device)
            kept = logits[row, keep]
            logits[row].fill_(float("-inf"))
            logits[row, keep] = kept
        if p.logit_bias:
            ids = torch.tensor([t for t, _ in p.logit_bias], dtype=torch.long, device=device)
            bias = torch.tensor([b for _, b in p.logit_bias], device=device, dtype=logits.dtype)
            logits[row, ids] += bias
        if step < p.min_tokens and p.min_tokens_blocked:
            logits[row, list(p.min_tokens_blocked)] = float("-inf")
        if p.penalizes and history:
            tokens = torch.tensor(list(history), dtype=torch.long, device=device)
            if p.repetition_penalty != 1.0:
                seen = tokens.unique()
                values = logits[row, seen]
                logits[row, seen] = torch.where(values > 0, values / p.repetition_penalty,
                                                values * p.repetition_penalty)
            generated = tokens[len(history) - step:]
            if len(generated):
                counts = torch.bincount(generated, minlength=logits.shape[-1]).to(logits.dtype)
                logits[row] -= p.frequency_penalty * counts + p.presence_penalty * (counts > 0).to(logits.dtype)


def _uniforms(params: Sequence[SamplingParams], steps: Sequence[int], device: torch.device) -> torch.Tensor:
    """One U[0, 1) draw per row, in float64. A seeded row's draw depends only on (seed, step), so
    the same request samples the same tokens whatever it is batched with."""
    u = torch.rand(len(params), dtype=torch.float64, device=device)
    for i, (p, step) in enumerate(zip(params, steps)):
        if p.seed is not None:
            u[i] = seeded_uniform(p.seed, step)
    return u


def sample(logits: torch.Tensor, params: Sequence[SamplingParams], steps: Sequence[int],
           histories: Sequence[Sequence[int]] | None = None, masks: RowMasks | None = None) -> list[TokenLogprob]:
    """logits: [N, vocab] float32, one row per sampled row; steps: the index of the token each
    row samples; histories: each row's prompt + generated tokens (needed for penalties);
    masks: the grammar masks of the rows that have one."""
    if masks is not None:
        apply_token_bitmask(logits, masks.bitmask, masks.rows)
    # Reported logprobs are the model's own distribution, before any restriction or temperature
    # (what vLLM reports by default), except a grammar's: as in vLLM, they are the distribution
    # over the tokens the grammar allows. The rows are kept as they are now (a copy, when
    # restrictions are about to change them in place).
    reported = [i for i, p in enumerate(params) if p.logprobs is not None]
    restricts = any(p.restricts_logits for p in params)
    raw = None
    if reported:
        raw = logits if len(reported) == len(params) and not restricts else logits[reported]
    if restricts:
        restrict_logits(logits, params, steps, histories or [()] * len(params))
    sampled = [i for i, p in enumerate(params) if not p.greedy]
    if len(sampled) == len(params):  # the usual batch: every row samples, none needs argmax
        token_list = _sample_rows(logits, params, steps).tolist()
    else:
        drawn = None
        if sampled:  # drawn first: on a GPU the argmax's read-back below then waits for both
            rows = torch.tensor(sampled, device=logits.device)
            drawn = _sample_rows(logits[rows], [params[i] for i in sampled], [steps[i] for i in sampled])
        token_list = _greedy_rows(logits)
        if drawn is not None:
            for i, token in zip(sampled, drawn.tolist()):
                token_list[i] = token
    results = [TokenLogprob(t, 0.0, []) for t in token_list]
    if raw is not None:
        for i, entry in zip(reported, _reported(raw, [params[i] for i in reported], [token_list[i] for i in reported])):
            results[i] = entry
    return results


def _reported(raw: torch.Tensor, params: Sequence[SamplingParams], tokens: Sequence[int]) -> list[TokenLogprob]:
    """The sampled tokens' logprobs, one row of `raw` logits each. A row restricted to
    allowed_token_ids lists the best of those as its alternatives."""
    out = [token_logprob(torch.log_softmax(raw[r], dim=-1), tokens[r], p.logprobs or 0, p.allowed_token_ids)
           if p.allowed_token_ids is not None else None for r, p in enumerate(params)]
    plain = [r for r, entry in enumerate(out) if entry is None]
    if plain:
        rows = raw if len(plain) == len(params) else raw[plain]
        for r, entry in zip(plain, token_logprobs(rows, [tokens[r] for r in plain],
                                                  max(params[r].logprobs or 0 for r in plain))):
            del entry.top[params[r].logprobs or 0:]  # the rows share one count, the most any of them asked for
            out[r] = entry
    return [entry for entry in out if entry is not None]


def _native_rows(logits: torch.Tensor) -> bool:
    """Whether the native kernels read these logits: fp32 rows of contiguous entries on the CPU."""
    return logits.is_cpu and logits.dtype == torch.float32 and logits.stride(-1) == 1


def _greedy_rows(logits: torch.Tensor) -> list[int]:
    """Each row's argmax (the first of equal values). On the CPU the native kernel's, which is
    about six times faster over a 152K vocabulary than torch's one-compare-at-a-time loop."""
    if greedy_tokens is None or not _native_rows(logits):
        return logits.argmax(dim=-1).tolist()
    rows, vocab = logits.shape
    return native_heads.greedy(logits.data_ptr(), rows, vocab, logits.stride(0), torch.get_num_threads()).tolist()


def _sample_rows(logits: torch.Tensor, params: Sequence[SamplingParams], steps: Sequence[int]) -> torch.Tensor:
    """Exact sampling from each row's tempered, min-p / top-k / top-p filtered distribution (in
    vLLM's order) by inverse CDF: one uniform per row and one cumulative sum, instead of one
    random draw per vocabulary entry. The sum runs in float64 so that tail tokens keep their
    exact share. fp32 rows on the CPU are drawn, cuts and all, by the native kernel
    (kernels/cpu/sample.hpp), which sorts no vocabulary."""
    if sample_tokens is not None and _native_rows(logits):
        uniforms = _uniforms(params, steps, logits.device)
        drawn = native_heads.draw(logits.data_ptr(), logits.shape[0], logits.shape[1], logits.stride(0), params,
                                  uniforms.data_ptr(), torch.get_num_threads())
        return torch.frombuffer(drawn, dtype=torch.long)
    top_ks = [p.top_k for p in params]
    if any(p.temperature != 1.0 for p in params):
        temps = torch.tensor([p.temperature for p in params], device=logits.device)
        logits = logits / temps[:, None]
    if any(p.min_p > 0.0 for p in params):
        # p >= min_p * p_max is logit >= max logit + log(min_p); log(0) = -inf keeps every token.
        floors = torch.tensor([p.min_p for p in params], device=logits.device, dtype=logits.dtype).log()
        logits = logits.masked_fill(logits < logits.amax(dim=-1, keepdim=True) + floors[:, None], float("-inf"))
    if any(k > 0 for k in top_ks):
        # k-th largest logit per row from one topk over the largest k asked (not a full sort);
        # rows without a cut keep everything.
        widest = max(top_ks)
        top = logits.topk(widest, dim=-1).values
        ks = torch.tensor([max(k, 1) for k in top_ks], device=logits.device)
        kth = top.gather(1, (ks - 1)[:, None])
        kth[torch.tensor([k <= 0 for k in top_ks], device=logits.device)] = float("-inf")
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if any(p.top_p < 1.0 for p in params):
        top_ps = torch.tensor([p.top_p for p in params], device=logits.device)
        sorted_logits, order = logits.sort(dim=-1, descending=True)
        sorted_probs = sorted_logits.softmax(dim=-1)
        # Drop a token when the tokens before it already reach top_p; the best one always stays.
        drop_sorted = (sorted_probs.cumsum(dim=-1) - sorted_probs) >= top_ps[:, None]
        drop = torch.zeros_like(drop_sorted).scatter(1, order, drop_sorted)
        logits = logits.masked_fill(drop, float("-inf"))
    cdf = logits.softmax(dim=-1).to(torch.float64).cumsum_(dim=-1)
    targets = _uniforms(params, steps, logits.device) * cdf[:, -1]
    # The first token whose cumulative mass exceeds the target: filtered tokens add no mass, so
    # they can never be it.
    chosen = torch.searchsorted(cdf, targets[:, None], right=True).squeeze(1)
    return chosen.clamp_(max=logits.shape[-1] - 1)


def token_logprobs(logits: torch.Tensor, targets: Sequence[int], top: int) -> list[TokenLogprob]:
    """For each row of logits its target token: the token's logprob under the row's
    log-softmax, its rank (the tokens at least as likely, itself included, as vLLM counts) and
    the row's `top` most likely tokens (none at -inf). fp32 rows on the CPU go to the native
    kernel (kernels/cpu/logprobs.hpp), which reads each row two or three times where torch's
    log_softmax, rank and topk make four passes and two tensors the size of the logits."""
    if native_logprobs is not None and _native_rows(logits):
        return native_heads.logprobs(logits.data_ptr(), len(targets), logits.shape[1], logits.stride(0), targets,
                                     top, torch.get_num_threads())
    all_logprobs = torch.log_softmax(logits, dim=-1)
    chosen = all_logprobs.gather(1, torch.tensor(targets, device=logits.device)[:, None])
    counted = (all_logprobs >= chosen).sum(dim=1).tolist()
    alternatives: list[list] = [[] for _ in targets]
    if top > 0:
        values, best = all_logprobs.topk(top, dim=-1)
        alternatives = [[(t, v) for t, v in zip(i, vs) if v != float("-inf")]
                        for i, vs in zip(best.tolist(), values.tolist())]
    return [TokenLogprob(t, lp, alt, rank)
            for t, lp, alt, rank in zip(targets, chosen.squeeze(1).tolist(), alternatives, counted)]


def token_logprob(logprobs: torch.Tensor, token_id: int, top: int,
                  allowed: Sequence[int] | None = None) -> TokenLogprob:
    """Logprob of `token_id` and the `top` best alternatives from one row of log-softmax. With
    `allowed` (allowed_token_ids, a structured choice) the alternatives are the best of the
    tokens the request could produce: a token it may not answer is no alternative."""
    alternatives = []
    if top > 0 and allowed is not None:
        candidates = torch.tensor(allowed, dtype=torch.long, device=logprobs.device)
        values, order = logprobs[candidates].topk(min(top, len(allowed)))
        alternatives = list(zip(candidates[order].tolist(), values.tolist()))
    elif top > 0:
        values, ids = logprobs.topk(top)
        # A token the grammar forbids (-inf) is no alternative either.
        alternatives = [(t, v) for t, v in zip(ids.tolist(), values.tolist()) if v != float("-inf")]
    chosen = logprobs[token_id]
    return TokenLogprob(token_id, float(chosen), alternatives, int((logprobs >= chosen).sum()))
