"""The command line: vLLM's flag names where vLLM has the flag (uvicorn's `--uds`), every
default read from Config, every flag with a help line that states its default, in groups."""
from __future__ import annotations

import argparse
import json
import os
import re
import sys
from dataclasses import fields

from prelude import __version__
from prelude.contract.config import ALLOW_LONG_MAX_MODEL_LEN_ENV, CHOICES, Config, ConfigError, parse_bytes
from prelude.contract.kv_events import KVEventsConfig, KVEventsConfigError


class _HelpFormatter(argparse.HelpFormatter):
    """Appends '(default: X)' to a help line that does not already say its default; flags whose
    default is computed (None in Config) say in their own words what it is."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        if "default" in text or action.default in (None, argparse.SUPPRESS) or not action.option_strings:
            return text
        shown = "on" if action.default is True else "off" if action.default is False else "%(default)s"
        return f"{text} (default: {shown})"


def _choices(name: str) -> list[str]:
    return [c for c in CHOICES[name] if c is not None]


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="prelude", formatter_class=_HelpFormatter,
                                description="Prelude: an OpenAI-compatible LLM inference server for "
                                            "decision-style traffic. `python -m prelude` runs the same.")
    p.add_argument("--version", action="version", version=f"prelude {__version__}",
                   help="print the version and exit")
    d = Config()

    model = p.add_argument_group("model")
    model.add_argument("--model", metavar="DIR",
                       help="local Hugging Face-format model directory (default: the embedded demo model)")
    model.add_argument("--served-model-name", metavar="NAME", nargs="+",
                       help="the model name clients send (default: the --model path, or prelude-demo); with "
                            "several, clients may send any, and answers name the first (as vLLM's)")
    model.add_argument("--dtype", default=d.dtype, choices=_choices("dtype"),
                       help="weight and activation dtype; auto is bf16 on CUDA, fp32 on CPU; on the CPU a "
                            "model computes in fp32 and bfloat16 stores its weights in bf16 (multiplied in bf16 "
                            "where the CPU has AVX-512 BF16)")
    model.add_argument("--quantization", default=d.quantization, choices=_choices("quantization"),
                       help="int8: int8 weights (one scale per output channel, quantized at load) for a "
                            "decoder on the CPU; with AVX-512 VNNI, int8 products (activations per token)")
    model.add_argument("--device", default=d.device, choices=_choices("device"),
                       help="auto picks CUDA when available")
    model.add_argument("--max-model-len", type=_token_count, metavar="N",
                       help="prompt + output token limit, as vLLM reads it (32k: 32,000; 32K: 32,768) "
                            "(default: the model's max positions; more is refused unless "
                            f"{ALLOW_LONG_MAX_MODEL_LEN_ENV}=1)")
    model.add_argument("--tokenizer-backend", default=d.tokenizer_backend, choices=_choices("tokenizer_backend"),
                       help="auto: fasttoken, or HF tokenizers where fasttoken does not support the file")
    model.add_argument("--tokenizer-workers", type=int, default=d.tokenizer_workers, metavar="N",
                       help="threads tokenizing long prompts off the event loop")
    model.add_argument("--cpu-threads", type=int, metavar="N",
                       help="compute threads of the CPU executor (default: one per core)")
    model.add_argument("--pooling", choices=_choices("pooling"),
                       help="embedding pooling (default: the checkpoint's modules.json, else last; cls for encoders)")
    model.add_argument("--executor", default=d.executor, choices=_choices("executor"),
                       help="null: fixed logits, no model work (CPU-cost benchmarks)")
    model.add_argument("--enforce-eager", action="store_true", help="no CUDA graphs")
    model.add_argument("--seed", type=int, default=d.seed, help="seed of unseeded sampling")
    model.add_argument("--generation-config", default=d.generation_config, choices=_choices("generation_config"),
                       help="auto: generation_config.json's temperature, top_p, top_k, min_p and "
                            "repetition_penalty are the defaults of requests that omit them, its max_new_tokens "
                            "caps max_tokens; vllm: neutral defaults")

    server = p.add_argument_group("server")
    server.add_argument("--host", default=d.host, help="address to listen on (0.0.0.0: every interface)")
    server.add_argument("--port", type=int, default=d.port, help="TCP port to listen on")
    server.add_argument("--uds", metavar="PATH",
                        help="serve on this Unix domain socket instead of --host/--port (default: none)")
    server.add_argument("--api-key", metavar="KEY",
                        help="require 'Authorization: Bearer KEY' on every route except /health, /ping, "
                             "/ready, /version and /metrics (default: none)")
    server.add_argument("--allowed-origins", type=_origins, default=d.allowed_origins, metavar="JSON",
                        help="origins browser pages may call the API from (CORS), as vLLM's JSON list, e.g. "
                             "'[\"*\"]' or '[\"https://app.example\"]' (default: none)")
    server.add_argument("--backlog", type=int, default=d.backlog, metavar="N",
                        help="pending connections the listening socket queues")
    server.add_argument("--http-server", default=d.http_server, choices=_choices("http_server"),
                        help="the HTTP/1.1 server under the app: uvicorn (with httptools) costs the least "
                             "CPU per request; hypercorn as before")
    server.add_argument("--max-request-bytes", type=_bytes, default=d.max_request_bytes, metavar="BYTES",
                        help="largest request body, e.g. 32MiB; larger ones get 413 (default: 32MiB)")
    server.add_argument("--max-logprobs", type=int, default=d.max_logprobs, metavar="N",
                        help="largest logprobs / top_logprobs / prompt_logprobs a request may ask for")
    server.add_argument("--shutdown-timeout", type=float, default=d.shutdown_timeout, metavar="S",
                        help="seconds in-flight requests get to finish after SIGTERM/SIGINT")
    server.add_argument("--keep-alive-timeout", type=float, default=d.keep_alive_timeout, metavar="S",
                        help="seconds an idle keep-alive connection stays open; keep it above your clients' "
                             "and router's pool idle timeouts")

    cache = p.add_argument_group("cache")
    cache.add_argument("--block-size", type=int, default=d.block_size, metavar="N", help="tokens per KV block")
    cache.add_argument("--num-gpu-blocks-override", "--num-kv-blocks", dest="num_kv_blocks", type=int,
                       metavar="N", help="KV blocks, overriding the memory budget (default: from memory)")
    cache.add_argument("--gpu-memory-utilization", type=float, default=d.gpu_memory_utilization, metavar="F",
                       help="fraction of GPU memory for weights, activations and the KV cache")
    cache.add_argument("--kv-cache-memory-bytes", "--kv-cache-memory", dest="kv_cache_memory",
                       type=_bytes, metavar="BYTES",
                       help="KV cache size, e.g. 2GiB (default: 512MiB on CPU; on CUDA what "
                            "--gpu-memory-utilization leaves)")
    cache.add_argument("--enable-prefix-caching", action=argparse.BooleanOptionalAction,
                       default=d.enable_prefix_caching, help="block-level prefix cache")
    cache.add_argument("--kv-events-config", type=_kv_events_config, metavar="JSON",
                       help="publish KV-cache block stored/removed events over ZMQ in vLLM's wire format, "
                            "for KV-aware routers; vLLM's JSON, e.g. '{\"enable_kv_cache_events\": true, "
                            "\"endpoint\": \"tcp://*:5557\", \"topic\": \"kv-events\"}' (default: off)")

    sched = p.add_argument_group("scheduler")
    sched.add_argument("--max-num-seqs", type=int, default=d.max_num_seqs, metavar="N",
                       help="running Decode sequences")
    sched.add_argument("--max-num-batched-tokens", type=int, default=d.max_num_batched_tokens, metavar="N",
                       help="tokens per step (prefill chunks + decodes)")
    sched.add_argument("--scheduling-policy", default=d.scheduling_policy,
                       choices=_choices("scheduling_policy"),
                       help="waiting-queue order: fcfs; priority (the request's `priority`, lower first); "
                            "sjf (shortest uncached prompt first, with aging); edf (earliest deadline by "
                            "slack, sjf for requests without one)")
    sched.add_argument("--max-queued-requests", type=int, metavar="N",
                       help="waiting requests beyond which new ones get 503 + Retry-After "
                            "(default: 4 x --max-num-seqs)")
    sched.add_argument("--max-queued-tokens", type=int, metavar="N",
                       help="waiting prompt tokens beyond which new requests get 503 (default: 4 x the KV pool)")
    sched.add_argument("--default-deadline-ms", type=int, metavar="MS",
                       help="deadline for the first token / OneShot result of requests that set none "
                            "(X-Deadline-Ms header or deadline_ms field) (default: none)")
    sched.add_argument("--shed-late-requests", action="store_true",
                       help="answer a waiting request that can no longer meet its deadline with 503 "
                            "deadline_exceeded at once")
    sched.add_argument("--multi-item-scoring", action=argparse.BooleanOptionalAction,
                       default=d.multi_item_scoring,
                       help="/v1/score with several short items runs them in one masked forward "
                            "(per request: \"multi_item\": true/false)")
    sched.add_argument("--layer-preemption", action=argparse.BooleanOptionalAction, default=d.layer_preemption,
                       help="a long OneShot step steps aside while short requests wait")
    sched.add_argument("--disable-oneshot", action="store_true",
                       help="ablation: run OneShot work through the Decode lifecycle")

    logs = p.add_argument_group("logging")
    logs.add_argument("--log-level", default=d.log_level, choices=_choices("log_level"),
                      help="debug also prints tracebacks of startup errors")
    logs.add_argument("--log-format", default=d.log_format, choices=_choices("log_format"),
                      help="json: one JSON object per line (access-log fields as keys)")
    logs.add_argument("--disable-log-requests", action="store_true",
                      help="no access-log line per request")
    return p


def _kv_events_config(text: str) -> KVEventsConfig:
    try:
        return KVEventsConfig.from_json(text)
    except KVEventsConfigError as exc:
        raise argparse.ArgumentTypeError(str(exc).removeprefix("--kv-events-config: ")) from exc


def _origins(text: str) -> tuple[str, ...]:
    """vLLM's JSON list; a bare origin (not JSON) is read as a list of one."""
    try:
        value = json.loads(text)
    except ValueError:
        value = [text]
    if not isinstance(value, list) or not all(isinstance(o, str) and o.strip() for o in value) or not value:
        raise argparse.ArgumentTypeError("expected a JSON list of origins, e.g. '[\"*\"]'")
    return tuple(value)


