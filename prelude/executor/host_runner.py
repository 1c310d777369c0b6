"""The model runner of a decoder on the CPU's native kernels, without torch (model.native_decoder):
a step's rows flattened (flat_step), its layers in one native call (the kernel
executor.fused_step calls), then the heads, without torch too: a token drawn greedily or at a
temperature, with min-p, top-k and top-p cuts, a seed, allowed ids, a logit bias, min_tokens,
penalties and a grammar, its logprobs and alternatives (executor.host_sampling); label and prompt
logprobs (executor.host_heads); a pooled state. A server on this runner never loads torch."""
from __future__ import annotations

import bisect
import contextlib
import math
from array import array
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, ContextManager, Sequence

import numpy as np

from kernels.cpu.addresses import address_of
from prelude.contract.batch import BatchResult, DecodeRow, OutputSpec, PrefillRow, RowResult
from prelude.contract.stop import StopFlag
from prelude.executor import host_heads, host_sampling
from prelude.executor.flat_step import FlatStep, flat_step, paged_rows
from prelude.host_tuning import zeroed_pages
from prelude.model.native_decoder import NativeDecoder, ResumableForward
from prelude.structured.masks import start_step_masks

if TYPE_CHECKING:
    from prelude.model.attention import GraphKind

Wanted = tuple[int, OutputSpec, "PrefillRow | DecodeRow"]


class HostKVCache:
    """The paged KV pool, per layer K and V as [blocks, block_size, kv_heads, head_dim] fp32
    (executor.kv_cache's layout, in host_tuning.zeroed_pages)."""

    def __init__(self, layers: int, blocks: int, block_size: int, kv_heads: int, head_dim: int):
        dims = (layers, blocks, block_size, kv_heads, head_dim)
        self.block_size = block_size
        self.k, self.v = (np.frombuffer(zeroed_pages(math.prod(dims) * 4), np.float32).reshape(dims)
                          for _ in range(2))


@dataclass(slots=True)
class HostProgress:
    """A prefill step that may be parked (ModelRunner's Progress, natively)."""

    prefills: Sequence[PrefillRow]
    flat: FlatStep
    steps: ResumableForward
    x: np.ndarray
    outputs: int
    held: tuple
    parks: int = 0


