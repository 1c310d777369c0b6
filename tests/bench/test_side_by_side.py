"""The side-by-side bench (issue #20, item 6) against an in-process demo-model server: a few
requests per workload, the peer skipped, then the same server standing in as its own peer; and
the random-weight checkpoint it compares on, in the exact HF layout."""
from __future__ import annotations

import json
import os

import pytest

from bench.serving import sbs_report, side_by_side

QUICK = ["--input-len", "24", "--output-len", "4", "--n-c1", "4", "--n-c16", "8", "--n-gen", "4",
         "--n-embed", "8", "--warmup", "1", "--no-progress"]


def test_prelude_alone_runs_every_workload_and_notes_the_skipped_peer(server, tmp_path, capsys):
    out = tmp_path / "sbs.json"
    code = side_by_side.main(["--prelude", server.base_url, "--prelude-pid", str(os.getpid()), *QUICK,
                              "--json", str(out)])
    assert code == 0
    data = json.loads(out.read_text())
    (side,) = data["sides"]
    assert set(side["runs"]) == {"one-token c=1", "one-token c=16", "generation c=4", "embeddings c=16"}
    for key, run in side["runs"].items():
        assert run["errors"] == 0 and run["output_len_mismatches"] == 0, key
        assert run["server_cpu_us_per_request"] > 0  # the pid given is this process, which serves
        sent = run["requests"]  # every measured request, to read a tail's shape from
        assert len(sent) == run["completed"] and [q["start"] for q in sent] == sorted(q["start"] for q in sent)
        assert sent[0]["start"] == 0 and all(q["ok"] and 0 < q["ttft"] <= q["e2e"] for q in sent)
    assert set(side["foreign_cores"]) == set(side["runs"])
    noise = side["host_noise"]  # the machine's own floor, probed after the c=1 run, a step per request
    assert noise["iterations"] == 4 and 0 < noise["p50_ms"] <= noise["p99_ms"]
    assert side["runs"]["generation c=4"]["tpot"]["count"] == 4
    assert side["rss_bytes"] > 0 and side["startup_s"] is None  # not launched here: no startup time
    text = capsys.readouterr().out
    assert "the peer was skipped" in text and "/ " not in text.splitlines()[1]  # no ratio column
    assert out.with_suffix(".png").read_bytes().startswith(b"\x89PNG")
    server.wait_idle()


def test_a_peer_gets_the_same_requests_and_a_ratio_column(server, tmp_path, capsys):
    out = tmp_path / "pair.json"
    code = side_by_side.main(["--prelude", server.base_url, "--peer", server.base_url, "--peer-name", "twin",
                              *QUICK, "--temperature", "0", "--no-noise-probe", "--json", str(out)])
    assert code == 0
    table = {row["metric"]: row for row in json.loads(out.read_text())["table"]}
    assert table["one-token c=16: throughput"]["ratio"] > 0
    assert table["startup to /health"]["ratio"] is None  # neither was launched here
    assert table["host noise: fixed compute loop P99 / P50"]["values"] == [None, None]  # not probed
    assert "prelude / twin" in capsys.readouterr().out
    server.wait_idle()


def test_ratio_and_table_rendering():
    rows = [sbs_report.Row("req/s", "req/s", "higher", (30.0, 20.0)), sbs_report.Row("x", "ms", "lower", (5.0, None))]
    assert rows[0].ratio == 1.5 and rows[1].ratio is None
    text = sbs_report.render(rows, ["prelude", "vllm-cpu"], "vllm-cpu")
    assert "prelude / vllm-cpu" in text and "1.50" in text
    assert "/" not in sbs_report.render(rows[:1], ["prelude"], None).splitlines()[0]


def test_checkpoint_b_has_the_hf_layout_and_103m_parameters(tmp_path):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from safetensors.torch import load_file

    from bench.serving.checkpoint import COMMON, SIZES, write_checkpoint

    config = transformers.Qwen3Config(**{k: v for k, v in dict(COMMON, **SIZES["103M"]).items()
                                         if k not in ("architectures", "model_type", "torch_dtype")})
    with torch.device("meta"):
        reference = transformers.Qwen3ForCausalLM(config)
    assert round(sum(p.numel() for p in reference.parameters()) / 1e6) == 103  # tied: one embedding
    # The layout itself, on the tiny size (same builder, seconds instead of a 412 MB write).
    path = write_checkpoint(tmp_path / "tiny", "tiny", tmp_path / "no-tokenizer", dtype="float32")
    written = json.loads((path / "config.json").read_text())
    assert written["torch_dtype"] == "float32"
    tensors = load_file(str(path / "model.safetensors"))
    assert {t.dtype for t in tensors.values()} == {torch.float32}
    tiny = transformers.Qwen3Config(**{k: v for k, v in written.items()
                                       if k not in ("architectures", "model_type", "torch_dtype")})
    with torch.device("meta"):
        names = set(transformers.Qwen3ForCausalLM(tiny).state_dict())
    assert set(tensors) == names - {"lm_head.weight"}  # tied embeddings: no separate head
    assert (path / "tokenizer.json").is_file()
