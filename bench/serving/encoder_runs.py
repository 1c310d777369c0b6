"""One peer's turn in the encoder benchmark: start it, check its answers against the reference,
run its cells, read its memory, stop it. A server is driven closed-loop by the load generator's
client (bench.serving.core.runner) with CPU read from /proc for its whole process tree; an
in-process library runs bench/serving/encoder_inproc.py in a subprocess of the interpreter that
has it, which times its own calls."""
from __future__ import annotations

import asyncio
import json
import random
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

import httpx

from bench.serving.core import encoder_peers as peers
from bench.serving.core import proc
from bench.serving.core.encoder_data import Cell, CrossEncoder, Texts
from bench.serving.core.runner import Level, Limits, RunResult, run_level
from bench.serving.core.server import ServerError, ServerProcess
from bench.serving.core.stats import percentile
from bench.serving.core.workloads import Job, Workload

INPROC_SCRIPT = Path(__file__).with_name("encoder_inproc.py")
MAX_REQUESTS = 100_000  # a cell's request cap; its duration is what ends it
# Other processes' CPU during a cell (cores) above which its figures shared the machine: the cell is
# measured again, up to Budget.retries times, and the least shared attempt kept.
BUSY_CORES = 0.15
QUIET_WAIT_S = 60.0  # before measuring a cell again, wait at most this long for the other work to stop


@dataclass(frozen=True, slots=True)
class Budget:
    """How long each cell runs: `seconds` of requests after `warmup` unmeasured ones."""

    seconds: float
    warmup: int = 2
    startup_timeout: float = 600.0
    retries: int = 2


@dataclass(slots=True)
class CellResult:
    cell: Cell
    requests: int
    errors: int
    seconds: float
    texts_per_s: float
    requests_per_s: float
    p50_ms: float | None
    p99_ms: float | None
    cpu_ms_per_text: float | None  # server process tree (in process: the library's process)
    client_cores: float | None = None  # the HTTP client's CPU over the cell, in cores
    other_cores: float | None = None  # every other process's CPU over the cell, in cores
    error_samples: list[str] = field(default_factory=list)
    attempts: int = 1  # measured this many times (other work on the machine): the least shared one is kept


@dataclass(slots=True)
class Turn:
    """A peer serving one task (embed or rerank): a server, or one in-process subprocess."""

    peer: str
    task: str
    mode: str
    engine: str
    version: str
    startup_s: float | None = None
    rss_ready_mb: float | None = None
    rss_after_mb: float | None = None
    peak_rss_mb: float | None = None
    check: str | None = None  # its answers against the reference, in words
    cells: list[CellResult] = field(default_factory=list)
    failed: str | None = None  # why it did not run (or stopped), in words
    log: str | None = None
    # A fixed GEMM's P50 (bench.serving.host_noise) timed just before the turn, one per round: the
    # 2-core host's speed drifts by tens of percent over minutes, and peers run minutes apart.
    host_gemm_ms: list[float] = field(default_factory=list)
    rounds: int = 1


def _mb(value: int | None) -> float | None:
    return None if value is None else value / 2**20


class EncoderLoad(Workload):
    """A cell's requests: each takes the next `batch` texts of its pool, in order, warmup first.
    A body is built once per start offset (the pool wraps), so a long cell costs no memory."""

    def __init__(self, cell: Cell, peer: peers.Peer, model: str | None, texts: Texts):
        self.cell, self.peer, self.model, self.texts = cell, peer, model, texts
        self.rows_per_request = cell.batch
        self.path = peer.rerank_path if cell.task == "rerank" else peer.embed_path
        self.cursor = 0
        self.bodies: dict[int, Job] = {}

    @property
    def label(self) -> str:
        return self.cell.shape

    @property
    def streamed(self) -> bool:
        return False

    def _job(self, index: int) -> Job:
        if self.cell.task == "rerank":
            index %= len(self.texts.rerank)
            if index not in self.bodies:
                query, docs = self.texts.rerank[index]
                self.bodies[index] = Job(self.path, peers.rerank_body(self.model, query, docs), False, 0, 0)
            return self.bodies[index]
        pool = self.texts.pool(self.cell.kind)
        start = (index * self.cell.batch) % len(pool)
        if start not in self.bodies:
            chunk = [pool[(start + i) % len(pool)] for i in range(self.cell.batch)]
            self.bodies[start] = Job(self.path, peers.embed_body(self.model, chunk), False, 0, 0)
        return self.bodies[start]

    def jobs(self, count: int, rng: random.Random) -> list[Job]:
        out = [self._job(self.cursor + i) for i in range(count)]
        self.cursor += count
        return out


def cell_result(cell: Cell, run: RunResult) -> CellResult:
    s = run.summary
    texts = s.completed * cell.batch
    other = None
    if run.machine_busy_s is not None and run.server_cpu_s is not None and s.duration_s:
        other = max(0.0, run.machine_busy_s - run.server_cpu_s - run.client_cpu_s) / s.duration_s
    return CellResult(cell, s.completed, s.errors, s.duration_s, run.rows_per_s, s.request_rate,
                      None if s.e2e.p50 is None else s.e2e.p50 * 1000, None if s.e2e.p99 is None else s.e2e.p99 * 1000,
                      run.server_cpu_s / texts * 1000 if run.server_cpu_s is not None and texts else None,
                      run.client_cpu_share, other, s.error_samples)


