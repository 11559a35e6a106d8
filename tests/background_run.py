"""Notebook runs of the test session started in the background, from the start of the session.

The main job (tests/test_notebooks.py) and nbval's run of the attendees' copies (tests/attendee_run.py) are
minutes of notebook work each. Each is started as soon as the session knows it will need it, one after the
other, so that they take the cycles the other tests leave idle (launches, servers, waits) instead of running
alone after them; the tests that read them run last and wait for them. A run is niced (10) and detached in a
session of its own, which a kernel that schedules sessions as groups (autogroup) weighs like the test session
itself. Every process a run starts is stopped by its process group when the session ends.
"""

from __future__ import annotations

import os
import shlex
import shutil
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
NICENESS = 10


@dataclass
class BackgroundRun:
    what: str
    folder: Path  # the run's own: its id, exit status and output, and whatever else it writes there
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


_started: dict[str, BackgroundRun] = {}


def start(what: str, command: list[str], timeout_s: float, env: dict | None = None,
          prepare=None) -> BackgroundRun:
    """Start ``command`` (once per session for each ``what``) in a folder of its own, detached, at nice 10, once
    the run started before it, if any, has ended.

    ``prepare(folder)`` may write what the command reads there and return (more arguments, more environment
    variables) that name it. The run is detached (setsid --fork): no child of the test session, so that a test
    which sums up its own process tree (the device monitor's) does not count the run's kernels.
    """
    if what in _started:
        return _started[what]
    after = next((r for r in reversed(_started.values()) if not r.finished()), None)
    folder = Path(tempfile.mkdtemp(prefix=f"{what}-"))
    arguments, more = prepare(folder) if prepare else ([], {})
    command = ["nice", "-n", str(NICENESS), *command, *arguments]
    run = BackgroundRun(what, folder, timeout_s)
    # one run at a time beside the tests: a run started while another goes waits for that one's exit status
    wait = (f"while [ ! -s {shlex.quote(str(after._file('rc')))} ]; do sleep 1; done; " if after else "")
    shell = (f"echo $$ > {shlex.quote(str(run._file('pid')))}; {wait}{shlex.join(command)} "
             f"> {shlex.quote(str(run._file('stdout.txt')))} 2> {shlex.quote(str(run._file('stderr.txt')))}; "
             f"echo $? > {shlex.quote(str(run._file('rc')))}")
    subprocess.run(["setsid", "--fork", "sh", "-c", shell], cwd=ROOT, check=True,
                   env={**os.environ, **(env or {}), **more})
    _started[what] = run
    return run


def result(run: BackgroundRun) -> subprocess.CompletedProcess:
    """Wait for the run; stopped (SIGKILL's status) past its time limit."""
    deadline = time.monotonic() + run.timeout_s
    while not run.finished() and time.monotonic() < deadline:
        time.sleep(1)
    if not run.finished():
        stop(run)
    code = int(run._file("rc").read_text()) if run.finished() else -signal.SIGKILL
    read = lambda name: run._file(name).read_text() if run._file(name).exists() else ""  # noqa: E731
    return subprocess.CompletedProcess(run.what, code, read("stdout.txt"), read("stderr.txt"))


def stop(run: BackgroundRun) -> None:
    """Stop the run and everything it started (its kernels, their ranks), by its process group."""
    if run.finished():
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
            break
        for _ in range(100):
            try:
                os.killpg(run.group, 0)
            except ProcessLookupError:
                break
            time.sleep(0.1)
        else:
            continue
        break
    if not run.finished():  # its shell died before writing it: the run waiting for this one goes on
        run._file("rc").write_text(f"{-signal.SIGKILL}\n")


def clean_up(keep: bool = False) -> None:
    """Stop every run still going; remove their folders unless ``keep`` (a failed session: they show why)."""
    for run in _started.values():
        stop(run)
        if not keep:
            shutil.rmtree(run.folder, ignore_errors=True)
