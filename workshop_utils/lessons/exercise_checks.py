"""The checks of the notebooks' exercises: each computes the right answer from the same inputs.

A check takes the attendee's answer and the inputs the exercise names, works the answer out
itself (never a number typed in), and either prints one ✓ line or raises ``NotYet`` with what is
wrong and a hint. Where a common mistake gives a predictable value (a forgotten 1e12, the wrong
peak, a percentage for a fraction), the message names that mistake.
"""

from __future__ import annotations

import math
from collections import Counter

import torch
import torch.nn.functional as F
from torch import nn

from ..parallel.comm_model import Link, ring_all_reduce_s
from ..parallel.pipeline import bubble_fraction
from ..parallel.sharding import BYTES_PER_PARAMETER, ZERO_STAGES
from ..spine.gpt import GPTSize, flops_per_token_closed_form
from ..spine.precision import autocast
from ..spine.timing import time_repeats
from ..system.errors import WorkshopError
from ..system.hardware import PRECISIONS, peak_tflops
from .exercises import (NotYet, answered_count, answered_number, exercise_check, judge, name_mistake, passed,
                        require, require_answered)

# ---------------------------------------------------------------- notebook 01: TFLOP/s and MFU by hand


@exercise_check
def check_achieved_tflops(achieved_tflops, flops_per_sample: float, samples_per_s: float,
                          exercise: str = "Exercise 1.1") -> bool:
    """achieved TFLOP/s = training FLOPs per sample x samples per second / 1e12."""
    value = answered_number(achieved_tflops, exercise, "achieved_tflops")
    right = flops_per_sample * samples_per_s / 1e12
    judge(value, right, exercise, "achieved_tflops", [
        (right * 1e12, "that is FLOP/s, not TFLOP/s.", "divide by 1e12 (tera = 10^12)."),
        (right * 1e3, "that is GFLOP/s, not TFLOP/s.", "divide by 1e12, not 1e9."),
        (right * 3, "three times too much: `flops` already counts forward and backward.",
         "multiply `flops` by the samples per second, nothing else."),
        (flops_per_sample / samples_per_s / 1e12, "you divided by the throughput.",
         "FLOP/s = FLOPs per sample x samples per second."),
    ], "achieved TFLOP/s = FLOPs per sample x samples per second / 1e12.")
    return passed(exercise, f"{value:.3g} TFLOP/s")


@exercise_check
def check_matmul_tflops(matmul_tflops, n: int, seconds, device_name: str | None = None, device=None,
                        exercise: str = "Exercise 1.2") -> bool:
    """An n x n by n x n matrix multiply is n^3 multiply-adds, 2 n^3 FLOPs, in ``seconds``.

    With ``device`` the check times such a multiply itself and shows its median beside the answer,
    for comparison only: on a shared machine both timings move with other people's work, so no
    verdict rests on them. A clock stopped before the GPU finished is caught without a stopwatch:
    the rate then exceeds the device's data-sheet peak.
    """
    seconds = answered_number(seconds, exercise, "seconds")
    require(seconds > 0, exercise, f"`seconds` = {seconds:g}: a time must be above 0.",
            "take the median of the timings: wu.time_repeats(...).median.")
    value = answered_number(matmul_tflops, exercise, "matmul_tflops")
    right = 2 * n**3 / seconds / 1e12
    judge(value, right, exercise, "matmul_tflops", [
        (right / 2, "half the right rate: each multiply-add is two FLOPs.", "count 2 * n**3 FLOPs."),
        (right * 1e12, "that is FLOP/s, not TFLOP/s.", "divide by 1e12."),
        (right * 1e3, "that is GFLOP/s, not TFLOP/s.", "divide by 1e12, not 1e9."),
        (right * 1e-3, "a thousand times too small: is `seconds` in milliseconds?",
         "divide the FLOPs by the time in seconds."),
    ], "TFLOP/s = 2 * n**3 / seconds / 1e12.")
    if device_name:
        fastest = max((p for p in (peak_tflops(device_name, q) for q in PRECISIONS) if p), default=None)
        require(fastest is None or value < 1.2 * fastest, exercise,
                f"{value:.0f} TFLOP/s is more than {device_name} can do ({fastest or 0:g} TFLOP/s at best).",
                "the timer stopped before the GPU finished: time with wu.time_repeats(..., device=device), "
                "which synchronizes.")
    compared = ""
    if device is not None:
        device = torch.device(device)
        a, b = torch.randn(n, n, device=device), torch.randn(n, n, device=device)
        own = time_repeats(lambda: a @ b, repeats=5, device=device).median
        compared = (f" (this check's own timing of `a @ b`: {own:.3g} s against your {seconds:.3g} s; far apart on an "
                    "idle machine means something else was timed)")
    return passed(exercise, f"{value:.3g} TFLOP/s for a {n} x {n} matmul{compared}")