async def _probe(peer: peers.Peer, base_url: str, task: str, texts: Texts, xenc: CrossEncoder | None,
                 reference: list[list[float]] | None) -> tuple[str | None, str]:
    """The served model's name and the check of one answer."""
    async with httpx.AsyncClient(base_url=base_url, timeout=120.0) as client:
        model = None
        try:
            resp = await client.get(peer.models_path)
            model = resp.json()["data"][0]["id"] if resp.status_code == 200 else None
        except (httpx.HTTPError, ValueError, KeyError, IndexError):
            pass
        if task == "rerank":
            assert xenc is not None and peer.rerank_path is not None
            body = peers.rerank_body(model, xenc.probe_query, xenc.probe_docs)
            resp = await client.post(peer.rerank_path, content=body, headers={"content-type": "application/json"})
            resp.raise_for_status()
            return model, peers.score_check(peers.rerank_scores(resp.json(), len(xenc.probe_docs)), xenc)
        resp = await client.post(peer.embed_path, content=peers.embed_body(model, texts.probe),
                                 headers={"content-type": "application/json"})
        resp.raise_for_status()
        vectors = peers.embeddings(resp.json())
        return model, peers.cosine_check(vectors, reference) if reference else f"{len(vectors)} vectors"


def _say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def wait_quiet(pid: int, limit_s: float = QUIET_WAIT_S) -> None:
    """Returns after a second in which processes other than `pid`'s tree and this one used under
    BUSY_CORES, or after `limit_s`."""
    began = time.perf_counter()
    while time.perf_counter() - began < limit_s:
        busy0, server0, own0 = proc.machine_busy_seconds(), proc.cpu_seconds(pid), time.process_time()
        time.sleep(1.0)
        busy1, server1, own1 = proc.machine_busy_seconds(), proc.cpu_seconds(pid), time.process_time()
        if None in (busy0, busy1, server0, server1):
            return
        if busy1 - busy0 - (server1 - server0) - (own1 - own0) < BUSY_CORES:
            return


def _busy(result: CellResult) -> bool:
    return result.other_cores is not None and result.other_cores > BUSY_CORES


def _measure(cell: Cell, peer: peers.Peer, model: str | None, texts: Texts, budget: Budget,
             server: ServerProcess) -> CellResult:
    run = asyncio.run(run_level(server.base_url, EncoderLoad(cell, peer, model, texts),
                                Level("concurrency", cell.concurrency), Limits(MAX_REQUESTS, budget.seconds,
                                                                               budget.warmup),
                                random.Random(0), peer.name, server.pid, show_progress=False))
    return cell_result(cell, run)


def http_turn(peer: peers.Peer, task: str, model_dir: Path, cells: Sequence[Cell], texts: Texts, budget: Budget,
              tools: peers.Tools, scratch: Path, log_dir: Path, xenc: CrossEncoder | None = None,
              reference: list[list[float]] | None = None) -> Turn:
    turn = Turn(peer.name, task, peer.mode, peer.engine, peers.version(peer, tools))
    log = log_dir / f"{peer.name}-{task}.log"
    server = ServerProcess([], peers.command(peer, model_dir, tools), peers.environment(peer, scratch), log,
                           f"{peer.name}-{task}")
    turn.log = str(log)
    _say(f"{peer.name} {task}: starting ({' '.join(server.argv)})")
    try:
        turn.startup_s = server.start(budget.startup_timeout)
        turn.rss_ready_mb = _mb(proc.rss_bytes(server.pid))
        model, turn.check = asyncio.run(_probe(peer, server.base_url, task, texts, xenc, reference))
        _say(f"{peer.name} {task}: ready in {turn.startup_s:.1f}s; {turn.check}")
        for cell in cells:
            result = _measure(cell, peer, model, texts, budget, server)
            while _busy(result) and result.attempts <= budget.retries:
                _say(f"  {peer.name} {cell.key}: other processes used {result.other_cores:.2f} cores; again")
                wait_quiet(server.pid)
                again = _measure(cell, peer, model, texts, budget, server)
                again.attempts = result.attempts + 1
                if (again.other_cores or 0.0) < (result.other_cores or 0.0):
                    result = again
                else:
                    result.attempts = again.attempts
            turn.cells.append(result)
            _say(f"  {peer.name} {cell.key}: {result.texts_per_s:.1f} texts/s, {result.requests} ok, "
                 f"{result.errors} errors")
        turn.rss_after_mb = _mb(proc.rss_bytes(server.pid))
        turn.peak_rss_mb = _mb(proc.peak_rss_bytes(server.pid))
    except (ServerError, httpx.HTTPError, ValueError, KeyError, OSError) as exc:
        turn.failed = f"{type(exc).__name__}: {str(exc).strip().splitlines()[0][:300]}"
        _say(f"{peer.name} {task}: FAILED {turn.failed}")
    finally:
        server.stop()
    return turn


