"""Notebook 05's exercises: ZeRO's memory per GPU, FSDP's traffic against DDP's, and the pipeline bubble.

The counting functions (``zero_gib_per_gpu``, ``fewest_gpus``, ``fewest_microbatches``) also
reproduce the mistakes a check names, so that each mistake's value comes from the same formula.
"""

from __future__ import annotations

import math
import numbers
import warnings

from ..parallel.comm_model import Link, ring_all_reduce_s
from ..parallel.pipeline import bubble_fraction
from ..parallel.sharding import BYTES_PER_PARAMETER, ZERO_STAGES
from ..system.errors import WorkshopError
from .exercise_cells import NotYet, passed, require, require_answered
from .exercise_judging import checked, count, number, verdict


def _stage_shards(stage: int, precision: str, exercise: str = "the check"):
    if not isinstance(stage, numbers.Integral) or not 0 <= stage < len(ZERO_STAGES):
        raise WorkshopError(f"{exercise}: stage {stage!r} is no ZeRO stage.", "pass 0 (DDP), 1, 2 or 3.")
    if precision not in BYTES_PER_PARAMETER:
        raise WorkshopError(f"{exercise}: unknown precision {precision!r}.",
                            f"use one of {sorted(BYTES_PER_PARAMETER)}.")
    return list(ZERO_STAGES.values())[stage]


def zero_gib_per_gpu(parameters: float, world_size: int, stage: int, precision: str = "mixed") -> float:
    """GiB per GPU of parameters, gradients and Adam state under DDP (stage 0) or ZeRO stage 1-3."""
    sharded = _stage_shards(stage, precision)
    return sum(b * parameters / (world_size if s else 1)
               for b, s in zip(BYTES_PER_PARAMETER[precision], sharded)) / 2**30


def fewest_gpus(parameters: float, budget_gib: float, stage: int, precision: str = "mixed",
                gib: float = 2**30, rounding=math.ceil) -> float:
    """The smallest world size whose share fits ``budget_gib``; ``math.inf`` when none does.

    ``gib`` is the unit's size in bytes: 2**30, or 1e9 to reproduce the GB-for-GiB mistake;
    ``rounding=math.floor`` reproduces rounding down (the smallest p whose share is *about* the budget).
    """
    sharded = _stage_shards(stage, precision)
    kept = sum(b for b, s in zip(BYTES_PER_PARAMETER[precision], sharded) if not s) * parameters / gib
    split = sum(b for b, s in zip(BYTES_PER_PARAMETER[precision], sharded) if s) * parameters / gib
    if split == 0:
        return 1 if kept <= budget_gib else math.inf
    if kept >= budget_gib:
        return math.inf
    if rounding is not math.ceil:
        return rounding(split / (budget_gib - kept))
    gpus = max(1, math.ceil(split / (budget_gib - kept)))
    while gpus > 1 and kept + split / (gpus - 1) <= budget_gib:  # the ceil of a rounded quotient may be one off
        gpus -= 1
    while kept + split / gpus > budget_gib:
        gpus += 1
    return gpus


# An H100 80GB's memory as PyTorch reports it on the kit's own H100 (results/reference/gpu/, "memory_gib"):
# what the exercise's budget leaves part of.
H100_GIB = 79.2


def _is_infinite(value) -> bool:
    if isinstance(value, (str, bytes, bool)) or isinstance(value, numbers.Complex) and not isinstance(value,
                                                                                                  numbers.Real):
        return False
    try:
        with warnings.catch_warnings():  # a tensor with gradients, a masked value: no infinity, and nothing to warn of
            warnings.simplefilter("ignore")
            return math.isinf(float(value))
    except Exception:  # noqa: BLE001 - whatever it is, it is no infinity
        return False


