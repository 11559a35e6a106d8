"""Pipeline parallelism: consecutive layers on consecutive ranks, fed with micro-batches (GPipe).

Stage s holds one slice of the layers. A batch is cut into m micro-batches; stage s runs the
forward pass of micro-batch i as soon as stage s-1 has sent its activations, and after the
last forward the backward passes flow the other way, gradients of the activations going back
by point-to-point send/recv. While the pipeline fills and drains, some stages have nothing to
do: with p equal stages the idle share of each stage, the **bubble**, is (p-1)/(m+p-1).

``gpipe_step`` runs one such step on every rank and records when each stage computed what;
``measure_bubble`` repeats it for several m and compares the measured idle share with the
formula. The schedule is written out by hand so that it can be read; for real work
``torch.distributed.pipelining`` provides it (``ScheduleGPipe``) and others: 1F1B has the same
bubble for the same m but holds at most p micro-batches' activations instead of m; interleaved
1F1B (v stages per rank) divides the bubble by v; zero-bubble schedules fill it with the
weight-gradient part of the backward pass.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from ..system.errors import WorkshopError
from ..spine.timing import StepTimer


def bubble_fraction(stages: int, microbatches: int) -> float:
    """GPipe's idle share of each stage for equal stages: (p-1)/(m+p-1)."""
    return (stages - 1) / (microbatches + stages - 1)


def build_full_model(stages: int, layers_per_stage: int, width: int, classes: int = 10, seed: int = 0) -> nn.Sequential:
    """An MLP of stages x layers_per_stage equal blocks and a classifier: the same on every rank."""
    torch.manual_seed(seed)
    blocks = [nn.Sequential(nn.Linear(width, width), nn.ReLU()) for _ in range(stages * layers_per_stage)]
    return nn.Sequential(*blocks, nn.Linear(width, classes))


def stage_of(full: nn.Sequential, stage: int, stages: int) -> nn.Sequential:
    """The layers of ``stage``: an equal share of the blocks; the last stage also keeps the classifier."""
    per = (len(full) - 1) // stages
    layers = list(full)[stage * per:(stage + 1) * per]
    if stage == stages - 1:
        layers.append(full[-1])
    return nn.Sequential(*layers)


def gpipe_step(stage: nn.Module, inputs: torch.Tensor | None, labels: torch.Tensor, microbatches: int,
               width: int, device) -> tuple[list[dict], float | None]:
    """One GPipe step (all forwards, then all backwards) on this rank; returns its timeline and the loss.

    ``inputs`` is the whole batch on stage 0 (None elsewhere); the last stage reads ``labels``.
    Times are seconds from the barrier that starts the step; waiting for a neighbour is not
    counted as work.
    """
    rank, stages = dist.get_rank(), dist.get_world_size()
    first, last = rank == 0, rank == stages - 1
    rows = labels.shape[0] // microbatches
    # StepTimer marks the start and end of every pass: CUDA events on a GPU, read once after the
    # step, so the step itself has no host sync; an event after a recv fires only when the data
    # is there, so waiting is not counted as work. On a CPU it reads the clock.
    clock, passes = StepTimer(device), []
    sends, kept = [], []
    loss_sum = torch.zeros((), device=device)
    dist.barrier()
    clock.begin()

    def timed(kind, index, work):
        clock.step_done(2 * len(passes))
        result = work()
        clock.step_done(2 * len(passes) + 1)
        passes.append((kind, index))
        return result

    for i in range(microbatches):
        if first:
            x = inputs[i * rows:(i + 1) * rows]
        else:
            x = torch.empty(rows, width, device=device)
            dist.recv(x, src=rank - 1)
            x.requires_grad_(True)
        y = timed("F", i, lambda: stage(x))
        if last:
            y = timed("F", i, lambda: F.cross_entropy(y, labels[i * rows:(i + 1) * rows]) / microbatches)
            loss_sum += y.detach()  # read after the step: an .item() here would wait for the GPU
        else:
            outgoing = y.detach().contiguous()
            sends.append((dist.isend(outgoing, dst=rank + 1), outgoing))  # keep the tensor alive until sent
        kept.append((x, y))
    for i in reversed(range(microbatches)):  # GPipe drains in reverse order
        x, y = kept[i]
        if last:
            timed("B", i, lambda: y.backward())
        else:
            grad = torch.empty_like(y)
            dist.recv(grad, src=rank + 1)
            timed("B", i, lambda: y.backward(grad))
        if not first:
            outgoing = x.grad.contiguous()
            sends.append((dist.isend(outgoing, dst=rank - 1), outgoing))
    for handle, _ in sends:
        handle.wait()
    marks = np.cumsum(clock.step_times())  # seconds from the step's start to every mark
    timeline = [{"stage": rank, "pass": kind, "microbatch": index, "start": float(marks[2 * n]),
                 "end": float(marks[2 * n + 1])} for n, (kind, index) in enumerate(passes)]
    return timeline, (loss_sum.item() if last else None)


