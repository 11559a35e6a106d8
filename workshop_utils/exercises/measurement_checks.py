"""Notebook 04's exercises: measure, then decide (the loader's workers, the batch that fits, the next fix). 4.1's
answer is a function, run on a sweep the check builds too: on a measured one some mistakes are right by chance."""

import math
import numbers

import numpy as np
import pandas as pd

from ..lessons.sweeps import METRICS, amdahl_speedup
from ..system.display import format_number
from .answer_values import Problem, number_of
from .cell_again import judge_cell_again
from .exercise_cells import NotYet, passed, require, require_answered
from .exercise_judging import (accepted, as_given, attendee_function, called, checked, count, described, kit_input,
                               number, short, verdict)


def _sweep_table(sweep, name: str, columns: set, exercise: str) -> None:
    """One line where the sweep passed is no table with ``columns`` (its rows as a list of dicts, one row): an input
    the check cell passes, not the answer."""
    held = list(getattr(sweep, "columns", []))
    got = short(f"a table of columns {held}", 80) if hasattr(sweep, "columns") else described(sweep)
    kit_input(columns <= set(held), f"{exercise}: `{name}` should be the sweep's table, got {got}.",
              f"pass `{name}`, the table the sweep cell made, as the check cell does.")


def _measured(row, columns, exercise: str, name: str) -> None:
    """One line where the row of a measured table that the exercise reads holds no number (NaN, inf, text) in a
    column the check reads: a run that went wrong, which no answer can be judged against."""
    def number(value) -> bool:
        return isinstance(value, numbers.Real) and not isinstance(value, (bool, np.bool_)) and math.isfinite(value)

    empty = [c for c in columns if not number(row[c])]
    kit_input(not empty, f"{exercise}: `{name}` holds no measured number (NaN, inf or text) in {', '.join(empty)} of "
              "the row the exercise reads.", f"run the cell that made `{name}` again, then this check.")


def constructed_loader_sweep(pinned: bool = True):
    """(table, starting row) of a loader sweep where each mistake of 4.1 gives its own answer: the start is no extreme
    row; the fastest waits neither least nor most, is unpinned and has no worker."""
    rows = [(8, False, 1700.0, 0.10), (0, False, 2100.0, 0.12), (4, False, 1000.0, 0.30), (2, False, 1200.0, 0.25)]
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
    speedup, right = number(answers[1], exercise, "measured_speedup", "one number, a ratio"), float(
        fastest.samples_per_s / start.samples_per_s)
    # the notebook's text names this one: where the start is the fastest row, upside down is 1 all the same
    verdict(speedup, right, exercise, "measured_speedup", [
        (1 / right, "upside down.", "divide the fastest row's samples/s by the starting row's.")],
        "the fastest row's samples_per_s / `start`'s (the function's argument, not a row you pick).",
        inputs=f"{shown} samples/s / `start`'s {format_number(float(start.samples_per_s))}")
    bound, wait = number(answers[2], exercise, "amdahl_bound", "one number, a ratio"), float(start.data_wait_fraction)
    kit_input(0 <= wait < 1, f"{exercise}: the starting row's data_wait_fraction is {wait}.",
              "pass the measured sweep.")
    verdict(bound, 1 / (1 - wait), exercise, "amdahl_bound", [],
            "Amdahl's ceiling: 1 / (1 - f), f `start`'s data_wait_fraction (the function's argument).",
            inputs=f"1 / (1 - f), f = {wait:.4g}, `start`'s data_wait_fraction")
    return workers, speedup, bound


def _same_answers(some, others) -> bool:
    try:
        return all(math.isclose(float(a), float(b), rel_tol=1e-6) for a, b in zip(some, others))
    except Exception:  # noqa: BLE001 - answers that are no numbers are judged, and named, elsewhere
        return False


