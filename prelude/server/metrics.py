"""GET /metrics: Prometheus text exposition. Everything under a `prelude:` prefix (vLLM's names
where vLLM has the metric), and the load and cache signals routers and dashboards read under
vLLM's own `vllm:` names and `model_name` label, so llm-d's endpoint picker, vllm-router and
existing Grafana dashboards work unchanged."""
from __future__ import annotations

from prelude.engine.output import FinishReason
from prelude.engine.snapshot import EngineSnapshot
from prelude.engine.stats import Histogram


FINISH_REASONS = tuple(reason.value for reason in FinishReason)


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


class _Writer:
    def __init__(self, model: str, prefix: str = "prelude"):
        self.prefix = prefix
        self.lines: list[str] = []
        self.label = f'model_name="{_escape(model)}"'

    def metric(self, name: str, kind: str, help_text: str, value: float, **labels: str) -> None:
        self.header(name, kind, help_text)
        self.sample(name, value, **labels)

    def header(self, name: str, kind: str, help_text: str) -> None:
        self.lines.append(f"# HELP {self.prefix}:{name} {help_text}")
        self.lines.append(f"# TYPE {self.prefix}:{name} {kind}")

    def sample(self, name: str, value: float, **labels: str) -> None:
        extra = "".join(f',{k}="{_escape(v)}"' for k, v in labels.items())
        self.lines.append(f"{self.prefix}:{name}{{{self.label}{extra}}} {value}")

    def finished(self, help_text: str, finished: dict[str, int]) -> None:
        """request_success_total, every reason from the start, at 0 as vLLM's: an alert on
        increase(...{finished_reason="abort"}) missed the first abort after a restart, its
        series not there before it."""
        self.header("request_success_total", "counter", help_text)
        for reason in FINISH_REASONS:
            self.sample("request_success_total", finished.get(reason, 0), finished_reason=reason)

    def histogram(self, name: str, help_text: str, hist: Histogram) -> None:
        self.header(name, "histogram", help_text)
        cumulative = 0
        for bound, count in zip(hist.buckets, hist.counts):
            cumulative += count
            self.sample(f"{name}_bucket", cumulative, le=repr(float(bound)))
        self.sample(f"{name}_bucket", hist.count, le="+Inf")
        self.sample(f"{name}_sum", hist.total)
        self.sample(f"{name}_count", hist.count)


def render(snap: EngineSnapshot, model: str) -> str:
    w = _Writer(model)
    stats, sched = snap.stats, snap.scheduler
    w.metric("num_requests_running", "gauge", "Decode sequences holding KV blocks.", snap.num_running)
    w.metric("num_requests_waiting", "gauge", "Requests waiting to be scheduled.", snap.num_waiting)
    w.metric("kv_cache_usage_perc", "gauge", "Fraction of KV blocks in use (1 = full).", snap.kv_usage)
    w.metric("kv_blocks_total", "gauge", "KV blocks in the pool.", snap.kv_blocks_total)
    w.metric("kv_blocks_in_use", "gauge", "KV blocks referenced by requests.", snap.kv_blocks_in_use)
    w.metric("kv_blocks_cached", "gauge", "KV blocks published in the prefix cache.", snap.kv_blocks_cached)
    w.metric("prefix_cache_queries_total", "counter", "Prompt tokens looked up in the prefix cache.",
             snap.prefix_query_tokens)
    w.metric("prefix_cache_hits_total", "counter", "Prompt tokens found in the prefix cache.", snap.prefix_hit_tokens)
    w.metric("prompt_tokens_total", "counter", "Prompt tokens computed (each request's, once).", stats.prompt_tokens)
    w.metric("generation_tokens_total", "counter", "Tokens generated, counted as each step makes them.",
             stats.generation_tokens)
    w.finished("Finished requests by finish reason.", stats.finished)
    w.header("rejected_requests_total", "counter", "Requests refused at admission (503), by reason.")
    for reason in ("queue_full", "draining"):
        w.sample("rejected_requests_total", stats.rejected.get(reason, 0), reason=reason)
    w.metric("late_requests_total", "counter", "Waiting requests shed because they could no longer meet "
             "their deadline (--shed-late-requests).", sched.num_late)
    w.metric("num_waiting_tokens", "gauge", "Prompt tokens of the waiting requests.", snap.num_waiting_tokens)
    w.metric("failed_steps_total", "counter", "Forward steps that raised; their rows were retried in halves.",
             stats.failed_steps)
    w.metric("failed_requests_total", "counter", "Requests ended because their own row made a step raise.",
             stats.failed_requests)
    w.metric("num_preemptions_total", "counter", "Decode sequences preempted for recompute.", sched.num_preemptions)
    w.metric("preemptible_steps_total", "counter", "Long OneShot steps run so that they could step aside.",
             snap.preemptible_steps)
    w.metric("layer_preemptions_total", "counter", "Times a long OneShot step stepped aside for short requests "
             "or running streams.", snap.layer_preemptions)
    w.metric("oneshot_rows_total", "counter", "OneShot rows executed.", sched.num_oneshot_rows)
    w.metric("oneshot_deferrals_total", "counter", "Requests deferred one tick behind a cold-prefix leader.",
             sched.num_deferrals)
    w.header("steps_total", "counter", "Forward steps by batch kind.")
    for kind, count in sched.steps.items():
        w.sample("steps_total", count, kind=kind)
    w.histogram("time_to_first_token_seconds", "Time to first token (or OneShot result).", stats.ttft)
    w.histogram("e2e_request_latency_seconds", "Arrival to finish.", stats.e2e)
    w.histogram("request_queue_time_seconds", "Arrival to first scheduled.", stats.queue_time)
    w.histogram("request_prefill_time_seconds", "First scheduled to first token.", stats.prefill_time)
    w.histogram("request_decode_time_seconds", "First token to finish.", stats.decode_time)
    w.histogram("request_inference_time_seconds", "First scheduled to finish.", stats.inference_time)
    w.histogram("request_time_per_output_token_seconds", "A request's mean time per output token after "
                "its first (requests of two tokens or more).", stats.time_per_output_token)
    w.histogram("inter_token_latency_seconds", "Each gap between two consecutive output tokens of a "
                "request.", stats.inter_token)
    w.histogram("step_duration_seconds", "Forward step wall time.", stats.step_time)
    w.histogram("step_tokens", "Tokens a forward step computes (prompt rows' and one per decode).", stats.step_tokens)
    w.histogram("request_prompt_tokens", "Prompt tokens of each finished request.", stats.request_prompt_tokens)
    w.histogram("request_generation_tokens", "Tokens generated for each finished request.",
                stats.request_generation_tokens)
    return "\n".join(w.lines + _vllm_names(snap, model)) + "\n"


