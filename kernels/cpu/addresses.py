"""Where an array's data starts, for the native kernels' pointer arguments: the extension's
`address` (some 50 ns a call), or numpy's `.ctypes.data` (about a microsecond: it imports a module
and builds an object each call) where the extension is not built."""
from __future__ import annotations

from typing import Any

try:
    from kernels.cpu._native import address as _address
except ImportError:  # the extension is not built (a source checkout before `pip install -e .`)
    _address = None


def _ctypes_address(array: Any) -> int:
    return 0 if array is None else array.ctypes.data


# An array's (or any buffer's) first element's address; 0 for None.
address_of = _address if _address is not None else _ctypes_address
