"""The attendees' copies run through nbval in the background, from the start of the test session.

Their run (minutes of notebook work) is started as soon as the session knows it will need it, at a low CPU
priority, so that it takes the cycles the other tests leave idle (launches, servers, waits) instead of running
alone after them; tests/test_attendee_notebooks.py, which the session runs last, waits for it. Every process it
starts is stopped by its id when the session ends.

The priority: where the tests may write cgroups (root), the run gets a cpu cgroup of its own at a fifth of an
equal share (CPU_WEIGHT), which holds every process it starts. `nice` alone is not enough where the kernel groups
processes by session (autogroup, /proc/sys/kernel/sched_autogroup_enabled): there a nice value only ranks a
process among its own session's, and the run, each notebook kernel (jupyter_client starts it in a new session) and
each training launch (system/launch.py does too) are sessions of their own. Measured on a 2-core machine, two busy
loops of 9 s in the foreground beside two started in new sessions: 3.1 s of CPU each with the others at nice 0,
6.0 s with the others in a cgroup of weight 50, 7.5 s at weight 20. At half a share the run slowed the tests it
ran beside by a fifth to two fifths (the main job 556 s against 461 s alone, the DDP lab 184 s against 129 s). At
a fifth it gets a sixth of a busy CPU, so each limit inside the copies must hold six times over: notebook 05's
launches (35 s at most alone on a slow machine, 180 s a launch in its profile) get TIMEOUT_S through its
``timeout_s`` parameter; the other launches' limits (300 s and more) and the lab checks' (scaled by what the
machine took to start a rank) hold as they are.
Without cgroups the run's own session is lowered (/proc/self/autogroup), which its kernels and launches escape.
The suite's record (the root conftest's --suite-record) keeps when the run ended (``timings``).
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
import uuid
from dataclasses import dataclass
from pathlib import Path

import nbformat

from workshop_utils.classroom.cgroups import Cgroups

ROOT = Path(__file__).resolve().parent.parent
EXERCISE = "exercise"
EXECUTED = "WORKSHOP_NBVAL_EXECUTED"  # the root conftest's: where nbval's run is kept
NICENESS = 10
CPU_WEIGHT = 20  # of 100, an equal share: a sixth of a contended CPU (the docstring says why)
TIMEOUT_S = 900  # notebook 05's limit per launch in the copies: six times its 180 s, and more


@dataclass
class AttendeeRun:
    folder: Path
    executed: Path
    names: list[str]
    timeout_s: float
    cgroups: object = None  # workshop_utils.classroom.cgroups.Cgroups, where this machine lets the tests make one
    started_at: float = 0.0  # time.time() when it was started

    def _file(self, name: str) -> Path:
        return self.folder / name

    @property
    def group(self) -> int | None:
        """The process group of the run (the id of the shell that leads it), once it has started."""
        text = self._file("pid").read_text().strip() if self._file("pid").exists() else ""
        return int(text) if text.isdigit() else None

    def finished(self) -> bool:
        return self._file("rc").exists() and self._file("rc").read_text().strip() != ""


# The copies show that each placeholder leaves its notebook running to the end, whatever the training's size: the
# run takes each notebook's own parameters (papermill's, set in its parameters cell) at a fraction of the cpu
# profile's work, which the main job (tests/test_notebooks.py) runs in full. Alone on a 2-core machine the full
# sizes took 990 s of wall time at 72 % of both cores: a second main job beside the tests.
SIZES = {
    "01_single_gpu_baseline.ipynb": dict(epochs=2, train_size=512),  # section 7 still resumes from epoch 1
    "02_multi_gpu_ddp.ipynb": dict(steps=8, train_size=512),
    "03_mixed_precision.ipynb": dict(max_steps=12, train_size=256),
    "04_profiling_optimization.ipynb": dict(steps=8, train_size=512, memory_cap_mib=200),
    "05_beyond_data_parallel.ipynb": dict(max_mib=1, fsdp_steps=2, timeout_s=TIMEOUT_S),
    "06_slurm_deployment.ipynb": dict(steps=50),  # section 6 needs 50
}


def set_sizes(copy: Path) -> None:
    """Set the copy's parameters to SIZES[its name], as papermill would: after the parameters cell's own lines."""
    notebook = nbformat.read(copy, as_version=4)
    cell = next(c for c in notebook.cells if "parameters" in c.metadata.get("tags", []))
    sizes = SIZES[copy.name].items()
    cell.source += "".join(f"\n{name} = {value!r}  # the attendee run's size" for name, value in sizes)
    nbformat.write(notebook, copy)


_started: AttendeeRun | None = None
timings: dict = {}  # for the suite's record: seconds from its start to its end, how it ended, the wait for it


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
        else:
            set_sizes(copy)
    executed = folder / "executed"
    # The copies sit outside the checkout, so the root conftest (expected outputs, sanitizing, history,
    # keeping the run) is loaded by name; -p no:cacheprovider writes nothing into the checkout.
    command = ["nice", "-n", str(NICENESS), sys.executable, "-m", "pytest", "--nbval-lax", "--nbval-current-env",
               "--nbval-cell-timeout", str(cell_limit_s), "-p", "conftest", "-p", "no:cacheprovider",
               "-c", str(ROOT / "pyproject.toml"), "--rootdir", str(ROOT), "-q", str(copies)]
    names = sorted(p.name for p in copies.glob("*.ipynb"))
    run = AttendeeRun(folder, executed, names, timeout_s, started_at=time.time())
    join = ""
    if Cgroups.unavailable() is None:
        run.cgroups = Cgroups(f"workshop-tests-attendee-run-{uuid.uuid4().hex[:8]}")
        join = f"echo $$ > {shlex.quote(str(run.cgroups.make('copies', None, None, CPU_WEIGHT)['cpu']))}/cgroup.procs; "
    shell = (f"echo $$ > {shlex.quote(str(run._file('pid')))}; {join}"
             f"echo {NICENESS} 2>/dev/null > /proc/self/autogroup; {shlex.join(command)} "
             f"> {shlex.quote(str(run._file('stdout.txt')))} 2> {shlex.quote(str(run._file('stderr.txt')))}; "
             f"echo $? > {shlex.quote(str(run._file('rc')))}")
    subprocess.run(["setsid", "--fork", "sh", "-c", shell], cwd=ROOT, check=True,
                   env={**os.environ, "WORKSHOP_PROFILE": "cpu", EXECUTED: str(executed)})
    _started = run
    return run


def result(run: AttendeeRun) -> subprocess.CompletedProcess:
    """Wait for the run; nothing else runs by then, so its lower priority no longer slows it."""
    called, deadline = time.time(), time.monotonic() + run.timeout_s
    while not run.finished() and time.monotonic() < deadline:
        time.sleep(1)
    if not run.finished():
        stop(run)
    code = int(run._file("rc").read_text()) if run.finished() else -signal.SIGKILL
    ended = run._file("rc").stat().st_mtime if run.finished() else time.time()
    timings.update(attendee_copies_s=round(ended - run.started_at, 1), exit_status=code,
                   cpu_weight=CPU_WEIGHT if run.cgroups is not None else None,
                   waited_s=round(max(0.0, ended - called), 1))  # what the session waited for it at the end
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
    if _started is not None and _started.cgroups is not None:
        _started.cgroups.remove()  # stops, by id, anything of the run that left its process group (a launch's ranks)
    if _started is not None:
        shutil.rmtree(_started.folder, ignore_errors=True)
