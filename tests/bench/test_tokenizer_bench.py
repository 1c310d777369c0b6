"""`python -m bench.tokenizer` as a user runs it, cut short: progress bars on stderr, the table
on stdout, and the JSON with its speedup chart beside it."""
from __future__ import annotations

import json

from bench.tokenizer.__main__ import main
from tests.data import tokenizer_dir


def test_tokenizer_bench_writes_table_json_and_chart(tmp_path, capsys):
    tokenizer_dir("gpt2")  # skips without the shared tokenizer files
    out = tmp_path / "tokenizer.json"
    assert main(["--tokenizers", "gpt2", "--budget", "0.005", "--random", "5", "--json", str(out)]) == 0
    captured = capsys.readouterr()
    assert "timing: 100%" in captured.err and "equality gate: 100%" in captured.err
    table = captured.out.split("== timing", 1)[1]
    assert "gpt2             encode 50 chars" in table and "best other/ft" in table
    assert set(json.loads(out.read_text())["results"]["gpt2"]["encode 50 chars"]) >= {"fasttoken", "hf"}
    assert out.with_suffix(".png").read_bytes().startswith(b"\x89PNG")
    assert main(["--tokenizers", "gpt2", "--budget", "0.005", "--random", "5", "--json", str(out),
                 "--no-progress"]) == 0
    assert "timing:" not in capsys.readouterr().err