_COUNT = re.compile(r"(\d+)|(\d+(?:\.\d+)?)([kmg])|(\d+)([KMG])")


def _token_count(text: str) -> int:
    """vLLM's human-readable counts: a lower-case k, m, g multiplies by powers of 1,000 (a
    fraction allowed: 25.6k), an upper-case one by powers of 1,024; a plain count is a whole
    number. A launch script's "32k" was refused."""
    match = _COUNT.fullmatch(text.strip())
    if match is None:
        raise argparse.ArgumentTypeError(f"not a token count: {text!r} (examples: 8192, 32k, 32K)")
    plain, decimal, prefix, binary, binary_prefix = match.groups()
    if plain is not None:
        return int(plain)
    if binary is not None:
        return int(binary) * 1024 ** " KMG".index(binary_prefix)
    return int(float(decimal) * 1000 ** " kmg".index(prefix))


def _bytes(text: str) -> int:
    """parse_bytes with its own message: argparse words a ValueError after the function's name,
    "invalid parse_bytes value: '12XB'"."""
    try:
        return parse_bytes(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from exc


def _as_typed(message: str, parser: argparse.ArgumentParser, argv: list[str]) -> str:
    """A ConfigError names a flag after its Config field (--num-kv-blocks, --kv-cache-memory,
    the older aliases); name it as the command line gave it, else by its first (vLLM's) name,
    so that `--num-gpu-blocks-override 0` is not answered about a flag nobody typed."""
    for action in parser._actions:
        field_flag = "--" + action.dest.replace("_", "-")
        if len(action.option_strings) < 2 or not message.startswith(field_flag + " "):
            continue
        typed = [o for o in action.option_strings if any(a == o or a.startswith(o + "=") for a in argv)]
        return (typed[-1] if typed else action.option_strings[0]) + message[len(field_flag):]
    return message


def parse_args(argv: list[str] | None = None) -> Config:
    parser = build_parser()
    argv = sys.argv[1:] if argv is None else argv
    args = parser.parse_args(argv)
    names = {f.name for f in fields(Config)}
    values = {k: v for k, v in vars(args).items() if k in names}
    served_names = values.pop("served_model_name") or [None]
    values["served_model_name"], values["served_model_aliases"] = served_names[0], tuple(served_names[1:])
    if values["api_key"] is None:  # vLLM's variable too: a key kept off the command line (ps shows it)
        name = next((n for n in ("PRELUDE_API_KEY", "VLLM_API_KEY") if n in os.environ), None)
        if name is not None and not os.environ[name].strip():
            # An empty secret turned authentication off without a word, as an empty --api-key would.
            parser.error(f"{name} is set but empty (unset it for no authentication)")
        values["api_key"] = os.environ[name] if name is not None else None
    # An environment variable, not a flag, as vLLM's opt-in is.
    values["allow_long_max_model_len"] = os.environ.get(ALLOW_LONG_MAX_MODEL_LEN_ENV, "0").strip().lower() in (
        "1", "true")
    try:
        return Config(**values)
    except ConfigError as exc:
        parser.error(_as_typed(str(exc), parser, argv))
