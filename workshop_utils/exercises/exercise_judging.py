"""What every exercise check shares: an answer read strictly, one tolerance, one line per verdict: a wrong answer
(``NotYet``), an exception in the attendee's code (naming their line) or inside a check (``KitDefect``)."""

import functools
import inspect
import linecache
import math
import traceback
import warnings

import numpy as np

from ..system.display import show_verdict
from ..system.errors import WorkshopError
from .answer_values import Problem, kind, number_of, show
from .exercise_cells import CELL_AGAIN, NotYet, Unsolved, require, require_answered
from .exercise_inputs import CHECKS, inputs_kept

LARGEST_COUNT = 2**53  # beyond it a float no longer holds every whole number
# The one tolerance of every exercise: within REL of the right value (a float32, another order of the same
# operations), or the right value rounded to at least SIGNIFICANT digits. A count is right only when equal.
REL, SIGNIFICANT, SIGNIFICANT_WORDS = 1e-3, 2, "two significant digits"


class KitDefect(WorkshopError):
    """A check failed on its own, not on the answer: a bug of the kit (its cause is chained)."""


def checked(check):
    """A check that shows no traceback: unsolved is one line and False, any exception but a ``WorkshopError`` a
    one-line ``KitDefect``."""
    signature = inspect.signature(check)
    default = getattr(signature.parameters.get("exercise"), "default", "the exercise")

    @functools.wraps(check)
    def run(*args, **kwargs):
        if CELL_AGAIN["on"]:  # a check inside a cell run again judges nothing: the check that ran it judges that
            return True
        try:
            exercise = signature.bind(*args, **kwargs).arguments.get("exercise", default)
        except TypeError as err:
            raise WorkshopError(f"{check.__name__} was called with arguments it does not take ({err}).",
                                "run the check cell as the notebook gives it.") from None
        try:
            if check.__name__ in CHECKS:  # an input a later cell changed is named before the answer is judged
                inputs_kept(exercise, check.__name__)
            return check(*args, **kwargs)
        except Unsolved as err:
            show_verdict(str(err))
            return False
        except WorkshopError:
            raise
        except Exception as err:  # noqa: BLE001 - a changed check-cell argument too (world_size=1, a dict for a link)
            raise KitDefect(f"✗ {exercise}: the check itself failed ({type(err).__name__}: {short(err)}), which is "
                            "no verdict on your answer.", "run the check cell as the notebook gives it; if it still "
                            "fails, tell the instructor: that is a defect of the kit, and the error's __cause__ holds "
                            "the check's traceback.") from err

    return run


def kit_input(condition: bool, problem: str, fix: str) -> None:
    """An input the kit passes (a measured table, the run's numbers), not the attendee's answer: one line if wrong."""
    if not condition:
        raise WorkshopError(problem, fix)


def kit_number(given, exercise: str, name: str, fix: str, least: float = 0, whole: bool = False,
               most: float = math.inf) -> float:
    """An input number the kit passes (the run's, the cell's), as a float; one line naming it if it is none."""
    try:
        value = number_of(given)
    except Problem:
        value = math.nan
    kit_input(least <= value <= most and value > 0 and (value.is_integer() or not whole),
              f"{exercise}: {name} = {short(repr(given), 40)} should be "
              + (f"a whole number, {least:g} or more" if whole else "a number above 0")
              + (f", at most {most:.0f}." if most < math.inf else "."), fix)
    return value


def kit_numbers(exercise: str, fix: str, where: str = "the cell's", **given) -> list[float]:
    """Several of the kit's input numbers, each read by ``kit_number``, in the order given."""
    return [kit_number(value, exercise, f"{where} {name}", fix) for name, value in given.items()]


def short(err_or_text, limit: int = 200) -> str:
    return show(" ".join(str(err_or_text).split()), limit)


def described(value) -> str:
    return f"{kind(value)} ({show(repr(value) if isinstance(value, str) else value)})"


