"""How a forward is cut into pieces for capture (prelude.executor.piecewise_graphs), on the CPU
with a stand-in for torch's CUDAGraph that checks the capture calls: the replay itself, and the
results of replayed pieces against the eager forward, are the CUDA tests' (test_cuda_executor)."""
from __future__ import annotations

import torch

from prelude.executor import piecewise_graphs
from prelude.model.attention import AttentionBackend
from prelude.model.config import ModelConfig
from prelude.model.loader import load_model
from tests.checkpoints import make_checkpoint


class _Graph:
    capturing: _Graph | None = None  # one capture at a time, as on a stream

    def __init__(self):
        self.captured = False

    def capture_begin(self, pool=None):
        assert _Graph.capturing is None, "a capture began inside another"
        _Graph.capturing = self

    def capture_end(self):
        assert _Graph.capturing is self, "a capture ended that had not begun"
        _Graph.capturing, self.captured = None, True


class _Attention(AttentionBackend):
    """Records what the splitter asks of it while pieces are captured (only the first half)."""

    fuses_rope = True

    def __init__(self):
        self.stored: list[tuple[int, int, bool, torch.Tensor]] = []

    def plan(self, layout):
        raise AssertionError("not planned here")

    def __call__(self, *args, **kwargs):
        raise AssertionError("the splitter stands in for attention while pieces are captured")

    def store(self, layer, q, k, v, rope, qk_norm, slots):
        assert _Graph.capturing is not None, "the first half belongs to the piece before"
        self.stored.append((layer, rope[0].shape[0], qk_norm is not None, slots))
        return q, k

    def attend(self, layer, q, k, v):
        raise AssertionError("attention runs between replayed pieces, not in a capture")


def test_a_forward_is_cut_into_one_piece_more_than_it_has_layers(monkeypatch, tmp_path):
    monkeypatch.setattr(torch.cuda, "CUDAGraph", _Graph)
    path = make_checkpoint(tmp_path / "q3", "qwen3")
    config = ModelConfig.from_dir(path)
    model = load_model(path, config, torch.float32, torch.device("cpu"), max_positions=64)
    attention = _Attention()
    graphs = piecewise_graphs.PiecewiseGraphs(model, attention, torch.zeros(3, 32, dtype=torch.long), [32])
    slots = graphs.static[2, :32]
    splitter = piecewise_graphs._Splitter(attention, graphs.buffers, slots, None)
    last_qkv: list[torch.Tensor] = []
    model.model.layers[-1].self_attn.qkv_proj.register_forward_hook(lambda m, args, out: last_qkv.append(out))
    splitter.begin()
    hidden = model(torch.arange(32), torch.arange(32), splitter)
    splitter.end()
    assert hidden.shape == (32, config.hidden_size)
    assert len(splitter.graphs) == config.num_layers + 1 and all(g.captured for g in splitter.graphs)
    # One cut per layer, in order; each layer's first half (norms, RoPE, K/V write) captured in
    # the piece before its cut, over the whole bucket, at the bucket's static slots.
    assert splitter.layers == list(range(config.num_layers))
    assert [(layer, tokens, normed) for layer, tokens, normed, _ in attention.stored] == \
        [(layer, 32, True) for layer in range(config.num_layers)]
    assert all(stored_slots is slots for *_, stored_slots in attention.stored)
    # The last layer's q/k/v went to the shared buffers (replays hand those to attention).
    q_size, kv_size = config.num_heads * config.head_dim, config.num_kv_heads * config.head_dim
    q, k, v = last_qkv[0].split([q_size, kv_size, kv_size], dim=-1)
    assert torch.equal(graphs.buffers.q[:32].flatten(1), q) and torch.equal(graphs.buffers.v[:32].flatten(1), v)
    assert torch.equal(graphs.buffers.k[:32].flatten(1), k)
