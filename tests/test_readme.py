"""The README's and docs' examples work. Every `curl` command in their bash blocks, and every JSON
block introduced by "`POST /route`", is replayed over real HTTP against the embedded demo model
(port 8000 in the docs) or its classifier variant (port 8001), and must answer 2xx; every route
the app serves has an example. Every `python -m MODULE` they and the benchmarks' READMEs name
answers `--help`."""
from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import pytest

from prelude.contract.config import Config
from prelude.demo import build_demo_classifier
from tests.server.harness import ServerThread

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
# The benchmarks' and the tokenizer's own READMEs name commands too (their --help is checked).
COMMAND_DOCS = [*DOCS, *sorted(ROOT.glob("bench/**/README.md")),
                *sorted(ROOT.glob("prelude/**/README.md"))]
FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.MULTILINE | re.DOTALL)
POST_LINE = re.compile(r"`POST (/\S*)`")
PYTHON_M = re.compile(r"python\s+-m\s+([A-Za-z_][\w.]*)")  # a command may wrap a line
PORTS = {8000: "lm", 8001: "classifier"}  # what the docs serve where
OPTIONAL = ("fastokens", "kitoken")  # bench.tokenizer's rivals: `pip install fastokens kitoken`
# Routes documented by name beside the example of the route they alias.
ALIASES = {"/get_model_info": "/model_info", "/get_server_info": "/server_info",
           "/v1/classify": "/classify", "/score": "/v1/score", "/flush_cache": "/reset_prefix_cache"}


@dataclass(frozen=True)
class Example:
    where: str  # file:line, for the failure message
    method: str
    port: int
    path: str
    body: bytes | None
    headers: dict[str, str]

    def __str__(self) -> str:
        return f"{self.where} {self.method} :{self.port}{self.path}"


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


def curl_example(where: str, command: str) -> Example | None:
    args = shlex.split(command)
    if not args or args[0] != "curl":
        return None
    url, body, headers, uds, method, i = None, None, {}, False, None, 1
    while i < len(args):
        arg = args[i]
        if arg == "--unix-socket":  # the sidecar's socket: replayed on the demo server's TCP port
            uds, i = True, i + 2
        elif arg in ("-X", "--request"):
            method, i = args[i + 1], i + 2
        elif arg in ("-d", "--data", "--data-raw"):
            body, i = args[i + 1].encode(), i + 2
        elif arg in ("-H", "--header"):
            name, _, value = args[i + 1].partition(":")
            headers[name.strip()], i = value.strip(), i + 2
        elif arg.startswith("-"):
            i += 1  # -N, -s, ...: no effect on the request
        else:
            url, i = arg, i + 1
    assert url is not None, f"{where}: curl without a URL"
    parts = urlsplit(url if "://" in url else "http://" + url)
    port = 8000 if uds else parts.port or 80
    method = method or ("POST" if body is not None else "GET")
    return Example(where, method, port, parts.path, body, headers)


def examples_in(doc: Path) -> list[Example]:
    text, name = doc.read_text(), doc.relative_to(ROOT).as_posix()
    found = []
    for match in FENCE.finditer(text):
        kind, block = match.group(1), match.group(2)
        first_line = text.count("\n", 0, match.start(2)) + 1
        if kind == "bash":
            for offset, command in shell_commands(block):
                example = curl_example(f"{name}:{first_line + offset}", command)
                if example is not None:
                    found.append(example)
        elif kind == "json":
            preceding = text[:match.start()].rstrip().splitlines()
            before = preceding[-1] if preceding else ""
            route = POST_LINE.search(before)
            if route:  # a request body; JSON blocks without "`POST /route`" before them are outputs
                json.loads(block)
                found.append(Example(f"{name}:{first_line}", "POST", 8000, route.group(1),
                                     block.encode(), {"Content-Type": "application/json"}))
    return found


EXAMPLES = [example for doc in DOCS for example in examples_in(doc)]


def served_routes() -> set[str]:
    """Every path the app routes, read from where server/app.py lists them."""
    source = (ROOT / "prelude/server/app.py").read_text()
    return set(re.findall(r"\(\s*\"(/[\w/]*)\"", source))


def test_every_route_has_an_example():
    routes = served_routes()
    assert {"/health", "/v1/completions", "/v1/embeddings", "/classify", "/tokenize"} <= routes
    replayed = {e.path for e in EXAMPLES}
    api = (ROOT / "docs/api.md").read_text()
    for route in sorted(routes):
        if route in ALIASES:
            named = re.search(rf"(?<![\w/]){re.escape(route)}(?![\w/])", api)
            assert ALIASES[route] in replayed and named, f"{route}: name it in docs/api.md"
        else:
            assert route in replayed, f"{route} has no replayed example in README.md or docs/"
    assert {e.port for e in EXAMPLES} <= set(PORTS), "ports 8000 (demo) and 8001 (classifier)"