def inproc_turn(peer: peers.Peer, model_dir: Path, cells: Sequence[Cell], texts_file: Path, budget: Budget,
                tools: peers.Tools, log_dir: Path, reference: list[list[float]] | None = None) -> Turn:
    """The library's calls at concurrency 1: a cell's c=16 has no in-process meaning and is skipped."""
    turn = Turn(peer.name, "embed", peer.mode, peer.engine, peers.version(peer, tools))
    shapes = list(dict.fromkeys((c.kind, c.batch) for c in cells if c.concurrency == 1))
    log = log_dir / f"{peer.name}-embed.log"
    turn.log = str(log)
    argv = [peers.inproc_python(peer, tools), str(INPROC_SCRIPT), "--lib", peer.name, "--model", str(model_dir),
            "--texts", str(texts_file), "--cells", ",".join(f"{k}:{b}" for k, b in shapes),
            "--duration", str(budget.seconds), "--warmup", str(budget.warmup), "--retries", str(budget.retries),
            "--busy-cores", str(BUSY_CORES), "--spawned-at", repr(time.time())]
    _say(f"{peer.name}: in process ({' '.join(argv[:4])} ...)")
    with open(log, "w") as err:
        done = subprocess.run(argv, stdout=subprocess.PIPE, stderr=err, text=True,
                              env=peers.environment(peer, log_dir), timeout=budget.startup_timeout + 60 * len(shapes)
                              + budget.seconds * 4 * len(shapes))
    if done.returncode != 0:
        turn.failed = f"exit {done.returncode}: {proc_tail(log)}"
        return turn
    out = json.loads(done.stdout)
    turn.version, turn.startup_s = f"{peer.name} {out['version']}", out["startup_s"]
    turn.rss_ready_mb, turn.rss_after_mb = _mb(out["rss_ready"]), _mb(out["rss_after"])
    turn.peak_rss_mb = _mb(out["peak_rss"])
    turn.check = peers.cosine_check(out["probe"], reference) if reference else None
    for raw in out["cells"]:
        cell = Cell("embed", raw["kind"], raw["batch"], 1)
        lat = raw["latencies"]
        turn.cells.append(CellResult(
            cell, raw["calls"], 0, raw["seconds"], raw["texts"] / raw["seconds"], raw["calls"] / raw["seconds"],
            percentile(lat, 50) * 1000, percentile(lat, 99) * 1000, raw["cpu_s"] / raw["texts"] * 1000,
            other_cores=raw.get("other_cores"), attempts=raw.get("attempts", 1)))
    return turn


def best_rounds(turns: Sequence[Turn]) -> list[Turn]:
    """One turn per (peer, task) from several rounds: each cell's fastest round (a slow phase of
    the host or other work only ever takes speed away), the quickest startup, the most memory."""
    merged: dict[tuple[str, str], Turn] = {}
    for t in turns:
        key = (t.peer, t.task)
        if key not in merged:
            merged[key] = Turn(t.peer, t.task, t.mode, t.engine, t.version, t.startup_s, t.rss_ready_mb,
                               t.rss_after_mb, t.peak_rss_mb, t.check, list(t.cells), t.failed, t.log,
                               list(t.host_gemm_ms), 1)
            continue
        m = merged[key]
        m.rounds += 1
        m.host_gemm_ms += t.host_gemm_ms
        if t.version not in m.version.split(" / "):  # Prelude's checkout moved between rounds
            m.version += " / " + t.version
        if t.failed:
            continue
        if m.failed:  # an earlier round failed: this one is the figures
            m.failed, m.check = None, t.check
        m.startup_s = min(x for x in (m.startup_s, t.startup_s) if x is not None) if t.startup_s else m.startup_s
        for name in ("rss_ready_mb", "rss_after_mb", "peak_rss_mb"):
            values = [v for v in (getattr(m, name), getattr(t, name)) if v is not None]
            setattr(m, name, max(values) if values else None)
        best = {r.cell: r for r in m.cells}
        for r in t.cells:
            if r.cell not in best or r.texts_per_s > best[r.cell].texts_per_s:
                best[r.cell] = r
        m.cells = list(best.values())
    return list(merged.values())


def proc_tail(log: Path) -> str:
    lines = [line for line in log.read_text(errors="replace").splitlines() if line.strip()]
    return lines[-1][:300] if lines else "(no output)"


def reference_vectors(model_dir: Path, texts_file: Path, tools: peers.Tools, log_dir: Path) -> list[list[float]]:
    """sentence-transformers' vectors of the probe texts: what every peer's are checked against."""
    argv = [tools.python, str(INPROC_SCRIPT), "--lib", "sentence-transformers", "--model", str(model_dir),
            "--texts", str(texts_file)]
    with open(log_dir / "reference.log", "w") as err:
        done = subprocess.run(argv, stdout=subprocess.PIPE, stderr=err, text=True, check=True, timeout=600,
                              env=peers.environment(peers.PEERS["sentence-transformers"], log_dir))
    return json.loads(done.stdout)["probe"]
