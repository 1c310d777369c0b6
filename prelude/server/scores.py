"""Head outputs as API values: the probabilities and relevance the decision endpoints report, and
the embedding vectors they return (Matryoshka cut, float32 packing)."""
from __future__ import annotations

import base64
import math
import struct
import sys
from array import array
from typing import TypeVar

import numpy as np

T = TypeVar("T")


def required(value: T | None) -> T:
    """An output the row's OutputSpec asked for, which the executor always fills."""
    assert value is not None, "the executor left out an output the row asked for"
    return value


def softmax(values: list[float]) -> list[float]:
    top = max(values)
    exps = [math.exp(v - top) for v in values]
    total = sum(exps)
    return [e / total for e in exps]


def sigmoid(x: float) -> float:
    return 1.0 / (1.0 + math.exp(-x)) if x >= 0 else math.exp(x) / (1.0 + math.exp(x))


def label_probabilities(logits: list[float], multi_label: bool) -> list[float]:
    """A classifier's probabilities, as transformers' text-classification pipeline and vLLM give
    them: each label's sigmoid for a one-label (reward) head or independent (multi-label) labels,
    else a softmax over the labels. A multi-label head's softmax made its labels compete: a text
    both toxic and insulting scored under 0.5 on each."""
    return [sigmoid(x) for x in logits] if multi_label or len(logits) == 1 else softmax(logits)


def pair_relevance(logits: list[float]) -> float:
    """Cross-encoder relevance: sigmoid of a single logit, else the probability of label 1."""
    return sigmoid(logits[0]) if len(logits) == 1 else softmax(logits)[1]


def pair_logit(logits: list[float]) -> float:
    """The logit pair_relevance's probability comes from (TEI's raw_scores): the single logit,
    else label 1's log-odds against the other labels, computed without the probability's
    rounding (a confident pair's sigmoid is 1.0 in a double, whose log-odds are infinite)."""
    if len(logits) == 1:
        return logits[0]
    rest = logits[:1] + logits[2:]
    top = max(rest)
    return logits[1] - top - math.log(sum(math.exp(x - top) for x in rest))


def matryoshka(vector: list[float], dimensions: int | None, normalize: bool) -> list[float]:
    """The leading `dimensions` of an embedding, renormalized when `normalize` (vLLM's
    `dimensions`, Cohere's `output_dimension`), in float32 like every other embedding the server
    returns: renormalized in float64, the float format listed values its base64 (float32) could
    not hold, so the two formats disagreed."""
    if dimensions is not None:
        vector = vector[:dimensions]
    if normalize:
        norm = math.sqrt(sum(v * v for v in vector)) or 1.0
        vector = array("f", [v / norm for v in vector]).tolist()
    return vector


def packed_float32(vector: list[float]) -> str:
    """base64 of the vector as little-endian float32 (OpenAI's and Cohere's base64 format)."""
    return base64.b64encode(struct.pack(f"<{len(vector)}f", *vector)).decode()


# vLLM's embed_dtype: the element type of a base64 embedding (float32, OpenAI's, by default).
EMBED_DTYPES = ("float32", "float16", "bfloat16", "fp8_e4m3", "fp8_e5m2")
ENDIANNESS = ("native", "little", "big")


def packed(vector: list[float], dtype: str = "float32", endianness: str = "little") -> str:
    """base64 of the vector's elements as `dtype` (one of EMBED_DTYPES, each rounded to nearest
    as torch converts), in `endianness` byte order."""
    if dtype == "float32" and endianness in ("little", "native") and sys.byteorder == "little":
        return packed_float32(vector)
    values = np.asarray(vector, dtype=np.float32)
    raw: np.ndarray
    if dtype == "float16":
        raw = values.astype(np.float16)
    elif dtype == "bfloat16":  # float32's top half, rounded to nearest even
        bits = values.view(np.uint32).astype(np.uint64)
        raw = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)
    elif dtype.startswith("fp8"):
        import torch  # the engine's: numpy has no 8-bit floats
        kind = torch.float8_e4m3fn if dtype == "fp8_e4m3" else torch.float8_e5m2
        raw = torch.from_numpy(values).to(kind).view(torch.uint8).numpy()
    else:
        raw = values
    if endianness == "big" or (endianness == "native" and sys.byteorder == "big"):
        raw = raw.astype(raw.dtype.newbyteorder(">"))
    else:
        raw = raw.astype(raw.dtype.newbyteorder("<"))
    return base64.b64encode(raw.tobytes()).decode()
