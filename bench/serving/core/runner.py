"""Driving a target: closed-loop (a fixed number of requests always in flight) and open-loop
(Poisson arrivals that never wait for completions), each bounded by a request count and a time
limit, with warmup requests run first and left out of the results."""
from __future__ import annotations

import asyncio
import random
import time
from dataclasses import dataclass, field
from typing import Sequence

from bench import progress
from bench.serving.core import proc
from bench.serving.core.client import ClientPool
from bench.serving.core.stats import RequestRecord, RunSummary, poisson_arrivals, summarize
from bench.serving.core.workloads import Job, Workload


@dataclass(frozen=True, slots=True)
class Level:
    """One load level: a closed-loop concurrency or an open-loop request rate."""

    mode: str  # "concurrency" | "qps"
    value: float

    @property
    def label(self) -> str:
        return f"c={self.value:g}" if self.mode == "concurrency" else f"qps={self.value:g}"


@dataclass(frozen=True, slots=True)
class Limits:
    num_requests: int
    duration: float | None = None  # seconds; None: only the count bounds a run
    warmup: int = 0
    timeout: float = 600.0
    open_loop_connections: int = 1024  # enough that Poisson sends never queue inside the client


@dataclass(slots=True)
class RunResult:
    server: str
    workload: str
    level: Level
    summary: RunSummary
    client_cpu_s: float  # this process's CPU in the window: a busy client skews latency
    server_cpu_s: float | None = None  # when the server's pid is known (a server we launched)
    max_send_lag_s: float = 0.0  # open loop: how far sends fell behind their Poisson schedule
    records: list[RequestRecord] = field(default_factory=list)
    rows_per_request: int = 1  # forward rows one request carries (score: its items)
    machine_busy_s: float | None = None  # every process's CPU in the window (Linux)

    @property
    def rows_per_s(self) -> float:
        return self.summary.request_rate * self.rows_per_request

    @property
    def client_cpu_share(self) -> float | None:
        """Cores' worth of CPU this process used over the run's window (1.0: one full core)."""
        return self.client_cpu_s / self.summary.duration_s if self.summary.duration_s else None

    @property
    def server_cpu_us_per_request(self) -> float | None:
        if self.server_cpu_s is None or not self.summary.completed:
            return None
        return self.server_cpu_s / self.summary.completed * 1e6


class Progress:
    """A level's progress bar (bench.progress), with the error count beside it."""

    def __init__(self, label: str, total: int, enabled: bool = True):
        self.bar = progress.bar(total, label, enabled, unit="req")
        self.errors = 0

    def update(self, record: RequestRecord) -> None:
        if not record.ok:
            self.errors += 1
            self.bar.set_postfix(err=self.errors, refresh=False)
        self.bar.update(1)

    def close(self) -> None:
        self.bar.close()


async def closed_loop(client: ClientPool, jobs: Sequence[Job], concurrency: int,
                      duration: float | None = None, progress: Progress | None = None) -> list[RequestRecord]:
    """`concurrency` workers, each sending its next request as soon as the last one ends."""
    records: list[RequestRecord] = []
    pending = iter(jobs)  # shared: each job is taken by exactly one worker
    deadline = time.perf_counter() + duration if duration else None

    async def worker() -> None:
        for job in pending:
            if deadline is not None and time.perf_counter() >= deadline:
                return
            record = await client.send(job)
            records.append(record)
            if progress is not None:
                progress.update(record)

    await asyncio.gather(*(worker() for _ in range(max(1, int(concurrency)))))
    return records


async def open_loop(client: ClientPool, jobs: Sequence[Job], arrivals: Sequence[float],
                    progress: Progress | None = None) -> tuple[list[RequestRecord], float]:
    """Sends job i at arrivals[i] seconds after the start, whatever is still in flight. Returns
    the records and the largest delay of a send behind its schedule."""
    async def one(job: Job) -> RequestRecord:
        record = await client.send(job)
        if progress is not None:
            progress.update(record)
        return record

    tasks: list[asyncio.Task] = []
    lag = 0.0
    start = time.perf_counter()
    for job, at in zip(jobs, arrivals):
        delay = start + at - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        lag = max(lag, time.perf_counter() - start - at)
        tasks.append(asyncio.create_task(one(job)))
    return list(await asyncio.gather(*tasks)), lag


async def run_level(base_url: str, workload: Workload, level: Level, limits: Limits, rng: random.Random,
                    server: str = "target", server_pid: int | None = None, api_key: str | None = None,
                    show_progress: bool = True, keep_records: bool = False) -> RunResult:
    """Warmup, then one measured run of `workload` at `level`."""
    if level.mode == "concurrency":
        connections = max(1, int(level.value))
        count = limits.num_requests
        arrivals: list[float] = []
    else:
        connections = limits.open_loop_connections
        arrivals = poisson_arrivals(level.value, rng, count=limits.num_requests, horizon=limits.duration)
        count = len(arrivals)
    warmup_jobs = workload.jobs(limits.warmup, rng)
    jobs = workload.jobs(count, rng)
    async with ClientPool(base_url, connections, limits.timeout, api_key) as client:
        if level.mode == "concurrency":
            await client.open_connections(connections)
        if warmup_jobs:
            await closed_loop(client, warmup_jobs, min(connections, len(warmup_jobs)))
        progress = Progress(f"{server} {workload.label} {level.label}", count, enabled=show_progress)
        server_cpu0 = proc.cpu_seconds(server_pid) if server_pid else None
        busy0 = proc.machine_busy_seconds()
        client_cpu0 = time.process_time()
        lag = 0.0
        if level.mode == "concurrency":
            records = await closed_loop(client, jobs, connections, limits.duration, progress)
        else:
            records, lag = await open_loop(client, jobs, arrivals, progress)
        client_cpu = time.process_time() - client_cpu0
        server_cpu1 = proc.cpu_seconds(server_pid) if server_pid else None
        busy1 = proc.machine_busy_seconds()
        progress.close()
    server_cpu = server_cpu1 - server_cpu0 if server_cpu0 is not None and server_cpu1 is not None else None
    busy = busy1 - busy0 if busy0 is not None and busy1 is not None else None
    return RunResult(server, workload.label, level, summarize(records, workload.streamed), client_cpu,
                     server_cpu, lag, records if keep_records else [], workload.rows_per_request, busy)
