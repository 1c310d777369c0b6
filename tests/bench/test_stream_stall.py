"""The stream-stall bench against a real in-process server on the demo model."""
from __future__ import annotations

import json

from bench.serving import stream_stall


def test_stream_stall_reports_each_run(server, tmp_path, capsys):
    out = tmp_path / "stall.json"
    assert stream_stall.main(["--base-url", server.base_url, "--long-tokens", "300", "--runs", "1",
                              "--stream-tokens", "400",
                              "--json", str(out)]) == 0
    runs = json.loads(out.read_text())["runs"]
    assert [r["kind"] for r in runs] == ["embed", "chat"]
    for run in runs:
        assert 0 < run["max_gap_s"] and run["long_s"] > 0 and len(run["gaps_s"]) == len(run["gap_ends_s"])
    assert runs[1]["long_first_token_s"] is not None and runs[0]["long_first_token_s"] is None
    assert "longest gap ms" in capsys.readouterr().out
    assert out.with_suffix(".png").read_bytes().startswith(b"\x89PNG")
    server.wait_idle()
