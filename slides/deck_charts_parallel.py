"""The charts of many processes (decks 02 and 05): DDP's scaling, the all-reduce and its ring model, predictions
to 512 GPUs, overlap, collectives, sharding, recomputation and checkpoints (see ``deck_charts``)."""

from __future__ import annotations

import re

from matplotlib.ticker import FixedLocator, FuncFormatter, MaxNLocator

from deck_charts import (PALETTE, ChartData, Drawn, bytes_axis, chart, headroom, integer_ticks, label_bars,
                         legend_above, legend_right, number, plain_log, rows_of, thousands)
from deck_labels import fmt_ms, fmt_sig, human

PERCENT = FuncFormatter(lambda v, _: f"{v:.0f}%")


def _link_words(link) -> str:
    """A fitted link as the slide says it: "0.25 ms a ring step, 1.49 GB/s"."""
    return f"{fmt_ms(link.latency_us / 1000)} a ring step, {fmt_sig(link.bandwidth_gbps)} GB/s"


def _processes(n: int) -> str:
    return f"{n} process{'es' if n != 1 else ''}"


# ----------------------------------------------------------------------------------------------- notebook 02


@chart("ddp_scaling", "section-ddp-scaling", throughput=True)
def ddp_scaling(d: ChartData) -> Drawn:
    rows = [r for r in rows_of(d.records["section-ddp-scaling"]) if number(r.get("samples_per_s")) is not None]
    fig, (speed_ax, eff_ax) = d.figure(ncols=2)
    sizes = sorted({r["world_size"] for r in rows})
    one = next((r["samples_per_s"] for r in rows if r["world_size"] == 1), None)
    for k, mode in enumerate(dict.fromkeys(r["mode"] for r in rows)):
        mine = sorted((r for r in rows if r["mode"] == mode), key=lambda r: r["world_size"])
        batch = "global batch kept" if mode == "strong" else "batch per process kept"
        style = dict(marker="os"[k % 2], color=PALETTE[k], label=f"{mode} scaling ({batch})")
        speed_ax.plot([r["world_size"] for r in mine], [r["samples_per_s"] for r in mine], **style)
        eff_ax.plot([r["world_size"] for r in mine], [100 * r["efficiency"] for r in mine], **style)
    if one:
        speed_ax.plot(sizes, [one * n for n in sizes], linestyle="--", color=PALETTE[7], label="ideal: linear")
        eff_ax.axhline(100, linestyle="--", color=PALETTE[7])
    for ax in (speed_ax, eff_ax):
        integer_ticks(ax.xaxis, sizes)
        ax.set_xlabel("processes")
        ax.set_xlim(min(sizes) - 0.25, max(sizes) + 0.25)
    speed_ax.set_ylabel("samples/s")
    speed_ax.set_ylim(bottom=0)
    thousands(speed_ax.yaxis)
    eff_ax.set_ylabel("efficiency")
    eff_ax.set_ylim(0, 110)
    eff_ax.yaxis.set_major_locator(FixedLocator([0, 25, 50, 75, 100]))
    eff_ax.yaxis.set_major_formatter(PERCENT)
    legend_right(fig, speed_ax)
    return Drawn(fig, f"measured on {d.device()}")


@chart("ddp_all_reduce", "all_reduce")
def ddp_all_reduce(d: ChartData) -> Drawn:
    from workshop_utils.parallel.comm_model import Link, ring_all_reduce_s

    record = d.records["all_reduce"]
    rows = sorted(record["rows"], key=lambda r: r["size_bytes"])
    world = int(record.get("world_size") or rows[0]["world_size"])
    fig, (time_ax, bw_ax) = d.figure(ncols=2)
    sizes = [r["size_bytes"] for r in rows]
    times = [1000 * r["seconds"] for r in rows]
    backend = f"{record.get('backend', '?')}, {_processes(world)}"
    time_ax.plot(sizes, times, "o", color=PALETTE[0], label=f"measured ({backend})")
    fitted = record.get("link") or {}
    if number(fitted.get("bandwidth_gbps")) and number(fitted.get("latency_us")) is not None:
        link = Link("fitted", fitted["bandwidth_gbps"], fitted["latency_us"], "")
        model = [1000 * ring_all_reduce_s(s, world, link) for s in sizes]
        time_ax.plot(sizes, model, color=PALETTE[1], label=f"ring model fitted to them: {_link_words(link)}")
        times = times + model
    for ax in (time_ax, bw_ax):
        ax.set_xscale("log")
        bytes_axis(ax.xaxis, sizes)
        ax.set_xlabel("message size")
    time_ax.set_yscale("log")
    plain_log(time_ax.yaxis, times)
    time_ax.set_ylabel("ms per all-reduce")
    bw_ax.plot(sizes, [r["bus_bandwidth_gbps"] for r in rows], "o-", color=PALETTE[0])
    bw_ax.set_ylabel("bus bandwidth (GB/s)")
    bw_ax.set_ylim(bottom=0)
    bw_ax.yaxis.set_major_locator(MaxNLocator(nbins=4))
    legend_above(fig, time_ax)
    return Drawn(fig, f"measured between {_processes(world)} on {d.device()}; the line is a model fitted to them")


