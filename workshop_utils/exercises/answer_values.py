"""What an answer is before any check reads it: one line to show it by, its kind in words, and one real number
(or a whole number's exact digits) from any numeric type an attendee may hold; ``Problem`` for what is none."""

import decimal
import fractions
import math
import numbers


class Problem(Exception):
    """A mistake found while reading an answer: "problem. Fix: hint"."""


def show(value, limit: int = 60) -> str:
    try:
        text = value if isinstance(value, str) else repr(value)
    except Exception:
        text = f"<{type(value).__name__}>"
    text = "".join(ch if ch.isprintable() else repr(ch)[1:-1] for ch in text)
    return text if len(text) <= limit else text[:limit - 1] + "…"


def kind(value) -> str:
    if value is None:
        return "None"
    if isinstance(value, str):
        return "text"
    name = type(value).__name__
    return f"an {name}" if name[:1].lower() in "aeiou" else f"a {name}"


def scalar(value):
    """The one number ``value`` holds, unwrapped from a 0-d array or tensor; ``Problem`` saying what it is else."""
    if value is None:
        raise Problem("is None")
    if isinstance(value, bool) or type(value).__name__ in ("bool_", "bool"):
        raise Problem(f"is {value}, a truth value, not a number")
    if isinstance(value, bytes):
        raise Problem(f"is bytes ({show(value)}), neither text nor a number: the b before the quotes makes it bytes")
    if isinstance(value, str):
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
    """A finite float from any real number type; ``Problem`` saying what ``value`` is otherwise."""
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
    """A whole number's exact digits (a huge int never goes through a float); None for a fraction."""
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
