"""Notebook 05's exercises: ZeRO's memory per GPU, FSDP's traffic against DDP's, and the pipeline bubble.

A count is judged by what it does (each GPU's share within the budget, the bubble within the target, and one
fewer not), a time against the ring model's, with the inputs it comes from.
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
                gib: float = 2**30) -> float:
    """The smallest world size whose share fits ``budget_gib``, ``math.inf`` when none does; ``gib=1e9`` counts GB."""
    kept, split = _kept_and_split(parameters, stage, precision, gib)
    if kept > budget_gib or (kept == budget_gib and split):
        return math.inf
    gpus = max(1, math.ceil(split / (budget_gib - kept))) if split else 1
    while gpus > 1 and kept + split / (gpus - 1) <= budget_gib:  # the ceil of a rounded quotient may be one off
        gpus -= 1
    while kept + split / gpus > budget_gib:
        gpus += 1
    return gpus


# An H100 80GB's memory as PyTorch reports it on the kit's own H100 (results/reference/gpu/, "memory_gib"):
# what the exercise's budget leaves part of.
H100_GIB = 79.2


def _is_infinite(value) -> bool:
    try:
        return math.isinf(float(scalar(value)))
    except Exception:  # noqa: BLE001 - whatever it is (text, a truth value, a list), it is no infinity
        return False


@checked
def check_fewest_gpus(gpus, parameters: float, budget_gib: float, stage: int, precision: str = "mixed",
                      exercise: str = "Exercise 5.1") -> bool:
    """The smallest number of GPUs whose ZeRO ``stage`` share of ``parameters`` fits ``budget_gib`` each.

    A wrong count is too few (a GPU's share exceeds the budget) or too many (one GPU fewer holds it): the line
    says which, with what each GPU would hold.
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
    per_gpu = zero_gib_per_gpu(parameters, value, stage, precision)
    fewer = zero_gib_per_gpu(parameters, value - 1, stage, precision) if value > 1 else math.inf
    # Every wrong count is too few or too many: what each GPU would hold then says which.
    require(per_gpu <= budget_gib, exercise, f"`{name}` = {value}: at {value} GPUs each holds {per_gpu:.1f} GiB, more "
            f"than the {budget_gib:g} GiB budget.", "take the smallest p with kept + sharded / p <= budget (a GiB is "
                                                     "2**30 bytes): each GPU's share must fit.")
    require(fewer > budget_gib, exercise, f"`{name}` = {value}: {value - 1} GPUs already hold it ({fewer:.1f} GiB "
            f"each, within {budget_gib:g} GiB).", f"take the smallest p that fits: stage {stage} keeps "
            f"{ {0: 'everything', 1: 'the parameters and gradients', 2: 'the parameters'}.get(stage, 'nothing')} "
            "whole on every GPU and divides only the rest.")
    return passed(exercise, f"ZeRO-{stage}: {value} GPUs, {per_gpu:.1f} GiB each")


@checked
def check_fsdp_traffic(ddp_s, fsdp_s, n_bytes: float, world_size: int, link: Link,
                       exercise: str = "Exercise 5.2") -> bool:
    """DDP: one ring all-reduce of the gradients (two passes). FSDP: two all-gathers of the parameters and one
    reduce-scatter (three passes), each pass (p-1) * alpha + (p-1)/p * n / B."""
    p = world_size
    one_pass = (p - 1) * link.latency_us * 1e-6 + (p - 1) / p * n_bytes / (link.bandwidth_gbps * 1e9)
    inputs = f"{{}} passes of (p-1) * alpha + (p-1)/p * n / B, p = {p}, alpha = {link.latency_us:g} us, " \
             f"B = {link.bandwidth_gbps:g} GB/s, n = {n_bytes:.3g} bytes"
    hint = "each pass (p-1) * alpha + (p-1)/p * n / B, in seconds: alpha in seconds, B in bytes/s."
    ddp = number(ddp_s, exercise, "ddp_s", "one number, in seconds")
    verdict(ddp, ring_all_reduce_s(n_bytes, p, link), exercise, "ddp_s", [], "an all-reduce is 2 passes (a "
            "reduce-scatter and an all-gather), " + hint, inputs=inputs.format(2))
    fsdp = number(fsdp_s, exercise, "fsdp_s", "one number, in seconds")
    verdict(fsdp, 3 * one_pass, exercise, "fsdp_s", [], "FSDP is 3 passes (all-gather for the forward pass, again for "
            "the backward, reduce-scatter of the gradients), " + hint, inputs=inputs.format(3))
    return passed(exercise, f"DDP {1e3 * ddp:.0f} ms, FSDP {1e3 * fsdp:.0f} ms per step: {fsdp / ddp:.2f}x")


@checked
def check_microbatches(microbatches, stages: int, target: float, exercise: str = "Exercise 5.3") -> bool:
    """The fewest micro-batches that bring the bubble of ``stages`` equal stages down to ``target``."""
    value = count(microbatches, exercise, "microbatches", "a whole number of micro-batches")
    require(value >= 1, exercise, f"`microbatches` = {value}: at least one is needed.", "count from 1.")
    bubble, fewer = bubble_fraction(stages, value), bubble_fraction(stages, max(1, value - 1))
    require(bubble <= target + 1e-12, exercise, f"`microbatches` = {value}: with m = {value} the bubble "
            f"(p-1) / (m+p-1) is {bubble:.3f}, above {target:g}.", "more micro-batches: the bubble is (p-1) / (m+p-1).")
    require(value == 1 or fewer > target + 1e-12, exercise, f"`microbatches` = {value}: m = {value - 1} already gives "
            f"a bubble of {fewer:.3f}, at most {target:g}.", "find the smallest m with (p-1) / (m+p-1) <= target.")
    return passed(exercise, f"m = {value}: bubble {bubble:.3f} <= {target:g}")
