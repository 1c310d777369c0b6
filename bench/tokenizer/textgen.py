"""Deterministic benchmark text: mostly English prose and code, with multilingual passages,
numbers and chat-style markup, the mix an LLM server's prompts tend to have. No data files:
the vocabulary below is written out here and recombined by a seeded RNG."""
from __future__ import annotations

import random

_EN = ["the", "of", "and", "to", "in", "is", "that", "for", "it", "as", "with", "was", "on", "be", "by", "this", "are",
       "or", "at", "from", "which", "have", "an", "not", "they", "but", "we", "his", "all", "been", "has", "their",
       "one", "there", "were", "would", "can", "more", "about", "said", "what", "when", "model", "server", "request",
       "response", "token", "latency", "throughput", "memory", "cache", "batch", "queue", "decision", "system", "user",
       "assistant", "question", "answer", "reason", "because", "however", "therefore", "example", "result", "data",
       "between", "during", "without", "within", "against", "through", "before", "after", "under", "over", "again",
       "further", "then", "policy", "approve", "reject", "review", "customer", "account", "payment", "invoice", "order",
       "shipment", "delivery", "important", "particular", "different", "following", "available", "possible",
       "necessary", "including", "whether"]
_NAMES = ["Alice", "Bob", "Carol", "Dave", "Erin", "Frank", "Grace", "Heidi", "Ivan", "Judy", "Mallory", "Niaj",
          "Olivia", "Peggy"]
_CODE = [
    "def {f}(x, y=None):\n    if y is None:\n        return x * 2\n    return x + y\n",
    "for i in range(len(items)):\n    total += items[i].price * items[i].qty\n",
    "class {F}(Base):\n    \"\"\"{s}\"\"\"\n\n"
    "    def __init__(self, value: int) -> None:\n        self.value = value\n",
    "const {f} = async (req, res) => {{\n"
    "  const data = await db.query('SELECT * FROM t WHERE id = $1', [req.id]);\n  res.json(data);\n}};\n",
    "if (n < 0) {{\n\treturn -1;\n}} else if (n == 0) {{\n\treturn 0;\n}}\n",
    "{{\"id\": {n}, \"name\": \"{name}\", \"tags\": [\"a\", \"b\"], \"score\": {x}}}\n",
]
_OTHER = [
    "Привет, как дела? Это тестовое сообщение для проверки токенизатора.",
    "我们需要在明天之前完成这个项目的第一阶段，然后再进行测试。",
    "この文章はトークナイザーの速度を測るためのものです。",
    "مرحبا، هذه رسالة اختبار لقياس سرعة المحلل.",
    "यह एक परीक्षण संदेश है जो गति मापने के लिए है।",
    "Ceci est un message de test, n'est-ce pas? L'été dernier, c'était très agréable.",
    "Das ist ein Testsatz für die Geschwindigkeitsmessung; Größe und Übermaß.",
    "สวัสดีครับ นี่คือข้อความทดสอบ",
    "Xin chào, đây là một tin nhắn thử nghiệm.",
    "🙂 Great job! 👍🏽 See you at 10:30 🚀",
]


def _sentence(rng: random.Random) -> str:
    words = [rng.choice(_EN) for _ in range(rng.randint(6, 18))]
    if rng.random() < 0.3:
        words.insert(rng.randrange(len(words)), rng.choice(_NAMES))
    if rng.random() < 0.2:
        words.insert(rng.randrange(len(words)), str(rng.randint(0, 99999)))
    if rng.random() < 0.15:
        words.insert(rng.randrange(len(words)), rng.choice(["don't", "it's", "we're", "they've", "I'll"]))
    text = " ".join(words)
    return text[0].upper() + text[1:] + rng.choice([".", ".", ".", "?", "!", ":"])


def _block(rng: random.Random) -> str:
    r = rng.random()
    if r < 0.6:
        return " ".join(_sentence(rng) for _ in range(rng.randint(2, 6))) + "\n\n"
    if r < 0.85:
        template = rng.choice(_CODE)
        return template.format(f=rng.choice(["compute", "handle", "run_step", "parse"]),
                               F=rng.choice(["Engine", "Parser", "Queue"]), s=_sentence(rng),
                               n=rng.randint(1, 9999), name=rng.choice(_NAMES), x=round(rng.random(), 3)) + "\n"
    return rng.choice(_OTHER) + " " + _sentence(rng) + "\n"


def text(chars: int, seed: int) -> str:
    """Exactly `chars` characters of mixed text."""
    rng = random.Random(seed)
    parts: list[str] = []
    size = 0
    while size < chars:
        block = _block(rng)
        parts.append(block)
        size += len(block)
    return "".join(parts)[:chars]


def texts(count: int, chars: int, seed: int) -> list[str]:
    return [text(chars, seed * 100_003 + i) for i in range(count)]


def _paper_words() -> list[str]:
    """Words of the papers in shared/papers (real English with its long tail of rare words,
    numbers, URLs and symbols); the generated English above when they are absent."""
    from bench.shared_data import shared_dir

    words: list[str] = []
    for path in sorted((shared_dir() / "papers").glob("*.txt")):
        words += path.read_text(encoding="utf-8").split()
    return words


_PAPER_WORDS: list[str] | None = None


def paper_texts(count: int, chars: int, seed: int) -> list[str]:
    """`count` different texts of exactly `chars` characters: words drawn at random from real
    papers, so every text is new to a tokenizer's word cache while the vocabulary stays real.
    Each call returns new string objects (no library finds another's UTF-8 conversion cached)."""
    global _PAPER_WORDS
    if _PAPER_WORDS is None:
        _PAPER_WORDS = _paper_words()
    words = _PAPER_WORDS
    if not words:
        return texts(count, chars, seed)
    rng = random.Random(seed)
    out = []
    for _ in range(count):
        parts: list[str] = []
        size = 0
        while size < chars:
            word = words[rng.randrange(len(words))]
            parts.append(word)
            size += len(word) + 1
        out.append(" ".join(parts)[:chars])
    return out
