"""`python -m prelude` as users run it: a separate process, the embedded demo model, real HTTP."""
from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path
from importlib.metadata import entry_points

import httpx
import pytest
import torch

from bench.serving.core.server import ServerProcess, log_tail, prelude_env
from prelude import __version__
from prelude.app.cli import build_parser
from prelude.contract.config import ALLOW_LONG_MAX_MODEL_LEN_ENV
from prelude.demo import VERSION
from prelude.model.cpu_linear import SPLIT_PRODUCTS, built


def run_to_exit(args: list[str], command: list[str] | None = None,
                env: dict[str, str] | None = None) -> tuple[int, str, str]:
    """Runs `python -m prelude args` to its exit; returns the exit code, stdout and stderr. This
    checkout comes first on the path (an installed `prelude` script may belong to another)."""
    done = subprocess.run([*(command or [sys.executable, "-m", "prelude"]), *args], env=env or prelude_env(),
                          capture_output=True, text=True, timeout=60, check=False)
    return done.returncode, done.stdout, done.stderr


def listen_on(tmp_path: Path) -> list[str]:
    """Where a server that fails at startup listens meanwhile: a Unix socket of its own, so no TCP
    port found free could be taken by then (the error would be another)."""
    return ["--uds", str(tmp_path / "prelude.sock")]


def one_error_line(code: int, stderr: str) -> str:
    """A startup error as operators must see it: exit code 2 and one stderr line, no traceback."""
    lines = stderr.strip().splitlines()
    assert code == 2, stderr
    assert len(lines) == 1 and lines[0].startswith("error: "), stderr
    return lines[0]


def test_version_from_module_and_console_script():
    code, out, _ = run_to_exit(["--version"])
    assert code == 0 and out.strip() == f"prelude {__version__}"
    # The `prelude` command pip installs runs the same entry point.
    (script,) = [e for e in entry_points(group="console_scripts") if e.name == "prelude"]
    assert script.value == "prelude.__main__:main"
    if shutil.which("prelude"):
        code, out, _ = run_to_exit(["--version"], command=[shutil.which("prelude")])
        assert code == 0 and out.strip() == f"prelude {__version__}"


def test_help_gives_every_flag_a_help_line_and_its_default_in_groups():
    parser = build_parser()
    text = parser.format_help()
    groups = {g.title: g for g in parser._action_groups}
    assert {"model", "server", "cache", "scheduler", "logging"} <= set(groups)
    formatter = parser._get_formatter()
    for action in parser._actions:
        if isinstance(action, (argparse._HelpAction, argparse._VersionAction)):
            continue
        shown = formatter._expand_help(action) if action.help else ""
        assert shown.strip(), f"{action.option_strings} has no help"
        assert "default" in shown, f"{action.option_strings} does not state its default: {shown!r}"
        assert action.option_strings[0] in text
    # vLLM's spelling wherever vLLM has the flag (the older Prelude names still parse).
    for flag in ("--model", "--served-model-name", "--host", "--port", "--uds", "--api-key", "--dtype",
                 "--max-model-len", "--block-size", "--num-gpu-blocks-override", "--gpu-memory-utilization",
                 "--kv-cache-memory-bytes", "--enable-prefix-caching", "--max-num-seqs",
                 "--max-num-batched-tokens", "--scheduling-policy", "--enforce-eager", "--max-logprobs",
                 "--seed", "--disable-log-requests"):
        assert flag in text, flag
    assert build_parser().parse_args(["--num-kv-blocks", "8", "--kv-cache-memory", "1MiB"]).num_kv_blocks == 8


def test_port_in_use_is_one_line_and_exit_2():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        code, _, err = run_to_exit(["--port", str(port)])
        line = one_error_line(code, err)
        assert f"port {port}" in line and "already in use" in line and "--port" in line
        # With --log-level debug the traceback comes too, for whoever needs to see where.
        code, _, err = run_to_exit(["--port", str(port), "--log-level", "debug"])
        assert code == 2 and "Traceback" in err and "already in use" in err


def test_model_directory_without_tokenizer_is_one_line(tmp_path, demo_model):
    shutil.copy(demo_model / "config.json", tmp_path / "config.json")
    code, _, err = run_to_exit(["--model", str(tmp_path), *listen_on(tmp_path)])
    line = one_error_line(code, err)
    assert "no tokenizer.json" in line and "save_pretrained" in line