@exercise_check
def check_mfu(mfu, achieved_tflops: float, device_name: str, precision: str, measured_peak_tflops: float,
              exercise: str = "Exercise 1.3") -> bool:
    """MFU = achieved / the data-sheet peak for this precision, or / the measured matmul rate without one."""
    value = answered_number(mfu, exercise, "mfu")
    table_peak = peak_tflops(device_name, precision)
    peak = table_peak or measured_peak_tflops
    right = achieved_tflops / peak
    mistakes = [
        (100 * right, "that is a percentage.", "give MFU as a fraction (0.12, not 12)."),
        (peak / achieved_tflops, "upside down.", "MFU = achieved / peak."),
    ]
    if table_peak:
        mistakes.append((achieved_tflops / measured_peak_tflops,
                         f"you divided by the measured matmul rate, but the table knows {device_name}.",
                         f"MFU is relative to the data-sheet peak: wu.peak_tflops(name, {precision!r})."))
        mistakes += [(achieved_tflops / other_peak, f"that uses the {other} peak; this run is {precision}.",
                      f"look up the peak for {precision!r}.")
                     for other in PRECISIONS if other != precision
                     for other_peak in [peak_tflops(device_name, other)] if other_peak]
    judge(value, right, exercise, "mfu", mistakes,
          "MFU = achieved TFLOP/s / peak TFLOP/s (the table's, or the measured matmul rate where it has none).")
    source = "the data-sheet peak" if table_peak else "the measured matmul rate, standing in for a peak"
    return passed(exercise, f"MFU {100 * value:.1f}% of {source}")


# ---------------------------------------------------------------- notebook 03: fp16's range and loss scaling


@exercise_check
def check_lost_fraction(lost_fraction, gradients: torch.Tensor, scale: float = 1.0,
                        exercise: str = "Exercise 3.1") -> bool:
    """Share of the non-zero gradient values that become exactly 0 when (scaled and) cast to fp16."""
    value = answered_number(lost_fraction, exercise, "lost_fraction")
    g = gradients.detach().flatten().float().cpu()
    nonzero = g[g != 0]
    flushed = (nonzero * scale).half() == 0
    right = flushed.double().mean().item()
    zero_after = (g * scale).half() == 0
    mistakes = [
        (100 * right, "that is a percentage.", "give a fraction between 0 and 1."),
        (flushed.sum().item() / g.numel(), "you divided by all values, zeros included.",
         "divide by the number of non-zero values: a zero cannot be lost."),
        (zero_after.double().mean().item(), "you counted values that were zero already.",
         "keep only the non-zero values first (g[g != 0])."),
        ((nonzero * scale < torch.finfo(torch.float16).smallest_normal).double().mean().item(),
         "that counts subnormals too, which fp16 keeps (imprecisely).", "count values whose fp16 cast == 0."),
        (((nonzero * scale).bfloat16() == 0).double().mean().item(), "that is bfloat16's loss, not float16's.",
         "cast with .half() (torch.float16)."),
    ]
    if scale != 1:
        mistakes.append(((nonzero.half() == 0).double().mean().item(), "you forgot the loss scale.",
                         "multiply by the scale before casting."))
    judge(value, right, exercise, "lost_fraction", mistakes,
          "non-zero values whose fp16 cast is 0, divided by the number of non-zero values.", abs_tol=1e-9)
    return passed(exercise, f"{100 * value:.4f}% of the non-zero gradients become 0 in fp16")


@exercise_check
def check_safe_loss_scale(safe_scale, gradients, dtype: torch.dtype = torch.float16,
                          exercise: str = "Exercise 3.2") -> bool:
    """The largest power of two S with S x (largest gradient) still finite in ``dtype``."""
    value = answered_number(safe_scale, exercise, "safe_scale")
    tensors = gradients.values() if isinstance(gradients, dict) else [gradients]
    largest = max(float(t.detach().abs().max()) for t in tensors if t.numel())
    limit = torch.finfo(dtype).max
    right = 2.0 ** math.floor(math.log2(limit / largest))
    require(value > 0 and math.log2(value).is_integer(), exercise,
            f"`safe_scale` = {value:g} is not a power of two.",
            "use 2.0 ** k: scaling by a power of two changes only the exponent, so it is exact.")
    judge(value, right, exercise, "safe_scale", [
        (2.0 ** math.floor(math.log2(torch.finfo(torch.bfloat16).max / largest)),
         "that uses bfloat16's largest value.", f"use float16's, {limit:,.0f}."),
        (2.0 ** min(127, math.floor(math.log2(torch.finfo(torch.float32).max / largest))),
         "that uses float32's largest value.", f"use float16's, {limit:,.0f}."),
        (2 * right, f"one power too far: {2 * right:g} x {largest:.3g} overflows {limit:,.0f}.",
         "round log2 down (math.floor), not up."),
    ], "the largest k with 2**k * largest <= finfo(float16).max, i.e. 2 ** floor(log2(max / largest)).")
    return passed(exercise, f"2^{math.log2(value):.0f}: the largest gradient {largest:.3g} becomes "
                            f"{value * largest:,.0f}, below {limit:,.0f}")


