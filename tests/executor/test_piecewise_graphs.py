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
    fuses_rope = True

    def plan(self, layout):
        raise AssertionError("not planned here")

    def __call__(self, *args, **kwargs):
        raise AssertionError("the splitter stands in for attention while pieces are captured")


def test_a_forward_is_cut_into_one_piece_more_than_it_has_layers(monkeypatch, tmp_path):
    monkeypatch.setattr(torch.cuda, "CUDAGraph", _Graph)
    path = make_checkpoint(tmp_path / "q3", "qwen3")
    config = ModelConfig.from_dir(path)
    model = load_model(path, config, torch.float32, torch.device("cpu"), max_positions=64)
    attention = _Attention()
    graphs = piecewise_graphs.PiecewiseGraphs(model, attention, torch.device("cpu"), [32])
    splitter = piecewise_graphs._Splitter(attention, graphs.buffers, None)
    last_qkv: list[torch.Tensor] = []
    model.model.layers[-1].self_attn.qkv_proj.register_forward_hook(lambda m, args, out: last_qkv.append(out))
    splitter.begin()
    hidden = model(torch.arange(32), torch.arange(32), splitter)
    splitter.end()
    assert hidden.shape == (32, config.hidden_size)
    assert len(splitter.graphs) == config.num_layers + 1 and all(g.captured for g in splitter.graphs)
    # One call per layer, in order, each with the step's rotary tables (the backend fuses RoPE)
    # and the layer's q/k norms (Qwen3 has them).
    assert [call.layer for call in splitter.calls] == list(range(config.num_layers))
    assert all(call.rope is not None and call.rope[0].shape[0] == 32 for call in splitter.calls)
    assert all(call.qk_norm is not None for call in splitter.calls)
    # The last layer's q/k/v went to the shared buffers (replays hand those to attention).
    q_size, kv_size = config.num_heads * config.head_dim, config.num_kv_heads * config.head_dim
    q, k, v = last_qkv[0].split([q_size, kv_size, kv_size], dim=-1)
    assert torch.equal(graphs.buffers.q[:32].flatten(1), q) and torch.equal(graphs.buffers.v[:32].flatten(1), v)
    assert torch.equal(graphs.buffers.k[:32].flatten(1), k)
