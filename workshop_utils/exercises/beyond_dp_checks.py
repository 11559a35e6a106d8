"""Notebook 05's exercises: ZeRO's memory per GPU, FSDP's traffic against DDP's, and the pipeline bubble.

The counting functions (``zero_gib_per_gpu``, ``fewest_gpus``, ``fewest_microbatches``) also reproduce the
mistakes a check names, so that each mistake's value comes from the same formula.
"""

from __future__ import annotations

import math
import numbers

from ..parallel.comm_model import Link, ring_all_reduce_s
from ..parallel.pipeline import bubble_fraction
from ..parallel.sharding import BYTES_PER_PARAMETER, ZERO_STAGES
from ..system.errors import WorkshopError
from .answer_values import scalar
from .exercise_cells import NotYet, passed, require, require_answered
from .exercise_judging import checked, count, number, verdict


def _kept_and_split(parameters: float, stage: int, precision: str, gib: float = 2**30) -> tuple[float, float]:
    """GiB of parameters, gradients and Adam state a ZeRO stage keeps whole on every GPU, and GiB it shards."""
    if not isinstance(stage, numbers.Integral) or not 0 <= stage < len(ZERO_STAGES):
        raise WorkshopError(f"stage {stage!r} is no ZeRO stage.", "pass 0 (DDP), 1, 2 or 3.")
    if precision not in BYTES_PER_PARAMETER:
        raise WorkshopError(f"unknown precision {precision!r}.", f"use one of {sorted(BYTES_PER_PARAMETER)}.")
    pairs = list(zip(BYTES_PER_PARAMETER[precision], list(ZERO_STAGES.values())[stage]))
    return (sum(b for b, s in pairs if not s) * parameters / gib, sum(b for b, s in pairs if s) * parameters / gib)


def zero_gib_per_gpu(parameters: float, world_size: int, stage: int, precision: str = "mixed") -> float:
    """GiB per GPU of parameters, gradients and Adam state under DDP (stage 0) or ZeRO stage 1-3."""
    kept, split = _kept_and_split(parameters, stage, precision)
    return kept + split / world_size


def fewest_gpus(parameters: float, budget_gib: float, stage: int, precision: str = "mixed",
                gib: float = 2**30, rounding=math.ceil) -> float:
    """The smallest world size whose share fits ``budget_gib``; ``math.inf`` when none does.

    ``gib`` is the unit's size in bytes: 2**30, or 1e9 to reproduce the GB-for-GiB mistake;
    ``rounding=math.floor`` reproduces rounding down (the smallest p whose share is *about* the budget).
    """
    kept, split = _kept_and_split(parameters, stage, precision, gib)
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

# Another stage's count given for this one: what that stage shards, and the fix.
OTHER_STAGE = {1: ("that is ZeRO-1's count; ZeRO-3 shards the parameters and gradients too.",
                   "divide all 16 bytes per parameter by the GPUs."),
               2: ("that is ZeRO-2's count, which shards the gradients too.", None),
               3: ("that is ZeRO-3's count, which shards everything.", None)}


def _is_infinite(value) -> bool:
    try:
        return math.isinf(float(scalar(value)))
    except Exception:  # noqa: BLE001 - whatever it is (text, a truth value, a list), it is no infinity
        return False