class HostRunner:
    """executor.executors' Runner for a NativeDecoder."""

    supports_items = True  # multi-item rows: the kernel masks each item from the others

    def __init__(self, model: NativeDecoder, kv: HostKVCache, threads: int, seed: int = 0):
        self.model = model
        self.kv = kv
        self.block_size = kv.block_size
        self.threads = threads
        self._rng = np.random.default_rng(seed)  # unseeded draws: the server's --seed makes a run repeat
        self._table = model.layer_table(kv.k, kv.v)
        c = model.config
        self._model_arguments = (address_of(self._table), c.num_layers, model.final_norm_address, c.hidden_size,
                                 c.num_heads, c.num_kv_heads, c.head_dim, c.intermediate_size, self.block_size,
                                 c.rms_norm_eps)  # forward_step's first ten: the same every step

    @staticmethod
    def thread_context() -> ContextManager[Any]:
        return contextlib.nullcontext()

    def has_graph(self, kind: GraphKind, tokens: int, rows: int) -> bool:
        return False

    def warmup(self) -> None:
        """Nothing to warm: the weights were stored for the kernels as they loaded."""

    def run(self, prefills: Sequence[PrefillRow], decodes: Sequence[DecodeRow], graph: GraphKind | None = None,
            on_launch: Callable[[], None] | None = None) -> BatchResult:
        flat = flat_step(prefills, decodes, self.block_size)
        arguments, x, outputs, _ = self._arguments(flat)
        if on_launch is not None:
            on_launch()
        self.model.forward(arguments)
        return BatchResult(self._heads(x[:outputs], prefills, decodes, flat))

    def start(self, prefills: Sequence[PrefillRow], stop: StopFlag) -> HostProgress:
        flat = flat_step(prefills, (), self.block_size)
        arguments, x, outputs, held = self._arguments(flat)
        return HostProgress(prefills, flat, self.model.begin(arguments, stop.check_every_macs), x, outputs, held)

    def advance(self, progress: HostProgress, stop: StopFlag) -> BatchResult | None:
        if not progress.steps.advance(stop.address):
            progress.parks += 1
            return None
        return BatchResult(self._heads(progress.x[:progress.outputs], progress.prefills, (), progress.flat))

    def _arguments(self, flat: FlatStep) -> tuple[tuple, np.ndarray, int, tuple]:
        """forward_step's arguments (kernels/cpu/_native.pyi), the embeddings it computes over in
        place, how many of its rows hold the read states, and the buffers the pointers name."""
        m = self.model
        n = flat.tokens.shape[1]
        x = m.embedding.rows(flat.tokens[0])
        keep = None if flat.read is None else array("q", flat.read)
        paged = paged_rows(flat.starts, flat.context_lens, flat.block_tables, flat.stored, flat.item_lengths,
                           self.block_size)
        tables, starts, lens = paged.tables, array("q", flat.starts), array("q", flat.context_lens)
        item_starts = None if paged.item_starts is None else array("q", paged.item_starts)
        item_lengths = None if paged.item_lengths is None else array("q", paged.item_lengths)
        threads = 1 if paged.decode_from == 0 and m.single_threaded_decode else self.threads
        arguments = (*self._model_arguments, len(flat.context_lens), n, paged.decode_from, address_of(starts),
                     address_of(lens), address_of(tables), paged.width, m.rotary_address, flat.address + 8 * n,
                     flat.address + 16 * n, address_of(keep), 0 if keep is None else len(keep),
                     address_of(item_starts), address_of(item_lengths), address_of(x), threads)
        held = (flat, x, keep, tables, starts, lens, item_starts, item_lengths)
        return arguments, x, n if keep is None else len(keep), held

    def _heads(self, hidden: np.ndarray, prefills: Sequence[PrefillRow], decodes: Sequence[DecodeRow],
               flat: FlatStep) -> list[RowResult]:
        wanted: list[Wanted] = [(i, r.output, r) for i, r in enumerate(prefills) if r.output is not None]
        wanted += [(len(prefills) + i, r.output, r) for i, r in enumerate(decodes)]
        params = [spec.sample for _, spec, _ in wanted if spec.sample is not None]  # the sampled rows', in order
        # The usual step: every row just draws a token (only_samples: no allowed ids, no grammar).
        if wanted and all(spec.only_samples for _, spec, _ in wanted):
            tokens = host_sampling.sample(self._logits(hidden, flat, [i for i, _, _ in wanted]), params,
                                          lambda k: wanted[k][2], self._rng, self.threads)
            return [RowResult(row.seq_id, token) for (_, _, row), token in zip(wanted, tokens)]
        results = [RowResult(seq_id=row.seq_id) for _, _, row in wanted]
        sampled = [k for k, (_, spec, _) in enumerate(wanted) if spec.sample is not None]
        if sampled:
            # Grammar masks are filled here, after the forward, inline: its threads usually take
            # every core, so a mask thread would not overlap it, and a step whose rows only draw
            # (never here) does not even look for grammars.
            masks = start_step_masks(prefills, decodes, beside_forward=False)
            step_masks = None if masks is None else masks.result()
            narrow = [host_sampling.narrow_ids(wanted[k][1], wanted[k][2].seq_id, step_masks) for k in sampled]
            logits = self._logits(hidden, flat, [wanted[k][0] for k in sampled], narrow)
            row_of = lambda j: wanted[sampled[j]][2]  # noqa: E731
            tokens = host_sampling.sample(logits, params, row_of, self._rng, self.threads, step_masks)
            for k, token in zip(sampled, tokens):
                results[k].token = token
                results[k].forced = host_sampling.forced_tokens(wanted[k][1], wanted[k][2], token.token_id)
        for k, (i, spec, _) in enumerate(wanted):
            if spec.pooling is not None:
                results[k].pooled = self._pooled(hidden, flat, i, spec).tolist()
        host_heads.decision_heads(results, wanted, self.model.lm_head, lambda at: _states_at(hidden, flat, at),
                                  flat.starts, self.threads)
        return results

    def _pooled(self, hidden: np.ndarray, flat: FlatStep, i: int, spec: OutputSpec) -> np.ndarray:
        """Step row i's state pooled as `spec` asks: its last, its first (cls) or their mean."""
        start, end = flat.starts[i], flat.starts[i + 1]
        if spec.pooling == "mean":
            # Summed in float64: numpy adds float32 rows one after another, which drifts over a
            # long input where torch's mean sums in blocks.
            state = _states_at(hidden, flat, list(range(start, end))).mean(axis=0, dtype=np.float64).astype(np.float32)
        else:
            state = hidden[_index(flat, start if spec.pooling == "cls" else end - 1)].astype(np.float32)
        return state / max(float(np.linalg.norm(state)), 1e-12) if spec.normalize else state

    def _logits(self, hidden: np.ndarray, flat: FlatStep, rows: list[int],
                narrow: Sequence[Sequence[int] | None] = ()) -> np.ndarray:
        """The LM head's logits at these step rows' last positions; a row with ids in `narrow`
        gets their logits alone and -inf elsewhere (host_sampling.narrow_ids)."""
        states = _states_at(hidden, flat, [flat.starts[i + 1] - 1 for i in rows])  # the rows' last positions
        head = self.model.lm_head
        if not any(ids is not None for ids in narrow):
            return head.matmul(states, self.threads)
        logits = np.full((len(states), head.outputs), -np.inf, np.float32)
        wide = [j for j, ids in enumerate(narrow) if ids is None]
        if wide:
            logits[wide] = head.matmul(np.ascontiguousarray(states[wide]), self.threads)
        for j, ids in enumerate(narrow):
            kept = np.asarray([t for t in ids or () if t < head.outputs], np.int64)  # a tokenizer may be wider
            if len(kept):
                logits[j, kept] = head.rows(kept) @ states[j]
        return logits


def _index(flat: FlatStep, position: int) -> int:
    """Where the state of step position `position` lies in the forward's output."""
    if flat.read is None:
        return position
    return bisect.bisect_left(flat.read, position)


def _states_at(hidden: np.ndarray, flat: FlatStep, positions: list[int]) -> np.ndarray:
    """The states of these step positions (all read), contiguous: a slice where they lie in a run
    (a OneShot step's last positions are the forward's read states themselves), else a copy."""
    if flat.read is not None and flat.read == positions:  # the forward kept just these, in order
        return hidden[:len(positions)]
    at = positions if flat.read is None else [_index(flat, p) for p in positions]
    if at and at == list(range(at[0], at[0] + len(at))):
        return hidden[at[0]:at[0] + len(at)]
    return np.ascontiguousarray(hidden[at])

