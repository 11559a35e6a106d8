"""How much does DDP's gradient all-reduce cost, here and on a large cluster?

A ring all-reduce of ``n`` bytes over ``p`` processes takes ``2(p-1)`` steps; in each
step every process sends ``n/p`` bytes to its neighbour. With a per-step latency
``alpha`` and a per-process link bandwidth ``B``::

    t(n, p) = 2(p-1) * alpha + 2(p-1)/p * n / B

The second term tends to ``2n/B``: the bandwidth cost hardly grows with ``p``, the
latency term does. We measure ``t`` for several sizes on the link the training ranks
use (``python -m workshop_utils.comm_model`` under torchrun: NCCL between GPUs, gloo
between CPU processes), fit ``alpha`` and ``B``, and predict the step time of
data-parallel training at any scale from the measured single-device step time and the
gradient size, with published link figures as inputs where no link can be measured.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..system.errors import WorkshopError


@dataclass(frozen=True)
class Link:
    name: str
    bandwidth_gbps: float  # GB/s per process and direction: what one ring step can use
    latency_us: float  # per ring step
    source: str


# Nominal figures, the inputs of the predictions. Vendors quote bidirectional totals; a ring uses one direction.
LINKS = {
    "nvlink4": Link("NVLink 4 (H100 SXM, within a node)", 450.0, 3.0,
                    "NVIDIA H100 data sheet: 900 GB/s NVLink per GPU, bidirectional -> 450 GB/s each way; "
                    "latency: order of magnitude of NCCL's small-message ring steps (nccl-tests), assumed"),
    "ib_ndr": Link("InfiniBand NDR, one 400 Gb/s NIC per GPU (between nodes)", 50.0, 5.0,
                   "NVIDIA DGX H100 user guide: 8 ConnectX-7 NDR 400 Gb/s ports per node, one per GPU; "
                   "400 Gb/s = 50 GB/s each way; latency ~1 us per switch hop plus software, assumed 5 us"),
}


def ring_all_reduce_s(n_bytes: float, world_size: int, link: Link) -> float:
    """Ring all-reduce time from the alpha-beta model above (0 for one process)."""
    p = world_size
    if p <= 1:
        return 0.0
    return 2 * (p - 1) * link.latency_us * 1e-6 + 2 * (p - 1) / p * n_bytes / (link.bandwidth_gbps * 1e9)


def bus_bandwidth_gbps(n_bytes: float, seconds: float, world_size: int) -> float:
    """nccl-tests' "bus bandwidth": the algorithm bandwidth n/t scaled by 2(p-1)/p, comparable across p."""
    return n_bytes / seconds * 2 * (world_size - 1) / world_size / 1e9


def fit_link(sizes_bytes, seconds, world_size: int, name: str = "measured") -> Link:
    """Least-squares alpha and B from measured all-reduce times (needs two or more sizes, p >= 2)."""
    if world_size < 2 or len(sizes_bytes) < 2:
        raise WorkshopError("Fitting a link needs all-reduce times from 2+ processes at 2+ sizes.",
                            "measure with torchrun --nproc-per-node=2 or more.")
    seconds = np.asarray(seconds, float)
    # Weights 1/t fit relative error, so the small messages that reveal the latency count as much as the large.
    slope, intercept = np.polyfit(np.asarray(sizes_bytes, float), seconds, 1, w=1 / seconds)
    p = world_size
    latency = max(intercept, 0.0) / (2 * (p - 1))
    bandwidth = 2 * (p - 1) / p / slope if slope > 0 else float("inf")
    return Link(name, bandwidth / 1e9, latency * 1e6, f"fitted to all-reduce times measured on {p} processes")


# DistributedDataParallel's defaults: a small first bucket starts communication early, then 25 MiB buckets.
DDP_FIRST_BUCKET_MIB = 1.0  # torch.distributed._DEFAULT_FIRST_BUCKET_BYTES
DDP_BUCKET_CAP_MIB = 25.0  # DistributedDataParallel(bucket_cap_mb=25)


def ddp_buckets(grad_bytes: float, bucket_cap_mib: float = DDP_BUCKET_CAP_MIB,
                first_bucket_mib: float = DDP_FIRST_BUCKET_MIB) -> list[float]:
    """Gradient bytes per DDP bucket, in the order the backward pass fills them.

    Real buckets end at parameter boundaries; here the bytes are cut at the caps exactly.
    """
    if grad_bytes <= 0:
        return []
    sizes, left, cap = [], float(grad_bytes), first_bucket_mib * 2**20
    while left > 0:
        sizes.append(min(cap, left))
        left -= sizes[-1]
        cap = bucket_cap_mib * 2**20
    return sizes


