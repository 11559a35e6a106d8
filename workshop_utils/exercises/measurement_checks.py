"""Notebook 04's exercises: measure, then decide (the loader's workers, the batch that fits, the next fix).

Exercise 4.1's answer is a function: on a measured sweep some mistakes give the right numbers by
chance, so the check also runs it on a sweep it builds, where every mistake gives its own answer.
"""

from __future__ import annotations

import math

import numpy as np

from ..lessons.sweeps import METRICS, amdahl_speedup
from ..system.display import format_number
from ..system.errors import WorkshopError
from .exercise_cells import NotYet, passed, require, require_answered
from .exercise_judging import attendee_function, called, checked, count, described, number, short, verdict


LOADER_ANSWERS = ("best_workers", "measured_speedup", "amdahl_bound")


def constructed_loader_sweep(pinned: bool = True):
    """A loader sweep where each mistake of Exercise 4.1 gives its own answer: (table, starting row).

    The start (2 workers, no pinning) is the fourth row: not the first, not the slowest, not the one that
    waits longest, not at 0 workers, not the fastest and not the one with the most workers; so a function
    that takes ``sweep.iloc[0]``, the slowest row, the longest wait or the 0-worker row in place of its
    ``start`` argument gets another answer. Every row waits for data a different share of its step, and the
    row that waits least is not the fastest.

    Its columns are those of ``dataloader_sweep``'s table, built the same way, so that a function reading any
    of them (``start.amdahl_max_speedup``, ``step_ms_median``) runs here as on the measured sweep.
    """
    import pandas as pd

    # The row that waits least is not the fastest (8 workers unpinned; 2 pinned where pinning was swept).
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
    for name, answer in zip(LOADER_ANSWERS, answers):
        require_answered(answer, exercise, f"`{name}` (what `loader_choice` returns) is still the placeholder `...`.",
                         "replace each `...` of the return line with your code.")
    return tuple(answers)


def _judge_loader(answers, sweep, start, exercise: str) -> tuple[int, float, float]:
    fastest = sweep.loc[sweep.samples_per_s.idxmax()]
    workers = count(answers[0], exercise, "best_workers", "a whole number of workers")
    require(workers in set(int(w) for w in sweep.num_workers), exercise,
            f"`best_workers` = {workers} is not a worker count of the sweep.", "pick one of its num_workers.")
    verdict(workers, int(fastest.num_workers), exercise, "best_workers", [
        (int(sweep.num_workers.max()), "the most workers, not the fastest setting.",
         "take the row with the highest samples_per_s (sweep.samples_per_s.idxmax())."),
        (int(sweep.loc[sweep.samples_per_s.idxmin()].num_workers), "that is the slowest row's.",
         "take the row with the highest samples_per_s."),
        (int(sweep.loc[sweep.data_wait_fraction.idxmin()].num_workers), "that is the row that waits least for "
         "data, not the fastest.", "take the row with the highest samples_per_s: the wait is a share of each step."),
    ], "take the num_workers of the row with the highest samples_per_s.", whole=True, also=[  # ties, as 4.3's
        int(row.num_workers) for _, row in sweep.iterrows()
        if format_number(float(row.samples_per_s)) == format_number(float(fastest.samples_per_s))])
    speedup = number(answers[1], exercise, "measured_speedup", "one number, a ratio")
    right = float(fastest.samples_per_s / start.samples_per_s)
    others = [row for _, row in sweep.iterrows()
              if not (row.num_workers == start.num_workers and row.pin_memory == start.pin_memory)]
    verdict(speedup, right, exercise, "measured_speedup", [
        (1 / right, "upside down.", "divide the fastest row's samples/s by the starting row's."),
        (float(fastest.samples_per_s - start.samples_per_s), "that is a difference of samples/s, not a ratio.",
         "divide the fastest row's samples/s by the starting row's."),
        (right - 1, "that is the gain, speed-up - 1; the speed-up is the ratio itself.",
         "divide the fastest row's samples/s by the starting row's, and subtract nothing."),
        (100 * right, "that is a percentage.", "give the ratio (1.5, not 150)."),
        *[(float(fastest.samples_per_s / row.samples_per_s), f"that is the speed-up over another row "
           f"({_row_name(row)}), not over `start`.", "divide by `start`'s samples_per_s: the function's argument, "
           "not a row you pick (iloc[0], the slowest, 0 workers).") for row in others],
    ], "the fastest row's samples_per_s / the starting row's.")
    bound = number(answers[2], exercise, "amdahl_bound", "one number, a ratio")
    wait = float(start.data_wait_fraction)
    if not 0 <= wait < 1:
        raise WorkshopError(f"{exercise}: the starting row's data_wait_fraction is {wait}.", "pass the measured sweep.")
    verdict(bound, 1 / (1 - wait), exercise, "amdahl_bound", [
        (1 / wait if wait else None, "that is 1/f.", "the ceiling is 1 / (1 - f): the part that stays."),
        (1 / (1 - float(fastest.data_wait_fraction)) if float(fastest.data_wait_fraction) < 1 else None,
         "that uses the fastest row's wait.",
         "Amdahl bounds what can be gained from where you start: the starting row's data_wait_fraction."),
        (1 / ((1 - wait) + wait / 2), "that is a loader twice as fast.",
         "the ceiling removes the wait entirely: 1 / (1 - f)."),
        (1 + wait, "1 + f is only the small-f approximation.", "compute 1 / (1 - f)."),
        (1 - wait, "that is the share of the step left, 1 - f; the ceiling is its inverse.", "compute 1 / (1 - f)."),
        *[(1 / (1 - float(row.data_wait_fraction)), f"that uses another row's wait ({_row_name(row)}), not "
           "`start`'s.", "take f from `start`, the function's argument, not a row you pick (iloc[0], the longest "
           "wait, 0 workers).") for row in others
          if row.name != fastest.name and 0 <= float(row.data_wait_fraction) < 1],
    ], "Amdahl's ceiling: 1 / (1 - f), f the starting row's data_wait_fraction.")
    return workers, speedup, bound


