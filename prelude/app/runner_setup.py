"""The model runner the Config asks for, and the memory sizing that goes with it: how many KV
blocks the pool gets, and what a step's activations may take (the scheduler's temp budget).
served_runner_setup picks host_runner_setup's runner without torch, else model_runner_setup's (CPU and
CUDA); null_runner_setup the benchmarks' null executor."""
from __future__ import annotations

import importlib.metadata
import importlib.util
import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from prelude.contract.config import Config
from prelude.executor.executors import Runner
from prelude.host_tuning import default_compute_threads, set_compute_threads
from prelude.model.config import ModelConfig
from prelude.app.preflight import StartupError

if TYPE_CHECKING:
    from prelude.executor.runner import ModelRunner

logger = logging.getLogger(__name__)

CPU_KV_CACHE_BYTES = 512 * 2**20
CPU_TEMP_MEMORY_BYTES = 1 << 30
# GPU memory kept out of the KV cache besides one step's activations: CUDA context, cuBLAS and
# flashinfer workspaces, CUDA-graph pools, allocator fragmentation.
CUDA_FIXED_RESERVE = 2 << 30


@dataclass(frozen=True, slots=True)
class RunnerSetup:
    """A model runner and what sizing it decided."""

    runner: Runner
    num_blocks: int  # KV blocks the pool may hand out
    temp_bytes_per_token: int
    temp_budget: int
    device: str
    dtype: str
    phases: tuple[tuple[str, float], ...] = ()  # where the setup's time went: (phase, seconds)
    supports_items: bool = True  # the runner masks multi-item rows (StepLayout.item_lengths)
    compute_threads: int = 1  # the native kernels' and torch's intra-op threads (--cpu-threads)
    weights_dtype: str = "float32"  # what the weights hold, in dtype names (TEI's /info model_dtype)


def null_runner_setup(config: Config, model_config: ModelConfig, eos_ids) -> RunnerSetup:
    """The null executor on the runner a decoder would be served on: the one without torch on
    the CPU, else the torch runner (a CUDA server's host side, run on CPU tensors)."""
    blocks = config.num_kv_blocks or 65536
    if on_cpu(config) and native_built():
        from prelude.executor.null_native import null_host_runner

        runner: Runner = null_host_runner(model_config, config.block_size, frozenset(eos_ids))
        return RunnerSetup(runner, blocks, 0, CPU_TEMP_MEMORY_BYTES, "cpu (null executor)", "none")
    from prelude.executor.null_model import null_runner

    threads = set_compute_threads(config.cpu_threads)
    torch_runner = null_runner(model_config, config.block_size, frozenset(eos_ids))
    return RunnerSetup(torch_runner, blocks, 0, CPU_TEMP_MEMORY_BYTES, "cpu (null executor, torch runner)", "none",
                       supports_items=torch_runner.attention.supports_items, compute_threads=threads)


def served_runner_setup(config: Config, model_dir: Path, model_config: ModelConfig,
                        max_model_len: int) -> RunnerSetup:
    """The runner a model is served on: the one without torch where it takes the model, else the
    torch runner."""
    from prelude.model.checkpoint_arrays import checkpoint_files
    from prelude.model.weight_shapes import check_decoder_checkpoint

    check_decoder_checkpoint(model_config, checkpoint_files(model_dir))
    return (host_runner_setup(config, model_dir, model_config, max_model_len)
            or model_runner_setup(config, model_dir, model_config, max_model_len))


def host_runner_setup(config: Config, model_dir: Path, model_config: ModelConfig,
                      max_model_len: int) -> RunnerSetup | None:
    """A decoder on the CPU's native kernels without torch (executor.host_runner), where the
    config and checkpoint are ones it runs; else None (model_runner_setup serves them)."""
    from prelude.model.native_decoder import NativeDecoder, NotNative
    from prelude.model.weight_formats import stored_format

    if not on_cpu(config):
        return None
    from prelude.model.checkpoint_arrays import checkpoint_files

    start = time.perf_counter()
    threads = config.cpu_threads or default_compute_threads()
    try:
        format = stored_format(config.dtype, config.quantization, model_config)
        model = NativeDecoder.load(checkpoint_files(model_dir), model_config, format, max_model_len, threads)
    except NotNative as exc:
        logger.debug("the torch runner serves this model: %s", exc)
        return None
    from prelude.executor.host_runner import HostKVCache, HostRunner

    cache_start = time.perf_counter()
    logger.info("loaded %s (%s, float32 activations) without torch, weights stored %s in %.2fs", model_dir,
                model_config.architecture, "/".join(model.formats), cache_start - start)
    c = model_config
    num_blocks = _cpu_blocks(config, c.kv_bytes_per_block(config.block_size, 4))
    kv = HostKVCache(c.num_layers, num_blocks, config.block_size, c.num_kv_heads, c.head_dim)
    phases = (("weights read and stored", cache_start - start), ("KV cache", time.perf_counter() - cache_start))
    return RunnerSetup(HostRunner(model, kv, threads, config.seed), num_blocks, _temp_bytes_per_token(c, 4),
                       CPU_TEMP_MEMORY_BYTES, "cpu", _dtype_name("float32", model.formats), phases,
                       HostRunner.supports_items, threads, _weights_dtype("float32", model.formats))