@checked
def check_fewest_gpus(gpus, parameters: float, budget_gib: float, stage: int, precision: str = "mixed",
                      exercise: str = "Exercise 5.1") -> bool:
    """The smallest number of GPUs whose ZeRO ``stage`` share of ``parameters`` fits ``budget_gib`` each.

    The exercise's numbers (7e9 parameters, 35 GiB) are chosen so that every mistake named here gives its
    own count: ZeRO-3's count for ZeRO-1, rounding down, GB for GiB.
    """
    name = f"zero{stage}_gpus"
    right = fewest_gpus(parameters, budget_gib, stage, precision)
    if right == math.inf:
        require_answered(gpus, exercise, f"`{name}` is still the placeholder `...`.",
                         "replace the `...` in the exercise cell with your code, run that cell, then this one.")
        require(_is_infinite(gpus), exercise, f"no number of GPUs holds it under stage {stage}.",
                f"set {name} = math.inf: what stays whole on every GPU already exceeds the budget.")
        return passed(exercise, f"stage {stage} cannot hold it at any size")
    if _is_infinite(gpus):
        raise NotYet(f"✗ {exercise}: `{name}` = inf, but {right} GPUs hold it under stage {stage}.",
                     "what stays whole fits the budget here: divide the sharded part into the rest.")
    value = count(gpus, exercise, name, "a whole number of GPUs")
    require(value >= 1, exercise, f"`{name}` = {value}: at least one GPU is needed.", "count GPUs from 1.")
    kept = {0: "everything", 1: "the parameters and gradients", 2: "the parameters"}.get(stage, "nothing")
    mistakes = [
        (fewest_gpus(parameters, budget_gib, stage, precision, rounding=math.floor),
         "rounded down: at that many GPUs each one holds more than the budget.", "round up (math.ceil)."),
        (fewest_gpus(parameters, budget_gib, stage, precision, gib=1e9), "that counts GB (10^9 bytes), not GiB.",
         "divide bytes by 2**30."),
    ]
    if stage != 3:
        mistakes.append((fewest_gpus(parameters, budget_gib, 3, precision),
                         "that is ZeRO-3's count, which shards everything.",
                         f"stage {stage} keeps {kept} whole on every GPU and divides only the rest."))
    if stage == 3:
        mistakes.append((fewest_gpus(parameters, budget_gib, 1, precision),
                         "that is ZeRO-1's count; ZeRO-3 shards the parameters and gradients too.",
                         "divide all 16 bytes per parameter by the GPUs."))
    if stage != 2:
        mistakes.append((fewest_gpus(parameters, budget_gib, 2, precision),
                         "that is ZeRO-2's count, which shards the gradients too.",
                         f"stage {stage} keeps {kept} whole on every GPU and divides only the rest."))
    if budget_gib != H100_GIB:
        mistakes.append((fewest_gpus(parameters, H100_GIB, stage, precision),
                         f"that fills the H100's whole {H100_GIB:.1f} GiB; the budget is budget_gib "
                         f"({budget_gib:g} GiB), the rest goes to activations.", "divide by budget_gib."))
    mistakes += [(right + 1, "one GPU more than the fewest that hold it (a spare?).",
                  f"{right} GPUs hold it already: take the smallest p that fits."),
                 (2 ** math.ceil(math.log2(right)), "that is the next power of two; the fewest need not be one.",
                  "take the smallest p that fits, whatever it is.")]
    mistakes = [(m, p, f) for m, p, f in mistakes if m != math.inf]
    per_gpu = zero_gib_per_gpu(parameters, value, stage, precision)
    fewer = zero_gib_per_gpu(parameters, value - 1, stage, precision) if value > 1 else math.inf
    verdict(value, right, exercise, name, mistakes, "the smallest p with kept + sharded / p <= budget.", whole=True,
            limits=[(per_gpu <= budget_gib, f"at {value} GPUs each holds {per_gpu:.1f} GiB, more than the "
                                            f"{budget_gib:g} GiB budget.",
                     "round up (math.ceil): a GPU more, never a fraction less."),
                    (fewer > budget_gib, f"{value - 1} GPUs already hold it ({fewer:.1f} GiB each).",
                     "find the smallest p with kept + sharded / p <= budget.")])
    return passed(exercise, f"ZeRO-{stage}: {value} GPUs, {per_gpu:.1f} GiB each")


