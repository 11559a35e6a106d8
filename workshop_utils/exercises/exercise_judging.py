"""What every exercise check shares: reading an answer strictly, and judging it in one line.

A check never shows a traceback: a wrong or unreadable answer is one ``NotYet`` line naming the
mistake (or the mistakes) it matches, an exception in the attendee's code is one line naming their
line, and an exception inside a check is a ``KitDefect``, one line too, its cause chained for
whoever debugs it. The checks of each notebook (``exercise_checks`` gathers them) build on these.
"""

from __future__ import annotations

import decimal
import functools
import inspect
import linecache
import math
import numbers
import traceback
import warnings

import numpy as np
import torch

from ..system.errors import WorkshopError
from .answer_values import kind
from .exercise_cells import NotYet, exercise_check, require, require_answered

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


def described(value) -> str:
    try:
        text = short(repr(value), 60)
    except Exception:  # noqa: BLE001 - an object whose repr fails is still named by its type
        text = "?"
    return f"{kind(value)} ({text})"


def number(value, exercise: str, name: str, what: str = "one number", returned_by: str | None = None) -> float:
    """``value`` as a float: an int, a float, a NumPy scalar, or a one-element tensor or array. A list or a tuple,
    even of one number (a trailing comma makes one), is refused: the cells after the exercise compute with it.

    ``...`` is "not yet solved" (``Unsolved``); anything else that is no finite number is ``NotYet``
    saying what is expected: text ("64"), a list, None, a bool, NaN, an infinity. ``returned_by`` names
    the attendee's function when ``value`` is what it returned: the messages then ask it to return the number.
    """
    # `name` is the variable the attendee assigns, or the function whose return value is judged
    subject, give = ((f"what `{returned_by}` returns", f"make `{returned_by}` return") if returned_by
                     else (f"`{name}`", "assign"))
    require_answered(value, exercise, f"{subject} is still the placeholder `...`.",
                     "replace the `...` in the exercise cell with your code, run that cell, then this one.")
    expected = f"{subject} should be {what}"
    if value is None:
        raise NotYet(f"✗ {exercise}: {subject} is None.",
                     f"make `{returned_by}` end with `return` and the number (without it, it returns None)."
                     if returned_by else f"assign the number to `{name}` (a function that ends without `return` "
                                         "gives None).")
    if isinstance(value, (str, bytes)):
        raise NotYet(f"✗ {exercise}: {expected}, got the text {short(repr(value), 40)}.",
                     f"{give} the number itself, without quotes ("
                     + ("return 64" if returned_by else f"{name} = 64") + ", not '64').")
    if isinstance(value, (bool, np.bool_)):
        raise NotYet(f"✗ {exercise}: {expected}, got {value}.",
                     f"a comparison gives True or False: {give} the number.")
    try:
        with warnings.catch_warnings():  # what the conversion would warn of is said in the answer's line
            warnings.simplefilter("ignore")
            converted = _real(value, exercise, expected, give)
    except NotYet:
        raise
    except OverflowError:
        raise NotYet(f"✗ {exercise}: {subject} is too large to be a number here.",
                     "check the units and the powers of ten in your formula.") from None
    except Exception as err:  # noqa: BLE001 - whatever the object does on conversion, the answer is no number
        raise NotYet(f"✗ {exercise}: {expected}; reading it as one failed ({type(err).__name__}).",
                     f"{give} one number (an int or a float).") from None
    if math.isnan(converted):
        raise NotYet(f"✗ {exercise}: {subject} is nan (not a number).",
                     "nan comes from 0/0, inf - inf, or an input that is nan already: check what your formula divides.")
    if math.isinf(converted):
        raise NotYet(f"✗ {exercise}: {subject} is {converted}.",
                     "an infinity comes from dividing by zero or from a result too large: check the formula's units.")
    return converted


def _real(value, exercise: str, expected: str, give: str) -> float:
    """The float an answer holds (a tensor's or an array's one element), or ``NotYet`` saying what it is."""
    tensor = torch.is_tensor(value)
    if tensor or isinstance(value, np.ndarray):
        holder = "a tensor" if tensor else "an array"
        if (value.numel() if tensor else value.size) != 1:
            raise NotYet(f"✗ {exercise}: {expected}, got {holder} of shape {tuple(value.shape)}.",
                         "reduce it to one number (a sum, a mean, one element), then .item().")
        if not ((value.dtype != torch.bool and not value.dtype.is_complex) if tensor else value.dtype.kind in "iuf"):
            raise NotYet(f"✗ {exercise}: {expected}, got {holder} of {value.dtype}.",
                         f"{give} a real number (an int or a float).")
        return float((value.detach().cpu() if tensor else value).reshape(()).item())
    if isinstance(value, decimal.Decimal):  # nan of either kind, or finite beyond a float: named as such
        converted = math.nan if value.is_nan() else float(value)
        if math.isinf(converted) and value.is_finite():
            raise OverflowError
        return converted
    if isinstance(value, numbers.Real):
        return float(value)
    raise NotYet(f"✗ {exercise}: {expected}, got {described(value)}.",
                 "a comma after the number makes a tuple of one: remove it." if isinstance(value, tuple)
                 and len(value) == 1 else f"{give} one number (an int or a float); a tensor's .item() gives one.")


