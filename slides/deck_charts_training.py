"""The charts of one training process (decks 00, 01, 03 and 04): the baseline, precision, batch size, the ladders
and storage layouts, each drawn from the records its notebook wrote (see ``deck_charts`` for how and why)."""

from __future__ import annotations

from matplotlib.ticker import FixedLocator, MaxNLocator

from deck_charts import (PALETTE, ChartData, Drawn, chart, headroom, integer_ticks, label_bars, legend_above,
                         legend_over, number, rows_of, thousands)
from deck_labels import fmt_count, fmt_ratio, fmt_sig, human, memory_stop_label

# A fixed colour per rung of the ladder, as the package's charts have them (workshop_utils.system.plotstyle): the
# bf16 rung is bf16's green on both ladders.
RUNG_COLORS = {"baseline": "#999999", "tuned dataloader": "#E69F00", "bf16 autocast": "#009E73",
               "channels_last": "#56B4E9", "device-resident loader": "#CC79A7", "fused optimizer": "#D55E00",
               "fused adamw": "#D55E00", "fused attention": "#E69F00", "torch.compile": "#0072B2",
               "cuda graphs": "#000000"}


def rung_color(label: str) -> str:
    key = str(label).strip().lower()
    if key.endswith("x batch") or key.endswith("micro-batches"):
        return "#F0E442"
    return RUNG_COLORS.get(key, PALETTE[0])


def rung_label(label: str) -> str:
    """A rung as the slide names it: "channels-last", "2× batch"."""
    return human(label)


# ----------------------------------------------------------------------------------------------- notebook 01


@chart("baseline_curves", "baseline")
def baseline_curves(d: ChartData) -> Drawn:
    record = d.records["baseline"]
    metrics = record.get("metrics", {})
    fig, (loss_ax, acc_ax) = d.figure(ncols=2)
    losses = record["step_loss"]
    first = int(record.get("first_step") or 0)
    loss_ax.plot(range(first + 1, first + len(losses) + 1), losses, color=PALETTE[0], linewidth=2)
    loss_ax.set_xlabel("training step")
    loss_ax.set_ylabel("training loss")
    history = record["history"]
    epochs = [h["epoch"] for h in history]
    acc_ax.plot(epochs, [100 * h["train_acc"] for h in history], marker="o", color=PALETTE[1], label="training")
    acc_ax.plot(epochs, [100 * h["test_acc"] for h in history], marker="s", color=PALETTE[2], label="test")
    integer_ticks(acc_ax.xaxis, epochs)
    acc_ax.set_xlabel("epoch")
    acc_ax.set_ylabel("accuracy (%)")
    for ax in (loss_ax, acc_ax):
        ax.yaxis.set_major_locator(MaxNLocator(nbins=4))
    legend_over(acc_ax)
    data = metrics.get("data_source") or "recorded"
    return Drawn(fig, f"measured on {d.device()}, {data} data")


