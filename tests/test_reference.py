"""The reference results follow the code: one command re-records them from a main-job run, and a test fails when a
notebook changed after the commit they were recorded at."""

import json
import os
import shutil
import subprocess
import sys
import time
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


def _suite(tmp_path: Path, **changes) -> Path:
    record = {"kind": "test_suite", "seconds": 2217.4, "exit_status": 0, "marker_expression": None,
              "counts": {"passed": 2030, "failed": 0, "skipped": 4, "error": 0}, "git_commit": "abc1234",
              "environment": {"cpu_model": "Some CPU", "cpu_cores": 2, "date": "2026-11-26T20:00:00+00:00"},
              "slowest": [{"test": "tests/test_notebooks.py::test_main_job", "seconds": 640.2}],
              "files": [{"file": "tests/test_notebooks.py", "seconds": 700.5, "tests": 40}], **changes}
    path = tmp_path / "test-suite.json"
    path.write_text(json.dumps(record))
    return path


def test_the_test_suites_time_joins_the_page_and_survives_a_new_run(tmp_path):
    target = tmp_path / "reference"
    reference.keep_as_reference(_run_folder(tmp_path), target)
    reference.main(["--tests", str(_suite(tmp_path)), "--into", str(target)])
    page = (target / "RUN.md").read_text()
    assert "37.0 minutes (2,217 s) at commit abc1234 on Some CPU (2 cores)" in page
    assert "2,030 passed, 4 skipped" in page and "| `tests/test_notebooks.py::test_main_job` | 640.2 |" in page
    assert "| `tests/test_notebooks.py` | 40 | 700.5 |" in page
    reference.keep_as_reference(_run_folder(tmp_path / "again"), target)  # a newer notebook run keeps the suite's time
    assert "37.0 minutes" in (target / "RUN.md").read_text()


@pytest.mark.parametrize("changes, words", [
    ({"exit_status": 1, "counts": {"passed": 3, "failed": 1}}, "failed"),
    ({"marker_expression": "not slow and not notebook"}, "timed only the tests marked"),
    ({"kind": "train"}, "not a test-suite record")])
def test_a_suite_record_that_is_not_a_whole_passing_run_is_refused_in_one_line(tmp_path, capsys, changes, words):
    target = tmp_path / "reference"
    reference.keep_as_reference(_run_folder(tmp_path), target)
    with pytest.raises(SystemExit) as stop:
        reference.main(["--tests", str(_suite(tmp_path, **changes)), "--into", str(target)])
    err = capsys.readouterr().err.strip()
    assert stop.value.code == 2 and len(err.splitlines()) == 1 and words in err
    assert "test suite" not in (target / "RUN.md").read_text()


@pytest.mark.slow
def test_make_test_writes_the_record_the_page_reads(tmp_path):
    """The conftest's --suite-record, run on a tiny suite in a subprocess: the record is one reference accepts."""
    (tmp_path / "test_tiny.py").write_text("def test_one():\n    assert 1 + 1 == 2\n")
    record = tmp_path / "suite.json"
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "conftest",
                           "--rootdir", str(REPO), "-c", str(REPO / "pyproject.toml"), "--suite-record", str(record),
                           str(tmp_path / "test_tiny.py")], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    suite = reference.read_suite_record(record)
    assert suite["counts"]["passed"] == 1 and suite["slowest"][0]["test"].endswith("test_one")
    assert [(row["file"].endswith("test_tiny.py"), row["tests"]) for row in suite["files"]] == [(True, 1)]
    assert suite["background"] is None  # no attendee copies ran beside this suite


def test_the_record_says_when_the_attendee_run_ended_and_how_long_the_session_waited_for_it(tmp_path, monkeypatch):
    """What the suite's record keeps of the background run (tests/attendee_run.py): where CI's minutes went."""
    import attendee_run

    monkeypatch.setattr(attendee_run, "timings", {})
    started = time.time() - 100
    run = attendee_run.AttendeeRun(tmp_path, tmp_path / "executed", [], 5.0, started_at=started)
    (tmp_path / "rc").write_text("0\n")
    os.utime(tmp_path / "rc", (started + 60, started + 60))  # it ended 60 s after it started, before the wait
    assert attendee_run.result(run).returncode == 0
    assert attendee_run.timings == {"attendee_copies_s": 60.0, "exit_status": 0, "cpu_weight": None, "waited_s": 0.0}