@checked
def check_loader_choice(loader_choice, loader_sweep, start_workers: int, exercise: str = "Exercise 4.1") -> bool:
    """``loader_choice(sweep, start)``: the fastest row's workers, its speed-up and Amdahl's ceiling at ``start``."""
    attendee_function(loader_choice, exercise, "loader_choice", "sweep, start")
    _sweep_table(loader_sweep, "loader_sweep", {"num_workers", "pin_memory", "samples_per_s", "data_wait_fraction"},
                 exercise)
    try:  # the kit's reading of a number: a 0-d tensor too, and no text or truth value
        workers = number_of(start_workers)
    except Problem:
        workers = math.nan
    kit_input(workers >= 0 and workers.is_integer(),
              f"{exercise}: the starting row's workers should be a whole number, got {short(repr(start_workers), 40)}.",
              "pass baseline.num_workers, as the check cell does.")
    rows = loader_sweep[(loader_sweep.num_workers == workers) & ~loader_sweep.pin_memory.astype(bool)]
    kit_input(not rows.empty, f"{exercise}: no row of the table has {start_workers} workers, unpinned.",
              "pass the table the notebook measured.")
    _measured(rows.iloc[0], ["samples_per_s", "data_wait_fraction"], exercise, "loader_sweep")
    measured = _loader_answers(loader_choice, loader_sweep, rows.iloc[0], exercise)
    workers, speedup, bound = _judge_loader(measured, loader_sweep, rows.iloc[0], exercise)
    table, start = constructed_loader_sweep(pinned=bool(loader_sweep.pin_memory.any()))
    second = f"{exercise}: on a second sweep, built by the check so that each mistake gives its own answer"
    built = _loader_answers(loader_choice, table, start, second)
    fastest = table.loc[table.samples_per_s.idxmax()]
    right = (fastest.num_workers, fastest.samples_per_s / start.samples_per_s, 1 / (1 - start.data_wait_fraction))
    require(not _same_answers(built, measured) or _same_answers(built, right), exercise,
            "on a second sweep the check built, `loader_choice` gave the same answers as on yours: it reads the "
            "notebook's variables, not its arguments.", "compute from `sweep` and `start`, the function's arguments.")
    _judge_loader(built, table, start, second)
    ceiling = as_given(bound)
    gain = (f" exceeds the {ceiling}x ceiling that the starting row's wait allows, so part of that gain is not the "
            "loader's (noise, or the step itself changed)" if speedup > 1.02 * bound else
            f", within the {ceiling}x that Amdahl allows" if speedup <= bound else
            f", above the {ceiling}x that Amdahl allows by less than 2%, a measurement's noise")
    return passed(exercise, f"{workers} workers: {as_given(speedup)}x measured{gain}")


def _largest_batches(limit: float, intercept: float, slope: float) -> list[int]:
    """The largest whole batch within the limit, first; where the line meets the limit at a whole batch (to a hair
    either side, as fitted), that batch and the one below are both right."""
    exact = (limit - intercept) / slope
    whole = round(exact)
    if abs(intercept + slope * whole - limit) <= 1e-10 * max(abs(limit), abs(intercept)):
        return [whole, whole - 1] if whole > 0 else [whole]  # no batch below 0
    return [math.floor(exact)]


def _other_sweep():
    """A sweep to run 4.2's cell on again: its peaks lie off one line (two rows give no fit's slope), the row over the
    cap far off it, and its limit, 640 MiB (not the cpu profile's 600), meets the line at batch 500.97 (no floor)."""
    return pd.DataFrame({"batch_size": [32, 64, 128, 256, 512], "status": ["ok"] * 4 + [
        "over the 640 MiB memory cap at batch 512"], "peak_memory_mib": [61.0, 97.0, 178.0, 337.0, 1000.0]})


@checked
def check_batch_memory(mib_per_sample, largest_batch, batch_sweep, limit_mib: float,
                       exercise: str = "Exercise 4.2") -> bool:
    """Peak memory's slope against batch size and the largest batch within ``limit_mib``, then on ``_other_sweep``."""
    detail = _judge_batch_memory(mib_per_sample, largest_batch, batch_sweep, limit_mib, exercise)
    other, again = _other_sweep(), f"{exercise} (your cell, run again on another sweep: 640 MiB, batches 32 to 256)"
    judge_cell_again(("mib_per_sample", "largest_batch"), {"batch_sweep": other, "fitted": other[other.status == "ok"],
                                                           "limit_mib": 640.0},
                     lambda answers: _judge_batch_memory(*answers.values(), other, 640.0, again))
    return passed(exercise, detail)


