"""Pipeline parallelism: consecutive layers on consecutive ranks, fed with micro-batches (GPipe).

Stage s holds one slice of the layers. A batch is cut into m micro-batches; stage s runs the
forward pass of micro-batch i as soon as stage s-1 has sent its activations, and after the
last forward the backward passes flow the other way, gradients of the activations going back
by point-to-point send/recv. While the pipeline fills and drains, some stages have nothing to
do: with p equal stages the idle share of each stage, the **bubble**, is (p-1)/(m+p-1).

``gpipe_step`` runs one such step on every rank and records when each stage computed what;
``measure_bubble`` repeats it for several m and compares the measured idle share with the
formula. The schedule is written out by hand so that it can be read; for real work
``torch.distributed.pipelining`` provides the same schedule (``ScheduleGPipe``) and better ones
(1F1B, interleaved, zero-bubble).
"""

from __future__ import annotations

import time

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn


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
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    timeline, sends, kept, loss_sum = [], [], [], 0.0
    dist.barrier()
    start = time.perf_counter()

    def timed(kind, index, work):
        sync()
        began = time.perf_counter()
        result = work()
        sync()
        timeline.append({"stage": rank, "pass": kind, "microbatch": index, "start": began - start,
                         "end": time.perf_counter() - start})
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
            loss_sum += y.item()
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
    return timeline, (loss_sum if last else None)


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
    """Measured idle share of the stages against (p-1)/(m+p-1), and the pipeline's gradients checked."""
    device = device or torch.device("cpu")
    rank, stages = dist.get_rank(), dist.get_world_size()
    full = build_full_model(stages, layers_per_stage, width, seed=seed).to(device)
    stage = stage_of(full, rank, stages)
    generator = torch.Generator().manual_seed(seed + 1)
    inputs = torch.randn(batch, width, generator=generator).to(device)
    labels = torch.randint(0, 10, (batch,), generator=generator).to(device)
    rows, timelines = [], {}
    for m in microbatch_counts:
        if batch % m:
            raise ValueError(f"batch {batch} does not split into {m} equal micro-batches")
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
        dist.all_gather_object(everyone, spans[-1])
        timelines[str(m)] = [row for stage_rows in everyone for row in stage_rows]
    return {"kind": "pipeline", "stages": stages, "batch": batch, "width": width, "layers_per_stage": layers_per_stage,
            "rows": rows, "timelines": timelines,
            "gradient_max_abs_difference": _check_gradients(full, stage, inputs, labels, width, device)}


def _check_gradients(full, stage, inputs, labels, width, device) -> float | None:
    """A 4-micro-batch pipeline step's gradients against the unsplit model's on the whole batch (rank 0)."""
    rank, stages = dist.get_rank(), dist.get_world_size()
    stage.zero_grad(set_to_none=True)
    gpipe_step(stage, inputs if rank == 0 else None, labels, 4, width, device)
    grads = [None] * stages
    dist.all_gather_object(grads, [p.grad.cpu() for p in stage.parameters()])
    if rank != 0:
        return None
    full.zero_grad(set_to_none=True)
    F.cross_entropy(full(inputs), labels).backward()
    pipelined = [g for stage_grads in grads for g in stage_grads]
    reference = [p.grad.cpu() for s in range(stages) for p in stage_of(full, s, stages).parameters()]
    return max((a - b).abs().max().item() for a, b in zip(pipelined, reference))


def bubble_table(record: dict):
    import pandas as pd

    return pd.DataFrame(record["rows"])


def plot_pipeline(record: dict, show=(1, 4)):
    """Gantt charts of the measured schedule for a few micro-batch counts, and the bubble against the formula."""
    import matplotlib.pyplot as plt

    show = [m for m in show if str(m) in record["timelines"]]
    fig, axes = plt.subplots(1, len(show) + 1, figsize=(5 * (len(show) + 1), 3.4))
    colours = {"F": "tab:blue", "B": "tab:orange"}
    for ax, m in zip(axes, show):
        timeline = record["timelines"][str(m)]
        for row in timeline:
            width = 1e3 * (row["end"] - row["start"])
            ax.barh(row["stage"], width, left=1e3 * row["start"], color=colours[row["pass"]], edgecolor="white")
            ax.text(1e3 * row["start"] + width / 2, row["stage"], f"{row['pass']}{row['microbatch'] + 1}",
                    ha="center", va="center", fontsize=7, color="white")
        ax.set(xlabel="ms", yticks=range(record["stages"]), yticklabels=[f"stage {s}" for s in range(record["stages"])],
               title=f"m = {m} micro-batches")
        ax.invert_yaxis()
    table = bubble_table(record)
    axes[-1].plot(table.microbatches, table.bubble_formula, "k--", label="(p-1)/(m+p-1)")
    axes[-1].plot(table.microbatches, table.bubble_measured, "o-", label="measured")
    axes[-1].set_xscale("log", base=2)
    axes[-1].xaxis.set_minor_locator(plt.NullLocator())
    axes[-1].set(xlabel="micro-batches m", ylabel="idle share of a stage", ylim=(0, 1),
                 xticks=list(table.microbatches), xticklabels=list(table.microbatches), title="The bubble")
    axes[-1].legend()
    fig.tight_layout()
    return fig
