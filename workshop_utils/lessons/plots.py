"""Matplotlib figures that read well in a notebook and save as PNG for the report and the slides.

Every chart here follows the kit's rules (``system/plotstyle.py``): drawn inside ``style()``, a title whose
second line states what the chart shows, both axes labelled with their unit, a legend whenever more
than one line is drawn, and the fixed colour of a precision or a ladder rung wherever one is plotted.
"""

from __future__ import annotations

import re
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np

from .monitor import stopped_by_memory
from ..system.plotstyle import (PALETTE, PRECISION_COLORS, RUNG_COLORS, STYLE, category_colors,
                                precision_color, rung_color, style)
from ..system.results import write_atomically

__all__ = ["PALETTE", "PRECISION_COLORS", "RUNG_COLORS", "STYLE", "category_colors", "plot_bars",
           "plot_batch_sweep", "plot_step_times", "plot_training_curves", "precision_color", "rung_color",
           "save_figure", "style"]

# Axis names for the columns notebooks pass as bar labels (a pandas Series keeps its column name).
_AXIS_NAMES = {
    "batch_size": "batch size (samples per step)",
    "rung": "ladder rung (each adds one switch to those left of it)",
    "layout": "storage layout",
    "mode": "mode",
    "precision": "precision mode",
    "num_workers": "DataLoader worker processes",
}
# A bare unit as y label gets the quantity in front of it.
_QUANTITIES = {"samples/s": "throughput (samples/s)", "ms": "time (ms)", "MiB": "memory (MiB)",
               "ms per save": "training blocked per save (ms)"}


def save_figure(fig, run_dir, name: str) -> Path:
    """Save ``fig`` as ``<run_dir>/figures/<name>.png`` and return the path."""
    # Written beside it and renamed: a full disk keeps the figure of the last run whole, not half a PNG.
    return write_atomically(Path(run_dir) / "figures" / f"{name}.png",
                            lambda tmp: fig.savefig(tmp, format="png", dpi=STYLE["savefig.dpi"], bbox_inches="tight"),
                            "Figure")


def _axis_name(labels, xlabel: str | None) -> str:
    if xlabel:
        return xlabel
    name = getattr(labels, "name", None)  # a pandas Series: its column
    if isinstance(name, str) and name:
        return _AXIS_NAMES.get(name, name.replace("_", " "))
    return "setting"


def _higher_is_better(ylabel: str) -> bool:
    """Speeds are better high; times and memory are better low (what the finding line should pick out)."""
    return "/s" in ylabel or "speed" in ylabel.lower() or "throughput" in ylabel.lower()


