"""The fasttoken equality gate: identical ids, text and streaming steps to HF `tokenizers` for
every real tokenizer in the shared folder that fasttoken supports (all of them today)."""
from __future__ import annotations

import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from prelude.tokenizer.fast import FastTokenizer
from tests.data import tokenizer_file
from tests.tokenizer.texts import long_text
from bench.tokenizer.corpus import FRAGMENTS, added_contents
from bench.tokenizer.equality import (
    check_decode,
    check_encode,
    check_stream,
    check_text,
    corpus_for,
    load_pair,
    random_texts,
)

# Qwen3 first: it is the default model's tokenizer.
NAMES = ["qwen3", "llama3", "llama3.2-vision", "gpt2", "deepseek-v3", "phi2", "phi3-mini"]
EXAMPLES = 250  # per tokenizer and strategy: 7 x 2 x 250 = 3,500 generated cases in all


def _path(name: str) -> str:
    return tokenizer_file(name)


@pytest.mark.parametrize("name", NAMES)
def test_loads_as_fasttoken(name: str) -> None:
    from prelude.tokenizer import load

    tok = load(_path(name))
    assert tok.backend == "fasttoken"
    fast, hf, _ = load_pair(_path(name))
    assert fast.vocab_size == hf.vocab_size
    assert fast.special_ids == hf.special_ids


@pytest.mark.parametrize("name", NAMES)
def test_corpus(name: str) -> None:
    path = _path(name)
    problems = [p for text in corpus_for(path) for p in check_text(path, text)]
    assert not problems, "\n".join(problems[:10])
    fast, _, _ = load_pair(path)
    assert fast.reference_encodes == 0, "the corpus must not need the HF escape hatch"


@pytest.mark.parametrize("name", NAMES)
def test_random_mixes(name: str) -> None:
    path = _path(name)
    problems = [p for text in random_texts(path, 400) for p in check_text(path, text, stream=False)]
    assert not problems, "\n".join(problems[:10])


@pytest.mark.parametrize("name", NAMES)
def test_batch(name: str) -> None:
    path = _path(name)
    fast, hf, _ = load_pair(path)
    texts = corpus_for(path) + random_texts(path, 64, seed=3)
    for add in (True, False):
        assert fast.encode_batch(texts, add) == hf.encode_batch(texts, add)
    assert fast.encode_batch([]) == []
    assert fast.encode_batch(tuple(texts[:3])) == hf.encode_batch(texts[:3])


@pytest.mark.parametrize("name", NAMES)
def test_long_input(name: str) -> None:
    path = _path(name)
    fast, hf, raw = load_pair(path)
    text = long_text(200_000)
    assert len(text) == 200_000
    assert not check_encode(fast, hf, text)
    # Two long stretches around an added token: the ids before the second parallel split, and
    # those of the first, reach the result list while the second is still being encoded.
    for special in added_contents(path)[:1]:
        assert not check_encode(fast, hf, text[:100_000] + special + text[100_000:])
    ids = hf.encode(text)
    assert not check_decode(fast, hf, ids)
    # A long run with no pre-token boundaries stresses the heap-based merge path.
    assert not check_encode(fast, hf, "ab" * 20_000 + " " * 5_000 + "\u00e9" * 3_000)
    assert not check_stream(fast, hf, raw, ids[:600])


@pytest.mark.parametrize("name", ["qwen3", "llama3", "gpt2", "deepseek-v3"])
def test_regex_reference_path(name: str) -> None:
    """The scanners' patterns run through the `regex` module instead (the path unknown Split
    regexes take) give HF's ids too."""
    path = _path(name)
    fast = FastTokenizer(path, use_scanners=False)
    _, hf, _ = load_pair(path)
    texts = corpus_for(path) + random_texts(path, 150, seed=17)
    problems = [p for text in texts for p in check_encode(fast, hf, text)]
    assert not problems, "\n".join(problems[:10])
    assert fast.encode_batch(texts[:20]) == hf.encode_batch(texts[:20])


@pytest.mark.parametrize("name", NAMES)
def test_token_lookups(name: str) -> None:
    path = _path(name)
    fast, hf, _ = load_pair(path)
    for token_id in [*range(300), *range(hf.vocab_size - 300, hf.vocab_size + 3), 10**6]:
        token = hf.id_to_token(token_id)
        assert fast.id_to_token(token_id) == token, token_id
        if token is not None:
            assert fast.token_to_id(token) == hf.token_to_id(token), token
    for token in added_contents(path) + ["", "not-a-token-\u2603"]:
        assert fast.token_to_id(token) == hf.token_to_id(token), token


