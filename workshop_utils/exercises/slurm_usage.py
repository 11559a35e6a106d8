"""Exercise 6.3: a finished job's efficiency and the request for the next run. The notebook's job has one CPU
and no GPU, where a missing division by the CPUs or a GPU count left out changes nothing, so the check also
runs the attendee's cell again on ``OTHER_JOB``."""

from __future__ import annotations

import math

from ..system.errors import WorkshopError
from .answer_values import Problem, kind, number_of, show
from .cell_again import earlier_values, run_cell_again
from .exercise_cells import NotYet, notebook_cell, passed, stores
from .exercise_judging import checked, number, verdict, written

USAGE = "Exercise 6.3"
TIME_MARGIN, MEMORY_MARGIN = 1.5, 1.25  # the next request: what the job used, with room to spare
ANSWERS = ("cpu_efficiency", "time_share", "gpu_hours", "next_time_limit_s", "next_memory_mib")
USAGE_KEYS = ("elapsed_s", "time_limit_s", "cpus", "gpus", "cpu_time_s", "max_rss_mib")
# A second job to judge the attendee's arithmetic on, where a CPU or GPU term left out gives another answer, and
# where rounding shows: 1.5 x its time is whole minutes (int() + 1 is not ceil), 1.25 x its memory 291.25 hundred MiB
# (round() is not ceil).
OTHER_JOB = {"job": "another job", "elapsed_s": 5400, "time_limit_s": 7200, "cpus": 8, "gpus": 4,
             "cpu_time_s": 25920.0, "max_rss_mib": 23300.0, "source": "made up: 8 CPUs and 4 GPUs for 1.5 hours"}


def next_request(usage: dict) -> tuple[int, int]:
    """(seconds, MiB) to ask for next time: the use with a margin, in whole minutes and 100 MiB."""
    return (60 * math.ceil(TIME_MARGIN * usage["elapsed_s"] / 60),
            100 * math.ceil(MEMORY_MARGIN * usage["max_rss_mib"] / 100))


def _usage_numbers(usage) -> dict:
    """The job's use as plain numbers; ``WorkshopError`` for what ``lesson.usage`` would never return."""
    fix = "pass the dict that lesson.usage(job) returned."
    if not isinstance(usage, dict) or not set(USAGE_KEYS) <= set(usage):
        what = f"has no {', '.join(repr(k) for k in USAGE_KEYS if k not in usage)}" if isinstance(usage, dict) else \
            f"is {kind(usage)}"
        raise WorkshopError(f"usage {what}: not what lesson.usage(job) returns.", fix)
    read = {}
    for key in USAGE_KEYS:
        try:
            read[key] = number_of(usage[key])
        except Problem as problem:
            raise WorkshopError(f"usage[{key!r}] {problem}: not what lesson.usage(job) returns.", fix) from None
    if min(read["elapsed_s"], read["time_limit_s"], read["cpus"], read["max_rss_mib"]) <= 0 or min(
            read["gpus"], read["cpu_time_s"]) < 0:
        raise WorkshopError(f"usage {show({k: usage.get(k) for k in USAGE_KEYS}, 200)} holds a count or time below "
                            "what a finished job can have.", fix)
    return read


def _judge_usage(answers: dict, usage: dict, exercise: str) -> None:
    """Each answer against the same arithmetic on ``usage``, by the rule every exercise shares."""
    elapsed, cpus, gpus, limit = usage["elapsed_s"], usage["cpus"], usage["gpus"], usage["time_limit_s"]
    right_time, right_memory = next_request(usage)
    inputs = ", ".join(f"{key} {usage[key]:g}" for key in USAGE_KEYS)
    for name, right, inside, why, formula in (
            ("cpu_efficiency", usage["cpu_time_s"] / (elapsed * cpus), lambda v: 0 <= v <= 1,
             "a share of the allocated core-seconds lies between 0 and 1.", "cpu_time_s / (elapsed_s x cpus)."),
            ("time_share", elapsed / limit, lambda v: 0 <= v <= 1,
             "a finished job used between none and all of its time limit.", "elapsed_s / time_limit_s."),
            ("gpu_hours", elapsed * gpus / 3600, lambda v: v >= 0, "a charge is never negative.",
             "elapsed_s x gpus / 3600 (0 for a job without GPUs)."),
            ("next_time_limit_s", right_time, lambda v: v > 0 and v % 60 == 0, "Slurm's time limits are whole "
             "minutes above zero, so seconds that are a positive multiple of 60.", "60 x ceil(1.5 x elapsed_s / 60)."),
            ("next_memory_mib", right_memory, lambda v: v > 0 and v % 100 == 0, "the request is in whole 100 MiB.",
             "100 x ceil(1.25 x max_rss_mib / 100).")):
        value = answers[name]
        if not inside(value) and written(value) != show(value):  # the line shows it rounded: say it as given
            why = f"{why.rstrip('.')}, and {show(value)} (as given) is not."
        minutes = [(right / 60, "that is in minutes, as --time reads a bare number; the answer is in seconds.",
                    f"{formula.rstrip('.')}, in seconds.")] if name == "next_time_limit_s" else []
        verdict(value, right, exercise, name, minutes, formula, whole=name.startswith("next_"), inputs=inputs,
                limits=[(inside(value) or not inside(right), why, formula)])


