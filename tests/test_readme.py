"""The README's request examples work: every `curl` command in its bash blocks, and every JSON
block introduced by "`POST /route`", is replayed over real HTTP against the embedded demo model
(port 8000 in the README) or its classifier variant (port 8001), and must answer 2xx."""
from __future__ import annotations

import json
import re
import shlex
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import pytest

from prelude.contract.config import Config
from prelude.demo import build_demo_classifier
from tests.server.harness import ServerThread

README = Path(__file__).resolve().parents[1] / "README.md"
FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.MULTILINE | re.DOTALL)
POST_LINE = re.compile(r"`POST (/\S*)`")
PORTS = {8000: "lm", 8001: "classifier"}  # what the README serves where


@dataclass(frozen=True)
class Example:
    line: int  # in README.md, for the failure message
    method: str
    port: int
    path: str
    body: bytes | None
    headers: dict[str, str]

    def __str__(self) -> str:
        return f"README.md:{self.line} {self.method} :{self.port}{self.path}"


def shell_commands(block: str) -> list[tuple[int, str]]:
    """(line offset, command) per shell command: comment lines dropped, backslash continuations
    joined, and a quoted argument may span lines."""
    out, pending, start = [], "", 0
    for i, line in enumerate(block.splitlines()):
        if not pending and (not line.strip() or line.lstrip().startswith("#")):
            continue
        if not pending:
            start = i
        pending += line[:-1] + " " if line.endswith("\\") else line + "\n"
        if line.endswith("\\"):
            continue
        try:
            shlex.split(pending)
        except ValueError:  # a quote still open: the argument goes on on the next line
            continue
        out.append((start, pending.strip()))
        pending = ""
    return out


def curl_example(line: int, command: str) -> Example | None:
    args = shlex.split(command)
    if not args or args[0] != "curl":
        return None
    url, body, headers, uds, i = None, None, {}, False, 1
    while i < len(args):
        arg = args[i]
        if arg == "--unix-socket":  # the sidecar's socket: replayed on the demo server's TCP port
            uds, i = True, i + 2
        elif arg in ("-d", "--data", "--data-raw"):
            body, i = args[i + 1].encode(), i + 2
        elif arg in ("-H", "--header"):
            name, _, value = args[i + 1].partition(":")
            headers[name.strip()], i = value.strip(), i + 2
        elif arg.startswith("-"):
            i += 1  # -N, -s, ...: no effect on the request
        else:
            url, i = arg, i + 1
    assert url is not None, f"README.md:{line}: curl without a URL"
    parts = urlsplit(url if "://" in url else "http://" + url)
    port = 8000 if uds else parts.port or 80
    return Example(line, "POST" if body is not None else "GET", port, parts.path, body, headers)


def examples() -> list[Example]:
    text = README.read_text()
    found = []
    for match in FENCE.finditer(text):
        kind, block = match.group(1), match.group(2)
        first_line = text.count("\n", 0, match.start(2)) + 1
        if kind == "bash":
            for offset, command in shell_commands(block):
                example = curl_example(first_line + offset, command)
                if example is not None:
                    found.append(example)
        elif kind == "json":
            before = text[:match.start()].rstrip().splitlines()[-1] if text[:match.start()].strip() else ""
            route = POST_LINE.search(before)
            if route:  # a request body; JSON blocks without "`POST /route`" before them are outputs
                json.loads(block)
                found.append(Example(first_line, "POST", 8000, route.group(1), block.encode(),
                                     {"Content-Type": "application/json"}))
    return found


EXAMPLES = examples()


def test_the_readme_has_examples_of_every_endpoint():
    routes = {e.path for e in EXAMPLES}
    for route in ("/health", "/v1/models", "/v1/completions", "/v1/chat/completions", "/tokenize", "/detokenize",
                  "/metrics", "/v1/embeddings", "/classify", "/pooling", "/v1/score", "/v1/rerank", "/ready"):
        assert route in routes, route
    assert {e.port for e in EXAMPLES} <= set(PORTS), "README examples use ports 8000 (demo) and 8001 (classifier)"


@pytest.fixture(scope="module")
def servers(demo_model, tmp_path_factory):
    classifier = tmp_path_factory.mktemp("demo-classifier")
    build_demo_classifier(demo_model, classifier)
    with ServerThread(Config(model=str(demo_model))) as lm, ServerThread(Config(model=str(classifier))) as cls:
        yield {"lm": lm, "classifier": cls}


@pytest.mark.parametrize("example", EXAMPLES, ids=str)
def test_readme_example_succeeds(servers, example):
    server = servers[PORTS[example.port]]
    response = httpx.request(example.method, server.base_url + example.path, content=example.body,
                             headers=example.headers, timeout=120)
    assert 200 <= response.status_code < 300, f"{example}: {response.status_code} {response.text[:300]}"
    if response.headers.get("content-type", "").startswith("application/json"):
        response.json()