@checked
def check_fewest_gpus(gpus, parameters: float, budget_gib: float, stage: int, precision: str = "mixed",
                      exercise: str = "Exercise 5.1") -> bool:
    """The smallest number of GPUs whose ZeRO ``stage`` share of ``parameters`` fits ``budget_gib`` each.

    The exercise's numbers (7e9 parameters, 35 GiB) give most mistakes named here a count of their own; where
    two give the same count (ZeRO-1's 12: GB for GiB, or all 16 bytes divided into what the whole copies leave),
    the line names both.
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
    whole, sharded = _kept_and_split(parameters, stage, precision)
    rest, master = budget_gib - whole, BYTES_PER_PARAMETER[precision][2] - BYTES_PER_PARAMETER["fp32"][2]
    mistakes = [
        (fewest_gpus(parameters, budget_gib, stage, precision, rounding=math.floor),
         "rounded down: at that many GPUs each one holds more than the budget.", "round up (math.ceil)."),
        (fewest_gpus(parameters, budget_gib, stage, precision, gib=1e9), "that counts GB (10^9 bytes), not GiB.",
         "divide bytes by 2**30."),
        *[(fewest_gpus(parameters, budget_gib, other, precision), problem,
           fix or f"stage {stage} keeps {kept} whole on every GPU and divides only the rest.")
          for other, (problem, fix) in OTHER_STAGE.items() if {1: stage == 3, 2: stage != 2, 3: stage != 3}[other]],
        (fewest_gpus(parameters, H100_GIB, stage, precision) if budget_gib != H100_GIB else None,
         f"that fills the H100's whole {H100_GIB:.1f} GiB; the budget is budget_gib ({budget_gib:g} GiB), the rest "
         "goes to activations.", "divide by budget_gib."),
        *([] if rest <= 0 or not sharded else [
            (math.ceil((whole + sharded) / rest), f"that divides all {sum(BYTES_PER_PARAMETER[precision])} bytes a "
             f"parameter into what {kept} leave; they stay whole, only the rest divides.",
             f"divide only what stage {stage} shards into budget_gib minus what stays whole."),
            (math.ceil((sharded - master * parameters / 2**30) / rest) if master else None, "that counts Adam's two "
             f"moments but not the fp32 master copy of the weights ({master} bytes a parameter more).",
             "use optimizer_bytes as the cell gives it: master copy and moments."),
        ]),
        (right + 1, "one GPU more than the fewest that hold it (a spare?).",
         f"{right} GPUs hold it already: take the smallest p that fits."),
        (2 ** math.ceil(math.log2(right)), "that is the next power of two; the fewest need not be one.",
         "take the smallest p that fits, whatever it is."),
    ]
    per_gpu = zero_gib_per_gpu(parameters, value, stage, precision)
    fewer = zero_gib_per_gpu(parameters, value - 1, stage, precision) if value > 1 else math.inf
    verdict(value, right, exercise, name, [m for m in mistakes if m[0] != math.inf],
            "the smallest p with kept + sharded / p <= budget.", whole=True,
            limits=[(per_gpu <= budget_gib, f"at {value} GPUs each holds {per_gpu:.1f} GiB, more than the "
                                            f"{budget_gib:g} GiB budget.",
                     "take the smallest p with kept + sharded / p <= budget: each GPU's share must fit."),
                    (fewer > budget_gib, f"{value - 1} GPUs already hold it ({fewer:.1f} GiB each).",
                     "find the smallest p with kept + sharded / p <= budget.")])
    return passed(exercise, f"ZeRO-{stage}: {value} GPUs, {per_gpu:.1f} GiB each")


@checked
def check_fsdp_traffic(ddp_s, fsdp_s, n_bytes: float, world_size: int, link: Link,
                       exercise: str = "Exercise 5.2") -> bool:
    """DDP: one ring all-reduce of the gradients (two passes). FSDP: two all-gathers of the parameters and one
    reduce-scatter (three passes), each pass (p-1) * alpha + (p-1)/p * n / B."""
    p, bandwidth = world_size, link.bandwidth_gbps * 1e9

    def passes(k: int, n: float = n_bytes, alpha: float = link.latency_us * 1e-6, by: float = bandwidth,
               share: float = (p - 1) / p) -> float:
        return k * ((p - 1) * alpha + share * n / by)

    ddp = number(ddp_s, exercise, "ddp_s", "one number, in seconds")
    right_ddp = ring_all_reduce_s(n_bytes, p, link)
    try:  # the two answers swapped: said on ddp_s, judged first
        swapped = math.isclose(number(fsdp_s, exercise, "fsdp_s"), right_ddp, rel_tol=1e-3)
    except WorkshopError:  # fsdp_s is no number: named below, once ddp_s is right
        swapped = False
    # A unit or a byte count mistaken, the same in either answer: (the pass it gives, problem, fix).
    units = [
        (dict(n=2 * n_bytes), "that counts 4 bytes a parameter (fp32); `n_bytes` is already the bf16 bytes, 2 a "
                              "parameter.", "use n_bytes as the cell gives it."),
        (dict(n=n_bytes / 2), "that sends one byte per parameter (the parameter count as bytes); bf16 takes 2.",
         "use n_bytes = 2 * parameters, as the cell gives it."),
        (dict(alpha=link.latency_us), "the latency is in microseconds.", "multiply latency_us by 1e-6."),
        (dict(by=bandwidth / 8), "that treats GB/s as Gbit/s.",
         "bandwidth_gbps is in gigabytes per second: B = bandwidth_gbps * 1e9 bytes/s."),
        (dict(by=2 * bandwidth), "that doubles the bandwidth (both directions added): a ring step sends each byte "
                                 "one way.", "bandwidth_gbps is per direction: B = bandwidth_gbps * 1e9."),
        (dict(by=link.bandwidth_gbps), "the bandwidth went in as bytes per second.",
         "bandwidth_gbps is in GB/s: multiply by 1e9."),
        (dict(by=link.bandwidth_gbps * 2**30), "the bandwidth went in as GiB/s (x 2**30).",
         "bandwidth_gbps is in GB/s, decimal: multiply by 1e9."),
        (dict(share=1), "the factor (p-1)/p is missing.",
         "each rank sends p-1 pieces of n/p bytes a pass: (p-1)/p * n / B."),
    ]
    in_passes = "each pass (p-1) * alpha + (p-1)/p * n / B, alpha in seconds, B in bytes/s."
    verdict(ddp, right_ddp, exercise, "ddp_s", [
        (passes(3), "`ddp_s` and `fsdp_s` are swapped: that is FSDP's time." if swapped else
         "that is three passes, FSDP's time; DDP's all-reduce is two (a reduce-scatter and an all-gather).",
         "ddp_s = 2 passes (one all-reduce), fsdp_s = 3 passes (2 all-gathers + 1 reduce-scatter)."),
        (passes(1), "that is an all-gather's time: an all-reduce is a reduce-scatter plus an all-gather.",
         "use 2(p-1) latency steps and 2(p-1)/p * n / B."),
        *[(passes(2, **change), problem, fix) for change, problem, fix in units],
        (1e3 * right_ddp, "that is milliseconds, not seconds.", "give the time in seconds."),
    ], "ring all-reduce: 2 passes, " + in_passes, limits=[(ddp > 0, "a time is above 0.",
                                                          "add the latency and the transfer time.")])
    fsdp = number(fsdp_s, exercise, "fsdp_s", "one number, in seconds")
    verdict(fsdp, passes(3), exercise, "fsdp_s", [
        (passes(2), "two collectives, but FSDP runs three per step.",
         "all-gather the parameters for the forward pass, again for the backward, then reduce-scatter the gradients."),
        (passes(4), "four passes (an all-reduce for the gradients, or two all-reduces): the reduce-scatter is one "
                    "pass, half an all-reduce.", "2 all-gathers + 1 reduce-scatter, " + in_passes),
        (3 * right_ddp, "three all-reduces: FSDP's collectives are each half an all-reduce.",
         "all-gather and reduce-scatter each cost (p-1) * alpha + (p-1)/p * n / B."),
        *[(passes(3, **change), problem, fix) for change, problem, fix in units],
        (1e3 * passes(3), "that is milliseconds, not seconds.", "give the time in seconds."),
    ], "2 all-gathers + 1 reduce-scatter, " + in_passes,
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
    fix = "find the smallest m with (p-1) / (m+p-1) <= target."
    verdict(value, fewest_microbatches(stages, target), exercise, "microbatches", [
        (fewest_microbatches(stages + 1, target), "that counts p idle slots; filling and draining take p-1.",
         "bubble = (p-1) / (m+p-1)."),
        (max(1, math.ceil((stages - 1) / target - 1e-9)), "that solves (p-1)/m <= target; the bubble is the idle "
                                                           "slots over all of them, (p-1)/(m+p-1).", fix),
    ], "the smallest m with (p-1) / (m+p-1) <= target.", whole=True, limits=[
        (bubble_fraction(stages, value) <= target + 1e-12,
         f"with m = {value} the bubble is {bubble_fraction(stages, value):.3f}, above {target:g}.",
         "more micro-batches: the bubble is (p-1) / (m+p-1)."),
        (value == 1 or bubble_fraction(stages, value - 1) > target + 1e-12,
         f"m = {value - 1} already gives a bubble of {bubble_fraction(stages, max(1, value - 1)):.3f}.", fix),
    ])
    return passed(exercise, f"m = {value}: bubble {bubble_fraction(stages, value):.3f} <= {target:g}")
