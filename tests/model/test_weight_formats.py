"""bf16 and int8 weights on the CPU (`--dtype bfloat16`, `--quantization int8`) come close to fp32
on the same checkpoint, through the server's own step (the native one-call step): logits within
a stated share of their spread, the same greedy token wherever fp32's top two are further apart
than that, and final hidden states (what embeddings and classifiers pool) within a stated cosine.

Stated tolerances, on random-weight Qwen3 checkpoints (real checkpoints quantize better: their
rows are less uniform than Gaussian noise, but no test here can download one):
  bf16: every logit within 4% of fp32's standard deviation over the vocabulary (measured: 3.2%);
        hidden-state cosine >= 0.9999 (measured 0.99997). Where the CPU has AVX-512 BF16 the rows
        are rounded to bf16 too (kernels/cpu/bf16_gemm.hpp): 2.8% and 0.99998 with the weights
        alone in bf16.
  int8: every logit within 25% of that standard deviation (measured: 19%, the worst of 2,048
        tokens x 50 positions); hidden-state cosine >= 0.998 (measured 0.9991). Where the CPU has
        AVX-512 VNNI or AVX2 the rows are quantized too (per row, kernels/cpu/vnni_gemm.hpp,
        maddubs_gemm.hpp): 12% and 0.9996 with the weights alone quantized.
  bf16x3 (fp32 weights on a CPU with AMX, kept as two bf16 halves, model.cpu_linear): every logit
        within 0.05% of that standard deviation (measured 0.006%), hidden-state cosine >= 0.99999
        (measured 1 - 1.8e-7), the same greedy token at every position."""
from __future__ import annotations

import pytest
import torch

from kernels.cpu import ops as cpu_ops
from prelude.contract.batch import OutputSpec, PrefillRow
from prelude.contract.sampling import GREEDY
from prelude.executor.attention.torch_ref import TorchAttention
from prelude.executor.fused_step import native_step
from prelude.executor.host_step import host_step
from prelude.executor.kv_cache import KVCache, KVCacheShape
from prelude.model.config import ModelConfig
from prelude.model.cpu_linear import SPLIT_PRODUCTS
from prelude.model.layers import stored_formats
from prelude.model.loader import load_model
from prelude.model.ops import select_ops
from tests.checkpoints import make_checkpoint

pytestmark = pytest.mark.skipif(not cpu_ops.built, reason="kernels.cpu is not built")

TOLERANCE = {"bfloat16": (0.04, 0.9999), "int8": (0.25, 0.998), "bf16x3": (5e-4, 0.99999)}  # (logits / std, cosine)


