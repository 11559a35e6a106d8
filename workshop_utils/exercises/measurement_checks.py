"""Notebook 04's exercises: measure, then decide (the loader's workers, the batch that fits, the next fix).
4.1's answer is a function: on a measured sweep some mistakes give the right numbers by chance, so the check also
runs it on a sweep it builds, where every mistake gives its own answer."""

from __future__ import annotations

import math

import numpy as np

from ..lessons.sweeps import METRICS, amdahl_speedup
from ..system.display import format_number
from ..system.errors import WorkshopError
from .exercise_cells import NotYet, passed, require, require_answered
from .exercise_judging import attendee_function, called, checked, count, described, number, short, verdict


def constructed_loader_sweep(pinned: bool = True):
    """A loader sweep with ``dataloader_sweep``'s columns where each mistake of 4.1 gives its own answer: (table,
    starting row). The start is no extreme row; the row that waits least is not the fastest."""
    import pandas as pd

    rows = [(8, False, 1700.0, 0.10), (0, False, 1000.0, 0.55), (4, False, 1900.0, 0.12), (2, False, 1600.0, 0.25)]
    if pinned:
        rows += [(0, True, 1050.0, 0.50), (2, True, 1650.0, 0.04), (4, True, 2000.0, 0.08), (8, True, 1750.0, 0.18)]
    # a batch of 64 at every row (step_ms_median), and an MFU that grows with the throughput
    table = pd.DataFrame([{"num_workers": workers, "pin_memory": pin, **dict(zip(METRICS, (
        samples, 64e3 / samples, wait, samples / 1e5))), "amdahl_max_speedup": amdahl_speedup(wait)}
        for workers, pin, samples, wait in rows])
    return table, table.iloc[3].copy()


def _loader_answers(loader_choice, sweep, start, exercise: str) -> tuple:
    answers = called(loader_choice, exercise, "loader_choice", sweep.copy(), start.copy())
    if getattr(answers, "ndim", None) == 1 and not isinstance(answers, (str, bytes)):  # an array or tensor of three
        answers = list(answers)
    require(isinstance(answers, (tuple, list)) and len(answers) == 3, exercise,
            f"`loader_choice` should return three values (best_workers, measured_speedup, amdahl_bound), got "
            f"{described(answers)}.", "end it with `return best_workers, measured_speedup, amdahl_bound`.")
    for name, answer in zip(("best_workers", "measured_speedup", "amdahl_bound"), answers):
        require_answered(answer, exercise, f"`{name}` (what `loader_choice` returns) is still the placeholder `...`.",
                         "replace each `...` of the return line with your code.")
    return tuple(answers)


def _judge_loader(answers, sweep, start, exercise: str) -> tuple[int, float, float]:
    fastest = sweep.loc[sweep.samples_per_s.idxmax()]
    workers = count(answers[0], exercise, "best_workers", "a whole number of workers")
    require(workers in set(int(w) for w in sweep.num_workers), exercise,
            f"`best_workers` = {workers} is not a worker count of the sweep.", "pick one of its num_workers.")
    shown = format_number(float(fastest.samples_per_s))
    # a choice of row: right or not, with no direction (a choice is no quantity); rows that tie as shown all right
    require(workers in {int(row.num_workers) for _, row in sweep.iterrows()
                        if format_number(float(row.samples_per_s)) == shown}, exercise,
            f"`best_workers` = {workers} is not the num_workers of the fastest row ({shown} samples/s).",
            "take the num_workers of the row with the highest samples_per_s.")
    speedup = number(answers[1], exercise, "measured_speedup", "one number, a ratio")
    right = float(fastest.samples_per_s / start.samples_per_s)
    # the notebook's text names this one: where the start is the fastest row, upside down is 1 all the same
    verdict(speedup, right, exercise, "measured_speedup", [
        (1 / right, "upside down.", "divide the fastest row's samples/s by the starting row's.")],
        "the fastest row's samples_per_s / `start`'s (the function's argument, not a row you pick).",
        inputs=f"{shown} samples/s / `start`'s {format_number(float(start.samples_per_s))}")
    bound = number(answers[2], exercise, "amdahl_bound", "one number, a ratio")
    wait = float(start.data_wait_fraction)
    if not 0 <= wait < 1:
        raise WorkshopError(f"{exercise}: the starting row's data_wait_fraction is {wait}.", "pass the measured sweep.")
    verdict(bound, 1 / (1 - wait), exercise, "amdahl_bound", [],
            "Amdahl's ceiling: 1 / (1 - f), f `start`'s data_wait_fraction (the function's argument).",
            inputs=f"1 / (1 - f), f = {wait:.4g}, `start`'s data_wait_fraction")
    return workers, speedup, bound


