"""Matplotlib figures that read well in a notebook and save as PNG for the report."""

from __future__ import annotations

from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np


def save_figure(fig, run_dir, name: str) -> Path:
    """Save ``fig`` as ``<run_dir>/figures/<name>.png`` and return the path."""
    folder = Path(run_dir) / "figures"
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}.png"
    fig.savefig(path, dpi=120, bbox_inches="tight")
    return path


def plot_training_curves(record: dict, title: str | None = None):
    """Loss per step (smoothed) and per-epoch train/test accuracy, side by side."""
    fig, (ax_loss, ax_acc) = plt.subplots(1, 2, figsize=(11, 3.8))
    losses = np.asarray(record["step_loss"], dtype=float)
    steps = np.arange(record.get("first_step", 0), record.get("first_step", 0) + len(losses)) + 1
    ax_loss.plot(steps, losses, alpha=0.35, label="per step")
    if len(losses) >= 10:
        window = max(5, len(losses) // 20)
        smooth = np.convolve(losses, np.ones(window) / window, mode="valid")
        ax_loss.plot(steps[window - 1:], smooth, label=f"mean of {window}")
    ax_loss.set(xlabel="optimizer step", ylabel="training loss", title="Loss")
    ax_loss.legend()
    history = record["history"]
    epochs = [h["epoch"] for h in history]
    ax_acc.plot(epochs, [h["train_acc"] for h in history], "o-", label="train")
    ax_acc.plot(epochs, [h["test_acc"] for h in history], "s-", label="test")
    ax_acc.axhline(0.1, color="grey", ls=":", label="chance (10 classes)")
    ax_acc.set(xlabel="epoch", ylabel="accuracy", ylim=(0, 1), title="Accuracy")
    ax_acc.legend()
    fig.suptitle(title or record["config"]["name"])
    fig.tight_layout()
    return fig


def plot_step_times(record_or_times, title: str = "Step time"):
    """Histogram of step times: a long right tail means stalls (data loading, sync, throttling)."""
    times = np.asarray(record_or_times, dtype=float)
    fig, ax = plt.subplots(figsize=(6, 3.2))
    ax.hist(times, bins=min(40, max(5, len(times) // 3)))
    ax.axvline(np.median(times), color="k", ls="--", label=f"median {np.median(times):.1f} ms")
    ax.set(xlabel="ms per step", ylabel="steps", title=title)
    ax.legend()
    fig.tight_layout()
    return fig


def plot_bars(labels, values, ylabel: str, title: str, annotate_fmt: str = "{:,.0f}", baseline: float | None = None):
    """A bar chart with the value on each bar (and its ratio to ``baseline`` when given)."""
    fig, ax = plt.subplots(figsize=(max(5, 1.1 * len(labels) + 2), 3.6))
    values = [np.nan if v is None else v for v in values]
    bars = ax.bar([str(l) for l in labels], values, color="tab:blue")
    for bar, value in zip(bars, values):
        if np.isfinite(value):
            text = annotate_fmt.format(value)
            if baseline:
                text += f"\n{value / baseline:.2f}x"
            ax.annotate(text, (bar.get_x() + bar.get_width() / 2, bar.get_height()),
                        ha="center", va="bottom", fontsize=8)
    ax.set(ylabel=ylabel, title=title)
    ax.margins(y=0.2)
    plt.setp(ax.get_xticklabels(), rotation=20, ha="right")
    fig.tight_layout()
    return fig