class _WatchedScaler(torch.amp.GradScaler):
    """A GradScaler that counts which of its methods were called."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.calls = Counter()

    def scale(self, outputs):
        self.calls["scale"] += 1
        return super().scale(outputs)

    def step(self, optimizer, *args, **kwargs):
        self.calls["step"] += 1
        return super().step(optimizer, *args, **kwargs)

    def update(self, new_scale=None):
        self.calls["update"] += 1
        return super().update(new_scale)


def _amp_trial(amp_step, device: torch.device, init_scale: float, zero_grad: bool = True,
               exercise: str = "Exercise 3.3"):
    """One step on a small seeded MLP with stale gradients in place: (model, scaler, loss, dtypes seen).

    With ``amp_step=None`` the step is the textbook one (or the one that forgets ``zero_grad``).
    """
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 10)).to(device)
    images = torch.randn(16, 32, device=device)
    labels = torch.randint(0, 10, (16,), device=device)
    for p in model.parameters():
        p.grad = torch.full_like(p, 1e3)  # the previous step's gradients, which the step must clear
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = _WatchedScaler(device.type, init_scale=init_scale, growth_interval=1)
    dtypes = []
    hook = model[0].register_forward_hook(lambda module, inputs, output: dtypes.append(output.dtype))
    try:
        if amp_step is not None:
            try:
                loss = amp_step(model, images, labels, optimizer, scaler)
            except AssertionError:  # GradScaler's own protest at a call out of order
                if scaler.calls["scale"] == 0:
                    raise NotYet(f"✗ {exercise}: the loss was not scaled.",
                                 "call scaler.scale(loss).backward() instead of loss.backward().") from None
                if scaler.calls["step"] == 0:
                    raise NotYet(f"✗ {exercise}: scaler.update() ran without scaler.step(optimizer) before it.",
                                 "call scaler.step(optimizer) instead of optimizer.step().") from None
                raise
        else:
            if zero_grad:
                optimizer.zero_grad(set_to_none=True)
            with autocast("fp16", device):
                loss = F.cross_entropy(model(images), labels)
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
    finally:
        hook.remove()
    return model, scaler, loss, dtypes


def _same_parameters(a: nn.Module, b: nn.Module) -> bool:
    return all(torch.allclose(p, q, rtol=1e-3, atol=1e-6) for p, q in zip(a.parameters(), b.parameters()))


@exercise_check
def check_amp_step(amp_step, device: torch.device, exercise: str = "Exercise 3.3") -> bool:
    """Run ``amp_step(model, images, labels, optimizer, scaler)`` on a small model against the textbook step.

    Once with a scale that fits (the step must match a correct fp16 step and the scale must grow, the
    scaler growing after every clean step here) and once with a scale that overflows (the step must
    be skipped and the scale halved). Which GradScaler methods ran and the dtype the first layer
    produced tell the common mistakes apart.
    """
    require_answered(amp_step, exercise, "`amp_step` is still the placeholder.",
                     "write the function body in the exercise cell and run it.")
    require(callable(amp_step), exercise, f"`amp_step` should be a function, got a {type(amp_step).__name__}.",
            "define it with def amp_step(model, images, labels, optimizer, scaler):")
    device = torch.device(device)
    scale = 2.0**8
    model, scaler, loss, dtypes = _amp_trial(amp_step, device, scale, exercise=exercise)
    require_answered(loss, exercise, "`amp_step` still returns the placeholder `...`.",
                     "replace the placeholder with your code; return the loss.")
    require(loss is not None, exercise, "`amp_step` returns nothing.", "end it with `return loss`.")
    require(bool(dtypes), exercise, "`amp_step` never ran the model.", "compute the loss from model(images).")
    require(dtypes[0] != torch.float32, exercise, "the forward pass ran in float32: no autocast.",
            "compute the output and the loss inside `with wu.autocast('fp16', device):`.")
    require(dtypes[0] == torch.float16, exercise, f"the forward pass ran in {dtypes[0]}, not float16.",
            "use autocast with dtype torch.float16 (wu.autocast('fp16', device)): the mode that needs a scaler.")
    require(scaler.calls["scale"] > 0, exercise, "the loss was not scaled.",
            "call scaler.scale(loss).backward() instead of loss.backward().")
    require(scaler.calls["step"] > 0, exercise, "scaler.step was never called.",
            "call scaler.step(optimizer) instead of optimizer.step(): it unscales and skips steps with inf/NaN.")
    require(scaler.calls["update"] > 0, exercise, "scaler.update() was never called.",
            "call scaler.update() after scaler.step(): without it the scale never adapts.")
    overflow = 2.0**40  # times a logit gradient of order 1/16, far beyond fp16's 65,504
    skipped, skipped_scaler, _, _ = _amp_trial(amp_step, device, overflow, exercise=exercise)
    untouched, _, _, _ = _amp_trial(lambda *args: None, device, overflow)
    require(_same_parameters(skipped, untouched), exercise, "a step whose gradients overflowed changed the weights.",
            "let scaler.step(optimizer) decide: do not also call optimizer.step().")
    require(skipped_scaler.get_scale() == overflow / 2, exercise, "after an overflow the scale was not halved.",
            "call scaler.update() after scaler.step(optimizer).")
    reference, _, reference_loss, _ = _amp_trial(None, device, scale)
    stale, _, _, _ = _amp_trial(None, device, scale, zero_grad=False)
    require(not (_same_parameters(model, stale) and not _same_parameters(model, reference)), exercise,
            "the previous step's gradients were added to this step's.",
            "call optimizer.zero_grad(set_to_none=True) before the backward pass.")
    require(_same_parameters(model, reference), exercise,
            "the weights after the step differ from a correct fp16 step's.",
            "zero the gradients, forward and loss under autocast, scaler.scale(loss).backward(), "
            "scaler.step(optimizer), scaler.update().")
    returned = answered_number(loss.detach() if torch.is_tensor(loss) else loss, exercise, "the returned loss")
    require(not math.isclose(returned, scale * reference_loss.item(), rel_tol=1e-3), exercise,
            "`amp_step` returns the scaled loss.", "return the loss itself, before scaler.scale.")
    require(math.isclose(returned, reference_loss.item(), rel_tol=1e-3), exercise,
            f"`amp_step` returns {returned:.4g}, not the batch's loss.", "return the loss computed under autocast.")
    require(scaler.get_scale() == 2 * scale, exercise, "the scale did not grow after a clean step.",
            "call scaler.update() once per step, after scaler.step(optimizer).")
    return passed(exercise, "fp16 forward, scaled backward, overflowing step skipped, scale halved after it "
                            "and doubled after a clean one")


# ---------------------------------------------------------------- notebook 05: memory, traffic, bubbles


def zero_gib_per_gpu(parameters: float, world_size: int, stage: int, precision: str = "mixed") -> float:
    """GiB per GPU of parameters, gradients and Adam state under DDP (stage 0) or ZeRO stage 1-3."""
    sharded = list(ZERO_STAGES.values())[stage]
    return sum(b * parameters / (world_size if s else 1)
               for b, s in zip(BYTES_PER_PARAMETER[precision], sharded)) / 2**30


def fewest_gpus(parameters: float, budget_gib: float, stage: int, precision: str = "mixed",
                gib: float = 2**30) -> float:
    """The smallest world size whose share fits ``budget_gib``; ``math.inf`` when none does.

    ``gib`` is the unit's size in bytes: 2**30, or 1e9 to reproduce the GB-for-GiB mistake.
    """
    sharded = list(ZERO_STAGES.values())[stage]
    kept = sum(b for b, s in zip(BYTES_PER_PARAMETER[precision], sharded) if not s) * parameters / gib
    split = sum(b for b, s in zip(BYTES_PER_PARAMETER[precision], sharded) if s) * parameters / gib
    if split == 0:
        return 1 if kept <= budget_gib else math.inf
    if kept >= budget_gib:
        return math.inf
    gpus = max(1, math.ceil(split / (budget_gib - kept)))
    while gpus > 1 and kept + split / (gpus - 1) <= budget_gib:  # the ceil of a rounded quotient may be one off
        gpus -= 1
    while kept + split / gpus > budget_gib:
        gpus += 1
    return gpus


@exercise_check
def check_fewest_gpus(gpus, parameters: float, budget_gib: float, stage: int, precision: str = "mixed",
                      exercise: str = "Exercise 5.1") -> bool:
    """The smallest number of GPUs whose ZeRO ``stage`` share of ``parameters`` fits ``budget_gib`` each."""
    name = f"zero{stage}_gpus"
    right = fewest_gpus(parameters, budget_gib, stage, precision)
    if right == math.inf:
        require(gpus == math.inf, exercise, f"no number of GPUs holds it under stage {stage}.",
                f"set {name} = math.inf: what stays whole on every GPU already exceeds the budget.")
        return passed(exercise, f"stage {stage} cannot hold it at any size")
    value = answered_count(gpus, exercise, name)
    require(value >= 1, exercise, f"`{name}` = {value}: at least one GPU is needed.", "count GPUs from 1.")
    kept = "the parameters and gradients" if stage == 1 else "the parameters"
    name_mistake(value, right, exercise, name, [
        (fewest_gpus(parameters, budget_gib, 3, precision), "that is ZeRO-3's count, which shards everything.",
         f"stage {stage} keeps {kept} whole on every GPU and divides only the rest."),
        (fewest_gpus(parameters, budget_gib, stage, precision, gib=1e9), "that counts GB (10^9 bytes), not GiB.",
         "divide bytes by 2**30."),
    ], rel=0)
    per_gpu = zero_gib_per_gpu(parameters, value, stage, precision)
    require(per_gpu <= budget_gib, exercise,
            f"at {value} GPUs each holds {per_gpu:.1f} GiB, more than the {budget_gib:g} GiB budget.",
            "round up (math.ceil): a GPU more, never a fraction less.")
    fewer = zero_gib_per_gpu(parameters, value - 1, stage, precision) if value > 1 else math.inf
    require(fewer > budget_gib, exercise, f"{value - 1} GPUs already hold it ({fewer:.1f} GiB each).",
            "find the smallest p with kept + sharded / p <= budget.")
    return passed(exercise, f"ZeRO-{stage}: {value} GPUs, {per_gpu:.1f} GiB each")


@exercise_check
def check_fsdp_traffic(ddp_s, fsdp_s, n_bytes: float, world_size: int, link: Link,
                       exercise: str = "Exercise 5.2") -> bool:
    """DDP: one ring all-reduce of the gradients. FSDP: two all-gathers of the parameters and one reduce-scatter."""
    p, alpha, bandwidth = world_size, link.latency_us * 1e-6, link.bandwidth_gbps * 1e9
    ddp = answered_number(ddp_s, exercise, "ddp_s")
    right_ddp = ring_all_reduce_s(n_bytes, p, link)
    half = (p - 1) * alpha + (p - 1) / p * n_bytes / bandwidth  # one all-gather or reduce-scatter
    judge(ddp, right_ddp, exercise, "ddp_s", [
        (half, "that is an all-gather's time: an all-reduce is a reduce-scatter plus an all-gather.",
         "use 2(p-1) latency steps and 2(p-1)/p * n / B."),
        (right_ddp + 2 * (p - 1) * (link.latency_us - alpha), "the latency is in microseconds.",
         "multiply latency_us by 1e-6."),
        (2 * (p - 1) * alpha + 2 * (p - 1) / p * n_bytes / (bandwidth / 8), "that treats GB/s as Gbit/s.",
         "bandwidth_gbps is in gigabytes per second: B = bandwidth_gbps * 1e9 bytes/s."),
        (2 * (p - 1) * alpha + 2 * n_bytes / bandwidth, "the factor (p-1)/p is missing.",
         "each rank sends 2(p-1) pieces of n/p bytes: 2(p-1)/p * n / B."),
    ], "ring all-reduce: 2(p-1) * alpha + 2(p-1)/p * n / B, alpha in seconds, B in bytes/s.")
    fsdp = answered_number(fsdp_s, exercise, "fsdp_s")
    judge(fsdp, 3 * half, exercise, "fsdp_s", [
        (2 * half, "two collectives, but FSDP runs three per step.",
         "all-gather the parameters for the forward pass, again for the backward, then reduce-scatter the gradients."),
        (3 * right_ddp, "three all-reduces: FSDP's collectives are each half an all-reduce.",
         "all-gather and reduce-scatter each cost (p-1) * alpha + (p-1)/p * n / B."),
    ], "2 all-gathers + 1 reduce-scatter, each (p-1) * alpha + (p-1)/p * n / B.")
    return passed(exercise, f"DDP {1e3 * ddp:.0f} ms, FSDP {1e3 * fsdp:.0f} ms per step: {fsdp / ddp:.2f}x")


def fewest_microbatches(stages: int, target: float) -> int:
    """The smallest m with a GPipe bubble (p-1)/(m+p-1) of at most ``target``."""
    if stages <= 1:
        return 1
    m = max(1, math.ceil((stages - 1) * (1 - target) / target))
    while m > 1 and bubble_fraction(stages, m - 1) <= target + 1e-12:
        m -= 1
    while bubble_fraction(stages, m) > target + 1e-12:
        m += 1
    return m


@exercise_check
def check_microbatches(microbatches, stages: int, target: float, exercise: str = "Exercise 5.3") -> bool:
    """The fewest micro-batches that bring the bubble of ``stages`` equal stages down to ``target``."""
    value = answered_count(microbatches, exercise, "microbatches")
    require(value >= 1, exercise, f"`microbatches` = {value}: at least one is needed.", "count from 1.")
    right = fewest_microbatches(stages, target)
    name_mistake(value, right, exercise, "microbatches", [
        (fewest_microbatches(stages + 1, target), "that counts p idle slots; filling and draining take p-1.",
         "bubble = (p-1) / (m+p-1)."),
    ], rel=0)
    bubble = bubble_fraction(stages, value)
    require(bubble <= target + 1e-12, exercise, f"with m = {value} the bubble is {bubble:.3f}, above {target:g}.",
            "more micro-batches: the bubble is (p-1) / (m+p-1).")
    fewer = bubble_fraction(stages, value - 1) if value > 1 else math.inf
    require(fewer > target + 1e-12, exercise, f"m = {value - 1} already gives a bubble of {fewer:.3f}.",
            "find the smallest m with (p-1) / (m+p-1) <= target.")
    return passed(exercise, f"m = {value}: bubble {bubble:.3f} <= {target:g}")


# ---------------------------------------------------------------- the GPT: FLOPs per token, micro-batches


@exercise_check
def check_flops_per_token(flops_per_token, parameters: int, size: GPTSize, sequence_length: int,
                          counted: float, exercise: str = "Exercise 1.4") -> bool:
    """6·N + 12·layers·width·sequence, shown beside what ``torch.utils.flop_counter`` counted."""
    value = answered_number(flops_per_token, exercise, "flops_per_token")
    L, d, T, N = size.layers, size.width, sequence_length, parameters
    right = flops_per_token_closed_form(size, T, N)
    judge(value, right, exercise, "flops_per_token", [
        (6 * N, "that is the weights' share alone: attention's scores and weighted sum multiply activations by "
                "activations, which no parameter counts.", "add 12 x layers x width x sequence."),
        (2 * N + 4 * L * d * T, "that is the forward pass alone.", "training adds a backward pass of twice its "
                                                                   "FLOPs: 6 per weight, 12 L d T for attention."),
        (6 * N + 12 * L * d, "attention's term grows with the sequence: each token attends to every earlier one.",
         "multiply 12 x layers x width by the sequence length."),
        (6 * N + 12 * L * d * T * T, "that counts the attention of every token of the sequence for each token.",
         "per token, attention costs 12 x layers x width x sequence."),
    ], "FLOPs per token = 6 x parameters + 12 x layers x width x sequence.")
    return passed(exercise, f"{value / 1e6:.2f} MFLOP per token by the formula; the counter measured "
                            f"{counted / 1e6:.2f} on the model itself")


def activation_bytes_per_sequence(size: GPTSize, sequence_length: int, stored_attention: bool = False) -> float:
    """Activations one sequence keeps for the backward pass in 16-bit training, all layers.

    Korthikanti et al., "Reducing Activation Recomputation in Large Transformer Models" (2022), section 4:
    per layer, sequence s, width h, a heads, s·h·(34 + 5·a·s/h) bytes. The 5·a·s/h term is the attention
    matrix; a fused attention kernel (scaled_dot_product_attention's flash path) never stores it.
    """
    per_layer = sequence_length * size.width * 34
    if stored_attention:
        per_layer += 5 * size.heads * sequence_length ** 2
    return float(size.layers * per_layer)


def largest_micro_batch(size: GPTSize, sequence_length: int, free_bytes: float, tokens_per_rank: int) -> int:
    """The largest power of two of sequences that fits ``free_bytes`` and divides a rank's share of the batch."""
    per_sequence = activation_bytes_per_sequence(size, sequence_length)
    sequences = tokens_per_rank // sequence_length
    micro = 1
    while micro * 2 * per_sequence <= free_bytes and sequences % (micro * 2) == 0:
        micro *= 2
    return micro


@exercise_check
def check_micro_batch_plan(micro_batch, accumulation, size: GPTSize, sequence_length: int, target_tokens: int,
                           ranks: int, free_bytes: float, exercise: str = "Exercise 2.4") -> bool:
    """The largest power-of-two micro-batch that fits, and the accumulation steps that reach the global batch."""
    micro = answered_count(micro_batch, exercise, "micro_batch")
    steps = answered_count(accumulation, exercise, "accumulation")
    require(micro >= 1 and steps >= 1, exercise, "both must be 1 or more.", "count sequences and steps from 1.")
    per_sequence = activation_bytes_per_sequence(size, sequence_length)
    require(micro * per_sequence <= free_bytes, exercise,
            f"{micro} sequences keep {micro * per_sequence / 2**30:.1f} GiB of activations; "
            f"{free_bytes / 2**30:.1f} GiB are free.", "take fewer sequences per micro-batch.")
    tokens = micro * steps * ranks * sequence_length
    require(tokens == target_tokens, exercise,
            f"{micro} x {steps} x {ranks} ranks x {sequence_length} tokens is {tokens:,} tokens a step, not "
            f"{target_tokens:,}.", "global batch = micro-batch x accumulation x ranks x sequence.")
    best = largest_micro_batch(size, sequence_length, free_bytes, target_tokens // ranks)
    require(micro >= best, exercise, f"{micro} sequences fit, but so do {best}: fewer, larger micro-batches keep "
                                     "the GPU busier for the same global batch.",
            "double the micro-batch while it fits and still divides the batch.")
    return passed(exercise, f"{micro} sequences x {steps} accumulation steps x {ranks} ranks = {tokens:,} tokens; "
                            f"{micro * per_sequence / 2**30:.1f} of {free_bytes / 2**30:.1f} GiB of activations")


# ---------------------------------------------------------------- notebook 04: measure, then decide


def _sweep_row(table, exercise: str, **match):
    rows = table
    for column, value in match.items():
        rows = rows[rows[column] == value]
    if rows.empty:
        raise WorkshopError(f"{exercise}: no row of the table has {match}.", "pass the table the notebook measured.")
    return rows.iloc[0]


@exercise_check
def check_loader_choice(best_workers, measured_speedup, amdahl_bound, loader_sweep, start_workers: int,
                        exercise: str = "Exercise 4.1") -> bool:
    """The fastest row's workers, its speed-up over the starting setting, and Amdahl's ceiling 1 / (1 - f) there."""
    start = _sweep_row(loader_sweep, exercise, num_workers=start_workers, pin_memory=False)
    fastest = loader_sweep.loc[loader_sweep.samples_per_s.idxmax()]
    workers = answered_count(best_workers, exercise, "best_workers")
    require(workers in set(loader_sweep.num_workers), exercise,
            f"`best_workers` = {workers} is not a worker count of the sweep.", "pick one of its num_workers.")
    name_mistake(workers, int(fastest.num_workers), exercise, "best_workers", [
        (int(loader_sweep.num_workers.max()), "the most workers, not the fastest setting.",
         "take the row with the highest samples_per_s (loader_sweep.samples_per_s.idxmax())."),
    ], rel=0)
    require(workers == int(fastest.num_workers), exercise, f"`best_workers` = {workers} is not the fastest row's.",
            "take the num_workers of the row with the highest samples_per_s.")
    speedup = answered_number(measured_speedup, exercise, "measured_speedup")
    right = fastest.samples_per_s / start.samples_per_s
    judge(speedup, right, exercise, "measured_speedup", [
        (1 / right, "upside down.", "divide the fastest row's samples/s by the starting row's."),
    ], "the fastest row's samples_per_s / the starting row's.")
    bound = answered_number(amdahl_bound, exercise, "amdahl_bound")
    wait = float(start.data_wait_fraction)
    judge(bound, 1 / (1 - wait), exercise, "amdahl_bound", [
        (1 / wait if wait else math.inf, "that is 1/f.", "the ceiling is 1 / (1 - f): the part that stays."),
        (1 / (1 - float(fastest.data_wait_fraction)), "that uses the fastest row's wait.",
         "Amdahl bounds what can be gained from where you start: the starting row's data_wait_fraction."),
        (1 / ((1 - wait) + wait / 2), "that is a loader twice as fast.",
         "the ceiling removes the wait entirely: 1 / (1 - f)."),
        (1 + wait, "1 + f is only the small-f approximation.", "compute 1 / (1 - f)."),
    ], "Amdahl's ceiling: 1 / (1 - f), f the starting row's data_wait_fraction.")
    return passed(exercise, f"{workers} workers: {speedup:.2f}x measured, Amdahl allows at most {bound:.2f}x")


def memory_line(batch_sweep, exercise: str = "the check"):
    """(MiB per sample, MiB at batch 0): least squares over the batch sizes that fit."""
    import numpy as np

    fitted = batch_sweep[batch_sweep.status == "ok"]
    if len(fitted) < 2:
        raise WorkshopError(f"{exercise}: only {len(fitted)} batch size fit, and a line needs two.",
                            "sweep from a smaller start batch or with a larger memory cap.")
    slope, intercept = np.polyfit(fitted.batch_size.astype(float), fitted.peak_memory_mib.astype(float), 1)
    return float(slope), float(intercept)


@exercise_check
def check_batch_memory(mib_per_sample, largest_batch, batch_sweep, limit_mib: float,
                       exercise: str = "Exercise 4.2") -> bool:
    """The slope of peak memory against batch size, and the largest batch the line keeps within ``limit_mib``."""
    import numpy as np

    slope, intercept = memory_line(batch_sweep, exercise)
    value = answered_number(mib_per_sample, exercise, "mib_per_sample")
    fitted = batch_sweep[batch_sweep.status == "ok"]
    measured = batch_sweep.dropna(subset=["peak_memory_mib"])
    judge(value, slope, exercise, "mib_per_sample", [
        *[(ratio, "that divides the whole peak by the batch.",
           "part of the memory does not grow with the batch: fit a line and take its slope (np.polyfit(..., 1)).")
          for ratio in (float((fitted.peak_memory_mib / fitted.batch_size).mean()),
                        float(fitted.peak_memory_mib.iloc[-1] / fitted.batch_size.iloc[-1]))],
        (float(np.polyfit(measured.batch_size.astype(float), measured.peak_memory_mib.astype(float), 1)[0])
         if len(measured) > len(fitted) else math.nan,
         "the fit includes the batch that ran out of memory.", "fit only the rows whose status is 'ok'."),
    ], "the slope of a least-squares line through (batch_size, peak_memory_mib) of the rows that fit.")
    largest = answered_count(largest_batch, exercise, "largest_batch")
    right = math.floor((limit_mib - intercept) / slope)
    name_mistake(largest, right, exercise, "largest_batch", [
        (math.ceil((limit_mib - intercept) / slope), "rounded up: at that batch the line is above the limit.",
         "round down."),
        (math.floor(limit_mib / slope), "that leaves out the memory that does not grow with the batch.",
         "subtract the line's intercept from the limit first."),
    ], rel=0)
    require(largest == right, exercise, f"`largest_batch` = {largest} is not right.",
            "the largest whole batch b with intercept + slope * b <= limit_mib.")
    return passed(exercise, f"{value:.2f} MiB per sample; up to batch {largest:,} in {limit_mib:,.0f} MiB")


@exercise_check
def check_next_fix(biggest_phase, step_speedup, breakdown, exercise: str = "Exercise 4.3") -> bool:
    """The top rung's largest part of the step, and Amdahl's speed-up of the step if that part ran twice as fast."""
    parts = [c for c in breakdown.columns if c.endswith("_ms") and c != "step_ms"]
    top, first = breakdown.iloc[-1], breakdown.iloc[0]
    right = max(parts, key=lambda part: top[part])
    require_answered(biggest_phase, exercise, "`biggest_phase` is still the placeholder `...`.",
                     "replace the `...` in the exercise cell with your code, run that cell, then this one.")
    phase = str(biggest_phase)
    phase = phase if phase.endswith("_ms") else f"{phase}_ms"
    require(phase != "step_ms", exercise, "step_ms is the whole step, not a part of it.",
            f"compare only the parts: {', '.join(parts)}.")
    require(phase in parts, exercise, f"`biggest_phase` = {biggest_phase!r} is no column of the table.",
            f"use one of {', '.join(parts)}.")
    baseline_biggest = max(parts, key=lambda part: first[part])
    require(not (phase == baseline_biggest != right), exercise, "that is the baseline's largest part.",
            "the top rung is the table's last row (breakdown.iloc[-1]).")
    require(phase == right, exercise, f"{phase} is not the top rung's largest part.",
            "take the part with the most milliseconds in the last row.")
    speedup = answered_number(step_speedup, exercise, "step_speedup")
    share = min(1.0, top[right] / top.step_ms)
    judge(speedup, 1 / ((1 - share) + share / 2), exercise, "step_speedup", [
        (2.0, "the step would be twice as fast only if that part were all of it.",
         "Amdahl: 1 / ((1 - f) + f / 2), f its share of the step."),
        (1 / (1 - share) if share < 1 else math.inf, "that makes the part free; twice as fast halves its time.",
         "1 / ((1 - f) + f / 2)."),
        (1 / ((1 - first[right] / first.step_ms) + first[right] / first.step_ms / 2), "that is the baseline's share.",
         "use the last row (the top rung)."),
    ], "Amdahl: 1 / ((1 - f) + f / 2), f = that part's ms / step_ms.")
    return passed(exercise, f"{right.removesuffix('_ms')} takes {share:.0%} of the step: twice as fast gives "
                            f"{speedup:.2f}x")
