"""Output heads: turn a step's final hidden states into each row's results (sampled token,
label-token logprobs, prompt logprobs, pooled state, classifier scores), per its OutputSpec."""
from __future__ import annotations

from bisect import bisect_left
from concurrent.futures import Future
from typing import Callable, Sequence

import torch
import torch.nn.functional as F

from prelude.contract.batch import DecodeRow, OutputSpec, PrefillRow, RowResult, TokenLogprob
from prelude.executor.flat_step import item_ends
from prelude.executor.host_heads import PROMPT_LOGPROB_CHUNK
from prelude.executor.host_sampling import forced_tokens, narrow_ids
from prelude.executor.runnable import ModelHeads
from prelude.executor.sampler import RowMasks, sample, token_logprobs
from prelude.model.attention import StepLayout
from prelude.structured.masks import StepMasks

# (hidden, layout, step row indices, ascending) -> the final hidden state of each row's last position.
LastHidden = Callable[[torch.Tensor, StepLayout, list[int]], torch.Tensor]


class _States:
    """A step's final hidden states as the heads ask for them, by step position: `hidden` holds
    every position's (read None), or only those of the positions in `read` (ascending, from
    positions_read), in that order, where the model skipped the others. Asking for a skipped
    position fails rather than read a state nobody computed."""

    __slots__ = ("hidden", "layout", "last_hidden", "read")

    def __init__(self, hidden: torch.Tensor, layout: StepLayout, last_hidden: LastHidden, read: list[int] | None):
        self.hidden, self.layout, self.last_hidden, self.read = hidden, layout, last_hidden, read

    def last(self, rows: list[int]) -> torch.Tensor:
        """The state of each of `rows`' last position (step row indices, ascending)."""
        if self.read is None:
            return self.last_hidden(self.hidden, self.layout, rows)
        ends = self.layout.query_starts
        return self.at([ends[i + 1] - 1 for i in rows])

    def at(self, positions: list[int]) -> torch.Tensor:
        if self.read is None:
            return self.hidden[positions]
        if positions == self.read:  # a OneShot step's usual read: each row's last state, no copy
            return self.hidden
        index = [self._index(p) for p in positions]
        return self.hidden[index[0]:index[0] + 1] if len(index) == 1 else self.hidden[index]

    def span(self, start: int, end: int) -> torch.Tensor:
        """The states of positions start..end-1, which were all read."""
        if self.read is None:
            return self.hidden[start:end]
        first = self._index(start)
        assert self._index(end - 1) == first + end - 1 - start, f"positions {start}..{end - 1} were not all read"
        return self.hidden[first:first + end - start]

    def _index(self, position: int) -> int:
        assert self.read is not None
        i = bisect_left(self.read, position)
        assert i < len(self.read) and self.read[i] == position, f"position {position} was not read"
        return i


