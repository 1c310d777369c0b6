"""Queue policies: the order in which waiting requests are offered to the scheduler."""
from __future__ import annotations

from abc import ABC, abstractmethod
from collections import deque
from typing import Generic, Iterator, TypeVar

T = TypeVar("T")


class QueuePolicy(ABC, Generic[T]):
    """A waiting queue. The scheduler iterates it in priority order, then removes what it admitted;
    preempted work re-enters with `push_front` so it is not starved behind new arrivals."""

    @abstractmethod
    def push(self, item: T) -> None: ...

    @abstractmethod
    def push_front(self, item: T) -> None: ...

    @abstractmethod
    def remove(self, item: T) -> None: ...

    @abstractmethod
    def remove_many(self, items: list[T]) -> None:
        """Removes items the scheduler admitted in one tick (one pass over the queue)."""

    @abstractmethod
    def __iter__(self) -> Iterator[T]: ...

    @abstractmethod
    def __len__(self) -> int: ...


class FCFS(QueuePolicy[T]):
    def __init__(self) -> None:
        self._queue: deque[T] = deque()

    def push(self, item: T) -> None:
        self._queue.append(item)

    def push_front(self, item: T) -> None:
        self._queue.appendleft(item)

    def remove(self, item: T) -> None:
        self._queue.remove(item)

    def remove_many(self, items: list[T]) -> None:
        if not items:
            return
        if len(items) == len(self._queue):
            self._queue.clear()
            return
        taken = {id(item) for item in items}
        self._queue = deque(item for item in self._queue if id(item) not in taken)

    def __iter__(self) -> Iterator[T]:
        # Not mutated while the scheduler iterates: admitted work is removed after the pass.
        return iter(self._queue)

    def __len__(self) -> int:
        return len(self._queue)


POLICIES = {"fcfs": FCFS}