@checked
def check_loader_choice(loader_choice, loader_sweep, start_workers: int, exercise: str = "Exercise 4.1") -> bool:
    """``loader_choice(sweep, start)`` returns the fastest row's workers, its speed-up over the starting row,
    and Amdahl's ceiling 1 / (1 - f) there.

    Judged on the measured sweep, and on one the check builds where every mistake gives its own answer:
    on a measured sweep whose starting row is the fastest, "upside down" and the fastest row's f give the
    right numbers by chance.
    """
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


def _row_name(row) -> str:
    return f"{int(row.num_workers)} workers, {'pinned' if row.pin_memory else 'unpinned'}"


def _same_answer(a, b) -> bool:
    try:
        return math.isclose(float(a), float(b), rel_tol=1e-6)
    except Exception:  # noqa: BLE001 - answers that are no numbers are judged, and named, elsewhere
        return False


def memory_line(batch_sweep, exercise: str = "the check"):
    """(MiB per sample, MiB at batch 0): least squares over the batch sizes that fit."""
    fitted = batch_sweep[batch_sweep.status == "ok"]
    if len(fitted) < 2:
        raise WorkshopError(f"{exercise}: only {len(fitted)} batch size fit, and a line needs two.",
                            "sweep from a smaller start batch or with a larger memory cap.")
    slope, intercept = np.polyfit(fitted.batch_size.astype(float), fitted.peak_memory_mib.astype(float), 1)
    return float(slope), float(intercept)


def _memory_limit(limit_mib, exercise: str) -> float:
    """``limit_mib`` as MiB: the exercise cell sets it, so a value that is no limit is the attendee's to fix."""
    problem = f"`limit_mib` = {short(repr(limit_mib), 40)} is no memory limit: it should be a number of MiB above 0."
    fix = "keep the cell's first line, limit_mib = hp[\"memory_cap_mib\"] or the GPU's free memory in MiB."
    try:
        limit = number(limit_mib, exercise, "limit_mib", "one number, in MiB")
    except NotYet:
        raise NotYet(f"✗ {exercise}: {problem}", fix) from None
    require(limit > 0, exercise, problem, fix)
    return limit


@checked
def check_batch_memory(mib_per_sample, largest_batch, batch_sweep, limit_mib: float,
                       exercise: str = "Exercise 4.2") -> bool:
    """The slope of peak memory against batch size, and the largest batch the line keeps within ``limit_mib``."""
    limit_mib = _memory_limit(limit_mib, exercise)
    slope, intercept = memory_line(batch_sweep, exercise)
    if not slope > 0:
        raise WorkshopError(f"{exercise}: the measured peak memory does not grow with the batch (slope {slope:.3g}).",
                            "sweep again: on a shared machine another process can move the peak.")
    value = number(mib_per_sample, exercise, "mib_per_sample", "one number, in MiB per sample")
    fitted = batch_sweep[batch_sweep.status == "ok"]
    measured = batch_sweep.dropna(subset=["peak_memory_mib"])
    verdict(value, slope, exercise, "mib_per_sample", [
        *[(ratio, "that divides the whole peak by the batch.",
           "part of the memory does not grow with the batch: fit a line and take its slope (np.polyfit(..., 1)).")
          for ratio in (float((fitted.peak_memory_mib / fitted.batch_size).mean()),
                        float(fitted.peak_memory_mib.iloc[-1] / fitted.batch_size.iloc[-1]))],
        (float(np.polyfit(measured.batch_size.astype(float), measured.peak_memory_mib.astype(float), 1)[0])
         if len(measured) > len(fitted) else None,
         "the fit includes the batch that ran out of memory.", "fit only the rows whose status is 'ok'."),
        (intercept, "that is the line's intercept, the memory at batch 0; the slope comes first.",
         "np.polyfit(x, y, 1) returns the slope, then the intercept."),
        (1 / slope, "upside down: samples per MiB.", "fit peak_memory_mib against batch_size (x first, then y)."),
        *[(slope * factor, f"that is {unit} per sample, not MiB.",
           f"peak_memory_mib is in MiB already: fit it as it is{fix}.")
          for factor, unit, fix in ((2**20, "bytes", ", without converting to bytes"),
                                    (1024, "KiB", ", without multiplying by 1024"),
                                    (1 / 1024, "GiB", ", without dividing by 1024"))],
    ], "the slope of a least-squares line through (batch_size, peak_memory_mib) of the rows that fit.")
    largest = count(largest_batch, exercise, "largest_batch", "a whole number of samples")
    right = math.floor((limit_mib - intercept) / slope)
    from_given = math.floor((limit_mib - intercept) / value) if value > 0 else None  # the slope as they rounded it
    verdict(largest, right, exercise, "largest_batch", [
        (math.ceil((limit_mib - intercept) / slope), "rounded up: at that batch the line is above the limit.",
         "round down."),
        (math.floor(limit_mib / slope), "that leaves out the memory that does not grow with the batch.",
         "subtract the line's intercept from the limit first."),
        (int(fitted.batch_size.max()), "that is the largest batch of the sweep, not the line's limit.",
         "solve intercept + slope * b <= limit_mib for the largest whole b."),
    ], "the largest whole batch b with intercept + slope * b <= limit_mib.", whole=True, also=[from_given])
    return passed(exercise, f"{value:.2f} MiB per sample; up to batch {largest:,} in {limit_mib:,.0f} MiB")


