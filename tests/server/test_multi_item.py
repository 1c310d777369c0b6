"""Multi-item scoring: a query and N items in ONE masked forward give the scores of N separate
query+item rows (fp32 tolerance), reuse a cached query prefix, and are used by default only
when the items are short relative to the query."""
from __future__ import annotations

import random

import httpx
import pytest

from prelude.contract.config import Config
from tests.server.harness import ServerThread

LABELS = [5, 9, 33]


@pytest.fixture(scope="module")
def srv(demo_model):
    with ServerThread(Config(model=str(demo_model), num_kv_blocks=512, block_size=16)) as server:
        yield server


def _ids(rng: random.Random, n: int) -> list[int]:
    return [rng.randrange(3, 500) for _ in range(n)]


def _score(srv, **body) -> httpx.Response:
    return httpx.post(srv.base_url + "/v1/score", json={"label_token_ids": LABELS, **body}, timeout=60)


def _rows_and_tokens(srv) -> tuple[int, int]:
    stats = srv.engine.scheduler.stats
    return srv.on_loop(lambda: (stats.num_oneshot_rows, stats.prefill_tokens))


@pytest.mark.parametrize("apply_softmax", [False, True])
def test_one_forward_equals_one_row_per_item(srv, apply_softmax):
    rng = random.Random(int(apply_softmax))
    query = _ids(rng, 70)
    items = [_ids(rng, rng.randrange(1, 14)) for _ in range(12)]
    before = _rows_and_tokens(srv)
    multi = _score(srv, query=query, items=items, apply_softmax=apply_softmax, multi_item=True).json()["scores"]
    after = _rows_and_tokens(srv)
    assert after[0] - before[0] == 1  # one row for all twelve items
    single = _score(srv, query=query, items=items, apply_softmax=apply_softmax, multi_item=False).json()["scores"]
    for got, want in zip(multi, single):
        assert got == pytest.approx(want, abs=1e-5)


def test_a_cached_query_prefix_is_reused(srv):
    rng = random.Random(7)
    query = _ids(rng, 64)  # four full blocks of 16
    _score(srv, query=query, items=[_ids(rng, 5), _ids(rng, 5)])
    items = [_ids(rng, 4) for _ in range(3)]
    before = _rows_and_tokens(srv)
    cached = _score(srv, query=query, items=items).json()["scores"]
    after = _rows_and_tokens(srv)
    assert after[1] - before[1] == 3 * 4  # the query came from the cache: only the items ran
    fresh = _score(srv, query=query, items=items, multi_item=False).json()["scores"]
    for got, want in zip(cached, fresh):
        assert got == pytest.approx(want, abs=1e-5)


def test_long_items_go_one_row_each_by_default(srv):
    rng = random.Random(3)
    before = _rows_and_tokens(srv)
    _score(srv, query=_ids(rng, 8), items=[_ids(rng, 20) for _ in range(3)])
    assert _rows_and_tokens(srv)[0] - before[0] == 3


def test_text_query_and_items(srv):
    out = _score(srv, query="Is the following answer correct? The answer is", items=[" yes", " no", " maybe"])
    assert out.status_code == 200 and len(out.json()["scores"]) == 3
    srv.wait_idle()


def test_the_default_choice_never_changes_a_text_items_score(srv):
    """Apart, "Item: " then "tent" are other tokens than "Item: tent" joined (the space goes
    with "tent"): packed by default, an item's score moved when a long item joined the request (a
    long item sends all rows one by one). Packing by default only where the tokens agree; asked
    for, it tokenizes apart, as SGLang's multi-item scoring does."""
    query = "Will the user like this item? Item: "
    tokenize = lambda text, special: httpx.post(srv.base_url + "/tokenize", json={  # noqa: E731
        "prompt": text, "add_special_tokens": special}).json()["tokens"]
    assert tokenize(query + "tent", True) != tokenize(query, True) + tokenize("tent", False)
    alone = _score(srv, query=query, items=["tent"]).json()["scores"][0]
    beside_short = _score(srv, query=query, items=["tent", "x"]).json()["scores"][0]
    beside_long = _score(srv, query=query, items=["tent", "x" * 80]).json()["scores"][0]
    assert beside_short == pytest.approx(alone, abs=1e-6) and beside_long == pytest.approx(alone, abs=1e-6)
    clean = "Will the user like this item?\n"  # a boundary the tokens agree on: packed
    before = _rows_and_tokens(srv)
    _score(srv, query=clean, items=["tent", "x"])
    rows = _rows_and_tokens(srv)[0] - before[0]
    if tokenize(clean + "x", True) == tokenize(clean, True) + tokenize("x", False):
        assert rows == 1


def test_items_too_long_to_pack_go_one_row_each(srv):
    """Packed by default, items count together against the context; one row each, only query +
    item must fit. Items that fit apart but not together are scored apart, not refused with a
    400 about a prompt the client never sent."""
    rng = random.Random(11)
    limit = srv.served.max_model_len
    query = _ids(rng, limit // 2)
    items = [_ids(rng, limit // 3) for _ in range(3)]  # each shorter than the query: packing's default
    before = _rows_and_tokens(srv)
    response = _score(srv, query=query, items=items)
    assert response.status_code == 200, response.text
    assert _rows_and_tokens(srv)[0] - before[0] == 3
    apart = _score(srv, query=query, items=items, multi_item=False).json()["scores"]
    for got, want in zip(response.json()["scores"], apart):
        assert got == pytest.approx(want, abs=1e-5)
    # Asked for, as one row each too: the 400 named a packed prompt the client never sent.
    before = _rows_and_tokens(srv)
    forced = _score(srv, query=query, items=items, multi_item=True)
    assert forced.status_code == 200 and _rows_and_tokens(srv)[0] - before[0] == 3
    assert _flat(forced.json()["scores"]) == pytest.approx(_flat(response.json()["scores"]), abs=1e-5)


@pytest.mark.parametrize("flag", ["disable_oneshot", "multi_item_scoring"])
def test_a_server_that_cannot_pack_scores_forced_multi_item_as_one_that_can(srv, demo_model, flag):
    """multi_item true tokenizes query and items apart (SGLang's multi-item scoring): a server that
    does not pack (--disable-oneshot, --no-multi-item-scoring) scored the joined text instead,
    and another probability, without a word."""
    query, items = "Will the user like this item? Item: ", ["tent", "a cookbook"]
    packed = _flat(_score(srv, query=query, items=items, multi_item=True).json()["scores"])
    joined = _flat(_score(srv, query=query, items=items, multi_item=False).json()["scores"])
    assert packed != pytest.approx(joined, abs=1e-4)  # the boundary tokenizes otherwise
    config = {"disable_oneshot": True} if flag == "disable_oneshot" else {"multi_item_scoring": False}
    with ServerThread(Config(model=str(demo_model), num_kv_blocks=512, block_size=16, **config)) as other:
        assert _flat(_score(other, query=query, items=items, multi_item=True).json()["scores"]) == \
            pytest.approx(packed, abs=1e-5)


def _flat(scores: list[list[float]]) -> list[float]:
    return [p for row in scores for p in row]
