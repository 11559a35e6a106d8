"""The attendees' copies run through nbval in the background, from the start of the test session.

Their run (minutes of notebook work) is started as soon as the session knows it will need it, at a lower CPU
priority (nice 10), so that it takes the cycles the other tests leave idle (launches, servers, waits) instead of
running alone after them; tests/test_attendee_notebooks.py, which the session runs last, waits for it. Every
process it starts is stopped by its process group when the session ends.

Where the kernel groups processes by session (autogroup, /proc/sys/kernel/sched_autogroup_enabled), a process's
nice value only ranks it among its own session's processes, and the run is a session of its own: there `nice`
alone left it an equal share beside the tests (measured: two busy loops under `setsid nice -n 10` took half of a
2-core machine from two at nice 0). So the run's session is given the lower priority too.
"""

from __future__ import annotations

import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import nbformat

ROOT = Path(__file__).resolve().parent.parent
EXERCISE = "exercise"
EXECUTED = "WORKSHOP_NBVAL_EXECUTED"  # the root conftest's: where nbval's run is kept
NICENESS = 10


@dataclass
class AttendeeRun:
    folder: Path
    executed: Path
    names: list[str]
    timeout_s: float

    def _file(self, name: str) -> Path:
        return self.folder / name

    @property
    def group(self) -> int | None:
        """The process group of the run (the id of the shell that leads it), once it has started."""
        text = self._file("pid").read_text().strip() if self._file("pid").exists() else ""
        return int(text) if text.isdigit() else None

    def finished(self) -> bool:
        return self._file("rc").exists() and self._file("rc").read_text().strip() != ""


_started: AttendeeRun | None = None


def start(cell_limit_s: float, timeout_s: float) -> AttendeeRun:
    """Write the copies of the notebooks that hold exercises and start nbval on them (once per session).

    The run is detached (setsid --fork): no child of the test session, so that a test which sums up its own
    process tree (the device monitor's) does not count the run's kernels.
    """
    global _started
    if _started is not None:
        return _started
    from workshop_utils.handout import write_attendee_notebooks

    folder = Path(tempfile.mkdtemp(prefix="attendee-"))
    copies = folder / "notebooks"
    write_attendee_notebooks(ROOT / "notebooks", copies)
    for copy in copies.glob("*.ipynb"):  # only the notebooks that hold exercises
        if not any(EXERCISE in c.metadata.get("tags", []) for c in nbformat.read(copy, as_version=4).cells):
            copy.unlink()
    executed = folder / "executed"
    # The copies sit outside the checkout, so the root conftest (expected outputs, sanitizing, history,
    # keeping the run) is loaded by name; -p no:cacheprovider writes nothing into the checkout.
    command = ["nice", "-n", str(NICENESS), sys.executable, "-m", "pytest", "--nbval-lax", "--nbval-current-env",
               "--nbval-cell-timeout", str(cell_limit_s), "-p", "conftest", "-p", "no:cacheprovider",
               "-c", str(ROOT / "pyproject.toml"), "--rootdir", str(ROOT), "-q", str(copies)]
    run = AttendeeRun(folder, executed, sorted(p.name for p in copies.glob("*.ipynb")), timeout_s)
    shell = (f"echo $$ > {shlex.quote(str(run._file('pid')))}; "
             f"echo {NICENESS} 2>/dev/null > /proc/self/autogroup; {shlex.join(command)} "
             f"> {shlex.quote(str(run._file('stdout.txt')))} 2> {shlex.quote(str(run._file('stderr.txt')))}; "
             f"echo $? > {shlex.quote(str(run._file('rc')))}")
    subprocess.run(["setsid", "--fork", "sh", "-c", shell], cwd=ROOT, check=True,
                   env={**os.environ, "WORKSHOP_PROFILE": "cpu", EXECUTED: str(executed)})
    _started = run
    return run


def result(run: AttendeeRun) -> subprocess.CompletedProcess:
    """Wait for the run; nothing else runs by then, so its lower priority no longer slows it."""
    deadline = time.monotonic() + run.timeout_s
    while not run.finished() and time.monotonic() < deadline:
        time.sleep(1)
    if not run.finished():
        stop(run)
    code = int(run._file("rc").read_text()) if run.finished() else -signal.SIGKILL
    read = lambda name: run._file(name).read_text() if run._file(name).exists() else ""  # noqa: E731
    return subprocess.CompletedProcess("nbval of the attendee copies", code, read("stdout.txt"), read("stderr.txt"))


def stop(run: AttendeeRun | None = None) -> None:
    """Stop the run and everything it started (its kernels, their ranks), by its process group."""
    run = run or _started
    if run is None or run.finished():
        return
    for _ in range(50):  # the shell writes its id as its first act
        if run.group is not None:
            break
        time.sleep(0.1)
    if run.group is None:
        return
    for sent in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(run.group, sent)
        except ProcessLookupError:
            return
        for _ in range(100):
            try:
                os.killpg(run.group, 0)
            except ProcessLookupError:
                return
            time.sleep(0.1)


def clean_up() -> None:
    stop()
    if _started is not None:
        shutil.rmtree(_started.folder, ignore_errors=True)