def _model_name(name: str) -> str:
    if "measured" in name.lower():
        return "this machine's link"
    return name.replace("(documented)", "").strip()


def _step_ms(row: dict) -> float | None:
    """The step time a prediction assumed, from its efficiency without overlap: eff = step / (step + all-reduce)."""
    eff, comm = number(row.get("efficiency_no_overlap")), number(row.get("all_reduce_ms"))
    return eff * comm / (1 - eff) if eff is not None and comm and 0 < eff < 1 else None


@chart("ddp_predicted_scaling", "section-ddp-comm-model", optional=("section-ddp-scaling",))
def ddp_predicted_scaling(d: ChartData) -> Drawn:
    rows = rows_of(d.records["section-ddp-comm-model"])
    fig, ax = d.figure()
    steps = {}
    for k, name in enumerate(dict.fromkeys(r["model"] for r in rows)):
        mine = sorted((r for r in rows if r["model"] == name and r["world_size"] > 1), key=lambda r: r["world_size"])
        sizes = [r["world_size"] for r in mine]
        color = PALETTE[k]
        ax.plot(sizes, [100 * r["efficiency_overlap"] for r in mine], "s-", color=color,
                label=f"{_model_name(name)}, overlapped (predicted)")
        ax.plot(sizes, [100 * r["efficiency_no_overlap"] for r in mine], "o--", color=color,
                label=f"{_model_name(name)}, no overlap (predicted)")
        steps[name] = next((s for s in map(_step_ms, mine) if s), None)
    measured = d.records.get("section-ddp-scaling")
    weak = [r for r in rows_of(measured or {}) if r.get("mode") == "weak" and number(r.get("efficiency")) is not None]
    if weak:
        top = max(weak, key=lambda r: r["world_size"])
        ax.plot([top["world_size"]], [100 * top["efficiency"]], "*", markersize=22, color=PALETTE[6],
                label=f"{_processes(top['world_size'])}, weak scaling (measured)")
    ax.set_xscale("log", base=2)
    sizes = sorted({r["world_size"] for r in rows if r["world_size"] > 1})
    integer_ticks(ax.xaxis, sizes)
    ax.xaxis.set_minor_locator(FixedLocator([]))
    ax.set_xlabel("processes (GPUs where predicted), log scale")
    ax.set_ylabel("weak-scaling efficiency")
    ax.set_ylim(0, 105)
    ax.yaxis.set_major_locator(FixedLocator([0, 25, 50, 75, 100]))
    ax.yaxis.set_major_formatter(PERCENT)
    legend_right(fig, ax)
    # The notebook says in its sentence whether the GPU step was measured (here, or on the GPU its record names,
    # "GPU step measured on one H100 ..., 2026-11-26") or estimated (no GPU in the run, no GPU record).
    said = str(d.records["section-ddp-comm-model"].get("text", ""))
    estimated = "estimat" in said.lower()
    elsewhere = re.search(r"GPU step measured (on one .+?, \d{4}-\d{2}-\d{2})", said)
    # The link figures the notebook took from the data sheets, in its sentence: "... -> 450 GB/s each way".
    speeds = re.findall(r"(\d[\d,.]*) GB/s each way", said)
    links = f"data-sheet links ({' and '.join(speeds)} GB/s each way)" if speeds else "data-sheet links"
    parts = []
    for name, step in steps.items():
        if step is None:
            continue
        if "measured" in name.lower():
            parts.append(f"the measured link from this machine's {fmt_ms(step)} step")
        elif estimated:
            parts.append(f"{links} from an estimated {fmt_ms(step)} GPU step (not measured)")
        elif elsewhere:
            parts.append(f"{links} from the {fmt_ms(step)} GPU step measured {elsewhere.group(1)}")
        else:
            parts.append(f"{links} from the measured {fmt_ms(step)} step")
    star = f"; the star measured on {d.device('section-ddp-scaling')}" if weak else ""
    return Drawn(fig, "predicted by the ring model: " + ", ".join(parts) + star)