@pytest.mark.parametrize("name", NAMES)
def test_random_id_sequences(name: str) -> None:
    """Decoding ids no encoder would produce: lone continuation bytes, byte-fallback tokens
    forming invalid UTF-8, specials anywhere, unknown ids; and streaming them step by step
    (against base.Tokenizer.decode_step only: DecodeStream rejects such streams)."""
    path = _path(name)
    fast, hf, raw = load_pair(path)
    rng = random.Random(31)
    specials = sorted(hf.special_ids)
    problems = []
    for i in range(400):
        ids = []
        for _ in range(rng.randint(0, 24)):
            r = rng.random()
            if r < 0.15 and specials:
                ids.append(rng.choice(specials))
            elif r < 0.45:
                ids.append(rng.randint(0, 600))  # single bytes, <0xNN> tokens, short pieces
            elif r < 0.5:
                ids.append(rng.randint(hf.vocab_size - 50, hf.vocab_size + 5))
            else:
                ids.append(rng.randrange(hf.vocab_size))
        problems += check_decode(fast, hf, ids)
        if i % 4 == 0:
            problems += check_stream(fast, hf, raw, ids, with_decode_stream=False)
    assert not problems, "\n".join(problems[:10])


@pytest.mark.parametrize("name", NAMES)
def test_decode_odd_ids(name: str) -> None:
    """Unknown ids are skipped, like HF; negative ids are an error on both sides."""
    fast, hf, _ = load_pair(_path(name))
    ids = [5, hf.vocab_size + 10, 2**31 + 5, 7]
    assert fast.decode(ids) == hf.decode(ids)
    with pytest.raises(OverflowError):
        fast.decode([-1])
    with pytest.raises(OverflowError):
        fast.decode([2**40])
    assert fast.decode([]) == hf.decode([]) == ""
    assert fast.decode_step([], 0, 0) == hf.decode_step([], 0, 0)
    ids = hf.encode("hello there")
    assert fast.decode_step(ids, -2, -1) == hf.decode_step(ids, -2, -1)
    long_ids = hf.encode(long_text(2_000))
    for prefix, read in [(0, len(long_ids) - 3), (5, 400), (300, 200), (0, 0), (10, 10**6)]:
        for skip in (False, True):  # windows past the small-window fast path, odd offsets
            assert fast.decode_step(long_ids, prefix, read, skip) == hf.decode_step(long_ids, prefix, read, skip)
    assert fast.decode_step(tuple(long_ids[:50]), 40, 45) == hf.decode_step(long_ids[:50], 40, 45)


_mix = st.lists(
    st.one_of(
        st.sampled_from(FRAGMENTS),
        st.sampled_from([" ", "  ", "\n", "\t", "\r\n", "\r", "\u00a0", "\u3000", "'s", "'RE", "\u0301",
                         "\u200d", "\ufe0f", "1234", "\U0001F468\u200d\U0001F469"]),
        st.text(max_size=8),
        st.integers(0, 40),  # index into the tokenizer's added tokens (filled in per test)
    ),
    max_size=12,
)


def _materialize(parts: list, specials: list[str]) -> str:
    return "".join(specials[p % len(specials)] if isinstance(p, int) else p for p in parts)


_settings = settings(max_examples=EXAMPLES, deadline=None, derandomize=True,
                     suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


@pytest.mark.parametrize("name", NAMES)
def test_hypothesis_text(name: str) -> None:
    path = _path(name)

    @_settings
    @given(st.text(alphabet=st.characters(codec="utf-8"), max_size=60))
    def run(text: str) -> None:
        problems = check_text(path, text, stream=False)
        assert not problems, "\n".join(problems)

    run()


@pytest.mark.parametrize("name", NAMES)
def test_hypothesis_mix(name: str) -> None:
    path = _path(name)
    specials = added_contents(path)

    @_settings
    @given(_mix)
    def run(parts: list) -> None:
        problems = check_text(path, _materialize(parts, specials))
        assert not problems, "\n".join(problems)

    run()
