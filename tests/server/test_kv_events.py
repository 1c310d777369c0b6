"""KV-cache events end to end: a real server on loopback with --kv-events-config, real requests
over HTTP, and a real ZMQ SUB socket decoding every batch with msgspec structs shaped like
vLLM's. The index the subscriber builds from the events alone must equal the pool's cached
blocks (hash, parent hash, tokens), sequence numbers run 0, 1, 2, ... without gaps, the replay
socket returns the same batches, and POST /reset_prefix_cache arrives as AllBlocksCleared."""
from __future__ import annotations

import time

import httpx
import msgspec
import pytest

zmq = pytest.importorskip("zmq", reason="pyzmq is not installed (pip install 'prelude[kv-events]')")

from bench.serving.core.server import free_port  # noqa: E402
from prelude.contract.config import Config  # noqa: E402
from prelude.contract.kv_events import KVEventsConfig  # noqa: E402
from prelude.app.preflight import StartupError  # noqa: E402
from tests.kv_wire import Index, MapBatch  # noqa: E402
from tests.server.harness import ServerThread  # noqa: E402

BS = 4
TOPIC = "kv-events"


def receive(sub, quiet: float = 0.5) -> list[tuple[int, bytes]]:
    """Every (seq, payload) that arrives until nothing has for `quiet` seconds."""
    out = []
    while sub.poll(int(quiet * 1000)):
        topic, seq, payload = sub.recv_multipart()
        assert topic == TOPIC.encode()
        out.append((int.from_bytes(seq, "big"), payload))
    return out


def _server_on_free_ports(demo_model) -> tuple[ServerThread, int, int]:
    """A server publishing on two TCP ports found free (vLLM's endpoint shapes: a wildcard PUB
    address binds; the replay ROUTER always binds), built again on others when one was taken by
    the time it bound (a StartupError naming it)."""
    for attempt in range(3):
        port, replay_port = free_port(), free_port()
        kv = KVEventsConfig(enable_kv_cache_events=True, endpoint=f"tcp://*:{port}",
                            replay_endpoint=f"tcp://127.0.0.1:{replay_port}", topic=TOPIC)
        # 48 blocks of 4 tokens: the prompts below overflow it, so the cache evicts.
        config = Config(model=str(demo_model), block_size=BS, num_kv_blocks=48, max_model_len=256,
                        kv_events_config=kv)
        try:
            return ServerThread(config), port, replay_port
        except StartupError as exc:
            if "in use" not in str(exc) or attempt == 2:
                raise
    raise AssertionError("unreachable")


@pytest.fixture(scope="module")
def events_server(demo_model):
    server, port, replay_port = _server_on_free_ports(demo_model)
    ctx = zmq.Context()
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt_string(zmq.SUBSCRIBE, TOPIC)
    with server:
        sub.connect(f"tcp://127.0.0.1:{port}")
        time.sleep(0.5)  # a PUB drops what it sends before the subscription reaches it
        yield server, sub, ctx, replay_port
    sub.close(0)
    ctx.term()


def test_a_subscriber_rebuilds_the_pools_cache_from_the_events(events_server):
    server, sub, ctx, replay_port = events_server
    system = "You are a careful assistant. Answer yes or no, then one reason. " * 2
    prompts = [system + f"Question {i}: is {i} a prime number?" for i in range(6)]
    prompts += [f"Unrelated prompt number {i} about the weather in city {i * 7}." for i in range(12)]
    with httpx.Client(base_url=server.base_url, timeout=60) as http:
        for prompt in prompts:
            r = http.post("/v1/completions", json={"model": server.served.name, "prompt": prompt, "max_tokens": 3})
            assert r.status_code == 200, r.text
        prompt_ids = [http.post("/tokenize", json={"prompt": p}).json()["tokens"] for p in prompts]
    server.wait_idle()
    received = receive(sub)
    assert [seq for seq, _ in received] == list(range(len(received))), "a gap or reorder in sequence numbers"
    index = Index(BS)
    kinds = set()
    for _, payload in received:
        batch = msgspec.msgpack.decode(payload, type=MapBatch)
        assert batch.data_parallel_rank == 0 and abs(batch.ts - time.time()) < 120
        for event in batch.events:
            kinds.add(type(event).__name__)
            if hasattr(event, "block_size"):
                assert event.block_size == BS and event.medium == "CPU"
                assert len(event.token_ids) == BS * len(event.block_hashes)
        index.apply(batch.events)
    assert kinds == {"MapStored", "MapRemoved"}, "the prompts should both fill and overflow the cache"
    cached = server.on_loop(lambda: server.engine.scheduler.pool.cached_by_hash())
    assert cached and index.blocks == cached
    # Every chain the subscriber holds spells out, from the root, the start of a prompt sent
    # (a chain may run on into the generated tokens, which are cached too).
    for h in index.blocks:
        chain: list[int] = []
        while h is not None:
            parent, tokens = index.blocks[h]
            chain[:0] = tokens
            h = parent
        assert any(chain[:len(ids)] == ids[:len(chain)] for ids in prompt_ids), chain

    # Replay from sequence 0 returns the very payloads the PUB socket sent. (A DEALER, not a
    # REQ: one request gets many replies, each framed [empty, seq, payload], then the end marker.)
    dealer = ctx.socket(zmq.DEALER)
    dealer.connect(f"tcp://127.0.0.1:{replay_port}")
    dealer.send_multipart((b"", (0).to_bytes(8, "big")))
    replayed = []
    while dealer.poll(5000):
        _, seq, payload = dealer.recv_multipart()
        if seq == (-1).to_bytes(8, "big", signed=True):
            break
        replayed.append((int.from_bytes(seq, "big"), payload))
    dealer.close(0)
    assert replayed == received

    # vLLM's reset route clears the cache and says so in one event.
    with httpx.Client(base_url=server.base_url, timeout=30) as http:
        assert http.post("/reset_prefix_cache").status_code == 200
    [(seq, payload)] = receive(sub)
    assert seq == len(received)
    assert [type(e).__name__ for e in msgspec.msgpack.decode(payload, type=MapBatch).events] == ["MapCleared"]
    assert server.on_loop(lambda: server.engine.scheduler.pool.cached_by_hash()) == {}
