"""The application: its endpoints and routes (server/routing.py), the plain ASGI layers around
them (request ids, the access log, auth, the overload gate), and serving it."""
from __future__ import annotations

import hmac
import logging
import time
from typing import Any, Awaitable, Callable

from starlette.middleware.cors import CORSMiddleware
from starlette.requests import Request as HTTPRequest
from starlette.responses import PlainTextResponse, Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from prelude import __version__
from prelude.contract.config import Config
from prelude.engine.engine import Engine
from prelude.server import access_log, http_server, metrics
from prelude.server.access_log import AccessLog
from prelude.server.admission import Admission
from prelude.server.errors import APIError, bad_request, model_not_found
from prelude.server.chat import ChatAPI
from prelude.server.compat import CompatAPI
from prelude.server.constraints import Grammars
from prelude.server.early_refusal import RefuseWhenFull
from prelude.server.http_server import ShutdownTrigger
from prelude.server.listen import Listener, bind
from prelude.server.protocol import scope_header
from prelude.server.completions import CompletionsAPI
from prelude.server.routing import Route, Router
from prelude.server.served_model import ServedModel
from prelude.server.answers import json_response
from prelude.server.serving import log_ignored_fields
from prelude.structured.compiler import GrammarCompiler

# Reachable without the API key: liveness and monitoring, as vLLM leaves them.
OPEN_PATHS = frozenset({"/health", "/ping", "/ready", "/version", "/metrics"})
TEI_ROOT = "/"  # a constant: the README's route check reads route paths out of this file
MODEL_CARDS = "/v1/models/"  # + a served name: OpenAI's models.retrieve


class BearerAuth:
    """Requires `Authorization: Bearer <key>` everywhere but OPEN_PATHS (plain ASGI: no per-request
    middleware objects). The scheme is case-insensitive (RFC 9110); the key is compared in
    constant time."""

    def __init__(self, app: ASGIApp, api_key: str):
        self.app = app
        self.expected = api_key.encode()

    def _authorized(self, scope: Scope) -> bool:
        given = scope_header(scope, b"authorization") or b""
        scheme, _, token = given.strip().partition(b" ")
        return scheme.lower() == b"bearer" and hmac.compare_digest(token.strip(), self.expected)

    def __call__(self, scope: Scope, receive: Receive, send: Send) -> Awaitable[None]:
        # A layer that only picks what runs returns that awaitable rather than awaiting it: no
        # frame of its own stays on the stack for the response's life, and a streamed response
        # resumes every frame on its stack at each token.
        if scope["type"] == "http" and scope["path"] not in OPEN_PATHS and not self._authorized(scope):
            error = APIError(401, "Invalid or missing API key (send 'Authorization: Bearer <key>').",
                             code="invalid_api_key", headers={"WWW-Authenticate": "Bearer"})
            return error.response()(scope, receive, send)
        return self.app(scope, receive, send)


class EchoRequestId:
    """Echoes a client's X-Request-Id on the response, as vLLM and most proxies do; the
    endpoints build their response ids on it (serving.new_id)."""

    def __init__(self, app: ASGIApp):
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        # The app's outermost layer: a coroutine function, from which servers (hypercorn, Ray
        # Serve's uvicorn lifespan) guess that the app is ASGI 3.
        given = scope_header(scope, b"x-request-id") if scope["type"] == "http" else None
        if given is None:
            await self.app(scope, receive, send)
            return

        async def send_with_id(message: Message) -> None:
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", []), (b"x-request-id", given)]}
            await send(message)

        await self.app(scope, receive, send_with_id)