def row_results(model: ModelHeads, hidden: torch.Tensor, prefills: Sequence[PrefillRow],
                decodes: Sequence[DecodeRow], layout: StepLayout, last_hidden: LastHidden,
                masks: Future[StepMasks] | None = None, read: list[int] | None = None) -> list[RowResult]:
    """Results of every row that produces something: prefill rows first, then decode rows.
    `masks`: the token masks of the rows that sample under a grammar (being filled). `read`:
    the positions whose states `hidden` holds, in order, where the model skipped the others
    (positions_read); None: it holds every position's."""
    states = _States(hidden, layout, last_hidden, read)
    # (row index in the step, spec, row) for every row that produces something.
    wanted: list[tuple[int, OutputSpec, PrefillRow | DecodeRow]] = [
        (i, r.output, r) for i, r in enumerate(prefills) if r.output is not None]
    wanted += [(len(prefills) + i, r.output, r) for i, r in enumerate(decodes)]
    if wanted and masks is None and all(spec.only_samples for _, spec, _ in wanted):
        return _sampled_rows(model, states, wanted)
    results = [RowResult(seq_id=r.seq_id) for _, _, r in wanted]

    # Which heads each row needs, sorted in one pass (a step's rows usually only sample):
    full: list[int] = []  # rows needing the full logits of their last position
    # Label rows read at item ends, or through the compact head (just the labels' K rows), by
    # (label ids, normalization): one head call per group for all their positions in the step.
    groups: dict[tuple[tuple[int, ...], bool], list[tuple[int, list[int], bool]]] = {}
    classify: list[int] = []
    last_pooled: list[int] = []
    spanning: list[int] = []  # rows whose heads read every position (prompt logprobs, mean/cls pooling)
    for k, (i, spec, row) in enumerate(wanted):
        ids = spec.label_token_ids
        if ids is not None:
            shares_gemm = _reads_last_with_vocab(spec, row)
            if spec.sample is not None or shares_gemm:
                full.append(k)
            if spec.sample is not None or not shares_gemm:
                items = row.item_lengths if isinstance(row, PrefillRow) else ()
                groups.setdefault((tuple(ids), spec.label_vocab_normalized), []).append(
                    (k, item_ends(layout.query_starts[i + 1], items), bool(items)))
        elif spec.sample is not None:
            full.append(k)
        if spec.classify:
            classify.append(k)
        if spec.pooling == "last":
            last_pooled.append(k)
        if spec.pooling not in (None, "last") or (spec.prompt_logprobs is not None and isinstance(row, PrefillRow)):
            spanning.append(k)

    # One GEMM over the vocabulary for every last position that needs full logits.
    if full:
        last = states.last([wanted[k][0] for k in full])
        # On a GPU the head's launch goes first and the masks' filling ends beside it; there one
        # row of the head takes microseconds, so no row is narrowed.
        step_masks = masks.result() if masks is not None and last.is_cpu else None
        narrow = [narrow_ids(wanted[k][1], wanted[k][2].seq_id, step_masks) for k in full] if last.is_cpu else []
        logits = _vocab_logits(model, last, narrow)
        sample_at = [j for j, k in enumerate(full) if wanted[k][1].sample is not None]
        for j, k in enumerate(full):
            ids = wanted[k][1].label_token_ids
            if ids is not None:
                results[k].label_logprobs = torch.log_softmax(logits[j], dim=-1)[list(ids)].tolist()
        if sample_at:
            chosen = [wanted[full[j]] for j in sample_at]
            sampled = logits if len(sample_at) == len(full) else logits[sample_at]  # no copy when all sample
            tokens = sample(sampled, [spec.sample for _, spec, _ in chosen if spec.sample],
                            [row.sample_step for _, _, row in chosen], [row.history for _, _, row in chosen],
                            _row_masks(masks.result(), chosen) if masks is not None else None)
            for j, token in zip(sample_at, tokens):
                results[full[j]].token = token
                results[full[j]].forced = forced_tokens(*wanted[full[j]][1:], token.token_id)
    # The planner budgets the step's logits rows together, so each group's tensor is within it.
    for (ids, vocab_normalized), members in groups.items():
        at_ends = states.at([e for _, ends, _ in members for e in ends])
        if vocab_normalized:
            logprobs = torch.log_softmax(model.compute_logits(at_ends).float(), dim=-1)[:, list(ids)]
        else:
            logprobs = torch.log_softmax(model.compute_label_logits(at_ends, ids).float(), dim=-1)
        values, at = logprobs.tolist(), 0
        for k, ends, per_item in members:
            if per_item:
                results[k].item_label_logprobs = values[at:at + len(ends)]
            else:
                results[k].label_logprobs = values[at]
            at += len(ends)

    # Heads over the last position run once per step for all their rows (grouped by head).
    if classify:
        rows = [wanted[k][0] for k in classify]
        pooled = (states.last(rows) if model.classifier_pooling == "last"
                  else _pooled_rows(states, rows, model.classifier_pooling))
        scores = model.compute_scores(pooled).float()
        for k, row_scores in zip(classify, scores.tolist()):
            results[k].scores = row_scores
    if last_pooled:
        lasts = states.last([wanted[k][0] for k in last_pooled]).float()
        normalized = F.normalize(lasts, dim=-1)
        for j, k in enumerate(last_pooled):
            results[k].pooled = (normalized[j] if wanted[k][1].normalize else lasts[j]).tolist()
    for k in spanning:
        i, spec, row = wanted[k]
        start, end = layout.query_starts[i], layout.query_starts[i + 1]
        if spec.prompt_logprobs is not None and isinstance(row, PrefillRow):
            results[k].prompt_logprobs = _prompt_logprobs(model, states.span(start, end), row.token_ids,
                                                          spec.prompt_logprobs)
        if spec.pooling is not None and spec.pooling != "last":
            results[k].pooled = _pool(states.span(start, end), spec).tolist()
    return results


