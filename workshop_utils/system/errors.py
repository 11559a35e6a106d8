"""One exception type for every mistake a user can fix, shown as one line.

Attendees should never have to read a traceback to learn that they typed
``precision="bf61"``. Every check in the package raises ``WorkshopError`` with
what went wrong and how to fix it; command-line entries print it on one line
and exit with status 2, and notebooks show it without the stack (see
``install_notebook_error_handler``).
"""

from __future__ import annotations

import argparse
import sys


class WorkshopError(ValueError):
    """A problem in the user's input or environment, with its fix."""

    def __init__(self, problem: str, fix: str | None = None):
        self.problem = problem
        self.fix = fix
        super().__init__(f"{problem} Fix: {fix}" if fix else problem)


def choose(value, allowed, what: str):
    """Return ``value`` if it is one of ``allowed``; otherwise a WorkshopError naming the choices."""
    if value not in allowed:
        names = ", ".join(repr(a) for a in allowed)
        raise WorkshopError(f"Unknown {what} {value!r}.", f"use one of {names}.")
    return value


def exit_on_workshop_error(main):
    """Decorator for ``main()`` functions: a WorkshopError becomes one line on stderr and exit code 2."""

    def wrapper(*args, **kwargs):
        try:
            return main(*args, **kwargs)
        except WorkshopError as err:
            print(f"error: {err}", file=sys.stderr, flush=True)
            raise SystemExit(2) from None

    wrapper.__name__ = main.__name__
    wrapper.__doc__ = main.__doc__
    return wrapper


def ipython_shell():
    """The IPython shell this code runs in (a notebook's kernel, an IPython terminal), or None."""
    try:
        from IPython import get_ipython
    except ImportError:
        return None
    return get_ipython()


def install_notebook_error_handler() -> bool:
    """In IPython, show a WorkshopError as one red line instead of a traceback.

    Returns True when a handler was installed (i.e. we are inside IPython).
    """
    shell = ipython_shell()
    if shell is None:
        return False

    def handler(shell, etype, value, tb, tb_offset=None):
        stb = [f"\033[91mWorkshopError: {value}\033[0m"]
        # IPython ignores what a custom handler returns: showing it is the handler's job. Shown as the
        # cell's error output (not a stderr print), papermill, nbval and the main job's report see it.
        shell._showtraceback(etype, value, stb)
        return stb

    shell.set_custom_exc((WorkshopError,), handler)
    return True


class OneLineParser(argparse.ArgumentParser):
    """argparse, but a bad flag is one line naming the problem and the fix (exit status 2).

    ``fix`` says what to do instead; by default, to read ``--help``.
    """

    def __init__(self, *args, fix: str | None = None, **kwargs):
        super().__init__(*args, **kwargs)
        self.fix = fix

    def error(self, message: str):
        message = " ".join(message.splitlines())  # a value holding a line break must not make two lines
        message = message[:1].upper() + message[1:]  # a sentence, like every WorkshopError line
        print(f"error: {message.rstrip('.')}. Fix: {self.fix or f'see `{self.prog} --help`.'}",
              file=sys.stderr, flush=True)
        raise SystemExit(2)


def whole_number(text: str) -> int:
    """A flag's whole number, or the parser's one-line error."""
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None


def positive_int(text: str) -> int:
    """A flag's whole number of 1 or more, or the parser's one-line error."""
    value = whole_number(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{text!r} must be 1 or more")
    return value
