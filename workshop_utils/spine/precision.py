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

from ..system.hardware import check_precision

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

EMULATED_SLOWDOWN = 3.0  # autocast this many times slower than fp32 on the probe: emulated, not native
_slowdowns: dict[str, float] = {}


def autocast_slowdown(precision: str, repeats: int = 3) -> float:
    """How many times slower a small conv step runs on the CPU under ``precision``'s autocast than in fp32.

    Many CPUs (AVX2-only ones, and fp16 on most others) have no native 16-bit arithmetic: autocast then
    converts every operand and runs 10-20x slower, which turns a minute's demo into a quarter-hour. A
    ratio of two short timings in the same process tells it apart from a busy machine, which slows both.
    Measured once per process (a fraction of a second).
    """
    if precision not in AUTOCAST_DTYPE:
        return 1.0
    if precision not in _slowdowns:
        import time

        torch.manual_seed(0)
        conv = torch.nn.Sequential(torch.nn.Conv2d(16, 16, 3, padding=1), torch.nn.ReLU(), torch.nn.Conv2d(16, 16, 3))
        images = torch.randn(4, 16, 16, 16)

        def step(dtype):
            with torch.autocast("cpu", dtype=dtype, enabled=dtype is not None):
                out = conv(images)
            out.float().sum().backward()

        timings = {None: [], AUTOCAST_DTYPE[precision]: []}
        for dtype in timings:
            step(dtype)  # warm-up: first-call dispatch and allocation are not what we compare
        for _ in range(repeats):  # interleaved, so a burst of load on the machine hits both alike
            for dtype in timings:
                started = time.perf_counter()
                step(dtype)
                timings[dtype].append(time.perf_counter() - started)
        fp32, low = (sorted(t)[len(t) // 2] for t in timings.values())
        _slowdowns[precision] = low / fp32
    return _slowdowns[precision]


def emulated_on_cpu(precision: str, device: torch.device) -> str | None:
    """One line saying why ``precision`` is skipped or sized down on this CPU, or None when it runs natively."""
    if device.type != "cpu" or precision not in AUTOCAST_DTYPE:
        return None
    if precision == "fp16":
        # PyTorch's CPU fp16 kernels cover only some shapes: a small probe can run natively while a
        # ResNet-18 step takes minutes, so fp16 counts as emulated on every CPU.
        return ("fp16 autocast on a CPU is emulated for most layers (a ResNet-18 step takes minutes), so it is "
                "skipped here; a GPU runs it")
    slowdown = autocast_slowdown(precision)
    if slowdown < EMULATED_SLOWDOWN:
        return None
    return (f"{precision} autocast is emulated on this CPU ({torch.backends.cpu.get_cpu_capability()}): a probe step "
            f"ran {slowdown:.0f}x slower than fp32, so it is skipped here; a GPU (or a CPU with native "
            f"{precision}) runs it")