def test_max_model_len_past_the_models_positions_is_one_line(demo_model, tmp_path):
    """It was served without a word (positions the model never trained on, wrong outputs); as in
    vLLM it is refused, naming both values, unless the operator opts in through the environment."""
    env = {k: v for k, v in prelude_env().items() if k != ALLOW_LONG_MAX_MODEL_LEN_ENV}
    code, _, err = run_to_exit(["--model", str(demo_model), "--max-model-len", "8192", *listen_on(tmp_path)],
                               env=env)
    line = one_error_line(code, err)
    assert "--max-model-len 8192" in line and "max_position_embeddings (4096" in line
    assert ALLOW_LONG_MAX_MODEL_LEN_ENV + "=1" in line


def test_unreadable_model_files_are_one_line(tmp_path):
    (tmp_path / "config.json").mkdir()  # unreadable as a file, whoever runs the test (root included)
    code, _, err = run_to_exit(["--model", str(tmp_path), *listen_on(tmp_path)])
    assert "cannot read" in one_error_line(code, err)


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads any directory")
def test_unreadable_model_directory_is_one_line(tmp_path):
    model = tmp_path / "model"
    model.mkdir()
    model.chmod(0)
    try:
        code, _, err = run_to_exit(["--model", str(model), *listen_on(tmp_path)])
    finally:
        model.chmod(0o755)
    line = one_error_line(code, err)
    assert "permission denied" in line and "chmod" in line


@pytest.mark.slow  # builds the demo model, then starts two servers
def test_demo_model_serves_cold_then_warm(tmp_path):
    default_threads = torch.get_num_threads()
    for run, args, threads in (("cold", [], default_threads), ("warm", ["--cpu-threads", "1"], 1)):
        server = ServerProcess(args, env=prelude_env(tmp_path / "cache"), log_path=tmp_path / f"{run}.log", label=run)
        try:
            server.start(timeout=60)
            out = httpx.post(server.base_url + "/v1/completions",
                             json={"prompt": "Hello", "max_tokens": 3, "temperature": 0}).json()
            assert out["usage"]["completion_tokens"] == 3
            assert out["model"] == "prelude-demo"
        finally:
            exit_code = server.stop(timeout=20)  # SIGINT: the server's own clean shutdown
        assert exit_code == 0, log_tail(server.log_path)
        log = server.log_path.read_text()
        # Logged before /health answers 200, so before the first request, however quick the client
        assert log.index(f"Prelude {__version__} ready in ") < log.index("POST /v1/completions")
        banner = banner_lines(log)
        assert banner[0].startswith(f"Prelude {__version__} ready in ") and banner[0].endswith("s")
        fields = dict(line.split(None, 1) for line in banner[1:])
        demo_dir = tmp_path / "cache" / f"demo-v{VERSION}"
        assert fields["model"] == f"{demo_dir} (Qwen3ForCausalLM), served as prelude-demo"
        # The demo's bf16 weights, served in fp32, kept in bf16 by the native kernels (its head too
        # where AMX's tiles take a head's many rows).
        weights = ", weights bf16x2/bfloat16" if SPLIT_PRODUCTS else ", weights bf16x2" if built else ""
        assert fields["dtype"] == f"float32{weights} on cpu, {threads} compute thread{'' if threads == 1 else 's'}"
        assert fields["tokenizer"] == "fasttoken"
        assert fields["KV"].startswith("cache ") and "tokens" in fields["KV"] and "prefix caching on" in fields["KV"]
        assert fields["listening"] == server.base_url
        # Where startup went, phase by phase, in order from the process's start
        phases = [part.rsplit(" ", 1) for part in fields["startup"].split(", ")]
        assert [name for name, _ in phases] == ["python", "imports", "config and tokenizer",
                                                 "weights read and stored", "KV cache", "engine", "warm-up"]
        assert all(seconds.endswith("s") and float(seconds[:-1]) >= 0 for _, seconds in phases)
    assert (tmp_path / "cache" / f"demo-v{VERSION}" / "model.safetensors").is_file()


def banner_lines(log: str) -> list[str]:
    """The startup banner's block: its head line and the indented lines after it."""
    lines = log.splitlines()
    start = next(i for i, line in enumerate(lines) if " ready in " in line and "Prelude " in line)
    head = lines[start][lines[start].index("Prelude "):]
    block = []
    for line in lines[start + 1:]:
        if not line.startswith("  "):
            break
        block.append(line.strip())
    return [head] + block


