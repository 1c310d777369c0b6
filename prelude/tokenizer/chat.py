"""Chat templates: the checkpoint's Jinja template, rendered the way HF transformers does."""
from __future__ import annotations

import json
from datetime import datetime
from functools import lru_cache
from pathlib import Path
from typing import Any


class ChatTemplateError(ValueError):
    """The template refused the messages (raise_exception) or failed to render."""


class TemplateCompileError(RuntimeError):
    """The checkpoint's template does not compile: the served model's fault, not the request's."""


def _raise(message: str):
    raise ChatTemplateError(message)


def _tojson(value: Any, ensure_ascii: bool = False, indent: int | None = None,
            separators=None, sort_keys: bool = False) -> str:
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                      sort_keys=sort_keys)


@lru_cache(maxsize=1)
def _generation_tag():
    """`{% generation %}...{% endgeneration %}`, which HF's environment knows (it marks the
    assistant's tokens for return_assistant_tokens_mask) and renders as its body. Templates that
    use it (SmolLM3's, among others) did not compile here, so such a checkpoint could not start."""
    from jinja2.ext import Extension

    class Generation(Extension):
        tags = {"generation"}

        def parse(self, parser):
            next(parser.stream)
            return parser.parse_statements(("name:endgeneration",), drop_needle=True)

    return Generation


@lru_cache(maxsize=8)
def _compile(source: str):
    from jinja2.ext import loopcontrols
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[loopcontrols, _generation_tag()])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    return env.from_string(source)


@lru_cache(maxsize=8)
def _loops_over_content(source: str) -> bool:
    """Whether a template iterates a message's content (`{% for part in message['content'] %}`,
    directly or through a variable set from it), reading it as a list of parts, as
    multimodal-style templates (Idefics', SmolVLM's, Llama 3.2 Vision's) do: vLLM's "openai"
    content format, detected as vLLM detects it."""
    from jinja2 import nodes
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def reads_content(node: nodes.Node) -> bool:
        return (isinstance(node, nodes.Getitem) and isinstance(node.arg, nodes.Const) and node.arg.value == "content") \
            or (isinstance(node, nodes.Getattr) and node.attr == "content")

    try:
        tree = ImmutableSandboxedEnvironment(extensions=[_generation_tag()]).parse(source)
    except Exception:  # noqa: BLE001 (compiling it reports the template's fault)
        return False
    names = {assign.target.name for assign in tree.find_all(nodes.Assign)
             if isinstance(assign.target, nodes.Name) and reads_content(assign.node)}
    return any(reads_content(loop.iter) or (isinstance(loop.iter, nodes.Name) and loop.iter.name in names)
               for loop in tree.find_all(nodes.For))


def tokenizer_config(model_dir: Path) -> dict:
    """tokenizer_config.json of a model directory ({} when there is none)."""
    path = model_dir / "tokenizer_config.json"
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}


def special_token_text(value: Any) -> str | None:
    """A special token as tokenizer_config.json gives it: a string, or an AddedToken object."""
    if isinstance(value, dict):
        return value.get("content")
    return value


# The special tokens transformers hands a template by name (its special_tokens_map: the ones set).
SPECIAL_TOKEN_NAMES = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token")


def special_tokens(config: dict) -> dict[str, Any]:
    """The special tokens tokenizer_config.json sets, by the names a template uses; one not set
    stays undefined in the template, which renders it as "" and tests it as false."""
    return {name: special_token_text(config[name]) for name in SPECIAL_TOKEN_NAMES if config.get(name)}


class ChatTemplate:
    """A checkpoint's template, and its tool-use variant where it has named templates with one
    ("tool_use", used when the request has tools, as transformers picks it).

    Compiled when a request first renders it, as transformers compiles it: importing jinja2 and
    compiling Qwen3's template took 18 ms of the demo model's startup, and a server that serves
    only decisions (completions, scores, embeddings) never renders one. A template that does not
    compile fails the requests that render it (TemplateCompileError)."""

    def __init__(self, source: str, special: dict[str, Any] | None = None, tool_use: str | None = None):
        self.source = source
        self.special = special or {}
        self.tool_use = tool_use

    @classmethod
    def from_dir(cls, model_dir: str | Path) -> ChatTemplate | None:
        """The template of a model directory: chat_template.jinja, else tokenizer_config.json's
        chat_template (a string, or a list of named templates: "default", and "tool_use" for
        requests with tools); "tool_use" also as additional_chat_templates/tool_use.jinja, where
        transformers saves named templates now (requests with tools got the default one)."""
        model_dir = Path(model_dir)
        config = tokenizer_config(model_dir)
        jinja_path = model_dir / "chat_template.jinja"
        source = jinja_path.read_text(encoding="utf-8") if jinja_path.is_file() else config.get("chat_template")
        tool_use = None
        if isinstance(source, list):
            named = {t.get("name"): t.get("template") for t in source}
            source = named.get("default") or next(iter(named.values()), None)
            tool_use = named.get("tool_use")
        saved = model_dir / "additional_chat_templates" / "tool_use.jinja"
        if tool_use is None and saved.is_file():
            tool_use = saved.read_text(encoding="utf-8")
        if not source:
            return None
        return cls(source, special_tokens(config), tool_use)

    def reads_content_parts(self, tools: bool) -> bool:
        """Whether the template that renders a request (with or without tools) reads a
        message's content as a list of text parts rather than a string."""
        return _loops_over_content(self._source(tools))

    def _source(self, tools: bool) -> str:
        return self.tool_use if tools and self.tool_use else self.source

    def render(self, messages: list[dict], add_generation_prompt: bool = True,
               tools: list[dict] | None = None, **kwargs: Any) -> str:
        """As apply_chat_template(tokenize=False): the request's template kwargs override the
        special tokens of the same name."""
        try:
            template = _compile(self._source(tools is not None))
        except Exception as exc:  # jinja2's TemplateSyntaxError and kin
            raise TemplateCompileError(f"the model's chat template does not compile: {exc}") from exc
        messages = [_with_reasoning_aliases(m) for m in messages]
        try:
            return template.render({**self.special, **kwargs, "messages": messages,
                                    "add_generation_prompt": add_generation_prompt, "tools": tools})
        except ChatTemplateError:
            raise
        except Exception as exc:  # jinja errors name the template problem
            raise ChatTemplateError(f"chat template failed: {exc}") from exc


# The names a message's reasoning comes by: vLLM 0.32 reads `reasoning` (and hands the template
# both it and `reasoning_content`), older clients send `reasoning_content`, gpt-oss templates
# read `thinking`.
REASONING_FIELDS = ("reasoning_content", "thinking", "reasoning")


def _with_reasoning_aliases(message: Any) -> Any:
    """The message with its reasoning under `reasoning_content` and `thinking` too, whichever
    name it came by, as transformers hands it to a template: Qwen3's template reads
    `reasoning_content` only, so a `reasoning` sent as vLLM 0.32 names it was dropped, and the
    turn rendered an empty think block."""
    if not isinstance(message, dict):
        return message
    reasoning = next((message[key] for key in REASONING_FIELDS if message.get(key) is not None), None)
    return message if reasoning is None else {"thinking": reasoning, **message, "reasoning_content": reasoning}
