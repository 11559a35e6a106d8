"""``pytest --nbval-lax notebooks/``: the cells whose output is the same on every machine are compared with it.

The committed notebooks carry no outputs; the root conftest.py hands nbval the expected ones from tests/nbval/
(tests/nbval_expected.py writes them from a main-job run). CI does not execute the notebooks a second time for
nbval: tests/test_notebooks.py compares the main job's executed copies with the same expectations, the way nbval
does (``nbval_expected.compared``). Here real nbval runs a tiny notebook, to show that a changed output fails.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest
from nbval_expected import CHECKED, checked_cells, compared, sanitize_patterns

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))


def _expected(notebook: Path) -> dict:
    path = ROOT / "tests" / "nbval" / f"{notebook.stem}.json"
    return json.loads(path.read_text())["cells"] if path.exists() else {}


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=lambda p: p.stem)
def test_every_checked_cell_has_its_expected_output_and_nothing_stale(notebook):
    assert set(_expected(notebook)) == set(checked_cells(notebook)), \
        "run python tests/nbval_expected.py <a main-job run> after tagging or removing a checked cell"


def test_the_sessions_stable_outputs_are_checked():
    """What the issue names: parameter counts, FLOPs, the format tables, the exercise checks, the DDP lab's verdict."""
    sources = {c.id: c.source for nb in NOTEBOOKS for c in nbformat.read(nb, as_version=4).cells
               if c.cell_type == "code" and CHECKED in c.metadata.get("tags", [])}
    text = "\n".join(sources.values())
    for call in ("count_parameters", "training_flops_per_sample", "format_table", "check_ddp_lab", "check_amp_step"):
        assert call in text, call
    unchecked = [c.source for nb in NOTEBOOKS for c in nbformat.read(nb, as_version=4).cells
                 if c.cell_type == "code" and "check" in c.metadata.get("tags", []) and c.id not in sources]
    assert not unchecked, f"exercise checks nbval does not compare: {unchecked}"


def test_the_sanitizer_masks_what_moves_and_keeps_what_does_not():
    patterns = sanitize_patterns()
    stable = [{"output_type": "stream", "name": "stdout", "text": "2,474,506 trainable parameters\n"}]
    assert compared(stable, patterns) == {"stdout": ["2,474,506 trainable parameters\n"]}
    one = compared([{"output_type": "stream", "name": "stdout", "text": "took 12.3 s, 1,234 samples/s\n"}], patterns)
    two = compared([{"output_type": "stream", "name": "stdout", "text": "took 7.9 s, 987 samples/s\n"}], patterns)
    assert one == two


def _tiny(folder: Path, stable_text: str) -> Path:
    notebook = nbformat.v4.new_notebook()
    # Ends like a check cell: a value hidden by a trailing semicolon, which nbval alone would show.
    checked = nbformat.v4.new_code_cell('print("2,474,506 trainable parameters")\nTrue;', metadata={"tags": [CHECKED]})
    volatile = nbformat.v4.new_code_cell("import time\nprint(time.time())")
    notebook.cells = [checked, volatile]
    path = folder / "tiny.ipynb"
    nbformat.write(notebook, path)
    expected = folder / "expected"
    expected.mkdir(exist_ok=True)
    (expected / "tiny.json").write_text(json.dumps({"cells": {checked.id: [
        {"output_type": "stream", "name": "stdout", "text": stable_text}]}}))
    return path


def _nbval(path: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "WORKSHOP_NBVAL_EXPECTED": str(path.parent / "expected")}
    # -p conftest: the kit's root conftest.py (its nbval hooks), which pytest does not find beside a /tmp notebook.
    return subprocess.run([sys.executable, "-m", "pytest", "--nbval-lax", "-p", "conftest", "-p", "no:cacheprovider",
                           "-q", "--rootdir", str(path.parent), str(path)], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=300)


@pytest.mark.slow
def test_nbval_passes_on_the_recorded_output_and_fails_in_one_line_when_it_changes(tmp_path):
    same = _nbval(_tiny(tmp_path, "2,474,506 trainable parameters\n"))
    assert same.returncode == 0, same.stdout[-3000:] + same.stderr[-2000:]
    assert "2 passed" in same.stdout
    changed = _nbval(_tiny(tmp_path, "2,474,507 trainable parameters\n"))
    assert changed.returncode == 1, changed.stdout[-3000:]
    assert ("tiny.ipynb, Cell 0 (print(\"2,474,506 trainable parameters\")): its output is not the one recorded "
            "in tests/nbval/") in changed.stdout, changed.stdout[-3000:]


@pytest.mark.slow
def test_a_failing_notebook_cell_is_named_in_one_line_with_its_error(tmp_path):
    notebook = nbformat.v4.new_notebook()
    notebook.cells = [nbformat.v4.new_code_cell("profile = 'gpux'\nraise ValueError(f'no profile named {profile!r}')")]
    path = tmp_path / "broken.ipynb"
    nbformat.write(notebook, path)
    (tmp_path / "expected").mkdir()
    result = _nbval(path)
    assert result.returncode == 1
    assert "broken.ipynb, Cell 0 (profile = 'gpux'): ValueError: no profile named 'gpux'" in result.stdout, \
        result.stdout[-3000:]