def _sampled_rows(model: ModelHeads, states: _States,
                  wanted: list[tuple[int, OutputSpec, PrefillRow | DecodeRow]]) -> list[RowResult]:
    """The results of rows that all just sample a token (OutputSpec.only_samples): one GEMM over
    the vocabulary and one draw, what row_results' general path does for them, without sorting
    each row by the heads it needs (a decode step of plain generation, every step)."""
    logits = model.compute_logits(states.last([i for i, _, _ in wanted])).float()
    tokens = sample(logits, [spec.sample for _, spec, _ in wanted if spec.sample],
                    [row.sample_step for _, _, row in wanted], [row.history for _, _, row in wanted])
    return [RowResult(row.seq_id, token) for (_, _, row), token in zip(wanted, tokens)]


def _vocab_logits(model: ModelHeads, states: torch.Tensor,
                  narrow: list[Sequence[int] | None]) -> torch.Tensor:
    """[rows, vocab] fp32 logits of `states`: a whole row of the LM head, or, for a row with
    allowed ids in `narrow`, their logits and -inf elsewhere (what its mask leaves of a row)."""
    if not any(ids is not None for ids in narrow):
        return model.compute_logits(states).float()
    vocab = model.config.vocab_size
    logits = torch.full((len(states), vocab), float("-inf"), device=states.device)
    wide = [j for j, ids in enumerate(narrow) if ids is None]
    if wide:
        logits[wide] = model.compute_logits(states[wide]).float()
    for j, ids in enumerate(narrow):
        kept = tuple(t for t in ids or () if t < vocab)  # a mask may be wider than the head (a larger tokenizer)
        if kept:
            logits[j, list(kept)] = model.compute_label_logits(states[j:j + 1], kept)[0].float()
    return logits


def _row_masks(masks: StepMasks, chosen: list[tuple[int, OutputSpec, PrefillRow | DecodeRow]]) -> RowMasks | None:
    """The step's masks lined up with the sampled rows: (bitmask rows, sampled row indices)."""
    lined = masks.lined_up([row.seq_id for _, _, row in chosen])
    return None if lined is None else RowMasks(torch.from_numpy(lined[0]), lined[1])


def _reads_last_with_vocab(spec: OutputSpec, row: PrefillRow | DecodeRow) -> bool:
    """A label row read at its last position over the whole vocabulary: it shares the step's
    full-logits GEMM with the sampled rows."""
    return spec.label_vocab_normalized and not (isinstance(row, PrefillRow) and row.item_lengths)


def _prompt_logprobs(model: ModelHeads, hidden: torch.Tensor, token_ids: Sequence[int],
                     top: int) -> list[TokenLogprob]:
    """Logprob (and rank) of prompt token j+1 given tokens 0..j, for every j, with `top`
    alternatives; computed PROMPT_LOGPROB_CHUNK positions at a time."""
    out: list[TokenLogprob] = []
    targets = list(token_ids[1:])
    for lo in range(0, len(targets), PROMPT_LOGPROB_CHUNK):
        chunk = targets[lo:lo + PROMPT_LOGPROB_CHUNK]
        out.extend(token_logprobs(model.compute_logits(hidden[lo:lo + len(chunk)]).float(), chunk, top))
    return out


def _pooled_rows(states: _States, rows: list[int], pooling: str) -> torch.Tensor:
    """Each row's first state (cls) or the mean of its states, in the hidden states' dtype."""
    starts = states.layout.query_starts
    spans = [(starts[i], starts[i + 1]) for i in rows]
    if pooling == "cls":
        return states.at([start for start, _ in spans])
    return torch.stack([states.span(start, end).mean(dim=0) for start, end in spans])


def _pool(hidden: torch.Tensor, spec: OutputSpec) -> torch.Tensor:
    """Mean or CLS pooling of one row (last-token pooling is grouped across rows above)."""
    pooled = hidden.float().mean(dim=0) if spec.pooling == "mean" else hidden[0].float()
    return F.normalize(pooled, dim=-1) if spec.normalize else pooled