def _final_states(path, weight_format: str | None, prompts: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
    """Every prompt token's final hidden state and logits, through the native step (weight_format
    None: the weights as read, through torch's ops)."""
    return _states_of(_load(path, weight_format), weight_format, prompts)


def _load(path, weight_format: str | None):
    return load_model(path, ModelConfig.from_dir(path), torch.float32, torch.device("cpu"), max_positions=256,
                      ops=select_ops(torch.device("cpu")), weight_format=weight_format)


def _states_of(model, weight_format: str | None, prompts: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
    """_final_states of a loaded model; label-token logits (a judge's few rows of the head)
    checked against the full ones."""
    config = model.config
    ops = select_ops(torch.device("cpu"))
    native = native_step(model, ops)
    assert native is not None or weight_format is None, "every format runs on the native step"
    cache = KVCache(KVCacheShape.for_model(config, num_blocks=64, block_size=4, dtype=torch.float32),
                    torch.device("cpu"))
    attention = TorchAttention(cache)
    rows = [PrefillRow(i, p, 0, list(range(8 * i, 8 * i + 8)), OutputSpec(sample=GREEDY))
            for i, p in enumerate(prompts)]
    step = host_step(rows, (), 4)
    attention.plan(step.layout(step.slots))
    with torch.inference_mode():
        ids, positions = step.ids, step.positions
        hidden = model(ids, positions, attention) if native is None else native.try_forward(ids, positions, attention)
        assert hidden is not None
        logits = model.compute_logits(hidden)
        labels = (5, 1000, 2047)
        # The label rows multiply fp32 activations; the whole head's int8 products (VNNI, AVX2) quantize
        # them per token: the two agree within that rounding (measured 2% of the logits' spread).
        close = 0.05 * logits.std().item() if weight_format == "int8" else 1e-4
        torch.testing.assert_close(model.compute_label_logits(hidden, labels), logits[:, labels], rtol=0, atol=close)
        return hidden, logits


@pytest.mark.parametrize("weight_format", ["bfloat16", "int8", pytest.param("bf16x3", marks=pytest.mark.skipif(
    not SPLIT_PRODUCTS, reason="bf16x3 runs on AMX, which this CPU (or process) lacks"))])
@pytest.mark.parametrize("tie", [True, False])
def test_narrow_weights_stay_within_the_stated_tolerance_of_fp32(tmp_path, weight_format, tie):
    path = make_checkpoint(tmp_path / "q3", "qwen3", hidden_size=256, intermediate_size=512, tie=tie,
                           vocab_size=2048)
    gen = torch.Generator().manual_seed(3)
    prompts = [torch.randint(0, 2048, (n,), generator=gen).tolist() for n in (3, 17, 30)]
    hidden32, logits32 = _final_states(path, "float32", prompts)
    hidden, logits = _final_states(path, weight_format, prompts)
    logit_share, cosine = TOLERANCE[weight_format]
    error = (logits - logits32).abs().max(dim=-1).values
    spread = logits32.std(dim=-1)
    assert (error <= logit_share * spread).all(), (error / spread).max()
    # The greedy token is fp32's wherever fp32's top two are further apart than twice the error.
    top2 = logits32.topk(2, dim=-1).values
    clear = (top2[:, 0] - top2[:, 1]) > 2 * error
    assert clear.sum() >= 10, "the check must cover a fair share of the 50 positions"
    assert torch.equal(logits.argmax(-1)[clear], logits32.argmax(-1)[clear])
    assert torch.nn.functional.cosine_similarity(hidden, hidden32, dim=-1).min() >= cosine
    if weight_format == "bf16x3":  # as good as fp32 for every choice
        assert torch.equal(logits.argmax(-1), logits32.argmax(-1))


def test_a_bf16_checkpoint_served_in_fp32_keeps_its_layers_in_bf16_with_fp32s_results(tmp_path):
    # Most published checkpoints are bf16, and the CPU serves them in fp32 by default: the layers'
    # weights lose nothing in bf16, so they keep one packing (bf16x2), not fp32's bytes, and give
    # fp32's logits within bf16x3's tolerance (on AMX; fp32's own products elsewhere), every
    # greedy token the same. The reference: the same weights in fp32 panels, stored as such.
    path = make_checkpoint(tmp_path / "q3", "qwen3", hidden_size=256, intermediate_size=512, vocab_size=2048,
                           dtype=torch.bfloat16)
    gen = torch.Generator().manual_seed(5)
    prompts = [torch.randint(0, 2048, (n,), generator=gen).tolist() for n in (3, 17, 30)]
    hidden32, logits32 = _final_states(path, None, prompts)
    hidden, logits = _final_states(path, "bf16x3" if SPLIT_PRODUCTS else "float32", prompts)
    logit_share, cosine = TOLERANCE["bf16x3"]
    assert ((logits - logits32).abs().max(dim=-1).values <= logit_share * logits32.std(dim=-1)).all()
    assert torch.equal(logits.argmax(-1), logits32.argmax(-1))
    assert torch.nn.functional.cosine_similarity(hidden, hidden32, dim=-1).min() >= cosine
    config = ModelConfig.from_dir(path)
    model = load_model(path, config, torch.float32, torch.device("cpu"), max_positions=64,
                       ops=select_ops(torch.device("cpu")), weight_format="bf16x3" if SPLIT_PRODUCTS else "float32")
    # Its tied head and embedding in bf16 too: by rows where AMX's tiles take a head's many rows,
    # else in bf16x2 panels (lookups gather from them).
    assert stored_formats(model) == (["bf16x2", "bfloat16"] if SPLIT_PRODUCTS else ["bf16x2"])
    embedding = model.model.embed_tokens.stored
    assert embedding is not None and embedding.format == ("bfloat16" if SPLIT_PRODUCTS else "bf16x2")


@pytest.mark.parametrize("tie", [True, False])
def test_a_bf16_checkpoint_is_read_as_bf16_and_gives_its_fp32_copys_results(tmp_path, tie):
    # A bf16 checkpoint's projections and embeddings are read and stored as the checkpoint holds
    # them (model.loader), not widened to fp32 first: in every CPU format the model gives the very
    # results of the same weights saved in fp32, and keeps no bf16 parameter beside its stored
    # weights (what the kernels do not take is widened again).
    import shutil

    from safetensors.torch import load_file, save_file

    path = make_checkpoint(tmp_path / "bf16", "qwen3", hidden_size=256, intermediate_size=512, vocab_size=2048,
                           tie=tie, dtype=torch.bfloat16)
    wide = tmp_path / "fp32"
    shutil.copytree(path, wide)
    for file in wide.glob("*.safetensors"):
        save_file({name: t.float() for name, t in load_file(file).items()}, file, metadata={"format": "pt"})
    gen = torch.Generator().manual_seed(7)
    prompts = [torch.randint(0, 2048, (n,), generator=gen).tolist() for n in (3, 17)]
    for weight_format in ("bf16x3" if SPLIT_PRODUCTS else "float32", "bfloat16", "int8"):
        hidden, logits = _final_states(path, weight_format, prompts)
        hidden32, logits32 = _final_states(wide, weight_format, prompts)
        assert torch.equal(hidden, hidden32) and torch.equal(logits, logits32), weight_format
        config = ModelConfig.from_dir(path)
        model = load_model(path, config, torch.float32, torch.device("cpu"), max_positions=64,
                           ops=select_ops(torch.device("cpu")), weight_format=weight_format)
        assert {p.dtype for p in model.parameters()} == {torch.float32}, weight_format


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_no_weight_changes_with_the_checkpoint_file_after_loading(tmp_path, dtype):
    # The loader takes the checkpoint's tensors from safetensors' memory map where they need no
    # conversion, stores them for the kernels from there, and copies out whatever the kernels do
    # not take: the file's values zeroed in place under a loaded model change none of its results.
    import shutil

    pristine = make_checkpoint(tmp_path / "q3", "qwen3", hidden_size=256, intermediate_size=512, vocab_size=2048,
                               dtype=dtype)
    gen = torch.Generator().manual_seed(11)
    prompts = [torch.randint(0, 2048, (n,), generator=gen).tolist() for n in (3, 17)]
    for weight_format in (None, "float32", *(["bf16x3"] if SPLIT_PRODUCTS else []), "bfloat16", "int8"):
        path = tmp_path / f"q3-{weight_format}"
        shutil.copytree(pristine, path)
        before = _final_states(path, weight_format, prompts)
        model = _load(path, weight_format)
        for file in path.glob("*.safetensors"):
            with open(file, "r+b") as f:
                start = 8 + int.from_bytes(f.read(8), "little")  # past the header: its tensors' bytes
                f.seek(start)
                f.write(bytes(file.stat().st_size - start))
        after = _states_of(model, weight_format, prompts)
        assert torch.equal(before[0], after[0]) and torch.equal(before[1], after[1]), weight_format


def test_an_encoder_packs_fp32_and_bf16_weights_and_refuses_int8_with_its_reason(tmp_path):
    from prelude.model.config import UnsupportedModel
    from prelude.model.loader import cpu_weight_format

    config = ModelConfig.from_dir(make_checkpoint(tmp_path / "bert", "bert", head="Model"))
    with pytest.raises(UnsupportedModel, match="--quantization int8 serves decoder models"):
        cpu_weight_format(torch.float32, "int8", config)
    # packed dense layers: fp32, or split for the tiles where the CPU has AMX (cpu_linear's bf16x3)
    assert cpu_weight_format(torch.float32, "none", config) == (torch.float32,
                                                                "bf16x3" if SPLIT_PRODUCTS else "float32")
    assert cpu_weight_format(torch.bfloat16, "none", config) == (torch.float32, "bfloat16")  # packed, bf16
