"""How much of DDP's all-reduce the backward pass hides: exposed communication, measured.

DDP all-reduces each gradient bucket as soon as the backward pass has filled it, while the
backward pass goes on computing the gradients of earlier layers. ``measure_overlap`` times three
things on every rank of a torchrun job, for each bucket size, interleaved repeat by repeat so that a
slow moment of a shared machine touches all three alike:

* **compute**: the backward pass as DDP runs it (gradients copied into buckets), with each
  bucket's all-reduce held back by a communication hook;
* **communication**: those same buckets all-reduced right after, one after another with nothing
  beside them;
* **overlapped**: the backward pass as DDP runs it, all-reduces inside.

``exposed = overlapped - compute`` is what the backward pass did not hide, the time a step would
gain without communication; ``hidden = communication - exposed``. Each is a median of per-repeat
differences with its middle half (25th to 75th percentile) beside it; where that middle half holds
zero, the difference is too small to measure on this machine, and the sentences say so. Every time
is the slowest rank's: a step ends when the last rank's does.

On CPUs gloo's threads do the all-reduce and compete for the cores with the backward pass, so the
overlapped pass can take longer than compute and communication one after the other; on GPUs
NCCL's kernels share the streaming multiprocessors with the backward kernels. Notebook 02 shows
each bucket size's three times side by side (``plot_overlap``).
"""

from __future__ import annotations

import copy

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

from ..spine.timing import RegionTimer, native_noise_filtered, profiler
from ..spine.precision import autocast
from ..system.hardware import PRECISIONS
from ..system.errors import WorkshopError, choose

PHASES = ("compute", "communication", "overlapped")


class _Buckets:
    """A communication hook's state: all-reduce each bucket (DDP's default) or keep it for later."""

    def __init__(self):
        self.hold = False
        self.held: list[torch.Tensor] = []


def _all_reduce_or_hold(state: _Buckets, bucket):
    if not state.hold:
        return default_hooks.allreduce_hook(None, bucket)
    # The buffer is DDP's own, reused only in the next backward pass: the all-reduces that time it run before that.
    state.held.append(bucket.buffer())
    done = torch.futures.Future()
    done.set_result(bucket.buffer())
    return done


def _all_reduce_held(state: _Buckets) -> None:
    """The held buckets all-reduced as DDP would: all started at once, queued one after another."""
    works = [dist.all_reduce(buffer, async_op=True) for buffer in state.held]
    for work in works:
        work.wait()


