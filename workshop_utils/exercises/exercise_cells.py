"""The exercise cells: the committed notebooks hold each solution between nbgrader-style markers (CI proves every
exercise solvable), the attendees' copies (``handout``) its placeholders (``x = ...``). A check reads ``...`` as
"not yet solved" (one line, False: the copy runs top to bottom) and raises ``NotYet`` on a wrong answer."""

import ast
import sys

from ..system.display import show_verdict
from ..system.errors import WorkshopError

BEGIN_SOLUTION = "### BEGIN SOLUTION"
END_SOLUTION = "### END SOLUTION"
PLACEHOLDER = "### PLACEHOLDER "
YOUR_CODE_HERE = "# YOUR CODE HERE"
ANSWER_HERE = "replace the `...` in the exercise cell with your code, run that cell, then this one."
BLOCK_FIX = (f"a block is a line '{BEGIN_SOLUTION}', the solution and its '{PLACEHOLDER}<code>' lines, then "
             f"'{END_SOLUTION}'; blocks do not nest.")


class NotYet(WorkshopError):
    """An exercise's answer is missing or wrong; the message says which and gives a hint."""


class Unsolved(NotYet):
    """The answer is still the placeholder: a check says so in one line and does not raise."""


def require_answered(value, exercise: str, problem: str, hint: str = ANSWER_HERE) -> None:
    if value is ...:
        raise Unsolved(f"… {exercise}: not yet solved: {problem}", hint)


def solved(*answers, exercise: str) -> bool:
    """For a cell that uses an exercise's answers: False, with one line, while any is still ``...``."""
    if any(answer is ... for answer in answers):
        print(f"(skipped until {exercise} is solved)", flush=True)
        return False
    return True


def passed(exercise: str, detail: str = "") -> bool:
    show_verdict(f"✓ {exercise}: correct" + (f" ({detail})" if detail else "") + ".")
    return True


def require(condition: bool, exercise: str, problem: str, hint: str) -> None:
    if not condition:
        raise NotYet(f"✗ {exercise}: {problem}", hint)


def magic_code(node, magics=None) -> str | None:
    """The Python a magic runs (``get_ipython().run_cell_magic('time', '', code)``); None for any other node."""
    if isinstance(node, ast.Call) and getattr(node.func, "attr", None) in ("run_cell_magic", "run_line_magic") and \
            len(node.args) >= 2 and all(isinstance(a, ast.Constant) and isinstance(a.value, str) for a in node.args) \
            and (magics is None or node.args[0].value in magics):
        return node.args[-1].value
    return None


def stores(source: str) -> set[str]:
    """The names a cell's code sets, functions it defines included, in the body of a ``%%time`` too."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError, TypeError):
        return set()
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            names.add(node.name)
        elif magic_code(node) is not None:
            names |= stores(magic_code(node))
    return names


def notebook_cell(answers) -> tuple[int | None, str | None, dict]:
    """(place in IPython's history ``_ih``, code) of the latest cell that sets every name of ``answers`` (or (None,
    None)), and the notebook's namespace ({} outside IPython), found from the frame that called the check."""
    frame = sys._getframe(1)
    while frame is not None and not isinstance(frame.f_globals.get("_ih"), list):
        frame = frame.f_back
    namespace = frame.f_globals if frame is not None else {}
    history = namespace.get("_ih", [])
    for index in range(len(history) - 1, -1, -1):
        if isinstance(history[index], str) and set(answers) <= stores(history[index]):
            return index, history[index], namespace
    return None, None, namespace


CELL_AGAIN = {"on": False}  # an answer's cell is being run again (``cell_again.run_cell_again``)


def attendee_source(source: str, where: str = "cell") -> str:
    """A code cell's source with every solution block replaced by its placeholders; a malformed block is one line."""
    out, opened = [], None
    for number, line in enumerate(source.splitlines(), start=1):
        text, indent = line.strip(), line[: len(line) - len(line.lstrip())]
        problem = None
        if text == BEGIN_SOLUTION:
            problem, opened = opened and f"'{BEGIN_SOLUTION}' inside the block opened on line {opened}", number
            out.append(indent + YOUR_CODE_HERE)
        elif text == END_SOLUTION:
            problem, opened = not opened and f"'{END_SOLUTION}' without a '{BEGIN_SOLUTION}' before it", None
        elif text == PLACEHOLDER.strip() or text.startswith(PLACEHOLDER):
            problem = not opened and "a placeholder line outside a solution block"
            out.append(indent + text[len(PLACEHOLDER):])
        elif text.startswith(("### BEGIN", "### END", "### PLACEHOLDER")):
            problem = f"unknown marker {text!r}"
        elif opened is None:
            out.append(line)
        if problem:
            raise WorkshopError(f"{where}, line {number}: {problem}.", BLOCK_FIX)
    if opened is not None:
        raise WorkshopError(f"{where}, line {opened}: '{BEGIN_SOLUTION}' has no '{END_SOLUTION}'.", BLOCK_FIX)
    return "\n".join(out)