@checked
def check_fsdp_traffic(ddp_s, fsdp_s, n_bytes: float, world_size: int, link: Link,
                       exercise: str = "Exercise 5.2") -> bool:
    """DDP: one ring all-reduce of the gradients. FSDP: two all-gathers of the parameters and one reduce-scatter."""
    p, alpha, bandwidth = world_size, link.latency_us * 1e-6, link.bandwidth_gbps * 1e9
    ddp = number(ddp_s, exercise, "ddp_s", "one number, in seconds")
    right_ddp = ring_all_reduce_s(n_bytes, p, link)

    def one_pass(n: float) -> float:  # one all-gather or reduce-scatter of n bytes
        return (p - 1) * alpha + (p - 1) / p * n / bandwidth

    half = one_pass(n_bytes)
    try:  # the two answers swapped: said on ddp_s, judged first
        swapped = math.isclose(number(fsdp_s, exercise, "fsdp_s"), right_ddp, rel_tol=1e-3)
    except WorkshopError:  # fsdp_s is no number: named below, once ddp_s is right
        swapped = False
    byte_mistakes = [
        (2, "that counts 4 bytes a parameter (fp32); `n_bytes` is already the bf16 bytes, 2 a parameter.",
         "use n_bytes as the cell gives it."),
        (0.5, "that sends one byte per parameter (the parameter count as bytes); bf16 takes 2.",
         "use n_bytes = 2 * parameters, as the cell gives it."),
    ]
    verdict(ddp, right_ddp, exercise, "ddp_s", [
        (3 * half, "`ddp_s` and `fsdp_s` are swapped: that is FSDP's time." if swapped else
         "that is three passes, FSDP's time; DDP's all-reduce is two (a reduce-scatter and an all-gather).",
         "ddp_s = 2 passes (one all-reduce), fsdp_s = 3 passes (2 all-gathers + 1 reduce-scatter)."),
        *[(2 * one_pass(factor * n_bytes), problem, fix) for factor, problem, fix in byte_mistakes],
        (half, "that is an all-gather's time: an all-reduce is a reduce-scatter plus an all-gather.",
         "use 2(p-1) latency steps and 2(p-1)/p * n / B."),
        (right_ddp + 2 * (p - 1) * (link.latency_us - alpha), "the latency is in microseconds.",
         "multiply latency_us by 1e-6."),
        (2 * (p - 1) * alpha + 2 * (p - 1) / p * n_bytes / (bandwidth / 8), "that treats GB/s as Gbit/s.",
         "bandwidth_gbps is in gigabytes per second: B = bandwidth_gbps * 1e9 bytes/s."),
        (2 * (p - 1) * alpha + 2 * (p - 1) / p * n_bytes / link.bandwidth_gbps,
         "the bandwidth went in as bytes per second.", "bandwidth_gbps is in GB/s: multiply by 1e9."),
        (2 * (p - 1) * alpha + 2 * (p - 1) / p * n_bytes / (link.bandwidth_gbps * 2**30),
         "the bandwidth went in as GiB/s (x 2**30).", "bandwidth_gbps is in GB/s, decimal: multiply by 1e9."),
        (2 * (p - 1) * alpha + 2 * n_bytes / bandwidth, "the factor (p-1)/p is missing.",
         "each rank sends 2(p-1) pieces of n/p bytes: 2(p-1)/p * n / B."),
        (1e3 * right_ddp, "that is milliseconds, not seconds.", "give the time in seconds."),
    ], "ring all-reduce: 2(p-1) * alpha + 2(p-1)/p * n / B, alpha in seconds, B in bytes/s.",
        limits=[(ddp > 0, "a time is above 0.", "add the latency and the transfer time.")])
    fsdp = number(fsdp_s, exercise, "fsdp_s", "one number, in seconds")
    verdict(fsdp, 3 * half, exercise, "fsdp_s", [
        (2 * half, "two collectives, but FSDP runs three per step.",
         "all-gather the parameters for the forward pass, again for the backward, then reduce-scatter the gradients."),
        (4 * half, "four passes (an all-reduce for the gradients, or two all-reduces): the reduce-scatter is one "
         "pass, half an all-reduce.", "2 all-gathers + 1 reduce-scatter, each (p-1) * alpha + (p-1)/p * n / B."),
        *[(3 * one_pass(factor * n_bytes), problem, fix) for factor, problem, fix in byte_mistakes],
        (3 * right_ddp, "three all-reduces: FSDP's collectives are each half an all-reduce.",
         "all-gather and reduce-scatter each cost (p-1) * alpha + (p-1)/p * n / B."),
        (3e3 * half, "that is milliseconds, not seconds.", "give the time in seconds."),
    ], "2 all-gathers + 1 reduce-scatter, each (p-1) * alpha + (p-1)/p * n / B.",
        limits=[(fsdp > 0, "a time is above 0.", "add the latency and the transfer time.")])
    return passed(exercise, f"DDP {1e3 * ddp:.0f} ms, FSDP {1e3 * fsdp:.0f} ms per step: {fsdp / ddp:.2f}x")


