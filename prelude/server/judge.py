"""The generative reranker's judge prompt (Qwen3-Reranker style): the model answers "yes" or
"no" to whether the document meets the query, and the score is P(yes) / (P(yes) + P(no)) at the
answer position. The prompt goes through the model's own chat template, rendered once per
instruction with placeholders that each query and document then fill."""
from __future__ import annotations

from prelude.tokenizer.chat import ChatTemplate

RERANK_INSTRUCTION = "Given a web search query, retrieve relevant passages that answer the query"
JUDGE_SYSTEM = ('Judge whether the Document meets the requirements based on the Query and the Instruct '
                'provided. Note that the answer can only be "yes" or "no".')
_QUERY, _DOCUMENT = "\ue000query\ue000", "\ue000document\ue000"  # private-use code points: never in input


class JudgePrompt:
    def __init__(self, template: ChatTemplate | None, instruction: str = RERANK_INSTRUCTION):
        """Rendered through `template` (thinking off, for templates that have it); without one,
        a plain prompt, and encoding adds the special tokens a template would have placed."""
        user = f"<Instruct>: {instruction}\n<Query>: {_QUERY}\n<Document>: {_DOCUMENT}"
        if template is None:
            self.text, self.add_special_tokens = f"{JUDGE_SYSTEM}\n{user}\nAnswer (yes or no): ", True
        else:
            messages = [{"role": "system", "content": JUDGE_SYSTEM}, {"role": "user", "content": user}]
            self.text = template.render(messages, add_generation_prompt=True, enable_thinking=False)
            self.add_special_tokens = False

    def fill(self, query: str, document: str) -> str:
        return self.text.replace(_QUERY, query).replace(_DOCUMENT, document)
