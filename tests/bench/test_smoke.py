"""End to end: the load generator against a real in-process server with the demo model."""
from __future__ import annotations

import asyncio
import json
import shutil
from pathlib import Path

import pytest

from bench.serving.core import loadgen


def test_load_generator_against_the_demo_model(server, tmp_path, capsys):
    out = tmp_path / "results.json"
    code = loadgen.main(["--base-url", server.base_url, "--shapes", "32/1,32/4", "--concurrency", "4",
                         "--num-requests", "10", "--warmup", "2", "--no-progress", "--json", str(out)])
    assert code == 0
    results = json.loads(out.read_text())["results"]
    assert [r["workload"] for r in results] == ["fixed 32/1", "fixed 32/4"]
    for r in results:
        assert (r["completed"], r["errors"], r["output_len_mismatches"]) == (10, 0, 0)
        # Token counts come from the server's usage: exact prompts, exact outputs (ignore_eos).
        assert r["input_tok_per_s"] * r["duration_s"] == pytest.approx(10 * 32)
        assert r["e2e"]["p50"] > 0 and r["server_cpu_s"] is None  # not our process to read
    one, four = results
    assert not one["streamed"] and one["ttft"] == one["e2e"] and one["tpot"]["count"] == 0
    assert four["streamed"] and four["output_tok_per_s"] * four["duration_s"] == pytest.approx(40)
    assert four["ttft"]["p50"] < four["e2e"]["p50"] and four["tpot"]["count"] == 10
    captured = capsys.readouterr()
    assert "fixed 32/4" in captured.out and "TTFT equals E2E" in captured.out
    assert "req/s" in captured.out.split("Throughput", 1)[1]  # the table comes last, after the bars
    assert "10/10" not in captured.err  # --no-progress: no bar
    # The chart sits beside the JSON: latency against throughput, one panel per workload.
    assert out.with_suffix(".png").read_bytes().startswith(b"\x89PNG")
    server.wait_idle()


def test_choice_workload_answers_one_of_its_labels(server, tmp_path):
    out = tmp_path / "choice.json"
    code = loadgen.main(["--base-url", server.base_url, "--workload", "choice", "--input-len", "24",
                         "--concurrency", "2", "--num-requests", "6", "--warmup", "0", "--no-progress",
                         "--json", str(out)])
    assert code == 0
    (result,) = json.loads(out.read_text())["results"]
    assert result["workload"] == "choice 24"
    assert (result["completed"], result["errors"], result["output_len_mismatches"]) == (6, 0, 0)
    server.wait_idle()


def test_load_generator_shows_a_progress_bar_per_level(server, tmp_path, capsys):
    out = tmp_path / "bar.json"
    code = loadgen.main(["--base-url", server.base_url, "--shapes", "16/1", "--concurrency", "2",
                         "--num-requests", "6", "--warmup", "0", "--json", str(out), "--plot", str(tmp_path / "c.png")])
    assert code == 0
    err = capsys.readouterr().err
    assert "target fixed 16/1 c=2" in err and "6/6" in err  # tqdm's bar for the level, finished
    assert (tmp_path / "c.png").is_file() and not out.with_suffix(".png").exists()
    server.wait_idle()


def _connections_to(port: int) -> int:
    """Established TCP connections to this port on loopback (Linux: /proc/net/tcp), the client's side."""
    lines = Path("/proc/net/tcp").read_text().splitlines()[1:]
    return sum(1 for line in lines if line.split()[2].endswith(f":{port:04X}") and line.split()[3] == "01")


@pytest.mark.skipif(not Path("/proc/net/tcp").exists(), reason="counts connections in /proc/net/tcp (Linux)")
def test_client_pool_keeps_one_connection_per_request_in_flight(server):
    from bench.serving.core.client import ClientPool
    from bench.serving.core.workloads import Job, encode

    job = Job("/v1/completions", encode({"prompt": [5, 6, 7], "max_tokens": 1}), False, 3, 1)
    port = int(server.base_url.rsplit(":", 1)[1])
    before = _connections_to(port)

    async def run():
        async with ClientPool(server.base_url, size=3, timeout=30) as pool:
            await pool.open_connections(3)
            opened = _connections_to(port) - before
            records = await asyncio.gather(*(pool.send(job) for _ in range(9)))
            return opened, _connections_to(port) - before, records

    opened, used, records = asyncio.run(run())
    assert opened == used == 3  # nine requests, never more than three at once, on three connections
    assert all(r.ok and r.output_tokens == 1 and r.prompt_tokens == 3 for r in records)


