"""`record`: the immutable dataclass of the types made per request, row and step."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TypeVar

from typing_extensions import dataclass_transform

T = TypeVar("T")


@dataclass_transform(frozen_default=True, field_specifiers=(field,))
def record(cls: type[T]) -> type[T]:
    """A dataclass with slots that the type checker holds frozen, made at a plain one's speed.

    dataclass(frozen=True) sets each field through object.__setattr__, some eight times a plain
    store's cost: a Request with its SamplingParams and OutputSpec took 7.5 us to make, and each
    step makes a row per request. A record's fields are stored plainly, and mypy, which the test
    command runs (tests/test_architecture.py), refuses any assignment to one, as it does for a
    frozen dataclass; `dataclasses.replace` makes changed copies. Records hash and compare by
    their fields, as frozen dataclasses do."""
    return dataclass(slots=True, unsafe_hash=True)(cls)
