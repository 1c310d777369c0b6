"""The structured-output benchmarks run end to end on small settings: the library comparison on
the demo tokenizer, and the judge workload against a real server."""
from __future__ import annotations

import json

import pytest


# xgrammar's and transformers' imports warn of deprecated torch APIs they use, and xgrammar of
# the stop tokens it detects itself.
@pytest.mark.filterwarnings("ignore::DeprecationWarning", "ignore::UserWarning")
def test_grammar_libs_bench_compares_both_libraries(tmp_path, capsys):
    from bench.serving import grammar_libs

    out = tmp_path / "libs.json"
    grammar_libs.main(["--tokenizers", "demo", "--generated", "3", "--json", str(out)])
    results = json.loads(out.read_text())["results"]
    assert {r["library"] for r in results} == {"llguidance", "xgrammar"}
    assert all(r["judge"]["compiled"] == r["judge"]["total"] and r["mask_b16_us"] > 0 for r in results)
    assert "mask b1 us" in capsys.readouterr().out


def test_structured_judge_bench_validates_every_answer(tmp_path, capsys):
    from bench.serving import structured_judge

    out = tmp_path / "judge.json"
    structured_judge.main(["--num-requests", "4", "--concurrency", "2", "--workloads", "pairwise,label",
                           "--json", str(out)])
    result = json.loads(out.read_text())
    constrained = [c for c in result["cells"] if c["constrained"]]
    assert len(constrained) == 2 and all(c["invalid"] == 0 for c in constrained)
    assert result["compile"]["p50_ms"] > 0 and "invalid" in capsys.readouterr().out
