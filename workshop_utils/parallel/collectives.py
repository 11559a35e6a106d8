"""The collective operations every parallel strategy is built from, shown and timed among real ranks.

Data parallelism needs one collective (all-reduce); sharded, tensor- and pipeline-parallel
training need the others. ``show_collectives`` runs each on tiny tensors so the inputs and
outputs of every rank can be read side by side; ``time_collectives`` times each over message
sizes, where ``n`` is always the size of the *full* tensor (the one all-reduced, gathered or
scattered), so the rows compare like with like. A ring all-gather or reduce-scatter moves
half of what a ring all-reduce moves: all-reduce = reduce-scatter + all-gather.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.distributed as dist

from .comm_model import Link, bus_bandwidth_gbps, fit_link, ring_all_reduce_s
from ..spine.distributed import collective_device
from ..spine.timing import time_repeats
from ..system.errors import WorkshopError

COLLECTIVES = ("broadcast", "scatter", "gather", "all_gather", "reduce_scatter", "all_reduce")


def _rank_input(rank: int, world: int, device) -> torch.Tensor:
    """Rank r holds [10r, 10r+1, ...]: every value says which rank it came from."""
    return torch.arange(world, dtype=torch.float32, device=device) + 10 * rank


# Newer PyTorch renamed the two tensor-in, tensor-out collectives and warns on the old names in every cell.
_all_gather_tensor = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
_reduce_scatter_tensor = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor


class Collective:
    """One collective on this rank's tensor ``x`` (length divisible by the world size); root is rank 0.

    Every output buffer is allocated here, once, so that calling the object does nothing but
    communicate: a timer around the call then measures the link, not the allocator or a copy.
    """

    def __init__(self, name: str, x: torch.Tensor):
        if name not in COLLECTIVES:
            raise WorkshopError(f"Unknown collective {name!r}.", f"use one of {', '.join(COLLECTIVES)}.")
        self.name, self.x = name, x
        self.world, self.rank = dist.get_world_size(), dist.get_rank()
        share = x.numel() // self.world
        if name in ("broadcast", "all_reduce"):  # these work in place, so they get a buffer of their own
            self.out = x.clone()
        elif name in ("scatter", "reduce_scatter"):
            self.out = torch.empty(share, dtype=x.dtype, device=x.device)
            self.pieces = list(x.chunk(self.world)) if name == "scatter" and self.rank == 0 else None
        else:  # gather, all_gather: every rank contributes the first 1/p of its tensor
            self.piece = x[:share].contiguous()
            if name == "gather":
                self.parts = [torch.empty_like(self.piece) for _ in range(self.world)] if self.rank == 0 else None
            else:
                self.out = torch.empty(share * self.world, dtype=x.dtype, device=x.device)

    def refill(self) -> None:
        """Put the input back where an in-place collective overwrote it (untimed, between rounds)."""
        if self.name in ("broadcast", "all_reduce"):
            self.out.copy_(self.x)

    def __call__(self) -> None:
        name = self.name
        if name == "broadcast":
            dist.broadcast(self.out, src=0)
        elif name == "scatter":
            dist.scatter(self.out, self.pieces, src=0)
        elif name == "gather":
            dist.gather(self.piece, self.parts, dst=0)
        elif name == "all_gather":
            _all_gather_tensor(self.out, self.piece)
        elif name == "reduce_scatter":
            _reduce_scatter_tensor(self.out, self.x)
        else:
            dist.all_reduce(self.out)

    def result(self) -> torch.Tensor | None:
        """What this rank holds after the call (None where a rank receives nothing)."""
        if self.name == "gather":
            return torch.cat(self.parts) if self.rank == 0 else None
        return self.out


def run_collective(name: str, x: torch.Tensor) -> torch.Tensor | None:
    """One collective on this rank's tensor ``x``; returns what this rank holds afterwards."""
    collective = Collective(name, x)
    collective()
    return collective.result()


