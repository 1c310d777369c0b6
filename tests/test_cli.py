"""`python -m prelude` as users run it: a separate process, the embedded demo model, real HTTP."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import httpx

from prelude.demo import VERSION

from tests.server.harness import free_port


def start(args: list[str], env: dict) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "prelude", *args], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def wait_healthy(proc: subprocess.Popen, port: int, timeout: float = 60) -> float:
    began = time.monotonic()
    while time.monotonic() - began < timeout:
        assert proc.poll() is None, proc.stdout.read()
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=0.5).status_code == 200:
                return time.monotonic() - began
        except httpx.HTTPError:
            time.sleep(0.05)
    raise TimeoutError("server never became healthy")


def stop(proc: subprocess.Popen) -> str:
    proc.send_signal(signal.SIGINT)
    try:
        output, _ = proc.communicate(timeout=20)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        raise
    assert proc.returncode == 0, output
    return output


def test_demo_model_serves_cold_then_warm(tmp_path):
    env = dict(os.environ, PRELUDE_CACHE=str(tmp_path / "cache"))
    for _ in ("cold", "warm"):
        port = free_port()
        proc = start(["--port", str(port)], env)
        try:
            wait_healthy(proc, port)
            out = httpx.post(f"http://127.0.0.1:{port}/v1/completions",
                             json={"prompt": "Hello", "max_tokens": 3, "temperature": 0}).json()
            assert out["usage"]["completion_tokens"] == 3
            assert out["model"] == "prelude-demo"
        finally:
            stop(proc)
    assert (tmp_path / "cache" / f"demo-v{VERSION}" / "model.safetensors").is_file()


def test_unsupported_architecture_is_a_clear_startup_error(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["GPT2LMHeadModel"]}))
    proc = start(["--model", str(tmp_path), "--port", str(free_port())], dict(os.environ))
    output, _ = proc.communicate(timeout=60)
    assert proc.returncode == 2
    assert "GPT2LMHeadModel" in output and "Qwen3ForCausalLM" in output


def test_missing_model_directory_is_a_clear_startup_error(tmp_path):
    proc = start(["--model", str(tmp_path / "nope"), "--port", str(free_port())], dict(os.environ))
    output, _ = proc.communicate(timeout=60)
    assert proc.returncode == 2 and "not a local directory" in output


def test_bad_flag_value_names_the_flag():
    proc = start(["--max-num-seqs", "0"], dict(os.environ))
    output, _ = proc.communicate(timeout=60)
    assert proc.returncode == 2 and "--max-num-seqs" in output
