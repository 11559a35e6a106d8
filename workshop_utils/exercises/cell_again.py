"""An answer's cell run again on a second input the check makes up, so that a method right by chance on the
notebook's one input shows (3.2's gradients, 4.2's sweep, 6.3's job). It runs on copies of what it reads, shows
nothing, and may not reach past the kernel (a file written, a process, a pause, a prompt): it changes nothing."""

import ast
import builtins
import contextlib
import copy
import io
import os
import signal
import sys
import threading
import types

from ..system.errors import WorkshopError
from .exercise_cells import NotYet, CELL_AGAIN, magic_code, notebook_cell

LIMIT_S = 30  # a cell that loops on the second input gives no second verdict, rather than a check that hangs
# what a cell run again may not do: reach a file, a process, the network, the clock or the attendee
REFUSED_EVENTS = set("""builtins.input time.sleep os.remove os.rename os.rmdir os.mkdir os.truncate os.chmod os.chown
    os.link os.symlink os.utime os.putenv os.unsetenv os.system os.exec os.posix_spawn os.spawn os.fork os.kill
    os.killpg subprocess.Popen shutil.copyfile shutil.copytree shutil.move shutil.rmtree socket.connect
    socket.bind""".split())
WRITES = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND


class _Refused(Exception):
    """What a cell run again tried that would reach past it."""


def _guard(event: str, args: tuple) -> None:
    if not CELL_AGAIN["on"] or CELL_AGAIN.get("thread") != threading.get_ident():
        return
    writes = event == "open" and len(args) >= 3 and (
        isinstance(args[1], str) and any(c in args[1] for c in "wax+") or isinstance(args[2], int) and args[2] & WRITES)
    if writes or event in REFUSED_EVENTS:
        raise _Refused(event)


def _too_long(*_):
    raise _Refused(f"past {LIMIT_S} s")


def run_cell_again(cell: str, namespace: dict, given: dict, answers) -> dict | None:
    """The values of ``answers`` that ``cell`` (or the body of its ``%%time``, ``%%capture``) leaves when run again
    apart from the notebook, ``given`` in place of the notebook's values; None where it sets one of ``given`` itself,
    fails, reaches past the kernel, runs past ``LIMIT_S`` or leaves an answer unset."""
    try:
        tree = ast.parse(cell)
        only = tree.body[0] if len(tree.body) == 1 and isinstance(tree.body[0], ast.Expr) else None
        code = magic_code(only.value, ("time", "capture")) if only else None
        tree = ast.parse(code) if code is not None else tree
    except (SyntaxError, ValueError):
        return None
    # a name of the given set anew; IPython asked to run something (%timeit, !ls), in the notebook's own namespace;
    # the process ended at once (os._exit), which no audit event announces
    for node in ast.walk(tree):
        name = getattr(node, "id", None) or getattr(node, "attr", None) or getattr(node, "name", None)
        if name in ("get_ipython", "_exit") or isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store) and \
                name in given:
            return None
    scope = {"__builtins__": builtins, **namespace, **_copies(tree, namespace, given), **given}
    pyplot = sys.modules.get("matplotlib.pyplot")
    figures = set(pyplot.get_fignums()) if pyplot else set()
    timed = threading.current_thread() is threading.main_thread()
    if not CELL_AGAIN.get("guarded"):
        sys.addaudithook(_guard)  # for the process's life: it acts only while a cell runs again, in its thread
        CELL_AGAIN["guarded"] = True
    before = signal.signal(signal.SIGALRM, _too_long) if timed else None
    CELL_AGAIN.update(on=True, thread=threading.get_ident())
    try:
        if timed:
            signal.setitimer(signal.ITIMER_REAL, LIMIT_S)
        with _quiet():
            exec(compile(tree, "<an answer's cell, run again>", "exec"), scope)
    except KeyboardInterrupt:
        raise WorkshopError("stopped while the check ran your answer's cell again, on an input of its own.",
                            "run the check cell again and let it finish; it gives the run up after "
                            f"{LIMIT_S} s.") from None
    except BaseException:  # noqa: BLE001 - a cell that cannot run apart from the notebook gives no second verdict
        return None
    finally:
        CELL_AGAIN["on"] = False
        if timed:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, before)
        for number in set(pyplot.get_fignums()) - figures if pyplot else ():
            pyplot.close(number)  # a plot the cell draws is shown once, under the cell that drew it
    return {name: scope[name] for name in answers} if all(name in scope for name in answers) else None


def _copies(tree, namespace: dict, given) -> dict:
    """Copies of the notebook's values the cell reads, so that ``log.append`` or ``.mul_`` leave the notebook's be."""
    read = {node.id for node in ast.walk(tree) if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load)}
    copies = {}
    for name in (read & namespace.keys()) - set(given):
        value = namespace[name]
        if not (callable(value) or isinstance(value, types.ModuleType)):
            with contextlib.suppress(Exception):
                copies[name] = copy.deepcopy(value)
    return copies


def _quiet():
    """What a cell run again prints or displays goes nowhere: a notebook shows it once, under the cell."""
    try:
        from IPython.utils.capture import capture_output  # outside a shell it captures the two streams alone
    except ImportError:
        stack = contextlib.ExitStack()
        stack.enter_context(contextlib.redirect_stdout(io.StringIO()))
        stack.enter_context(contextlib.redirect_stderr(io.StringIO()))
        return stack
    return capture_output(display=True)


def _names(node) -> tuple[set, set]:
    """(set, read) names of a statement, its whole body included; ``log.append(x)`` sets ``log`` from ``x``."""
    stored, read = set(), set()
    for inner in ast.walk(node):
        if isinstance(inner, ast.Name):
            (read if isinstance(inner.ctx, ast.Load) else stored).add(inner.id)
        elif isinstance(inner, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            stored.add(inner.name)
        elif isinstance(inner, ast.Call) and isinstance(inner.func, ast.Attribute) and isinstance(
                inner.func.value, ast.Name):
            stored.add(inner.func.value.id)
    return stored, read


def earlier_values(cell: str, namespace: dict, given, answers) -> list[str]:
    """The notebook's values from earlier cells, other than ``given``, that flow into the cell's ``answers`` (a
    function that reads one of ``given`` too): a run on other inputs keeps them, so it speaks for the cell in part.
    Asked only after ``run_cell_again`` ran the cell, so that it parses."""
    statements, outside, defined = [], set(), set()
    for statement in ast.parse(cell).body:
        stored, read = _names(statement)
        outside |= read - defined  # `x = int(x)` reads the notebook's x
        defined |= stored
        statements.append((stored, read))
    flowing, grew = set(answers), True
    while grew:
        grew = False
        for stored, read in statements:
            if stored & flowing and not read <= flowing:
                flowing |= read
                grew = True
    names = sorted((flowing & outside) - set(given))
    return [name for name in names if name in namespace and not name.startswith("_") and (
        not (callable(namespace[name]) or isinstance(namespace[name], types.ModuleType)) or
        set(getattr(getattr(namespace[name], "__code__", None), "co_names", ())) & set(given))]


def judge_cell_again(answers, given: dict, judge) -> None:
    """``judge`` (raising ``NotYet``) what the cell that set ``answers`` gives when run again on ``given``; no verdict
    where its answers also come from earlier cells' values, which keep the notebook's on the other input."""
    _, cell, namespace = notebook_cell(answers)
    again = run_cell_again(cell, namespace, given, answers) if isinstance(cell, str) and not CELL_AGAIN["on"] else None
    if again is None:
        return
    try:
        judge(again)
    except NotYet:
        if not earlier_values(cell, namespace, given, answers):
            raise
