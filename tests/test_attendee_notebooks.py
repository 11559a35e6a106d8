"""The attendees' copies, generated from the committed notebooks, as an attendee first opens them.

Every exercise is left as its placeholder. The copies must still run from top to bottom: each
check says "not yet solved" in one line instead of raising, and each cell that uses an answer skips
with one line. The main job (tests/test_notebooks.py) runs the solved notebooks, where every check
passes; together they show each exercise solvable and each check failing on the untouched placeholder.

The copies run through nbval (``pytest --nbval-lax``, as README's "Checking the notebooks" runs the solved
ones): every cell must run without an error, and the cells whose output is the same on every machine are
compared with tests/nbval/. nbval's run is kept (the root conftest's WORKSHOP_NBVAL_EXECUTED) for the
checks below, so this is the notebooks' one execution in their attendee form.
"""

from pathlib import Path

import attendee_run as attendee_run_module
import nbformat
import pytest
from helpers import HANG_LIMIT_FACTOR

from workshop_utils.system.profiles import TIME_BUDGET_S

ROOT = Path(__file__).resolve().parent.parent
LIMIT_S = HANG_LIMIT_FACTOR * TIME_BUDGET_S["cpu"]
pytestmark = [pytest.mark.notebook, pytest.mark.timeout(6 * LIMIT_S + 180)]


@pytest.fixture(scope="module")
def attendee_run():
    """nbval's run of the copies, started in the background when the session began (tests/attendee_run.py)."""
    run = attendee_run_module.start(LIMIT_S, 6 * LIMIT_S + 120)
    return attendee_run_module.result(run), run.executed, run.names


OUTCOME = "nbval_outcome"  # the root conftest's: each cell's outcome in nbval's kept run


def test_every_attendee_copy_runs_to_the_end(attendee_run):
    proc, executed, names = attendee_run
    assert len(names) >= 5, names
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert sorted(p.name for p in executed.glob("*.ipynb")) == names, proc.stdout[-3000:]
    for name in names:
        code = [c for c in nbformat.read(executed / name, as_version=4).cells if c.cell_type == "code"]
        assert code and all(c.metadata.get(OUTCOME) == "passed" for c in code), (
            name, [(c.source[:80], c.metadata.get(OUTCOME)) for c in code if c.metadata.get(OUTCOME) != "passed"])


def test_the_copies_cells_that_nbval_compares_are_the_solved_notebooks_stable_cells(attendee_run):
    """The copies keep nbval's comparison on every stable cell but the checks (whose ✓ is the solved run's)."""
    _, executed, names = attendee_run
    for name in names:
        copy = nbformat.read(executed / name, as_version=4)
        solved = {c.id: c for c in nbformat.read(ROOT / "notebooks" / name, as_version=4).cells}
        for cell in copy.cells:
            tags = cell.metadata.get("tags", [])
            expected = "nbval-check-output" in solved[cell.id].metadata.get("tags", []) and "check" not in tags
            assert ("nbval-check-output" in tags) == expected, (name, cell.id, tags)


def test_each_check_says_not_yet_solved_in_one_line(attendee_run):
    _, executed, names = attendee_run
    for name in names:
        cells = nbformat.read(executed / name, as_version=4).cells
        checks = [c for c in cells if c.cell_type == "code" and "check" in c.metadata.get("tags", [])]
        assert len(checks) >= 3, name
        for cell in checks:
            # A verdict is shown as rich output in a notebook (wu.show_verdict) with its line as text/plain.
            text = "".join(o.get("text", "") if o.output_type == "stream" else o.get("data", {}).get("text/plain", "") + "\n"
                           for o in cell.outputs if o.output_type in ("stream", "display_data"))
            # One line per check the cell calls (5.1 checks two answers), each a "not yet solved" line.
            lines = [line for line in text.splitlines() if line.strip()]
            assert lines and all("not yet solved" in line for line in lines), (name, cell.source, text)
            assert len(lines) == cell.source.count("wu.check_"), (name, cell.source, text)
            assert not [o for o in cell.outputs if o.output_type == "error"], (name, cell.source)
