"""The attendees' copies, generated from the committed notebooks, as an attendee first opens them.

Every exercise is left as its placeholder. The copies must still run from top to bottom: each
check says "not yet solved" in one line instead of raising, and each cell that uses an answer skips
with one line. The main job (tests/test_notebooks.py) runs the solved notebooks, where every check
passes; together they show each exercise solvable and each check failing on the untouched placeholder.
"""

import json
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest
from helpers import HANG_LIMIT_FACTOR

from workshop_utils.lessons.exercises import write_attendee_notebooks
from workshop_utils.system.profiles import TIME_BUDGET_S

ROOT = Path(__file__).resolve().parent.parent
LIMIT_S = HANG_LIMIT_FACTOR * TIME_BUDGET_S["cpu"]
pytestmark = [pytest.mark.notebook, pytest.mark.timeout(6 * LIMIT_S + 180)]


@pytest.fixture(scope="module")
def attendee_run(tmp_path_factory):
    folder = tmp_path_factory.mktemp("attendee")
    copies = folder / "notebooks"
    write_attendee_notebooks(ROOT / "notebooks", copies)
    for copy in copies.glob("*.ipynb"):  # only the notebooks that hold exercises
        if not any(EXERCISE in c.metadata.get("tags", []) for c in nbformat.read(copy, as_version=4).cells):
            copy.unlink()
    run_dir = folder / "run"
    proc = subprocess.run([sys.executable, "-m", "workshop_utils.run_notebooks", "--profile", "cpu",
                           "--notebooks", str(copies), "--run-dir", str(run_dir), "--timeout", str(LIMIT_S)],
                          capture_output=True, text=True, timeout=6 * LIMIT_S + 120)
    return proc, run_dir, sorted(p.name for p in copies.glob("*.ipynb"))


EXERCISE = "exercise"


def test_every_attendee_copy_runs_to_the_end(attendee_run):
    proc, run_dir, names = attendee_run
    assert len(names) >= 5, names
    log = {e["notebook"]: e for e in json.loads((run_dir / "notebooks.json").read_text())}
    failed = {n: (e["cell_source"][:200], e["error"]) for n, e in log.items() if e["status"] != "ok"}
    assert proc.returncode == 0 and not failed and sorted(log) == names, f"{failed}\n{proc.stderr[-2000:]}"


def test_each_check_says_not_yet_solved_in_one_line(attendee_run):
    _, run_dir, names = attendee_run
    for name in names:
        executed = nbformat.read(run_dir / "notebooks" / name, as_version=4)
        checks = [c for c in executed.cells if c.cell_type == "code" and "check" in c.metadata.get("tags", [])]
        assert len(checks) >= 3, name
        for cell in checks:
            text = "".join(o.get("text", "") for o in cell.outputs if o.output_type == "stream")
            # One line per check the cell calls (5.1 checks two answers), each a "not yet solved" line.
            lines = [line for line in text.splitlines() if line.strip()]
            assert lines and all("not yet solved" in line for line in lines), (name, cell.source, text)
            assert len(lines) == cell.source.count("wu.check_"), (name, cell.source, text)
            assert not [o for o in cell.outputs if o.output_type == "error"], (name, cell.source)
