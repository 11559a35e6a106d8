"""The reference results follow the code: one command re-records them from a main-job run, and a test fails when a
notebook changed after the commit they were recorded at."""

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from workshop_utils import reference

REPO = Path(__file__).resolve().parents[1]
REFERENCE = REPO / "results" / "reference"


def _run_folder(tmp_path: Path, status: str = "ok", commits=("abc1234",)) -> Path:
    run = tmp_path / "runs" / "2026-11-26-1200"
    (run / "results").mkdir(parents=True)
    (run / "figures").mkdir()
    (run / "figures" / "baseline_curves.png").write_bytes(b"png")
    for i, commit in enumerate(commits):
        (run / "results" / f"r{i}.json").write_text(json.dumps({
            "name": f"r{i}", "git_commit": commit, "kind": "train",
            "environment": {"device_type": "cpu", "cpu_model": "Some CPU", "cpu_cores": 2, "torch": "2.x"}}))
    (run / "report.md").write_text("# report")
    (run / "notebooks.json").write_text(json.dumps([
        {"notebook": "01_x.ipynb", "status": "ok", "seconds": 40.5, "budget_s": 300, "profile": "cpu"},
        {"notebook": "02_y.ipynb", "status": status, "seconds": 60.0, "budget_s": 300, "profile": "cpu"}]))
    return run


def test_a_complete_run_replaces_the_reference_and_keeps_the_other_references(tmp_path):
    run = _run_folder(tmp_path)
    target = tmp_path / "reference"
    (target / "results").mkdir(parents=True)
    (target / "results" / "stale.json").write_text("{}")
    (target / "gpu").mkdir()
    (target / "gpu" / "kept.json").write_text("{}")
    reference.keep_as_reference(run, target)
    assert sorted(p.name for p in (target / "results").iterdir()) == ["r0.json"]
    assert (target / "gpu" / "kept.json").exists() and (target / "figures" / "baseline_curves.png").exists()
    facts = json.loads((target / "reference.json").read_text())
    assert facts["commit"] == "abc1234" and facts["run"] == run.name
    page = (target / "RUN.md").read_text()
    assert "| 01_x.ipynb | 40.5 | 300 |" in page and "**100.5**" in page and "Some CPU" in page


@pytest.mark.parametrize("status, commits, words", [
    ("FAILED", ("abc1234",), "did not finish: 02_y.ipynb"),
    ("ok", ("abc1234", "def5678"), "come from 2 commits")])  # not in this history: no way to tell
def test_a_run_that_cannot_be_the_reference_is_one_line(tmp_path, status, commits, words):
    run = _run_folder(tmp_path, status, commits)
    with pytest.raises(reference.WorkshopError, match=words):
        reference.keep_as_reference(run, tmp_path / "reference")
    assert not (tmp_path / "reference" / "reference.json").exists()


def test_the_command_line_is_one_line_for_a_missing_folder(tmp_path, capsys):
    with pytest.raises(SystemExit) as stop:
        reference.main([str(tmp_path / "nothing")])
    assert stop.value.code == 2 and len(capsys.readouterr().err.strip().splitlines()) == 1


def _git(*args) -> subprocess.CompletedProcess:
    return subprocess.run(["git", "-C", str(REPO), *args], capture_output=True, text=True)


@pytest.mark.skipif(shutil.which("git") is None or _git("rev-parse", "HEAD").returncode != 0,
                    reason="needs the checkout's git history")
def test_the_reference_is_newer_than_every_notebook_that_writes_it():
    facts = json.loads((REFERENCE / "reference.json").read_text())
    commit = facts["commit"]
    assert _git("cat-file", "-e", f"{commit}^{{commit}}").returncode == 0, f"{commit} is not in this history"
    changed = _git("log", "--format=%h %s", f"{commit}..HEAD", "--", "notebooks/").stdout.strip()
    assert not changed, ("notebooks changed after the reference was recorded: rerun `make run` and "
                         f"`python -m workshop_utils.reference runs/<stamp>`:\n{changed}")