def count(value, exercise: str, name: str, what: str = "a whole number") -> int:
    """``value`` as an int: a number (see ``number``) that is whole and not absurdly large."""
    converted = number(value, exercise, name, what)
    # shown as given: 62.99999999999999 is no whole number, although it prints as 63 to six digits
    require(converted == math.floor(converted), exercise, f"`{name}` = {converted!r} is not a whole number.",
            "a count is whole: round with math.ceil or math.floor, whichever the question asks for.")
    require(abs(converted) <= LARGEST_COUNT, exercise, f"`{name}` = {converted:.3g} is far too large to be the count.",
            "check the formula's units.")
    return int(converted)


# The one tolerance of every exercise: an answer within REL of the right value is right (a float32, another order of
# the same operations), and so is the right value rounded keeping at least SIGNIFICANT significant digits. A count
# (GPUs, a batch, micro-batches, a Slurm request) is whole: right only when equal.
REL, SIGNIFICANT, SIGNIFICANT_WORDS = 1e-3, 2, "two significant digits"


def close(value: float, target: float, through=None) -> bool:
    """``value`` within the tolerance of ``target``; compared ``through`` a function where the exercise's quantity is
    another one (2.3: the communication time an efficiency implies, where efficiencies near 1 all look alike)."""
    if through is not None:
        value, target = through(value), through(target)
    return math.isclose(value, target, rel_tol=REL, abs_tol=1e-12)


def accepted(value: float, right: float, whole: bool = False, through=None) -> bool:
    """Whether ``value`` passes as ``right`` under the one rule (``REL``, ``SIGNIFICANT``); a count only when equal."""
    if whole:
        return value == right
    return close(value, right, through) or (rounded_digits(value, right) or 0) >= SIGNIFICANT


def verdict(value: float, right: float, exercise: str, name: str, mistakes, hint: str, *, whole: bool = False,
            also=(), through=None, limits=()) -> None:
    """Return when ``value`` is ``right`` (or one of ``also``: the same formula on an earlier answer as the attendee
    rounded it) under the one rule; else ``NotYet`` naming the mistake(s) it matches, or showing the value.

    ``mistakes`` holds ``(what that mistake gives, problem, fix)``; one that gives a right value (or None) is
    skipped. When two give ``value`` here, the message names both: naming one would be a guess. A rounding to
    fewer than two digits is named as the mistake it matches, or told that it keeps too few. ``limits`` holds
    ``(holds, problem, fix)``: physical bounds, said when no mistake is recognised and one does not hold.
    """
    rights = [right, *also]
    hits = (lambda a, b: a == b) if whole else (lambda a, b: close(a, b, through))
    if any(hits(value, r) for r in rights):
        return
    roundings = [] if whole else [d for d in (rounded_digits(value, r) for r in rights) if d is not None]
    digits = max(roundings, default=None)
    if digits is not None and digits >= SIGNIFICANT:
        # The right value rounded: right, even where a mistake's value rounds to the same digits (6/39 values lost
        # is 0.15 to two decimals, and so is 6/40): the rule every check states holds without exception.
        return
    matched, exact = [], []
    for wrong, problem, fix in mistakes:
        if wrong is None or (isinstance(wrong, float) and math.isnan(wrong)) or problem in [p for p, _ in matched]:
            continue
        # a count's mistake in another unit (1.07 GiB for 1,100 MiB) is no count: rounded as any number may be
        if not any(hits(wrong, r) for r in rights) and accepted(value, wrong, whole and float(wrong).is_integer(),
                                                                through):
            matched.append((problem, fix))
            if math.isclose(value, wrong, rel_tol=1e-9):
                exact.append((problem, fix))
    if len(matched) > 1 and len(exact) == 1:
        matched = exact  # two mistakes land within the tolerance, one of them on the very value: that one
    require(digits is None or matched, exercise,
            f"`{name}` = {value:g} keeps fewer than {SIGNIFICANT_WORDS} of the answer, too few to tell the right "
            "answer from a mistake.", f"give at least {SIGNIFICANT_WORDS}: round to more decimals, or leave `{name}` "
                                      "unrounded.")
    shown = f"`{name}` = {written(value)}"
    if len(matched) == 1:
        raise NotYet(f"✗ {exercise}: {shown}: {matched[0][0]}", matched[0][1])
    if matched:
        raise NotYet(f"✗ {exercise}: {shown}, which {len(matched)} mistakes give here: "
                     + " Or: ".join(p for p, _ in matched), " / ".join(dict.fromkeys(f for _, f in matched)))
    for holds, problem, fix in limits:
        require(holds, exercise, f"{shown}: {problem}", fix)
    raise NotYet(f"✗ {exercise}: {shown} is not right.", hint)


