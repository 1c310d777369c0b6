"""The elementwise and normalization ops of the decoder, behind one indirection so that the CUDA
executor can swap in Triton kernels at model build time while every other path keeps running
plain torch code unchanged.

`TORCH_OPS` is the reference: kernels/reference.py's torch functions, the same ones every Triton
kernel is tested against.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Callable

import torch

from kernels.reference import rms_norm, rotate, silu_and_mul

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Ops:
    name: str
    rms_norm: Callable[..., object]
    rotate: Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]
    silu_and_mul: Callable[[torch.Tensor], torch.Tensor]
    # Every layer of a step in one call (prelude.executor.fused_step), where one exists, and the
    # same in calls that stop when asked (cooperative preemption).
    forward_step: Callable[..., None] | None = None
    resumable_step: Callable[..., Any] | None = None


TORCH_OPS = Ops("torch", rms_norm, rotate, silu_and_mul)


def cpu_native_ops() -> Ops:
    """The native fp32 kernels (kernels/cpu/ops.py), each falling back to the reference for
    inputs it does not take."""
    from kernels.cpu import ops as cpu

    return Ops("cpu-native", cpu.rms_norm, cpu.rotate, cpu.silu_and_mul, cpu.forward_step, cpu.resumable_step)


def triton_ops() -> Ops:
    """Triton RMSNorm and SiLU-and-mul; rotation stays torch here because the CUDA attention
    backend fuses it with the KV write (kernels.rope) and this one only serves other paths."""
    from kernels.activation import silu_and_mul as triton_silu_and_mul
    from kernels.norm import rms_norm as triton_rms_norm

    return Ops("triton", triton_rms_norm, rotate, triton_silu_and_mul)


def select_ops(device: torch.device, kernels: str = "auto") -> Ops:
    """`auto`: Triton on CUDA when importable, the native kernels on the CPU when built, torch
    everywhere else; `torch` forces torch."""
    if kernels == "torch":
        return TORCH_OPS
    if device.type == "cpu":
        from kernels.cpu import ops as cpu

        return cpu_native_ops() if cpu.built else TORCH_OPS
    if device.type != "cuda":
        return TORCH_OPS
    from kernels import available

    if not available(device.type):
        logger.info("triton is not importable: the model runs its torch ops on %s", device)
        return TORCH_OPS
    return triton_ops()