def plot_training_curves(record: dict, title: str | None = None):
    """Loss per step (smoothed) and per-epoch train/test accuracy, side by side."""
    with style():
        fig, (ax_loss, ax_acc) = plt.subplots(1, 2, figsize=(11, 3.8))
        losses = np.asarray(record["step_loss"], dtype=float)
        steps = np.arange(record.get("first_step", 0), record.get("first_step", 0) + len(losses)) + 1
        ax_loss.plot(steps, losses, alpha=0.35, color=PALETTE[0], label="per step")
        if len(losses) >= 10:
            window = max(5, len(losses) // 20)
            smooth = np.convolve(losses, np.ones(window) / window, mode="valid")
            ax_loss.plot(steps[window - 1:], smooth, color=PALETTE[0], label=f"mean of {window} steps")
        ax_loss.set(xlabel="optimizer step", ylabel="training loss (cross-entropy)", title="Loss")
        ax_loss.legend()
        history = record["history"]
        epochs = [h["epoch"] for h in history]
        ax_acc.plot(epochs, [100 * h["train_acc"] for h in history], "o-", label="train")
        ax_acc.plot(epochs, [100 * h["test_acc"] for h in history], "s-", label="test")
        ax_acc.axhline(10, color="grey", ls=":", label="chance (10 classes)")
        ax_acc.set(xlabel="epoch", ylabel="accuracy (%)", ylim=(0, 100), title="Accuracy")
        ax_acc.legend()
        name = title or record["config"]["name"]
        final = history[-1]["test_acc"] if history else None
        finding = (f"test accuracy {100 * final:.1f}% after {len(history)} epoch(s)" if final is not None
                   else "no epoch finished")
        fig.suptitle(f"{name}: {finding}")
        fig.tight_layout()
    return fig


def plot_step_times(record_or_times, title: str = "Step time"):
    """Histogram of step times: a long right tail means stalls (data loading, sync, throttling)."""
    times = np.asarray(record_or_times, dtype=float)
    with style():
        fig, ax = plt.subplots(figsize=(6, 3.4))
        ax.hist(times, bins=min(40, max(5, len(times) // 3)), color=PALETTE[0], label=f"{len(times)} timed steps")
        median, p90 = np.median(times), np.percentile(times, 90)
        ax.axvline(median, color="k", ls="--", label=f"median {median:.1f} ms")
        ax.axvline(p90, color="k", ls=":", label=f"90th percentile {p90:.1f} ms")
        tail = (f"median {median:.1f} ms; " + ("90th percentile over 1.5x the median: a long tail, some steps stall"
                                               if p90 > 1.5 * median else
                                               "90th percentile within 1.5x the median: most steps steady"))
        ax.set(xlabel="step time (ms)", ylabel="steps (count)", title=f"{title}\n{tail}")
        ax.legend()
        fig.tight_layout()
    return fig


def plot_bars(labels, values, ylabel: str, title: str, annotate_fmt: str = "{:,.0f}",
              baseline: float | None = None, xlabel: str | None = None, colors=None):
    """A bar chart with the value on each bar (and its ratio to ``baseline`` when given).

    ``xlabel`` defaults to the name of ``labels`` when it is a pandas column. Bars whose labels are
    ladder rungs or precision modes take their fixed colours; ``colors`` overrides them.
    """
    names = [str(label) for label in labels]
    values = np.array([np.nan if v is None else v for v in values], dtype=float)
    ylabel = _QUANTITIES.get(ylabel, ylabel)
    with style():
        fig, ax = plt.subplots(figsize=(max(5.5, 1.1 * len(names) + 2), 3.8))
        bars = ax.bar(names, values, color=list(colors) if colors is not None else category_colors(names))
        for bar, value in zip(bars, values):
            if np.isfinite(value):
                text = annotate_fmt.format(value)
                if baseline:
                    text += f"\n{value / baseline:.2f}x"
                ax.annotate(text, (bar.get_x() + bar.get_width() / 2, bar.get_height()),
                            ha="center", va="bottom", fontsize=8)
        finite = np.isfinite(values)
        finding = ""
        if finite.any():
            pick = np.nanargmax(values) if _higher_is_better(ylabel) else np.nanargmin(values)
            word = "highest" if _higher_is_better(ylabel) else "lowest"
            ratio = f", {values[pick] / baseline:.2f}x the first bar" if baseline else ""
            finding = f"\n{word}: {names[pick]} ({annotate_fmt.format(values[pick])}{ratio})"
        ax.set(xlabel=_axis_name(labels, xlabel), ylabel=ylabel, title=f"{title}{finding}")
        ax.grid(axis="x", visible=False)
        ax.margins(y=0.25)
        plt.setp(ax.get_xticklabels(), rotation=20, ha="right")
        fig.tight_layout()
    return fig


def _memory_stop(status: str) -> str:
    """What stopped a sweep, said of its batch: "ran out of memory" or "went over the 600 MiB memory cap"."""
    cap = re.match(r"over (the [\d,.]+ MiB memory cap)", str(status))
    return f"went over {cap.group(1)}" if cap else "ran out of memory"


def plot_batch_sweep(table, title: str = "Batch size: throughput and peak memory"):
    """Throughput and peak memory against batch size, side by side; the batch memory stopped is marked with why.

    ``table`` is what ``batch_size_sweep`` returns (or its report section's rows): ``batch_size``,
    ``status``, ``samples_per_s`` and ``peak_memory_mib`` per row.
    """
    rows = table.to_dict("records") if hasattr(table, "to_dict") else list(table)
    ok = [r for r in rows if r.get("status") == "ok" and r.get("samples_per_s")]
    failed = [r for r in rows if stopped_by_memory(r.get("status", ""))]
    with style():
        fig, (ax_speed, ax_mem) = plt.subplots(1, 2, figsize=(11, 3.8))
        sizes = [r["batch_size"] for r in ok]
        speeds = [r["samples_per_s"] for r in ok]
        ax_speed.plot(sizes, speeds, "o-", color=PALETTE[0], label="measured")
        ax_speed.set(xscale="log", xlabel="batch size (samples per step, log scale)",
                     ylabel="throughput (samples/s)", title="Throughput", ylim=(0, 1.2 * max(speeds, default=1)))
        held = [r for r in ok if r.get("peak_memory_mib") is not None]
        ax_mem.plot([r["batch_size"] for r in held], [r["peak_memory_mib"] for r in held], "o-", color=PALETTE[1],
                    label="peak memory")
        for r in failed:
            ax_mem.plot([r["batch_size"]], [r["peak_memory_mib"] or 0], "X", color=PALETTE[3], markersize=11,
                        label=r["status"])
        ax_mem.set(xscale="log", xlabel="batch size (samples per step, log scale)", ylabel="peak memory (MiB)",
                   title="Peak memory", ylim=(0, None))
        for ax in (ax_speed, ax_mem):
            ax.set_xticks([r["batch_size"] for r in rows], [str(r["batch_size"]) for r in rows])
            ax.minorticks_off()
            ax.legend(loc="lower right" if ax is ax_speed else "upper left")
        if ok:
            best = max(ok, key=lambda r: r["samples_per_s"])
            finding = f"fastest at batch {best['batch_size']} ({best['samples_per_s']:,.0f} samples/s)"
            finding += f"; batch {failed[0]['batch_size']} {_memory_stop(failed[0]['status'])}" if failed else \
                f"; memory grew {ok[-1]['peak_memory_mib'] / ok[0]['peak_memory_mib']:.1f}x" \
                if ok[0].get("peak_memory_mib") and ok[-1].get("peak_memory_mib") else ""
        else:
            finding = "no batch size was timed"
        fig.suptitle(f"{title}\n{finding}")
        fig.tight_layout()
    return fig