def _vllm_names(snap: EngineSnapshot, model: str) -> list[str]:
    """The signals routers read, as vLLM v1 names them."""
    w, stats = _Writer(model, "vllm"), snap.stats
    w.metric("num_requests_running", "gauge", "Requests running on the engine.", snap.num_rows_running)
    w.metric("num_requests_waiting", "gauge", "Requests waiting to be scheduled.", snap.num_waiting)
    w.metric("kv_cache_usage_perc", "gauge", "KV-cache usage; 1 means 100 percent.", snap.kv_usage)
    w.metric("prefix_cache_queries_total", "counter", "Prefix-cache queries, in tokens.", snap.prefix_query_tokens)
    w.metric("prefix_cache_hits_total", "counter", "Prefix-cache hits, in tokens.", snap.prefix_hit_tokens)
    w.metric("prompt_tokens_total", "counter", "Prefill tokens processed.", stats.prompt_tokens)
    w.metric("generation_tokens_total", "counter", "Generation tokens processed.", stats.generation_tokens)
    w.finished("Successfully processed requests.", stats.finished)
    w.histogram("time_to_first_token_seconds", "Time to first token.", stats.ttft)
    w.histogram("e2e_request_latency_seconds", "End-to-end request latency.", stats.e2e)
    # The queue and prefill panels and the preemption count of vLLM's Grafana dashboard read
    # these names; Prelude measures them (under prelude:), so they were empty panels.
    w.histogram("request_queue_time_seconds", "Time spent in the WAITING phase.", stats.queue_time)
    w.histogram("request_prefill_time_seconds", "Time spent in the PREFILL phase.", stats.prefill_time)
    w.metric("num_preemptions_total", "counter", "Cumulative number of preemptions.",
             snap.scheduler.num_preemptions)
    # The decode-time and time-per-output-token panels (vLLM v1's per-request names).
    w.histogram("request_decode_time_seconds", "Time spent in the DECODE phase.", stats.decode_time)
    w.histogram("request_inference_time_seconds", "Time spent in the RUNNING phase.", stats.inference_time)
    w.histogram("request_time_per_output_token_seconds", "Time per output token, per request.",
                stats.time_per_output_token)
    w.histogram("inter_token_latency_seconds", "Histogram of inter-token latency in seconds.", stats.inter_token)
    # The same gaps under vLLM's older name, which dashboards built for it read.
    w.histogram("time_per_output_token_seconds", "Histogram of time per output token in seconds.", stats.inter_token)
    # The dashboard's prompt and generation length panels, and its tokens-per-step one.
    w.histogram("request_prompt_tokens", "Number of prefill tokens processed.", stats.request_prompt_tokens)
    w.histogram("request_generation_tokens", "Number of generation tokens processed.",
                stats.request_generation_tokens)
    w.histogram("iteration_tokens_total", "Histogram of number of tokens per engine_step.", stats.step_tokens)
    return w.lines