@checked
def check_loader_choice(loader_choice, loader_sweep, start_workers: int, exercise: str = "Exercise 4.1") -> bool:
    """``loader_choice(sweep, start)``: the fastest row's workers, its speed-up over ``start``, and Amdahl's ceiling
    1 / (1 - f) at ``start``; judged on the measured sweep and on ``constructed_loader_sweep``."""
    attendee_function(loader_choice, exercise, "loader_choice", "sweep, start")
    rows = loader_sweep[(loader_sweep.num_workers == start_workers) & ~loader_sweep.pin_memory.astype(bool)]
    if rows.empty:
        raise WorkshopError(f"{exercise}: no row of the table has {start_workers} workers, unpinned.",
                            "pass the table the notebook measured.")
    start = rows.iloc[0]
    measured = _loader_answers(loader_choice, loader_sweep, start, exercise)
    workers, speedup, bound = _judge_loader(measured, loader_sweep, start, exercise)
    table, table_start = constructed_loader_sweep(pinned=bool(loader_sweep.pin_memory.any()))
    second = f"{exercise}: on a second sweep, built by the check so that each mistake gives its own answer"
    built = _loader_answers(loader_choice, table, table_start, second)
    fastest = table.loc[table.samples_per_s.idxmax()]
    right_built = (int(fastest.num_workers), float(fastest.samples_per_s / table_start.samples_per_s),
                   1 / (1 - float(table_start.data_wait_fraction)))
    same_as_measured = all(_same_answer(a, b) for a, b in zip(built, measured))
    require(not (same_as_measured and not all(_same_answer(a, b) for a, b in zip(built, right_built))), exercise,
            "on a second sweep the check built, `loader_choice` gave the same answers as on yours: it reads the "
            "notebook's variables, not its arguments.", "compute from `sweep` and `start`, the function's arguments.")
    _judge_loader(built, table, table_start, second)
    if speedup > 1.02 * bound:
        return passed(exercise, f"{workers} workers: {speedup:.2f}x measured exceeds the {bound:.2f}x ceiling that "
                                "the starting row's wait allows, so part of that gain is not the loader's (noise, "
                                "or the step itself changed)")
    return passed(exercise, f"{workers} workers: {speedup:.2f}x measured, "
                            + (f"within the {bound:.2f}x that Amdahl allows" if speedup <= bound else
                               f"above the {bound:.2f}x that Amdahl allows by less than 2%, a measurement's noise"))


def _same_answer(a, b) -> bool:
    try:
        return math.isclose(float(a), float(b), rel_tol=1e-6)
    except Exception:  # noqa: BLE001 - answers that are no numbers are judged, and named, elsewhere
        return False


