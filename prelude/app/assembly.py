"""Assembly, the top layer: reads the Config and builds everything else (tokenizer, model,
runner and executors, KV cache, scheduler, engine, and the HTTP app), then serves it.
`python -m prelude` calls `serve`; tests and benchmarks call `build`."""
from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from prelude import __version__, tokenizer as tokenizers
from prelude.app.banner import Banner, process_age, tokenizer_text
from prelude.app.encoders import encoder_length, encoder_serving
from prelude.app.logs import batched_writer
from prelude.cache.block_pool import BlockPool
from prelude.cache.kv_events import KVEventLog
from prelude.contract.config import Config
from prelude.contract.kv_events import KVEventsConfig
from prelude.engine.engine import Engine
from prelude.engine.scheduler import Scheduler
from prelude.engine.scheduler_config import SchedulerConfig
from prelude.executor.executors import Executors
from prelude.host_tuning import freeze_startup_objects, keep_freed_memory, release_startup_memory
from prelude.model.config import ModelConfig, UnsupportedModel, sampling_defaults
from prelude.app.preflight import StartupError, check_model_dir, checked_max_model_len, listen_error
from prelude.app.runner_setup import null_runner_setup, served_runner_setup
from prelude.server.app import create_app, serve_app
from prelude.server.listen import bind
from prelude.server.served_model import ServedModel
from prelude.tokenizer.chat import ChatTemplate, special_token_text, tokenizer_config

logger = logging.getLogger(__name__)

def default_pooling(model_dir: Path, encoder: bool) -> str:
    """A sentence-transformers export says how it pools (modules.json -> Pooling config);
    otherwise an encoder pools its [CLS] token, as vLLM's BERT-family embedding models do (its
    last token is the closing [SEP]), and a decoder embedder (Qwen3-Embedding style) its last."""
    modules = model_dir / "modules.json"
    if modules.is_file():
        for module in json.loads(modules.read_text()):
            if module.get("type", "").endswith("Pooling"):
                pooling_config = model_dir / module.get("path", "") / "config.json"
                if pooling_config.is_file():
                    modes = json.loads(pooling_config.read_text())
                    for key, name in (("pooling_mode_lasttoken", "last"), ("pooling_mode_mean_tokens", "mean"),
                                      ("pooling_mode_cls_token", "cls")):
                        if modes.get(key):
                            return name
    return "cls" if encoder else "last"


def sentence_transformers_prompts(model_dir: Path) -> dict[str, str]:
    """The named prompts of a sentence-transformers export ("query": "query: " for e5-style
    models), from its config_sentence_transformers.json."""
    path = model_dir / "config_sentence_transformers.json"
    prompts = json.loads(path.read_text()).get("prompts") if path.is_file() else None
    return {str(name): text for name, text in (prompts or {}).items() if isinstance(text, str)}


def resolve_model_dir(config: Config) -> Path:
    if config.model is None:
        from prelude.demo import ensure_demo_model

        return ensure_demo_model()
    path = Path(config.model).expanduser()
    check_model_dir(path)
    return path


def _eos_ids(model_dir: Path, model_config: ModelConfig, tokenizer) -> tuple[int, ...]:
    ids = list(model_config.eos_token_ids)
    eos = special_token_text(tokenizer_config(model_dir).get("eos_token"))
    eos_id = tokenizer.token_to_id(eos) if eos else None
    if eos_id is not None:
        ids.append(eos_id)
    return tuple(dict.fromkeys(ids))


@dataclass(frozen=True, slots=True)
class Built:
    engine: Engine
    served: ServedModel
    device: str
    dtype: str
    num_blocks: int
    compute_threads: int
    config: Config  # the flags it runs under (an encoder's differ from the command line's)
    phases: tuple[tuple[str, float], ...] = ()  # build's: (phase, seconds)

    def banner(self, listen_url: str, seconds_to_ready: float,
               startup: tuple[tuple[str, float], ...] = ()) -> Banner:
        served, config = self.served, self.config
        tokenizer = tokenizer_text(served.tokenizer.backend, served.tokenizer.fallback_reason, config.tokenizer_backend)
        return Banner(__version__, str(served.path), served.name, served.config.architecture, self.dtype,
                      self.device, self.compute_threads, tokenizer,
                      served.kv_capacity_tokens, self.num_blocks, config.block_size, config.enable_prefix_caching,
                      listen_url, seconds_to_ready, startup)


