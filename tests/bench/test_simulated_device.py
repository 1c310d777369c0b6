"""bench.serving.simulated_device: the null executor's steps take the time a device's would."""
from __future__ import annotations

import json
import sys
import time
import urllib.request

from bench.serving.core.server import ServerProcess, prelude_env


def test_each_step_takes_its_fixed_time_plus_its_tokens_time():
    """40 ms a step plus 100 us a token: a 100-token one-token request cannot answer in under
    50 ms, whatever the host's speed (the null executor alone answers in about 1 ms). Each prompt
    is new: a cached prefix is not computed, and costs no time."""
    server = ServerProcess(["--fixed-ms", "40", "--us-per-token", "100", "--", "--executor", "null"],
                           [sys.executable, "-m", "bench.serving.simulated_device"], prelude_env(), label="simulated")
    server.start(120)
    try:
        model = json.load(urllib.request.urlopen(f"{server.base_url}/v1/models"))["data"][0]["id"]
        took = []
        for first in range(3):
            body = json.dumps({"model": model, "prompt": [first, *range(100, 199)], "max_tokens": 1}).encode()
            request = urllib.request.Request(f"{server.base_url}/v1/completions", body,
                                             {"Content-Type": "application/json"})
            started = time.perf_counter()
            answer = json.load(urllib.request.urlopen(request))
            took.append(time.perf_counter() - started)
            assert (answer["usage"]["prompt_tokens"], answer["usage"]["completion_tokens"]) == (100, 1)
        assert min(took) >= 0.050, took
    finally:
        server.stop()
