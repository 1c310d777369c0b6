"""Property-based fuzzing of every POST endpoint over real HTTP, against the demo-model server.

Bodies start valid and get mutated (wrong types, extreme numbers, unicode edge cases, 10,000-deep
nesting, duplicate keys, unknown keys), or are not JSON at all. For every example: no 5xx, every
4xx is an OpenAI-style error object, /health stays 200, and well-formed requests sent at the same
time get, promptly, exactly the answers they get alone.

The "ci" profile keeps this bounded and seeded; PRELUDE_FUZZ_EXAMPLES=300 runs longer locally."""
from __future__ import annotations

import copy
import json
import os
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

settings.register_profile(
    "ci", derandomize=True, database=None, deadline=None,
    max_examples=int(os.environ.get("PRELUDE_FUZZ_EXAMPLES", "100")),
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
FUZZ = settings.get_profile("ci")

# Hypothesis imports libcst to report a failure; libcst's DeprecationWarning would turn that
# report into a pytest INTERNALERROR under this project's filterwarnings = error.
pytestmark = pytest.mark.filterwarnings(
    "ignore:mypy_extensions.TypedDict is deprecated:DeprecationWarning")

TRIED: Counter[str] = Counter()  # requests sent, per test: reported when the module ends
DEEP = 10_000
STALL_S = 5.0  # an exchange takes tens of ms; one this slow means the event loop was blocked
JSON = "application/json"


class Case:
    """One request to send; its repr (in failure reports) shows at most 300 bytes of the body."""

    def __init__(self, path: str, body: bytes, content_type: str | None = JSON):
        self.path, self.body, self.content_type = path, body, content_type

    def __repr__(self) -> str:
        more = f"...<{len(self.body)} bytes>" if len(self.body) > 300 else ""
        return f"Case({self.path!r}, {self.body[:300]!r}{more}, {self.content_type!r})"


@dataclass(frozen=True)
class Raw:
    """JSON text spliced in verbatim: what json.dumps cannot write (lone surrogates, NaN, huge
    literals, nesting deep enough to make json.dumps recurse out)."""
    text: str


@dataclass(frozen=True)
class Dup:
    """A key written twice in its object, with these two values."""
    first: object
    second: object


def _spread(value) -> list:
    """The values a key is written with, in order (a key duplicated twice is a Dup in a Dup)."""
    return _spread(value.first) + _spread(value.second) if isinstance(value, Dup) else [value]


def encode(value, ensure_ascii: bool = True) -> str:
    if isinstance(value, Raw):
        return value.text
    if isinstance(value, dict):
        pairs = [(k, w) for k, v in value.items() for w in _spread(v)]
        return "{" + ",".join(f"{encode(k, ensure_ascii)}:{encode(w, ensure_ascii)}"
                              for k, w in pairs) + "}"
    if isinstance(value, list):
        return "[" + ",".join(encode(v, ensure_ascii) for v in value) + "]"
    return json.dumps(value, ensure_ascii=ensure_ascii)


# -- values ------------------------------------------------------------------------------------
BEYOND_INT64 = [2**63, 2**64, 10**30, -(2**63) - 1, 10**400]  # 10**400: float() overflows
EXTREME_NUMBERS = [*BEYOND_INT64, 2**63 - 1, -(2**63), 0, -1, 1,
                   1e308, -1e308, 1e-300, -1e-300, 0.0, -0.0, 0.5, 4.0]
RAW_VALUES = [Raw('"\\ud800x"'), Raw('"a\\udc00"'), Raw('"\\udbff\\udbff"'), Raw("NaN"),
              Raw("Infinity"), Raw("-Infinity"), Raw("1e400"), Raw("-1e400"), Raw("1.5e-400"),
              Raw("1" * 5000), Raw("[" * DEEP + "]" * DEEP), Raw('{"a":' * DEEP + "1" + "}" * DEEP)]
EDGE_STRINGS = ["", "\x00", "a\x00b", "\U0001f99c", "\u202eevil\u202c", "\u200f", "\ufeff",
                "e\u0301", "\U0010ffff", "\uffff", "<|im_start|>", "<|endoftext|>", "{{ 7 * 7 }}",
                "{% for %}", "\\", "a" * 4000, "\U0001f99c" * 1000, "\n" * 200, " ", "1", "1e308"]
WRONG_TYPES = [None, True, False, [], {}, [1, 2], ["a"], [[1]], [None], [{}], {"a": 1},
               {"text": "x"}, [{"role": "user", "content": "x"}], [{"type": "text", "text": "x"}]]
scalars = st.one_of(
    st.sampled_from(EXTREME_NUMBERS + RAW_VALUES + EDGE_STRINGS + WRONG_TYPES),
    st.integers(), st.floats(allow_nan=False, allow_infinity=False), st.text(max_size=12),
    st.lists(st.integers(-2, 3000), max_size=4))  # token-id-like, some beyond the vocabulary
values = st.recursive(
    scalars, lambda inner: st.lists(inner, max_size=3)
    | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=6).map(copy.deepcopy)  # mutations must not edit the shared constants above

# Every field some endpoint reads, so that inserted keys reach validation; plus unknown keys.
FIELDS = """model prompt messages input max_tokens max_completion_tokens temperature top_p top_k
    seed n best_of stop stop_token_ids logprobs top_logprobs prompt_logprobs echo stream
    stream_options include_usage logit_bias allowed_token_ids guided_choice structured_outputs
    choice ignore_eos skip_special_tokens chat_template_kwargs add_generation_prompt
    add_special_tokens tools suffix encoding_format dimensions normalize label_token_ids
    apply_softmax item_first query items documents text_1 text_2 instruction top_n
    return_documents tokens presence_penalty min_tokens role content text""".split()
keys = st.sampled_from(FIELDS) | st.text(max_size=8)

# -- valid starting points, one or two per endpoint (generation kept to <= 4 tokens) -----------
CHAT = [{"role": "system", "content": "Be brief."},
        {"role": "user", "content": [{"type": "text", "text": "Hi"}]}]
BASES = [
    ("/v1/completions", {"prompt": ["Hello there", [5, 6, 7]], "max_tokens": 4, "temperature": 0,
                         "logprobs": 2, "stop": ["\n"]}),
    ("/v1/completions", {"prompt": "Is it?", "max_tokens": 1, "logit_bias": {"5": 1.5}, "seed": 3}),
    ("/v1/chat/completions", {"messages": CHAT, "max_tokens": 4, "temperature": 0.7, "top_p": 0.9,
                              "top_k": 5, "seed": 1, "logprobs": True, "top_logprobs": 2}),
    ("/v1/embeddings", {"input": ["first text", [9, 10]], "dimensions": 8}),
    ("/v1/classify", {"input": ["great product", "awful"]}),
    ("/pooling", {"input": "a reply to grade", "normalize": True}),
    ("/v1/score", {"text_1": "what is a KV cache?", "text_2": ["paged attention", "a soup"]}),
    ("/v1/score", {"query": "Will the user like it? ", "items": ["a", "b"],
                   "label_token_ids": [311, 324], "apply_softmax": True}),
    ("/v1/rerank", {"query": "kv cache", "documents": ["paged attention", {"text": "soup"}],
                    "top_n": 1}),
    ("/tokenize", {"prompt": "Hello world", "add_special_tokens": True}),
    ("/tokenize", {"messages": CHAT, "chat_template_kwargs": {"enable_thinking": False}}),
    ("/detokenize", {"tokens": [1, 2, 3]}),
]
GENERATES = {"/v1/completions", "/v1/chat/completions"}


def _containers(value):
    """Every object and array inside `value` (itself included): where a mutation can land."""
    if isinstance(value, (dict, list)):
        yield value
        for child in value.values() if isinstance(value, dict) else value:
            yield from _containers(child)


def _keep_generation_short(body: dict) -> None:
    """With no max_tokens chat generates to the end of the context (seconds on CPU), and a valid
    budget up to 1000 is as slow: those become 4. Invalid budgets stay, to be refused."""
    budgets = ("max_completion_tokens", "max_tokens")
    for key in budgets:
        v = _spread(body.get(key))[-1]  # the value a parser keeps
        if isinstance(v, (int, float)) and not isinstance(v, bool) and 4 < v <= 1000:
            body[key] = 4
    if all(_spread(body.get(key))[-1] is None for key in budgets):
        body["max_tokens"] = 4


@st.composite
def mutated_bodies(draw):
    path, base = draw(st.sampled_from(BASES))
    body = copy.deepcopy(base)
    for _ in range(draw(st.integers(1, 3))):
        target = draw(st.sampled_from(list(_containers(body))))
        op = draw(st.sampled_from(["replace", "insert", "delete", "duplicate"]))
        if op == "insert" or not target:
            if isinstance(target, dict):
                target[draw(keys)] = draw(values)
            else:
                target.insert(draw(st.integers(0, len(target))), draw(values))
            continue
        where = list(target) if isinstance(target, dict) else range(len(target))
        key = draw(st.sampled_from(where))
        if op == "delete":
            del target[key]
        elif op == "duplicate" and isinstance(target, dict):
            pair = (target[key], draw(values))
            target[key] = Dup(*pair) if draw(st.booleans()) else Dup(*reversed(pair))
        else:
            target[key] = draw(values)
    if path in GENERATES:
        _keep_generation_short(body)
    # Raw UTF-8 or \u escapes; surrogatepass lets a lone surrogate through as (invalid) bytes.
    return Case(path, encode(body, draw(st.booleans())).encode("utf-8", "surrogatepass"))


# -- bodies that are not (valid) JSON objects, and wrong content types -------------------------
RAW_BODIES = [
    b"", b" ", b"null", b"true", b"0", b'"x"', b"[]", b"[1, 2]", b"{", b"}", b"{}", b"\xff\xfe",
    b'{"prompt": "caf\xe9"}', b'{"prompt": "\xc0\x80"}', b'{"prompt": "\xed\xa0\x80"}',
    b'{"prompt": "a\x00b"}', b"NaN", b'{"prompt": NaN}', b'{"prompt": "a", "prompt": 5}',
    b"[" * DEEP + b"]" * DEEP, b'{"a":' * DEEP + b"1" + b"}" * DEEP, b"[" * 60_000,
    b'\xef\xbb\xbf{"prompt": "hi"}', '{"prompt": "hi"}'.encode("utf-16"), b'{"prompt": "hi"}\x00',
    b'{"prompt": "hi"} {"prompt": "hi"}', b'{"prompt": "' + b"\\" * 3001 + b'"}', b"1" * 5000,
    # Many brackets, then an unterminated string of escaped quotes: a scan for string literals
    # that restarts at every quote is quadratic here (60 KB, under this server's 64 KiB limit).
    b"[" * 70 + b'"' + b'\\"' * 30_000,
]
CONTENT_TYPES = [JSON, "text/plain", "application/x-www-form-urlencoded", None, "*/*", "",
                 "multipart/form-data; boundary=x", "application/json; charset=utf-16"]


@st.composite
def raw_requests(draw):
    path, base = draw(st.sampled_from(BASES))
    valid = json.dumps(base).encode()
    kind = draw(st.sampled_from(["fixed", "binary", "truncated", "byte"]))
    if kind == "fixed":
        body = draw(st.sampled_from(RAW_BODIES))
    elif kind == "binary":
        body = draw(st.binary(max_size=200))
    elif kind == "truncated":
        body = valid[:draw(st.integers(0, len(valid) - 1))]
    else:  # one byte of a valid body overwritten
        at = draw(st.integers(0, len(valid) - 1))
        body = valid[:at] + bytes([draw(st.integers(0, 255))]) + valid[at + 1:]
    return Case(path, body, draw(st.sampled_from(CONTENT_TYPES)))


# -- the properties ----------------------------------------------------------------------------
BASELINE = [("/v1/completions", {"prompt": "The quick fox", "max_tokens": 4, "temperature": 0}),
            ("/v1/embeddings", {"input": "a fixed sentence"})]


def _answer(path: str, response: httpx.Response):
    assert response.status_code == 200, response.text
    data = response.json()["data" if path == "/v1/embeddings" else "choices"][0]
    return data["embedding"] if path == "/v1/embeddings" else data["text"]


class Rig:
    """A client for the fuzz request and one per baseline request, a pool of threads to overlap
    them, and the baseline answers."""

    def __init__(self, base_url: str):
        count = 1 + len(BASELINE)
        self.clients = [httpx.Client(base_url=base_url, timeout=120) for _ in range(count)]
        self.pool = ThreadPoolExecutor(count)
        # Each baseline request alone, before any fuzzing: what it must get under any traffic.
        self.expected = [_answer(p, self.clients[0].post(p, json=b)) for p, b in BASELINE]

    def __repr__(self) -> str:  # hypothesis prints the fixtures of a falsifying example
        return "Rig()"


@pytest.fixture(scope="module")
def rig(server, request):
    rig = Rig(server.base_url)
    yield rig
    rig.pool.shutdown()
    for client in rig.clients:
        client.close()
    reporter = request.config.pluginmanager.get_plugin("terminalreporter")
    capture = request.config.pluginmanager.get_plugin("capturemanager")
    if reporter is not None and capture is not None:
        with capture.global_and_fixture_disabled():  # teardown output is captured otherwise
            reporter.write_line(f"\ntest_fuzz: {sum(TRIED.values())} cases tried ({dict(TRIED)})")


def check_answer(response: httpx.Response, where: str) -> None:
    assert response.status_code < 500, where
    if response.status_code >= 400:
        error = response.json()
        assert set(error) == {"error"}, where
        assert set(error["error"]) == {"message", "type", "param", "code"}, where
        assert error["error"]["message"] and error["error"]["type"], where
    elif response.headers.get("content-type", "").startswith("text/event-stream"):
        assert 'data: {"error"' not in response.text, where  # a 5xx that came after the 200


def exercise(rig: Rig, name: str, case: Case):
    """Sends the case while the baseline requests run beside it, then checks every property."""
    TRIED[name] += 1
    fuzzer, *others = rig.clients
    path, body = case.path, case.body
    headers = {} if case.content_type is None else {"content-type": case.content_type}
    started = time.monotonic()
    sent = rig.pool.submit(fuzzer.post, path, content=body, headers=headers)
    beside = [rig.pool.submit(c.post, p, json=b) for c, (p, b) in zip(others, BASELINE)]
    response = sent.result()
    where = f"{case} -> {response.status_code} {response.text[:500]}"
    check_answer(response, where)
    for (p, _), future, want in zip(BASELINE, beside, rig.expected):
        got = _answer(p, future.result())
        if isinstance(want, list):  # an embedding: batching may move the last float bits
            assert len(got) == len(want), where
            assert max(abs(a - b) for a, b in zip(got, want)) < 1e-5, where
        else:  # greedy text: exactly
            assert got == want, where
    stalled = time.monotonic() - started
    assert stalled < STALL_S, f"the exchange took {stalled:.1f} s: {where}"
    assert fuzzer.get("/health").status_code == 200, where


@FUZZ
@given(case=mutated_bodies())
def test_mutated_bodies(rig, case):
    exercise(rig, "mutated", case)


@FUZZ
@given(case=raw_requests())
def test_raw_bodies_and_content_types(rig, case):
    exercise(rig, "raw", case)


SWEPT = [*RAW_VALUES, *BEYOND_INT64, 1e308, -1e308, 1e-300, -1, [], True, "\x00"]
PROBES = [Raw('"\\ud800x"'), Raw("NaN"), Raw("[" * DEEP + "]" * DEEP), 2**63, 10**400, -1, [], True]


def _sweep():
    """(path, what, body): each edge value alone in each field of each starting body, a few in
    every known field of the first (a generation: sampling and logprobs), then each raw body."""
    fields = [(path, base, key, SWEPT) for path, base in BASES for key in base]
    fields += [(*BASES[0], key, PROBES) for key in FIELDS]
    for path, base, key, swept in fields:
        for value in swept:
            body = dict(base, **{key: value})
            if path in GENERATES:
                _keep_generation_short(body)
            yield path, key, encode(body).encode()
    for i, raw in enumerate(RAW_BODIES):
        yield BASES[i % len(BASES)][0], "the whole body", raw


def test_every_edge_value_in_every_field(rig):
    """The random search meets a given value in a given field only now and then; this sweeps
    them all, one request at a time, and lists every distinct failure at once."""
    failures: dict[tuple, bytes] = {}
    client = rig.clients[0]
    for path, what, raw in _sweep():
        TRIED["sweep"] += 1
        started = time.monotonic()
        response = client.post(path, content=raw, headers={"content-type": JSON})
        took = time.monotonic() - started
        try:
            check_answer(response, "")
            problem = f"took {took:.1f} s" if took > STALL_S else None
        except (AssertionError, ValueError):  # ValueError: a 4xx body that is not JSON
            problem = f"{response.status_code} {response.text[:120]}"
        if problem is not None:
            failures.setdefault((path, what, problem), raw)
    assert not failures, "\n".join(f"{path} [{what}] {problem} <- {raw[:200]!r}"
                                   for (path, what, problem), raw in failures.items())
    assert client.get("/health").status_code == 200
