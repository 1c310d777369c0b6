"""Our encoders' states and classifier scores equal transformers' on the same random weights:
BERT (with token types), XLM-RoBERTa (positions offset past the padding id) and ModernBERT
(global and windowed local layers), rows of several lengths in one flattened step: each row on
the native kernel (fp32 on the CPU, no window), on torch, short ones batched under a mask and
long ones attended alone, and on the flashinfer backend (its non-causal ragged prefill, run here
on the CPU stand-in of flashinfer's API; windowed layers whose window some row exceeds on torch)."""
from __future__ import annotations

import dataclasses

import pytest
import torch

from prelude.contract.batch import OutputSpec, PrefillRow
from prelude.contract.stop import StopFlag
from prelude.executor.attention import encoder_attention
from prelude.executor.attention.encoder_attention import PADDED_ROW_TOKENS
from prelude.executor.attention.torch_ref import TorchAttention
from prelude.executor.host_step import host_step
from prelude.executor.kv_cache import KVCache, KVCacheShape
from prelude.model.config import ModelConfig
from prelude.model.loader import load_model
from tests.checkpoints import load_reference, make_checkpoint
from tests.executor import fake_flashinfer

SEP = 3
LENGTHS = [9, 1, PADDED_ROW_TOKENS + 13, 30, 5]
CASES = [
    ("bert", "Model", {}),
    ("bert", "ForSequenceClassification", dict(num_labels=3)),
    ("xlm-roberta", "Model", dict(pad_token_id=1)),
    ("xlm-roberta", "ForSequenceClassification", dict(pad_token_id=1, num_labels=1)),
    ("modernbert", "Model", dict(local_attention=8, global_attn_every_n_layers=2, num_hidden_layers=3)),
    ("modernbert", "ForSequenceClassification", dict(local_attention=8, num_labels=2, classifier_pooling="mean")),
]


def _config(path, family) -> ModelConfig:
    config = ModelConfig.from_dir(path)
    if family == "bert":  # no tokenizer beside these weights: name the separator ourselves
        assert config.encoder is not None
        config = dataclasses.replace(config, encoder=dataclasses.replace(config.encoder, sep_token_id=SEP))
    return config


def _ours(path, family, weight_format="float32", backend="torch"):
    config = _config(path, family)
    model = load_model(path, config, torch.float32, torch.device("cpu"), max_positions=config.max_position_embeddings,
                       weight_format=weight_format)
    cache = KVCache(KVCacheShape.for_model(config, num_blocks=4, block_size=16, dtype=torch.float32),
                    torch.device("cpu"))
    if backend == "flashinfer":
        from prelude.executor.attention.flashinfer_backend import FlashInferAttention

        return config, model, FlashInferAttention(cache, config.num_heads, max_pages_per_row=4, dummy_page=3,
                                                  fuse_rope=False, workspace_bytes=16)
    return config, model, TorchAttention(cache)


def _states(model, attention, prompts: list[torch.Tensor], device: str = "cpu") -> list[torch.Tensor]:
    """Each prompt's final states, the prompts computed together in one flattened step."""
    step = host_step([PrefillRow(i, p.tolist(), 0, [], OutputSpec(pooling="mean")) for i, p in enumerate(prompts)],
                     (), 16)
    layout = step.layout(step.slots.to(device))
    attention.plan(layout)
    hidden = model(step.ids.to(device), step.positions.to(device), attention)
    return [hidden[layout.query_starts[i]:layout.query_starts[i + 1]] for i in range(len(prompts))]


@pytest.mark.parametrize("kernel", ["native", "torch", "flashinfer"])
@pytest.mark.parametrize("family,head,extra", CASES, ids=lambda c: c if isinstance(c, str) else "")
def test_encoder_states_and_scores_match_transformers(tmp_path, monkeypatch, family, head, extra, kernel):
    if kernel != "native":  # the torch fallback of either backend: batched under a mask, or alone
        monkeypatch.setattr(encoder_attention, "bidirectional_rows", None)
    elif encoder_attention.bidirectional_rows is None:
        pytest.skip("kernels.cpu is not built")
    if kernel == "flashinfer":
        fake_flashinfer.install(monkeypatch)
    path = make_checkpoint(tmp_path / family, family, head=head, **extra)
    config, model, attention = _ours(path, family, backend="torch" if kernel == "native" else kernel)
    reference = load_reference(path)
    gen = torch.Generator().manual_seed(2)
    prompts = [torch.randint(4, config.vocab_size, (n,), generator=gen) for n in LENGTHS]
    prompts[0][4] = SEP  # a pair: tokens after the first separator are segment B
    with torch.inference_mode():
        states = _states(model, attention, prompts)
    if kernel == "flashinfer":  # planned once for the step, at its first unwindowed layer
        assert attention.encoder.plan_calls == 1
    with torch.inference_mode():
        for i, (prompt, ours) in enumerate(zip(prompts, states)):
            kwargs = {}
            if family == "bert":
                types = (torch.arange(len(prompt)) > 4).long() if i == 0 else torch.zeros_like(prompt)
                kwargs["token_type_ids"] = types[None]
            if head == "Model":
                theirs = reference(prompt[None], **kwargs).last_hidden_state[0]
                torch.testing.assert_close(ours, theirs, atol=2e-5, rtol=1e-4)
                continue
            theirs_scores = reference(prompt[None], **kwargs).logits[0]
            pooled = ours[0] if model.classifier_pooling == "cls" else ours.mean(dim=0)
            torch.testing.assert_close(model.compute_scores(pooled[None])[0], theirs_scores, atol=2e-5, rtol=1e-4)