def number(value, exercise: str, name: str, what: str = "one number", returned_by: str | None = None,
           earlier: str = "") -> float:
    """``value`` as a float (a one-element tensor or array too; a tuple of one is none), else one ``NotYet`` line."""
    subject = f"what `{returned_by}` returns" if returned_by else f"`{name}`" + f" from {earlier}" * bool(earlier)
    give = f"make `{returned_by}` return" if returned_by else f"give `{name}`"
    require_answered(value, exercise, f"{subject} is still the placeholder `...`.")
    try:
        with warnings.catch_warnings():  # what the conversion would warn of is said in the answer's line
            warnings.simplefilter("ignore")
            size = value.numel() if hasattr(value, "numel") else getattr(value, "size", None)
            if getattr(value, "shape", ()) not in ((), None) and size == 1:
                value = value.reshape(()) if hasattr(value, "reshape") else np.asarray(value).reshape(())
            return number_of(value)
    except Exception as err:  # noqa: BLE001 - whatever the object does on conversion, the answer is no number
        said = str(err) if isinstance(err, Problem) else f"is {kind(value)}, not a number"
    text, truth = isinstance(value, (str, bytes)), isinstance(value, (bool, np.bool_))
    if said in ("is inf", "is -inf") and str(getattr(value, "dtype", "")) in ("float16", "torch.float16"):
        raise NotYet(f"✗ {exercise}: {subject} {said}: float16 holds at most 65,504, and this overflowed it.",
                     "compute it in float32 (.float() on the tensor) or as a Python float.")
    if said.endswith("beyond what a float holds"):
        said = "is too large to be a number here"
    elif said not in ("is None", "is nan", "is inf", "is -inf"):
        said = f"should be {what}, got " + (f"the text {show(repr(value), 40)}" if text else str(value) if truth
                                            else said[3:].split(", not")[0])
    raise NotYet(f"✗ {exercise}: {subject} {said}.",
                 "a comma after the number makes a tuple of one: remove it." if isinstance(value, tuple) and
                 len(value) == 1 else f"{give} one value, not {len(value)}." if isinstance(value, tuple) else
                 f"{give} the number itself, without quotes." if text else
                 f"a comparison gives True or False: {give} the number." if truth else
                 f"make `{returned_by}` end with `return` and the number (without it, it returns None)."
                 if returned_by and value is None else f"{give} {what}: an int or a float (a tensor's .item() gives "
                                                       "one).") from None


def count(value, exercise: str, name: str, what: str = "a whole number") -> int:
    converted = number(value, exercise, name, what)
    # shown as given: 62.99999999999999 is no whole number, although it prints as 63 to six digits
    require(converted == math.floor(converted), exercise, f"`{name}` = {converted!r} is not a whole number.",
            "a count is whole: round with math.ceil or math.floor, whichever the question asks for.")
    require(abs(converted) <= LARGEST_COUNT, exercise, f"`{name}` = {converted:.3g} is far too large to be the count.",
            "check the formula's units.")
    return int(converted)


def smallest(value: int, exercise: str, name: str, measure, limit: float, too_few, too_many: str, fix: str) -> int:
    """``value``, the smallest count with ``measure(value) <= limit``; "too many" names no count, the answer is near."""
    require(value >= 1, exercise, f"`{name}` = {value}: at least one is needed.", "count from 1.")
    require(measure(value) <= limit, exercise, f"`{name}` = {value}: {too_few(value, measure(value))}.", fix)
    require(value == 1 or measure(value - 1) > limit, exercise, f"`{name}` = {value}: too many: {too_many}.", fix)
    return value


def close(value: float, target: float, through=None) -> bool:
    """Within ``REL``, compared ``through`` a function where that is the quantity (2.3: the communication time)."""
    if through is not None:
        value, target = through(value), through(target)
    return math.isclose(value, target, rel_tol=REL, abs_tol=1e-12)


def accepted(value: float, right: float, whole: bool = False, through=None) -> bool:
    if whole:
        return value == right
    return close(value, right, through) or (rounded_digits(value, right) or 0) >= SIGNIFICANT