def exposed_communication_s(step_s: float, buckets, world_size: int, link: Link,
                            backward_share: float = 2 / 3) -> float:
    """Communication time left after the backward pass when DDP overlaps bucket all-reduces with it.

    The backward pass takes ``T = backward_share * step_s`` and produces gradients at an even
    rate, so bucket ``i`` is ready at ``r_i = T * (b_1 + ... + b_i) / G``. Buckets are
    all-reduced one after another, each as soon as it is ready and the previous one is done,
    each costing ``c_i = ring_all_reduce_s(b_i)``. The last one ends at
    ``max_i (r_i + c_i + ... + c_k)``, so the exposed time is::

        exposed = max_i (r_i + sum_{j >= i} c_j) - T

    It is at least ``c_k``: the last bucket is ready only when the backward pass ends, so its
    all-reduce never hides. It is at most ``sum c_j``, the same all-reduces run after backward.
    """
    buckets = list(buckets)
    total = sum(buckets)
    if world_size <= 1 or total <= 0:
        return 0.0
    backward = backward_share * step_s
    costs = [ring_all_reduce_s(b, world_size, link) for b in buckets]
    ready = np.cumsum(buckets) / total * backward
    remaining = np.cumsum(costs[::-1])[::-1]  # c_i + ... + c_k
    # The bounds hold exactly; clamping only removes the rounding of (T + c) - T.
    return min(float(remaining[0]), max(costs[-1], float(np.max(ready + remaining)) - backward))


def predict_scaling(step_s: float, grad_bytes: float, world_sizes, link_within: Link, link_between: Link | None = None,
                    gpus_per_node: int = 8, backward_share: float = 2 / 3,
                    bucket_cap_mib: float = DDP_BUCKET_CAP_MIB, first_bucket_mib: float = DDP_FIRST_BUCKET_MIB):
    """Predicted weak-scaling step time and efficiency for each world size, as a DataFrame.

    ``step_s`` is the measured single-device step time; each process keeps its batch. A job
    that fits in one node uses ``link_within``; beyond it the ring crosses ``link_between``,
    the slowest link, which then sets the pace. Gradients travel in DDP's buckets (1 MiB, then
    ``bucket_cap_mib``), one ring all-reduce each; ``all_reduce_ms`` is their sum. Two bounds:

    * no overlap: every all-reduce after the backward pass, ``step + sum c_i``;
    * overlap: all-reduces run while the backward pass (``backward_share`` of the step) still
      computes, ``step + exposed`` with ``exposed`` from ``exposed_communication_s``. The last
      bucket never hides, so with any communication the efficiency stays below 1.

    Efficiency = step / predicted step, so 1 >= efficiency_overlap >= efficiency_no_overlap.
    """
    import pandas as pd

    if not (step_s > 0 and np.isfinite(step_s)) or not grad_bytes >= 0:
        raise WorkshopError(f"A step time above 0 and gradient bytes of 0 or more are needed, got step_s={step_s!r}, "
                            f"grad_bytes={grad_bytes!r}.", "pass the measured step time in seconds and 4 x parameters.")
    if not 0 <= backward_share <= 1:
        raise WorkshopError(f"backward_share is a fraction of the step, got {backward_share!r}.",
                            "use a number from 0 to 1 (about 2/3 for training).")
    if bucket_cap_mib <= 0 or first_bucket_mib <= 0:
        raise WorkshopError("DDP bucket sizes must be positive.", "use the defaults (1 MiB first, then 25 MiB).")
    buckets = ddp_buckets(grad_bytes, bucket_cap_mib, first_bucket_mib)
    rows = []
    for p in world_sizes:
        if int(p) != p or p < 1:
            raise WorkshopError(f"World sizes are whole numbers of processes, got {p!r}.", "use 1, 2, 4, 8, ...")
        link = link_within if (p <= gpus_per_node or link_between is None) else link_between
        comm = sum(ring_all_reduce_s(b, p, link) for b in buckets)
        exposed = exposed_communication_s(step_s, buckets, p, link, backward_share)
        rows.append({"world_size": p, "link": link.name if p > 1 else "-", "buckets": len(buckets),
                     "all_reduce_ms": 1e3 * comm, "exposed_ms": 1e3 * exposed,
                     "step_ms_no_overlap": 1e3 * (step_s + comm), "step_ms_overlap": 1e3 * (step_s + exposed),
                     "efficiency_no_overlap": step_s / (step_s + comm),
                     "efficiency_overlap": step_s / (step_s + exposed)})
    return pd.DataFrame(rows)


