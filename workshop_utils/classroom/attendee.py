"""The attendees of a class: an account and a home each, and their notebooks run as JupyterLab runs them.

Where this process is root and the kit can be read by every user, each attendee is a Unix user of their own
(made for the class, removed after it): the servers then run as the attendees, so nothing of one can be
written by another and the shared install is read-only to all of them. Elsewhere every server runs as this
process's user, each with a home of its own (``one_user``), and the record says so.
"""

from __future__ import annotations

import os
import pwd
import re
import subprocess
import sys
import time
import uuid
from dataclasses import asdict, dataclass, field
from pathlib import Path

import nbformat

from ..portal_check import kernel_socket
from ..portal_check.kernel import run_cell
from ..system.errors import WorkshopError
from ..system.results import repo_root

CHECK, EXERCISE, PARAMETERS = "check", "exercise", "parameters"
PASSED = "✓"


@dataclass
class Attendee:
    name: str
    home: Path
    uid: int | None = None  # None: the servers run as this process's user


def readable_by_everyone(path: Path) -> bool:
    """Whether every user may read ``path`` and enter each folder above it (a shared install must be)."""
    path = path.resolve()
    return all(os.stat(p).st_mode & 0o005 == 0o005 for p in [path, *path.parents] if p.is_dir()) \
        and os.stat(path).st_mode & 0o004 == 0o004


def separate_users_possible() -> str | None:
    """Why attendees cannot be Unix users of their own here, in one line, or None when they can."""
    if not hasattr(os, "geteuid") or os.geteuid() != 0:
        return "not root: every server runs as this user, each with its own home"
    for path, what in ((repo_root() or Path.cwd(), "the kit's checkout"), (Path(sys.executable), "its Python")):
        if not readable_by_everyone(path):
            return (f"{what} ({path}) cannot be read by other users: every server runs as this user, each with "
                    "its own home")
    if subprocess.run(["which", "useradd"], capture_output=True).returncode != 0:
        return "no useradd here: every server runs as this user, each with its own home"
    return None


def make_attendees(count: int, folder: Path, separate_users: bool) -> list[Attendee]:
    """``count`` attendees with homes under ``folder/home``; Unix users of their own when ``separate_users``."""
    tag = uuid.uuid4().hex[:5]
    homes = folder / "home"
    homes.mkdir(parents=True, exist_ok=True)
    for path in (folder, homes):
        path.chmod(0o755)
    attendees = []
    for i in range(1, count + 1):
        name = f"wsclass{tag}-{i:02d}"
        home = homes / name
        home.mkdir()
        uid = None
        if separate_users:
            subprocess.run(["useradd", "--no-create-home", "--home-dir", str(home), "--shell", "/bin/bash",
                            "--user-group", name], check=True, capture_output=True)
            uid = pwd.getpwnam(name).pw_uid
            os.chown(home, uid, pwd.getpwnam(name).pw_gid)
            home.chmod(0o700)  # as a site's homes are: no attendee reads another's
        attendees.append(Attendee(name, home, uid))
    return attendees


def remove_attendees(attendees: list[Attendee]) -> None:
    for attendee in attendees:
        if attendee.uid is not None:
            subprocess.run(["userdel", attendee.name], capture_output=True)


# ------------------------------------------------------------------------------------------------ the notebooks

def _tags(cell) -> list[str]:
    return cell.metadata.get("tags", [])


def whole_notebook(path: Path) -> list:
    """Every code cell, in order: "Run All"."""
    return [c for c in nbformat.read(path, as_version=4).cells if c.cell_type == "code"]


def exercise_section(path: Path, marker: str) -> list:
    """The notebook's set-up (its parameters and the cell after them) and the section of the exercise whose
    solution mentions ``marker``, up to that exercise's check: what an attendee runs to do that exercise."""
    cells = nbformat.read(path, as_version=4).cells
    code = [i for i, c in enumerate(cells) if c.cell_type == "code"]
    first = next(i for i in code if PARAMETERS in _tags(cells[i]))
    setup = [first, next(i for i in code if i > first)]
    exercise = next(i for i in code if EXERCISE in _tags(cells[i]) and marker in cells[i].source)
    check = next(i for i in code if i > exercise and CHECK in _tags(cells[i]))
    start = max(i for i in range(exercise) if cells[i].cell_type == "markdown" and cells[i].source.startswith("## "))
    return [cells[i] for i in setup] + [cells[i] for i in code if start < i <= check and i not in setup]


