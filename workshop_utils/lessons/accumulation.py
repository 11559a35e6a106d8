"""Notebook 02's GPT under DDP: gradient accumulation with ``no_sync()``, and DDP's gradient buckets.

Each run is one launch of the one training loop with one field changed (``sync_micro_batches``,
``bucket_cap_mb``); its record counts the gradient buckets rank 0 all-reduced (``all_reduces``) and keeps
every timed step's time. A time difference is credited only when the two runs' middle halves of step times
(25th to 75th percentile) do not overlap; otherwise it reads "no measurable change". The counts need no
such rule: they are what DDP did, the same on every machine.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from .sweeps import NO_MEASURABLE_CHANGE


def accumulation_table(records: dict[str, dict]) -> pd.DataFrame:
    """One row per run (name -> its record): micro-batches, buckets, all-reduces per step, step time and spread."""
    rows = []
    for name, record in records.items():
        metrics, config = record["metrics"], record["config"]
        step_ms = np.asarray(record["step_ms"], dtype=float)
        rows.append({
            "run": name,
            "world_size": metrics["world_size"],
            "micro_batches": config["accumulation_steps"],
            "sync_every_micro_batch": config["sync_micro_batches"],
            "bucket_cap_mb": config["bucket_cap_mb"],
            "tokens_per_step": metrics["tokens_per_step"],
            "all_reduces_per_step": metrics["all_reduces"] / metrics["steps"],
            "step_ms_median": float(np.median(step_ms)),
            "step_ms_p25": float(np.percentile(step_ms, 25)),
            "step_ms_p75": float(np.percentile(step_ms, 75)),
            "tokens_per_s": metrics["tokens_per_s"],
        })
    return pd.DataFrame(rows)


def step_time_change(table: pd.DataFrame, run: str, against: str) -> tuple[float | None, str]:
    """Milliseconds per step that ``run`` adds to ``against`` and one line saying so, or None and "no
    measurable change" when the middle halves of their step times overlap."""
    rows = table.set_index("run")
    a, b = rows.loc[against], rows.loc[run]
    extra = b["all_reduces_per_step"] - a["all_reduces_per_step"]
    spread = (f"(middle half of the steps: {a.step_ms_p25:.1f}–{a.step_ms_p75:.1f} ms against "
              f"{b.step_ms_p25:.1f}–{b.step_ms_p75:.1f} ms)")
    if b.step_ms_p25 <= a.step_ms_p75 and a.step_ms_p25 <= b.step_ms_p75:
        return None, f"{run} against {against}: {NO_MEASURABLE_CHANGE} {spread}, with {extra:+.0f} all-reduces a step"
    delta = b.step_ms_median - a.step_ms_median
    per = f", {delta / extra:+.2f} ms per extra all-reduce" if extra else ""
    return delta, f"{run} against {against}: {delta:+.1f} ms a step {spread}, {extra:+.0f} all-reduces a step{per}"
