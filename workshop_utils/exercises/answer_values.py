"""What an exercise's answer is, before any tool reads it: one line to show it by, its kind in words, and
one real number (or a whole number's exact digits) from any numeric type an attendee may hold.

Notebook 06's checks share these, and its readers of Slurm, bash and torchrun raise ``Problem`` for what
those tools would not read, so that every wrong answer ends as one line ("what is wrong. Fix: hint").
"""

from __future__ import annotations

import decimal
import fractions
import math
import numbers


class Problem(Exception):
    """A mistake found while reading an answer: "problem. Fix: hint", as the readers return them."""


def show(value, limit: int = 60) -> str:
    """``value`` as it may appear inside a one-line message: no line breaks, no control characters, short."""
    try:
        text = value if isinstance(value, str) else repr(value)
    except Exception:
        text = f"<{type(value).__name__}>"
    text = "".join(ch if ch.isprintable() else repr(ch)[1:-1] for ch in text)
    return text if len(text) <= limit else text[:limit - 1] + "…"


def kind(value) -> str:
    """What an answer is, in words: "a list", "a dict", "text", ..."""
    if value is None:
        return "None"
    if isinstance(value, str):
        return "text"
    name = type(value).__name__
    return f"an {name}" if name[:1].lower() in "aeiou" else f"a {name}"


def scalar(value):
    """The one number ``value`` holds, unwrapped from a NumPy 0-d array or a 0-d tensor; ``Problem`` saying
    what it is otherwise (None, a truth value, text, a list, an array of several, ...)."""
    if value is None:
        raise Problem("is None")
    if isinstance(value, bool) or type(value).__name__ in ("bool_", "bool"):
        raise Problem(f"is {value}, a truth value, not a number")
    if isinstance(value, (str, bytes)):
        raise Problem(f"is text ({show(repr(value))}), not a number: the quotes make it a string")
    shape = getattr(value, "shape", None)
    if shape is not None and not isinstance(value, numbers.Number):
        try:
            dims = tuple(shape)
        except Exception:
            dims = None
        if dims != ():
            raise Problem(f"is {kind(value)} of shape {dims}, not one number")
        try:
            item = value.item()
        except Exception:
            raise Problem(f"is {kind(value)}, not a number") from None
        return scalar(item)
    if isinstance(value, numbers.Complex) and not isinstance(value, numbers.Real):
        raise Problem("is a complex number")
    # Decimal is a Number but not a Real (it does not mix with floats); as an answer it is as good as one.
    if not isinstance(value, (numbers.Real, decimal.Decimal)):
        raise Problem(f"is {kind(value)}, not a number")
    return value


def number_of(value) -> float:
    """One real number from an int, a float, a Decimal, a Fraction, a NumPy scalar or 0-d array, a 0-d tensor;
    ``Problem`` saying what ``value`` is otherwise (NaN and infinities included)."""
    value = scalar(value)
    if isinstance(value, decimal.Decimal) and not value.is_finite():
        raise Problem("is nan" if value.is_nan() else f"is {'-' if value.is_signed() else ''}inf")
    try:
        number = float(value)
    except Exception:
        raise Problem(f"is {show(value)}, beyond what a float holds") from None
    if math.isnan(number):
        raise Problem(f"is {number}")
    if math.isinf(number):
        try:
            infinite = value == number  # a float inf is one; a Decimal or long double too large for a float is not
        except Exception:
            infinite = True
        raise Problem(f"is {number}" if infinite else f"is {show(value)}, beyond what a float holds")
    return number


def whole_digits(value) -> str | None:
    """A whole number's exact digits (a huge int stays exact, never through a float); None for a fraction.
    ``Problem`` for what is no number at all."""
    value = scalar(value)
    size = (abs(int(value)).bit_length() * 0.30103 if isinstance(value, numbers.Integral) else
            value.adjusted() if isinstance(value, decimal.Decimal) and value.is_finite() else
            abs(value.numerator).bit_length() * 0.30103 if isinstance(value, fractions.Fraction) else 0)
    if size > 4000:  # far beyond any count: never turned into digits (Python refuses past 4300)
        raise Problem(f"is a number of about {int(size) + 1} digits, far beyond any count Slurm or torchrun reads")
    if isinstance(value, numbers.Integral):
        return str(int(value))
    if isinstance(value, fractions.Fraction) or isinstance(value, decimal.Decimal) and value.is_finite():
        return str(int(value)) if value == int(value) else None
    number = number_of(value)
    return str(int(number)) if number.is_integer() else None


def kit_failure(exercise: str, err: Exception):
    """A bug of a check itself, still one line for the attendee (and a test failure for the kit)."""
    from .exercise_cells import NotYet

    return NotYet(f"✗ {exercise}: the check itself failed on this answer ({type(err).__name__}: {show(str(err))}).",
                  "this is a bug in the kit: tell the instructor, with your answer.")
