"""The exercise cells: the committed notebooks hold each solution between nbgrader-style markers (CI proves every
exercise solvable); the attendees' copies (``handout``) hold the block's placeholders (``x = ...``). A check
reads ``...`` as "not yet solved" (one line, False: the copy runs top to bottom) and raises ``NotYet`` on a wrong
answer, so that a headless run of the solved notebooks fails."""

from __future__ import annotations

import ast
import builtins
import contextlib
import functools
import io
import sys
import types

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


def exercise_check(check):

    @functools.wraps(check)
    def run(*args, **kwargs):
        if _rerun["on"]:  # a check inside a cell run again judges nothing: the check that ran it judges what it gave
            return True
        try:
            return check(*args, **kwargs)
        except Unsolved as err:
            show_verdict(str(err))
            return False

    return run


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
    """The Python a cell or line magic runs (``%%time``, ``%time``, ``%%capture``), as IPython writes the magic into
    the cell's code (``get_ipython().run_cell_magic('time', '', code)``); None for any other node, or a magic not
    in ``magics``."""
    if isinstance(node, ast.Call) and getattr(node.func, "attr", None) in ("run_cell_magic", "run_line_magic") and \
            len(node.args) >= 2 and all(isinstance(a, ast.Constant) and isinstance(a.value, str) for a in node.args) \
            and (magics is None or node.args[0].value in magics):
        return node.args[-1].value
    return None


def stores(source: str) -> set[str]:
    """The names a cell's code sets, functions it defines included, in the body of a ``%%time`` or ``%time`` too
    (IPython runs those from a string)."""
    try:
        nodes = list(ast.walk(ast.parse(source)))
    except (SyntaxError, ValueError, TypeError):
        return set()
    names = set()
    for node in nodes:
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            names.add(node.name)
        elif magic_code(node) is not None:
            names |= stores(magic_code(node))
    return names


def notebook_cell(answers) -> tuple[int | None, str | None, dict]:
    """The latest cell of IPython's input history (``_ih``, in the namespace of the cell that called the check) that
    sets every name of ``answers``: its place in the history and its code (None, None when no cell does), and the
    notebook's namespace ({} outside IPython)."""
    frame = sys._getframe(1)
    while frame is not None and not isinstance(frame.f_globals.get("_ih"), list):
        frame = frame.f_back
    namespace = frame.f_globals if frame is not None else {}
    history = namespace.get("_ih", [])
    for index in range(len(history) - 1, -1, -1):
        if isinstance(history[index], str) and set(answers) <= stores(history[index]):
            return index, history[index], namespace
    return None, None, namespace


_rerun = {"on": False}  # an answer's cell is being run again (``run_cell_again``)


def run_cell_again(cell: str, namespace: dict, given: dict, answers) -> dict | None:
    """The values of ``answers`` that ``cell`` leaves when run again, apart from the notebook, with ``given`` in
    place of the notebook's values of those names (the body of a ``%%time`` or ``%%capture`` cell, quietly);
    None where it cannot run so: it sets one of those names itself, fails, or leaves an answer unset."""
    try:
        tree = ast.parse(cell)
        code = magic_code(tree.body[0].value, ("time", "capture")) if len(tree.body) == 1 and isinstance(
            tree.body[0], ast.Expr) else None
        tree = ast.parse(code) if code is not None else tree
    except (SyntaxError, ValueError):
        return None
    # a name of the given set anew, or IPython asked to run something (%timeit, !ls): in the notebook's own
    # namespace, not apart from it
    if any(isinstance(node, ast.Name) and (node.id in given and isinstance(node.ctx, ast.Store) or
                                           node.id == "get_ipython") for node in ast.walk(tree)):
        return None
    scope = {"__builtins__": builtins, **namespace, **given}
    pyplot = sys.modules.get("matplotlib.pyplot")
    figures = set(pyplot.get_fignums()) if pyplot else set()
    _rerun["on"] = True
    try:
        with _quiet():
            exec(compile(tree, "<an answer's cell, run again>", "exec"), scope)
    except KeyboardInterrupt:
        raise
    except BaseException:  # noqa: BLE001 - a cell that cannot run apart from the notebook gives no second verdict
        return None
    finally:
        _rerun["on"] = False
        for number in set(pyplot.get_fignums()) - figures if pyplot else ():
            pyplot.close(number)  # a plot the cell draws is shown once, under the cell that drew it
    return {name: scope[name] for name in answers} if all(name in scope for name in answers) else None


def _quiet():
    """What a cell run again prints or displays goes nowhere: a notebook shows it once, under the cell."""
    try:
        from IPython import get_ipython
        from IPython.utils.capture import capture_output
    except ImportError:
        get_ipython = None
    if get_ipython is not None and get_ipython() is not None:
        return capture_output(display=True)
    stack = contextlib.ExitStack()
    stack.enter_context(contextlib.redirect_stdout(io.StringIO()))
    stack.enter_context(contextlib.redirect_stderr(io.StringIO()))
    return stack


def earlier_values(cell: str, namespace: dict, given=()) -> list[str]:
    """The notebook's variables that the cell reads and does not set, other than ``given`` (`cpus = usage['cpus']`
    in an earlier cell): a run of the cell on other inputs keeps their values, so its answers there speak for the
    cell only in part."""
    try:
        tree = ast.parse(cell)
    except (SyntaxError, ValueError):
        return []
    nodes = [node for node in ast.walk(tree) if isinstance(node, ast.Name)]
    stored = {node.id for node in nodes if not isinstance(node.ctx, ast.Load)}
    read = sorted({node.id for node in nodes if isinstance(node.ctx, ast.Load)} - stored - set(given))
    return [name for name in read if name in namespace and not name.startswith("_")
            and not (callable(namespace[name]) or isinstance(namespace[name], types.ModuleType))]


def judge_cell_again(answers, given: dict, judge) -> None:
    """Where the cell that set ``answers`` can run apart from the notebook: run it again on ``given`` and ``judge``
    the answers it gives there (``judge`` raises ``NotYet`` when they are wrong), so that a method that happens to
    give the right number on the notebook's one input shows. A cell that reads other values of earlier cells keeps
    them on the other input: its refusal there is no verdict."""
    _, cell, namespace = notebook_cell(answers)
    again = run_cell_again(cell, namespace, given, answers) if isinstance(cell, str) and not _rerun["on"] else None
    if again is None:
        return
    try:
        judge(again)
    except NotYet:
        if not earlier_values(cell, namespace, given):
            raise


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