def verdict(value: float, right: float, exercise: str, name: str, mistakes=(), hint: str = "", *,
            whole: bool = False, also=(), through=None, limits=(), inputs: str = "") -> None:
    """Return when ``value`` is ``right`` or one of ``also``; else one ``NotYet`` line: the named ``mistakes`` (value,
    problem, fix) it matches, too few digits, a broken ``limits`` bound (holds, problem, fix), which way it is off."""
    rights = [r for r in (right, *also) if r is not None]
    if any(accepted(value, r, whole, through) for r in rights):
        return
    matched, exact = {}, {}
    for wrong, problem, fix in mistakes:
        # a mistake whose value is right itself is never named (a right value rounded may land on it)
        if wrong is None or math.isnan(wrong) or any(wrong == r if whole else close(wrong, r, through) for r in rights):
            continue
        if accepted(value, wrong, whole and float(wrong).is_integer(), through):
            matched.setdefault(problem, fix)
            if math.isclose(value, wrong, rel_tol=1e-9):
                exact.setdefault(problem, fix)
    matched = exact if len(matched) > 1 and len(exact) == 1 else matched
    display = written(value)  # with more digits where its four would read as a right answer (float16's 1.2695)
    if any(accepted(float(display.replace(",", "")), r, whole, through) for r in rights):
        display = f"{value:.8g}"
    shown = f"`{name}` = {display}"
    if len(matched) == 1:
        (problem, fix), = matched.items()
        raise NotYet(f"✗ {exercise}: {shown}: {problem}", fix)
    if matched:
        raise NotYet(f"✗ {exercise}: {shown}, which {len(matched)} mistakes give here: " + " Or: ".join(matched),
                     " / ".join(dict.fromkeys(matched.values())))
    require(whole or all(rounded_digits(value, r) is None for r in rights), exercise,
            f"`{name}` = {value:g} is not right, or keeps fewer than {SIGNIFICANT_WORDS} of the answer: too few "
            "to tell a rounding from a mistake.",
            f"give at least {SIGNIFICANT_WORDS}: round to more decimals, or leave `{name}` unrounded.")
    for holds, problem, fix in limits:
        require(holds, exercise, f"{shown}: {problem}", fix)
    source, far = f" for what {inputs} gives" if inputs else "", how_far(value, right, whole)
    raise NotYet(f"✗ {exercise}: {shown} is not right{': ' * bool(far)}{far}{source}.", hint)


def how_far(value: float, right: float, whole: bool = False) -> str:
    """Which way ``value`` is off, from 10x on by about what factor: never a value the attendee could paste."""
    if right == 0 or value == 0 or not (math.isfinite(value) and math.isfinite(right)):
        return "" if right == 0 else "it should not be 0" if value == 0 else "it is no finite number"
    if (value > 0) != (right > 0):
        return "its sign is wrong"
    ratio = abs(value) / abs(right)  # may overflow to inf or underflow to 0: inverted only within a million
    direction = "too large" if ratio > 1 else "too small"
    if 0.99 < ratio < 1.01 and not whole:
        return f"slightly {direction} (within 1%)"
    if 0.1 < ratio < 10:
        return direction if whole else f"{direction} (within 10x)"
    if not 1e-6 < ratio < 1e6:
        return f"more than 1,000,000x {direction}"
    return f"about {float(f'{max(ratio, 1 / ratio):.1g}'):,.0f}x {direction}"  # one digit: a hint, not a value


def written(value: float) -> str:
    """Four significant digits, and 1,235 rather than 1.235e+03: exponents only for the tiny and the huge."""
    if math.isfinite(value) and 1e3 <= abs(value) < 1e15:
        return f"{value:,.0f}"
    return f"{value:.4g}" if value == 0 or not math.isfinite(value) or abs(value) >= 1e-4 else f"{value:.3e}"


def as_given(value: float, decimals: int = 2) -> str:
    """An accepted answer in a pass line, to ``decimals`` decimals or to the fewer it was given with: 1.4 reads 1.4,
    not 1.40, which would claim a digit the attendee did not compute."""
    text = f"{value:.{decimals}f}"
    # rel 1e-7: a float32 holding the answer (np.float32(1.4)) is 1.39999998, still the 1.4 it was given as
    if "." in text and math.isclose(float(text), value, rel_tol=1e-7):
        text = text.rstrip("0").rstrip(".")
    return text


