"""Where an array's data starts (a view's first element; 0 for None), for the native kernels'
pointer arguments: the extension's `address` (some 50 ns a call), or numpy's `.ctypes.data` (about
a microsecond: it imports a module and builds an object each call) where the extension is not
built."""
from __future__ import annotations

from typing import Any

try:
    from kernels.cpu._native import address as address_of
except ImportError:  # the extension is not built (a source checkout before `pip install -e .`)
    def address_of(array: Any) -> int:
        return 0 if array is None else array.ctypes.data
