"""The attendees' copies run through nbval in the background, from the start of the test session.

Their run (minutes of notebook work) is started as soon as the session knows it will need it, at a lower CPU
priority (nice 10), so that it takes the cycles the other tests leave idle (launches, servers, waits) instead of
running alone after them; tests/test_attendee_notebooks.py, which the session runs last, waits for it. Every
process it starts is stopped by its process group when the session ends.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import nbformat

ROOT = Path(__file__).resolve().parent.parent
EXERCISE = "exercise"
EXECUTED = "WORKSHOP_NBVAL_EXECUTED"  # the root conftest's: where nbval's run is kept
NICENESS = 10


@dataclass
class AttendeeRun:
    process: subprocess.Popen
    folder: Path
    executed: Path
    names: list[str]
    timeout_s: float


_started: AttendeeRun | None = None


def start(cell_limit_s: float, timeout_s: float) -> AttendeeRun:
    """Write the copies of the notebooks that hold exercises and start nbval on them (once per session)."""
    global _started
    if _started is not None:
        return _started
    from workshop_utils.lessons.exercises import write_attendee_notebooks

    folder = Path(tempfile.mkdtemp(prefix="attendee-"))
    copies = folder / "notebooks"
    write_attendee_notebooks(ROOT / "notebooks", copies)
    for copy in copies.glob("*.ipynb"):  # only the notebooks that hold exercises
        if not any(EXERCISE in c.metadata.get("tags", []) for c in nbformat.read(copy, as_version=4).cells):
            copy.unlink()
    executed = folder / "executed"
    # The copies sit outside the checkout, so the root conftest (expected outputs, sanitizing, history,
    # keeping the run) is loaded by name; -p no:cacheprovider writes nothing into the checkout.
    command = [sys.executable, "-m", "pytest", "--nbval-lax", "--nbval-current-env",
               "--nbval-cell-timeout", str(cell_limit_s), "-p", "conftest", "-p", "no:cacheprovider",
               "-c", str(ROOT / "pyproject.toml"), "--rootdir", str(ROOT), "-q", str(copies)]
    with open(folder / "stdout.txt", "w") as out, open(folder / "stderr.txt", "w") as err:
        process = subprocess.Popen(command, cwd=ROOT, stdout=out, stderr=err, start_new_session=True,
                                   preexec_fn=lambda: os.nice(NICENESS),
                                   env={**os.environ, "WORKSHOP_PROFILE": "cpu", EXECUTED: str(executed)})
    _started = AttendeeRun(process, folder, executed, sorted(p.name for p in copies.glob("*.ipynb")), timeout_s)
    return _started


def result(run: AttendeeRun) -> subprocess.CompletedProcess:
    """Wait for the run; nothing else runs by then, so its lower priority no longer slows it."""
    try:
        run.process.wait(timeout=run.timeout_s)
    except subprocess.TimeoutExpired:
        stop(run)
    return subprocess.CompletedProcess(run.process.args, run.process.returncode,
                                       (run.folder / "stdout.txt").read_text(), (run.folder / "stderr.txt").read_text())


def stop(run: AttendeeRun | None = None) -> None:
    """Stop the run and everything it started (its kernels, their ranks), by its process group."""
    run = run or _started
    if run is None or run.process.poll() is not None:
        return
    for sent, grace in ((signal.SIGTERM, 10), (signal.SIGKILL, 10)):
        try:
            os.killpg(run.process.pid, sent)
        except ProcessLookupError:
            return
        try:
            run.process.wait(timeout=grace)
            return
        except subprocess.TimeoutExpired:
            continue


def clean_up() -> None:
    stop()
    if _started is not None:
        shutil.rmtree(_started.folder, ignore_errors=True)
