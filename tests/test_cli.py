"""`python -m prelude` as users run it: a separate process, the embedded demo model, real HTTP."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import httpx

from bench.serving.server import ServerProcess, free_port, log_tail, prelude_env
from prelude.demo import VERSION


def run_to_exit(args: list[str]) -> tuple[int, str]:
    """Runs `python -m prelude args` to its exit; returns the exit code and stdout + stderr."""
    done = subprocess.run([sys.executable, "-m", "prelude", *args], env=dict(os.environ),
                          capture_output=True, text=True, timeout=60, check=False)
    return done.returncode, done.stdout + done.stderr


def test_demo_model_serves_cold_then_warm(tmp_path):
    for run in ("cold", "warm"):
        server = ServerProcess(env=prelude_env(tmp_path / "cache"), log_path=tmp_path / f"{run}.log", label=run)
        try:
            server.start(timeout=60)
            out = httpx.post(server.base_url + "/v1/completions",
                             json={"prompt": "Hello", "max_tokens": 3, "temperature": 0}).json()
            assert out["usage"]["completion_tokens"] == 3
            assert out["model"] == "prelude-demo"
        finally:
            exit_code = server.stop(timeout=20)  # SIGINT: the server's own clean shutdown
        assert exit_code == 0, log_tail(server.log_path)
    assert (tmp_path / "cache" / f"demo-v{VERSION}" / "model.safetensors").is_file()


def test_unsupported_architecture_is_a_clear_startup_error(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["GPT2LMHeadModel"]}))
    code, output = run_to_exit(["--model", str(tmp_path), "--port", str(free_port())])
    assert code == 2
    assert "GPT2LMHeadModel" in output and "Qwen3ForCausalLM" in output


def test_missing_model_directory_is_a_clear_startup_error(tmp_path):
    code, output = run_to_exit(["--model", str(tmp_path / "nope"), "--port", str(free_port())])
    assert code == 2 and "not a local directory" in output


def test_bad_flag_value_names_the_flag():
    code, output = run_to_exit(["--max-num-seqs", "0"])
    assert code == 2 and "--max-num-seqs" in output
