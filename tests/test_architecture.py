"""The architecture is checked, not just described: import-linter's contracts in pyproject.toml
(layers that never import upward; the product never imports bench or tests; no import cycles
within a package; tests take from bench only what pyproject names), mypy over prelude/
and kernels/ and ruff over the repository, all with the configuration in pyproject.toml; product
comments carry no measurement history."""
from __future__ import annotations

import logging
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_import_contracts_hold(monkeypatch):
    from importlinter.cli import lint_imports

    monkeypatch.chdir(ROOT)
    # lint_imports sets up its logging with dictConfig, which disables every logger that exists
    # by then (prelude's too) for the rest of the session; undo that after the test.
    for logger in list(logging.root.manager.loggerDict.values()):
        if isinstance(logger, logging.Logger):
            monkeypatch.setattr(logger, "disabled", logger.disabled)
    assert lint_imports(config_filename=str(ROOT / "pyproject.toml"), no_cache=True) == 0, \
        "an import breaks a layer contract: run `lint-imports` for the details"


def test_mypy_is_clean(monkeypatch):
    from mypy import api

    monkeypatch.chdir(ROOT)  # the config's `files` are relative to the repository root
    stdout, stderr, status = api.run(["--config-file", str(ROOT / "pyproject.toml")])
    assert status == 0, f"mypy reports errors (run `mypy` at the repository root):\n{stdout}{stderr}"


def test_records_are_read_only_to_mypy(tmp_path, monkeypatch):
    """Records (prelude.contract.record) are stored as plain dataclasses for speed; mypy is what
    keeps a field of one from being assigned, as it does a frozen dataclass's."""
    from mypy import api

    snippet = tmp_path / "mutates.py"
    snippet.write_text("from prelude.contract.batch import DecodeRow\n"
                       "from prelude.engine.request import Request\n"
                       "def change(request: Request, row: DecodeRow) -> None:\n"
                       "    request.prompt_ids = [2]\n"
                       "    row.token_id = 3\n")
    monkeypatch.chdir(ROOT)
    stdout, _, status = api.run(["--config-file", str(ROOT / "pyproject.toml"), str(snippet)])
    assert status == 1 and stdout.count("is read-only") == 2, stdout


def test_ruff_is_clean():
    result = subprocess.run([sys.executable, "-m", "ruff", "check", "--no-cache", "--output-format", "concise", "."],
                            cwd=ROOT, capture_output=True, text=True)
    assert result.returncode == 0, \
        f"ruff reports findings (run `ruff check` at the repository root):\n{result.stdout}{result.stderr}"


PRODUCT_SOURCES = {".py", ".pyx", ".pxd", ".hpp", ".cpp", ".h"}


def test_product_files_carry_no_dates():
    """Measurements belong to commits and bench/serving/results, not to product comments: no file
    of prelude/ or kernels/ holds a date (Cython's generated .cpp files aside)."""
    date = re.compile(r"20\d{2}-\d{2}-\d{2}")
    hits = []
    for package in ("prelude", "kernels"):
        for path in sorted((ROOT / package).rglob("*")):
            if path.suffix not in PRODUCT_SOURCES or (path.suffix == ".cpp" and path.with_suffix(".pyx").exists()):
                continue
            for number, line in enumerate(path.read_text(encoding="utf-8", errors="replace").splitlines(), 1):
                if date.search(line):
                    hits.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()}")
    assert not hits, "dated lines in product files (history goes in commits):\n" + "\n".join(hits)