def rounded_digits(value: float, right: float) -> int | None:
    """The significant digits ``value`` keeps as ``right`` rounded to the decimals it was written with, or None.
    From 100 up tens and hundreds count too (300 keeps two digits of 304.9), below they do not (30 is no 32)."""
    if value == 0 or right == 0 or not math.isfinite(right):
        return None
    magnitude, digits = math.floor(math.log10(abs(right))), None
    for decimals in range(-magnitude if magnitude >= 2 else 0, 16):  # the most decimals that fit count
        # rel 1e-7: a float32 holding the rounded number (np.float32(2.52)) is 2.5199999..., still written as 2.52
        if (math.isclose(value, round(value, decimals), rel_tol=1e-7)
                and abs(value - right) <= 0.5 * 10.0**-decimals * (1 + 1e-9)):
            digits = decimals + magnitude + 1
    return digits


def carried(given, rights, exercise: str, name: str, earlier: str) -> float:
    """An earlier exercise's answer this one builds on, if that exercise accepts it; else ``NotYet``: fix it first."""
    answered_input(given, exercise, earlier, name)
    value = number(given, exercise, name, earlier=earlier)
    require(not rights or any(accepted(value, right) for right in rights), exercise,
            f"`{name}` = {written(value)} from {earlier} is not right yet, and this exercise builds on it.",
            f"fix {earlier} first: its check says what is wrong.")
    return value


def attendee_error(err: BaseException, function, exercise: str, name: str, hint: str | None = None) -> NotYet:
    """One line for an exception raised while the attendee's ``function`` ran: their line and the error."""
    code = getattr(function, "__code__", None)
    own = [f for f in traceback.extract_tb(err.__traceback__) if code is not None and f.filename == code.co_filename]
    error = f"{type(err).__name__}: {short(err, 160)}" if str(err) else type(err).__name__
    if not own:
        return NotYet(f"✗ {exercise}: calling `{name}` raised {error}.",
                      hint or f"check how `{name}` is defined: its arguments and what it calls.")
    line = (own[-1].line or linecache.getline(own[-1].filename, own[-1].lineno)).strip()
    return NotYet(f"✗ {exercise}: `{name}` raised {error} (line {own[-1].lineno} of its cell: `{short(line, 80)}`).",
                  hint or "that line of your code raised it; fix it and run the exercise cell again.")


def attendee_function(function, exercise: str, name: str, arguments: str) -> None:
    require_answered(function, exercise, f"`{name}` is still the placeholder `...`.",
                     "write the function in the exercise cell and run it.")
    require(callable(function), exercise, f"`{name}` should be a function, got {described(function)}.",
            f"define it with def {name}({arguments}):")
    # called, a generator or a coroutine function runs none of its body: say what it is, not what it never did
    kind_of = ("a generator (its body holds yield)" if inspect.isgeneratorfunction(function) or
               inspect.isasyncgenfunction(function) else "a coroutine (async def)"
               if inspect.iscoroutinefunction(function) else "")
    require(not kind_of, exercise, f"`{name}` is {kind_of}: a call runs none of its body.",
            f"define it with def {name}({arguments}): and return the answer, without yield or async.")


def called(function, exercise: str, name: str, *args, failure=None):
    """What the attendee's ``function`` returns; an exception in it (``sys.exit`` too) is one line, ``failure(err)``."""
    try:
        result = function(*args)
    except (Exception, SystemExit) as err:  # noqa: BLE001 - the attendee's code: one line, their line
        raise (failure(err) if failure else attendee_error(err, function, exercise, name)) from None
    require_answered(result, exercise, f"`{name}` still returns the placeholder `...`.",
                     "replace the `...` with your code, run that cell, then this one.")
    return result


def answered_input(value, exercise: str, earlier: str, name: str) -> None:
    require_answered(value, exercise, f"`{name}` from {earlier} is still the placeholder `...`.",
                     f"solve {earlier} first; this exercise builds on it.")