@checked
def check_batch_memory(mib_per_sample, largest_batch, batch_sweep, limit_mib: float,
                       exercise: str = "Exercise 4.2") -> bool:
    """The slope of peak memory against batch size, and the largest batch the line keeps within ``limit_mib`` (set
    by the exercise cell: a value that is no limit is the attendee's to fix)."""
    try:
        limit = number(limit_mib, exercise, "limit_mib")
    except NotYet:  # the placeholder too: the cell's first line, not the answer
        limit = math.nan
    require(limit > 0, exercise, f"`limit_mib` = {short(repr(limit_mib), 40)} is no memory limit: it should be a "
            "number of MiB above 0.", "keep the cell's first line, limit_mib = hp[\"memory_cap_mib\"] or the GPU's "
                                      "free memory in MiB.")
    limit_mib, fitted = limit, batch_sweep[batch_sweep.status == "ok"]
    if len(fitted) < 2:
        raise WorkshopError(f"{exercise}: only {len(fitted)} batch size fit, and a line needs two.",
                            "sweep from a smaller start batch or with a larger memory cap.")
    slope, intercept = (float(v) for v in np.polyfit(fitted.batch_size.astype(float),
                                                      fitted.peak_memory_mib.astype(float), 1))
    if not slope > 0:
        raise WorkshopError(f"{exercise}: the measured peak memory does not grow with the batch (slope {slope:.3g}).",
                            "sweep again: on a shared machine another process can move the peak.")
    value = number(mib_per_sample, exercise, "mib_per_sample", "one number, in MiB per sample")
    verdict(value, slope, exercise, "mib_per_sample", [], "fit a line through (batch_size, peak_memory_mib) of the "
            "rows whose status is 'ok' (np.polyfit(x, y, 1) returns the slope, then the intercept), in MiB.",
            inputs=f"the least-squares slope through the {len(fitted)} rows that fit")
    largest = count(largest_batch, exercise, "largest_batch", "a whole number of samples")
    right = math.floor((limit_mib - intercept) / slope)
    from_given = math.floor((limit_mib - intercept) / value) if value > 0 else None  # the slope as they rounded it
    no_intercept = ("that leaves the intercept out: at batch b the line is intercept + slope x b.",
                    "the line includes the intercept: solve intercept + slope * b <= limit.")
    verdict(largest, right, exercise, "largest_batch", [(math.floor(limit_mib / s), *no_intercept)
                                                        for s in (slope, value) if s > 0],
        "the largest whole batch b with intercept + slope * b <= limit_mib.", whole=True, also=[from_given],
        inputs=f"intercept {intercept:,.1f} MiB + {slope:.4g} MiB x b <= {limit_mib:,.0f} MiB")
    return passed(exercise, f"{value:.2f} MiB per sample; up to batch {largest:,} in {limit_mib:,.0f} MiB")


@checked
def check_next_fix(biggest_phase, step_speedup, breakdown, exercise: str = "Exercise 4.3") -> bool:
    """The top rung's largest part of the step, and Amdahl's speed-up if it ran twice as fast; parts that tie as
    wu.show_table shows them are each right."""
    parts = [c for c in breakdown.columns if c.endswith("_ms") and c != "step_ms"]
    top = breakdown.iloc[-1]
    largest = format_number(max(float(top[part]) for part in parts))
    require_answered(biggest_phase, exercise, "`biggest_phase` is still the placeholder `...`.",
                     "replace the `...` in the exercise cell with your code, run that cell, then this one.")
    require(isinstance(biggest_phase, str), exercise,
            f"`biggest_phase` should be a column name (text), got {described(biggest_phase)}.",
            f"assign the name of one of {', '.join(parts)}.")
    phase = biggest_phase if biggest_phase.endswith("_ms") else f"{biggest_phase}_ms"
    require(phase != "step_ms", exercise, "step_ms is the whole step, not a part of it.",
            f"compare only the parts: {', '.join(parts)}.")
    require(phase in parts, exercise, f"`biggest_phase` = {short(repr(biggest_phase), 40)} is no column of the table.",
            f"use one of {', '.join(parts)}.")
    require(format_number(float(top[phase])) == largest, exercise,
            f"{phase} is not the top rung's largest part: in the last row it takes {format_number(float(top[phase]))} "
            "ms, less than another part.",
            "compare every _ms column of the last row (breakdown.iloc[-1]) but step_ms.")
    speedup = number(step_speedup, exercise, "step_speedup", "one number, a ratio")
    raw = top[phase] / top.step_ms
    share = min(1.0, raw)
    # the exercise says f is at most 1: taken uncapped, it is named
    verdict(speedup, 1 / ((1 - share) + share / 2), exercise, "step_speedup", [
        (1 / ((1 - raw) + raw / 2) if 1 < raw < 2 else None,
         f"f = {raw:.2g} is above 1: {phase}'s kernels ran on past the host's step, and no part is more than all "
         "of the step.", "cap f at 1, as the exercise says: f = min(1, ms / step_ms).")],
        "Amdahl: 1 / ((1 - f) + f / 2), f = that part's ms / step_ms of the last row.",
        inputs=f"1 / ((1 - f) + f / 2), f = {share:.3g}, {phase}'s share of the top rung's step")
    return passed(exercise, f"{phase.removesuffix('_ms')} takes {share:.0%} of the step: twice as fast gives "
                            f"{speedup:.2f}x")