def test_decode_step_bench_times_every_op_set(demo_model, tmp_path, capsys):
    from bench.kernels import decode_step

    out = tmp_path / "decode_step.json"
    code = decode_step.main(["--model", str(demo_model), "--rounds", "1", "--steps", "2", "--json", str(out)])
    assert code == 0
    rounds = json.loads(out.read_text())["rounds_ms"]
    assert set(rounds) == set(decode_step.OPS) and all(len(t) == 1 and t[0] > 0 for t in rounds.values())
    assert "median ms" in capsys.readouterr().out


def test_suffix_step_bench_times_a_suffix_over_a_cached_prefix(demo_model, tmp_path, capsys):
    from bench.kernels import suffix_step

    out = tmp_path / "suffix_step.json"
    code = suffix_step.main(["--model", str(demo_model), "--prefix", "40", "--suffix", "8", "--rounds", "2",
                             "--steps", "1", "--json", str(out)])
    assert code == 0
    assert all(t > 0 for t in json.loads(out.read_text())["rounds_ms"])
    assert "median ms" in capsys.readouterr().out


def _kernel_bench(module, args: list[str], tmp_path, capsys) -> tuple[dict, str]:
    """Runs a CPU kernel micro-benchmark once, one repeat (skipped where the kernels are not
    built): its JSON and what it printed; its chart is a PNG beside the JSON."""
    from prelude.model import cpu_linear

    if not cpu_linear.built:
        pytest.skip("kernels.cpu is not built")
    out = tmp_path / "bench.json"
    assert module.main([*args, "--repeats", "1", "--json", str(out)]) == 0
    assert out.with_suffix(".png").read_bytes().startswith(b"\x89PNG")
    return json.loads(out.read_text()), capsys.readouterr().out


def test_prefill_attention_bench_writes_its_table_json_and_chart(tmp_path, capsys):
    from bench.kernels import prefill_attention

    payload, printed = _kernel_bench(prefill_attention, ["--tokens", "16", "--chunk", "8:40"], tmp_path, capsys)
    results = payload["results"]
    assert len(results) == 2 * len(prefill_attention.HEADS)
    assert all(r["torch_us"] > 0 and r["prelude_us"] > 0 for r in results)
    assert "speedup" in printed


def test_linear_formats_bench_times_every_format_this_cpu_stores(tmp_path, capsys):
    from bench.kernels import linear_formats
    from prelude.model import cpu_linear

    payload, printed = _kernel_bench(linear_formats, ["--hidden", "64", "--intermediate", "96", "--heads", "2,1,32",
                                                      "--rows", "1,24"], tmp_path, capsys)
    results = payload["results"]
    formats = {r["format"] for r in results}
    assert {"float32", "bfloat16", "bf16x2", "int8"} <= formats
    assert ("bf16x3" in formats) == cpu_linear.SPLIT_PRODUCTS
    assert len(results) == 2 * len(formats) and all(r["gflops"] > 0 for r in results)
    assert "GFLOP/s" in printed


def test_lm_head_bench_times_a_head_in_both_layouts(tmp_path, capsys):
    from bench.kernels import lm_head

    payload, printed = _kernel_bench(lm_head, ["--vocab", "1000", "--hidden", "64", "--rows", "1,6",
                                               "--format", "float32", "--layouts"], tmp_path, capsys)
    assert payload["kept"] in ("by rows", "panels") and [r["rows"] for r in payload["results"]] == [1, 6]
    assert all(r["by_rows_ms"] > 0 and r["panels_ms"] > 0 for r in payload["results"] + payload["lookups"])
    assert "by rows / panels" in printed and "lookup ids" in printed


def test_cpu_cost_bench_runs_against_the_null_executor(tmp_path):
    """bench.serving.cpu_cost launches a real `--executor null` server and reads its CPU per
    request; every request is answered (the null model once fell behind the runner's calls: its
    warm-up failed, so the server never became ready, and its forward refused the kept tokens)."""
    from bench.serving import cpu_cost

    out = tmp_path / "cpu.json"
    # Enough requests that each run's server CPU is well above zero.
    code = cpu_cost.main(["--concurrency", "1,4", "--num-requests", "60", "--warmup", "2", "--no-progress",
                          "--log-dir", str(tmp_path), "--json", str(out)])
    assert code == 0
    runs = json.loads(out.read_text())["results"]
    assert len(runs) == 4 and all(r["completed"] == 60 and r["errors"] == 0 for r in runs), runs
    assert all(r["server_cpu_s"] > 0 for r in runs)


