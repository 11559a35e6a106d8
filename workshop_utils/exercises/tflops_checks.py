"""Notebook 01's exercises: achieved TFLOP/s, a matrix multiply's TFLOP/s and MFU, each judged from the inputs the
exercise names; MFU carries 1.1's and 1.2's answers as the attendee rounded them."""

import numbers

import numpy as np
import torch
from torch.utils.flop_counter import FlopCounterMode

from ..spine.timing import Timings, time_repeats
from ..system.errors import WorkshopError
from ..system.hardware import as_device, peak_tflops
from .answer_values import Problem, number_of
from .exercise_cells import NotYet, passed, require, require_answered
from .exercise_judging import (answered_input, called, carried, checked, described, kit_input, kit_numbers, number,
                               verdict, written)

EXERCISE_N = {"cuda": 4096, "cpu": 1024}  # the n of Exercise 1.2's cell: a GPU's, and a CPU's (or any other)
EXERCISE_DTYPE = torch.float32  # what the multiply of Exercise 1.2's cell returns: the precision the model trained in


@checked
def check_achieved_tflops(achieved_tflops, flops_per_sample: float, samples_per_s: float,
                          exercise: str = "Exercise 1.1") -> bool:
    rerun = "rerun the training cell: a run that trained measures both."
    flops_per_sample, samples_per_s = kit_numbers(exercise, rerun, "the run's", flops_per_sample=flops_per_sample,
                                                  samples_per_s=samples_per_s)
    value = number(achieved_tflops, exercise, "achieved_tflops", "one number, in TFLOP/s")
    verdict(value, flops_per_sample * samples_per_s / 1e12, exercise, "achieved_tflops", [],
            "achieved TFLOP/s = FLOPs per sample x samples per second / 1e12 (tera = 10^12).",
            inputs=f"{written(flops_per_sample)} FLOPs x {written(samples_per_s)} samples/s / 1e12")
    return passed(exercise, f"{written(value)} TFLOP/s")


def timed_seconds(timings, exercise: str) -> np.ndarray:
    require_answered(timings, exercise, "`timings` is still the placeholder `...`.",
                     "store what wu.time_repeats(...) returns in it, run that cell, then this one.")
    values = timings.seconds if isinstance(timings, Timings) else timings
    held = isinstance(values, (np.ndarray, list, tuple, torch.Tensor))
    values = [] if not held else list(values.reshape(-1)) if hasattr(values, "reshape") else list(values)
    require(bool(values), exercise, "`timings` holds no repeats." if held else
            f"`timings` should be what wu.time_repeats returns, got {described(timings)}.",
            "timings = wu.time_repeats(lambda: a @ b, repeats=10, device=device)")
    seconds = np.array([number(v, exercise, f"timings[{i}]") for i, v in enumerate(values)], dtype=float)
    require(bool((seconds > 0).all()), exercise, f"`timings` holds a time of {seconds.min():g} s.",
            "a time is above 0: time with wu.time_repeats.")
    return seconds


def _matmul_seconds(n, seconds, timings, device, exercise: str, timed=None) -> tuple[float, float]:
    """1.2's judgement of what its rate is computed from (n, the multiply timed, `timings`, `seconds`), which 1.3
    applies too: (`seconds` as given, the seconds the rate should come from: `timings`' median where there is one)."""
    kit_input(isinstance(n, numbers.Integral) and not isinstance(n, bool) and n >= 1,
              f"{exercise}: n = {n!r} is no matrix size.", "pass the n of the exercise cell.")
    size = _exercise_n(device)
    require(n >= size, exercise, f"n = {n}, but the exercise multiplies {size} x {size} matrices: a small multiply "
            "leaves the device idle between calls and measures no peak.", f"keep the exercise cell's n ({size} here).")
    if timed is not None:
        _timed_workload(timed, int(n), device, exercise)
    measured = None if timings is None else timed_seconds(timings, exercise)
    given = number(seconds, exercise, "seconds", "one number, in seconds")
    require(given > 0, exercise, f"`seconds` = {given:g}: a time must be above 0.",
            "take the median of the timings: wu.time_repeats(...).median.")
    _timed_output(timings, n, exercise)
    if measured is None:
        return given, given
    verdict(given, float(np.median(measured)), exercise, "seconds", [], "seconds = timings.median, in seconds.",
            inputs=f"the median of the {len(measured)} repeats in `timings`")
    return given, float(np.median(measured))


def _timed_output(timings, n: int, exercise: str) -> None:
    """What the function `timings` measured returned (``time_repeats`` keeps its shape and dtype): the exercise's
    float32 n x n product, or those seconds are another workload's (a bfloat16 one runs many times faster)."""
    shape, dtype = getattr(timings, "output_shape", None), getattr(timings, "output_dtype", None)
    if shape is not None and tuple(shape) != (n, n):
        result = f"a {' x '.join(map(str, shape)) or 'single number'} result"
    elif dtype is not None and dtype != EXERCISE_DTYPE:
        result = f"a {str(dtype).removeprefix('torch.')} result"
    else:
        return
    raise NotYet(f"✗ {exercise}: `timings` measured a function that returned {result}, not the {n} x {n} "
                 f"{str(EXERCISE_DTYPE).removeprefix('torch.')} of the exercise's multiply: those seconds belong to "
                 "another workload.", "time the product itself (matmul = lambda: a @ b, a and b made with n), then "
                                      "run the cell again.")