def _judge_batch_memory(mib_per_sample, largest_batch, batch_sweep, limit_mib, exercise: str) -> str:
    limit_fix = "keep the cell's first line, limit_mib = hp[\"memory_cap_mib\"] or the GPU's free memory in MiB."
    try:
        limit = number(limit_mib, exercise, "limit_mib")
    except NotYet:  # the placeholder too: the cell's first line, not the answer
        limit = math.nan
    require(limit > 0, exercise, f"`limit_mib` = {short(repr(limit_mib), 40)} is no memory limit: it should be a "
            "number of MiB above 0.", limit_fix)
    _sweep_table(batch_sweep, "batch_sweep", {"batch_size", "status", "peak_memory_mib"}, exercise)

    def numeric(table) -> list:  # batch sizes and peaks as floats, NaN where a cell holds no number
        return [pd.to_numeric(table[c], errors="coerce").astype(float) for c in ("batch_size", "peak_memory_mib")]

    fitted = batch_sweep[batch_sweep.status == "ok"]
    batches, peaks = numeric(fitted)
    unread = fitted[~(np.isfinite(batches) & np.isfinite(peaks))]
    first = unread.iloc[0] if len(unread) else {}
    cells = [repr(v) if isinstance(v, str) else str(v) for v in (first.get("batch_size"), first.get("peak_memory_mib"))]
    kit_input(unread.empty, f"{exercise}: a row of the sweep that fit has no finite number for its batch_size or "
              f"peak_memory_mib: batch_size = {short(cells[0], 30)}, peak_memory_mib = {short(cells[1], 30)}.",
              "sweep again, or drop that row from `batch_sweep` before the check.")
    sizes = batches.nunique()
    kit_input(sizes >= 2, f"{exercise}: only {sizes} batch size fit, and a line needs two.",
              "sweep from a smaller start batch or with a larger memory cap.")
    slope, intercept = (float(v) for v in np.polyfit(batches, peaks, 1))
    # a flat sweep fits a slope of float noise (2e-16), not 0: growth below a millionth of the peak is none
    kit_input(slope * np.ptp(batches) > 1e-6 * peaks.abs().max(), f"{exercise}: the measured peak memory grows by less "
              f"than a millionth of itself across the sweep (slope {slope:.3g} MiB a sample): too little for a line to "
              "tell the batch that fits.", "sweep again: on a shared machine another process can move the peak.")
    where = "at" if limit == intercept else "below"
    require(limit > intercept, exercise, f"`limit_mib` = {limit:.4g} MiB is {where} the line's intercept "
            f"({intercept:,.1f} MiB): no batch fits in it.", limit_fix)
    value = number(mib_per_sample, exercise, "mib_per_sample", "one number, in MiB per sample")
    every = numeric(batch_sweep)
    kept = np.isfinite(every[0]) & np.isfinite(every[1])
    stopped = [] if kept.sum() <= len(fitted) or every[0][kept].nunique() < 2 else [(
        float(np.polyfit(every[0][kept], every[1][kept], 1)[0]), "that fits every row, the one memory stopped too: "
        "its peak is where the sweep stopped, not a point of the line.", "fit only the rows whose status is 'ok' "
                                                                          "(`fitted`).")]
    verdict(value, slope, exercise, "mib_per_sample", stopped, "fit a line through (batch_size, peak_memory_mib) of "
            "the rows whose status is 'ok' (np.polyfit(x, y, 1) returns the slope, then the intercept), in MiB.",
            inputs=f"the least-squares slope through the {len(fitted)} rows that fit")
    largest = count(largest_batch, exercise, "largest_batch", "a whole number of samples")
    no_intercept = ("that leaves the intercept out: at batch b the line is intercept + slope x b.",
                    "the line includes the intercept: solve intercept + slope * b <= limit.")
    right, *exactly = _largest_batches(limit, intercept, slope)
    verdict(largest, right, exercise, "largest_batch",
            [(math.floor(limit / s), *no_intercept) for s in (slope, value) if s > 0],
            "the largest whole batch b with intercept + slope * b <= limit_mib.", whole=True,
            # the slope as they rounded it; not the intercept: near the limit its rounding moves the batch by hundreds
            also=[*exactly, *(_largest_batches(limit, intercept, value) if value > 0 else [])],
            inputs=f"intercept {intercept:,.1f} MiB + {slope:#.4g} MiB x b <= {limit:,.0f} MiB")
    return f"{value:.3g} MiB per sample; up to batch {largest:,} in {limit:,.0f} MiB"


