"""Launching a server subprocess for a benchmark: a free loopback port, output captured to a log
file, readiness by polling GET /health, and a clean SIGINT shutdown (escalating only if the
server does not exit). A server never outlives its benchmark: one stopped by SIGTERM (as
`timeout` stops a stage of gpu_check.sh) stops its servers on the way out, where an orphaned
server would hold its memory (a GPU's, on the device) under the next stage's."""
from __future__ import annotations

import atexit
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Sequence

import httpx

from prelude.contract.config import ALLOW_LONG_MAX_MODEL_LEN_ENV

HEALTH_POLL_S = 0.02  # resolution of the startup timer; each poll is a cheap refused connect


class ServerError(RuntimeError):
    """The server exited or never became healthy; the message ends with its log's tail."""


class PortTaken(ServerError):
    """The server exited because another process had bound its port first."""


PORT_ATTEMPTS = 3


def default_command() -> list[str]:
    return [sys.executable, "-m", "prelude"]


def parse_command(text: str | None) -> list[str]:
    return shlex.split(text) if text else default_command()


def free_port() -> int:
    """A TCP port free now. Another process may bind it before the server does: ServerProcess
    starts its server again on another port when that happens."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def log_tail(path: Path, lines: int = 30) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


_RUNNING: set["ServerProcess"] = set()  # started and not yet stopped, in this process


def _stop_running() -> None:
    for server in list(_RUNNING):
        server.stop(timeout=10.0)


def _exit_on_sigterm() -> None:
    """SIGTERM raises SystemExit instead of ending the process at once, so `finally` blocks and
    atexit stop the servers. Only where nothing else handles SIGTERM, and only in the main
    thread (the only one that may set a handler)."""
    if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL and threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))


atexit.register(_stop_running)


class ServerProcess:
    """`command + args + --host 127.0.0.1 --port N` as a child process. Works for any server
    taking --host/--port and answering GET /health (Prelude, vLLM, SGLang, llama-server)."""

    def __init__(self, args: Sequence[str] = (), command: Sequence[str] | None = None,
                 env: dict[str, str] | None = None, log_path: Path | None = None, label: str = "prelude"):
        self.args = list(args)
        self.command = list(command) if command else default_command()
        self.env = env
        self.label = label
        self.port = free_port()
        self.base_url = f"http://127.0.0.1:{self.port}"
        if log_path is None:
            log_dir = Path(tempfile.mkdtemp(prefix="prelude-bench-"))
            log_path = log_dir / f"{re.sub(r'[^A-Za-z0-9_.-]', '_', label)}.log"
        self.log_path = log_path
        self.proc: subprocess.Popen | None = None
        self.startup_s: float | None = None

    @property
    def argv(self) -> list[str]:
        return [*self.command, *self.args, "--host", "127.0.0.1", "--port", str(self.port)]

    @property
    def pid(self) -> int:
        assert self.proc is not None, "server not started"
        return self.proc.pid

    def start(self, timeout: float = 600.0) -> float:
        """Starts the server and waits for /health 200; returns seconds from spawn to ready. A
        server that exits because its port was taken meanwhile (free_port) is started again on
        another."""
        for attempt in range(PORT_ATTEMPTS):
            try:
                return self._start(timeout)
            except PortTaken:
                if attempt == PORT_ATTEMPTS - 1:
                    raise
                self.port = free_port()
                self.base_url = f"http://127.0.0.1:{self.port}"
        raise AssertionError("unreachable")

    def _start(self, timeout: float) -> float:
        if self.proc is not None and self.proc.poll() is None:
            # A second process on the same port would answer nothing, and the first, no longer
            # referenced, would outlive the benchmark.
            raise ServerError(f"{self.label} is already running (pid {self.proc.pid})")
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        log = open(self.log_path, "wb")
        began = time.perf_counter()
        # Own session: a Ctrl-C in the terminal reaches only the benchmark, which then stops the
        # server itself (and the server's shutdown output stays in its log).
        _exit_on_sigterm()
        self.proc = subprocess.Popen(self.argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                     env=self.env, start_new_session=True)
        _RUNNING.add(self)
        log.close()
        with httpx.Client(timeout=2.0) as client:
            while True:
                if self.proc.poll() is not None:
                    tail = log_tail(self.log_path)
                    error = PortTaken if "already in use" in tail else ServerError
                    raise error(f"{self.label} exited with {self.proc.returncode} before becoming "
                                f"healthy; log {self.log_path}:\n{tail}")
                try:
                    if client.get(f"{self.base_url}/health").status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                if time.perf_counter() - began > timeout:
                    self.stop()
                    raise ServerError(f"{self.label} not healthy after {timeout:.0f}s; log {self.log_path}:\n"
                                      f"{log_tail(self.log_path)}")
                time.sleep(HEALTH_POLL_S)
        self.startup_s = time.perf_counter() - began
        return self.startup_s

    def stop(self, timeout: float = 30.0) -> int | None:
        """SIGINT (the server's own clean shutdown), then SIGTERM, then SIGKILL."""
        _RUNNING.discard(self)
        proc = self.proc
        if proc is None or proc.poll() is not None:
            return None if proc is None else proc.returncode
        for sig, wait in ((signal.SIGINT, timeout), (signal.SIGTERM, 5.0), (signal.SIGKILL, 5.0)):
            try:
                proc.send_signal(sig)
            except ProcessLookupError:
                break
            try:
                return proc.wait(wait)
            except subprocess.TimeoutExpired:
                continue
        return proc.poll()

    def __enter__(self) -> "ServerProcess":
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def prelude_env(cache_dir: str | Path | None = None) -> dict[str, str]:
    """This environment, with PRELUDE_CACHE pointed at `cache_dir` when given, and this checkout
    first on PYTHONPATH so `python -m prelude` runs the code being benchmarked."""
    env = dict(os.environ)
    root = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
    if cache_dir is not None:
        env["PRELUDE_CACHE"] = str(cache_dir)
    # Benchmarks stretch the demo model (4,096 positions) to 8K-token inputs: they measure speed,
    # not output quality, so the servers they start may run past a model's max positions.
    env.setdefault(ALLOW_LONG_MAX_MODEL_LEN_ENV, "1")
    return env
