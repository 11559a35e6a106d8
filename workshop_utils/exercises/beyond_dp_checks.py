"""Notebook 05's exercises: ZeRO's memory per GPU, FSDP's traffic against DDP's, and the pipeline bubble. A count is
judged by what it does (``smallest``), a time against the ring model's."""

import math

from ..parallel.comm_model import Link, ring_all_reduce_s
from ..parallel.pipeline import bubble_fraction
from ..parallel.sharding import BYTES_PER_PARAMETER, fewest_gpus, zero_kept_and_sharded_gib
from ..system.display import format_number
from .answer_values import scalar, show
from .cell_again import judge_cell_again
from .exercise_cells import passed, require, require_answered
from .exercise_judging import (accepted, checked, close, count, kit_input, kit_number, kit_numbers, number, short,
                               smallest, verdict)

# An H100 80GB's memory as PyTorch reports it on the kit's own H100 (results/reference/gpu/, "memory_gib"):
# what the exercise's budget leaves part of.
H100_GIB = 79.2


def _is_infinite(value) -> bool:
    try:
        return math.isinf(float(scalar(value)))
    except Exception:  # noqa: BLE001 - whatever it is (text, a truth value, a list), it is no infinity
        return False


# 5.1's cell run again on another model and budget: quotients of 3.34 and 15.18 GPUs, which round() and int() take
# one GPU short (the notebook's 2.98 and 8.77 round up by chance), and neither count the notebook's 3 or 9
OTHER_MODEL = {"parameters": 13e9, "budget_gib": 58}
# 5.3's cell run again on another pipeline: a bound of 28.33 micro-batches, so 29, where int() and round() give 28 and
# no ceiling no whole number (the notebook's bound is 63 exactly)
OTHER_PIPELINE = {"stages": 6, "target": 0.15}


def _other_inputs(given: dict) -> str:
    return ", ".join(f"{name} = {format_number(value)}" for name, value in given.items())


@checked
def check_fewest_gpus(gpus, parameters: float, budget_gib: float, stage: int, precision: str = "mixed",
                      exercise: str = "Exercise 5.1") -> bool:
    """The smallest count of GPUs whose share fits the budget, then on ``OTHER_MODEL``, the answer's cell run again."""
    name = f"zero{stage}_gpus"
    detail = _judge_fewest_gpus(gpus, parameters, budget_gib, stage, precision, exercise)
    bytes_each = dict(zip(("param_bytes", "grad_bytes", "optimizer_bytes"), BYTES_PER_PARAMETER[precision]))
    again = f"{exercise} (your cell, run again on other inputs: {_other_inputs(OTHER_MODEL)})"
    # the bytes per parameter too, as the notebook sets them: a cell that reads them still gets a second verdict
    judge_cell_again((name,), {**OTHER_MODEL, **bytes_each}, lambda answers: _judge_fewest_gpus(
        answers[name], *OTHER_MODEL.values(), stage, precision, again))
    return passed(exercise, detail)


def _judge_fewest_gpus(gpus, parameters: float, budget_gib: float, stage: int, precision: str, exercise: str) -> str:
    name, (kept, split) = f"zero{stage}_gpus", zero_kept_and_sharded_gib(parameters, stage, precision)
    if fewest_gpus(parameters, budget_gib, stage, precision) == math.inf:
        require_answered(gpus, exercise, f"`{name}` is still the placeholder `...`.")
        require(_is_infinite(gpus), exercise, f"no number of GPUs holds it under stage {stage}.",
                f"set {name} = math.inf: what stays whole on every GPU already exceeds the budget.")
        return f"stage {stage} cannot hold it at any size"
    require(not _is_infinite(gpus), exercise, f"`{name}` = {show(gpus)}, but a finite number of GPUs holds it under "
            f"stage {stage}.", "divide what is sharded into what the budget leaves beside what stays whole.")
    given = count(gpus, exercise, name, "a whole number of GPUs")
    require(given >= 1 or not kept, exercise, f"`{name}` = {given}: a number of GPUs is at least 1; 0 or less comes "
            "from dividing by a room that is not positive.", "what is sharded divides into the budget minus what "
            f"stays whole on every GPU ({kept:.1f} GiB under stage {stage}), both in GiB (a GiB is 2**30 bytes).")
    require(given >= 1, exercise, f"`{name}` = {given}: a number of GPUs is at least 1.", "round the quotient up "
            "(math.ceil): a share just above the budget needs one more GPU, never none.")
    value = smallest(given, exercise, name, lambda p: kept + split / p,
                     budget_gib, lambda p, each: f"at {p} GPU{'s' * (p > 1)} each holds {each:.1f} GiB, more than "
                     f"the {budget_gib:g} GiB budget", f"fewer GPUs already hold it within {budget_gib:g} GiB each",
                     "take the smallest p with kept + sharded / p <= budget (a GiB is 2**30 bytes).")
    return f"ZeRO-{stage}: {value} GPUs, {kept + split / value:.1f} GiB each"


