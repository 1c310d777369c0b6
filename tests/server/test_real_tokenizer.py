"""A tiny random Qwen3 behind the real Qwen3 tokenizer and chat template (fasttoken by default):
chat, streaming detokenization of multilingual text, and /tokenize agree with HF."""
from __future__ import annotations

import httpx
import openai
import pytest

from prelude.contract.config import Config
from tests.checkpoints import make_model_dir
from tests.data import hf_reference_tokenizer, tokenizer_dir
from tests.server.harness import ServerThread

MESSAGES = [{"role": "user", "content": "Summarize: 你好世界, naïve café, emoji 👨‍👩‍👧 and code `x**2`."}]


@pytest.fixture(scope="module")
def qwen3(tmp_path_factory):
    path = make_model_dir(tmp_path_factory.mktemp("qwen3-real-tok"), "qwen3", tokenizer_dir("qwen3"))
    with ServerThread(Config(model=str(path), num_kv_blocks=512, max_model_len=512)) as srv:
        yield srv


def test_fasttoken_serves_the_qwen3_tokenizer(qwen3):
    assert qwen3.served.tokenizer.backend == "fasttoken"


def test_chat_prompt_tokens_match_hf(qwen3):
    ref = hf_reference_tokenizer("qwen3")
    text = ref.apply_chat_template(MESSAGES, tokenize=False, add_generation_prompt=True)
    got = httpx.post(qwen3.base_url + "/tokenize", json={"messages": MESSAGES}).json()["tokens"]
    assert got == ref.encode(text, add_special_tokens=False)


def test_streamed_text_equals_full_text_and_decode(qwen3):
    with openai.OpenAI(base_url=qwen3.base_url + "/v1", api_key="x", max_retries=0) as client:
        name = qwen3.served.name
        kw = dict(model=name, messages=MESSAGES, max_tokens=24, temperature=0.9, seed=3, logprobs=True)
        full = client.chat.completions.create(**kw)
        chunks = list(client.chat.completions.create(stream=True, **kw))
    streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert streamed == full.choices[0].message.content
    assert len(full.choices[0].logprobs.content) == full.usage.completion_tokens
    assert full.usage.completion_tokens == 24 or full.choices[0].finish_reason == "stop"


def test_generative_rerank_renders_the_qwen3_reranker_prompt(qwen3):
    """Through Qwen3's own chat template (thinking off), the judge prompt is exactly the
    Qwen3-Reranker format."""
    from prelude.server.judge import JUDGE_SYSTEM, RERANK_INSTRUCTION, JudgePrompt

    docs = ["blocks and caches", "soup"]
    before = qwen3.on_loop(lambda: qwen3.engine.scheduler.stats.prefill_tokens)
    response = httpx.post(qwen3.base_url + "/v1/rerank", json={"query": "what is a KV cache?", "documents": docs})
    assert response.status_code == 200
    user = f"<Instruct>: {RERANK_INSTRUCTION}\n<Query>: what is a KV cache?\n<Document>: "
    expected = [f"<|im_start|>system\n{JUDGE_SYSTEM}<|im_end|>\n<|im_start|>user\n{user}{doc}<|im_end|>\n"
                "<|im_start|>assistant\n<think>\n\n</think>\n\n" for doc in docs]
    judge = JudgePrompt(qwen3.served.chat_template, RERANK_INSTRUCTION)
    rendered = [judge.fill("what is a KV cache?", doc) for doc in docs]
    assert rendered == expected and not judge.add_special_tokens
    assert qwen3.on_loop(lambda: qwen3.engine.scheduler.stats.prefill_tokens) > before


@pytest.fixture(scope="module")
def phi3(tmp_path_factory):
    """A tiny random Llama behind Phi-3's SentencePiece-style tokenizer (tokens carry a leading
    "▁", which a decoder drops at the start of a text)."""
    path = make_model_dir(tmp_path_factory.mktemp("phi3-real-tok"), "llama", tokenizer_dir("phi3-mini"))
    with ServerThread(Config(model=str(path), num_kv_blocks=64, max_model_len=256)) as srv:
        yield srv


