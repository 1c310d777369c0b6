"""The flag that asks a running forward to step aside (cooperative preemption), raised by the
engine's event loop while the forward runs in its worker thread."""
from __future__ import annotations

import ctypes


class StopFlag:
    """An int32 that native code reads at `address` between pieces of its work, and Python code
    through `is_set`. `check_every_macs`: about how many multiply-adds a forward may run between
    two looks (where it can look inside a layer; elsewhere it looks between layers)."""

    __slots__ = ("_flag", "check_every_macs")

    def __init__(self, check_every_macs: int):
        self._flag = ctypes.c_int32(0)
        self.check_every_macs = check_every_macs

    @property
    def address(self) -> int:
        return ctypes.addressof(self._flag)

    def set(self) -> None:
        self._flag.value = 1

    def clear(self) -> None:
        self._flag.value = 0

    def is_set(self) -> bool:
        return self._flag.value != 0