def _largest_parts(row, parts: list[str]) -> list[str]:
    """The parts of ``row`` that tie for its largest: equal, or equal as wu.show_table shows them (three
    significant figures), since a reader of the table cannot tell those apart."""
    largest = max(float(row[part]) for part in parts)
    return [part for part in parts
            if float(row[part]) == largest or format_number(float(row[part])) == format_number(largest)]


@checked
def check_next_fix(biggest_phase, step_speedup, breakdown, exercise: str = "Exercise 4.3") -> bool:
    """The top rung's largest part of the step, and Amdahl's speed-up of the step if that part ran twice as fast.

    Parts that tie for the largest (equal as the table shows them) are each right, each judged with its own share.
    """
    parts = [c for c in breakdown.columns if c.endswith("_ms") and c != "step_ms"]
    top, first = breakdown.iloc[-1], breakdown.iloc[0]
    tied = _largest_parts(top, parts)
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
    baseline_biggest = max(parts, key=lambda part: first[part])
    others = [part for part in parts if part != "idle_ms"]
    # Largest of the top rung without idle time: the phases listed by hand, the wait between them forgotten.
    require(not ("idle_ms" in tied and phase not in tied and _largest_parts(top, others)[:1] == [phase]), exercise,
            f"{phase} is the top rung's largest part only without {' and '.join(tied)} "
            f"({format_number(float(top[tied[0]]))} ms against {format_number(float(top[phase]))} ms), which is a "
            "part of the step too.", "compare every _ms column of the last row but step_ms.")
    require(not (phase == baseline_biggest and phase not in tied), exercise, "that is the baseline's largest part.",
            "the top rung is the table's last row (breakdown.iloc[-1]).")
    require(phase in tied, exercise,
            f"{phase} is not the top rung's largest part ({phase} {format_number(float(top[phase]))} ms, "
            f"{' and '.join(tied)} {format_number(float(top[tied[0]]))} ms).",
            "take the part with the most milliseconds in the last row.")
    right = phase
    speedup = number(step_speedup, exercise, "step_speedup", "one number, a ratio")
    raw = top[right] / top.step_ms
    share = min(1.0, raw)
    verdict(speedup, 1 / ((1 - share) + share / 2), exercise, "step_speedup", [
        (1 / ((1 - raw) + raw / 2) if 1 < raw < 2 else None,
         f"f = {raw:.2g} is above 1: {right}'s kernels ran on past the host's step, and no part is more than all "
         "of the step.", "cap f at 1, as the exercise says: f = min(1, ms / step_ms)."),
        (2.0, "the step would be twice as fast only if that part were all of it.",
         "Amdahl: 1 / ((1 - f) + f / 2), f its share of the step."),
        (1 / (1 - share) if share < 1 else None, "that makes the part free; twice as fast halves its time.",
         "1 / ((1 - f) + f / 2)."),
        (1 / ((1 - first[right] / first.step_ms) + first[right] / first.step_ms / 2), "that is the baseline's share.",
         "use the last row (the top rung)."),
        (share, "that is the part's share of the step, f, not the speed-up.", "Amdahl: 1 / ((1 - f) + f / 2)."),
    ], "Amdahl: 1 / ((1 - f) + f / 2), f = that part's ms / step_ms.")
    return passed(exercise, f"{right.removesuffix('_ms')} takes {share:.0%} of the step: twice as fast gives "
                            f"{speedup:.2f}x")
