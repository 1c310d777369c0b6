"""Runs ForwardBatches through a DecoderLM: flattens rows into the varlen layout, plans attention
once per step, runs the model, and applies each row's output head."""
from __future__ import annotations

from array import array
from dataclasses import dataclass
from typing import Sequence

import torch
import torch.nn.functional as F

from prelude.engine.batch import (
    BatchResult,
    DecodeRow,
    ForwardBatch,
    OutputSpec,
    PrefillRow,
    RowResult,
    TokenLogprob,
    decode_rows,
    prefill_rows,
)
from prelude.executor.attention.base import AttentionBackend, StepLayout
from prelude.executor.base import Executor
from prelude.executor.sampler import sample
from prelude.model.decoder import DecoderLM

# Prompt-logprob rows compute logits over the vocabulary this many positions at a time, so a
# long prompt never materializes a [prompt_len, vocab] tensor.
PROMPT_LOGPROB_CHUNK = 256


class ModelExecutor(Executor):
    def __init__(self, model: DecoderLM, attention: AttentionBackend, device: torch.device):
        self.model = model
        self.attention = attention
        self.device = device
        self.block_size = attention.kv_cache.block_size

    @torch.inference_mode()
    def execute(self, batch: ForwardBatch) -> BatchResult:
        prefills, decodes = prefill_rows(batch), decode_rows(batch)
        hidden, layout = self._forward(batch, host_step(prefills, decodes, self.block_size))
        return BatchResult(self._outputs(hidden, prefills, decodes, layout))

    def _forward(self, batch: ForwardBatch, step: HostStep) -> tuple[torch.Tensor, StepLayout]:
        """Final hidden states of every token of the step, and the layout they were computed in."""
        input_ids, positions, layout = self._upload(step)
        self.attention.plan(layout)
        return self.model(input_ids, positions, self.attention), layout

    def _upload(self, step: HostStep) -> tuple[torch.Tensor, torch.Tensor, StepLayout]:
        return self._to_device(step.ids), self._to_device(step.positions), step.layout(self._to_device(step.slots))

    def _to_device(self, values: list[int]) -> torch.Tensor:
        # array('q') + frombuffer converts a long list several times faster than torch.tensor.
        host = torch.frombuffer(array("q", values), dtype=torch.long) if values else torch.empty(0, dtype=torch.long)
        return host.to(self.device, non_blocking=True)

    def _last_hidden(self, hidden: torch.Tensor, layout: StepLayout, rows: list[int]) -> torch.Tensor:
        """Final hidden state of the last position of each of `rows` (step row indices)."""
        index = torch.tensor([layout.query_starts[i + 1] - 1 for i in rows], device=hidden.device)
        return hidden[index]

    def _outputs(self, hidden: torch.Tensor, prefills, decodes, layout: StepLayout) -> list[RowResult]:
        # (row index in the step, spec, row) for every row that produces something.
        wanted = [(i, r.output, r) for i, r in enumerate(prefills) if r.output is not None]
        wanted += [(len(prefills) + i, r.output, r) for i, r in enumerate(decodes)]
        results = [RowResult(seq_id=r.seq_id) for _, _, r in wanted]

        logit_rows = [k for k, (_, spec, _) in enumerate(wanted) if spec.needs_last_logits]
        if logit_rows:
            last = self._last_hidden(hidden, layout, [wanted[k][0] for k in logit_rows])
            logits = self.model.compute_logits(last).float()
            sample_rows = [j for j, k in enumerate(logit_rows) if wanted[k][1].sample is not None]
            label_rows = [j for j, k in enumerate(logit_rows) if wanted[k][1].label_token_ids is not None]
            if label_rows:
                logprobs = torch.log_softmax(logits[label_rows], dim=-1)
                for j, lp in zip(label_rows, logprobs):
                    k = logit_rows[j]
                    ids = torch.tensor(wanted[k][1].label_token_ids, device=lp.device)
                    results[k].label_logprobs = lp[ids].tolist()
            if sample_rows:
                specs = [wanted[logit_rows[j]][1] for j in sample_rows]
                tokens = sample(logits[sample_rows], specs)
                for j, token in zip(sample_rows, tokens):
                    results[logit_rows[j]].token = token

        for k, (i, spec, row) in enumerate(wanted):
            start, end = layout.query_starts[i], layout.query_starts[i + 1]
            if spec.prompt_logprobs is not None:
                results[k].prompt_logprobs = self._prompt_logprobs(hidden[start:end], row.token_ids, spec.prompt_logprobs)
            if spec.pooling is not None:
                results[k].pooled = _pool(hidden[start:end], spec).tolist()
            if spec.classify:
                results[k].scores = self.model.compute_scores(hidden[end - 1]).float().tolist()
        return results

    def _prompt_logprobs(self, hidden: torch.Tensor, token_ids: Sequence[int], top: int):
        """Logprob (and rank) of prompt token j+1 given tokens 0..j, for every j, with `top`
        alternatives; computed PROMPT_LOGPROB_CHUNK positions at a time, one host copy each."""
        out: list[TokenLogprob] = []
        targets_all = torch.tensor(list(token_ids[1:]), device=hidden.device)
        for lo in range(0, len(targets_all), PROMPT_LOGPROB_CHUNK):
            targets = targets_all[lo:lo + PROMPT_LOGPROB_CHUNK]
            logprobs = torch.log_softmax(self.model.compute_logits(hidden[lo:lo + len(targets)]).float(), dim=-1)
            chosen = logprobs.gather(1, targets[:, None])
            ranks = ((logprobs > chosen).sum(dim=1) + 1).tolist()
            alternatives: list[list] = [[] for _ in ranks]
            if top > 0:
                values, ids = logprobs.topk(top, dim=-1)
                alternatives = [list(zip(i, v)) for i, v in zip(ids.tolist(), values.tolist())]
            out.extend(TokenLogprob(t, lp, alt, r) for t, lp, alt, r in
                       zip(targets.tolist(), chosen.squeeze(1).tolist(), alternatives, ranks))
        return out


