"""The checks of the notebooks' exercises: each judges the answer against what the exercise asks.

A check takes the attendee's answer and the inputs the exercise names, works the right answer out
itself from those inputs (never a number typed in, never from another answer of the attendee's), and
either prints one ✓ line or raises ``NotYet`` with what is wrong and a hint. Where a common mistake
gives a predictable value (a forgotten 1e12, the wrong peak, a percentage for a fraction), the message
names that mistake; where two mistakes give the same value there, it names both. Where the measured
data cannot tell a mistake from the right answer, the attendee writes a function and the check also
runs it on a constructed case where they differ (Exercise 4.1).

Every check reads its answers strictly: an int, a float, a NumPy scalar or a one-element tensor or
array is a number; text, lists, None, booleans, NaN and infinities are not, and get one line saying
what is expected. An exception in the attendee's code is one line naming their line and the error;
an exception inside a check itself is a defect of the kit (``KitDefect``), also one line, its cause
chained for whoever debugs it.
"""

from __future__ import annotations

import decimal
import functools
import inspect
import linecache
import math
import numbers
import traceback
from collections import Counter

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from ..parallel.comm_model import Link, ring_all_reduce_s
from ..parallel.pipeline import bubble_fraction
from ..parallel.sharding import BYTES_PER_PARAMETER, ZERO_STAGES
from ..spine.gpt import GPTSize, flops_per_token_closed_form
from ..spine.precision import autocast
from ..spine.timing import Timings, time_repeats
from ..system.errors import WorkshopError
from ..system.hardware import PRECISIONS, peak_tflops
from .exercises import NotYet, exercise_check, passed, require, require_answered

# ---------------------------------------------------------------- what every check shares

LARGEST_COUNT = 2**53  # beyond it a float no longer holds every whole number


class KitDefect(WorkshopError):
    """A check failed on its own, not on the answer: a bug of the kit (its cause is chained)."""


def checked(check):
    """Decorate a check: ``Unsolved`` prints its one line (``exercise_check``); any exception that is no
    ``WorkshopError`` becomes a one-line ``KitDefect``, so that no check ever shows a traceback."""
    signature = inspect.signature(check)
    default = signature.parameters["exercise"].default if "exercise" in signature.parameters else "the exercise"

    @exercise_check
    @functools.wraps(check)
    def run(*args, **kwargs):
        try:
            signature.bind(*args, **kwargs)
        except TypeError as err:
            raise WorkshopError(f"{check.__name__} was called with arguments it does not take ({err}).",
                                "run the check cell as the notebook gives it.") from None
        try:
            return check(*args, **kwargs)
        except WorkshopError:
            raise
        except Exception as err:  # noqa: BLE001 - turned into one line; the cause stays chained
            exercise = signature.bind(*args, **kwargs).arguments.get("exercise", default)
            raise KitDefect(f"✗ {exercise}: the check itself failed ({type(err).__name__}: {short(err)}); that is "
                            "a defect of the kit, not a verdict on your answer.",
                            "tell the instructor; the error's __cause__ holds the check's traceback.") from err

    return run