@dataclass(frozen=True)
class LinkPlan:
    """Which all-reduce to time on this machine, and what the measurement may stand for."""

    processes: int
    device: str  # "cuda": NCCL between GPUs; "cpu": gloo between CPU processes
    is_training_link: bool  # True: the link the training ranks here use, fit to predict their scaling
    max_mib: int  # largest message timed
    note: str  # one line for the reader


def link_measurement_plan(gpus: int, world_sizes=(1, 2)) -> LinkPlan:
    """Measure the link the ranks really use: NCCL between GPUs when there are two or more.

    One GPU has no GPU-to-GPU link: two gloo CPU processes then only demonstrate the method,
    and predictions must use the documented figures (``LINKS``), never that CPU link.
    """
    if gpus >= 2:
        processes = max([p for p in world_sizes if 2 <= p <= gpus] or [2])
        return LinkPlan(processes, "cuda", True, 256,
                        f"Measuring NCCL all-reduce between {processes} GPUs: the link the DDP ranks above used.")
    if gpus == 1:
        return LinkPlan(2, "cpu", False, 16,
                        "One GPU: no GPU-to-GPU link can be measured here, so predictions use the documented "
                        "NVLink/InfiniBand figures; the gloo all-reduce between two CPU processes below only "
                        "demonstrates the method and is not this GPU's link.")
    return LinkPlan(2, "cpu", True, 16,
                    "No GPU: measuring gloo all-reduce between two CPU processes, the link the CPU ranks above used.")


def message_sizes(min_kib: int, max_mib: int) -> list[int]:
    """Bytes from ``min_kib`` KiB up to ``max_mib`` MiB in steps of 4x."""
    return [min_kib * 1024 * 4**k for k in range(20) if min_kib * 1024 * 4**k <= max_mib * 2**20]


# ---------------------------------------------------------------- measured scaling: tables and plots


def scaling_table(records: list[dict]):
    """Throughput, speedup and efficiency per (mode, world size) from training records.

    Each record's ``config["name"]`` starts with its mode, "strong" or "weak". Strong scaling keeps the
    global batch, so the ideal speedup is p; weak scaling keeps the per-process batch, so throughput
    should also grow p-fold. Either way efficiency = speedup / p, against the one-process run.
    """
    import pandas as pd

    rows = []
    for record in records:
        m = record["metrics"]
        rows.append({"mode": record["config"]["name"].split("-")[0], "world_size": m["world_size"],
                     "batch_per_process": record["config"]["batch_size"], "global_batch": m["global_batch_size"],
                     "lr": record["config"]["lr"], "step_ms": m["step_ms_median"],
                     "samples_per_s": m["samples_per_s"], "final_train_loss": m["final_train_loss"],
                     "test_acc_pct": None if m.get("final_test_acc") is None else 100 * m["final_test_acc"]})
    table = pd.DataFrame(rows).sort_values(["mode", "world_size"]).reset_index(drop=True)
    base = table[table.world_size == 1].set_index("mode")["samples_per_s"]
    table["speedup"] = table["samples_per_s"] / table["mode"].map(base)
    table["efficiency"] = table["speedup"] / table["world_size"]
    return table


def plot_scaling(table, title: str = "Data-parallel scaling"):
    """Throughput and efficiency against world size, with the ideal line; the title line below says how close."""
    import matplotlib.pyplot as plt

    from ..system.plotstyle import style

    with style():
        fig, (ax_speed, ax_eff) = plt.subplots(1, 2, figsize=(11, 3.8))
        sizes = sorted(table.world_size.unique())
        for mode, group in table.groupby("mode"):
            ax_speed.plot(group.world_size, group.samples_per_s, "o-", label=f"{mode} scaling")
            ax_eff.plot(group.world_size, 100 * group.efficiency, "o-", label=f"{mode} scaling")
        one = table[table.world_size == 1].samples_per_s.mean()
        ax_speed.plot(sizes, [one * p for p in sizes], "k:", label="ideal (linear)")
        ax_speed.set(xlabel="processes (world size)", ylabel="throughput (samples/s)", title="Throughput",
                     xticks=sizes)
        ax_eff.axhline(100, color="k", ls=":", label="ideal")
        ax_eff.set(xlabel="processes (world size)", ylabel="efficiency (% of linear speed-up)", title="Efficiency",
                   xticks=sizes, ylim=(0, 115))
        ax_speed.legend()
        ax_eff.legend()
        largest = table[table.world_size == max(sizes)]
        finding = ", ".join(f"{row.mode} {100 * row.efficiency:.0f}%" for row in largest.itertuples())
        fig.suptitle(f"{title}\nefficiency at {max(sizes)} processes: {finding}")
        fig.tight_layout()
    return fig