@chart("ddp_gpt_overlap", "section-ddp-overlap")
def ddp_gpt_overlap(d: ChartData) -> Drawn:
    rows = rows_of(d.records["section-ddp-overlap"])
    fig, ax = d.figure()
    xs = list(range(len(rows)))
    compute = [number(r.get("compute_ms")) or 0 for r in rows]
    comm = [number(r.get("communication_ms")) or 0 for r in rows]
    both = [number(r.get("overlapped_ms")) or 0 for r in rows]
    ax.bar([x - 0.2 for x in xs], compute, 0.38, color=PALETTE[0], label="backward alone")
    ax.bar([x - 0.2 for x in xs], comm, 0.38, bottom=compute, color=PALETTE[1], label="then the all-reduces alone")
    ax.bar([x + 0.2 for x in xs], both, 0.38, color=PALETTE[2], label="both at once, as DDP runs them")
    for x, row, top in zip(xs, rows, (max(a + b, c) for a, b, c in zip(compute, comm, both))):
        if number(row.get("exposed_ms")) is not None:
            ax.annotate(f"{fmt_ms(row['exposed_ms'])} not hidden", (x, top), xytext=(0, 4),
                        textcoords="offset points", ha="center", va="bottom")
    headroom(ax, 1.2)
    plural = lambda n: f"{n} bucket{'s' if n != 1 else ''}"
    ax.set_xticks(xs, [f"{fmt_sig(r['bucket_cap_mb'])} MiB buckets\n({plural(r['buckets'])})" for r in rows])
    ax.set_ylabel("ms per backward pass")
    ax.yaxis.set_major_locator(MaxNLocator(nbins=4))
    ax.grid(axis="x", visible=False)
    legend_right(fig, ax)
    return Drawn(fig, f"measured: medians of repeats on {d.device()}")


# ----------------------------------------------------------------------------------------------- notebook 05


@chart("collectives", "beyond-collectives")
def collectives(d: ChartData) -> Drawn:
    from workshop_utils.parallel.comm_model import fit_link, ring_all_reduce_s

    record = d.records["beyond-collectives"]
    rows = record["rows"]
    world = int(record.get("world_size") or rows[0]["world_size"])
    fig, ax = d.figure()
    names = list(dict.fromkeys(r["collective"] for r in rows))
    every = []
    for k, name in enumerate(names):
        mine = sorted((r for r in rows if r["collective"] == name), key=lambda r: r["size_bytes"])
        times = [1000 * r["seconds"] for r in mine]
        every += times
        ax.plot([r["size_bytes"] for r in mine], times, "o-", linewidth=1.2, color=PALETTE[k % len(PALETTE)],
                label=f"{human(name)}, measured")
    sizes = sorted({r["size_bytes"] for r in rows})
    reduce = [r for r in rows if r["collective"] == "all_reduce"]
    what = f"measured between {_processes(world)} ({record.get('backend', '?')}) on {d.device()}"
    if len(reduce) >= 2 and world >= 2:
        link = fit_link([r["size_bytes"] for r in reduce], [r["seconds"] for r in reduce], world)
        model = [1000 * ring_all_reduce_s(s, world, link) for s in sizes]
        ax.plot(sizes, model, color=PALETTE[6], linewidth=3, label="ring model fitted to the all-reduce")
        ax.plot(sizes, [m / 2 for m in model], color=PALETTE[6], linewidth=3, linestyle="--",
                label="its prediction: all-gather, reduce-scatter")
        every += model
        what += f"; the lines: the ring model fitted to the all-reduce ({_link_words(link)})"
    ax.set_xscale("log")
    ax.set_yscale("log")
    bytes_axis(ax.xaxis, sizes)
    plain_log(ax.yaxis, [t for t in every if t > 0])
    ax.set_xlabel("tensor size")
    ax.set_ylabel("ms per call")
    legend_right(fig, ax)
    return Drawn(fig, what)


MEMORY_PARTS = (("parameters_mib", "parameters"), ("gradients_mib", "gradients"), ("optimizer_mib", "optimizer state"))


def _held_bars(ax, rows: list[dict], labels: list[str]) -> None:
    positions = list(range(len(rows)))[::-1]
    left = [0.0] * len(rows)
    for k, (key, name) in enumerate(MEMORY_PARTS):
        values = [number(r.get(key)) or 0 for r in rows]
        ax.barh(positions, values, 0.7, left=left, color=PALETTE[k], label=name)
        left = [a + b for a, b in zip(left, values)]
    for y, total in zip(positions, left):
        ax.annotate(f"{fmt_sig(total)} MiB", (total, y), xytext=(6, 0), textcoords="offset points", va="center")
    headroom(ax, 1.3, horizontal=True)
    ax.set_yticks(positions, labels)
    ax.set_xlabel("MiB held per rank")
    ax.grid(axis="y", visible=False)
    ax.xaxis.set_major_locator(MaxNLocator(nbins=4))