def _merge_spans(timeline: list[dict]) -> list[dict]:
    """One entry per (pass, micro-batch): the last stage's loss is part of its forward."""
    merged: dict[tuple, dict] = {}
    for row in timeline:
        key = (row["pass"], row["microbatch"])
        if key in merged:
            merged[key]["start"] = min(merged[key]["start"], row["start"])
            merged[key]["end"] = max(merged[key]["end"], row["end"])
        else:
            merged[key] = dict(row)
    return list(merged.values())


def measure_bubble(microbatch_counts=(1, 2, 4, 8), batch: int = 256, width: int = 1024, layers_per_stage: int = 2,
                   repeats: int = 3, seed: int = 0, device=None) -> dict:
    """Measured idle share of the stages against (p-1)/(m+p-1), and the pipeline's gradients checked.

    ``device`` None: where the process group's collectives run (this rank's GPU under NCCL).
    """
    from ..spine.distributed import collective_device

    microbatch_counts = list(microbatch_counts)
    bad = [m for m in microbatch_counts if not (isinstance(m, int) and 0 < m <= batch and batch % m == 0)]
    if bad or not microbatch_counts:
        raise WorkshopError(f"A batch of {batch} does not split into {bad or 'no'} equal micro-batches.",
                            "use micro-batch counts that divide the batch, e.g. 1, 2, 4, 8.")
    if repeats < 1:
        raise WorkshopError(f"repeats={repeats}: at least one timed step per micro-batch count is needed.",
                            "use repeats=3.")
    device = torch.device(device) if device is not None else collective_device()
    rank, stages = dist.get_rank(), dist.get_world_size()
    full = build_full_model(stages, layers_per_stage, width, seed=seed).to(device)
    stage = stage_of(full, rank, stages)
    generator = torch.Generator().manual_seed(seed + 1)
    inputs = torch.randn(batch, width, generator=generator).to(device)
    labels = torch.randint(0, 10, (batch,), generator=generator).to(device)
    rows, timelines = [], {}
    for m in microbatch_counts:
        spans = []
        for attempt in range(repeats + 1):  # the first step warms up allocator and connections
            stage.zero_grad(set_to_none=True)
            timeline, _ = gpipe_step(stage, inputs if rank == 0 else None, labels, m, width, device)
            if attempt:
                spans.append(_merge_spans(timeline))
        # The step lasts until the slowest stage finishes; busy is this stage's computing.
        steps = torch.tensor([max(r["end"] for r in s) for s in spans], dtype=torch.float64, device=device)
        dist.all_reduce(steps, op=dist.ReduceOp.MAX)
        steps = steps.cpu().numpy()
        busy = np.array([sum(r["end"] - r["start"] for r in s) for s in spans])
        idle = torch.tensor(float(np.median(1 - busy / steps)), dtype=torch.float64, device=device)
        dist.all_reduce(idle)
        rows.append({"microbatches": m, "microbatch_size": batch // m, "stages": stages,
                     "step_ms": 1e3 * float(np.median(steps)),
                     "bubble_measured": idle.item() / stages, "bubble_formula": bubble_fraction(stages, m)})
        everyone = [None] * stages
        dist.all_gather_object(everyone, spans[-1])  # a few dozen numbers per stage
        timelines[str(m)] = [row for stage_rows in everyone for row in stage_rows]
    return {"kind": "pipeline", "stages": stages, "batch": batch, "width": width, "layers_per_stage": layers_per_stage,
            "rows": rows, "timelines": timelines,
            "gradient_max_abs_difference": _check_gradients(full, stage, inputs, labels, width, device)}


def gradient_difference(ours, reference) -> float:
    """The largest absolute difference between two lists of gradients, pair by pair."""
    ours, reference = list(ours), list(reference)
    if len(ours) != len(reference) or any(a.shape != b.shape for a, b in zip(ours, reference)):
        raise WorkshopError("The two gradient lists do not match parameter for parameter.",
                            "compare a stage with the same stage of the unsplit model (stage_of).")
    return max(((a - b).abs().max().item() for a, b in zip(ours, reference)), default=0.0)