def _exercise_n(device) -> int:
    return EXERCISE_N["cuda"] if device is not None and torch.device(device).type == "cuda" else EXERCISE_N["cpu"]


def _timed_workload(timed, n: int, device, exercise: str) -> None:
    """``timed`` does one n x n float32 product on ``device``, as ``torch.utils.flop_counter`` counts."""
    answered_input(timed, exercise, "the exercise cell", "matmul")
    require(callable(timed), exercise, f"`matmul` should be the function you timed, got {described(timed)}.",
            "matmul = lambda: a @ b, and time it: wu.time_repeats(matmul, repeats=10, device=device).")
    with FlopCounterMode(display=False) as counter:
        out = called(timed, exercise, "matmul")
    flops, right, side = counter.get_total_flops(), 2 * n**3, round((counter.get_total_flops() / 2) ** (1 / 3))
    wanted = torch.device(device).type if device is not None else None  # what no tensor shows is not judged
    dtype, on = (out.dtype, out.device.type) if torch.is_tensor(out) else (torch.float32, wanted)
    what = (f"a {str(dtype)[6:]} multiply on {on}" if flops == right else "no matrix multiply" if flops == 0 else
            f"a {side} x {side} product" if 2 * side**3 == flops else
            f"{flops:,} FLOPs, not the {right:,} of an {n} x {n} by {n} x {n} product")
    require(flops == right and dtype == torch.float32 and on == (wanted or on), exercise,
            f"the function you timed does {what}; the exercise times one {n} x {n} float32 multiply on "
            f"{wanted or on or 'the device'} ({right:,} FLOPs).",
            "a, b = torch.randn(n, n, device=device), torch.randn(n, n, device=device); matmul = lambda: a @ b.")


@checked
def check_matmul_tflops(matmul_tflops, n: int, seconds, device_name: str | None = None, device=None,
                        exercise: str = "Exercise 1.2", *, timings=None, precision: str = "fp32", timed=None) -> bool:
    """2 n^3 FLOPs in the median of ``timings``, at most the data-sheet peak. With ``device`` the check times the
    multiply too and refuses only a gap beyond 20x: on a shared machine both timings move with others' work."""
    device = None if device is None else as_device(device, exercise)
    given, right_seconds = _matmul_seconds(n, seconds, timings, device, exercise, timed)
    value = number(matmul_tflops, exercise, "matmul_tflops", "one number, in TFLOP/s")
    right = 2 * n**3 / right_seconds / 1e12
    verdict(value, right, exercise, "matmul_tflops", [], "TFLOP/s = 2 * n**3 / seconds / 1e12: each multiply-add "
            "is two FLOPs.", also=[2 * n**3 / given / 1e12], inputs=f"2 x {n}^3 FLOPs / {right_seconds:.4g} s / 1e12")
    if device_name is not None:
        peak = peak_tflops(_device_name(device_name, exercise), precision)
        require(peak is None or right <= peak, exercise, f"{right:.0f} TFLOP/s is more than {device_name} can do in "
                f"{precision} ({peak or 0:g} TFLOP/s, its data-sheet peak).",
                "time float32 matrices with wu.time_repeats(..., device=device), which synchronizes, TF32 off.")
    compared = ""
    if device is not None:
        a, b = torch.randn(n, n, device=device), torch.randn(n, n, device=device)
        own = time_repeats(lambda: a @ b, repeats=5, device=device).median
        ratio = right_seconds / own
        require(1 / 20 <= ratio <= 20, exercise, f"your {right_seconds:.3g} s is {max(ratio, 1 / ratio):.0f}x "
                f"{'longer' if ratio > 1 else 'shorter'} than this check's own {own:.3g} s for the same multiply.",
                f"time `a @ b` of two {n} x {n} float32 matrices on `device` with wu.time_repeats(..., device=device).")
        compared = (f" (this check's own timing of `a @ b`: {own:.3g} s against your {right_seconds:.3g} s; far apart "
                    "on an idle machine means something else was timed)")
    return passed(exercise, f"{written(value)} TFLOP/s for a {n} x {n} matmul{compared}")


def _device_name(name, exercise: str) -> str:
    kit_input(isinstance(name, str), f"{exercise}: the device name is {name!r}, not a name.",
              'pass env["device_name"], as the check cell does.')
    return name


