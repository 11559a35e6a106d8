"""Exercise 2.3: the weak-scaling efficiency of DDP at 64 GPUs without overlap, from the ring all-reduce model."""

import math

import torch

from ..parallel.comm_model import LINKS, ddp_buckets, predict_scaling, ring_all_reduce_s
from .ddp_lab_files import EFFICIENCY_EXERCISE
from .exercise_cells import passed, require
from .exercise_judging import accepted, checked, kit_number, number, verdict


@checked
def check_ddp_efficiency(efficiency, step_s: float, grad_bytes: float, world_size: int = 64,
                         gpus_per_node: int = 8, exercise: str = EFFICIENCY_EXERCISE) -> float:
    """The efficiency without overlap at ``world_size`` GPUs, from ``predict_scaling``'s model, compared through the
    communication time it implies: near 1 and near 0 the mistakes' efficiencies agree to many digits."""
    fix = "pass the inputs of the exercise's cell."
    step_s = kit_number(step_s, exercise, "the cell's step_s", fix)
    # gradients past a PiB: bucket by bucket, the model would take hours
    grad_bytes = kit_number(grad_bytes, exercise, "the cell's grad_bytes", fix, most=2.0**50)
    world_size = int(kit_number(world_size, exercise, "the cell's world_size", fix, least=2, whole=True, most=2.0**20))
    gpus_per_node = int(kit_number(gpus_per_node, exercise, "the cell's gpus_per_node", fix, least=1, whole=True,
                                   most=2.0**20))
    value = number(efficiency, exercise, "efficiency_64", "one number, a fraction")
    within, between = LINKS["nvlink4"], LINKS["ib_ndr"]
    row = predict_scaling(step_s, grad_bytes, [world_size], within, between, gpus_per_node).iloc[0]
    right = float(row.efficiency_no_overlap)
    link = between if world_size > gpus_per_node else within
    p, lat, bw = world_size, link.latency_us * 1e-6, link.bandwidth_gbps * 1e9

    def efficiency_with(comm_s: float) -> float:
        return step_s / (step_s + comm_s)

    def ring(lat_s: float = lat, bytes_per_s: float = bw, gpus: int = p, steps=None, latency_steps=None) -> float:
        steps = 2 * (gpus - 1) if steps is None else steps
        return efficiency_with(sum((steps if latency_steps is None else latency_steps) * lat_s
                                   + steps / gpus * n / bytes_per_s for n in ddp_buckets(grad_bytes)))

    ib_fix = "bandwidth_gbps is in GB/s, decimal: B = bandwidth_gbps * 1e9 bytes/s."
    mistakes = [
        (1.0, "that leaves the communication out: an efficiency of 1 is a step with no all-reduce at all.",
         "add the buckets' ring all-reduce times to the step: efficiency = step / (step + communication)."),
        (efficiency_with(sum(ring_all_reduce_s(b, p, within) for b in ddp_buckets(grad_bytes))),
         "that is NVLink's figure, the link inside a node.", f"{p} GPUs fill {math.ceil(p / gpus_per_node)} nodes: "
         "the ring crosses InfiniBand (wu.LINKS['ib_ndr']), its slowest link, which sets the pace."),
        (efficiency_with(ring_all_reduce_s(grad_bytes, p, link)), "the gradients went as one message.",
         "DDP sends one all-reduce per bucket (wu.ddp_buckets(grad_bytes)); each pays the latency."),
        (float(row.efficiency_overlap), "that is the bound with overlap.",
         "this exercise asks for no overlap: every bucket's all-reduce after the backward pass."),
        (100 * right, "that looks like a percentage.", "give the efficiency as a fraction (0.85, not 85)."),
        (ring(steps=p - 1), "a ring all-reduce takes 2(p-1) steps.", "a reduce-scatter (p-1), then an all-gather."),
        (ring(lat_s=link.latency_us), "the latency went in as seconds.", "latency_us is in microseconds: x 1e-6."),
        (ring(bytes_per_s=link.bandwidth_gbps), "the bandwidth went in as bytes per second.", ib_fix),
        (ring(bytes_per_s=link.bandwidth_gbps * 2**30), "the bandwidth went in as GiB/s (x 2**30).", ib_fix),
        (ring(bytes_per_s=bw / 8), "that treats GB/s as Gbit/s (divided by 8).", ib_fix),
        (ring(latency_steps=1), "that pays the latency once per bucket; the ring pays it at each of its 2(p-1) steps.",
         "t(n, p) = 2(p-1) latency + 2(p-1)/p n / bandwidth, for each bucket."),
        # Mistakes that may land on another's number (2 buckets x (p-1) latencies = one message's 2(p-1)): named
        # too, so that a number two mistakes give names both, never one of them as certain.
        (ring(latency_steps=p - 1), "that pays the latency (p-1) times per bucket; the ring pays it at each of its "
         "2(p-1) steps.", "t(n, p) = 2(p-1) latency + 2(p-1)/p n / bandwidth, for each bucket."),
        (ring(gpus=gpus_per_node) if p > gpus_per_node > 1 else None,
         f"that is a ring over one node's {gpus_per_node} GPUs.",
         f"the ring runs over all {p} GPUs: p = {p} in t(n, p), over InfiniBand between the nodes."),
    ]

    def communication(efficiency: float) -> float:  # per step, as an efficiency implies it: 1 / e - 1 steps
        return 1 / efficiency - 1 if efficiency > 0 else math.nan

    # 1 (the answer rounded, or held in bf16) is the mistake of no all-reduce at all, however near 1 the answer is
    shown = next((f"{right:.{d}f}" for d in range(6, 17) if f"{right:.{d}f}" != f"{1:.{d}f}"), repr(right))
    require(value != 1 or not 0.995 <= right < 1, exercise, f"`efficiency_64` = 1 is a step with no all-reduce at "
            f"all: the answer, {shown}, keeps its communication only in digits that rounding to 1 removed.",
            "leave it unrounded (a Python float), or round to as many decimals as keep it below 1.")
    # the right value as bf16 or fp16 holds it is that one, whatever mistake it lands on too (but 0: an underflow)
    if value and value in {torch.tensor(right, dtype=torch.float64).to(half).item()
                           for half in (torch.bfloat16, torch.float16)}:
        value = right
    # within one step of its last digit, yet not the answer's rounding: too close to call wrong, asked for rounded
    digits = next((d for d in range(1, 7) if float(f"{value:.{d}g}") == value), 0)
    if digits >= 2 and not accepted(value, right, through=communication):
        decimals = digits - 1 - math.floor(math.log10(abs(value)))
        require(abs(value - right) > 10.0 ** -decimals, exercise,
                f"`efficiency_64` = {value:g} is off by less than one step of its last digit: it is not the answer "
                f"rounded to {digits} digits (a digit cut off?), and too near it to tell a slip from a mistake.",
                f"round it, round(efficiency_64, {decimals}), rather than cutting digits off, or leave it unrounded.")
    verdict(value, right, exercise, "efficiency_64", mistakes,
            "efficiency = step / (step + the buckets' ring all-reduce times); "
            "t(n, p) = 2(p-1) latency + 2(p-1)/p n / bandwidth.", through=communication,
            limits=[(0 < value <= 1, "an efficiency is a fraction between 0 and 1.",
                     "efficiency = step / (step + communication).")])
    passed(exercise, f"{right:.1%} at {world_size} GPUs without overlap, over {link.name.split(',')[0].split(' (')[0]}")
    return right