def written(value: float) -> str:
    """A number as an answer line shows it: four significant digits, and 1,235 rather than 1.235e+03 (a GPU's
    TFLOP/s, a rate in samples/s): exponents only for the tiny and the huge."""
    if math.isfinite(value) and 1e3 <= abs(value) < 1e15:
        return f"{value:,.0f}"
    return f"{value:.4g}" if value == 0 or not math.isfinite(value) or abs(value) >= 1e-4 else f"{value:.3e}"


def rounded_digits(value: float, right: float) -> int | None:
    """How many significant digits the answer ``value`` keeps, when it is ``right`` rounded to the decimals it was
    written with; None when it is no such rounding. A float drops trailing zeros (0.3 may be 0.2961 to two
    decimals, 0.30; 1.0 may be 1.004 to two, 1.00; 10 may be 9.96 to one, 10.0), so the most decimals that fit are
    taken. Answers of 100 and more may be rounded to tens, hundreds...: 300 keeps two digits of 304.9, 1.48e7 three
    of 14,765,268; smaller whole ones (a batch of 30 for 32) are no rounding. Nothing is a rounding of 0.
    """
    if value == 0 or right == 0 or not math.isfinite(right):
        return None
    magnitude = math.floor(math.log10(abs(right)))
    digits = None
    for decimals in range(-magnitude if magnitude >= 2 else 0, 16):  # left of the point: down to the first digit
        kept = decimals + magnitude + 1
        # rel 1e-7: a float32 holding the rounded number (np.float32(2.52)) is 2.5199999..., still written as 2.52
        written = math.isclose(value, round(value, decimals), rel_tol=1e-7)
        if written and abs(value - right) <= 0.5 * 10.0**-decimals * (1 + 1e-9):
            digits = kept
    return digits


def carried(given, rights, exercise: str, name: str, earlier: str) -> float:
    """An earlier exercise's answer that this one builds on: the attendee's own value, as rounded as that exercise's
    check accepts it against any of its ``rights`` (so that this answer is judged from it), or ``NotYet`` asking to
    fix that exercise first; read as it is where no ``rights`` are known."""
    answered_input(given, exercise, earlier, name)
    value = number(given, exercise, f"{name} ({earlier})")
    require(not rights or any(accepted(value, right) for right in rights), exercise,
            f"`{name}` = {written(value)} from {earlier} is not right yet, and this exercise builds on it.",
            f"fix {earlier} first: its check says what is wrong.")
    return value


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


def attendee_function(function, exercise: str, name: str, arguments: str) -> None:
    """``Unsolved`` while the function an exercise asks for is still ``...``; ``NotYet`` when it is no function."""
    require_answered(function, exercise, f"`{name}` is still the placeholder `...`.",
                     "write the function in the exercise cell and run it.")
    require(callable(function), exercise, f"`{name}` should be a function, got {described(function)}.",
            f"define it with def {name}({arguments}):")


def called(function, exercise: str, name: str, *args, failure=None):
    """What the attendee's ``function`` returns for ``args``; ``Unsolved`` when that is still ``...``. An exception in
    it (``sys.exit`` too) is one line: ``failure(err)`` where given, else their line and the error."""
    try:
        result = function(*args)
    except (Exception, SystemExit) as err:  # noqa: BLE001 - the attendee's code: one line, their line
        raise (failure(err) if failure else attendee_error(err, function, exercise, name)) from None
    require_answered(result, exercise, f"`{name}` still returns the placeholder `...`.",
                     "replace the `...` with your code, run that cell, then this one.")
    return result


def answered_input(value, exercise: str, earlier: str, name: str) -> None:
    """``Unsolved`` when an input that an earlier exercise computes is still its placeholder."""
    require_answered(value, exercise, f"`{name}` from {earlier} is still the placeholder `...`.",
                     f"solve {earlier} first; this exercise builds on it.")

