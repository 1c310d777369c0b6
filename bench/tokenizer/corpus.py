"""Text the fasttoken equality gate runs on (also imported by bench/tokenizer's quick gate).

Every fragment targets something a tokenizer can get subtly wrong; `special_mixes` adds each
tokenizer's own added tokens inside and next to text.
"""
from __future__ import annotations

import unicodedata

FRAGMENTS: list[str] = [
    # prose and contractions, every form the regexes special-case
    "Hello world, this is a test.",
    "I'm sure you'll see they've said it's what we'd do, and you're right; don't.",
    "I'M SURE YOU'LL SEE THEY'VE SAID IT'S WHAT WE'D DO, AND YOU'RE RIGHT; DON'T.",
    "Mixed 'S 'T 'Re 'vE 'M 'Ll 'D 's't're've'm'll'd and 'sam 'tea 'really 'x",
    "'s",
    "it\u2019s a curly apostrophe, and a long s: x'\u017ftop 'ſ",
    # multilingual
    "Привет, мир! Как дела? Ёжик в тумане.",
    "مرحبا بالعالم، كيف حالك؟ هذا نصٌّ عربيّ مُشَكَّل.",
    "नमस्ते दुनिया, आप कैसे हैं? हिन्दी में क्षत्रिय और ज्ञान।",
    "สวัสดีชาวโลก ภาษาไทยไม่มีช่องว่างระหว่างคำ",
    "你好，世界！我们今天学习中文。机器学习很有趣。",
    "日本語のテキスト：ひらがな、カタカナ、漢字を混ぜる。ｶﾀｶﾅ半角",
    "한국어 텍스트입니다. 안녕하세요!",
    "Ελληνικά: Καλημέρα κόσμε. עברית: שלום עולם",
    "Tiếng Việt có dấu: Cộng hòa Xã hội chủ nghĩa Việt Nam",
    "ＡＢＣ full-width ＡＢＣ１２３ and ①②③ Ⅻ ½ ¾ ²³",
    # code
    "def f(x):\n    return x**2  # square\n\nclass A(object):\n\tpass\n",
    "for (int i = 0; i < n; ++i) { sum += a[i] * b[i]; }\r\n",
    "const x = {\"key\": [1, 2, 3], 'b': null};\n// comment\n/* block */",
    "SELECT name, COUNT(*) FROM users WHERE id >= 10 GROUP BY name;",
    "<html><body class=\"main\">&nbsp;&amp;</body></html>",
    "x=1;y=22;z=333;w=4444;v=55555;u=666666;t=7777777",
    # emoji, ZWJ, flags, variation selectors
    "emoji 😀😃😄 👍🏽 👨‍👩‍👧‍👦 🏳️‍🌈 🇫🇷🇯🇵 ❤️ ☺︎ 🫠",
    "👩🏾‍💻 and 🧑‍🤝‍🧑 plus keycap 1️⃣ #️⃣",
    # combining marks, NFC vs NFD
    "e\u0301 vs \u00e9, a\u0308 vs \u00e4, n\u0303 vs \u00f1",
    unicodedata.normalize("NFD", "Crème brûlée à la française, Ångström, Việt"),
    unicodedata.normalize("NFC", "Crème brûlée à la française, Ångström, Việt"),
    "a\u0323\u0302 \u0302\u0323 q\u0307\u0323 \u1e0b\u0323 \u0301start",
    "\u1100\u1161\u11a8 \u1100\u1161 \uac00\u11a8 hangul jamo",
    "zalgo: z\u0351\u0352a\u0353\u0354l\u0355g\u0356o\u0357",
    # whitespace
    "  leading and trailing spaces  ",
    "multiple     spaces\t\ttabs\n\nnewlines\r\n\r\nwindows\rcarriage",
    "\n\n\n",
    "   ",
    "\t",
    "a \u00a0nbsp\u2003em\u3000ideographic\u2028line\u2029para\u0085nel",
    " \n x",
    "end with space ",
    "end with newline\n",
    "  \n  \n\t \r\n  x",
    # numbers
    "1 12 123 1234 12345 123456 1234567 3.14159 -42 1e10 0x1F 1,000,000",
    "٠١٢٣٤٥٦٧٨٩ ০১২৩ ๑๒๓ ௧௨௩",
    "phone: +1 (555) 123-4567, date 2024-01-15T10:30:00Z",
    # punctuation runs and odd characters
    "!!! ??? ... --- ___ *** ### $$$ %%% &&& @@@",
    "\"quoted\" 'single' «guillemets» „German“ 『Japanese』",
    "null\x00byte and controls \x01\x02\x1b[0m \x7f",
    "soft\u00adhyphen zero\u200bwidth joiner\u200d non\u200cjoiner \ufeffbom",
    "private use \ue000\uf8ff and astral 𝔘𝔫𝔦𝔠𝔬𝔡𝔢 𝟙𝟚𝟛",
    "math ∀x∈ℝ: x²≥0 ∑∫√∞ ≠ ≤ ≥",
    "",
    " ",
    "a",
    "Ġ Ċ ▁ <0x0A> Ā",
    "\u2581leading lower one eighth block \u2581\u2581",
]


def special_mixes(specials: list[str]) -> list[str]:
    """Added tokens alone, inside words, next to whitespace, back to back and unterminated."""
    out: list[str] = []
    for i, tok in enumerate(specials):
        other = specials[(i + 1) % len(specials)]
        out += [
            tok,
            f"{tok}hello{other}",
            f"before{tok}after",
            f" {tok} spaced {tok}\n",
            f"{tok}\n\nnext line",
            f"text  {tok}  text",
            f"{tok}{tok}{other}",
            f"{tok[:-1]} truncated",
            f"\u00e9{tok}\u0301",
            f"{tok}'s",
        ]
    return out


def added_contents(path: str) -> list[str]:
    import json

    with open(path, encoding="utf-8") as fh:
        added = json.load(fh).get("added_tokens", [])
    # A handful is enough; the first/last and all non-special ones cover the kinds.
    chosen = added[:4] + added[-4:] + [t for t in added if not t["special"]][:12]
    seen: list[str] = []
    for t in chosen:
        if t["content"] not in seen:
            seen.append(t["content"])
    return seen
