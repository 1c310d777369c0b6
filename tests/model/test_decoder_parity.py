"""Our decoder's logits equal transformers' on the same weights: a varlen prefill of several
sequences, then incremental decode steps reading K/V back through the paged cache."""
from __future__ import annotations

import pytest
import torch

from prelude.contract.batch import DecodeRow, OutputSpec, PrefillRow
from prelude.contract.sampling import GREEDY
from prelude.executor.attention.torch_ref import TorchAttention
from prelude.executor.kv_cache import KVCache, KVCacheShape
from prelude.executor.host_step import host_step
from prelude.model.config import ModelConfig
from prelude.model.loader import load_model
from prelude.model.ops import select_ops
from tests.checkpoints import load_reference, make_checkpoint

BLOCK = 4
CASES = [
    ("qwen3", dict()),
    ("qwen3", dict(tie=True, max_shard_size="50KB")),
    ("qwen2", dict()),
    ("llama", dict()),
    ("llama", dict(tie=True, rope_parameters={"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0,
                                            "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                            "original_max_position_embeddings": 64})),
]


SPEC = OutputSpec(sample=GREEDY)


def _step(prefills=(), decodes=()):
    """The executor's own flattening (ids, positions, layout) of PrefillRow/DecodeRow rows."""
    step = host_step(prefills, decodes, BLOCK)
    return step.ids, step.positions, step.layout(step.slots)


def _ours_and_reference(path, num_blocks: int):
    """Our model with a paged torch attention over `num_blocks` blocks, and transformers' model."""
    config = ModelConfig.from_dir(path)
    # The ops the server picks on the CPU (the native kernels where built), as the server runs them.
    model = load_model(path, config, torch.float32, torch.device("cpu"), max_positions=512,
                       ops=select_ops(torch.device("cpu")))
    cache = KVCache(KVCacheShape.for_model(config, num_blocks=num_blocks, block_size=BLOCK, dtype=torch.float32),
                    torch.device("cpu"))
    return config, model, TorchAttention(cache), load_reference(path)


@pytest.mark.parametrize("family,extra", CASES,
                         ids=lambda c: str(c) if isinstance(c, str) else "-".join(map(str, c)) or "plain")
def test_varlen_prefill_then_paged_decode_match_transformers(tmp_path, family, extra):
    _prefill_then_decode(tmp_path, family, extra)


def test_padded_decode_path_matches_transformers(tmp_path, monkeypatch):
    """The gather-and-pad decode attention (other dtypes and devices) without the native kernel."""
    import prelude.executor.attention.torch_ref as torch_ref

    monkeypatch.setattr(torch_ref, "paged_decode", None)
    _prefill_then_decode(tmp_path, "qwen3", {})


def _prefill_then_decode(tmp_path, family, extra):
    config, model, attention, reference = _ours_and_reference(make_checkpoint(tmp_path / family, family, **extra), 64)

    gen = torch.Generator().manual_seed(1)
    lengths = [7, 1, 13, 4]
    prompts = [torch.randint(0, config.vocab_size, (n,), generator=gen) for n in lengths]
    # Deliberately scattered, non-contiguous block tables.
    free = list(range(63, -1, -1))
    tables = [[free.pop(2 * i % len(free)) for i in range(8)] for _ in prompts]

    with torch.inference_mode():
        # Every prompt, the 1-token one included, is a fresh prefill row.
        ids, positions, layout = _step([PrefillRow(i, p.tolist(), 0, t, SPEC)
                                        for i, (p, t) in enumerate(zip(prompts, tables))])
        assert layout.num_prefill_rows == len(prompts) and all(layout.store_kv)
        torch.testing.assert_close(ids, torch.cat(prompts))
        attention.plan(layout)
        hidden = model(ids, positions, attention)
        ours = model.compute_logits(hidden)
        offset = 0
        for prompt in prompts:
            expected = reference(prompt[None]).logits[0]
            torch.testing.assert_close(ours[offset:offset + len(prompt)], expected, atol=1e-4, rtol=1e-4)
            offset += len(prompt)

        sequences = [p.tolist() for p in prompts]
        for _ in range(6):
            next_tokens = [int(torch.randint(0, config.vocab_size, (1,), generator=gen)) for _ in sequences]
            rows = zip(sequences, next_tokens, tables)
            ids, positions, layout = _step(decodes=[DecodeRow(i, tok, len(s), t, SPEC)
                                                    for i, (s, tok, t) in enumerate(rows)])
            attention.plan(layout)
            hidden = model(ids, positions, attention)
            ours = model.compute_logits(hidden)
            for i, (seq, tok) in enumerate(zip(sequences, next_tokens)):
                seq.append(tok)
                expected = reference(torch.tensor([seq])).logits[0, -1]
                torch.testing.assert_close(ours[i], expected, atol=1e-4, rtol=1e-4)


def test_chunked_prefill_over_cached_prefix_matches_full_prefill(tmp_path):
    config, model, attention, reference = _ours_and_reference(make_checkpoint(tmp_path / "q3", "qwen3"), 16)
    prompt = torch.randint(0, config.vocab_size, (23,), generator=torch.Generator().manual_seed(3))
    table = [5, 2, 9, 11, 0, 3, 7]
    outputs = []
    with torch.inference_mode():
        for lo, hi in [(0, 8), (8, 17), (17, 23)]:
            ids, positions, layout = _step([PrefillRow(0, prompt[lo:hi].tolist(), lo, table, None)])
            attention.plan(layout)
            outputs.append(model.compute_logits(model(ids, positions, attention)))
        expected = reference(prompt[None]).logits[0]
    torch.testing.assert_close(torch.cat(outputs), expected, atol=1e-4, rtol=1e-4)


def test_unsupported_architecture_names_the_supported_ones():
    from prelude.model.config import UnsupportedModel

    with pytest.raises(UnsupportedModel, match="Qwen3ForCausalLM"):
        ModelConfig.from_dict({"architectures": ["GPT2LMHeadModel"]})