@pytest.mark.parametrize("family,extra", [(f, e) for f, h, e in CASES if h == "Model"], ids=lambda c: c
                         if isinstance(c, str) else "")
def test_bf16_weights_keep_every_state_within_the_stated_cosine(tmp_path, family, extra):
    # --dtype bfloat16: the dense layers' weights packed in bf16, each product's rows rounded to
    # bf16 as the kernel reads them (AVX-512 BF16) or its weights widened; all else in fp32.
    if encoder_attention.bidirectional_rows is None:
        pytest.skip("kernels.cpu is not built")
    path = make_checkpoint(tmp_path / family, family, head="Model", **extra)
    config, model, attention = _ours(path, family, weight_format="bfloat16")
    reference = load_reference(path)
    gen = torch.Generator().manual_seed(3)
    prompts = [torch.randint(4, config.vocab_size, (n,), generator=gen) for n in LENGTHS]
    with torch.inference_mode():
        for prompt, ours in zip(prompts, _states(model, attention, prompts)):
            kwargs = {"token_type_ids": torch.zeros_like(prompt)[None]} if family == "bert" else {}
            theirs = reference(prompt[None], **kwargs).last_hidden_state[0]
            assert torch.nn.functional.cosine_similarity(ours, theirs, dim=-1).min() >= 0.999


def test_a_forward_stepped_aside_between_layers_gives_the_same_states(tmp_path):
    path = make_checkpoint(tmp_path / "bert", "bert", head="Model", num_hidden_layers=3)
    config, model, attention = _ours(path, "bert")
    step = host_step([PrefillRow(0, list(range(4, 20)), 0, [], OutputSpec(pooling="mean"))], (), 16)
    layout = step.layout(step.slots)
    ids, positions = step.ids, step.positions
    attention.plan(layout)
    with torch.inference_mode():
        whole = model(ids, positions, attention)
        stop = StopFlag(check_every_macs=0)
        stop.set()
        forward = model.begin(ids, positions, attention, None, stop)
        parts = [forward.advance(attention, stop) for _ in range(config.num_layers)]
    assert parts[:-1] == [None] * (config.num_layers - 1)
    torch.testing.assert_close(parts[-1], whole)


def test_an_unsupported_encoder_config_is_refused_with_its_reason():
    from prelude.model.config import UnsupportedModel

    raw = dict(architectures=["BertModel"], vocab_size=10, hidden_size=8, intermediate_size=8, num_hidden_layers=1,
               num_attention_heads=2, position_embedding_type="relative_key")
    with pytest.raises(UnsupportedModel, match="relative_key"):
        ModelConfig.from_dict(raw)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (and flashinfer)")
@pytest.mark.parametrize("family,extra", [("bert", {}), ("modernbert", dict(local_attention=8))],
                         ids=["bert", "modernbert"])
def test_flashinfer_encoder_states_on_the_gpu_match_transformers(tmp_path, family, extra):
    """flashinfer's own non-causal kernel, in bf16 at head_dim 64 (one of its prebuilt sizes),
    against transformers in fp32 on the CPU."""
    pytest.importorskip("flashinfer")
    from prelude.executor.attention.flashinfer_backend import FlashInferAttention

    path = make_checkpoint(tmp_path / family, family, head="Model", hidden_size=128, num_attention_heads=2,
                           num_key_value_heads=2, **extra)
    config = _config(path, family)
    cuda = torch.device("cuda")
    model = load_model(path, config, torch.bfloat16, cuda, max_positions=config.max_position_embeddings)
    cache = KVCache(KVCacheShape.for_model(config, num_blocks=4, block_size=16, dtype=torch.bfloat16), cuda)
    attention = FlashInferAttention(cache, config.num_heads, max_pages_per_row=4, dummy_page=3)
    reference = load_reference(path)
    gen = torch.Generator().manual_seed(4)
    prompts = [torch.randint(4, config.vocab_size, (n,), generator=gen) for n in LENGTHS]
    with torch.inference_mode():
        states = _states(model, attention, prompts, "cuda")
        assert attention._encoder_planned  # the global layers ran on flashinfer's kernel
        for prompt, state in zip(prompts, states):
            ours = state.float().cpu()
            kwargs = {"token_type_ids": torch.zeros_like(prompt)[None]} if family == "bert" else {}
            theirs = reference(prompt[None], **kwargs).last_hidden_state[0]
            assert torch.nn.functional.cosine_similarity(ours, theirs, dim=-1).min() >= 0.99
