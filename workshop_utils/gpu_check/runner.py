"""The GPU check's clock: each path in turn within one budget, one verdict line each, and the summary.

A path that would start too close to the budget is not started; one still running when it runs out is
stopped by an alarm (SIGALRM), so one slow path cannot take the time of those after it. Any error of a
path is its verdict, and the check goes on to the next.
"""

from __future__ import annotations

import contextlib
import signal
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from .context import Context, Failed, Skip

BUDGET_S = 300  # the whole check on one H100, compiles included


class OutOfTime(BaseException):
    """The check's budget ran out while a path was running (raised by the alarm; not an Exception)."""


@dataclass
class Verdict:
    name: str
    what: str
    status: str  # "ok", "failed", "skipped", "not checked", "not reached"
    detail: str
    seconds: float = 0.0

    SYMBOLS = {"ok": "✓", "failed": "✗", "skipped": "–", "not checked": "–", "not reached": "…"}

    def line(self) -> str:
        took = f" ({self.seconds:.1f} s)" if self.seconds else ""
        label = "" if self.status == "ok" else f"{self.status}: "
        return f"{self.SYMBOLS[self.status]} {self.name}{took}: {label}{self.detail}"


def first_line(err: BaseException) -> str:
    text = str(err).strip().splitlines()
    return f"{type(err).__name__}: {text[0] if text else ''}".strip().rstrip(":")[:300]


def _where(err: BaseException) -> str:
    """The innermost frame of the kit's own code in a traceback: file:line, so a failure can be found."""
    frames = [f for f in traceback.extract_tb(err.__traceback__) if "workshop_utils" in f.filename
              or "benchmarks" in f.filename]
    if not frames:
        return ""
    frame = frames[-1]
    return f" [{Path(frame.filename).name}:{frame.lineno}]"


@contextlib.contextmanager
def _deadline(seconds: float):
    """Raise OutOfTime in the main thread when ``seconds`` have passed (SIGALRM, Unix main thread only)."""
    usable = hasattr(signal, "setitimer") and seconds > 0
    if usable:
        def alarm(signum, frame):
            raise OutOfTime()

        previous = signal.signal(signal.SIGALRM, alarm)
        signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        if usable:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, previous)


def run_paths(paths, ctx: Context, budget_s: float = BUDGET_S, gpus: int | None = None,
              say: Callable[[str], None] = print, clock: Callable[[], float] = time.monotonic) -> list[Verdict]:
    """Run each path in order within ``budget_s``; one verdict each, said as soon as it is known."""
    gpus = (torch.cuda.device_count() if torch.cuda.is_available() else 0) if gpus is None else gpus
    start, verdicts = clock(), []
    for path in paths:
        left = budget_s - (clock() - start)
        if path.gpus > max(gpus, 1) or (path.gpus > 1 and not ctx.on_gpu):
            verdict = Verdict(path.name, path.what, "not checked", f"needs {path.gpus} GPUs, this node has {gpus}")
        elif left < path.least_s:
            verdict = Verdict(path.name, path.what, "not reached",
                              f"{left:.0f} s of the {budget_s:.0f} s budget left, it needs at least {path.least_s:.0f}")
        else:
            began = clock()
            try:
                with _deadline(left):
                    status, detail = "ok", path.run(ctx)
            except OutOfTime:
                status, detail = "not reached", f"stopped when the {budget_s:.0f} s budget ran out"
            except Skip as err:
                status, detail = "skipped", str(err)
            except Failed as err:
                status, detail = "failed", str(err)
            except Exception as err:  # any error of the path is its verdict; the check goes on
                status, detail = "failed", first_line(err) + _where(err)
            verdict = Verdict(path.name, path.what, status, detail, clock() - began)
            if ctx.on_gpu:
                torch.cuda.empty_cache()
        verdicts.append(verdict)
        say(verdict.line())
    return verdicts


def summary_line(verdicts: list[Verdict], seconds: float, budget_s: float) -> str:
    counts = {status: [v.name for v in verdicts if v.status == status] for status in Verdict.SYMBOLS}
    ran = len(verdicts) - len(counts["not checked"])
    text = f"GPU check: {len(counts['ok'])} of {ran} paths passed"
    for status in ("failed", "not reached", "skipped"):
        if counts[status]:
            text += f", {len(counts[status])} {status} ({', '.join(counts[status])})"
    if counts["not checked"]:
        text += f"; {len(counts['not checked'])} not checked here ({', '.join(counts['not checked'])}: need 2 GPUs)"
    return text + f"; {seconds:.0f} s of the {budget_s:.0f} s budget."