def test_unsupported_architecture_is_a_clear_startup_error(tmp_path, demo_model):
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["GPT2LMHeadModel"]}))
    shutil.copy(demo_model / "tokenizer.json", tmp_path / "tokenizer.json")
    code, _, err = run_to_exit(["--model", str(tmp_path), *listen_on(tmp_path)])
    line = one_error_line(code, err)
    assert "GPT2LMHeadModel" in line and "Qwen3ForCausalLM" in line


def test_missing_model_directory_is_a_clear_startup_error(tmp_path):
    code, _, err = run_to_exit(["--model", str(tmp_path / "nope"), *listen_on(tmp_path)])
    assert "not a local directory" in one_error_line(code, err)
    # with --log-format json, one JSON line like every other (it was the plain text line)
    code, _, err = run_to_exit(["--model", str(tmp_path / "nope"), "--log-format", "json", *listen_on(tmp_path)])
    (line,) = err.strip().splitlines()
    record = json.loads(line)
    assert code == 2 and record["level"] == "ERROR" and "not a local directory" in record["message"]


def test_a_damaged_optional_json_file_is_a_clear_startup_error(tmp_path, demo_model):
    """generation_config.json, tokenizer_config.json and the rest failed with a JSONDecodeError
    traceback from the loader (exit 1)."""
    model = tmp_path / "model"
    shutil.copytree(demo_model, model)
    (model / "generation_config.json").write_text('{"eos_token_id": [1,')
    code, _, err = run_to_exit(["--model", str(model), *listen_on(tmp_path)])
    assert "generation_config.json is not valid JSON" in one_error_line(code, err)


def test_a_kv_cache_larger_than_the_host_is_a_clear_startup_error(tmp_path):
    """Its pages are mapped as first used: it failed with an mmap traceback, or started and was
    killed for memory once the prefix cache filled it."""
    code, _, err = run_to_exit(["--kv-cache-memory-bytes", "100TiB", *listen_on(tmp_path)])
    assert "larger than this host's memory" in err.strip().splitlines()[-1] and code == 2, err
    assert "Traceback" not in err


def test_bad_flag_value_names_the_flag():
    code, _, err = run_to_exit(["--max-num-seqs", "0"])
    assert code == 2 and "--max-num-seqs" in err


@pytest.mark.parametrize("args,expected", [
    (["--num-gpu-blocks-override", "0"], "error: --num-gpu-blocks-override must be positive"),
    (["--num-kv-blocks=0"], "error: --num-kv-blocks must be positive"),
    (["--kv-cache-memory-bytes", "0"], "error: --kv-cache-memory-bytes must be positive"),
    (["--keep-alive-timeout", "0"], "error: --keep-alive-timeout must be positive"),
    (["--kv-cache-memory-bytes", "12XB"], "not a byte size: '12XB'"),
    (["--max-request-bytes", "lots"], "not a byte size: 'lots'"),
])
def test_bad_flag_value_is_named_as_typed(args, expected):
    """An error names the flag the operator typed (the field's older alias, --num-kv-blocks, was
    named for --num-gpu-blocks-override) and a bad byte size says what it expects (argparse said
    "invalid parse_bytes value")."""
    code, _, err = run_to_exit(args)
    assert code == 2 and expected in err, err
    assert "parse_bytes" not in err


@pytest.mark.parametrize("executor", ["model", "null"])
def test_startup_loads_no_library_that_only_some_requests_need(demo_model, executor):
    """The chat template's compiler (jinja2) and the grammar library (llguidance) load when a
    request first needs them: 25 ms of every start, which a server of decisions never spends. A
    decoder the native kernels run whole is served without torch (executor.host_runner), which
    loads with the first request whose heads need it: ~1 s and ~190 MiB of every start. The
    benchmarks' null executor runs on the same runner, so it measures the same server."""
    script = ("import sys; from prelude.app.assembly import build; from prelude.contract.config import Config; "
              f"build(Config(model={str(demo_model)!r}, executor={executor!r}));"
              "print(sorted(m for m in ('jinja2', 'llguidance', 'torch') if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", script], env=prelude_env(), capture_output=True, text=True,
                          timeout=60, check=False)
    assert done.stdout.strip().splitlines()[-1:] == ["[]"], done.stderr
