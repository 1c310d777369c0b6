"""A safetensors checkpoint's tensors as the files hold them, read from their memory maps into
numpy arrays without torch (model.native_decoder stores them for the kernels from there)."""
from __future__ import annotations

import json
import mmap
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from prelude.model.config import UnsupportedModel

# The kernels' source codes (model.cpu_linear.SOURCES): what a checkpoint's tensor holds.
SOURCES = {"F32": 0, "BF16": 1}
BF16_SOURCE = SOURCES["BF16"]


class NotNative(ValueError):
    """A checkpoint or format the model without torch (model.native_decoder) does not run: the
    torch model serves it."""


@dataclass(frozen=True, slots=True)
class Source:
    """A checkpoint tensor as its file holds it: fp32, or bf16 as its 16 bits."""

    array: np.ndarray
    code: int  # SOURCES

    @property
    def shape(self) -> tuple[int, ...]:
        return self.array.shape


def checkpoint_files(model_dir: Path) -> list[Path]:
    index = model_dir / "model.safetensors.index.json"
    if index.is_file():
        shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        return [model_dir / shard for shard in shards]
    files = sorted(model_dir.glob("*.safetensors"))
    if not files:
        raise UnsupportedModel(f"no *.safetensors weights in {model_dir}; save the checkpoint as safetensors "
                               "(save_pretrained(..., safe_serialization=True))")
    return files


def fp32(source: Source) -> np.ndarray:
    """A vector (a norm's weight, a bias) in fp32."""
    if source.code == BF16_SOURCE:
        return (source.array.astype(np.uint32) << 16).view(np.float32)
    return np.array(source.array, np.float32)


class Checkpoint:
    """A safetensors checkpoint's tensors, read from the files' memory maps as they are."""

    def __init__(self, files: list[Path]):
        self._maps: list[mmap.mmap] = []
        self.tensors: dict[str, Source] = {}
        for path in files:
            with open(path, "rb") as f:
                size = int.from_bytes(f.read(8), "little")
                header = json.loads(f.read(size))
                mapped = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
            self._maps.append(mapped)
            raw = np.frombuffer(mapped, np.uint8)
            for name, meta in header.items():
                if name == "__metadata__":
                    continue
                if meta["dtype"] not in SOURCES:
                    raise NotNative(f"{path.name}: {name} is {meta['dtype']}")
                lo, hi = meta["data_offsets"]
                dtype = np.float32 if meta["dtype"] == "F32" else np.uint16
                array = raw[8 + size + lo:8 + size + hi].view(dtype).reshape(meta["shape"])
                self.tensors[canonical_name(name)] = Source(array, SOURCES[meta["dtype"]])

    def __getitem__(self, name: str) -> Source:
        if name not in self.tensors:
            raise NotNative(f"the checkpoint lacks {name}")
        return self.tensors[name]

    def fused(self, *names: str) -> Source:
        """Tensors concatenated along their outputs (q/k/v, gate/up), in one source dtype."""
        parts = [self[name] for name in names]
        if len({p.code for p in parts}) != 1:
            raise NotNative(f"{names} mix dtypes")
        return Source(np.concatenate([p.array for p in parts]), parts[0].code)

    def close(self) -> None:
        self.tensors.clear()
        for mapped in self._maps:
            mapped.close()


def canonical_name(name: str) -> str:
    """DecoderLM._canonical_name's: embedding checkpoints saved from the bare *Model lack `model.`."""
    return "model." + name if name.split(".")[0] in ("embed_tokens", "layers", "norm") else name
