"""Command-line flags: vLLM's names, byte sizes, and errors that name the bad flag."""
from __future__ import annotations

import pytest

from prelude.app.cli import parse_args
from prelude.contract.config import ALLOW_LONG_MAX_MODEL_LEN_ENV, Config, parse_bytes


def test_flags_map_onto_config():
    config = parse_args(["--model", "/models/q/", "--max-num-seqs", "8", "--kv-cache-memory", "2GiB",
                         "--no-enable-prefix-caching", "--disable-oneshot", "--pooling", "mean"])
    assert config.model_name == "/models/q"
    assert (config.max_num_seqs, config.kv_cache_memory) == (8, 2 * 2**30)
    assert not config.enable_prefix_caching and config.disable_oneshot and config.pooling == "mean"
    assert parse_args([]) == Config()


def test_long_max_model_len_opt_in_comes_from_the_environment(monkeypatch):
    monkeypatch.delenv(ALLOW_LONG_MAX_MODEL_LEN_ENV, raising=False)
    assert not parse_args([]).allow_long_max_model_len
    for value, allowed in (("1", True), ("true", True), ("0", False)):
        monkeypatch.setenv(ALLOW_LONG_MAX_MODEL_LEN_ENV, value)
        assert parse_args([]).allow_long_max_model_len is allowed


@pytest.mark.parametrize("text,tokens", [("8192", 8192), ("32k", 32_000), ("32K", 32_768), ("25.6k", 25_600),
                                         ("1M", 2**20)])
def test_max_model_len_takes_vllms_human_readable_counts(text, tokens):
    assert parse_args(["--max-model-len", text]).max_model_len == tokens


def test_the_api_key_may_come_from_the_environment_as_in_vllm(monkeypatch):
    """VLLM_API_KEY was ignored: a deployment moved from vLLM served every client without a word."""
    for name in ("PRELUDE_API_KEY", "VLLM_API_KEY"):
        monkeypatch.delenv(name, raising=False)
    assert parse_args([]).api_key is None
    monkeypatch.setenv("VLLM_API_KEY", "from-vllm")
    assert parse_args([]).api_key == "from-vllm"
    monkeypatch.setenv("PRELUDE_API_KEY", "ours")
    assert parse_args([]).api_key == "ours" and parse_args(["--api-key", "flag"]).api_key == "flag"


@pytest.mark.parametrize("name", ["PRELUDE_API_KEY", "VLLM_API_KEY"])
def test_an_empty_api_key_in_the_environment_is_a_usage_error(monkeypatch, capsys, name):
    """An empty secret (a Kubernetes secret never filled) served every client without a word."""
    for variable in ("PRELUDE_API_KEY", "VLLM_API_KEY"):
        monkeypatch.delenv(variable, raising=False)
    monkeypatch.setenv(name, " ")
    with pytest.raises(SystemExit) as exited:
        parse_args([])
    assert exited.value.code == 2 and f"{name} is set but empty" in capsys.readouterr().err


@pytest.mark.parametrize("text,expected", [("512MB", 512 * 10**6), ("512MiB", 512 * 2**20), ("4gib", 4 * 2**30),
                                           ("1.5k", 1500), ("123", 123), ("7b", 7)])
def test_byte_sizes(text, expected):
    assert parse_bytes(text) == expected


@pytest.mark.parametrize("argv,flag", [
    (["--port", "0"], "--port"),
    (["--port", "70000"], "--port"),  # was served on 70000 - 65536, the banner saying 70000
    (["--num-kv-blocks", "0"], "--num-kv-blocks"),
    (["--max-model-len", "-5"], "--max-model-len"),
    (["--max-model-len", "32kb"], "--max-model-len"),
    (["--max-model-len", "1.5"], "--max-model-len"),
    (["--gpu-memory-utilization", "1.5"], "--gpu-memory-utilization"),
    (["--dtype", "int8"], "--dtype"),
    (["--pooling", "max"], "--pooling"),
    (["--max-logprobs", "-1"], "--max-logprobs"),
    (["--seed", "-1"], "--seed"),  # was a numpy traceback at startup
    (["--kv-cache-memory", "lots"], "--kv-cache-memory"),
    (["--api-key", ""], "--api-key"),
])
def test_bad_flag_is_a_usage_error_naming_it(argv, flag, capsys):
    with pytest.raises(SystemExit) as exit_info:
        parse_args(argv)
    assert exit_info.value.code == 2
    assert flag in capsys.readouterr().err