@dataclass(frozen=True, slots=True)
class HostStep:
    """A step flattened on the host: what goes to the device, and the layout around it."""

    ids: list[int]
    positions: list[int]
    slots: list[int]
    starts: list[int]
    context_lens: list[int]
    block_tables: list[Sequence[int]]
    stored: list[bool]
    num_prefill_rows: int

    def layout(self, slot_mapping: torch.Tensor) -> StepLayout:
        return StepLayout(
            query_starts=self.starts,
            context_lens=self.context_lens,
            block_tables=self.block_tables,
            store_kv=self.stored,
            num_prefill_rows=self.num_prefill_rows,
            slot_mapping=slot_mapping,
            host_slots=self.slots,
        )


def host_step(prefills: Sequence[PrefillRow], decodes: Sequence[DecodeRow], bs: int) -> HostStep:
    """Rows flattened into the varlen layout: prefill rows first, then decode rows. A prefill
    token's slot is -1 where the row's block table does not cover its position."""
    ids: list[int] = []
    positions: list[int] = []
    slots: list[int] = []
    starts = [0]
    stored: list[bool] = []
    for row in prefills:
        start, end, table = row.start, row.start + len(row.token_ids), row.block_table
        ids.extend(row.token_ids)
        positions.extend(range(start, end))
        covered = min(end, len(table) * bs)
        # Slots of the stored tokens, one contiguous range per block.
        for block in range(start // bs, -(-covered // bs)):
            lo, hi = max(start, block * bs), min(covered, (block + 1) * bs)
            base = table[block] * bs - block * bs
            slots.extend(range(base + lo, base + hi))
        slots.extend([-1] * (end - max(covered, start)))
        stored.append(covered == end)
        starts.append(starts[-1] + end - start)
    for row in decodes:
        ids.append(row.token_id)
        positions.append(row.position)
        slots.append(row.block_table[row.position // bs] * bs + row.position % bs)
        starts.append(starts[-1] + 1)
    return HostStep(
        ids, positions, slots, starts,
        context_lens=[r.start for r in prefills] + [r.position for r in decodes],
        block_tables=[r.block_table for r in prefills] + [r.block_table for r in decodes],
        stored=stored + [True] * len(decodes),
        num_prefill_rows=len(prefills),
    )


def _pool(hidden: torch.Tensor, spec: OutputSpec) -> torch.Tensor:
    if spec.pooling == "mean":
        pooled = hidden.float().mean(dim=0)
    elif spec.pooling == "cls":
        pooled = hidden[0].float()
    else:
        pooled = hidden[-1].float()
    return F.normalize(pooled, dim=-1) if spec.normalize else pooled