def _check_gradients(full, stage, inputs, labels, width, device, microbatches: int = 4) -> float:
    """A 4-micro-batch pipeline step's gradients against the unsplit model's on the whole batch.

    Every rank holds the same unsplit model and input, so each computes the reference itself
    and compares its own stage only: one number per rank crosses the network, not every
    stage's gradients to every rank. ``stage`` shares its layers with ``full``, so the pipeline's
    gradients are copied before the reference pass overwrites them.
    """
    rank = dist.get_rank()
    stage.zero_grad(set_to_none=True)
    gpipe_step(stage, inputs if rank == 0 else None, labels, microbatches, width, device)
    pipelined = [p.grad.detach().clone() for p in stage.parameters()]
    full.zero_grad(set_to_none=True)
    F.cross_entropy(full(inputs), labels).backward()
    worst = torch.tensor(gradient_difference(pipelined, [p.grad for p in stage.parameters()]),
                         dtype=torch.float64, device=device)
    dist.all_reduce(worst, op=dist.ReduceOp.MAX)
    full.zero_grad(set_to_none=True)
    return worst.item()


def bubble_table(record: dict):
    import pandas as pd

    return pd.DataFrame(record["rows"])


def plot_pipeline(record: dict, show=(1, 4)):
    """Gantt charts of the measured schedule for a few micro-batch counts, and the bubble against the formula.

    The title states the finding: the measured bubble (idle share of a stage) at the fewest and the most
    micro-batches, with the formula's value beside it.
    """
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    from ..system.plotstyle import PALETTE, style

    show = [m for m in show if str(m) in record["timelines"]]
    table = bubble_table(record).sort_values("microbatches")
    measured = {int(r["microbatches"]): r["bubble_measured"] for r in record["rows"]}
    passes = {"F": ("forward", PALETTE[0], "white"), "B": ("backward", PALETTE[1], "black")}
    stages = record["stages"]
    with style():
        fig, axes = plt.subplots(1, len(show) + 1, figsize=(5 * (len(show) + 1), 3.8), squeeze=False)
        axes = axes[0]
        for ax, m in zip(axes, show):
            for row in record["timelines"][str(m)]:
                name, color, text_color = passes[row["pass"]]
                width = 1e3 * (row["end"] - row["start"])
                ax.barh(row["stage"], width, left=1e3 * row["start"], color=color, edgecolor="white")
                ax.text(1e3 * row["start"] + width / 2, row["stage"], f"{row['pass']}{row['microbatch'] + 1}",
                        ha="center", va="center", fontsize=7, color=text_color)
            idle = f", {measured[m]:.0%} idle" if m in measured else ""
            ax.set(xlabel="time since the step began (ms)", ylabel="pipeline stage (one rank each)",
                   yticks=range(stages), yticklabels=[f"stage {s}" for s in range(stages)],
                   title=f"m = {m} micro-batches{idle}")
            ax.grid(axis="y", visible=False)
            ax.invert_yaxis()
            ax.legend(handles=[Patch(color=color, label=f"{name} pass ({key})")
                               for key, (name, color, _) in passes.items()], loc="best")
        ax = axes[-1]
        ax.plot(table.microbatches, 100 * table.bubble_formula, "k--", label="formula (p-1)/(m+p-1)")
        ax.plot(table.microbatches, 100 * table.bubble_measured, "o-", color=PALETTE[2], label="measured")
        ax.set_xscale("log", base=2)
        ax.xaxis.set_minor_locator(plt.NullLocator())
        ax.set(xlabel="micro-batches per step (m)", ylabel="idle share of a stage (%)", ylim=(0, 100),
               xticks=list(table.microbatches), xticklabels=list(table.microbatches), title="The bubble")
        ax.legend()
        few, many = table.iloc[0], table.iloc[-1]
        finding = (f"bubble {few.bubble_measured:.0%} of the step at m = {few.microbatches:.0f} "
                   f"(formula {few.bubble_formula:.0%})")
        if len(table) > 1:
            finding += (f", {many.bubble_measured:.0%} at m = {many.microbatches:.0f} "
                        f"(formula {many.bubble_formula:.0%})")
        fig.suptitle(f"GPipe on {stages} stages: {finding}")
        fig.tight_layout()
    return fig
