"""Admission keeps the sampling parameters it read by the fields a request named: a request gets
what reading its own fields gives, a value of another type is read (and refused) afresh, and
SAMPLING_FIELDS, which picks the fields that make the key, names every field the reading looks at."""
from __future__ import annotations

import pytest

from prelude.server.admission import SAMPLING_FIELDS, Admission
from prelude.server.errors import APIError
from prelude.server.protocol import Body


class _Tokenizer:
    vocab_size = 1000


class _Looked(dict):
    """A body that notes every field looked up in it."""

    def __init__(self, data: dict, looked: set[str]):
        super().__init__(data)
        self.looked = looked

    def get(self, key, default=None):
        self.looked.add(key)
        return super().get(key, default)

    def __contains__(self, key):
        self.looked.add(key)
        return super().__contains__(key)


def _admission() -> Admission:
    return Admission(_Tokenizer(), 1, 4096, 1 << 20, 20, eos_token_ids=(2,),
                     sampling_defaults={"temperature": 0.7, "top_p": 0.9})


def test_every_field_sampling_reads_is_named():
    admission = _admission()
    looked: set[str] = set()
    # Bodies that take every branch: absent fields, then fields that lead on to others.
    for data in ({}, {"min_tokens": 2, "logit_bias": {"5": 1.0}, "allowed_token_ids": [5, 6], "stop": "x"}):
        admission._read_sampling(Body(_Looked(data, looked)), 16, None)
    assert looked - {"5"} <= SAMPLING_FIELDS  # "5": a logit_bias key, read from the nested object


def test_a_repeated_request_gets_what_reading_its_fields_gives():
    admission = _admission()
    bodies = [{"model": "m", "prompt": "p"}, {"temperature": 0, "ignore_eos": True, "seed": None},
              {"temperature": 0.0, "ignore_eos": True}, {"stop": ["a"], "top_k": 5}, {"temperature": 0}]
    for round_ in range(2):
        for data in bodies:
            for max_tokens, logprobs in ((1, None), (16, 5)):
                body = Body(dict(data))
                got = admission.sampling(body, max_tokens, logprobs)
                assert got == admission._read_sampling(Body(dict(data)), max_tokens, logprobs)
                assert body.ignored() == [k for k, v in data.items() if v is not None and k in ("model", "prompt")]
    assert admission.sampling(Body({}), 1, None).temperature == 0.7  # the model's default


def test_an_equal_value_of_another_type_is_checked_again():
    admission = _admission()
    assert admission.sampling(Body({"temperature": 1}), 1, None).temperature == 1.0
    with pytest.raises(APIError):
        admission.sampling(Body({"temperature": True}), 1, None)  # True == 1, but not a number here