def measure_overlap(size: str = "tiny", batch: int = 8, sequence: int = 64, bucket_caps=(25.0, 1.0, 0.25),
                    repeats: int = 10, warmup: int = 2, seed: int = 0, trace: str | None = None, device=None,
                    data_root=None, precision: str | None = None) -> dict:
    """Compute, communication and both overlapped, per bucket size, for the GPT under DDP on every rank.

    Each rank trains on its own ``batch`` windows of the corpus. ``trace``: a file for rank 0's profiler
    trace of one more overlapped backward pass with the smallest buckets (Chrome trace format: Perfetto
    shows the all-reduces beside the backward pass). ``device`` None: where the process group's
    collectives run (this rank's GPU under NCCL).
    """
    from torch.nn.parallel import DistributedDataParallel

    from ..spine.distributed import collective_device
    from ..spine.gpt import GPT_SIZES, build_gpt
    from ..spine.text import first_windows, load_text

    choose(size, tuple(GPT_SIZES), "size")
    caps = [float(cap) for cap in bucket_caps]
    if min(batch, sequence, repeats) < 1 or warmup < 0 or not caps or min(caps) <= 0:
        raise WorkshopError(f"batch={batch}, sequence={sequence}, repeats={repeats}, warmup={warmup}, "
                            f"bucket_caps={list(bucket_caps)}: each must be positive.",
                            "use e.g. batch=8, sequence=64, repeats=10, warmup=2, bucket_caps=[25, 1, 0.25].")
    if sequence > GPT_SIZES[size].context:
        raise WorkshopError(f"sequence={sequence} is longer than the {size} GPT's context.",
                            f"use at most {GPT_SIZES[size].context} tokens.")
    device = torch.device(device) if device is not None else collective_device()
    # On GPUs the precision the course trains in: an fp32 backward pass would be several times the one that
    # the all-reduce must hide behind, and the measurement would find the communication hidden for that reason.
    precision = precision or ("bf16" if device.type == "cuda" else "fp32")
    choose(precision, PRECISIONS, "precision")
    rank, world = dist.get_rank(), dist.get_world_size()
    data = load_text(data_root, quiet=True)
    data.check_vocabulary(GPT_SIZES[size].vocab)
    inputs, targets = first_windows(data.train_tokens, sequence, batch * world, device)
    inputs, targets = inputs[rank::world], targets[rank::world]

    torch.manual_seed(seed)
    start = build_gpt(size).to(device)
    models, hooks = [], []
    for cap in caps:
        model = DistributedDataParallel(copy.deepcopy(start), device_ids=[device.index] if device.type == "cuda" else None,
                                        bucket_cap_mb=cap)
        hooks.append(_Buckets())
        model.register_comm_hook(hooks[-1], _all_reduce_or_hold)
        models.append(model)

    timers = {(phase, cap): RegionTimer(device, warmup=warmup) for phase in PHASES for cap in caps}
    buckets = {}

    def backward(model, timer) -> None:
        model.zero_grad(set_to_none=True)
        with autocast(precision, device):
            loss = F.cross_entropy(model(inputs).flatten(0, 1).float(), targets.flatten())
        dist.barrier()  # every rank starts its backward pass together, as in a step
        with timer:
            loss.backward()

    for _ in range(warmup + repeats):
        for cap, model, hook in zip(caps, models, hooks):
            hook.hold, hook.held = True, []
            backward(model, timers["compute", cap])
            dist.barrier()
            with timers["communication", cap]:
                _all_reduce_held(hook)
            buckets[cap] = [buffer.numel() * buffer.element_size() for buffer in hook.held]
            hook.hold = False
            backward(model, timers["overlapped", cap])

    if trace:
        _trace_one_backward(models[caps.index(min(caps))], backward, device, trace if rank == 0 else None)

    # The slowest rank's time, repeat by repeat.
    seconds = torch.tensor(np.array([[timers[phase, cap].times().seconds for cap in caps] for phase in PHASES]),
                           dtype=torch.float64, device=device)
    dist.all_reduce(seconds, op=dist.ReduceOp.MAX)
    seconds = seconds.cpu().numpy()
    rows = []
    for i, cap in enumerate(caps):
        compute, communication, overlapped = (1e3 * seconds[p, i] for p in range(len(PHASES)))
        exposed = overlapped - compute
        rows.append({"bucket_cap_mb": cap, "buckets": len(buckets[cap]),
                     "gradient_mib": sum(buckets[cap]) / 2**20,
                     **{f"{name}_ms": float(np.median(values)) for name, values in
                        (("compute", compute), ("communication", communication), ("overlapped", overlapped))},
                     "exposed_ms": float(np.median(exposed)),
                     "exposed_p25_ms": float(np.percentile(exposed, 25)),
                     "exposed_p75_ms": float(np.percentile(exposed, 75)),
                     "repeats": repeats})
    return {"kind": "ddp_overlap", "model": f"GPT {size}", "size": size, "batch": batch, "sequence": sequence,
            "precision": precision,
            "world_size": world, "data_source": data.source, "corpus": data.fingerprint(), "rows": rows,
            "trace": trace, "traced_bucket_cap_mb": min(caps) if trace else None}


def _trace_one_backward(model, backward, device, path) -> None:
    """One overlapped backward pass on every rank; rank 0 (``path`` not None) records it with the profiler."""
    from pathlib import Path

    from torch.profiler import ProfilerActivity

    if path is None:
        backward(model, RegionTimer(device))
        return
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with native_noise_filtered():  # what a CUDA build's profiler prints on a machine without a GPU, held back
        with profiler(activities=activities) as prof:
            backward(model, RegionTimer(device))
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        prof.export_chrome_trace(str(path))


