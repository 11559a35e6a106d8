"""bash's ``$((...))``, for a port a job script derives from its job id: numbers as bash reads them (0x1F
hexadecimal, a leading 0 octal, BASE#DIGITS), its operators and their precedence, 64-bit integers that wrap,
C's division (towards zero), ``&&``, ``||`` and ``?:`` evaluating only the side they need.

Assignments (``=``, ``+=``, ``++``) are refused: a port's expression has no business changing a variable.
"""

from __future__ import annotations

import re


class BashArithmeticError(ValueError):
    """What bash itself would say and stop at (``division by 0``, ``value too great for base``, ...)."""


class Unreadable(ValueError):
    """A name or piece whose value is known only when the job runs (or never set): the check cannot evaluate it."""


_TOKEN = re.compile(r"\s*(?:(?P<number>[0-9][0-9A-Za-z@_#]*)|(?P<name>[A-Za-z_][A-Za-z0-9_]*)|"
                    r"(?P<op>\*\*=|<<=|>>=|&&|\|\||\*\*|<<|>>|<=|>=|==|!=|\+\+|--|[-+*/%&^|]=|[-+*/%<>=!~&^|?:,()]))")
_BINARY = [("||",), ("&&",), ("|",), ("^",), ("&",), ("==", "!="), ("<=", ">=", "<", ">"), ("<<", ">>"), ("+", "-"),
           ("*", "/", "%")]  # loosest first
_DIGITS = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ@_"
MAX_DEPTH = 16


def _wrap(value: int) -> int:
    """bash's intmax_t: 64 bits, wrapping."""
    return (value + 2**63) % 2**64 - 2**63


def _number(token: str) -> int:
    """A number as bash's ``strlong`` reads it."""
    too_great = BashArithmeticError(f'value too great for base (error token is "{token}")')
    if "#" in token:
        base_text, _, digits = token.partition("#")
        if not base_text.isdigit() or not 2 <= int(base_text) <= 64 or not digits:
            raise BashArithmeticError(f'invalid arithmetic base (error token is "{token}")')
        base, value = int(base_text), 0
        for ch in digits:
            digit = _DIGITS.find(ch if base > 36 or ch in "@_" else ch.lower())
            if digit < 0 or digit >= base:
                raise too_great
            value = value * base + digit
        return _wrap(value)
    if token[:2] in ("0x", "0X"):
        digits = token[2:]
        if digits and not re.fullmatch(r"[0-9A-Fa-f]+", digits):
            raise too_great
        return _wrap(int(digits or "0", 16))
    if token.startswith("0"):
        if not re.fullmatch(r"[0-7]+", token):
            raise too_great
        return _wrap(int(token, 8))
    if not token.isdigit():
        raise too_great
    return _wrap(int(token))


def parse(expression: str):
    """The expression as a tree of tuples: ("num", n), ("name", NAME), ("unary", op, a), ("binary", op, a, b),
    ("if", condition, a, b), ("comma", a, b); ``BashArithmeticError`` where bash would refuse it."""
    if len(expression) > 500:
        raise Unreadable("an expression too long to follow")
    tokens, i = [], 0
    while i < len(expression):
        found = _TOKEN.match(expression, i)
        if not found or found.end() == i:
            if expression[i:].strip() == "":
                break
            raise BashArithmeticError(f'syntax error: operand expected (error token is "{expression[i:].strip()}")')
        kind = found.lastgroup
        tokens.append((kind, found.group(kind)))
        i = found.end()
    position = 0

    def peek():
        return tokens[position][1] if position < len(tokens) else None

    def take():
        nonlocal position
        position += 1
        return tokens[position - 1]

    def comma():
        node = conditional()
        while peek() == ",":
            take()
            node = ("comma", node, conditional())
        return node

    def conditional():
        node = binary(0)
        if peek() == "?":
            take()
            then = comma()
            if peek() != ":":
                raise BashArithmeticError("`:' expected for conditional expression")
            take()
            node = ("if", node, then, conditional())
        if peek() is not None and (peek() == "=" or (peek().endswith("=") and peek() not in ("==", "!=", "<=", ">="))):
            raise BashArithmeticError("an assignment, which a port's expression should not hold")
        return node

    def binary(level):
        if level == len(_BINARY):
            return power()
        node = binary(level + 1)
        while peek() in _BINARY[level] and tokens[position][0] == "op":
            op = take()[1]
            node = ("binary", op, node, binary(level + 1))
        return node

    def power():
        node = unary()
        if peek() == "**":
            take()
            return ("binary", "**", node, power())
        return node

    def unary():
        token = peek()
        if token in ("++", "--"):
            raise BashArithmeticError("an increment, which a port's expression should not hold")
        if token in ("-", "+", "!", "~"):
            take()
            return ("unary", token, unary())
        return primary()

    def primary():
        if position >= len(tokens):
            raise BashArithmeticError("syntax error: operand expected")
        kind, text = take()
        if kind == "number":
            return ("num", _number(text))
        if kind == "name":
            if peek() in ("++", "--"):
                raise BashArithmeticError("an increment, which a port's expression should not hold")
            return ("name", text)
        if text == "(":
            node = comma()
            if peek() != ")":
                raise BashArithmeticError("missing `)'")
            take()
            return node
        raise BashArithmeticError(f'syntax error: operand expected (error token is "{text}")')

    if not tokens:
        return ("num", 0)  # $(( )) is 0
    tree = comma()
    if position < len(tokens):
        raise BashArithmeticError(f'syntax error in expression (error token is "{tokens[position][1]}")')
    return tree