@chart("baseline_step_times", "baseline")
def baseline_step_times(d: ChartData) -> Drawn:
    record = d.records["baseline"]
    metrics = record.get("metrics", {})
    times = [t for t in record["step_ms"] if number(t) is not None]
    fig, ax = d.figure()
    ax.hist(times, bins=min(20, max(5, len(times) // 4)), color=PALETTE[0], alpha=0.85)
    median, p90 = metrics.get("step_ms_median"), metrics.get("step_ms_p90")
    if number(median) is not None:
        ax.axvline(median, color=PALETTE[3], linewidth=2.5, label=f"median {fmt_sig(median)} ms")
    if number(p90) is not None:
        ax.axvline(p90, color=PALETTE[6], linewidth=2.5, linestyle="--", label=f"90th percentile {fmt_sig(p90)} ms")
    ax.set_xlabel("step time after warm-up (ms)")
    ax.set_ylabel("steps")
    thousands(ax.xaxis)
    ax.yaxis.set_major_locator(MaxNLocator(nbins=4, integer=True))
    legend_above(fig, ax, ncols=1)
    return Drawn(fig, f"measured: {len(times)} timed steps on {d.device()}")


@chart("monitor", "section-monitor", optional=("monitor",))
def monitor(d: ChartData) -> Drawn | None:
    """Utilisation and memory over time from notebook 04's samples (record "monitor": t_s, utilization_pct,
    memory_used_mib); a run recorded before the samples were kept gives None, and the slide shows its PNG."""
    samples = (d.records.get("monitor") or {}).get("samples") or rows_of(d.records["section-monitor"])
    rows = [r for r in samples if number(r.get("t_s")) is not None]
    if not rows or not any(number(r.get("utilization_pct")) is not None for r in rows):
        return None
    fig, (util_ax, mem_ax) = d.figure(ncols=2)
    times = [r["t_s"] for r in rows]
    util_ax.plot(times, [number(r.get("utilization_pct")) for r in rows], color=PALETTE[0], label="utilisation")
    util_ax.axhline(80, color=PALETTE[3], linestyle="--", label="80%: busy")
    util_ax.set_ylim(0, 105)
    util_ax.yaxis.set_major_locator(FixedLocator([0, 25, 50, 75, 100]))
    util_ax.set_ylabel("utilisation (%)")
    mem_ax.plot(times, [number(r.get("memory_used_mib")) for r in rows], color=PALETTE[2])
    mem_ax.set_ylim(0, None)  # from zero: a swing of a quarter does not fill the axis
    mem_ax.set_ylabel("memory used (MiB)")
    thousands(mem_ax.yaxis)
    for ax in (util_ax, mem_ax):
        ax.set_xlabel("seconds since sampling began")
        ax.xaxis.set_major_locator(MaxNLocator(nbins=4))
    legend_above(fig, util_ax)
    return Drawn(fig, f"measured: {len(rows)} samples on {d.device()}")


# ----------------------------------------------------------------------------------------------- notebook 03


@chart("fp16_loss_scaling", "section-precision-numerics")
def fp16_loss_scaling(d: ChartData) -> Drawn:
    """The share of gradient values fp16 cannot hold exactly (zero or subnormal), per loss scale."""
    rows = rows_of(d.records["section-precision-numerics"])
    scales = list(dict.fromkeys(row["loss scale"] for row in rows))
    kinds = list(dict.fromkeys(row["gradients"] for row in rows))
    fig, ax = d.figure()
    width = 0.8 / max(1, len(kinds))
    for k, kind in enumerate(kinds):
        shares = []
        for scale in scales:
            row = next((r for r in rows if r["gradients"] == kind and r["loss scale"] == scale), {})
            shares.append(sum(number(row.get(c)) or 0 for c in ("flushed to zero %", "subnormal (imprecise) %")))
        xs = [i + (k - (len(kinds) - 1) / 2) * width for i in range(len(scales))]
        name = {"parameters": "parameter", "activations": "activation"}.get(kind, kind)
        bars = ax.bar(xs, shares, width * 0.92, color=PALETTE[(2 * k) % len(PALETTE)], label=f"{name} gradients")
        label_bars(ax, bars, [f"{fmt_sig(s, 2)}%" for s in shares])
    ax.set_xticks(range(len(scales)), [human(s) + (" (none)" if human(s) == "1" else "") for s in scales])
    ax.set_xlabel("loss scale (the loss multiplied by)")
    ax.set_ylabel("imprecise or zero (%)")
    ax.set_ylim(0, 100)
    headroom(ax, 1.15)
    ax.yaxis.set_major_locator(FixedLocator([0, 25, 50, 75, 100]))
    legend_above(fig, ax)
    return Drawn(fig, f"measured: real gradients cast to fp16 on {d.device()}")


# ----------------------------------------------------------------------------------------------- notebook 04


@chart("batch_size_sweep", "section-batch_size", throughput=True)
def batch_size_sweep(d: ChartData) -> Drawn:
    rows = rows_of(d.records["section-batch_size"])
    fig, ax = d.figure()
    labels = [f"{row['batch_size']:,}" for row in rows]
    values = [number(row.get("samples_per_s")) for row in rows]
    bars = ax.bar(range(len(rows)), [v or 0 for v in values], 0.7, color=PALETTE[0])
    label_bars(ax, bars, [fmt_count(v) if v is not None else None for v in values])
    headroom(ax, 1.2)
    for i, (row, value) in enumerate(zip(rows, values)):
        if value is None:
            status = memory_stop_label(row.get("status", "")) or "not run"
            ax.annotate(status.replace(" of ", " of\n").replace(" the ", " the\n"), (i, 0), xytext=(0, 6),
                        textcoords="offset points", ha="center", va="bottom", color=PALETTE[3])
    ax.set_xticks(range(len(rows)), labels)
    ax.set_xlabel("batch size (samples per step)")
    ax.set_ylabel("samples/s")
    thousands(ax.yaxis)
    return Drawn(fig, f"measured on {d.device()}")


def _ladder(d: ChartData, key: str, value_key: str, unit: str) -> Drawn:
    rows = [row for row in rows_of(d.records[key]) if number(row.get(value_key)) is not None]
    fig, ax = d.figure()
    positions = list(range(len(rows)))[::-1]  # the first rung on top
    values = [number(row[value_key]) for row in rows]
    bars = ax.barh(positions, values, 0.7, color=[rung_color(row["rung"]) for row in rows])
    texts = []
    for row, value in zip(rows, values):
        ratio = number(row.get("vs_baseline"))
        texts.append(fmt_count(value) + (f" · {fmt_ratio(ratio)}" if ratio is not None and row is not rows[0] else ""))
    label_bars(ax, bars, texts, horizontal=True)
    headroom(ax, 1.55, horizontal=True)
    ax.set_yticks(positions, [rung_label(row["rung"]) for row in rows])
    ax.set_xlabel(f"throughput ({unit})")
    ax.grid(axis="y", visible=False)
    thousands(ax.xaxis)
    skipped = len(rows_of(d.records[key])) - len(rows)
    note = f"; {skipped} rung(s) not measured here (report.md says why)" if skipped else ""
    return Drawn(fig, f"measured on {d.device()}; × against the first rung{note}")


@chart("optimization_ladder", "section-ladder", throughput=True)
def optimization_ladder(d: ChartData) -> Drawn:
    return _ladder(d, "section-ladder", "samples_per_s", "samples/s")


@chart("gpt_ladder", "section-gpt-ladder", throughput=True)
def gpt_ladder(d: ChartData) -> Drawn:
    return _ladder(d, "section-gpt-ladder", "tokens_per_s", "tokens/s")


PHASES = (("data_ms", "data"), ("forward_ms", "forward"), ("backward_ms", "backward"),
          ("optimizer_ms", "optimizer"), ("other_ms", "other"), ("idle_ms", "device idle"))


@chart("ladder_breakdown", "section-ladder-breakdown")
def ladder_breakdown(d: ChartData) -> Drawn:
    return _breakdown(d, "section-ladder-breakdown")


@chart("gpt_ladder_breakdown", "section-gpt-ladder-breakdown")
def gpt_ladder_breakdown(d: ChartData) -> Drawn:
    return _breakdown(d, "section-gpt-ladder-breakdown")


def _breakdown(d: ChartData, key: str) -> Drawn:
    """A step's milliseconds by phase for each rung: the phase that is longest on the top rung is the next to fix."""
    rows = [row for row in rows_of(d.records[key]) if number(row.get("step_ms")) is not None]
    fig, ax = d.figure()
    positions = list(range(len(rows)))[::-1]
    left = [0.0] * len(rows)
    for (key, name), color in zip(PHASES, (PALETTE[7], PALETTE[0], PALETTE[3], PALETTE[2], PALETTE[1], PALETTE[6])):
        values = [number(row.get(key)) or 0.0 for row in rows]
        if not any(values):
            continue
        ax.barh(positions, values, 0.7, left=left, color=color, label=name)
        left = [a + b for a, b in zip(left, values)]
    for y, row, end in zip(positions, rows, left):
        ax.annotate(f"{fmt_sig(row['step_ms'])} ms", (max(end, row["step_ms"]), y), xytext=(6, 0),
                    textcoords="offset points", va="center")
    headroom(ax, 1.2 if d.width > 900 else 1.35, horizontal=True)
    ax.set_yticks(positions, [rung_label(row["rung"]) for row in rows])
    ax.set_xlabel("ms per profiled step, by phase" if d.width <= 900 else "milliseconds per profiled step, by phase")
    ax.grid(axis="y", visible=False)
    thousands(ax.xaxis)
    phases = len(ax.get_legend_handles_labels()[0])
    legend_above(fig, ax, ncols=phases if d.width > 900 else min(phases, 3))  # a side column fits three a row
    return Drawn(fig, f"measured under the profiler on {d.device()} (its overhead included)")


@chart("io_layouts", "section-io")
def io_layouts(d: ChartData) -> Drawn:
    """The same images read from each storage layout; the loader paths (another baseline) stay in the table."""
    rows = [row for row in rows_of(d.records["section-io"])
            if number(row.get("files")) is not None and number(row.get("samples_per_s")) is not None]
    fig, ax = d.figure()
    positions = list(range(len(rows)))[::-1]
    values = [row["samples_per_s"] / 1000 for row in rows]
    bars = ax.barh(positions, values, 0.7, color=PALETTE[0])
    label_bars(ax, bars, [fmt_count(v) for v in values], horizontal=True)
    headroom(ax, 1.3, horizontal=True)
    # On a CPU the device is the CPU: its "device" layout is torch tensors in the same host memory as the arrays.
    on_gpu = d.environment().get("device_type") == "cuda"
    in_memory = {"memory": "in host memory\nNumPy arrays, no file",
                 "device": "in GPU memory\ntensors, no file" if on_gpu else "in host memory\ntorch tensors, no file"}

    def label(row) -> str:
        if row["layout"] in in_memory and not row["files"]:
            return in_memory[row["layout"]]
        files = int(row["files"])
        return f"{human(row['layout'])}\n{fmt_count(files)} file{'s' if files != 1 else ''} opened"

    ax.set_yticks(positions, [label(row) for row in rows])
    ax.set_xlabel("thousand images read per second")
    ax.grid(axis="y", visible=False)
    thousands(ax.xaxis)
    return Drawn(fig, f"measured on {d.device()}, every file in its OS page cache")
