"""FLOPs counted by PyTorch itself, turned into achieved TFLOP/s and MFU.

MFU (model FLOPs utilisation) = achieved FLOP/s / the device's peak FLOP/s for
the precision used. The FLOPs come from ``torch.utils.flop_counter`` on a real
forward and backward pass, never from a hand-typed formula.

A token model is counted on the meta device: shapes without data, so the
124M-parameter GPT costs nothing to count, and attention is counted as the two
matrix products it is (on a CPU, the fused attention kernel has no FLOP formula
in the counter and would count as zero).
"""

from __future__ import annotations

import copy

import torch
from torch import nn
from torch.func import functional_call
from torch.utils.flop_counter import FlopCounterMode

from ..system.hardware import peak_tflops


def training_flops_per_sample(model: nn.Module, input_shape=(3, 32, 32), batch: int = 2) -> int:
    """FLOPs of one training step (forward + backward) per sample, counted on a CPU copy."""
    probe = copy.deepcopy(model).cpu().float().train()
    x = torch.randn(batch, *input_shape)
    counter = FlopCounterMode(display=False)
    with counter:
        probe(x).sum().backward()
    return counter.get_total_flops() // batch


def training_flops_per_sequence(model: nn.Module, sequence_length: int, batch: int = 2) -> int:
    """FLOPs of one training step (forward + backward) per sequence of token ids, counted on the meta device."""
    tensors = {**dict(model.named_parameters()), **dict(model.named_buffers())}
    meta = {name: torch.empty_like(t, device="meta").requires_grad_(t.requires_grad) for name, t in tensors.items()}
    tokens = torch.zeros(batch, sequence_length, dtype=torch.long, device="meta")
    counter = FlopCounterMode(display=False)
    with counter:
        functional_call(model, meta, (tokens,)).sum().backward()
    return counter.get_total_flops() // batch


def achieved_tflops(flops_per_sample: int, samples_per_second: float) -> float:
    return flops_per_sample * samples_per_second / 1e12


def mfu(tflops: float, device_name: str, precision: str) -> float | None:
    """Fraction of the device's peak, or None when its peak is not known (never guessed)."""
    peak = peak_tflops(device_name, precision)
    return tflops / peak if peak else None
