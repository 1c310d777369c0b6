"""Token masks of a step's constrained rows: filled in one batched llguidance call, in a thread
of their own while the step's forward runs, and applied to the logits as a bitmask (one bit per
vocabulary entry, 32 to an int32 word), with no per-row Python loop over the vocabulary.

A few rows' masks are filled in the step's own thread instead: a hop to the mask thread costs
more than they do (`python -m bench.serving.grammar_libs` times one row's mask). So are every
step's where torch's threads already take every core: the mask thread would take its core from
the forward, not overlap it (`python -m bench.serving.structured_judge`)."""
from __future__ import annotations

import os
from array import array
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TYPE_CHECKING, Callable, Sequence, cast

import torch

from prelude.contract.constraint import TokenConstraint
from prelude.contract.record import record
from prelude.structured.state import GrammarState

if TYPE_CHECKING:
    import llguidance  # imported where a grammar is first compiled (structured.compiler)

mask_logits: Callable[..., None] | None
try:
    from kernels.cpu._native import mask_logits
except ImportError:  # the extension is not built (a source checkout before `pip install -e .`)
    mask_logits = None

# Steps with fewer constrained rows fill their masks inline (see above).
THREADED_ROWS = 4
_filler: ThreadPoolExecutor | None = None
_executor: llguidance.LLExecutor | None = None


@record
class MaskRequest:
    """A row that samples under a grammar: its state, the index of the token it samples, and
    its last input token (the one before it)."""

    seq_id: int
    grammar: TokenConstraint
    step: int
    last_token: int


@record
class StepMasks:
    """The masks of a step's rows that sample under their grammar now (not those still in a
    reasoning block): `bitmask` row i is the mask of the row whose seq_id maps to i."""

    bitmask: torch.Tensor  # [rows, words] int32
    rows: dict[int, int]  # seq_id -> bitmask row


def start_filling(requests: Sequence[MaskRequest], device: torch.device) -> Future[StepMasks]:
    """Catches each row's state up and fills its mask, for a forward on `device`; the future's
    result is ready once every mask is."""
    global _filler, _executor
    if len(requests) < THREADED_ROWS or not _core_beside_forward(device):
        done: Future[StepMasks] = Future()
        done.set_result(_fill(list(requests), None))
        return done
    if _filler is None:
        import llguidance

        _filler = ThreadPoolExecutor(max_workers=1, thread_name_prefix="prelude-masks")
        _executor = llguidance.LLExecutor()
    return _filler.submit(_fill, list(requests), _executor)


def _core_beside_forward(device: torch.device) -> bool:
    """Whether a core is free while the forward runs: always beside a GPU's, on the CPU only
    when torch's threads leave one."""
    return device.type != "cpu" or (os.cpu_count() or 1) > torch.get_num_threads()


def _fill(requests: list[MaskRequest], executor: llguidance.LLExecutor | None) -> StepMasks:
    """The rows' masks: in one batched call of `executor` (the mask thread's) when enough rows
    sample under their grammar, else one row at a time."""
    matchers: list[tuple[llguidance.LLMatcher, int]] = []
    rows: dict[int, int] = {}
    words = 0
    for request in requests:
        state = cast(GrammarState, request.grammar)
        words = state.mask_words  # every state of a server comes from its one compiler
        state.catch_up(request.step, request.last_token)
        if not state.reasoning:
            rows[request.seq_id] = len(matchers)
            matchers.append((state.matcher, len(matchers)))
    bitmask = torch.empty(len(matchers), words, dtype=torch.int32)
    if executor is not None and len(matchers) >= THREADED_ROWS:
        executor.unsafe_compute_mask_ptr(matchers, bitmask.data_ptr(), words * 4, len(matchers))
    else:
        for matcher, row in matchers:
            matcher.unsafe_compute_mask_ptr(bitmask[row].data_ptr(), words * 4)
    return StepMasks(bitmask, rows)


def apply_token_bitmask(logits: torch.Tensor, bitmask: torch.Tensor, rows: list[int]) -> None:
    """Sets to -inf, in place, the logits of `rows` whose bit in the matching bitmask row is 0."""
    vocab = logits.shape[-1]
    if (mask_logits is not None and logits.device.type == "cpu" and logits.dtype == torch.float32
            and logits.stride(-1) == 1):
        logits_rows = array("q", rows)  # a plain buffer for the kernel: no tensor built from a list
        bitmask = bitmask.contiguous()
        mask_logits(logits.data_ptr(), len(rows), vocab, logits.stride(0), bitmask.data_ptr(), bitmask.shape[1],
                    logits_rows.buffer_info()[0], torch.get_num_threads())
        return
    forbidden = ~unpack_bitmask(bitmask.to(logits.device, non_blocking=True), vocab)
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