def fewest_microbatches(stages: int, target: float) -> int:
    """The smallest m with a GPipe bubble (p-1)/(m+p-1) of at most ``target``."""
    if stages <= 1:
        return 1
    if not 0 < target < 1:
        raise WorkshopError(f"A bubble target of {target!r} is no fraction between 0 and 1.", "pass e.g. target=0.1.")
    m = max(1, math.ceil((stages - 1) * (1 - target) / target))
    while m > 1 and bubble_fraction(stages, m - 1) <= target + 1e-12:
        m -= 1
    while bubble_fraction(stages, m) > target + 1e-12:
        m += 1
    return m


@checked
def check_microbatches(microbatches, stages: int, target: float, exercise: str = "Exercise 5.3") -> bool:
    """The fewest micro-batches that bring the bubble of ``stages`` equal stages down to ``target``."""
    value = count(microbatches, exercise, "microbatches", "a whole number of micro-batches")
    require(value >= 1, exercise, f"`microbatches` = {value}: at least one is needed.", "count from 1.")
    right = fewest_microbatches(stages, target)
    over_m = max(1, math.ceil((stages - 1) / target - 1e-9))  # the smallest m with (p-1)/m <= target
    verdict(value, right, exercise, "microbatches", [
        (fewest_microbatches(stages + 1, target), "that counts p idle slots; filling and draining take p-1.",
         "bubble = (p-1) / (m+p-1)."),
        (over_m, "that solves (p-1)/m <= target; the bubble is the idle slots over all of them, (p-1)/(m+p-1).",
         "find the smallest m with (p-1) / (m+p-1) <= target."),
    ], "the smallest m with (p-1) / (m+p-1) <= target.", whole=True, limits=[
        (bubble_fraction(stages, value) <= target + 1e-12,
         f"with m = {value} the bubble is {bubble_fraction(stages, value):.3f}, above {target:g}.",
         "more micro-batches: the bubble is (p-1) / (m+p-1)."),
        (value == 1 or bubble_fraction(stages, value - 1) > target + 1e-12,
         f"m = {value - 1} already gives a bubble of {bubble_fraction(stages, max(1, value - 1)):.3f}.",
         "find the smallest m with (p-1) / (m+p-1) <= target."),
    ])
    return passed(exercise, f"m = {value}: bubble {bubble_fraction(stages, value):.3f} <= {target:g}")
