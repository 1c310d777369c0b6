"""Building blocks shared by the decoder families: norms, rotary embedding, MLP, attention.

Layers compute on the flattened varlen layout: every activation is [num_tokens, ...] with no
batch or padding dimension. Attention itself is delegated to the `AttentionBackend` the executor
plans per step (prelude.model.attention), so model code never sees block tables or backend details.
"""
from __future__ import annotations


import torch
import torch.nn.functional as F
from torch import nn

from prelude.model.attention import AttentionBackend
from prelude.model.config import ModelConfig, RopeConfig
from prelude.model.ops import TORCH_OPS, Ops
from prelude.model.cpu_linear import BY_ROWS, HEAD_LAYOUTS, PANELS, StoredWeight, bf16_exact, linear, readable, store
from prelude.model.rotary import rotary_table
from prelude.model.weight_formats import placement

class UsesOps:
    """Mixin of the modules whose math goes through the Ops indirection; DecoderLM.set_ops
    replaces the class default on every instance at build time."""

    ops: Ops = TORCH_OPS


def _stored(weight: torch.Tensor, format: str, layout: int) -> StoredWeight | None:
    """The weight kept for the CPU kernels where model.weight_formats.placement puts it, or None
    where it stays as it is."""
    if not readable(weight):
        return None
    placed = placement(format, layout, bf16_exact(weight), weight.shape[1])
    return None if placed is None else store(weight, *placed)


def fill(param: nn.Parameter, tensor: torch.Tensor) -> None:
    """A checkpoint's tensor into `param`, converted as copied; on the CPU one already of the
    parameter's dtype and shape is taken as it is, no copy (read from safetensors' memory map):
    most are then stored for the kernels from the map, and model.loader copies whatever is left
    (B's fp32 weights copied into their parameters first took 0.15 s of an int8 server's start)."""
    if (tensor.dtype == param.dtype and tensor.shape == param.shape
            and param.device.type == "cpu" and tensor.device.type == "cpu"):
        param.data = tensor
    else:
        param.data.copy_(tensor)


def stored_formats(model: nn.Module) -> list[str]:
    """The formats the model's weights are kept in for the CPU kernels (none: as loaded)."""
    formats = {stored.format for m in model.modules() if isinstance(stored := getattr(m, "stored", None), StoredWeight)}
    return sorted(formats)


class Linear(nn.Module):
    """nn.Linear without weight initialization: weights always come from a checkpoint, and
    initializing on the meta device drags in torch's compiler stack (seconds of startup)."""

    def __init__(self, in_features: int, out_features: int, bias: bool = False):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(out_features, in_features))
        self.bias = nn.Parameter(torch.empty(out_features)) if bias else None
        self.stored: StoredWeight | None = None

    def store(self, format: str, layout: int = PANELS) -> None:
        """Keeps the weight only as the CPU kernels read it (cpu_linear), in `format` and
        `layout`; the checkpoint's copy is dropped."""
        if self.stored is None:
            self.stored = _stored(self.weight, format, layout)
            if self.stored is not None:
                self.weight = nn.Parameter(torch.empty(0), requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return linear(x, self.weight, self.bias, self.stored)


class Embedding(nn.Module):
    """A token embedding [vocab, dim], which a tied LM head multiplies by: stored (cpu_linear), it
    is kept in the narrower format in the head's layout (HEAD_LAYOUTS), which lookups widen."""

    def __init__(self, num_embeddings: int, dim: int):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(num_embeddings, dim))
        self.stored: StoredWeight | None = None

    def store(self, format: str) -> None:
        if self.stored is None:
            self.stored = _stored(self.weight, format, HEAD_LAYOUTS.get(format, BY_ROWS))
            if self.stored is not None:
                self.weight = nn.Parameter(torch.empty(0), requires_grad=False)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        if self.stored is not None:
            return self.stored.rows(ids)
        return F.embedding(ids, self.weight)


class RMSNorm(UsesOps, nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None):
        """Normalizes x (after adding residual, when given). With a residual it returns
        (normed, x + residual) so the next block can reuse the sum."""
        return self.ops.rms_norm(x, self.weight, self.eps, residual)


