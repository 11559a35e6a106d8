"""The four numeric modes of the workshop, each one small switch.

=======  ==========================  ===================  ===========
mode     matmul/conv inputs          autocast dtype       loss scaling
=======  ==========================  ===================  ===========
fp32     float32, TF32 disabled      none                 no
tf32     TF32 tensor cores allowed   none                 no
fp16     float16 under autocast      torch.float16        GradScaler
bf16     bfloat16 under autocast     torch.bfloat16       not needed
=======  ==========================  ===================  ===========

bf16 keeps float32's exponent range, so small gradients do not underflow and no
loss scaling is needed; fp16 has 5 exponent bits and needs the GradScaler.
"""

from __future__ import annotations

import contextlib

import torch

from ..system.hardware import check_precision, cpu_16bit_support

AUTOCAST_DTYPE = {"fp16": torch.float16, "bf16": torch.bfloat16}


def set_tf32(enabled: bool) -> None:
    """Allow or forbid TF32 tensor cores for float32 matmuls and convolutions (global switches)."""
    torch.backends.cuda.matmul.allow_tf32 = enabled
    torch.backends.cudnn.allow_tf32 = enabled


def configure_precision(precision: str, device: torch.device) -> list[str]:
    """Check the device can run ``precision``, set the TF32 switches; return any warnings."""
    notes = check_precision(precision, device)
    set_tf32(precision == "tf32")
    return notes


def autocast(precision: str, device: torch.device):
    """The autocast context for a mode (a no-op for fp32 and tf32)."""
    if precision in AUTOCAST_DTYPE:
        return torch.autocast(device_type=device.type, dtype=AUTOCAST_DTYPE[precision])
    return contextlib.nullcontext()


def grad_scaler(precision: str, device: torch.device) -> torch.amp.GradScaler:
    """A GradScaler that is active only for fp16 (disabled scalers pass calls straight through)."""
    return torch.amp.GradScaler(device.type, enabled=precision == "fp16")


# ---------------------------------------------------------------- CPUs that only emulate 16-bit formats


def emulated_on_cpu(precision: str, device: torch.device) -> str | None:
    """One line saying why ``precision`` is skipped or sized down on this CPU, or None when it runs natively.

    The answer comes from what the CPU and PyTorch report (``cpu_16bit_support``), never from a timing:
    the same machine gives the same plan whether it is idle or busy.
    """
    if device.type != "cpu" or precision not in AUTOCAST_DTYPE:
        return None
    if precision == "fp16":
        return ("fp16 autocast on a CPU is emulated for most layers (a ResNet-18 step takes minutes), so it is "
                "skipped here; a GPU runs it")
    support = cpu_16bit_support()
    if support["native_bf16"]:
        return None
    missing = ("oneDNN reports no native bf16" if not support["onednn_bf16"]
               else "no AVX-512 BF16 or AMX instructions")
    return (f"bf16 autocast is emulated on this CPU ({support['cpu_capability']}, {missing}): each step converts "
            "every operand and runs many times slower than fp32, so it is skipped here; a GPU (or a CPU with "
            "AVX-512 BF16 or AMX) runs it")