@checked
def check_fsdp_traffic(ddp_s, fsdp_s, n_bytes: float, world_size: int, link: Link,
                       exercise: str = "Exercise 5.2") -> bool:
    fix = "pass the inputs of the exercise's cell."
    n_bytes = kit_number(n_bytes, exercise, "the cell's n_bytes", fix)
    p = int(kit_number(world_size, exercise, "the cell's world_size", fix, least=2, whole=True, most=2.0**20))
    kit_input(isinstance(link, Link) and link.bandwidth_gbps > 0 and link.latency_us >= 0,
              f"{exercise}: the link is {short(repr(link), 40)}, not one of wu.LINKS.", "pass wu.LINKS[\"ib_ndr\"], "
              "as the exercise's cell does.")
    one_pass = (p - 1) * link.latency_us * 1e-6 + (p - 1) / p * n_bytes / (link.bandwidth_gbps * 1e9)
    lat, bw = link.latency_us * 1e-6, link.bandwidth_gbps * 1e9
    inputs = (f"{{}} passes of (p-1) * alpha + (p-1)/p * n / B, p = {p}, alpha = {link.latency_us:g} us, "
              f"B = {link.bandwidth_gbps:g} GB/s, n = {n_bytes:.3g} bytes")
    hint = "each pass (p-1) * alpha + (p-1)/p * n / B, in seconds: alpha in seconds, B in bytes/s."
    units = "alpha = latency_us * 1e-6 s, B = bandwidth_gbps * 1e9 bytes/s (GB/s are decimal)."

    def as_rounded(answer: float, passes: int, pass_s: float) -> float:
        """``passes`` x ``pass_s``, or the answer where it is that pass rounded, then multiplied (2 x 0.28 s)."""
        exact = passes * pass_s
        return answer if not close(answer, exact) and accepted(answer / passes, pass_s) else exact

    def mistakes(passes: int, answer: float) -> list:  # as 2.3 names them, for the same link arithmetic
        def ring(alpha=lat, bandwidth=bw, n=n_bytes, share=(p - 1) / p):
            return as_rounded(answer, passes, (p - 1) * alpha + share * n / bandwidth)
        return [(ring(bandwidth=bw / 8), "that treats GB/s as Gbit/s (divided by 8).", units),
                (ring(bandwidth=link.bandwidth_gbps * 2**30), "the bandwidth went in as GiB/s (x 2**30).", units),
                (ring(bandwidth=link.bandwidth_gbps), "the bandwidth went in as bytes per second.", units),
                (ring(alpha=link.latency_us), "the latency went in as seconds.", units),
                (ring(alpha=0), "that leaves the latency out: each of the p-1 steps pays it.", hint),
                (ring(share=1), "that sends all n bytes in a pass; each GPU sends (p-1)/p of them.", hint),
                (ring(n=2 * n_bytes), "that counts the gradients in fp32, 4 bytes; `n_bytes` holds them in bf16.",
                 "use n_bytes as given.")]

    ddp = number(ddp_s, exercise, "ddp_s", "one number, in seconds")
    verdict(ddp, ring_all_reduce_s(n_bytes, p, link), exercise, "ddp_s", mistakes(2, ddp), "an all-reduce is 2 "
            "passes (a reduce-scatter and an all-gather), " + hint, also=[as_rounded(ddp, 2, one_pass)],
            inputs=inputs.format(2))
    fsdp = number(fsdp_s, exercise, "fsdp_s", "one number, in seconds")
    six = (3 * ddp, "that is 3 all-reduces, 6 passes: FSDP's 3 passes are 1.5 all-reduces.", hint)
    verdict(fsdp, 3 * one_pass, exercise, "fsdp_s", [six, *mistakes(3, fsdp)], "FSDP is 3 passes (all-gather for "
            "the forward pass, again for the backward, reduce-scatter of the gradients), " + hint,
            also=[1.5 * ddp, as_rounded(fsdp, 3, one_pass)], inputs=inputs.format(3))
    return passed(exercise, f"DDP {1e3 * ddp:.0f} ms, FSDP {1e3 * fsdp:.0f} ms per step: {fsdp / ddp:.2f}x")


@checked
def check_microbatches(microbatches, stages: int, target: float, exercise: str = "Exercise 5.3") -> bool:
    """The smallest m whose bubble is within ``target``, then on ``OTHER_PIPELINE``, the answer's cell run again."""
    detail = _judge_microbatches(microbatches, stages, target, exercise)
    again = f"{exercise} (your cell, run again on other inputs: {_other_inputs(OTHER_PIPELINE)})"
    judge_cell_again(("microbatches",), OTHER_PIPELINE, lambda answers: _judge_microbatches(
        answers["microbatches"], *OTHER_PIPELINE.values(), again))
    return passed(exercise, detail)


def _judge_microbatches(microbatches, stages, target, exercise: str) -> str:
    stages, target = kit_numbers(exercise, "pass the inputs of the exercise's cell.", stages=stages, target=target)
    value = smallest(count(microbatches, exercise, "microbatches", "a whole number of micro-batches"), exercise,
                     "microbatches", lambda m: bubble_fraction(stages, m), target + 1e-12,
                     lambda m, bubble: f"with m = {m} the bubble (p-1) / (m+p-1) is {bubble:.3f}, above {target:g}",
                     f"fewer micro-batches already bring the bubble to at most {target:g}",
                     "find the smallest m with (p-1) / (m+p-1) <= target.")
    return f"m = {value}: bubble {bubble_fraction(stages, value):.3f} <= {target:g}"
