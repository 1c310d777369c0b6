"""Output heads: turn a step's final hidden states into each row's results (sampled token,
label-token logprobs, prompt logprobs, pooled state, classifier scores), per its OutputSpec."""
from __future__ import annotations

from typing import Callable, Sequence

import torch
import torch.nn.functional as F

from prelude.contract.batch import DecodeRow, OutputSpec, PrefillRow, RowResult, TokenLogprob
from prelude.executor.sampler import sample
from prelude.model.attention import StepLayout
from prelude.model.decoder import DecoderLM

# Prompt-logprob rows compute logits over the vocabulary this many positions at a time, so a
# long prompt never materializes a [prompt_len, vocab] tensor.
PROMPT_LOGPROB_CHUNK = 256

# (hidden, layout, step row indices) -> the final hidden state of each row's last position.
LastHidden = Callable[[torch.Tensor, StepLayout, list[int]], torch.Tensor]


def row_results(model: DecoderLM, hidden: torch.Tensor, prefills: Sequence[PrefillRow],
                decodes: Sequence[DecodeRow], layout: StepLayout, last_hidden: LastHidden) -> list[RowResult]:
    """Results of every row that produces something: prefill rows first, then decode rows."""
    # (row index in the step, spec, row) for every row that produces something.
    wanted: list[tuple[int, OutputSpec, PrefillRow | DecodeRow]] = [
        (i, r.output, r) for i, r in enumerate(prefills) if r.output is not None]
    wanted += [(len(prefills) + i, r.output, r) for i, r in enumerate(decodes)]
    results = [RowResult(seq_id=r.seq_id) for _, _, r in wanted]

    logit_rows = [k for k, (_, spec, _) in enumerate(wanted) if spec.needs_last_logits]
    if logit_rows:
        last = last_hidden(hidden, layout, [wanted[k][0] for k in logit_rows])
        logits = model.compute_logits(last).float()
        sample_rows = [j for j, k in enumerate(logit_rows) if wanted[k][1].sample is not None]
        label_rows = [j for j, k in enumerate(logit_rows) if wanted[k][1].label_token_ids is not None]
        if label_rows:
            logprobs = torch.log_softmax(logits[label_rows], dim=-1)
            for j, lp in zip(label_rows, logprobs):
                k = logit_rows[j]
                ids = torch.tensor(wanted[k][1].label_token_ids, device=lp.device)
                results[k].label_logprobs = lp[ids].tolist()
        if sample_rows:
            chosen = [wanted[logit_rows[j]] for j in sample_rows]
            tokens = sample(logits[sample_rows], [spec.sample for _, spec, _ in chosen if spec.sample],
                            [row.sample_step for _, _, row in chosen])
            for j, token in zip(sample_rows, tokens):
                results[logit_rows[j]].token = token

    for k, (i, spec, row) in enumerate(wanted):
        start, end = layout.query_starts[i], layout.query_starts[i + 1]
        if spec.prompt_logprobs is not None and isinstance(row, PrefillRow):
            results[k].prompt_logprobs = _prompt_logprobs(model, hidden[start:end], row.token_ids,
                                                          spec.prompt_logprobs)
        if spec.pooling is not None:
            results[k].pooled = _pool(hidden[start:end], spec).tolist()
        if spec.classify:
            results[k].scores = model.compute_scores(hidden[end - 1]).float().tolist()
    return results


def _prompt_logprobs(model: DecoderLM, hidden: torch.Tensor, token_ids: Sequence[int], top: int) -> list[TokenLogprob]:
    """Logprob (and rank) of prompt token j+1 given tokens 0..j, for every j, with `top`
    alternatives; computed PROMPT_LOGPROB_CHUNK positions at a time, one host copy each."""
    out: list[TokenLogprob] = []
    targets_all = torch.tensor(list(token_ids[1:]), device=hidden.device)
    for lo in range(0, len(targets_all), PROMPT_LOGPROB_CHUNK):
        targets = targets_all[lo:lo + PROMPT_LOGPROB_CHUNK]
        logprobs = torch.log_softmax(model.compute_logits(hidden[lo:lo + len(targets)]).float(), dim=-1)
        chosen = logprobs.gather(1, targets[:, None])
        ranks = ((logprobs > chosen).sum(dim=1) + 1).tolist()
        alternatives: list[list] = [[] for _ in ranks]
        if top > 0:
            values, ids = logprobs.topk(top, dim=-1)
            alternatives = [list(zip(i, v)) for i, v in zip(ids.tolist(), values.tolist())]
        out.extend(TokenLogprob(t, lp, alt, r) for t, lp, alt, r in
                   zip(targets.tolist(), chosen.squeeze(1).tolist(), alternatives, ranks))
    return out


def _pool(hidden: torch.Tensor, spec: OutputSpec) -> torch.Tensor:
    if spec.pooling == "mean":
        pooled = hidden.float().mean(dim=0)
    elif spec.pooling == "cls":
        pooled = hidden[0].float()
    else:
        pooled = hidden[-1].float()
    return F.normalize(pooled, dim=-1) if spec.normalize else pooled