def build(config: Config, on_ready: Callable[[], None] | None = None) -> Built:
    """The engine and what the server knows about the model, ready to serve (the engine warms
    the runner up when it starts, then calls `on_ready`). Problems an operator can fix raise
    StartupError."""
    start = time.perf_counter()
    keep_freed_memory()
    model_dir = resolve_model_dir(config)
    try:
        model_config = ModelConfig.from_dir(model_dir)
        config = encoder_serving(config, model_config)
        learned_positions = model_config.encoder is not None and model_config.encoder.learned_positions
        max_model_len = checked_max_model_len(config, model_config.max_position_embeddings, model_dir,
                                              learned_positions)
        max_model_len, truncate_at = encoder_length(config, model_config, model_dir, max_model_len)
        tokenizer = _load_tokenizer(model_dir, config.tokenizer_backend, truncate_at)
        eos_ids = _eos_ids(model_dir, model_config, tokenizer)
        tokenizer_done = time.perf_counter()
        if config.executor == "null":
            setup = null_runner_setup(config, model_config, eos_ids)
        else:
            setup = served_runner_setup(config, model_dir, model_config, max_model_len)
    except UnsupportedModel as exc:
        raise StartupError(str(exc)) from exc
    model_done = time.perf_counter()
    num_blocks = setup.num_blocks
    events = config.kv_events_config
    publishing = events is not None and events.active and config.enable_prefix_caching
    pool = BlockPool(num_blocks, config.block_size, config.enable_prefix_caching,
                     events=KVEventLog(config.block_size) if publishing else None)
    scheduler = Scheduler(SchedulerConfig.from_config(
        config, temp_bytes_per_token=setup.temp_bytes_per_token,
        temp_bytes_per_logits_row=2 * 4 * model_config.vocab_size,
        temp_memory_budget=setup.temp_budget, kv_capacity_tokens=num_blocks * config.block_size), pool)
    engine = Engine(scheduler, Executors.over(setup.runner), tokenizer, eos_ids, warmup=setup.runner.warmup,
                    kv_events=_kv_publisher(events, setup.device) if publishing and events else None,
                    on_ready=on_ready)
    served = ServedModel(config.model_name, model_dir, model_config, tokenizer, ChatTemplate.from_dir(model_dir),
                         max_model_len, num_blocks * config.block_size,
                         config.pooling or default_pooling(model_dir, model_config.encoder is not None),
                         multi_item_scoring=config.multi_item_scoring and setup.supports_items
                         and not config.disable_oneshot,
                         truncation_side=tokenizer_config(model_dir).get("truncation_side", "right"),
                         eos_token_ids=eos_ids, sampling_defaults=_sampling_defaults(config, model_dir),
                         sentence_transformers=(model_dir / "modules.json").is_file(),
                         aliases=config.served_model_aliases, prompts=sentence_transformers_prompts(model_dir),
                         dtype=setup.weights_dtype)
    done = time.perf_counter()
    logger.info("engine ready in %.2fs: %s, %d KV blocks of %d tokens, tokenizer %s",
                done - start, model_config.architecture, num_blocks, config.block_size, tokenizer.backend)
    # The runner's own phases where it timed them (weights, KV cache, on CUDA its init), else one.
    model_phases = setup.phases or (("model", model_done - tokenizer_done),)
    phases = (("config and tokenizer", tokenizer_done - start), *model_phases, ("engine", done - model_done))
    return Built(engine, served, setup.device, setup.dtype, num_blocks, setup.compute_threads, config, phases)


def _sampling_defaults(config: Config, model_dir: Path) -> dict[str, float]:
    """generation_config.json's sampling defaults under --generation-config auto, said once at
    startup as vLLM says it: a request that omits them does not sample at temperature 1."""
    defaults = sampling_defaults(model_dir) if config.generation_config == "auto" else {}
    if defaults:
        logger.info("default sampling parameters from the model's generation_config.json: %s "
                    "(--generation-config vllm for neutral defaults)",
                    ", ".join(f"{k}={v}" for k, v in defaults.items()))
    return defaults


