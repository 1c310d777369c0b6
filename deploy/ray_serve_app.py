"""Prelude on Ray Serve: each Serve replica builds one Prelude engine and serves Prelude's own
ASGI app (every endpoint, streaming, /metrics), one replica per GPU. Ray's HTTP proxy (port 8000
by default) spreads requests over the replicas; for prefix-aware routing put sglang-router in
front of the replicas' own ports instead (docs/deploy.md, "Ray Serve").

    pip install "ray[serve]" -e .
    ray start --head                       # one node; `ray start --address=HEAD:6379` on the others
    PRELUDE_ARGS="--model /models/Qwen3-0.6B" PRELUDE_REPLICAS=2 serve run deploy.ray_serve_app:app

PRELUDE_ARGS: the flags `python -m prelude` takes (host and port are Ray's). PRELUDE_GPUS: GPUs
per replica (default 1 when the cluster has GPUs, else 0 and one CPU per replica).
"""
from __future__ import annotations

import os
import shlex

import ray
from ray import serve


def build_prelude_app():
    """Runs inside each replica: the ASGI app, whose lifespan starts and stops the engine (Ray
    Serve runs an ingress app's lifespan on the replica's own event loop)."""
    from prelude.app.assembly import build
    from prelude.app.cli import parse_args
    from prelude.server.app import create_app

    config = parse_args(shlex.split(os.environ.get("PRELUDE_ARGS", "")))
    built = build(config)
    return create_app(built.engine, built.served, config)


def _gpus() -> float:
    if "PRELUDE_GPUS" in os.environ:
        return float(os.environ["PRELUDE_GPUS"])
    if not ray.is_initialized():
        ray.init(address="auto", ignore_reinit_error=True)
    return 1.0 if ray.cluster_resources().get("GPU", 0) else 0.0


@serve.deployment(
    num_replicas=int(os.environ.get("PRELUDE_REPLICAS", "2")),
    # Prelude batches internally; let many requests reach a replica at once.
    max_ongoing_requests=int(os.environ.get("PRELUDE_MAX_ONGOING", "256")),
    ray_actor_options={"num_gpus": _gpus(), "num_cpus": 1,
                       "runtime_env": {"env_vars": {k: v for k, v in os.environ.items()
                                                    if k.startswith(("PRELUDE_", "OMP_NUM_THREADS"))}}},
)
@serve.ingress(build_prelude_app)
class PreludeReplica:
    pass


app = PreludeReplica.bind()