def _c_division(a: int, b: int, remainder: bool) -> int:
    if b == 0:
        raise BashArithmeticError("division by 0")
    quotient = abs(a) // abs(b) * (1 if (a >= 0) == (b >= 0) else -1)
    return _wrap(a - b * quotient if remainder else quotient)


def evaluate(node, value_of, depth: int = 0) -> int:
    """The tree's value; ``value_of(NAME)`` gives a variable's int, or its text, which bash evaluates as an
    expression of its own (empty text is 0), or raises ``Unreadable``."""
    kind = node[0]
    if kind == "num":
        return node[1]
    if kind == "name":
        value = value_of(node[1])
        if isinstance(value, int):
            return value
        if depth >= MAX_DEPTH:
            raise BashArithmeticError("expression recursion level exceeded")
        return evaluate(parse(value.strip()), value_of, depth + 1) if value.strip() else 0
    if kind == "unary":
        value = evaluate(node[2], value_of, depth)
        return {"-": _wrap(-value), "+": value, "!": int(value == 0), "~": ~value}[node[1]]
    if kind == "if":
        return evaluate(node[2] if evaluate(node[1], value_of, depth) else node[3], value_of, depth)
    if kind == "comma":
        evaluate(node[1], value_of, depth)
        return evaluate(node[2], value_of, depth)
    op, left = node[1], evaluate(node[2], value_of, depth)
    if op == "&&":
        return int(bool(left) and bool(evaluate(node[3], value_of, depth)))
    if op == "||":
        return int(bool(left) or bool(evaluate(node[3], value_of, depth)))
    right = evaluate(node[3], value_of, depth)
    if op in ("/", "%"):
        return _c_division(left, right, op == "%")
    if op == "**":
        if right < 0:
            raise BashArithmeticError("exponent less than 0")
        return _wrap(pow(left, right, 2**64))
    if op in ("<<", ">>"):
        return _wrap(left << (right % 64)) if op == "<<" else left >> (right % 64)
    results = {"+": left + right, "-": left - right, "*": left * right, "&": left & right, "^": left ^ right,
               "|": left | right, "==": left == right, "!=": left != right, "<": left < right, ">": left > right,
               "<=": left <= right, ">=": left >= right}
    return _wrap(int(results[op]))


def expand(expression: str, value_of) -> str:
    """``$NAME`` and ``${NAME}`` replaced by their text, as bash expands them before it evaluates; a name known
    only when the job runs stays a name (``value_of`` raises ``Unreadable`` for it). ``Unreadable`` for a
    command substitution inside."""
    if "$(" in expression or "`" in expression:
        raise Unreadable("a command substitution inside $((...))")

    def text(found):
        name = found.group(1) or found.group(2)
        try:
            value = value_of(name)
        except Unreadable:
            return name
        return str(value)

    return re.sub(r"\$\{([A-Za-z_]\w*)\}|\$([A-Za-z_]\w*)", text, expression)


def arithmetic(expression: str, value_of) -> int:
    """``$((expression))`` as bash computes it (see ``evaluate`` for ``value_of``)."""
    return evaluate(parse(expand(expression, value_of)), value_of)


def moduli(node, value_of) -> set[int]:
    """The positive right sides of the tree's ``%`` that do not depend on what ``value_of`` cannot give: a port
    derived as BASE + JOB % M must suit the job ids around M."""
    found = set()
    if node[0] == "binary" and node[1] == "%":
        try:
            modulus = evaluate(node[3], value_of)
            if modulus > 0:
                found.add(modulus)
        except ValueError:
            pass
    for child in node[1:]:
        if isinstance(child, tuple):
            found |= moduli(child, value_of)
    return found