@dataclass
class NotebookRun:
    """One attendee's run of some cells of a notebook."""

    notebook: str
    ok: bool = False
    seconds: float = 0.0
    cells: int = 0
    checks: int = 0
    checks_passed: int = 0
    failed_cell: int | None = None
    cell_source: str = ""
    error: str = ""
    kernel_starts: int = 0
    checks_shown: list[str] = field(default_factory=list)

    def summary(self) -> dict:
        return {k: v for k, v in asdict(self).items() if k != "checks_shown"}


def _last_line(text: str) -> str:
    lines = [line.strip() for line in re.sub(r"\x1b\[[0-9;]*[A-Za-z]", "", text).splitlines() if line.strip()]
    return lines[-1][:300] if lines else ""


# Two kernels started at once can race for a port (each server picks free ones, then its kernel binds them): the
# one that loses never answers, and its server gives up on it after a minute. An attendee restarts it; so does this.
KERNEL_STARTS = 2


def in_a_kernel(open_kernel, work) -> int:
    """``work(ws)`` in a kernel ``open_kernel()`` starts (a context manager giving its websocket), and once more in a
    new one where the first never answered: ``work`` returned False, or the socket closed first (WorkshopError, raised
    from the last kernel). Returns how many kernels it took."""
    for start in range(1, KERNEL_STARTS + 1):
        try:
            with open_kernel() as ws:
                if work(ws):
                    return start
        except WorkshopError:
            if start == KERNEL_STARTS:
                raise
    return KERNEL_STARTS


def run_notebook(server: str, token: str, kernel: str, path_in_home: str, cells: list, parameters: dict,
                 cell_timeout_s: float) -> NotebookRun:
    """Run ``cells`` in a kernel of the attendee's server started for the notebook at ``path_in_home`` (so in its
    folder, as JupyterLab does), with ``parameters`` set after its parameters cell, as papermill sets them.
    Stops at the first failing cell; a check passes when its cell shows a ✓ line. A kernel that never answers its
    first cell is started again, once (``kernel_starts`` says how many it took)."""
    run = NotebookRun(Path(path_in_home).name, cells=len(cells))
    injected = "\n".join(f"{name} = {value!r}" for name, value in parameters.items())
    started = time.perf_counter()

    def open_kernel():
        run.kernel_starts += 1
        run.checks = run.checks_passed = 0
        run.failed_cell, run.cell_source, run.error, run.checks_shown = None, "", "", []
        return kernel_socket(server, token, kernel, path=path_in_home, timeout_s=cell_timeout_s)

    def attempt(ws) -> bool:  # whether the kernel answered its first cell
        for number, cell in enumerate(cells, 1):
            code = cell.source + ("\n" + injected if PARAMETERS in _tags(cell) else "")
            try:
                result = run_cell(ws, code, number, kernel, cell_timeout_s)
            except WorkshopError as err:  # a socket closed after the kernel answered is this attendee's result
                if number == 1:
                    raise
                run.error = f"{type(err).__name__}: {err}".splitlines()[0][:300]
                return True
            if number == 1 and result.status == "died":
                return False
            if CHECK in _tags(cell):
                run.checks += 1
                shown = [line for line in result.text.splitlines() if line.strip()[:1] in "✓✗⚠?…"]
                run.checks_shown += shown
                run.checks_passed += any(line.startswith(PASSED) for line in shown)
            if result.status != "ok":
                run.failed_cell, run.cell_source = number, cell.source.strip().splitlines()[0][:120]
                run.error = result.error or _last_line(result.text)
                return True
        run.ok = run.checks_passed == run.checks
        if not run.ok:
            run.error = f"{run.checks - run.checks_passed} of {run.checks} check(s) did not show ✓"
        return True

    try:
        in_a_kernel(open_kernel, attempt)
    except Exception as err:  # noqa: BLE001 -- a server or kernel that failed is this attendee's result
        run.error = f"{type(err).__name__}: {err}".splitlines()[0][:300]
    run.seconds = round(time.perf_counter() - started, 1)
    return run


def run_folders(attendee: Attendee, since: float) -> list[str]:
    """The run folders made since ``since`` anywhere in the attendee's home (results, figures, records)."""
    found = []
    for record in attendee.home.glob("**/results/*.json"):
        folder = record.parent.parent
        if folder.stat().st_mtime >= since - 1 and str(folder) not in found:
            found.append(str(folder))
    return sorted(found)