def on_cpu(config: Config) -> bool:
    """Whether the server computes on the CPU: `--device cpu`, or `auto` with no CUDA device to
    find."""
    return config.device == "cpu" or (config.device == "auto" and not cuda_possible())


def native_built() -> bool:
    """Whether the CPU's native kernels are built (a source checkout has none before `pip install
    -e .`)."""
    return importlib.util.find_spec("kernels.cpu._native") is not None


def cuda_possible() -> bool:
    """Whether `--device auto` could find a CUDA device, asked without importing torch: the
    installed torch is a CUDA build and the machine has an NVIDIA device node."""
    try:
        version = importlib.metadata.version("torch")
    except importlib.metadata.PackageNotFoundError:
        return False
    return "+cpu" not in version and any(Path("/dev").glob("nvidia[0-9]*"))


def model_runner_setup(config: Config, model_dir: Path, model_config: ModelConfig, max_model_len: int) -> RunnerSetup:
    import torch

    from prelude.executor.attention import get_backend
    from prelude.executor.fused_step import native_step
    from prelude.executor.runner import ModelRunner
    from prelude.executor.kv_cache import KVCache, KVCacheShape
    from prelude.model.layers import stored_formats
    from prelude.model.loader import cpu_weight_format, load_model, resolve_dtype
    from prelude.model.ops import select_ops

    threads = set_compute_threads(config.cpu_threads)
    start = time.perf_counter()
    if config.device == "cuda" and not torch.cuda.is_available():
        raise StartupError(f"--device cuda, but torch {torch.__version__} sees no CUDA device; use --device cpu "
                           "(or auto), or install a CUDA build of torch")
    device = torch.device("cuda" if config.device == "auto" and torch.cuda.is_available() else
                          "cpu" if config.device == "auto" else config.device)
    dtype = resolve_dtype(config.dtype, device)
    phases: list[tuple[str, float]] = []
    weights_start = start
    if device.type == "cuda":  # the driver and context now, rather than inside the first copy
        torch.cuda.init()
        weights_start = time.perf_counter()
        phases.append(("CUDA init", weights_start - start))
    weight_format = None
    if device.type == "cpu":
        torch.manual_seed(config.seed)
        dtype, weight_format = cpu_weight_format(dtype, config.quantization, model_config)
    elif config.quantization != "none":
        raise StartupError(f"--quantization {config.quantization} is for the CPU path (int8 weights on its "
                           "native kernels); on a GPU serve bfloat16")
    ops = select_ops(device)
    model = load_model(model_dir, model_config, dtype, device, max_positions=max_model_len, ops=ops,
                       weight_format=weight_format)
    cache_start = time.perf_counter()
    phases.append(("weights read and stored", cache_start - weights_start))
    itemsize = torch.empty((), dtype=dtype).element_size()
    temp_per_token = _temp_bytes_per_token(model_config, itemsize)
    per_block = model_config.kv_bytes_per_block(config.block_size, itemsize)
    compute, formats = str(dtype).removeprefix("torch."), stored_formats(model) if weight_format else []
    dtype_name, weights_dtype = _dtype_name(compute, formats), _weights_dtype(compute, formats)
    if device.type == "cuda":
        runner, num_blocks, temp_budget = cuda_runner(config, model, device, dtype, max_model_len, temp_per_token,
                                                       per_block)
        phases.append(("KV cache and attention backend", time.perf_counter() - cache_start))
        return RunnerSetup(runner, num_blocks, temp_per_token, temp_budget,
                           f"cuda ({torch.cuda.get_device_name(device)})", dtype_name, tuple(phases),
                           runner.attention.supports_items, threads, weights_dtype)
    num_blocks = _cpu_blocks(config, per_block)
    kv_cache = KVCache(KVCacheShape.for_model(model_config, num_blocks, config.block_size, dtype), device)
    runner = ModelRunner(model, get_backend("torch", kv_cache), device, config.block_size, native_step(model, ops))
    phases.append(("KV cache", time.perf_counter() - cache_start))
    return RunnerSetup(runner, num_blocks, temp_per_token, CPU_TEMP_MEMORY_BYTES, "cpu", dtype_name, tuple(phases),
                       runner.attention.supports_items, threads, weights_dtype)