@checked
def check_mfu(mfu, achieved_tflops, device_name: str, precision: str, measured_peak_tflops,
              exercise: str = "Exercise 1.3", *, flops_per_sample: float | None = None,
              samples_per_s: float | None = None, n: int | None = None, timings=None, seconds=None) -> bool:
    """MFU = the achieved rate / the data-sheet peak, or / 1.2's measured rate without one: then it may exceed 1
    (a multiply timed on a busy machine), which the pass says instead of refusing a right division. With ``n`` and
    ``timings`` (1.2's, as the check cell passes them with ``seconds``) that rate is judged as 1.2 judges it."""
    require_answered(mfu, exercise, "`mfu` is still the placeholder `...`.")
    table_peak = peak_tflops(_device_name(device_name, exercise), precision)
    exact = [flops_per_sample * samples_per_s / 1e12] if None not in (flops_per_sample, samples_per_s) else []
    achieved = carried(achieved_tflops, exact, exercise, "achieved_tflops", "Exercise 1.1")
    peak = exact_peak = table_peak  # without one, 1.2's measured rate stands in
    if not table_peak:
        rates = []  # 1.2's timings' rate, and as 1.2 accepts it, the rate from `seconds` as the attendee rounded it
        if n is not None and timings is not None:
            for name, value in (("timings", timings), ("seconds", seconds)):
                answered_input(value, exercise, "Exercise 1.2", name)
            # 1.2's own judgement of the timing its rate comes from, with 1.2 named first: 1.3 builds on what 1.2
            # accepts, and refuses what 1.2 refuses in 1.2's words
            try:
                given, median = _matmul_seconds(n, seconds, timings, None, f"{exercise}: Exercise 1.2, which this "
                                                "exercise builds on, is not right yet")
            except WorkshopError as err:  # a kit input of 1.2 (its n) too: 1.2's cell is where it is fixed
                raise type(err)(err.problem, f"fix Exercise 1.2 first: {err.fix}") from None
            rates = [2 * n**3 / median / 1e12, 2 * n**3 / given / 1e12]
        peak = carried(measured_peak_tflops, rates, exercise, "matmul_tflops", "Exercise 1.2")
        exact_peak = rates[0] if rates else peak
        require(peak > 0, exercise, f"`matmul_tflops` = {peak:g} from Exercise 1.2 is no rate.",
                "fix Exercise 1.2 first.")
    right = achieved / peak
    # an achieved rate above the data-sheet peak: 1.1's answer, or (where 1.1 was judged here) the run's numbers
    require(not table_peak or 0 < right <= 1, exercise, f"`achieved_tflops` = {achieved:.4g} from Exercise 1.1 is "
            f"not between 0 and {device_name}'s {precision} peak of {table_peak or 0:g} TFLOP/s.",
            "fix Exercise 1.1 first" + (": the run it computes from is wrong, rerun the notebook from the top."
                                        if exact else "."))
    value = number(mfu, exercise, "mfu", "one number, a fraction")
    try:  # 1.2's rate, named as a mistake where there is a data-sheet peak
        measured_rate = number_of(measured_peak_tflops) if table_peak else 0.0
    except Problem:
        measured_rate = 0.0
    source = "the data-sheet peak" if table_peak else "the measured matmul rate, standing in for a peak"
    formula = "MFU = achieved TFLOP/s / peak TFLOP/s"
    verdict(value, right, exercise, "mfu", [(1.0 if right > 1 else None, "that caps MFU at 1; of a measured rate, "
            "standing in for a peak, it may be above 1.", f"{formula}, not capped."),
            (100 * right if 0.01 < right <= 1 else None, "a percentage, above 1: MFU is a fraction (0.05 is 5%).",
             f"{formula}, not x 100."),
            # the notebook's own branch divides by 1.2's rate where there is no peak: here there is one
            (achieved / measured_rate if table_peak and measured_rate > 0 else None,
             f"that divides by your measured matmul rate; {device_name} has a data-sheet {precision} peak of "
             f"{table_peak or 0:g} TFLOP/s.", f"{formula}: wu.peak_tflops(device_name, precision).")],
            f"{formula}, a fraction (0.05 is 5%).", also=[(exact[0] if exact else achieved) / exact_peak],
            inputs=f"achieved_tflops {written(achieved)} / {written(peak)} TFLOP/s, {source}",
            limits=[(value > 0, "MFU is a share of the peak, above 0.", f"{formula}."),
                    (value <= 1 or right > 1, "MFU above 1, but the achieved rate is below the peak here.",
                     f"{formula}, a fraction between 0 and 1.")])
    if right <= 1:
        # to one decimal, or to two significant digits below 1%: a tiny MFU reads 0.0012%, never 0.0%
        return passed(exercise, f"MFU {100 * value:.1f}% of {source}" if value >= 0.01 else
                      f"MFU {100 * value:.2g}% of {source}")
    percent = 100 * (value if value > 1 else right)  # as many decimals as show it above 100 (100.4, not 100)
    percent = next((f"{percent:.{d}f}" for d in range(6) if round(percent, d) > 100), f"{percent:.6f}")
    return passed(exercise, f"MFU {percent}% of the measured matmul rate: above 100% means the multiply in Exercise "
                            "1.2 ran slower than this machine can, most likely beside other work; rerun 1.2 and this "
                            "cell on an idle machine for a rate that is a ceiling")
