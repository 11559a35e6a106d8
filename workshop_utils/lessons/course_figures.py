"""The seed course's figures beside the ones measured here, and why they differ.

The course this kit grew from closed with one slide of results: an A100 baseline of about 1,000
samples/s, 6.5x on 8 GPUs, 1.7x from AMP and 11x combined. Attendees have seen those numbers; their
own will differ. ``beside_the_course`` puts the quoted figure next to the measured one and explains
the gap from facts of the run (device, FLOPs per sample, world size, precision).
"""

from __future__ import annotations

import pandas as pd

from ..system.errors import WorkshopError
from ..system.hardware import peak_tflops


# The seed course's "combined optimization results" slide: SimpleCNN/ResNet-18 on CIFAR-10, A100s.
A100 = "A100"
COURSE_FIGURES = {
    "baseline samples/s": (1000.0, "SimpleCNN, one A100, FP32"),
    "8-GPU speed-up": (6.5, "SimpleCNN, 8 A100s with DDP over one"),
    "AMP speed-up": (1.7, "ResNet-18, FP16 autocast over FP32, A100"),
    "combined speed-up": (11.0, "8 A100s and AMP over one A100 in FP32"),
}


def _why_baseline(facts: dict) -> str:
    flops = facts.get("flops_per_sample")
    used = (f"1,000 samples/s of {flops / 1e6:,.0f} MFLOP each is {1000 * flops / (peak_tflops(A100, 'fp32') * 1e12):.2%} "
            "of an A100's FP32 peak: that figure is set by the data loader, not the GPU. ") if flops else ""
    device = facts.get("device_name", "this device")
    if facts.get("device_type") == "cpu":
        return used + f"Here a CPU ({device}) does the arithmetic itself, without a GPU's thousands of lanes."
    return used + f"Here ({device}) the same holds until the loader is tuned: notebook 04 removes it step by step."


def _why_scaling(facts: dict) -> str:
    world = facts.get("world_size", 1)
    measured = facts.get("measured")
    mine = f"{measured / world:.0%}" if measured and world else "?"
    if facts.get("device_type") == "cpu":
        where = f"{world} CPU processes that share one memory bus and a few cores"
    else:
        where = f"{world} GPUs ({facts.get('device_name', 'GPU')})"
    return (f"Per-device efficiency: the course {6.5 / 8:.0%} on 8 A100s in one node; here {mine} with {where}. "
            "Efficiency falls as the all-reduce takes a larger share of each step (the cost model in section 7).")


def _why_amp(facts: dict) -> str:
    precision = facts.get("precision", "bf16")
    if facts.get("device_type") == "cpu":
        return (f"The course's FP16 ran on A100 tensor cores ({peak_tflops(A100, 'fp16'):.0f} TFLOP/s against "
                f"{peak_tflops(A100, 'fp32'):.1f} in FP32). A CPU has no tensor cores: {precision} there saves "
                "memory traffic at best, and where the CPU only emulates it, it is slower.")
    return (f"Both use tensor cores; the gain grows with the batch (the batch sweep) and with channels_last. "
            "The course's FP32 most likely let cuDNN run its convolutions in TF32 (PyTorch's default); the "
            "speed-up here is against strict FP32, so it comes out larger. A newer GPU widens the gap again: "
            "its 16-bit peak grew faster than its FP32 peak.")


def _why_combined(facts: dict) -> str:
    return ("The course multiplies across 8 GPUs (6.5x) and AMP (1.7x). Notebook 04 stays on one device and "
            "multiplies smaller steps instead: the loader, the precision, the layout, the optimizer, the batch.")


_WHY = {"baseline samples/s": _why_baseline, "8-GPU speed-up": _why_scaling, "AMP speed-up": _why_amp,
        "combined speed-up": _why_combined}


def _figure(value: float, name: str) -> str:
    return f"{value:,.0f} samples/s" if name.endswith("samples/s") else f"{value:.2f}x"


def beside_the_course(name: str, measured: float | None, **facts) -> pd.DataFrame:
    """Print the course's quoted figure, the one measured here and why they differ; return them as a row.

    ``facts`` feed the explanation: ``device_type``, ``device_name``, ``flops_per_sample``,
    ``world_size`` and ``precision`` where they matter.
    """
    if name not in COURSE_FIGURES:
        raise WorkshopError(f"No course figure named {name!r}.", f"use one of: {', '.join(COURSE_FIGURES)}.")
    quoted, setting = COURSE_FIGURES[name]
    here = facts.get("device_name") or facts.get("device_type") or "this machine"
    why = _WHY[name]({**facts, "measured": measured})
    world = facts.get("world_size")
    if name == "8-GPU speed-up" and world:
        # A speed-up on 2 devices is not comparable with one on 8: compare what each device delivers.
        ratio, against = (measured / world) / (quoted / 8) if measured else None, "per-device efficiency"
        here = f"{world} x {here}"
    else:
        ratio, against = (measured / quoted if measured else None), "figure"
    print(f"{name}, the course: {_figure(quoted, name)} ({setting})")
    print(f"{name}, here:       " + (f"{_figure(measured, name)} ({here}), {ratio:.2g}x the course's {against}"
                                     if measured else f"not measured in this run ({here})"))
    print(f"why they differ: {why}")
    return pd.DataFrame([{"figure": name, "course (quoted)": quoted, "course setting": setting,
                          "measured here": measured, "here": here, "here / course": ratio, "why they differ": why}])