def _temp_bytes_per_token(c: ModelConfig, itemsize: int) -> int:
    """What a step's activations take per token (the scheduler's temp budget counts them)."""
    return itemsize * (4 * c.hidden_size + (c.num_heads + 2 * c.num_kv_heads) * c.head_dim + 3 * c.intermediate_size)


def _cpu_blocks(config: Config, per_block: int) -> int:
    """The KV blocks of a CPU pool: --num-kv-blocks, else what --kv-cache-memory-bytes holds. A
    pool larger than the host's memory is refused here: its pages are mapped as they are first
    used, so it started (or failed with a traceback from deep in the mapping) and was killed for
    memory hours later, when the prefix cache had filled it."""
    num_blocks = config.num_kv_blocks or max(1, (config.kv_cache_memory or CPU_KV_CACHE_BYTES) // per_block)
    memory = _host_memory_bytes()
    if memory is not None and num_blocks * per_block > memory:
        raise StartupError(f"the KV cache ({num_blocks} blocks, {num_blocks * per_block / 2**30:.1f} GiB) is larger "
                           f"than this host's memory ({memory / 2**30:.1f} GiB); lower --kv-cache-memory-bytes "
                           "or --num-kv-blocks")
    return num_blocks


def _host_memory_bytes() -> int | None:
    """The memory this process may use: the machine's, or its cgroup's limit where lower (a
    container's); None where neither can be read."""
    limits = []
    try:
        with open("/proc/meminfo") as meminfo:
            limits += [int(line.split()[1]) * 1024 for line in meminfo if line.startswith("MemTotal:")]
    except OSError:
        pass
    try:
        limit = Path("/sys/fs/cgroup/memory.max").read_text().strip()
        if limit.isdigit():
            limits.append(int(limit))
    except OSError:
        pass
    return min(limits, default=None)


def _weights_dtype(compute: str, formats: list[str]) -> str:
    """What the weights hold, in dtype names: bf16x2 keeps bf16 values, bf16x3 fp32 ones; int8
    where any weight is int8 (a quantized model keeps some bf16 ones)."""
    held = sorted({{"bf16x2": "bfloat16", "bf16x3": "float32"}.get(f, f) for f in formats}) or [compute]
    return "int8" if "int8" in held else "/".join(held)


def _dtype_name(compute: str, formats: list[str]) -> str:
    """The banner's dtype: the compute dtype, and the stored weights' formats where not its own."""
    return compute if formats in ([], ["float32"]) else f"{compute}, weights {'/'.join(formats)}"


def cuda_runner(config: Config, model, device, dtype, max_model_len: int, temp_per_token: int,
                 per_block: int) -> tuple[ModelRunner, int, int]:
    """KV cache sized from --gpu-memory-utilization after the weights are loaded, leaving room
    for one full step's activations; one extra block at the end belongs to nobody (CUDA-graph
    padding rows write and read it)."""
    import torch

    from prelude.executor.attention import pick_backend
    from prelude.executor.cuda_runner import CudaModelRunner
    from prelude.executor.kv_cache import KVCache, KVCacheShape

    c = model.config
    logits_bytes = 2 * 4 * c.vocab_size * config.max_num_seqs
    temp_budget = 2 * temp_per_token * config.max_num_batched_tokens + logits_bytes + CUDA_FIXED_RESERVE
    free, total = torch.cuda.mem_get_info(device)
    if config.num_kv_blocks:
        num_blocks = config.num_kv_blocks
    else:
        kv_bytes = config.kv_cache_memory or int(total * config.gpu_memory_utilization) - (total - free) - temp_budget
        num_blocks = kv_bytes // per_block
        if num_blocks < 1:
            raise StartupError(f"no GPU memory left for the KV cache ({free / 2**30:.1f} GiB free of "
                               f"{total / 2**30:.1f}); raise --gpu-memory-utilization or free the GPU")
    shape = KVCacheShape.for_model(c, num_blocks + 1, config.block_size, dtype)
    kv_cache = KVCache(shape, device)
    attention = pick_backend(kv_cache, num_q_heads=c.num_heads, dummy_page=num_blocks,
                             max_pages_per_row=-(-max_model_len // config.block_size) + 1)
    runner = CudaModelRunner(model, attention, device, config.block_size, max_num_seqs=config.max_num_seqs,
                             max_num_batched_tokens=config.max_num_batched_tokens,
                             pad_slot=num_blocks * config.block_size, enforce_eager=config.enforce_eager)
    logger.info("KV cache: %d blocks (%.2f GiB) on %s; attention %s", num_blocks,
                num_blocks * per_block / 2**30, torch.cuda.get_device_name(device), type(attention).__name__)
    return runner, num_blocks, temp_budget