def overlap_table(record: dict):
    """One row per bucket size: the three medians, the exposed time and its middle half, the hidden share (empty
    for a single bucket)."""
    import pandas as pd

    table = pd.DataFrame(record["rows"])
    # One bucket cannot overlap (it is full when the backward pass ends): no share of it was hidden, whatever the noise.
    can_overlap = table.buckets > 1
    table["hidden_ms"] = (table.communication_ms - table.exposed_ms).where(can_overlap)
    table["hidden_share"] = (table.hidden_ms / table.communication_ms).where(can_overlap)
    return table[["bucket_cap_mb", "buckets", "gradient_mib", "compute_ms", "communication_ms", "overlapped_ms",
                  "exposed_ms", "exposed_p25_ms", "exposed_p75_ms", "hidden_ms", "hidden_share"]]


def overlap_sentence(row) -> str:
    """What one bucket size's measurement shows, in one line that claims no more than the spread allows."""
    head = (f"{row.bucket_cap_mb:g} MiB buckets ({row.buckets} of them): backward {row.compute_ms:.1f} ms, "
            f"their all-reduces alone {row.communication_ms:.1f} ms, both together {row.overlapped_ms:.1f} ms")
    spread = f"middle half {row.exposed_p25_ms:+.1f} to {row.exposed_p75_ms:+.1f} ms"
    if row.buckets == 1:  # full only when the backward pass ends: there is nothing for it to overlap with
        noise = ", within this machine's noise" if row.exposed_p25_ms <= 0 <= row.exposed_p75_ms else ""
        return (f"{head}: one bucket is full only when the backward pass ends, so nothing can overlap; both together "
                f"took {row.exposed_ms:+.1f} ms over the backward pass alone ({spread}{noise})")
    if row.exposed_p25_ms <= 0 <= row.exposed_p75_ms:
        return (f"{head}: the {row.exposed_ms:+.1f} ms between the backward pass alone and both together is within "
                f"this machine's noise ({spread}), no exposed time measurable here")
    if row.exposed_p75_ms < 0:
        return (f"{head}: together faster than the backward pass alone ({spread}), a machine whose speed moved "
                "between the repeats; measure again")
    exposed = f"{row.exposed_ms:.1f} ms exposed ({spread})"
    if row.exposed_ms > row.communication_ms:
        return (f"{head}: {exposed}, more than the all-reduces alone take: running beside the backward pass, "
                "they slowed it down (they compete for the same cores or GPU)")
    return f"{head}: {exposed}, so {1 - row.exposed_ms / row.communication_ms:.0%} of the communication was hidden"


def plot_overlap(record: dict):
    """Per bucket size, two bars: backward then its all-reduces one after the other, and DDP's overlapped pass."""
    import matplotlib.pyplot as plt
    import numpy as np

    from ..system.plotstyle import PALETTE, style

    table = overlap_table(record)
    x = np.arange(len(table))
    with style():
        fig, ax = plt.subplots(figsize=(8, 4.5))
        ax.bar(x - 0.2, table.compute_ms, 0.38, color=PALETTE[0], label="backward, all-reduces held back")
        ax.bar(x - 0.2, table.communication_ms, 0.38, bottom=table.compute_ms, color=PALETTE[1],
               label="then the all-reduces alone")
        ax.bar(x + 0.2, table.overlapped_ms, 0.38, color=PALETTE[2], label="DDP: both overlapped")
        ax.set_xticks(x, [f"{row.bucket_cap_mb:g} MiB\n({row.buckets} bucket{'s' * (row.buckets > 1)})"
                          for row in table.itertuples()])
        ax.set(xlabel="bucket_cap_mb (DDP's buckets of the gradients)",
               ylabel="ms per backward pass (slowest rank, median)")
        tallest = max(table.compute_ms.add(table.communication_ms).max(), table.overlapped_ms.max())
        ax.set_ylim(0, 1.3 * tallest)  # room for the legend above the bars
        ax.legend(loc="upper center", ncol=3, fontsize=8)
        exposed = ", ".join(f"{row.exposed_ms:.1f} ms ({row.bucket_cap_mb:g} MiB)" for row in table.itertuples())
        ax.set_title(f"{record['model']} on {record['world_size']} ranks, how much of the all-reduce hides:\n"
                     f"exposed {exposed}")
        fig.tight_layout()
    return fig