def short(err_or_text, limit: int = 200) -> str:
    """An error's message (or a text) on one line, at most ``limit`` characters."""
    text = " ".join(str(err_or_text).split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _shown(value) -> str:
    try:
        text = short(repr(value), 60)
    except Exception:  # noqa: BLE001 - an object whose repr fails is still named by its type
        text = "?"
    return f"a {type(value).__name__} ({text})"


def number(value, exercise: str, name: str, what: str = "one number") -> float:
    """``value`` as a float: an int, a float, a NumPy scalar, or a one-element tensor or array.

    ``...`` is "not yet solved" (``Unsolved``); anything else that is no finite number is ``NotYet``
    saying what is expected: text ("64"), a list, None, a bool, NaN, an infinity.
    """
    require_answered(value, exercise, f"`{name}` is still the placeholder `...`.",
                     "replace the `...` in the exercise cell with your code, run that cell, then this one.")
    expected = f"`{name}` should be {what}"
    if value is None:
        raise NotYet(f"✗ {exercise}: `{name}` is None.",
                     f"assign the number to `{name}` (a function that ends without `return` gives None).")
    if isinstance(value, (str, bytes)):
        raise NotYet(f"✗ {exercise}: {expected}, got the text {short(repr(value), 40)}.",
                     f"assign the number itself, without quotes ({name} = 64, not '64').")
    if isinstance(value, (bool, np.bool_)):
        raise NotYet(f"✗ {exercise}: {expected}, got {value}.",
                     "a comparison gives True or False: assign the number.")
    try:
        if torch.is_tensor(value) or isinstance(value, np.ndarray):
            kind = "tensor" if torch.is_tensor(value) else "array"
            size = value.numel() if kind == "tensor" else value.size
            if size != 1:
                raise NotYet(f"✗ {exercise}: {expected}, got a {kind} of shape {tuple(value.shape)}.",
                             "reduce it to one number (a sum, a mean, one element), then .item().")
            numeric = (value.dtype != torch.bool and not value.dtype.is_complex) if kind == "tensor" else \
                value.dtype.kind in "iuf"
            if not numeric:
                raise NotYet(f"✗ {exercise}: {expected}, got a {kind} of {value.dtype}.",
                             "assign a real number (an int or a float).")
            item = value.detach().cpu().reshape(()).item() if kind == "tensor" else value.reshape(()).item()
            converted = float(item)
        elif isinstance(value, (numbers.Real, decimal.Decimal)):
            converted = float(value)
        else:
            raise NotYet(f"✗ {exercise}: {expected}, got {_shown(value)}.",
                         "assign one number (an int or a float); a tensor's .item() gives one.")
    except NotYet:
        raise
    except OverflowError:
        raise NotYet(f"✗ {exercise}: `{name}` is too large to be a number here.",
                     "check the units and the powers of ten in your formula.") from None
    except Exception as err:  # noqa: BLE001 - whatever the object does on conversion, the answer is no number
        raise NotYet(f"✗ {exercise}: {expected}; reading it as one failed ({type(err).__name__}).",
                     "assign one number (an int or a float).") from None
    if math.isnan(converted):
        raise NotYet(f"✗ {exercise}: `{name}` is nan (not a number).",
                     "nan comes from 0/0, inf - inf, or an input that is nan already: check what your formula divides.")
    if math.isinf(converted):
        raise NotYet(f"✗ {exercise}: `{name}` is {converted}.",
                     "an infinity comes from dividing by zero or from a result too large: check the formula's units.")
    return converted


def count(value, exercise: str, name: str, what: str = "a whole number") -> int:
    """``value`` as an int: a number (see ``number``) that is whole and not absurdly large."""
    converted = number(value, exercise, name, what)
    require(converted == math.floor(converted), exercise, f"`{name}` = {converted:g} is not a whole number.",
            "a count is whole: round with math.ceil or math.floor, whichever the question asks for.")
    require(abs(converted) <= LARGEST_COUNT, exercise, f"`{name}` = {converted:.3g} is far too large to be the count.",
            "check the formula's units.")
    return int(converted)


def verdict(value: float, right: float, exercise: str, name: str, mistakes, hint: str, rel: float = 1e-3,
            abs_tol: float = 0.0, same=None, limits=()) -> None:
    """Return when ``value`` is ``right``; else ``NotYet`` naming the mistake(s) it matches, or showing the value.

    ``mistakes`` holds ``(what that mistake gives, problem, fix)``; one that gives the right value (or
    nothing, None) is skipped. When two mistakes give ``value`` here, the message names both: naming
    one would be a guess. ``limits`` holds ``(holds, problem, fix)``: physical bounds, said when no
    mistake is recognised and one does not hold.
    """
    same = same or (lambda a, b: math.isclose(a, b, rel_tol=rel, abs_tol=abs_tol))
    if same(value, right):
        return
    matched = []
    for wrong, problem, fix in mistakes:
        if wrong is None or (isinstance(wrong, float) and math.isnan(wrong)):
            continue
        if not same(wrong, right) and same(value, wrong) and problem not in [p for p, _ in matched]:
            matched.append((problem, fix))
    shown = f"`{name}` = {value:.4g}"
    if len(matched) == 1:
        raise NotYet(f"✗ {exercise}: {shown}: {matched[0][0]}", matched[0][1])
    if matched:
        raise NotYet(f"✗ {exercise}: {shown}, which {len(matched)} mistakes give here: "
                     + " Or: ".join(p for p, _ in matched), " / ".join(f for _, f in matched))
    for holds, problem, fix in limits:
        require(holds, exercise, f"{shown}: {problem}", fix)
    raise NotYet(f"✗ {exercise}: {shown} is not right.", hint)


def attendee_error(err: BaseException, function, exercise: str, name: str, hint: str | None = None) -> NotYet:
    """One line for an exception raised while the attendee's ``function`` ran: their line and the error."""
    code = getattr(function, "__code__", None)
    frames = traceback.extract_tb(err.__traceback__)
    own = [f for f in frames if code is not None and f.filename == code.co_filename]
    error = f"{type(err).__name__}: {short(err, 160)}" if str(err) else type(err).__name__
    if own:
        frame = own[-1]
        line = (frame.line or linecache.getline(frame.filename, frame.lineno)).strip()
        return NotYet(f"✗ {exercise}: `{name}` raised {error} "
                      f"(line {frame.lineno} of its cell: `{short(line, 80)}`).",
                      hint or "that line of your code raised it; fix it and run the exercise cell again.")
    return NotYet(f"✗ {exercise}: calling `{name}` raised {error}.",
                  hint or f"check how `{name}` is defined: its arguments and what it calls.")


def _answered_input(value, exercise: str, earlier: str, name: str) -> None:
    """``Unsolved`` when an input that an earlier exercise computes is still its placeholder."""
    require_answered(value, exercise, f"`{name}` from {earlier} is still the placeholder `...`.",
                     f"solve {earlier} first; this exercise builds on it.")


def _device(device, exercise: str) -> torch.device:
    try:
        return torch.device(device)
    except (TypeError, RuntimeError, ValueError):
        raise WorkshopError(f"{exercise}: {device!r} is no device.", "pass the device the model trained on.") from None


# ---------------------------------------------------------------- notebook 01: TFLOP/s and MFU by hand


@checked
def check_achieved_tflops(achieved_tflops, flops_per_sample: float, samples_per_s: float,
                          exercise: str = "Exercise 1.1") -> bool:
    """achieved TFLOP/s = training FLOPs per sample x samples per second / 1e12."""
    value = number(achieved_tflops, exercise, "achieved_tflops", "one number, in TFLOP/s")
    right = flops_per_sample * samples_per_s / 1e12
    verdict(value, right, exercise, "achieved_tflops", [
        (right * 1e12, "that is FLOP/s, not TFLOP/s.", "divide by 1e12 (tera = 10^12)."),
        (right * 1e3, "that is GFLOP/s, not TFLOP/s.", "divide by 1e12, not 1e9."),
        (right * 3, "three times too much: `flops` already counts forward and backward.",
         "multiply `flops` by the samples per second, nothing else."),
        (flops_per_sample / samples_per_s / 1e12, "you divided by the throughput.",
         "FLOP/s = FLOPs per sample x samples per second."),
    ], "achieved TFLOP/s = FLOPs per sample x samples per second / 1e12.")
    return passed(exercise, f"{value:.3g} TFLOP/s")


def timed_seconds(timings, exercise: str, name: str = "timings") -> np.ndarray:
    """The seconds of each repeat in what ``wu.time_repeats`` returned (or a list of seconds)."""
    require_answered(timings, exercise, f"`{name}` is still the placeholder `...`.",
                     "store what wu.time_repeats(...) returns in it, run that cell, then this one.")
    if isinstance(timings, Timings):
        values = list(timings.seconds)
    elif torch.is_tensor(timings):
        values = list(timings.detach().cpu().reshape(-1))
    elif isinstance(timings, np.ndarray):
        values = list(timings.reshape(-1))
    elif isinstance(timings, (list, tuple)):
        values = list(timings)
    else:
        raise NotYet(f"✗ {exercise}: `{name}` should be what wu.time_repeats returns, got {_shown(timings)}.",
                     f"{name} = wu.time_repeats(lambda: a @ b, repeats=10, device=device)")
    require(len(values) > 0, exercise, f"`{name}` holds no timing.", "time at least one repeat.")
    seconds = np.array([number(v, exercise, f"each of `{name}`") for v in values], dtype=float)
    require(bool((seconds > 0).all()), exercise, f"`{name}` holds a time of {seconds.min():g} s.",
            "a time is above 0: time with wu.time_repeats.")
    return seconds


@checked
def check_matmul_tflops(matmul_tflops, n: int, seconds, device_name: str | None = None, device=None,
                        exercise: str = "Exercise 1.2", *, timings=None, precision: str = "fp32") -> bool:
    """An n x n by n x n matrix multiply is n^3 multiply-adds, 2 n^3 FLOPs, in the median of ``timings``.

    ``timings`` (what ``wu.time_repeats`` returned) is the measurement: ``seconds`` must be its median in
    seconds (not milliseconds, not the total or the mean of the repeats) and ``matmul_tflops`` follows
    from it. Without ``timings``, ``seconds`` stands for the measurement. The rate cannot exceed the
    data-sheet peak of ``precision`` on ``device_name`` (a clock stopped before the GPU finished, or a
    multiply that ran in another precision). With ``device`` the check times such a multiply itself and
    shows its median beside the answer; only a gap beyond 100x (another size, another device, no
    multiply at all) is a verdict, since on a shared machine both timings move with other people's work.
    """
    if not isinstance(n, numbers.Integral) or n < 1:
        raise WorkshopError(f"{exercise}: n = {n!r} is no matrix size.", "pass the n of the exercise cell.")
    measured = None if timings is None else timed_seconds(timings, exercise)
    given = number(seconds, exercise, "seconds", "one number, in seconds")
    require(given > 0, exercise, f"`seconds` = {given:g}: a time must be above 0.",
            "take the median of the timings: wu.time_repeats(...).median.")
    if measured is not None:
        median, repeats = float(np.median(measured)), len(measured)
        verdict(given, median, exercise, "seconds", [
            (1e3 * median, "that is milliseconds, not seconds.", "keep the median in seconds, as timings gives it."),
            (1e6 * median, "that is microseconds, not seconds.", "keep the median in seconds, as timings gives it."),
            (float(measured.sum()), f"that is the total of the {repeats} repeats, not the time of one multiply.",
             "take the median: timings.median."),
            (float(measured.mean()), "that is the mean of the repeats; the exercise asks for the median, which a "
                                     "slow outlier does not move.", "take timings.median."),
            (float(measured.min()), "that is the fastest repeat, not the median.", "take timings.median."),
            (float(measured.max()), "that is the slowest repeat, not the median.", "take timings.median."),
        ], "seconds = timings.median: the median of the repeats, in seconds.")
        right_seconds = median
    else:
        right_seconds = given
    value = number(matmul_tflops, exercise, "matmul_tflops", "one number, in TFLOP/s")
    right = 2 * n**3 / right_seconds / 1e12
    mistakes = [
        (right / 2, "half the right rate: each multiply-add is two FLOPs.", "count 2 * n**3 FLOPs."),
        (right * 1e12, "that is FLOP/s, not TFLOP/s.", "divide by 1e12."),
        (right * 1e3, "that is GFLOP/s, not TFLOP/s.", "divide by 1e12, not 1e9."),
        (right * 1e-3, "a thousand times too small: the time went in as milliseconds.",
         "divide the FLOPs by the median in seconds."),
        (2 * n**2 / right_seconds / 1e12, "that counts n^2 FLOPs; a matrix multiply does n^3 multiply-adds.",
         "count 2 * n**3 FLOPs."),
    ]
    if measured is not None:
        mistakes.append((right / len(measured), f"that divides by the total of the {len(measured)} repeats.",
                         "divide by the median time of one multiply."))
    verdict(value, right, exercise, "matmul_tflops", mistakes, "TFLOP/s = 2 * n**3 / seconds / 1e12.")
    if device_name:
        peak = peak_tflops(device_name, precision)
        require(peak is None or right <= peak, exercise,
                f"{right:.0f} TFLOP/s is more than {device_name} can do in {precision} ({peak or 0:g} TFLOP/s, its "
                "data-sheet peak).",
                "the clock stopped before the GPU finished, or the multiply ran in another precision: time float32 "
                "matrices with wu.time_repeats(..., device=device), which synchronizes, TF32 off (wu.set_tf32(False)).")
    compared = ""
    if device is not None:
        device = _device(device, exercise)
        a, b = torch.randn(n, n, device=device), torch.randn(n, n, device=device)
        own = time_repeats(lambda: a @ b, repeats=5, device=device).median
        ratio = right_seconds / own
        require(1 / 100 <= ratio <= 100, exercise,
                f"your {right_seconds:.3g} s is {max(ratio, 1 / ratio):.0f}x "
                f"{'longer' if ratio > 1 else 'shorter'} than this check's own {own:.3g} s for the same multiply.",
                f"time `a @ b` of two {n} x {n} float32 matrices on `device` (both a and b there), with "
                "wu.time_repeats(..., device=device).")
        compared = (f" (this check's own timing of `a @ b`: {own:.3g} s against your {right_seconds:.3g} s; far apart "
                    "on an idle machine means something else was timed)")
    return passed(exercise, f"{value:.3g} TFLOP/s for a {n} x {n} matmul{compared}")


def _peak_groups(device_name: str, precision: str) -> dict[float, list[str]]:
    """The other precisions' data-sheet peaks, the precisions that share each (fp16 and bf16 often do)."""
    own = peak_tflops(device_name, precision)
    groups: dict[float, list[str]] = {}
    for other in PRECISIONS:
        peak = peak_tflops(device_name, other)
        if other != precision and peak and peak != own:
            groups.setdefault(peak, []).append(other)
    return groups


@checked
def check_mfu(mfu, achieved_tflops, device_name: str, precision: str, measured_peak_tflops,
              exercise: str = "Exercise 1.3", *, flops_per_sample: float | None = None,
              samples_per_s: float | None = None, n: int | None = None, timings=None) -> bool:
    """MFU = the achieved rate / the data-sheet peak for ``precision``, or / the measured matmul rate without one.

    ``achieved_tflops`` and ``measured_peak_tflops`` are the answers of Exercises 1.1 and 1.2. Given the
    inputs those exercises start from (``flops_per_sample`` and ``samples_per_s``; ``n`` and ``timings``),
    the check works both rates out itself and first says when an earlier answer is not right yet, so
    that MFU is judged against the exercise, not against an earlier mistake. MFU is above 0, and at most
    1 of a data-sheet peak.
    """
    require_answered(mfu, exercise, "`mfu` is still the placeholder `...`.",
                     "replace the `...` in the exercise cell with your code, run that cell, then this one.")
    _answered_input(achieved_tflops, exercise, "Exercise 1.1", "achieved_tflops")
    achieved = number(achieved_tflops, exercise, "achieved_tflops (Exercise 1.1)")
    if flops_per_sample is not None and samples_per_s is not None:
        right_achieved = flops_per_sample * samples_per_s / 1e12
        require(math.isclose(achieved, right_achieved, rel_tol=1e-3), exercise,
                f"`achieved_tflops` = {achieved:.4g} from Exercise 1.1 is not right yet, and MFU builds on it.",
                "fix Exercise 1.1 first: its check says what is wrong.")
        achieved = right_achieved
    table_peak = peak_tflops(device_name, precision)
    if table_peak:  # the measured rate only names a mistake here: an unreadable one names none
        try:
            measured = number(measured_peak_tflops, exercise, "matmul_tflops (Exercise 1.2)")
        except NotYet:
            measured = None
    else:
        _answered_input(measured_peak_tflops, exercise, "Exercise 1.2", "matmul_tflops")
        measured = number(measured_peak_tflops, exercise, "matmul_tflops (Exercise 1.2)")
        if n is not None and timings is not None:
            _answered_input(timings, exercise, "Exercise 1.2", "timings")
            right_rate = 2 * n**3 / float(np.median(timed_seconds(timings, exercise))) / 1e12
            require(math.isclose(measured, right_rate, rel_tol=1e-3), exercise,
                    f"`matmul_tflops` = {measured:.4g} from Exercise 1.2 is not right yet, and MFU on this device "
                    "divides by it.", "fix Exercise 1.2 first: its check says what is wrong.")
            measured = right_rate
        require(measured > 0, exercise, f"`matmul_tflops` = {measured:g} from Exercise 1.2 is no rate.",
                "fix Exercise 1.2 first.")
    peak = table_peak or measured
    right = achieved / peak
    if table_peak and not 0 < right <= 1 and flops_per_sample is None:
        raise NotYet(f"✗ {exercise}: `achieved_tflops` = {achieved:.4g} from Exercise 1.1 is not between 0 and "
                     f"{device_name}'s {precision} peak of {table_peak:g} TFLOP/s.",
                     "fix Exercise 1.1 first: its check says what is wrong.")
    if table_peak and not 0 < right <= 1:
        raise WorkshopError(f"{exercise}: the achieved {achieved:.3g} TFLOP/s is not between 0 and {device_name}'s "
                            f"{precision} peak of {table_peak:g} TFLOP/s.",
                            "the run's FLOP count or its throughput is wrong: rerun the notebook from the top.")
    value = number(mfu, exercise, "mfu", "one number, a fraction")
    mistakes = [
        (100 * right, "that is a percentage.", "give MFU as a fraction (0.12, not 12)."),
        (peak / achieved if achieved else None, "upside down.", "MFU = achieved / peak."),
        (achieved * 1e12 / peak, "the achieved rate went in as FLOP/s.", "use achieved_tflops, in TFLOP/s."),
    ]
    if table_peak:
        if measured:
            mistakes.append((achieved / measured, f"you divided by the measured matmul rate, but the table knows "
                                                  f"{device_name}.",
                             f"MFU is relative to the data-sheet peak: wu.peak_tflops(name, {precision!r})."))
        for other_peak, others in _peak_groups(device_name, precision).items():
            mistakes.append((achieved / other_peak,
                             f"that uses the {' and '.join(others)} peak ({other_peak:g} TFLOP/s); this run is "
                             f"{precision}.", f"look up the peak for {precision!r}."))
    verdict(value, right, exercise, "mfu", mistakes,
            "MFU = achieved TFLOP/s / peak TFLOP/s (the table's, or the measured matmul rate where it has none).",
            limits=[(value > 0, "MFU is a share of the peak, above 0.", "MFU = achieved TFLOP/s / peak TFLOP/s."),
                    (value <= 1 or not table_peak, "MFU above 1 would be faster than the data-sheet peak, which no "
                     "run is.", "MFU = achieved TFLOP/s / peak TFLOP/s, a fraction between 0 and 1.")])
    source = "the data-sheet peak" if table_peak else "the measured matmul rate, standing in for a peak"
    return passed(exercise, f"MFU {100 * value:.1f}% of {source}")


# ---------------------------------------------------------------- notebook 03: fp16's range and loss scaling


def _gradient_values(gradients, exercise: str) -> torch.Tensor:
    if not torch.is_tensor(gradients) or not gradients.numel():
        raise WorkshopError(f"{exercise}: the gradients to judge against are no tensor with values.",
                            "pass the tensor the exercise names.")
    return gradients.detach().flatten().float().cpu()


@checked
def check_lost_fraction(lost_fraction, gradients: torch.Tensor, scale: float = 1.0,
                        exercise: str = "Exercise 3.1") -> bool:
    """Share of the non-zero gradient values that become exactly 0 when (scaled and) cast to fp16."""
    value = number(lost_fraction, exercise, "lost_fraction", "one number, a fraction between 0 and 1")
    g = _gradient_values(gradients, exercise)
    nonzero = g[g != 0]
    if not nonzero.numel():
        raise WorkshopError(f"{exercise}: every gradient is 0, so none can be lost.", "pass the measured gradients.")
    flushed = (nonzero * scale).half() == 0
    right = flushed.double().mean().item()
    zero_after = (g * scale).half() == 0
    mistakes = [
        (100 * right, "that is a percentage.", "give a fraction between 0 and 1."),
        (flushed.sum().item() / g.numel(), "you divided by all values, zeros included.",
         "divide by the number of non-zero values: a zero cannot be lost."),
        (zero_after.double().mean().item(), "you counted values that were zero already.",
         "keep only the non-zero values first (g[g != 0])."),
        ((nonzero * scale < torch.finfo(torch.float16).smallest_normal).double().mean().item(),
         "that counts subnormals too, which fp16 keeps (imprecisely).", "count values whose fp16 cast == 0."),
        (((nonzero * scale).bfloat16() == 0).double().mean().item(), "that is bfloat16's loss, not float16's.",
         "cast with .half() (torch.float16)."),
        (1 - right, "that is the share that survives, not the share lost.", "count the values whose cast == 0."),
    ]
    if scale != 1:
        mistakes.append(((nonzero.half() == 0).double().mean().item(), "you forgot the loss scale.",
                         "multiply by the scale before casting."))
    verdict(value, right, exercise, "lost_fraction", mistakes,
            "non-zero values whose fp16 cast is 0, divided by the number of non-zero values.", abs_tol=1e-9,
            limits=[(0 <= value <= 1, "a fraction of the values lies between 0 and 1.",
                     "divide the count of lost values by the count of non-zero values.")])
    return passed(exercise, f"{100 * value:.4f}% of the non-zero gradients become 0 in fp16")


@checked
def check_safe_loss_scale(safe_scale, gradients, dtype: torch.dtype = torch.float16,
                          exercise: str = "Exercise 3.2") -> bool:
    """The largest power of two S with S x (largest gradient) still finite in ``dtype``."""
    value = number(safe_scale, exercise, "safe_scale", "one number, a power of two")
    tensors = [t for t in (gradients.values() if isinstance(gradients, dict) else [gradients])
               if torch.is_tensor(t) and t.numel()]
    if not tensors:
        raise WorkshopError(f"{exercise}: no gradient tensor to judge against.",
                            "pass the gradients the exercise names.")
    largest = max(float(t.detach().abs().max()) for t in tensors)
    if not (math.isfinite(largest) and largest > 0):
        raise WorkshopError(f"{exercise}: the largest gradient is {largest}.", "pass the measured gradients.")
    limit = torch.finfo(dtype).max
    right = 2.0 ** math.floor(math.log2(limit / largest))
    require(value > 0 and math.log2(value).is_integer(), exercise,
            f"`safe_scale` = {value:g} is not a power of two.",
            "use 2.0 ** k: scaling by a power of two changes only the exponent, so it is exact.")
    verdict(value, right, exercise, "safe_scale", [
        (2.0 ** math.floor(math.log2(torch.finfo(torch.bfloat16).max / largest)),
         "that uses bfloat16's largest value.", f"use float16's, {limit:,.0f}."),
        (2.0 ** min(127, math.floor(math.log2(torch.finfo(torch.float32).max / largest))),
         "that uses float32's largest value.", f"use float16's, {limit:,.0f}."),
        (2 * right, f"one power too far: {2 * right:g} x {largest:.3g} overflows {limit:,.0f}.",
         "round log2 down (math.floor), not up."),
    ], "the largest k with 2**k * largest <= finfo(float16).max, i.e. 2 ** floor(log2(max / largest)).")
    return passed(exercise, f"2^{math.log2(value):.0f}: the largest gradient {largest:.3g} becomes "
                            f"{value * largest:,.0f}, below {limit:,.0f}")


class _WatchedScaler(torch.amp.GradScaler):
    """A GradScaler that counts which of its methods were called."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.calls = Counter()

    def scale(self, outputs):
        self.calls["scale"] += 1
        return super().scale(outputs)

    def unscale_(self, optimizer):
        self.calls["unscale_"] += 1
        return super().unscale_(optimizer)

    def step(self, optimizer, *args, **kwargs):
        self.calls["step"] += 1
        return super().step(optimizer, *args, **kwargs)

    def update(self, new_scale=None):
        self.calls["update"] += 1
        return super().update(new_scale)


def _amp_model(device: torch.device) -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 10)).to(device)


def _amp_failure(err: Exception, amp_step, scaler: _WatchedScaler, exercise: str) -> NotYet:
    """The one line for an exception raised while ``amp_step`` ran: GradScaler's protests by their cause."""
    calls, text = scaler.calls, str(err)
    if isinstance(err, AssertionError):  # GradScaler's own protests at a call out of order
        if calls["scale"] == 0:
            return NotYet(f"✗ {exercise}: the loss was not scaled.",
                          "call scaler.scale(loss).backward() instead of loss.backward().")
        if calls["step"] == 0:
            return NotYet(f"✗ {exercise}: scaler.update() ran without scaler.step(optimizer) before it.",
                          "call scaler.step(optimizer) instead of optimizer.step().")
        if calls["update"] > calls["step"]:
            return NotYet(f"✗ {exercise}: scaler.update() ran {calls['update']} times for {calls['step']} "
                          "scaler.step(): GradScaler refuses an update with no step since the last one.",
                          "call scaler.update() once per step, after scaler.step(optimizer).")
    if isinstance(err, ValueError) and "unscale FP16 gradients" in text:
        return NotYet(f"✗ {exercise}: the gradients are float16: the model's weights were cast to float16 "
                      "(model.half()?), and GradScaler unscales only float32 gradients.",
                      "keep the weights in float32: autocast runs the forward pass in float16 by itself.")
    if isinstance(err, RuntimeError) and "unscale_() has already been called" in text:
        return NotYet(f"✗ {exercise}: scaler.unscale_ or scaler.step ran twice for one update.",
                      "once per step: scaler.step(optimizer), then scaler.update().")
    if isinstance(err, RuntimeError) and "step() has already been called" in text:
        return NotYet(f"✗ {exercise}: scaler.step(optimizer) ran twice before scaler.update().",
                      "once per step: scaler.step(optimizer), then scaler.update().")
    return attendee_error(err, amp_step, exercise, "amp_step")


def _amp_trial(amp_step, device: torch.device, init_scale: float, zero_grad: bool = True,
               exercise: str = "Exercise 3.3"):
    """One step on a small seeded MLP with stale gradients in place: (model, scaler, loss, dtypes seen).

    With ``amp_step=None`` the step is the textbook one (or the one that forgets ``zero_grad``).
    """
    model = _amp_model(device)
    images = torch.randn(16, 32, device=device)
    labels = torch.randint(0, 10, (16,), device=device)
    for p in model.parameters():
        p.grad = torch.full_like(p, 1e3)  # the previous step's gradients, which the step must clear
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = _WatchedScaler(device.type, init_scale=init_scale, growth_interval=1)
    dtypes = []
    hook = model[0].register_forward_hook(lambda module, inputs, output: dtypes.append(output.dtype))
    try:
        if amp_step is not None:
            try:
                loss = amp_step(model, images, labels, optimizer, scaler)
            except Exception as err:  # noqa: BLE001 - the attendee's code: one line naming their line
                raise _amp_failure(err, amp_step, scaler, exercise) from None
        else:
            if zero_grad:
                optimizer.zero_grad(set_to_none=True)
            with autocast("fp16", device):
                loss = F.cross_entropy(model(images), labels)
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
    finally:
        hook.remove()
    return model, scaler, loss, dtypes


def _same_parameters(a: nn.Module, b: nn.Module) -> bool:
    return all(p.shape == q.shape and torch.allclose(p.float(), q.float(), rtol=1e-3, atol=1e-6)
               for p, q in zip(a.parameters(), b.parameters()))


def _same_update(model: nn.Module, reference: nn.Module, start: nn.Module, tolerance: float = 0.02) -> bool:
    """The step moved every parameter as the reference step did, to ``tolerance`` of the reference's move.

    Judged on the update, not the weights: fp16 rounding in a loss computed another way (a log-softmax
    that autocast runs in fp16 on one device and fp32 on another) moves the update by far less than 1%,
    every mistake by far more.
    """
    for p, q, s in zip(model.parameters(), reference.parameters(), start.parameters()):
        if p.shape != q.shape:
            return False
        mine, theirs = p.detach().float() - s.detach().float(), q.detach().float() - s.detach().float()
        if not bool(torch.isfinite(mine).all()):
            return False
        if float((mine - theirs).norm()) > tolerance * float(theirs.norm()) + 1e-7:
            return False
    return True


@checked
def check_amp_step(amp_step, device: torch.device, exercise: str = "Exercise 3.3") -> bool:
    """Run ``amp_step(model, images, labels, optimizer, scaler)`` on a small model against the textbook step.

    Once with a scale that fits (the step must move the weights as a correct fp16 step does and the
    scale must grow, the scaler growing after every clean step here) and once with a scale that
    overflows (the step must be skipped and the scale halved). Which GradScaler methods ran and the
    dtype the first layer produced tell the common mistakes apart; any loss that computes the
    cross-entropy of the logits passes, whichever operations autocast runs it in on this device.
    """
    require_answered(amp_step, exercise, "`amp_step` is still the placeholder.",
                     "write the function body in the exercise cell and run it.")
    require(callable(amp_step), exercise, f"`amp_step` should be a function, got {_shown(amp_step)}.",
            "define it with def amp_step(model, images, labels, optimizer, scaler):")
    device = _device(device, exercise)
    scale = 2.0**8
    start = _amp_model(device)
    model, scaler, loss, dtypes = _amp_trial(amp_step, device, scale, exercise=exercise)
    require_answered(loss, exercise, "`amp_step` still returns the placeholder `...`.",
                     "replace the placeholder with your code; return the loss.")
    require(loss is not None, exercise, "`amp_step` returns nothing.", "end it with `return loss`.")
    require(bool(dtypes), exercise, "`amp_step` never ran the model.", "compute the loss from model(images).")
    require(dtypes[0] != torch.float32, exercise, "the forward pass ran in float32: no autocast.",
            "compute the output and the loss inside `with wu.autocast('fp16', device):`.")
    require(dtypes[0] == torch.float16, exercise, f"the forward pass ran in {dtypes[0]}, not float16.",
            "use autocast with dtype torch.float16 (wu.autocast('fp16', device)): the mode that needs a scaler.")
    require(scaler.calls["scale"] > 0, exercise, "the loss was not scaled.",
            "call scaler.scale(loss).backward() instead of loss.backward().")
    require(scaler.calls["step"] > 0, exercise, "scaler.step was never called.",
            "call scaler.step(optimizer) instead of optimizer.step(): it unscales and skips steps with inf/NaN.")
    require(scaler.calls["update"] > 0, exercise, "scaler.update() was never called.",
            "call scaler.update() after scaler.step(): without it the scale never adapts.")
    overflow = 2.0**40  # times a logit gradient of order 1/16, far beyond fp16's 65,504
    skipped, skipped_scaler, _, _ = _amp_trial(amp_step, device, overflow, exercise=exercise)
    require(_same_parameters(skipped, start), exercise, "a step whose gradients overflowed changed the weights.",
            "let scaler.step(optimizer) decide: do not also call optimizer.step().")
    require(skipped_scaler.get_scale() == overflow / 2, exercise, "after an overflow the scale was not halved.",
            "call scaler.update() once, after scaler.step(optimizer).")
    reference, _, reference_loss, _ = _amp_trial(None, device, scale)
    stale, _, _, _ = _amp_trial(None, device, scale, zero_grad=False)
    require(not (_same_update(model, stale, start) and not _same_update(model, reference, start)), exercise,
            "the previous step's gradients were added to this step's.",
            "call optimizer.zero_grad(set_to_none=True) before the backward pass.")
    require(_same_update(model, reference, start), exercise,
            "the weights after the step differ from a correct fp16 step's.",
            "zero the gradients, forward and loss under autocast, scaler.scale(loss).backward(), "
            "scaler.step(optimizer), scaler.update().")
    returned = number(loss, exercise, "returned loss", "one number (the loss tensor)")
    right = reference_loss.item()
    require(not math.isclose(returned, scale * right, rel_tol=1e-2), exercise,
            "`amp_step` returns the scaled loss.", "return the loss itself, before scaler.scale.")
    require(math.isclose(returned, right, rel_tol=1e-2), exercise,
            f"`amp_step` returns {returned:.4g}, not the batch's loss.", "return the loss computed under autocast.")
    require(scaler.get_scale() == 2 * scale, exercise, "the scale did not grow after a clean step.",
            "call scaler.update() once per step, after scaler.step(optimizer).")
    return passed(exercise, "fp16 forward, scaled backward, overflowing step skipped, scale halved after it "
                            "and doubled after a clean one")


# ---------------------------------------------------------------- notebook 05: memory, traffic, bubbles


def _stage_shards(stage: int, precision: str, exercise: str = "the check"):
    if not isinstance(stage, numbers.Integral) or not 0 <= stage < len(ZERO_STAGES):
        raise WorkshopError(f"{exercise}: stage {stage!r} is no ZeRO stage.", "pass 0 (DDP), 1, 2 or 3.")
    if precision not in BYTES_PER_PARAMETER:
        raise WorkshopError(f"{exercise}: unknown precision {precision!r}.",
                            f"use one of {sorted(BYTES_PER_PARAMETER)}.")
    return list(ZERO_STAGES.values())[stage]


def zero_gib_per_gpu(parameters: float, world_size: int, stage: int, precision: str = "mixed") -> float:
    """GiB per GPU of parameters, gradients and Adam state under DDP (stage 0) or ZeRO stage 1-3."""
    sharded = _stage_shards(stage, precision)
    return sum(b * parameters / (world_size if s else 1)
               for b, s in zip(BYTES_PER_PARAMETER[precision], sharded)) / 2**30


def fewest_gpus(parameters: float, budget_gib: float, stage: int, precision: str = "mixed",
                gib: float = 2**30, rounding=math.ceil) -> float:
    """The smallest world size whose share fits ``budget_gib``; ``math.inf`` when none does.

    ``gib`` is the unit's size in bytes: 2**30, or 1e9 to reproduce the GB-for-GiB mistake;
    ``rounding=math.floor`` reproduces rounding down (the smallest p whose share is *about* the budget).
    """
    sharded = _stage_shards(stage, precision)
    kept = sum(b for b, s in zip(BYTES_PER_PARAMETER[precision], sharded) if not s) * parameters / gib
    split = sum(b for b, s in zip(BYTES_PER_PARAMETER[precision], sharded) if s) * parameters / gib
    if split == 0:
        return 1 if kept <= budget_gib else math.inf
    if kept >= budget_gib:
        return math.inf
    if rounding is not math.ceil:
        return rounding(split / (budget_gib - kept))
    gpus = max(1, math.ceil(split / (budget_gib - kept)))
    while gpus > 1 and kept + split / (gpus - 1) <= budget_gib:  # the ceil of a rounded quotient may be one off
        gpus -= 1
    while kept + split / gpus > budget_gib:
        gpus += 1
    return gpus


def _is_infinite(value) -> bool:
    try:
        return not isinstance(value, (str, bytes, bool)) and math.isinf(float(value))
    except Exception:  # noqa: BLE001 - whatever it is, it is no infinity
        return False


@checked
def check_fewest_gpus(gpus, parameters: float, budget_gib: float, stage: int, precision: str = "mixed",
                      exercise: str = "Exercise 5.1") -> bool:
    """The smallest number of GPUs whose ZeRO ``stage`` share of ``parameters`` fits ``budget_gib`` each.

    The exercise's numbers (7e9 parameters, 35 GiB) are chosen so that every mistake named here gives its
    own count: ZeRO-3's count for ZeRO-1, rounding down, GB for GiB.
    """
    name = f"zero{stage}_gpus"
    right = fewest_gpus(parameters, budget_gib, stage, precision)
    if right == math.inf:
        require_answered(gpus, exercise, f"`{name}` is still the placeholder `...`.",
                         "replace the `...` in the exercise cell with your code, run that cell, then this one.")
        require(_is_infinite(gpus), exercise, f"no number of GPUs holds it under stage {stage}.",
                f"set {name} = math.inf: what stays whole on every GPU already exceeds the budget.")
        return passed(exercise, f"stage {stage} cannot hold it at any size")
    if _is_infinite(gpus):
        raise NotYet(f"✗ {exercise}: `{name}` = inf, but {right} GPUs hold it under stage {stage}.",
                     "what stays whole fits the budget here: divide the sharded part into the rest.")
    value = count(gpus, exercise, name, "a whole number of GPUs")
    require(value >= 1, exercise, f"`{name}` = {value}: at least one GPU is needed.", "count GPUs from 1.")
    kept = {0: "everything", 1: "the parameters and gradients", 2: "the parameters"}.get(stage, "nothing")
    mistakes = [
        (fewest_gpus(parameters, budget_gib, stage, precision, rounding=math.floor),
         "rounded down: at that many GPUs each one holds more than the budget.", "round up (math.ceil)."),
        (fewest_gpus(parameters, budget_gib, stage, precision, gib=1e9), "that counts GB (10^9 bytes), not GiB.",
         "divide bytes by 2**30."),
    ]
    if stage != 3:
        mistakes.append((fewest_gpus(parameters, budget_gib, 3, precision),
                         "that is ZeRO-3's count, which shards everything.",
                         f"stage {stage} keeps {kept} whole on every GPU and divides only the rest."))
    if stage == 3:
        mistakes.append((fewest_gpus(parameters, budget_gib, 1, precision),
                         "that is ZeRO-1's count; ZeRO-3 shards the parameters and gradients too.",
                         "divide all 16 bytes per parameter by the GPUs."))
    mistakes = [(m, p, f) for m, p, f in mistakes if m != math.inf]
    per_gpu = zero_gib_per_gpu(parameters, value, stage, precision)
    fewer = zero_gib_per_gpu(parameters, value - 1, stage, precision) if value > 1 else math.inf
    verdict(value, right, exercise, name, mistakes, "the smallest p with kept + sharded / p <= budget.", rel=0,
            limits=[(per_gpu <= budget_gib, f"at {value} GPUs each holds {per_gpu:.1f} GiB, more than the "
                                            f"{budget_gib:g} GiB budget.",
                     "round up (math.ceil): a GPU more, never a fraction less."),
                    (fewer > budget_gib, f"{value - 1} GPUs already hold it ({fewer:.1f} GiB each).",
                     "find the smallest p with kept + sharded / p <= budget.")])
    return passed(exercise, f"ZeRO-{stage}: {value} GPUs, {per_gpu:.1f} GiB each")


@checked
def check_fsdp_traffic(ddp_s, fsdp_s, n_bytes: float, world_size: int, link: Link,
                       exercise: str = "Exercise 5.2") -> bool:
    """DDP: one ring all-reduce of the gradients. FSDP: two all-gathers of the parameters and one reduce-scatter."""
    p, alpha, bandwidth = world_size, link.latency_us * 1e-6, link.bandwidth_gbps * 1e9
    ddp = number(ddp_s, exercise, "ddp_s", "one number, in seconds")
    right_ddp = ring_all_reduce_s(n_bytes, p, link)
    half = (p - 1) * alpha + (p - 1) / p * n_bytes / bandwidth  # one all-gather or reduce-scatter
    verdict(ddp, right_ddp, exercise, "ddp_s", [
        (half, "that is an all-gather's time: an all-reduce is a reduce-scatter plus an all-gather.",
         "use 2(p-1) latency steps and 2(p-1)/p * n / B."),
        (right_ddp + 2 * (p - 1) * (link.latency_us - alpha), "the latency is in microseconds.",
         "multiply latency_us by 1e-6."),
        (2 * (p - 1) * alpha + 2 * (p - 1) / p * n_bytes / (bandwidth / 8), "that treats GB/s as Gbit/s.",
         "bandwidth_gbps is in gigabytes per second: B = bandwidth_gbps * 1e9 bytes/s."),
        (2 * (p - 1) * alpha + 2 * (p - 1) / p * n_bytes / link.bandwidth_gbps,
         "the bandwidth went in as bytes per second.", "bandwidth_gbps is in GB/s: multiply by 1e9."),
        (2 * (p - 1) * alpha + 2 * n_bytes / bandwidth, "the factor (p-1)/p is missing.",
         "each rank sends 2(p-1) pieces of n/p bytes: 2(p-1)/p * n / B."),
        (1e3 * right_ddp, "that is milliseconds, not seconds.", "give the time in seconds."),
    ], "ring all-reduce: 2(p-1) * alpha + 2(p-1)/p * n / B, alpha in seconds, B in bytes/s.",
        limits=[(ddp > 0, "a time is above 0.", "add the latency and the transfer time.")])
    fsdp = number(fsdp_s, exercise, "fsdp_s", "one number, in seconds")
    verdict(fsdp, 3 * half, exercise, "fsdp_s", [
        (2 * half, "two collectives, but FSDP runs three per step.",
         "all-gather the parameters for the forward pass, again for the backward, then reduce-scatter the gradients."),
        (3 * right_ddp, "three all-reduces: FSDP's collectives are each half an all-reduce.",
         "all-gather and reduce-scatter each cost (p-1) * alpha + (p-1)/p * n / B."),
        (3e3 * half, "that is milliseconds, not seconds.", "give the time in seconds."),
    ], "2 all-gathers + 1 reduce-scatter, each (p-1) * alpha + (p-1)/p * n / B.",
        limits=[(fsdp > 0, "a time is above 0.", "add the latency and the transfer time.")])
    return passed(exercise, f"DDP {1e3 * ddp:.0f} ms, FSDP {1e3 * fsdp:.0f} ms per step: {fsdp / ddp:.2f}x")


def fewest_microbatches(stages: int, target: float) -> int:
    """The smallest m with a GPipe bubble (p-1)/(m+p-1) of at most ``target``."""
    if stages <= 1:
        return 1
    if not 0 < target < 1:
        raise WorkshopError(f"A bubble target of {target!r} is no fraction between 0 and 1.", "pass e.g. target=0.1.")
    m = max(1, math.ceil((stages - 1) * (1 - target) / target))
    while m > 1 and bubble_fraction(stages, m - 1) <= target + 1e-12:
        m -= 1
    while bubble_fraction(stages, m) > target + 1e-12:
        m += 1
    return m


@checked
def check_microbatches(microbatches, stages: int, target: float, exercise: str = "Exercise 5.3") -> bool:
    """The fewest micro-batches that bring the bubble of ``stages`` equal stages down to ``target``."""
    value = count(microbatches, exercise, "microbatches", "a whole number of micro-batches")
    require(value >= 1, exercise, f"`microbatches` = {value}: at least one is needed.", "count from 1.")
    right = fewest_microbatches(stages, target)
    verdict(value, right, exercise, "microbatches", [
        (fewest_microbatches(stages + 1, target), "that counts p idle slots; filling and draining take p-1.",
         "bubble = (p-1) / (m+p-1)."),
    ], "the smallest m with (p-1) / (m+p-1) <= target.", rel=0, limits=[
        (bubble_fraction(stages, value) <= target + 1e-12,
         f"with m = {value} the bubble is {bubble_fraction(stages, value):.3f}, above {target:g}.",
         "more micro-batches: the bubble is (p-1) / (m+p-1)."),
        (value == 1 or bubble_fraction(stages, value - 1) > target + 1e-12,
         f"m = {value - 1} already gives a bubble of {bubble_fraction(stages, max(1, value - 1)):.3f}.",
         "find the smallest m with (p-1) / (m+p-1) <= target."),
    ])
    return passed(exercise, f"m = {value}: bubble {bubble_fraction(stages, value):.3f} <= {target:g}")


# ---------------------------------------------------------------- the GPT: FLOPs per token, micro-batches


@checked
def check_flops_per_token(flops_per_token, parameters: int, size: GPTSize, sequence_length: int,
                          counted: float, exercise: str = "Exercise 1.4") -> bool:
    """6·N + 12·layers·width·sequence with N every trainable parameter, shown beside what
    ``torch.utils.flop_counter`` counted on the model itself.

    The formula counts 6 FLOPs for every parameter, the position table, biases and norms included, which
    do no multiply-add with a token's activations; the counter counts only the matrix multiplies. So the
    formula comes out above the counter (2.5% for the tiny GPT). Both count attention's 12·L·d·T whole,
    although a causal mask lets a fused kernel compute about half of it.
    """
    value = number(flops_per_token, exercise, "flops_per_token", "one number, FLOPs per token")
    L, d, T, N = size.layers, size.width, sequence_length, parameters
    right = flops_per_token_closed_form(size, T, N)
    verdict(value, right, exercise, "flops_per_token", [
        (6 * N, "that is the weights' share alone: attention's scores and weighted sum multiply activations by "
                "activations, which no parameter counts.", "add 12 x layers x width x sequence."),
        (2 * N + 4 * L * d * T, "that is the forward pass alone.", "training adds a backward pass of twice its "
                                                                   "FLOPs: 6 per weight, 12 L d T for attention."),
        (6 * N + 12 * L * d, "attention's term grows with the sequence: each token attends to every earlier one.",
         "multiply 12 x layers x width by the sequence length."),
        (6 * N + 12 * L * d * T * T, "that counts the attention of every token of the sequence for each token.",
         "per token, attention costs 12 x layers x width x sequence."),
        (6 * N + 6 * L * d * T, "that halves attention for the causal mask; the formula counts all of it, as "
                                "every MFU convention does.", "use 12 x layers x width x sequence."),
        (6 * (N - size.context * d) + 12 * L * d * T, "that leaves the position table out (nanoGPT's convention); "
                                                      "this exercise's N is every trainable parameter.",
         "use n_gpt as it is."),
        (counted, "that is the counter's measurement, not the formula.",
         "write 6 x parameters + 12 x layers x width x sequence."),
    ], "FLOPs per token = 6 x parameters + 12 x layers x width x sequence.")
    return passed(exercise, f"{value / 1e6:.2f} MFLOP per token by the formula; the counter measured "
                            f"{counted / 1e6:.2f} on the model itself")


def loss_bytes_per_sequence(size: GPTSize, sequence_length: int) -> float:
    """The loss's logits for one sequence: the bf16 logits (2 bytes) and their fp32 log-softmax (4 bytes)
    for every token and vocabulary entry (the GPT computes its cross-entropy in fp32)."""
    return float(sequence_length * size.vocab * (2 + 4))


def activation_bytes_per_sequence(size: GPTSize, sequence_length: int, stored_attention: bool = False,
                                  logits: bool = True) -> float:
    """Activations one sequence keeps for the backward pass in 16-bit training: all blocks, and the loss's logits.

    Korthikanti et al., "Reducing Activation Recomputation in Large Transformer Models" (2022), section 4:
    per layer, sequence s, width h, a heads, s·h·(34 + 5·a·s/h) bytes. The 5·a·s/h term is the attention
    matrix; a fused attention kernel (scaled_dot_product_attention's flash path) never stores it. The blocks
    are not all: the loss's logits (``loss_bytes_per_sequence``, GPT-2 small at 1,024 tokens 0.29 GiB, as
    much as 12 blocks' 0.30 GiB) come on top; ``logits=False`` leaves them out.
    """
    per_layer = sequence_length * size.width * 34
    if stored_attention:
        per_layer += 5 * size.heads * sequence_length ** 2
    return float(size.layers * per_layer) + (loss_bytes_per_sequence(size, sequence_length) if logits else 0.0)


def largest_micro_batch(size: GPTSize, sequence_length: int, free_bytes: float, tokens_per_rank: int) -> int:
    """The largest power of two of sequences that fits ``free_bytes`` and divides a rank's share of the batch."""
    per_sequence = activation_bytes_per_sequence(size, sequence_length)
    sequences = tokens_per_rank // sequence_length
    micro = 1
    while micro * 2 * per_sequence <= free_bytes and sequences % (micro * 2) == 0:
        micro *= 2
    return micro


@checked
def check_micro_batch_plan(micro_batch, accumulation, size: GPTSize, sequence_length: int, target_tokens: int,
                           ranks: int, free_bytes: float, exercise: str = "Exercise 2.4") -> bool:
    """The largest power-of-two micro-batch whose activations and logits fit, and the accumulation steps that
    reach the global batch."""
    micro = count(micro_batch, exercise, "micro_batch", "a whole number of sequences")
    steps = count(accumulation, exercise, "accumulation", "a whole number of micro-batches")
    require(micro >= 1 and steps >= 1, exercise, "both must be 1 or more.", "count sequences and steps from 1.")
    per_sequence = activation_bytes_per_sequence(size, sequence_length)
    blocks_only = activation_bytes_per_sequence(size, sequence_length, logits=False)
    if micro * per_sequence > free_bytes:
        require(micro * blocks_only > free_bytes, exercise,
                f"{micro} sequences keep {micro * blocks_only / 2**30:.1f} GiB in the blocks, but the loss's logits "
                f"add {micro * (per_sequence - blocks_only) / 2**30:.1f} GiB: {micro * per_sequence / 2**30:.1f} GiB, "
                f"and {free_bytes / 2**30:.1f} GiB are free.",
                "count per_sequence as the cell above does, logits included, and take fewer sequences.")
        raise NotYet(f"✗ {exercise}: {micro} sequences keep {micro * per_sequence / 2**30:.1f} GiB of activations "
                     f"and logits; {free_bytes / 2**30:.1f} GiB are free.", "take fewer sequences per micro-batch.")
    tokens = micro * steps * ranks * sequence_length
    require(tokens == target_tokens, exercise,
            f"{micro} x {steps} x {ranks} ranks x {sequence_length} tokens is {tokens:,} tokens a step, not "
            f"{target_tokens:,}.", "global batch = micro-batch x accumulation x ranks x sequence.")
    best = largest_micro_batch(size, sequence_length, free_bytes, target_tokens // ranks)
    require(micro >= best, exercise, f"{micro} sequences fit, but so do {best}: fewer, larger micro-batches keep "
                                     "the GPU busier for the same global batch.",
            "double the micro-batch while it fits and still divides the batch.")
    return passed(exercise, f"{micro} sequences x {steps} accumulation steps x {ranks} ranks = {tokens:,} tokens; "
                            f"{micro * per_sequence / 2**30:.1f} of {free_bytes / 2**30:.1f} GiB of activations "
                            "and logits")


# ---------------------------------------------------------------- notebook 04: measure, then decide


def _sweep_row(table, exercise: str, **match):
    rows = table
    for column, value in match.items():
        rows = rows[rows[column] == value]
    if rows.empty:
        raise WorkshopError(f"{exercise}: no row of the table has {match}.", "pass the table the notebook measured.")
    return rows.iloc[0]


LOADER_ANSWERS = ("best_workers", "measured_speedup", "amdahl_bound")


def constructed_loader_sweep(pinned: bool = True):
    """A loader sweep where each mistake of Exercise 4.1 gives its own answer: (table, starting row).

    The start (0 workers, no pinning) is neither the fastest row nor the one with the most workers, and
    every row waits for data a different share of its step.
    """
    import pandas as pd

    rows = [(0, False, 1000.0, 0.55), (2, False, 1600.0, 0.25), (4, False, 1900.0, 0.12), (8, False, 1700.0, 0.20)]
    if pinned:
        rows += [(0, True, 1050.0, 0.50), (2, True, 1650.0, 0.22), (4, True, 2000.0, 0.08), (8, True, 1750.0, 0.18)]
    table = pd.DataFrame(rows, columns=["num_workers", "pin_memory", "samples_per_s", "data_wait_fraction"])
    return table, table.iloc[0].copy()


def _loader_answers(loader_choice, sweep, start, exercise: str) -> tuple:
    try:
        answers = loader_choice(sweep.copy(), start.copy())
    except Exception as err:  # noqa: BLE001 - the attendee's code: one line naming their line
        raise attendee_error(err, loader_choice, exercise, "loader_choice") from None
    require_answered(answers, exercise, "`loader_choice` still returns the placeholder `...`.",
                     "replace the placeholder with your code; return best_workers, measured_speedup, amdahl_bound.")
    require(isinstance(answers, (tuple, list)) and len(answers) == 3, exercise,
            f"`loader_choice` should return three values (best_workers, measured_speedup, amdahl_bound), got "
            f"{_shown(answers)}.", "end it with `return best_workers, measured_speedup, amdahl_bound`.")
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
    ], "take the num_workers of the row with the highest samples_per_s.", rel=0)
    speedup = number(answers[1], exercise, "measured_speedup", "one number, a ratio")
    right = float(fastest.samples_per_s / start.samples_per_s)
    verdict(speedup, right, exercise, "measured_speedup", [
        (1 / right, "upside down.", "divide the fastest row's samples/s by the starting row's."),
        (float(fastest.samples_per_s - start.samples_per_s), "that is a difference of samples/s, not a ratio.",
         "divide the fastest row's samples/s by the starting row's."),
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
    require_answered(loader_choice, exercise, "`loader_choice` is still the placeholder.",
                     "write the function body in the exercise cell and run it.")
    require(callable(loader_choice), exercise, f"`loader_choice` should be a function, got {_shown(loader_choice)}.",
            "define it with def loader_choice(sweep, start):")
    start = _sweep_row(loader_sweep, exercise, num_workers=start_workers, pin_memory=False)
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
    return passed(exercise, f"{workers} workers: {speedup:.2f}x measured, Amdahl allows at most {bound:.2f}x")


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


@checked
def check_batch_memory(mib_per_sample, largest_batch, batch_sweep, limit_mib: float,
                       exercise: str = "Exercise 4.2") -> bool:
    """The slope of peak memory against batch size, and the largest batch the line keeps within ``limit_mib``."""
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
    ], "the slope of a least-squares line through (batch_size, peak_memory_mib) of the rows that fit.")
    largest = count(largest_batch, exercise, "largest_batch", "a whole number of samples")
    right = math.floor((limit_mib - intercept) / slope)
    verdict(largest, right, exercise, "largest_batch", [
        (math.ceil((limit_mib - intercept) / slope), "rounded up: at that batch the line is above the limit.",
         "round down."),
        (math.floor(limit_mib / slope), "that leaves out the memory that does not grow with the batch.",
         "subtract the line's intercept from the limit first."),
        (int(fitted.batch_size.max()), "that is the largest batch of the sweep, not the line's limit.",
         "solve intercept + slope * b <= limit_mib for the largest whole b."),
    ], "the largest whole batch b with intercept + slope * b <= limit_mib.", rel=0)
    return passed(exercise, f"{value:.2f} MiB per sample; up to batch {largest:,} in {limit_mib:,.0f} MiB")


