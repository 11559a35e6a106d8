"""The attendees' copies run through nbval in the background, from the start of the test session
(tests/background_run.py); tests/test_attendee_notebooks.py, which the session runs last, waits for it."""

from __future__ import annotations

import sys
from pathlib import Path

import nbformat

import background_run

ROOT = background_run.ROOT
EXERCISE = "exercise"
EXECUTED = "WORKSHOP_NBVAL_EXECUTED"  # the root conftest's: where nbval's run is kept
WHAT = "attendee"


def start(cell_limit_s: float, timeout_s: float) -> background_run.BackgroundRun:
    """Write the copies of the notebooks that hold exercises and start nbval on them (once per session)."""
    from workshop_utils.handout import write_attendee_notebooks

    def copies(folder: Path) -> tuple[list[str], dict]:
        write_attendee_notebooks(ROOT / "notebooks", folder / "notebooks")
        for copy in (folder / "notebooks").glob("*.ipynb"):  # only the notebooks that hold exercises
            if not any(EXERCISE in c.metadata.get("tags", []) for c in nbformat.read(copy, as_version=4).cells):
                copy.unlink()
        return [str(folder / "notebooks")], {EXECUTED: str(executed_in(folder))}

    # The copies sit outside the checkout, so the root conftest (expected outputs, sanitizing, history,
    # keeping the run) is loaded by name; -p no:cacheprovider writes nothing into the checkout.
    command = [sys.executable, "-m", "pytest", "--nbval-lax", "--nbval-current-env", "--nbval-cell-timeout",
               str(cell_limit_s), "-p", "conftest", "-p", "no:cacheprovider", "-c", str(ROOT / "pyproject.toml"),
               "--rootdir", str(ROOT), "-q"]
    return background_run.start(WHAT, command, timeout_s, {"WORKSHOP_PROFILE": "cpu"}, prepare=copies)


def executed_in(folder: Path) -> Path:
    """Where the root conftest keeps each notebook nbval executed."""
    return folder / "executed"


def names(run: background_run.BackgroundRun) -> list[str]:
    return sorted(p.name for p in (run.folder / "notebooks").glob("*.ipynb"))
