"""The decision heads of the CPU runner without torch (executor.host_runner): label logprobs, at a
row's last position or at each of its items' ends (over the whole vocabulary, or over the labels
alone from just their rows of the LM head), and prompt logprobs, from numpy states and the LM
head's native product, as executor.heads gives them."""
from __future__ import annotations

from typing import Callable, Sequence

import numpy as np

from kernels.cpu.addresses import address_of
from prelude.contract.batch import DecodeRow, OutputSpec, PrefillRow, RowResult, TokenLogprob
from prelude.executor import native_heads
from prelude.executor.flat_step import item_ends
from prelude.model.native_decoder import NativeWeight

# Prompt-logprob rows compute logits over the vocabulary this many positions at a time, so a
# long prompt never materializes a [prompt_len, vocab] array (executor.heads reads it too).
PROMPT_LOGPROB_CHUNK = 256

# (step positions) -> their final hidden states, fp32 [positions, hidden].
StatesAt = Callable[[list[int]], np.ndarray]


def decision_heads(results: list[RowResult], wanted: Sequence[tuple[int, OutputSpec, PrefillRow | DecodeRow]],
                   head: NativeWeight, states_at: StatesAt, starts: Sequence[int], threads: int) -> None:
    """Sets the label and prompt logprobs of the rows in `wanted` (step row index, spec, row) that
    ask for them; `starts`: the step rows' query starts."""
    normalized: list[tuple[int, list[int]]] = []  # label rows over the vocabulary: one product for all
    for k, (i, spec, row) in enumerate(wanted):
        if spec.prompt_logprobs is not None and isinstance(row, PrefillRow):
            states = states_at(list(range(starts[i], starts[i + 1])))
            results[k].prompt_logprobs = prompt_logprobs(head, states, row.token_ids, spec.prompt_logprobs, threads)
        if spec.label_token_ids is None:
            continue
        ends = item_ends(starts[i + 1], _items(row))
        if spec.label_vocab_normalized:
            normalized.append((k, ends))
        else:
            labels = head.rows(np.asarray(spec.label_token_ids, np.int64))
            _set_labels(results[k], row, _log_softmax(np.ascontiguousarray(states_at(ends)) @ labels.T))
    if normalized:
        states = np.ascontiguousarray(states_at([e for _, ends in normalized for e in ends]))
        logprobs = _log_softmax(head.matmul(states, threads))
        at = 0
        for k, ends in normalized:
            _, spec, row = wanted[k]
            _set_labels(results[k], row, logprobs[at:at + len(ends), list(spec.label_token_ids or ())])
            at += len(ends)


def prompt_logprobs(head: NativeWeight, states: np.ndarray, token_ids: Sequence[int], top: int,
                    threads: int) -> list[TokenLogprob]:
    """Logprob (and rank) of prompt token j+1 given tokens 0..j, for every j, with `top`
    alternatives; PROMPT_LOGPROB_CHUNK positions at a time."""
    out: list[TokenLogprob] = []
    targets = list(token_ids[1:])
    for lo in range(0, len(targets), PROMPT_LOGPROB_CHUNK):
        chunk = targets[lo:lo + PROMPT_LOGPROB_CHUNK]
        logits = head.matmul(np.ascontiguousarray(states[lo:lo + len(chunk)]), threads)
        out.extend(native_heads.logprobs(address_of(logits), len(chunk), head.outputs, head.outputs, chunk, top,
                                         threads))
    return out


def _items(row: PrefillRow | DecodeRow) -> tuple[int, ...]:
    return row.item_lengths if isinstance(row, PrefillRow) else ()


def _set_labels(result: RowResult, row: PrefillRow | DecodeRow, values: np.ndarray) -> None:
    """A row's label logprobs: per item where it has items, else at its last position."""
    if _items(row):
        result.item_label_logprobs = values.tolist()
    else:
        result.label_logprobs = values[0].tolist()


def _log_softmax(logits: np.ndarray) -> np.ndarray:
    """Each row's log-softmax, in float32."""
    shifted = logits - logits.max(axis=-1, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))