class RotaryEmbedding:
    """Neox-style rotary embedding (rotate halves). The cos/sin table is built once per device,
    and looked up once per forward: every layer reuses the same (cos, sin) pair."""

    def __init__(self, rope: RopeConfig, head_dim: int, max_positions: int):
        self.rope = rope
        self.head_dim = head_dim
        self.max_positions = max_positions
        self.cos_sin: torch.Tensor | None = None

    def materialize(self, device: torch.device) -> None:
        self.cos_sin = torch.from_numpy(rotary_table(self.rope, self.head_dim, self.max_positions)).to(device)

    def lookup(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        assert self.cos_sin is not None, "materialize() builds the table before any forward"
        cos, sin = self.cos_sin[positions].to(dtype).unsqueeze(1).chunk(2, dim=-1)
        return cos, sin


# Rows of the MLP's input processed at once; longer inputs are chunked (see MLP.forward). On a
# GPU, 8,192 rows (a default step) at once: the largest activation is then at most 320 MB
# (Qwen3-4B), within the step's temporary budget, and smaller chunks launch more kernels per
# layer where the host's launching sets the step's time (`python -m bench.serving.gpu_profile`).
MLP_CHUNK_TOKENS = 2048
MLP_CHUNK_TOKENS_GPU = 8192


class MLP(UsesOps, nn.Module):
    """SwiGLU with gate and up projections fused into one matmul."""

    def __init__(self, hidden: int, intermediate: int):
        super().__init__()
        self.gate_up_proj = Linear(hidden, 2 * intermediate, bias=False)
        self.down_proj = Linear(intermediate, hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        chunk = MLP_CHUNK_TOKENS if x.device.type == "cpu" else MLP_CHUNK_TOKENS_GPU
        if x.shape[0] <= chunk:
            return self.down_proj(self.ops.silu_and_mul(self.gate_up_proj(x)))
        # Hybrid prefilling (PrefillOnly): a long input goes through the MLP a chunk of tokens at
        # a time, so its largest activation ([tokens, 2 x intermediate]) stays bounded.
        out = torch.empty_like(x)
        for start in range(0, x.shape[0], chunk):
            out[start:start + chunk] = self.down_proj(self.ops.silu_and_mul(self.gate_up_proj(x[start:start + chunk])))
        return out


class Attention(UsesOps, nn.Module):
    """Grouped-query self-attention with q/k/v fused into one matmul and optional per-head
    q/k RMSNorm (Qwen3)."""

    def __init__(self, config: ModelConfig, layer: int):
        super().__init__()
        self.layer = layer
        self.num_heads = config.num_heads
        self.num_kv_heads = config.num_kv_heads
        self.head_dim = config.head_dim
        self.q_size = config.num_heads * config.head_dim
        self.kv_size = config.num_kv_heads * config.head_dim
        self.qkv_proj = Linear(
            config.hidden_size, self.q_size + 2 * self.kv_size, bias=config.attention_bias
        )
        self.o_proj = Linear(self.q_size, config.hidden_size, bias=False)
        self.q_norm: RMSNorm | None  # both or neither
        self.k_norm: RMSNorm | None
        if config.qk_norm:
            self.q_norm = RMSNorm(config.head_dim, config.rms_norm_eps)
            self.k_norm = RMSNorm(config.head_dim, config.rms_norm_eps)
        else:
            self.q_norm = self.k_norm = None

    def forward(self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor], attention: AttentionBackend,
                keep: torch.Tensor | None = None):
        """Attention output of every token, or only of the tokens `keep` indexes (every token's
        K/V is still computed and stored)."""
        q, k, v = self._heads(x)
        if attention.fuses_rope:
            qk_norm = None
            if self.q_norm is not None and self.k_norm is not None:
                qk_norm = (self.q_norm.weight, self.k_norm.weight, self.q_norm.eps)
            out = attention(self.layer, q, k, v, rope=rope, qk_norm=qk_norm)
        else:
            out = attention(self.layer, *self.normed_rotated(q, k, v, rope))
        out = out.reshape(-1, self.q_size)
        return self.o_proj(out if keep is None else out[keep])

    def project(self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor]):
        """q, k, v [T, heads, head_dim] as a backend that does not fuse the rotation takes them."""
        return self.normed_rotated(*self._heads(x), rope)

    def _heads(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        q, k, v = self.qkv_proj(x).split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        return (q.view(-1, self.num_heads, self.head_dim), k.view(-1, self.num_kv_heads, self.head_dim),
                v.view(-1, self.num_kv_heads, self.head_dim))

    def normed_rotated(self, q, k, v, rope: tuple[torch.Tensor, torch.Tensor]):
        if self.q_norm is not None and self.k_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        cos, sin = rope
        return self.ops.rotate(q, cos, sin), self.ops.rotate(k, cos, sin), v
