"""Token masks of a step's constrained rows: filled in one batched llguidance call, in a thread
of their own while the step's forward runs, as a bitmask (one bit per vocabulary entry, 32 to an
int32 word) that the runner's sampler applies to the logits with no per-row Python loop over the
vocabulary (executor.sampler on a tensor, executor.host_sampling on an array). No torch here: the
CPU runner without torch fills them too.

A few rows' masks are filled in the step's own thread instead: a hop to the mask thread costs
more than they do (`python -m bench.serving.grammar_libs` times one row's mask). So are every
step's where the forward's threads already take every core: the mask thread would take its core
from the forward, not overlap it (`python -m bench.serving.structured_judge`)."""
from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor
from typing import TYPE_CHECKING, Sequence, cast

import numpy as np

from kernels.cpu.addresses import address_of
from prelude.contract.batch import DecodeRow, PrefillRow
from prelude.contract.constraint import TokenConstraint
from prelude.contract.record import record
from prelude.structured.state import GrammarState

if TYPE_CHECKING:
    import llguidance  # imported where a grammar is first compiled (structured.compiler)

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

    bitmask: np.ndarray  # [rows, words] int32
    rows: dict[int, int]  # seq_id -> bitmask row

    def lined_up(self, seq_ids: Sequence[int]) -> tuple[np.ndarray, list[int]] | None:
        """The masks of the rows `seq_ids` names that sample under their grammar now, lined up
        with them: (their bitmask rows, contiguous and in order; their indices in `seq_ids`), for
        a sampler's logits rows; None when none does."""
        at = [(self.rows[seq], k) for k, seq in enumerate(seq_ids) if seq in self.rows]
        if not at:
            return None
        bitmask_rows, indices = (list(side) for side in zip(*at))
        if bitmask_rows == list(range(len(self.bitmask))):
            return self.bitmask, indices
        return np.ascontiguousarray(self.bitmask[bitmask_rows]), indices


def start_step_masks(prefills: Sequence[PrefillRow], decodes: Sequence[DecodeRow],
                     beside_forward: bool) -> Future[StepMasks] | None:
    """Starts filling the token masks of a step's rows that sample under a grammar (None when no
    row does); in the mask thread when `beside_forward`: a core is free while the forward runs."""
    requests = [MaskRequest(r.seq_id, r.output.grammar, r.sample_step, r.token_ids[-1])
                for r in prefills if r.output is not None and r.output.grammar is not None]
    requests += [MaskRequest(r.seq_id, r.output.grammar, r.sample_step, r.token_id)
                 for r in decodes if r.output.grammar is not None]
    return start_filling(requests, beside_forward) if requests else None


def start_filling(requests: Sequence[MaskRequest], beside_forward: bool) -> Future[StepMasks]:
    """Catches each row's state up and fills its mask; the future's result is ready once every
    mask is."""
    global _filler, _executor
    if len(requests) < THREADED_ROWS or not beside_forward:
        done: Future[StepMasks] = Future()
        done.set_result(_fill(list(requests), None))
        return done
    if _filler is None:
        import llguidance

        _filler = ThreadPoolExecutor(max_workers=1, thread_name_prefix="prelude-masks")
        _executor = llguidance.LLExecutor()
    return _filler.submit(_fill, list(requests), _executor)


def _fill(requests: list[MaskRequest], executor: llguidance.LLExecutor | None) -> StepMasks:
    """The rows' masks: in one batched call of `executor` (the mask thread's) when enough rows
    sample under their grammar, else one row at a time."""
    matchers: list[tuple[llguidance.LLMatcher, int]] = []
    states: list[GrammarState] = []
    rows: dict[int, int] = {}
    words = 0
    for request in requests:
        state = cast(GrammarState, request.grammar)
        words = state.mask_words  # every state of a server comes from its one compiler
        state.catch_up(request.step, request.last_token)
        if not state.reasoning:
            rows[request.seq_id] = len(matchers)
            matchers.append((state.matcher, len(matchers)))
            states.append(state)
    bitmask = np.empty((len(matchers), words), np.int32)
    if executor is not None and len(matchers) >= THREADED_ROWS:
        executor.unsafe_compute_mask_ptr(matchers, address_of(bitmask), words * 4, len(matchers))
    else:
        for matcher, row in matchers:
            matcher.unsafe_compute_mask_ptr(address_of(bitmask[row]), words * 4)
    for state in states:  # a failed row fails its step; the engine then fails that row's request alone
        state.check()
    return StepMasks(bitmask, rows)


def few_allowed(words: np.ndarray, limit: int) -> list[int] | None:
    """The token ids one bitmask row allows, when it allows at most `limit` of them; else None."""
    nonzero = np.flatnonzero(words)
    if not 0 < len(nonzero) <= limit:  # each nonzero word allows 1 to 32 tokens
        return None
    bits = (words.view(np.uint32)[nonzero, None] >> np.arange(32, dtype=np.uint32)) & 1
    ids = (nonzero[:, None] * 32 + np.arange(32))[bits.astype(bool)]
    return ids.tolist() if len(ids) <= limit else None