def test_paired_cpu_bench_drives_two_servers_in_turn(tmp_path):
    """bench.serving.paired_cpu runs two `--executor null` servers at once and drives them in
    alternating blocks with its bare keep-alive client (unstreamed and streamed answers both read
    to their end): each side counts its requests and its server's CPU."""
    from bench.serving import paired_cpu

    out = tmp_path / "paired.json"
    code = paired_cpu.main(["--concurrency", "2", "--blocks", "2", "--block-s", "0.3", "--prompts", "16",
                            "--log-dir", str(tmp_path), "--json", str(out)])
    assert code == 0
    cells = json.loads(out.read_text())["cells"]
    assert [(c["workload"].split()[0], c["concurrency"]) for c in cells] == [("OneShot", 2), ("Decode", 2)]
    assert all(c[side]["requests"] > 0 and c[side]["cpu_s"] > 0 for c in cells for side in ("a", "b"))
    assert out.with_suffix(".png").read_bytes().startswith(b"\x89PNG")


@pytest.mark.skipif(shutil.which("valgrind") is None or shutil.which("callgrind_control") is None,
                    reason="bench.serving.instructions runs the server under callgrind (apt install valgrind)")
def test_instructions_bench_counts_a_null_executor_server(tmp_path):
    """bench.serving.instructions counts the instructions of a real `--executor null` server
    under callgrind, only while the measured requests run: every request answered, a count per
    request for the event loop and for the other threads."""
    from bench.serving import instructions

    out = tmp_path / "instructions.json"
    code = instructions.main(["--classes", "OneShot", "--concurrency", "1", "--num-requests", "20", "--warmup", "2",
                              "--log-dir", str(tmp_path), "--json", str(out)])
    assert code == 0
    (row,) = json.loads(out.read_text())["rows"]
    assert row["requests"] == 20 and row["errors"] == 0
    # The loop's own work per request is hundreds of thousands of instructions, not the whole
    # process's startup (counting is off until the run).
    assert 1e5 < row["loop_per_request"] < 1e8 and row["other_per_request"] > 0


def test_long_short_bench_runs_a_policy_and_the_overload(tmp_path, capsys):
    """bench.serving.long_short, shrunk: calibration, one policy with and without deadlines, and
    an overload herd against a bound of 8 (the rest answered 503, none failing otherwise)."""
    from bench.serving import long_short

    out = tmp_path / "long_short.json"
    code = long_short.main(["--policies", "edf", "--no-baseline", "--no-shorts-alone", "--seconds", "1",
                            "--long-tokens", "512", "--overload", "30", "--max-queued-requests", "8",
                            "--idle-requests", "10", "--deadline-ms", "250", "--no-progress", "--json", str(out)])
    assert code == 0
    report = json.loads(out.read_text())
    calibration = report["calibration"]  # the unloaded P99 both back to back and after idle gaps
    assert 0 < calibration["unloaded_short_p99_s"] and 0 < calibration["unloaded_after_gaps_short_p99_s"]
    assert calibration["deadline_s"] == 0.25  # --deadline-ms, not a multiple of the unloaded P99
    assert [(r["policy"], r["deadlines"]) for r in report["results"]] == [("edf", False), ("edf", True)]
    assert all(r["errors"] == 0 for r in report["results"]), report["results"]
    overload = report["overload"]
    assert overload["accepted"] >= 8 and overload["refused"] > 0 and overload["other"] == 0, overload
    assert "SLO %" in capsys.readouterr().out and out.with_suffix(".png").read_bytes().startswith(b"\x89PNG")


def test_hotpath_refuses_a_single_round_before_starting_a_server(capsys):
    from bench.serving import hotpath

    with pytest.raises(SystemExit) as refused:
        hotpath.main(["--rounds", "1"])
    assert refused.value.code == 2 and "--rounds must be at least 2" in capsys.readouterr().err


def test_idle_penalty_times_the_same_step_after_each_kind_of_gap(tmp_path, capsys):
    import torch

    from bench.serving import idle_penalty

    threads = torch.get_num_threads()  # the null runner takes one intra-op thread for the process
    out = tmp_path / "idle.json"
    try:
        code = idle_penalty.main(["--iterations", "20", "--rounds", "2", "--gap-ms", "0.2", "--json", str(out)])
    finally:
        torch.set_num_threads(threads)
    assert code == 0
    rows = json.loads(out.read_text())["rows"]
    assert [r["case"] for r in rows] == list(idle_penalty.CASES)
    assert all(r["steps"] == 40 and r["median_us"] > 0 for r in rows) and rows[0]["ratio"] == 1.0
    assert "after sleep" in capsys.readouterr().out
    assert out.with_suffix(".png").read_bytes().startswith(b"\x89PNG")