def _sent(name: str, x: torch.Tensor, rank: int, world: int) -> torch.Tensor | None:
    """The part of ``x`` that ``run_collective`` actually contributes, for display."""
    if name in ("broadcast", "scatter"):
        return x if rank == 0 else None
    if name in ("gather", "all_gather"):
        return x[: x.numel() // world]
    return x


def show_collectives(device=None) -> list[dict]:
    """Every collective on tiny tensors: one row per (collective, rank) with its input and output."""
    world, rank = dist.get_world_size(), dist.get_rank()
    x = _rank_input(rank, world, torch.device(device) if device is not None else collective_device())
    mine = []
    for name in COLLECTIVES:
        sent, out = _sent(name, x, rank, world), run_collective(name, x)
        mine.append({"collective": name, "rank": rank,
                     "input": "-" if sent is None else sent.int().tolist(),
                     "output": "-" if out is None else out.int().tolist()})
    everyone = [None] * world
    dist.all_gather_object(everyone, mine)
    return sorted((row for rows in everyone for row in rows), key=lambda r: (COLLECTIVES.index(r["collective"]),
                                                                              r["rank"]))


def time_collectives(sizes_bytes, names=COLLECTIVES, repeats: int = 10, device=None) -> list[dict]:
    """Median seconds per collective and full-tensor size (fp32), the slowest rank's median.

    ``device`` None: where the process group's collectives run (this rank's GPU under NCCL).
    """
    device = torch.device(device) if device is not None else collective_device()
    world = dist.get_world_size()
    rows = []
    for name in names:
        for n_bytes in sizes_bytes:
            numel = max(world, int(n_bytes) // 4 // world * world)
            collective = Collective(name, torch.ones(numel, dtype=torch.float32, device=device))

            def ready(collective=collective):  # untimed: the input back in place, every rank at the start
                collective.refill()
                dist.barrier()

            # Two untimed rounds set up connections and buffers; CUDA events on a GPU, perf_counter on a CPU.
            times = time_repeats(collective, repeats, warmup=2, device=device, before=ready)
            # Every rank waits for the slowest, so the slowest rank's median is the collective's time.
            median = torch.tensor([times.median], device=device)
            dist.all_reduce(median, op=dist.ReduceOp.MAX)
            seconds = median.item()
            rows.append({"collective": name, "size_bytes": numel * 4, "seconds": seconds, "world_size": world,
                         "bus_bandwidth_gbps": bus_bandwidth_gbps(numel * 4, seconds, world)
                         if name == "all_reduce" else None})
    return rows


def ring_time_s(name: str, n_bytes: float, world_size: int, link: Link) -> float | None:
    """The ring model for the collectives it describes; None for the rooted ones.

    A ring all-gather or reduce-scatter takes p-1 steps of n/p bytes each; an all-reduce is one
    of each, so it takes twice as long.
    """
    full = ring_all_reduce_s(n_bytes, world_size, link)
    return {"all_reduce": full, "all_gather": full / 2, "reduce_scatter": full / 2}.get(name)


def collective_table(rows: list[dict], link: Link | None = None):
    """Measured times as a DataFrame, one column per collective (ms), with the ring model where it applies."""
    import pandas as pd

    frame = pd.DataFrame(rows)
    if link is None:
        link = fit_all_reduce(rows)
    frame["model_seconds"] = [ring_time_s(r.collective, r.size_bytes, r.world_size, link) for r in frame.itertuples()]
    frame["measured_over_model"] = frame.seconds / frame.model_seconds.astype(float)
    return frame


def fit_all_reduce(rows: list[dict]) -> Link:
    """Latency and bandwidth of the ring model, fitted to the all-reduce rows alone."""
    ar = [r for r in rows if r["collective"] == "all_reduce"]
    return fit_link([r["size_bytes"] for r in ar], [r["seconds"] for r in ar], ar[0]["world_size"],
                    f"fitted to {ar[0]['world_size']}-rank all-reduce")


def plot_collective_times(rows: list[dict], link: Link | None = None):
    """Time against message size for every collective (log-log), the ring model as labelled lines beside them.

    All-gather and reduce-scatter share one model line (half an all-reduce); the title's second line
    says how far the largest message's measurement sits from the model.
    """
    import matplotlib.pyplot as plt

    from ..system.plotstyle import style

    link = link or fit_all_reduce(rows)
    p = rows[0]["world_size"]
    with style():
        fig, (ax_time, ax_bw) = plt.subplots(1, 2, figsize=(12, 4.4))
        models, ratios = {}, []
        for name in COLLECTIVES:
            mine = sorted((r for r in rows if r["collective"] == name), key=lambda r: r["size_bytes"])
            if not mine:
                continue
            sizes = np.array([r["size_bytes"] for r in mine], float)
            seconds = np.array([r["seconds"] for r in mine], float)
            points, = ax_time.loglog(sizes / 2**20, seconds * 1e3, "o", label=f"{name} (measured)")
            ax_bw.semilogx(sizes / 2**20, sizes / seconds / 1e9, "o-", color=points.get_color(),
                           label=f"{name} (measured)")
            model = ring_time_s(name, sizes[-1], p, link)
            if model is not None:
                models.setdefault("all_reduce" if name == "all_reduce" else "half", (sizes, name))
                ratios.append(f"{name} {seconds[-1] / model:.2g}x")
        for kind, (sizes, name) in models.items():
            times = np.array([ring_time_s(name, n, p, link) for n in sizes]) * 1e3
            label = ("ring model: all-reduce" if kind == "all_reduce" else
                     "ring model: all-gather and reduce-scatter (half an all-reduce)")
            ax_time.loglog(sizes / 2**20, times, "-" if kind == "all_reduce" else "--", color="0.35", label=label)
        ax_time.set(xlabel="full tensor size (MiB, log scale)", ylabel="time per call (ms, log scale)",
                    title=f"{p} ranks; model fitted to all-reduce: {link.latency_us:.0f} us, "
                          + (f"{link.bandwidth_gbps:.2f} GB/s" if np.isfinite(link.bandwidth_gbps)
                             else "no bandwidth (times do not grow with size)"))
        ax_bw.set(xlabel="full tensor size (MiB, log scale)", ylabel="algorithm bandwidth n / t (GB/s)",
                  title="Small messages are bound by latency", ylim=(0, None))
        # One legend for both panels, below them: a collective has the same colour in each.
        fig.legend(*ax_time.get_legend_handles_labels(), loc="lower center", ncol=4, fontsize=8.5,
                   bbox_to_anchor=(0.5, -0.02))
        if ratios:
            fig.suptitle("Measured against the ring model at the largest size: " + ", ".join(ratios))
        fig.tight_layout(rect=(0, 0.12, 1, 1))
    return fig


def collectives_frame(rows: list[dict]):
    """``show_collectives`` rows as one table: a row per collective, a column per rank, "input -> output"."""
    import pandas as pd

    def fmt(value):
        return "-" if value == "-" else "[" + " ".join(str(v) for v in value) + "]"

    frame = pd.DataFrame({"collective": r["collective"], "rank": f"rank {r['rank']}",
                          "cell": f"{fmt(r['input'])} -> {fmt(r['output'])}"} for r in rows)
    table = frame.pivot(index="collective", columns="rank", values="cell")
    return table.reindex([c for c in COLLECTIVES if c in table.index]).rename_axis(columns=None)


def measure_all_reduce(sizes_bytes, repeats: int = 10, device: torch.device | None = None) -> list[dict]:
    """Median time of an all-reduce (sum, fp32) per size, in an initialised process group.

    ``device`` None: where the process group's collectives run (this rank's GPU under NCCL).
    """

    if not (dist.is_available() and dist.is_initialized()):
        raise WorkshopError("measure_all_reduce needs a process group.",
                            "run `torchrun --nproc-per-node=2 -m workshop_utils.comm_model`.")
    # Under NCCL the buffers must be on this rank's GPU; a CPU default would fail in the first all-reduce.
    rows = time_collectives(sizes_bytes, ("all_reduce",), repeats, device or collective_device())
    return [{key: row[key] for key in ("size_bytes", "seconds", "world_size", "bus_bandwidth_gbps")} for row in rows]