@checked
def check_next_fix(biggest_phase, step_speedup, breakdown, exercise: str = "Exercise 4.3") -> bool:
    """The top rung's largest part (ties as shown all are), and Amdahl's speed-up if it ran twice as fast."""
    kit_input(hasattr(breakdown, "columns"), f"{exercise}: `breakdown` should be the table, got "
              f"{described(breakdown)}.", "pass `breakdown`, the whole table, as the check cell does.")
    kit_input("step_ms" in breakdown.columns and not breakdown.empty, f"{exercise}: `breakdown` should hold a row per "
              "rung with its step_ms.", "pass `breakdown`, the whole table, as the check cell does.")
    parts, top = [c for c in breakdown.columns if c.endswith("_ms") and c != "step_ms"], breakdown.iloc[-1]
    _measured(top, [*parts, "step_ms"], exercise, "breakdown")
    require_answered(biggest_phase, exercise, "`biggest_phase` is still the placeholder `...`.")
    require(isinstance(biggest_phase, str), exercise, f"`biggest_phase` should be a column name (text), got "
            f"{described(biggest_phase)}.", f"assign the name of one of {', '.join(parts)}.")
    phase = biggest_phase if biggest_phase.endswith("_ms") else f"{biggest_phase}_ms"
    require(phase != "step_ms", exercise, "step_ms is the whole step, not a part of it.",
            f"compare only the parts: {', '.join(parts)}.")
    require(phase in parts, exercise, f"`biggest_phase` = {short(repr(biggest_phase), 40)} is no column of the "
            "step's parts.", f"use one of {', '.join(parts)}.")
    taken = format_number(float(top[phase]))
    require(taken == format_number(max(float(top[part]) for part in parts)), exercise,
            f"{phase} is not the top rung's largest part: in the last row it takes {taken} ms, less than another part.",
            "compare every _ms column of the last row (breakdown.iloc[-1]) but step_ms.")
    speedup, raw = number(step_speedup, exercise, "step_speedup", "one number, a ratio"), top[phase] / top.step_ms
    share = min(1.0, raw)
    # built from f rounded as any check takes a rounding (0.72 for 0.723): the f it implies is that rounding
    implied = 2 * (1 - 1 / speedup) if speedup > 0 else math.nan
    # the exercise says f is at most 1: taken uncapped, it is named
    verdict(speedup, 1 / ((1 - share) + share / 2), exercise, "step_speedup", [
        (1 / ((1 - raw) + raw / 2) if 1 < raw < 2 else None,
         f"f = {raw:.2g} is above 1: {phase}'s kernels ran on past the host's step, and no part is more than all "
         "of the step.", "cap f at 1, as the exercise says: f = min(1, ms / step_ms).")],
        "Amdahl: 1 / ((1 - f) + f / 2), f = that part's ms / step_ms of the last row.",
        also=[speedup] if 0 < implied <= 1 and accepted(implied, share) else [],
        inputs=f"1 / ((1 - f) + f / 2), f = {share:.3g}, {phase}'s share of the top rung's step")
    return passed(exercise, f"{phase.removesuffix('_ms')} takes {share:.0%} of the step: twice as fast gives "
                            f"{as_given(speedup)}x")
