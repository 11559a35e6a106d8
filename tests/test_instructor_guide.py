"""The instructor guide stays true to the notebooks, the decks and the README."""

from __future__ import annotations

import json
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
GUIDE = ROOT / "slides" / "INSTRUCTOR.md"


def _exercises(notebook: Path) -> list[str]:
    """The exercise numbers a notebook's headings announce ("Exercise 2.3")."""
    cells = json.loads(notebook.read_text())["cells"]
    text = "\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "markdown")
    return re.findall(r"^#+ Exercise (\d\.\d)", text, re.M)


def test_the_readme_links_the_guide():
    assert "(slides/INSTRUCTOR.md)" in (ROOT / "README.md").read_text()


def test_every_notebook_with_its_deck_exercises_and_reference_cpu_time_is_in_the_guide():
    guide = GUIDE.read_text()
    rows = {line.split("|")[2].strip(" `"): line for line in guide.splitlines() if line.startswith("| ") and ".ipynb" in line}
    notebooks = sorted((ROOT / "notebooks").glob("0*.ipynb"))
    assert set(rows) == {n.name for n in notebooks}
    reference = {e["notebook"]: e["seconds"] for e in
                 json.loads((ROOT / "results" / "reference" / "reference.json").read_text())["notebooks"]}
    for notebook in notebooks:
        row = rows[notebook.name]
        deck = row.split("|")[3].strip(" `")
        assert (ROOT / "slides" / "decks" / deck).is_file(), f"{notebook.name}: no deck {deck}"
        listed = re.findall(r"(\d\.\d) ", row.split("|")[4])
        assert listed == _exercises(notebook), f"{notebook.name}: guide lists {listed}, notebook has {_exercises(notebook)}"
        shown = re.search(r"(\d+) s", row.split("|")[5])
        assert shown, f"{notebook.name}: no measured CPU time in {row!r}"
        assert int(shown.group(1)) == round(reference[notebook.name]), \
            f"{notebook.name}: the guide says {shown.group(0)}, the reference run {reference[notebook.name]} s: update its column after re-recording"
    facts = json.loads((ROOT / "results" / "reference" / "reference.json").read_text())
    assert f"commit {facts['commit']}" in guide, "the guide names the reference run's commit its times come from"


def test_the_guide_gives_the_preflight_commands_that_exist():
    guide = GUIDE.read_text()
    assert "python -m workshop_utils.run_notebooks --check --profile gpu" in guide
    assert "slurm/preflight.sbatch" in guide and (ROOT / "slurm" / "preflight.sbatch").is_file()
    assert "results/reference/" in guide and "## When a live demo fails" in guide