def create_app(engine: Engine, served: ServedModel, config: Config,
               access_write: Callable[[Any], None] | None = None) -> ASGIApp:
    admission = Admission(served.tokenizer, config.tokenizer_workers, served.max_model_len,
                          served.kv_capacity_tokens, config.max_logprobs, config.disable_oneshot,
                          served.eos_token_ids, served.config.vocab_size, served.sampling_defaults)
    completions = CompletionsAPI(engine, admission, served, config.max_request_bytes, config.default_deadline_ms)
    chat = ChatAPI(engine, admission, served, config.max_request_bytes, config.default_deadline_ms)
    grammars = _grammars(served)
    completions.grammars = chat.grammars = grammars
    decision = CompatAPI(engine, admission, served, config.max_request_bytes, config.default_deadline_ms)

    # Liveness: one small response, built once, whatever else is in flight.
    alive, dead = Response(status_code=200), Response(status_code=503)

    async def health(_: HTTPRequest) -> Response:
        return alive if engine.healthy else dead

    async def ping(_: HTTPRequest) -> Response:
        return Response(status_code=200 if engine.healthy else 503)

    async def ready(_: HTTPRequest) -> Response:
        """Readiness, for routers, load balancers and Kubernetes readiness probes: 503 until the
        engine has warmed up, while the waiting queue is full, and while the server drains
        (liveness stays on /health)."""
        if not engine.healthy:
            return json_response({"status": "unhealthy"}, status=503)
        if not engine.ready:
            return json_response({"status": "warming_up"}, status=503)
        if engine.overloaded:
            return json_response({"status": "draining" if engine.draining else "overloaded"}, status=503)
        return json_response({"status": "ready"})

    async def reset_prefix_cache(_: HTTPRequest) -> Response:
        """vLLM's route: drops the idle cached blocks (publishing AllBlocksCleared when KV events
        are on); 409 while cached blocks are in use, so the caller retries once idle."""
        if engine.reset_prefix_cache():
            return Response(status_code=200)
        return APIError(409, "cached blocks are in use; retry when the server is idle").response()

    async def load(_: HTTPRequest) -> Response:
        """SGLang's worker load, which sglang-router's power_of_two policy polls (as one data-parallel
        rank): requests admitted and unfinished, the waiting ones, and tokens held (KV in use and
        prompts waiting). Without it every replica read as of unknown load, and the policy chose
        at random, a busy replica as often as an idle one."""
        now = engine.snapshot()
        return json_response([{"dp_rank": 0, "num_reqs": now.num_rows_running + now.num_waiting,
                               "num_waiting_reqs": now.num_waiting,
                               "num_tokens": now.kv_blocks_in_use * config.block_size + now.num_waiting_tokens}])

    # When the model was loaded, as vLLM reports it (0 read as 1970 in clients that show it).
    loaded_at = int(time.time())

    cards = {name: {"id": name, "object": "model", "created": loaded_at, "owned_by": "prelude",
                    "root": str(served.path), "parent": None, "max_model_len": served.max_model_len,
                    "capabilities": served.capabilities} for name in (served.name, *served.aliases)}

    async def models(_: HTTPRequest) -> Response:
        return json_response({"object": "list", "data": list(cards.values())})

    async def model_card(http: HTTPRequest) -> Response:  # OpenAI's GET /v1/models/{id} (models.retrieve)
        return json_response(cards[http.scope["path"].removeprefix(MODEL_CARDS)])

    # SGLang's worker discovery (sglang-router asks for it): the model's id, and where its
    # tokenizer lives, so a cache-aware router tokenizes as the worker does.
    info = {"model_path": str(served.path), "served_model_name": served.name, "tokenizer_path": str(served.path),
            "is_generation": served.has_lm_head, "architectures": [served.config.architecture],
            "max_model_len": served.max_model_len, "capabilities": served.capabilities}

    async def model_info(_: HTTPRequest) -> Response:
        return json_response(info)

    async def server_info(_: HTTPRequest) -> Response:
        # SGLang's names for the serving mode too, which only the startup banner said.
        return json_response({**info, "version": __version__, "context_length": served.max_model_len,
                              "max_total_num_tokens": served.kv_capacity_tokens,
                              "scheduling_policy": config.scheduling_policy, "dtype": served.dtype,
                              "quantization": None if config.quantization == "none" else config.quantization})

    async def version(_: HTTPRequest) -> Response:
        return json_response({"version": __version__})

    tei_info = decision.tei_info(__version__, config.max_num_batched_tokens, config.tokenizer_workers)

    async def tei_info_endpoint(_: HTTPRequest) -> Response:
        return json_response(tei_info)

    async def metrics_endpoint(_: HTTPRequest) -> Response:
        return PlainTextResponse(metrics.render(engine.snapshot(), served.name),
                                 media_type="text/plain; version=0.0.4")

    async def tokenize(http: HTTPRequest) -> Response:
        body = await completions.body(http)
        add_special = body.bool("add_special_tokens", True)
        if body.has("messages"):
            text = (await chat.chat_prompt.render(body)).text
            add_special = body.bool("add_special_tokens", False)
        else:
            text = body.str("prompt")
            if text is None:
                raise bad_request("'prompt' (a string) or 'messages' is required", "prompt")
        ids = await admission.encode(text, add_special)
        # vLLM's return_token_strs: each id's vocabulary string (convert_ids_to_tokens), else null
        strs = [served.tokenizer.id_to_token(i) for i in ids] if body.bool("return_token_strs") else None
        return json_response({"count": len(ids), "max_model_len": served.max_model_len, "tokens": ids,
                              "token_strs": strs})

    async def detokenize(http: HTTPRequest) -> Response:
        body = await completions.body(http)
        tokens = body.list("tokens")
        if tokens is None:
            raise bad_request("'tokens' is required", "tokens")
        ids = await admission.checked_ids(tokens, "tokens") if tokens else []  # no tokens: "", as vLLM
        return json_response({"prompt": await admission.decode(ids)})

    async def startup() -> None:
        await engine.start()

    async def shutdown() -> None:
        try:
            await engine.stop()
        finally:
            admission.close()
            if grammars is not None:
                grammars.close()

    # The routes that queue engine work: refused unread while the engine admits nothing, and
    # logging (at debug) the fields they ignored.
    work = [Route(path, log_ignored_fields(endpoint), ("POST",)) for path, endpoint in (
        ("/v1/completions", completions.completions), ("/v1/chat/completions", chat.chat),
        ("/v1/embeddings", decision.embeddings), ("/classify", decision.classify),
        ("/v1/classify", decision.classify), ("/pooling", decision.pooling), ("/score", decision.score),
        ("/v1/score", decision.score), ("/rerank", decision.rerank), ("/v1/rerank", decision.rerank),
        ("/embed", decision.tei_embed), ("/predict", decision.tei_predict),
        # TEI's inference route by model type, where its clients post (SageMaker's name too)
        (TEI_ROOT, decision.tei_inference), ("/invocations", decision.tei_inference),
        ("/v2/embed", decision.cohere_embed), ("/v2/rerank", decision.cohere_rerank))]
    router = Router([
        Route("/health", health, ("GET",)),
        Route("/info", tei_info_endpoint, ("GET",)),  # TEI's
        Route("/ping", ping, ("GET", "POST")),
        Route("/ready", ready, ("GET",)),
        Route("/version", version, ("GET",)),
        Route("/model_info", model_info, ("GET",)),
        Route("/get_model_info", model_info, ("GET",)),
        Route("/server_info", server_info, ("GET",)),
        Route("/get_server_info", server_info, ("GET",)),
        Route("/metrics", metrics_endpoint, ("GET",)),
        Route("/reset_prefix_cache", reset_prefix_cache, ("POST",)),
        Route("/flush_cache", reset_prefix_cache, ("GET", "POST")),  # SGLang's name (sglang-router's flush)
        Route("/get_load", load, ("GET",)),
        Route("/v1/models", models, ("GET",)),
        *(Route(MODEL_CARDS + name, model_card, ("GET",)) for name in cards),  # another id: 404
        *work,
        Route("/tokenize", tokenize, ("POST",)),
        Route("/detokenize", detokenize, ("POST",)),
    ], startup, shutdown, _unknown_model)
    outer: ASGIApp = RefuseWhenFull(router, engine, [(m, r.path) for r in work for m in r.methods])
    if config.api_key:
        outer = BearerAuth(outer, config.api_key)
    if config.allowed_origins:  # outside auth: a browser's preflight carries no key
        outer = CORSMiddleware(outer, allow_origins=config.allowed_origins, allow_methods=["*"], allow_headers=["*"])
    if not config.disable_log_requests and access_log.logger.isEnabledFor(logging.INFO):
        outer = AccessLog(outer, access_write)  # outside auth: refused keys are logged too
    return EchoRequestId(outer)


def _unknown_model(path: str) -> Response | None:
    """OpenAI's answer to models.retrieve of an id this server does not serve."""
    if not path.startswith(MODEL_CARDS):
        return None
    return model_not_found(path.removeprefix(MODEL_CARDS)).response()


async def serve_app(app: ASGIApp, config: Config, shutdown_trigger: ShutdownTrigger,
                    listener: Listener | None = None) -> None:
    """Serves `app` on `listener` (bound from the config when not given) until the trigger."""
    listener = listener or bind(config)
    try:
        await http_server.serve(app, listener, config, shutdown_trigger)
    finally:
        listener.cleanup()


def _grammars(served: ServedModel) -> Grammars | None:
    """Structured outputs' compiler for the served tokenizer (its tokenizer.json), with masks as
    wide as the model's logits; None for a model with no LM head."""
    tokenizer_json = served.path / "tokenizer.json"
    if not served.has_lm_head or not tokenizer_json.is_file():
        return None
    vocab = max(served.config.vocab_size, served.tokenizer.vocab_size)
    return Grammars(GrammarCompiler(tokenizer_json, vocab, served.eos_token_ids))