@chart("fsdp_memory", "section-beyond-fsdp", optional=("beyond-fsdp",))
def fsdp_memory(d: ChartData) -> Drawn:
    rows = rows_of(d.records["section-beyond-fsdp"])
    losses = (d.records.get("beyond-fsdp") or {}).get("losses") or {}
    fig, axes = d.figure(ncols=2 if losses else 1, width_ratios=[1.25, 1] if losses else None)
    held_ax = axes[0] if losses else axes
    _held_bars(held_ax, rows, [f"{r['strategy']}, rank {r['rank']}" for r in rows])
    if losses:
        loss_ax = axes[1]
        for k, (name, values) in enumerate(losses.items()):
            loss_ax.plot(range(1, len(values) + 1), values, "o-" if k == 0 else "x--", color=PALETTE[4 + k],
                         label=f"{name}: training loss")
        loss_ax.set_xlabel("optimizer step")
        loss_ax.set_ylabel("loss")
        loss_ax.yaxis.set_major_locator(MaxNLocator(nbins=3))
        loss_ax.xaxis.set_major_locator(MaxNLocator(nbins=4, integer=True))
        handles = [*held_ax.get_legend_handles_labels()[0], *loss_ax.get_legend_handles_labels()[0]]
        labels = [*held_ax.get_legend_handles_labels()[1], *loss_ax.get_legend_handles_labels()[1]]
        legend_right(fig, handles=handles, labels=labels)
    else:
        legend_right(fig, held_ax)
    return Drawn(fig, f"measured after an optimizer step on {d.device()}")


@chart("gpt_parallel_memory", "section-beyond-gpt-parallel")
def gpt_parallel_memory(d: ChartData) -> Drawn:
    rows = rows_of(d.records["section-beyond-gpt-parallel"])
    fig, ax = d.figure()
    _held_bars(ax, rows, [human(r["strategy"]) for r in rows])
    legend_above(fig, ax)
    return Drawn(fig, f"measured after an optimizer step on {d.device()}")


@chart("activation_checkpointing", "section-beyond-recompute")
def activation_checkpointing(d: ChartData) -> Drawn:
    rows = rows_of(d.records["section-beyond-recompute"])
    models = list(dict.fromkeys(r.get("model", "") for r in rows))
    fig, (mem_ax, time_ax) = d.figure(ncols=2)
    for ax, key, label in ((mem_ax, "peak_memory_mib", "step memory (MiB)"), (time_ax, "step_ms", "step time (ms)")):
        for k, (flag, name) in enumerate(((False, "activations stored"), (True, "recomputed in backward"))):
            values = [number(next((r.get(key) for r in rows if r.get("model", "") == m
                                   and bool(r["activation_checkpointing"]) is flag), None)) or 0 for m in models]
            bars = ax.bar([i + (k - 0.5) * 0.4 for i in range(len(models))], values, 0.38, color=PALETTE[k], label=name)
            label_bars(ax, bars, [fmt_sig(v) for v in values])
        headroom(ax, 1.25)
        ax.set_xticks(range(len(models)), [human(m).replace(" blocks", "") for m in models])
        ax.set_ylabel(label)
        ax.yaxis.set_major_locator(MaxNLocator(nbins=3))
        ax.grid(axis="x", visible=False)
    legend_above(fig, mem_ax)
    return Drawn(fig, f"measured: one training step on {d.device()}")


@chart("checkpoint_stall", "section-beyond-checkpoint")
def checkpoint_stall(d: ChartData) -> Drawn:
    rows = [r for r in rows_of(d.records["section-beyond-checkpoint"]) if (number(r.get("saves")) or 0) > 0]
    names = {"sync": "blocking save", "async": "asynchronous save"}
    # A save's first call pays one-off set-up (the asynchronous writer's thread): shown apart where recorded.
    bars_of = []
    for i, r in enumerate(rows):
        name, color = names.get(r["mode"], human(r["mode"])), PALETTE[(2 * i) % len(PALETTE)]
        first, later = number(r.get("first_save_blocked_ms")), number(r.get("later_saves_blocked_ms"))
        if first is not None and later is not None:
            bars_of += [(f"{name}, first", first, color), (f"{name}, later", later, color)]
        else:
            bars_of.append((name, number(r.get("blocked_ms_per_save")) or 0, color))
    fig, ax = d.figure()
    positions = list(range(len(bars_of)))[::-1]
    values = [value for _, value, _ in bars_of]
    bars = ax.barh(positions, values, 0.6, color=[color for _, _, color in bars_of])
    label_bars(ax, bars, [fmt_ms(v) for v in values], horizontal=True)
    headroom(ax, 1.35, horizontal=True)
    ax.set_yticks(positions, [name for name, _, _ in bars_of])
    ax.set_xlabel("training blocked per save (ms)")
    ax.grid(axis="y", visible=False)
    thousands(ax.xaxis)
    return Drawn(fig, f"measured on {d.device()}")

