"""The GPU table's MFU column: FLOPs per prompt token from a model's config."""
from __future__ import annotations

import pytest

from bench.serving.gpu_table2 import flops_per_prompt_token

QWEN3_06B = {"hidden_size": 1024, "num_hidden_layers": 28, "num_attention_heads": 16, "num_key_value_heads": 8,
             "head_dim": 128, "intermediate_size": 3072}


def test_qwen3_06b_costs_about_088_gflop_per_token_in_its_linear_layers():
    # Issue #14's figure for 512-token scoring: ~0.88 GFLOP per token of linear work; causal
    # attention over 512 tokens adds 2 products x 2 FLOPs x 2,048 x 256 keys x 28 layers.
    linear = flops_per_prompt_token(QWEN3_06B, 0)
    assert linear == pytest.approx(0.881e9, rel=1e-3)
    assert flops_per_prompt_token(QWEN3_06B, 512) - linear == 28 * 2 * 2 * 2048 * 256


def test_gil_profile_shares_samples_by_thread_and_function(tmp_path):
    from bench.serving.gil_profile import summarize

    stacks = tmp_path / "pyspy.txt"
    stacks.write_text("thread (11): MainThread;run (a.py:1);parse (b.py:2) 3\n"
                      "thread (12): prelude-step_0;execute (c.py:3);launch (d.py:4) 1\n"
                      "thread (11): MainThread;run (a.py:1) 4\n")
    text = summarize(stacks, top=3)
    assert text.splitlines()[:3] == ["pyspy.txt: 8 samples holding the GIL", "   87.5%  MainThread",
                                     "   12.5%  prelude-step_0"]
    assert "   50.0%  MainThread       run" in text and "   37.5%  MainThread       parse" in text
    assert "   87.5%  MainThread       run" in text  # with its callee


def test_the_ablation_table_pairs_each_shape_with_the_default_servers_run(capsys):
    from bench.serving.gpu_table2 import print_ablation

    def run(prompt_len, concurrency, req_per_s, ttft):
        return {"prompt_len": prompt_len, "max_tokens": 1, "concurrency": concurrency, "req_per_s": req_per_s,
                "ttft_p50_ms": ttft}

    records = [{"model": "0.6B", "flags": [], "runs": [run(128, 1, 200.0, 4.0), run(512, 64, 300.0, 90.0)]},
               {"model": "0.6B", "flags": ["--disable-oneshot"], "runs": [run(128, 1, 160.0, 5.0)]},
               {"model": "4B", "flags": [], "error": "failed to start"}]
    print_ablation(records)
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[0] == "OneShot against --disable-oneshot"
    assert len(lines) == 3  # the title, the header, one shape: only those both servers ran
    assert lines[2].split() == ["0.6B", "128/1", "1", "200.0", "160.0", "1.25", "4.0", "5.0"]


def test_the_startup_timeline_is_read_from_the_servers_banner(tmp_path):
    """/health answers during the warm-up, before the banner: the line is awaited (a while)."""
    from bench.serving.gpu_table2 import startup_timeline

    log = ("2026-12-04 00:34:54,357 INFO prelude.app.assembly: Prelude 0.1.0 ready in 1.61s\n"
           "  tokenizer  fasttoken\n"
           "  startup    python 0.13s, imports 1.20s, config and tokenizer 0.09s, warm-up 0.02s\n"
           "2026-12-04 00:34:55,001 INFO prelude.access: - GET /health 200\n")
    path = tmp_path / "server.log"
    path.write_text(log)
    assert startup_timeline(path) == "python 0.13s, imports 1.20s, config and tokenizer 0.09s, warm-up 0.02s"
    path.write_text("no banner yet\n")
    assert startup_timeline(path, wait_s=0.1) is None
