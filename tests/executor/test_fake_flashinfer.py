"""The stand-in's signatures against the installed flashinfer's source, read without importing
it (flashinfer imports only where CUDA is): the CPU tests of the backend are only as good as
the stand-in's agreement with the real API. Runs wherever the wheel is installed or on
PYTHONPATH (the device image, or `PYTHONPATH=<unzipped wheel>` here)."""
from __future__ import annotations

import ast
import importlib.util
import inspect
from pathlib import Path

import pytest

from tests.executor import fake_flashinfer

MIRRORED = {
    "prefill.py": {"BatchPrefillWithRaggedKVCacheWrapper": ("__init__", "plan", "run"),
                   "BatchPrefillWithPagedKVCacheWrapper": ("__init__", "plan", "run")},
    "decode.py": {"BatchDecodeWithPagedKVCacheWrapper": ("__init__", "plan", "run")},
    "cascade.py": {None: ("merge_state_in_place",)},
}


def _package() -> Path:
    spec = importlib.util.find_spec("flashinfer")
    if spec is None or not spec.submodule_search_locations or spec.origin == fake_flashinfer.__file__:
        pytest.skip("flashinfer is not installed")
    return Path(next(iter(spec.submodule_search_locations)))


def _real_params(fn: ast.FunctionDef) -> list[tuple[str, str, str | None]]:
    """(name, kind, default source) per parameter, as inspect would report them."""
    a = fn.args
    positional = a.posonlyargs + a.args
    defaults = [None] * (len(positional) - len(a.defaults)) + [ast.unparse(d) for d in a.defaults]
    params = [(p.arg, "POSITIONAL_OR_KEYWORD", d) for p, d in zip(positional, defaults)]
    if a.vararg:
        params.append((a.vararg.arg, "VAR_POSITIONAL", None))
    params += [(p.arg, "KEYWORD_ONLY", None if d is None else ast.unparse(d))
               for p, d in zip(a.kwonlyargs, a.kw_defaults)]
    if a.kwarg:
        params.append((a.kwarg.arg, "VAR_KEYWORD", None))
    return params


def _fake_params(fn) -> list[tuple[str, str, str | None]]:
    return [(p.name, p.kind.name if p.kind.name != "POSITIONAL_ONLY" else "POSITIONAL_OR_KEYWORD",
             None if p.default is inspect.Parameter.empty else repr(p.default))
            for p in inspect.signature(inspect.unwrap(fn)).parameters.values()]


def _definitions(tree: ast.Module, owner: str | None) -> dict[str, ast.FunctionDef]:
    """The last definition of each function (an @overload's implementation comes last)."""
    body = tree.body if owner is None else next(
        n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == owner).body
    return {n.name: n for n in body if isinstance(n, ast.FunctionDef)}


def test_stand_in_signatures_are_the_installed_flashinfers():
    package = _package()
    checked = 0
    for module, owners in MIRRORED.items():
        tree = ast.parse((package / module).read_text())
        for owner, names in owners.items():
            real = _definitions(tree, owner)
            fake_owner = fake_flashinfer if owner is None else getattr(fake_flashinfer, owner)
            for name in names:
                assert _fake_params(getattr(fake_owner, name)) == _real_params(real[name]), f"{owner}.{name}"
                checked += 1
    assert checked == 10