def _run_cell(cell: str, namespace: dict, usage: dict) -> dict | None:
    """The answers the cell computes from ``usage``; None when it cannot run apart from the notebook."""
    again = run_cell_again(cell, namespace, {"usage": dict(usage)}, ANSWERS)
    try:
        return again and {name: number(again[name], USAGE, name) for name in ANSWERS}
    except NotYet:
        return None


@checked
def check_job_usage(cpu_efficiency, time_share, gpu_hours, next_time_limit_s, next_memory_mib, usage: dict,
                    exercise: str = USAGE, cell: str | None = None) -> bool:
    """Each answer against the same arithmetic on ``usage``; then, where the exercise cell can be run again,
    its answers for ``OTHER_JOB``, where a missing division by the CPUs or a GPU count left out shows."""
    given = (cpu_efficiency, time_share, gpu_hours, next_time_limit_s, next_memory_mib)
    answers = {name: number(value, exercise, name) for name, value in zip(ANSWERS, given)}
    read = _usage_numbers(usage)
    _judge_usage(answers, read, exercise)
    cell, namespace = (cell, {}) if cell is not None else notebook_cell(ANSWERS)[1:]
    judged_elsewhere, earlier = False, []
    again = _run_cell(cell, namespace, usage) if isinstance(cell, str) else None
    # Only a cell that gives the answers passed here, run on the same job, speaks for them on another job;
    # and only one whose answers move with the job: a cell that reads earlier variables, not `usage`, cannot.
    if again is not None and all(math.isclose(again[n], answers[n], rel_tol=1e-9, abs_tol=1e-12) for n in ANSWERS):
        other = _run_cell(cell, namespace, OTHER_JOB)
        moved = other is not None and not all(math.isclose(other[n], again[n], rel_tol=1e-9, abs_tol=1e-12)
                                              for n in ANSWERS)
        # the same answers on another job: numbers typed in (4.1 refuses a function that ignores its sweep alike)
        if other is not None and not moved and not earlier_values(cell, namespace, ("usage",), ANSWERS):
            raise NotYet(f"✗ {exercise}: your cell gives the same five answers for another job ({OTHER_JOB['cpus']} "
                         f"CPUs, {OTHER_JOB['gpus']} GPUs, {OTHER_JOB['elapsed_s']:,} s) as for this one: it holds "
                         "typed-in numbers, not arithmetic on `usage`.", "compute each answer from `usage`, e.g. "
                         "cpu_efficiency = usage[\"cpu_time_s\"] / (usage[\"elapsed_s\"] * usage[\"cpus\"]).")
        if moved:
            try:
                _judge_usage(other, _usage_numbers(OTHER_JOB), f"{exercise} (your cell, run on another job: "
                                                               f"{OTHER_JOB['cpus']} CPUs, {OTHER_JOB['gpus']} GPUs)")
                judged_elsewhere = True
            except NotYet:
                # A value from an earlier cell (`cpus = usage['cpus']`) stays this job's on the other: no verdict
                earlier = earlier_values(cell, namespace, ("usage",), ANSWERS)
                if not earlier:
                    raise
    elapsed, cpus = read["elapsed_s"], read["cpus"]
    right_time, right_memory = next_request(read)
    busy = read["cpu_time_s"] / elapsed
    caveat = ""
    if not judged_elsewhere and (cpus == 1 or read["gpus"] == 0):
        blind = " and ".join(([f"{cpus:g} CPU cannot show a missing / cpus"] if cpus == 1 else []) +
                             (["0 GPUs cannot show a missing x gpus"] if read["gpus"] == 0 else []))
        reads = (f" (your cell reads {', '.join(f'`{name}`' for name in earlier)} from an earlier cell, which keeps "
                 "this job's value on another)") if earlier else ""
        advice = ("leave `usage` as the notebook set it, and the check can run your cell on another job" if
                  isinstance(cell, str) and "usage" in stores(cell) else
                  "compute each answer from `usage` in one cell, so the check can run it on another job")
        caveat = f"; judged on this job alone, whose {blind}{reads}: {advice}"
    if busy > cpus:  # a review: 120% passed unexplained, where the exercise says between 0 and 1
        caveat += (f"; above 100%: its threads ran on more than the {cpus:g} core(s) it was given, which a node "
                   "without Slurm's cgroup confinement allows: confined, they would share those")
    return passed(exercise, f"{100 * busy / cpus:.0f}% of {cpus:g} core(s) busy, "
                            f"{100 * elapsed / read['time_limit_s']:.0f}% of the time limit used; next time ask "
                            f"--time={right_time // 60} --mem={right_memory}M{caveat}")