def test_a_one_token_answer_keeps_its_leading_space(phi3):
    """The same token reads the same whether the answer is one token (OneShot path) or longer:
    " yes", decoded after the prompt, not "yes", decoded alone."""
    # "▁yes": the tokenizer prepends the "▁" to a text's first word
    (yes,) = httpx.post(phi3.base_url + "/tokenize",
                        json={"prompt": "yes", "add_special_tokens": False}).json()["tokens"]

    def answer(max_tokens: int) -> str:
        body = {"prompt": "Is it good? Answer:", "max_tokens": max_tokens, "temperature": 0,
                "allowed_token_ids": [yes]}
        return httpx.post(phi3.base_url + "/v1/completions", json=body).json()["choices"][0]["text"]

    assert answer(1) == " yes"
    assert answer(2) == " yes yes"


def test_a_choice_of_words_answers_one_of_them_exactly(phi3):
    """"yes" encodes alone as the one token "▁yes", which reads " yes" after the prompt: a choice
    of single tokens answered " yes", which no client comparing with "yes" matches."""
    for path, body in (("/v1/completions", {"prompt": "Answer:"}),
                       ("/v1/chat/completions", {"messages": [{"role": "user", "content": "Answer:"}]})):
        for seed, max_tokens in ((0, 10), (1, 10), (2, 1)):  # one token: the pieces "yes" and "no"
            out = httpx.post(phi3.base_url + path, json={**body, "guided_choice": ["yes", "no"], "seed": seed,
                                                          "max_tokens": max_tokens, "temperature": 1}).json()
            choice = out["choices"][0]
            assert choice.get("text", choice.get("message", {}).get("content")) in ("yes", "no"), out
            assert out["usage"]["completion_tokens"] == 1


@pytest.fixture(scope="module")
def llama32(tmp_path_factory):
    path = make_model_dir(tmp_path_factory.mktemp("llama32-real-tok"), "llama", tokenizer_dir("llama3.2-vision"))
    # HF's {% generation %} tag (assistant-token masks), as SmolLM3's template has it
    (path / "chat_template.jinja").write_text(
        "{% for m in messages %}{% if m['role'] == 'assistant' %}{% generation %}[{{ m['content'] }}]"
        "{% endgeneration %}{% else %}{{ m['content'] }}{% endif %}{% endfor %}")
    with ServerThread(Config(model=str(path), num_kv_blocks=256, max_model_len=256)) as srv:
        yield srv


def test_add_special_tokens_is_honoured(llama32):
    """vLLM's add_special_tokens (completions and pooling: default true; chat: false) was ignored:
    a prompt already carrying <|begin_of_text|> got a second one. Llama 3.2 Vision's tokenizer.json adds BOS."""
    url, text = llama32.base_url, "<|begin_of_text|>Is this relevant?"

    def prompt_tokens(path: str, **body) -> int:
        response = httpx.post(url + path, json={"max_tokens": 1, **body})
        assert response.status_code == 200, response.text
        return response.json()["usage"]["prompt_tokens"]

    plain = prompt_tokens("/v1/completions", prompt=text)
    assert prompt_tokens("/v1/completions", prompt=text, add_special_tokens=False) == plain - 1
    assert prompt_tokens("/v1/embeddings", input=text, add_special_tokens=False) == plain - 1
    chat = [{"role": "user", "content": "hi"}]
    assert prompt_tokens("/v1/chat/completions", messages=chat, add_special_tokens=True) == \
        prompt_tokens("/v1/chat/completions", messages=chat) + 1


def test_a_template_with_generation_blocks_renders(llama32):
    """A template using HF's {% generation %} tag did not compile: the checkpoint could not start.
    The tag renders its body, as in HF."""
    messages = [{"role": "user", "content": "Is it good?"}, {"role": "assistant", "content": "Yes"}]
    tokens = httpx.post(llama32.base_url + "/tokenize", json={"messages": messages}).json()["tokens"]
    ref = hf_reference_tokenizer("llama3.2-vision")
    text = ref.apply_chat_template(messages, chat_template=llama32.served.chat_template.source, tokenize=False)
    assert text == "Is it good?[Yes]" and tokens == ref.encode(text, add_special_tokens=False)
    response = httpx.post(llama32.base_url + "/v1/chat/completions", json={"messages": messages, "max_tokens": 2})
    assert response.status_code == 200 and response.json()["usage"]["prompt_tokens"] == len(tokens)
