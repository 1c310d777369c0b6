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
                      "thread (11): MainThread;run (a.py:1) 4\n"
                      "thread (11): MainThread;\n\x00 (\u0dde\x00:1694527087);run (a.py:1) 5\n")  # a torn read
    text = summarize(stacks, top=3)
    assert text.splitlines()[:3] == ["pyspy.txt: 8 samples holding the GIL", "   87.5%  MainThread",
                                     "   12.5%  prelude-step_0"]
    assert "   50.0%  MainThread       run" in text and "   37.5%  MainThread       parse" in text
    assert "   87.5%  MainThread       run" in text  # with its callee


def test_a_pair_table_pools_each_servers_rounds_and_gives_each_halfs_ratio(capsys):
    from bench.serving.gpu_table2 import print_pairs

    def rounds(*rates_and_ttfts):  # one second per round: its requests are its rate
        return [{"requests": rate, "errors": 0, "duration_s": 1.0, "ttft_p50_ms": ttft}
                for rate, ttft in rates_and_ttfts]

    pair = {"prompt_len": 128, "max_tokens": 1, "concurrency": 16,
            "rounds": {"oneshot": rounds((200, 4.0), (300, 5.0), (250, 6.0), (250, 7.0)),
                       "ablation": rounds((200, 5.0), (200, 6.0), (250, 7.0), (250, 8.0))}}
    print_pairs([{"model": "0.6B", "kind": "ablation", "labels": ["oneshot", "ablation"], "pairs": [pair]},
                 {"model": "4B", "error": "failed to start"}])
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[0].startswith("OneShot against --disable-oneshot")
    assert len(lines) == 3  # the title, the header, one shape: the 4B never ran
    # pooled 1000 / 900 requests in 4 s each; halves 500 / 400 and 500 / 500; TTFT medians of rounds
    assert lines[2].split() == ["0.6B", "128/1", "16", "250.0", "225.0", "1.11", "1.25", "1.00", "5.5", "6.5"]


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


NATIVE_PACKAGES = ("prelude/_fasttoken", "kernels/cpu")


def _libraries(root) -> list[str]:
    return sorted(p.name for package in NATIVE_PACKAGES for p in (root / package).glob("*.so"))


def test_another_checkout_gets_this_ones_native_extensions_only_when_built_from_the_same_sources(tmp_path):
    """--against CHECKOUT: a checkout with the same native sources and no built extensions is
    given this one's; one whose sources differ is left to bring its own."""
    import shutil

    from bench.serving.gpu_table2 import REPO, _share_native_extensions

    if not _libraries(REPO):
        pytest.skip("the native extensions are not built in this checkout")
    sources = [REPO / "setup.py", *(p for package in NATIVE_PACKAGES for pattern in ("*.pyx", "*.pxd", "*.pxi", "*.hpp")
                                    for p in (REPO / package).glob(pattern))]
    same, changed = tmp_path / "same", tmp_path / "changed"
    for root in (same, changed):
        for source in sources:
            copy = root / source.relative_to(REPO)
            copy.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, copy)
    (changed / "setup.py").write_text((changed / "setup.py").read_text() + "\n# changed\n")
    for root in (same, changed):
        _share_native_extensions(root)
    assert _libraries(same) == _libraries(REPO) and _libraries(changed) == []
