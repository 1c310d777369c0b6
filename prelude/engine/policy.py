"""Queue policies: the order in which waiting requests are offered to the scheduler."""
from __future__ import annotations

from abc import ABC, abstractmethod
from collections import deque
from typing import Generic, Iterator, TypeVar

T = TypeVar("T")


class QueuePolicy(ABC, Generic[T]):
    """A waiting queue. The scheduler iterates it in priority order and removes what it admits;
    preempted work re-enters with `push_front` so it is not starved behind new arrivals."""

    @abstractmethod
    def push(self, item: T) -> None: ...

    @abstractmethod
    def push_front(self, item: T) -> None: ...

    @abstractmethod
    def remove(self, item: T) -> None: ...

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

    def __iter__(self) -> Iterator[T]:
        return iter(list(self._queue))

    def __len__(self) -> int:
        return len(self._queue)


POLICIES = {"fcfs": FCFS}
