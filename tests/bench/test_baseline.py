"""The hot-path guards' committed baseline covers every guard, and the README's command uses it."""
from __future__ import annotations

import ast
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
COMMAND = ("pytest tests/bench/test_hot_paths.py --benchmark-enable --benchmark-storage=file://tests/bench/baseline "
           "--benchmark-compare --benchmark-compare-fail=median:25%")


def test_baseline_covers_every_hot_path_guard():
    source = ast.parse((ROOT / "tests/bench/test_hot_paths.py").read_text())
    guards = {f.name for f in source.body if isinstance(f, ast.FunctionDef) and f.name.startswith("test_")
              and "benchmark" in {a.arg for a in f.args.args}}
    assert {"test_request_normalization", "test_scheduler_tick_with_256_waiting",
            "test_streaming_detokenize_of_256_tokens", "test_response_serialization"} <= guards
    (baseline,) = sorted((ROOT / "tests/bench/baseline").glob("*/*.json"))[-1:]
    recorded = {b["name"] for b in json.loads(baseline.read_text())["benchmarks"]}
    assert recorded == guards, "refresh the baseline (README: Hot-path guards)"


def test_readme_documents_the_guard_command():
    assert COMMAND in (ROOT / "README.md").read_text()