def _kv_publisher(events: KVEventsConfig, device: str):
    """The ZMQ publisher; StartupError when pyzmq/msgspec are missing or the endpoint is taken."""
    from prelude.cache.kv_publisher import KVEventPublisher

    try:
        # vLLM names the tier the blocks live in; routers that track several tiers read it.
        publisher = KVEventPublisher(events, medium="GPU" if device.startswith("cuda") else "CPU")
    except ImportError as exc:
        raise StartupError(f"--kv-events-config needs pyzmq and msgspec ({exc}); "
                           "pip install 'prelude[kv-events]'") from exc
    except Exception as exc:  # zmq.ZMQError: address in use, bad endpoint
        raise StartupError(f"--kv-events-config: cannot open {events.endpoint}: {exc}") from exc
    logger.info("KV-cache events on %s (topic %r, %s encoding)", events.endpoint, events.topic, events.encoding)
    return publisher


def _load_tokenizer(model_dir: Path, backend: str, truncate_at: int | None = None):
    """The tokenizer, or a StartupError saying how to get one that loads."""
    from prelude.tokenizer.fast import UnsupportedTokenizer

    try:
        return tokenizers.load(model_dir, backend, truncate_at)
    except UnsupportedTokenizer as exc:
        raise StartupError(f"fasttoken does not support {model_dir / 'tokenizer.json'} ({exc}); use "
                           "--tokenizer-backend auto, which falls back to HF tokenizers") from exc
    except ImportError as exc:
        raise StartupError(f"fasttoken's extension is not built ({exc}); run `pip install -e .` to build it, "
                           "or use --tokenizer-backend auto") from exc
    except Exception as exc:  # noqa: BLE001 (HF tokenizers raises plain Exceptions for a file it cannot parse)
        raise StartupError(f"{model_dir / 'tokenizer.json'} cannot be read: {exc}") from exc


async def serve(config: Config, started: float | None = None) -> None:
    """Binds the listening address first (a port in use fails in a second), builds the engine,
    and serves until SIGTERM or SIGINT, then drains: new requests get 503 (Connection: close),
    in-flight ones get up to --shutdown-timeout to finish, and the server exits 0. A second
    signal exits at once. The banner is logged once the engine is warm, before /health answers
    200; `started` is when the process began (perf_counter), for its "ready in"."""
    started = time.perf_counter() if started is None else started
    age = process_age()
    born = started - (age - (time.perf_counter() - started) if age is not None else 0.0)
    try:
        listener = bind(config)
    except OSError as exc:
        raise listen_error(config, exc) from exc

    def announce() -> None:  # in the engine loop, once warm, before /health answers 200
        freeze_startup_objects()
        release_startup_memory()
        now = time.perf_counter()
        startup = (("python", started - born), ("imports", building - started), *built.phases,
                   ("warm-up", now - building - sum(seconds for _, seconds in built.phases)))
        logger.info(built.banner(listener.url, now - started, startup))

    building = time.perf_counter()
    try:
        built = build(config, on_ready=announce)
    except BaseException:
        listener.close()
        raise
    engine = built.engine
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    drained: list[asyncio.Task] = []

    async def drain() -> None:
        if not await engine.wait_idle(config.shutdown_timeout):
            logger.warning("shutdown timeout (%.1fs) reached with requests in flight: ending them",
                           config.shutdown_timeout)
            engine.end_all()
            await asyncio.sleep(0.1)  # their handlers write the error out before the server closes
        stop.set()

    def on_signal(name: str) -> None:
        if drained:
            logger.warning("%s again: exiting now", name)
            os._exit(0)
        logger.info("%s: draining (%d waiting, %d running; at most %gs)", name,
                    engine.snapshot().num_waiting, engine.snapshot().num_running, config.shutdown_timeout)
        engine.begin_drain()
        drained.append(loop.create_task(drain()))

    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, on_signal, sig.name)
    app = create_app(engine, built.served, built.config, batched_writer())
    server = asyncio.create_task(serve_app(app, config, shutdown_trigger=stop.wait, listener=listener))
    ready = asyncio.create_task(engine.wait_ready())
    await asyncio.wait({server, ready}, return_when=asyncio.FIRST_COMPLETED)
    if ready.done() and not ready.result():
        # The engine loop died warming up (its error is logged): this server would answer 503
        # forever, so it stops, and the process exits with the startup error status.
        stop.set()
        await server
        raise StartupError("the engine failed while warming up (the error is logged above)")
    ready.cancel()
    await server