@checked
def check_next_fix(biggest_phase, step_speedup, breakdown, exercise: str = "Exercise 4.3") -> bool:
    """The top rung's largest part of the step, and Amdahl's speed-up of the step if that part ran twice as fast."""
    parts = [c for c in breakdown.columns if c.endswith("_ms") and c != "step_ms"]
    top, first = breakdown.iloc[-1], breakdown.iloc[0]
    right = max(parts, key=lambda part: top[part])
    require_answered(biggest_phase, exercise, "`biggest_phase` is still the placeholder `...`.",
                     "replace the `...` in the exercise cell with your code, run that cell, then this one.")
    require(isinstance(biggest_phase, str), exercise,
            f"`biggest_phase` should be a column name (text), got {_shown(biggest_phase)}.",
            f"assign the name of one of {', '.join(parts)}.")
    phase = biggest_phase if biggest_phase.endswith("_ms") else f"{biggest_phase}_ms"
    require(phase != "step_ms", exercise, "step_ms is the whole step, not a part of it.",
            f"compare only the parts: {', '.join(parts)}.")
    require(phase in parts, exercise, f"`biggest_phase` = {short(repr(biggest_phase), 40)} is no column of the table.",
            f"use one of {', '.join(parts)}.")
    baseline_biggest = max(parts, key=lambda part: first[part])
    require(not (phase == baseline_biggest != right), exercise, "that is the baseline's largest part.",
            "the top rung is the table's last row (breakdown.iloc[-1]).")
    require(phase == right, exercise, f"{phase} is not the top rung's largest part.",
            "take the part with the most milliseconds in the last row.")
    speedup = number(step_speedup, exercise, "step_speedup", "one number, a ratio")
    share = min(1.0, top[right] / top.step_ms)
    verdict(speedup, 1 / ((1 - share) + share / 2), exercise, "step_speedup", [
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
