"""What the encoder benchmark sends: its cells (text kind, texts per request, concurrency), the
texts themselves, and the random-weight cross-encoder it reranks with.

Texts are runs of the prompt helpers' common words cut to an exact token count with the model's
own tokenizer (special tokens included), seeded, so every peer gets the very same strings. Each
kind is a pool of distinct texts that requests take in order: a server that cached results
would find no repeat within a cell (the pools outlast the longest cell)."""
from __future__ import annotations

import asyncio
import json
import random
import shutil
from dataclasses import dataclass
from pathlib import Path

from bench.serving.core.prompts import LocalTokenizer, PromptFactory

SHORT_TOKENS = 20  # a sentence, [CLS] and [SEP] included
PASSAGE_TOKENS = 200  # a passage, under all-MiniLM's 256-token limit
QUERY_TOKENS = 16  # a rerank query
DOC_TOKENS = 100  # a rerank document: a pair is ~115 tokens
POOL_TEXTS = {"short": 16384, "passage": 4096}
RERANK_QUERIES = 64
DOCS_PER_QUERY = 32
PROBE = ["a quiet village by the river", "the doctor bought a red guitar and a golden clock in the market"]
# The tokenizer files a cross-encoder directory gets beside its random weights.
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "special_tokens_map.json")
# cross-encoder/ms-marco-MiniLM-L-6-v2's shape.
CROSS_ENCODER_SHAPE = dict(num_hidden_layers=6, hidden_size=384, num_attention_heads=12, intermediate_size=1536,
                           vocab_size=30522, max_position_embeddings=512, num_labels=1)


@dataclass(frozen=True, slots=True)
class Cell:
    """One measured load: `batch` texts per request (rerank: documents with one query), at
    `concurrency` requests in flight."""

    task: str  # "embed" | "rerank"
    kind: str  # "short" | "passage" | "pairs"
    batch: int
    concurrency: int

    @property
    def key(self) -> str:
        return f"{self.task} {self.kind} b={self.batch} c={self.concurrency}"

    @property
    def shape(self) -> str:
        """The cell without its concurrency: what an in-process call is."""
        return f"{self.task} {self.kind} b={self.batch}"


def embed_cells(kinds: list[str], batches: list[int], concurrencies: list[int]) -> list[Cell]:
    return [Cell("embed", k, b, c) for k in kinds for b in batches for c in concurrencies]


def rerank_cells(concurrencies: list[int]) -> list[Cell]:
    return [Cell("rerank", "pairs", DOCS_PER_QUERY, c) for c in concurrencies]


@dataclass(frozen=True, slots=True)
class Texts:
    """Every text of the run. `rerank` is (query, 32 documents) per request."""

    short: list[str]
    passage: list[str]
    rerank: list[tuple[str, list[str]]]
    probe: list[str]

    def pool(self, kind: str) -> list[str]:
        return self.short if kind == "short" else self.passage

    def to_json(self) -> dict:
        return {"short": self.short, "passage": self.passage, "probe": self.probe,
                "rerank": [[q, docs] for q, docs in self.rerank]}

    def write(self, path: Path) -> Path:
        path.write_text(json.dumps(self.to_json()))
        return path


def make_texts(tokenizer_dir: Path, seed: int = 0) -> Texts:
    """The same texts for a given tokenizer and seed, whatever the peers."""
    factory = asyncio.run(PromptFactory.from_tokenizer(LocalTokenizer(tokenizer_dir)))
    rng = random.Random(seed)

    def texts(n: int, tokens: int) -> list[str]:
        # WordPiece lower-cases and splits on spaces: the leading space the helpers put is dropped.
        return [factory.exact(tokens, rng).text.strip() for _ in range(n)]

    short = texts(POOL_TEXTS["short"], SHORT_TOKENS)
    passage = texts(POOL_TEXTS["passage"], PASSAGE_TOKENS)
    rerank = [(texts(1, QUERY_TOKENS)[0], texts(DOCS_PER_QUERY, DOC_TOKENS)) for _ in range(RERANK_QUERIES)]
    # A passage among the probe texts: a peer that truncates it shorter than sentence-transformers
    # does (fastembed reads tokenizer_config.json's max_length, 128 here) fails the check.
    return Texts(short, passage, rerank, [*PROBE, passage[0]])


def take(pool: list, start: int, n: int) -> list:
    """n items of `pool` from `start` on, wrapping around."""
    return [pool[(start + i) % len(pool)] for i in range(n)]


@dataclass(frozen=True, slots=True)
class CrossEncoder:
    """A random-weight BertForSequenceClassification directory and the logits transformers gives
    for the probe pairs (the first rerank request's query against its first documents)."""

    path: Path
    probe_query: str
    probe_docs: list[str]
    probe_logits: list[float]


def build_cross_encoder(out: Path, tokenizer_dir: Path, texts: Texts, seed: int = 0) -> CrossEncoder:
    """Writes the checkpoint with transformers (seeded torch init, safetensors) and the embedding
    model's tokenizer files beside it. Imports torch only here: the client stays light otherwise."""
    import torch
    from transformers import AutoTokenizer, BertConfig, BertForSequenceClassification

    torch.manual_seed(seed)
    config = BertConfig(**CROSS_ENCODER_SHAPE)
    config.architectures = ["BertForSequenceClassification"]
    model = BertForSequenceClassification(config).eval()
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out, safe_serialization=True)
    for name in TOKENIZER_FILES:
        if (tokenizer_dir / name).exists():
            shutil.copy(tokenizer_dir / name, out / name)
    query, docs = texts.rerank[0][0], texts.rerank[0][1][:4]
    tok = AutoTokenizer.from_pretrained(out)
    batch = tok([query] * len(docs), docs, padding=True, truncation=True, return_tensors="pt")
    with torch.no_grad():
        logits = model(**batch).logits[:, 0].tolist()
    return CrossEncoder(out, query, docs, logits)
