"""A step planned ahead of the one running (a DecodeChain's) gets its input tokens from what that
step sampled: every other field of each row stays as planned."""
from __future__ import annotations

import dataclasses

from prelude.contract.batch import (SAMPLED_BY_PREVIOUS_STEP, BatchResult, DecodeBatch, DecodeRow, OutputSpec,
                                    RowResult, TokenLogprob)
from prelude.contract.sampling import SamplingParams
from prelude.engine.decode_chain import with_sampled_tokens

EOS = frozenset({2})


def planned(seq_id: int, history: tuple[int, ...] = ()) -> DecodeRow:
    row = DecodeRow(seq_id, SAMPLED_BY_PREVIOUS_STEP, position=40 + seq_id, block_table=[7, seq_id],
                    output=OutputSpec(sample=SamplingParams(max_tokens=8, temperature=0.0)), sample_step=3,
                    history=history)
    # Fields added later with a default get a value of their own too: the chained row is built
    # field by field (for speed), and one it left out would fall back to its default unseen.
    known = {"seq_id", "token_id", "position", "block_table", "output", "sample_step", "history"}
    return dataclasses.replace(row, **{f.name: object() for f in dataclasses.fields(DecodeRow)
                                       if f.name not in known})


def sampled(*tokens: tuple[int, int]) -> BatchResult:
    return BatchResult([RowResult(seq_id, TokenLogprob(token, 0.0, [])) for seq_id, token in tokens])


def test_a_chained_row_takes_the_sampled_token_and_keeps_the_rest():
    rows = [planned(0), planned(1, history=(5, 6))]
    chained = with_sampled_tokens(DecodeBatch(rows), sampled((0, 11), (1, 12)), EOS)
    assert chained is not None
    for before, after, token in zip(rows, chained.rows, (11, 12)):
        assert after.token_id == token
        assert after.history == ((*before.history, token) if before.history else ())
        for field in dataclasses.fields(DecodeRow):
            if field.name not in ("token_id", "history"):
                assert getattr(after, field.name) == getattr(before, field.name), field.name


def test_a_row_whose_token_ended_it_is_dropped_and_a_missing_token_replans():
    rows = [planned(0), planned(1)]
    chained = with_sampled_tokens(DecodeBatch(rows), sampled((0, 2), (1, 12)), EOS)  # 2 is EOS
    assert chained is not None and [r.seq_id for r in chained.rows] == [1]
    assert with_sampled_tokens(DecodeBatch(rows), sampled((1, 12)), EOS) is None