def plot_all_reduce(rows: list[dict], link: Link | None = None, title: str | None = None):
    """Measured all-reduce time and bus bandwidth against message size (log-log), with the fitted model.

    ``title`` says what was measured (which backend, between what), above both panels; a second line
    states the bandwidth reached.
    """
    import matplotlib.pyplot as plt

    from ..system.plotstyle import style

    sizes = np.array([r["size_bytes"] for r in rows], float)
    seconds = np.array([r["seconds"] for r in rows], float)
    bandwidth = np.array([r["bus_bandwidth_gbps"] for r in rows], float)
    p = rows[0]["world_size"]
    with style():
        fig, (ax_time, ax_bw) = plt.subplots(1, 2, figsize=(11, 3.8))
        ax_time.loglog(sizes / 2**20, seconds * 1e3, "o", label="measured")
        if link is not None:
            ax_time.loglog(sizes / 2**20, [1e3 * ring_all_reduce_s(n, p, link) for n in sizes], "-",
                           label=f"ring model: {link.latency_us:.0f} us per step, {link.bandwidth_gbps:.2f} GB/s")
        ax_time.set(xlabel="message size (MiB, log scale)", ylabel="time per all-reduce (ms, log scale)",
                    title=f"All-reduce time, {p} processes")
        ax_time.legend()
        ax_bw.semilogx(sizes / 2**20, bandwidth, "o-", label="measured bus bandwidth")
        ax_bw.set(xlabel="message size (MiB, log scale)", ylabel="bus bandwidth (GB/s)",
                  title="Small messages pay latency; large ones use the link", ylim=(0, None))
        ax_bw.legend()
        best = int(np.argmax(bandwidth))
        finding = f"bus bandwidth up to {bandwidth[best]:.2f} GB/s, reached at {sizes[best] / 2**20:.3g} MiB"
        fig.suptitle(f"{title}\n{finding}" if title else finding)
        fig.tight_layout()
    return fig


def _percent(value: float) -> str:
    """A share in percent as people write it: "230%", "4.7%", "0.31%" (never "2.3e+02%")."""
    return f"{value:,.0f}%" if abs(value) >= 10 else f"{value:.2g}%"


def plot_predicted_vs_measured(predicted, measured=None, title: str = "Predicted weak-scaling efficiency"):
    """Share of each step lost to communication against world size: both overlap bounds, measured points beside.

    The loss is ``1 / efficiency - 1`` on a log scale: efficiencies of 0.9996 and 0.97 look alike on a
    linear axis near 1, yet one costs a hundred times more. One process loses nothing and is left out.
    """
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter

    from ..system.plotstyle import style

    def lost_pct(efficiency):
        return 100 * (1 / np.asarray(efficiency, float) - 1)

    groups = list(predicted.groupby("model", sort=False)) if "model" in predicted else [("predicted", predicted)]
    with style():
        fig, ax = plt.subplots(figsize=(9.5, 4.4))
        for label, group in groups:
            group = group[group.world_size > 1]
            line, = ax.plot(group.world_size, lost_pct(group.efficiency_no_overlap), "o--",
                            label=f"{label}: all-reduce after backward (no overlap)")
            ax.plot(group.world_size, lost_pct(group.efficiency_overlap), "s-", color=line.get_color(),
                    label=f"{label}: overlapped with backward")
        if measured is not None and len(measured):
            shown = measured[(measured.world_size > 1) & (measured.efficiency < 1)]  # a log axis shows no gain
            if len(shown):
                ax.plot(shown.world_size, lost_pct(shown.efficiency), "k*", markersize=13,
                        label="measured (all overheads, not only communication)")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log", base=10)
        ax.yaxis.set_major_formatter(FuncFormatter(lambda value, _: f"{value:g}%"))
        finding = ""
        if groups:
            last = groups[-1][1].sort_values("world_size").iloc[-1]
            finding = (f"\n{groups[-1][0]}, {last.world_size:.0f} processes: "
                       f"{_percent(lost_pct(last.efficiency_no_overlap))} of each step lost, "
                       f"{_percent(lost_pct(last.efficiency_overlap))} with overlap")
        ax.set(xlabel="processes (log scale)", ylabel="step time lost to communication (log scale)",
               title=f"{title}{finding}")
        fig.legend(*ax.get_legend_handles_labels(), loc="lower center", ncol=2, fontsize=8)
        fig.tight_layout(rect=(0, 0.17, 1, 1))
    return fig