def test_the_readme_opens_with_the_install_and_test_commands():
    """Two commands on a fresh machine: install + serve, and the tests, which is what CI runs."""
    readme = (ROOT / "README.md").read_text()
    blocks = [m.group(2).strip() for m in FENCE.finditer(readme) if m.group(1) == "bash"]
    install_and_serve, test = blocks[0], blocks[1]
    assert "pip install" in install_and_serve and "python -m prelude" in install_and_serve
    assert "\n" not in install_and_serve and "\n" not in test
    ci = [line.strip() for line in (ROOT / ".ci/run").read_text().splitlines()]
    assert install_and_serve.split(" && ")[0] in ci, "`.ci/run` installs exactly as the README does"
    assert ci[-1] == test, "`.ci/run` ends with exactly the README's test command"


LINK = re.compile(r"\]\(([^)\s]+)\)")
HEADING = re.compile(r"^#+ (.+)$", re.MULTILINE)


def anchors(doc: Path) -> set[str]:
    """GitHub's heading anchors: lower case, punctuation dropped, spaces as hyphens."""
    text = FENCE.sub("", doc.read_text())
    return {re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
            for heading in HEADING.findall(text)}


def test_links_between_the_docs_resolve():
    broken = []
    for doc in DOCS:
        for target in LINK.findall(FENCE.sub("", doc.read_text())):
            if "://" in target:
                continue
            path, _, anchor = target.partition("#")
            linked = (doc.parent / path).resolve() if path else doc
            unknown_anchor = anchor and linked.suffix == ".md" and anchor not in anchors(linked)
            if not linked.exists() or unknown_anchor:
                broken.append(f"{doc.relative_to(ROOT)}: {target}")
    assert not broken, broken


@pytest.fixture(scope="module")
def servers(demo_model, tmp_path_factory):
    classifier = tmp_path_factory.mktemp("demo-classifier")
    build_demo_classifier(demo_model, classifier)
    # served under the default demo's name, which the docs' URLs use
    with ServerThread(Config(model=str(demo_model), served_model_name="prelude-demo")) as lm:
        with ServerThread(Config(model=str(classifier))) as cls:
            yield {"lm": lm, "classifier": cls}


@pytest.mark.parametrize("example", EXAMPLES, ids=str)
def test_example_succeeds(servers, example):
    server = servers[PORTS[example.port]]
    response = httpx.request(example.method, server.base_url + example.path, content=example.body,
                             headers=example.headers, timeout=120)
    status = response.status_code
    assert 200 <= status < 300, f"{example}: {status} {response.text[:300]}"
    if response.headers.get("content-type", "").startswith("application/json"):
        response.json()


# Runs each module as `python -m MODULE --help` would, all in one interpreter (torch imported
# once), and reports how each ended.
HELP_PROBE = r"""
import contextlib, io, json, runpy, sys
results = {}
for module in sys.argv[1:]:
    out = io.StringIO()
    sys.argv = [module, "--help"]
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
            runpy.run_module(module, run_name="__main__", alter_sys=True)
        code = "ran to the end without answering --help"
    except SystemExit as stop:
        code = stop.code
    except BaseException as error:
        code = f"{type(error).__name__}: {error}"
    results[module] = [code, out.getvalue()[-400:]]
print("HELP-RESULTS " + json.dumps(results, default=str))
"""


def test_every_python_m_command_answers_help():
    named = (m for doc in COMMAND_DOCS for m in PYTHON_M.findall(doc.read_text()))
    modules = sorted({m.rstrip(".") for m in named})
    assert "prelude" in modules and "bench.serving.side_by_side" in modules
    run = subprocess.run([sys.executable, "-c", HELP_PROBE, *modules], cwd=ROOT,
                         capture_output=True, text=True, timeout=600)
    line = next((x for x in run.stdout.splitlines() if x.startswith("HELP-RESULTS ")), None)
    assert line is not None, run.stdout[-2000:] + run.stderr[-2000:]
    # 0: argparse's help; a usage line: a module with fixed arguments (prelude.demo); or an
    # optional benchmark-only library missing (it is not in the dev extra)
    missing = {f"ModuleNotFoundError: No module named '{name}'" for name in OPTIONAL}
    failed = {}
    for module, (code, output) in json.loads(line.removeprefix("HELP-RESULTS ")).items():
        answered = code in (0, None) or (isinstance(code, str) and code.startswith("usage:"))
        if not answered and code not in missing:
            failed[module] = (code, output)
    assert not failed, failed
