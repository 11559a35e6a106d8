"""The notebooks as users run them: headless with papermill, and through the main job.

nbval executes every notebook as well (``--nbval-lax`` over ``notebooks/``, see pyproject.toml).
"""

import json
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

import workshop_utils as wu

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
BASELINE = ROOT / "notebooks" / "01_single_gpu_baseline.ipynb"


def _execute(notebook: Path, out: Path, **parameters):
    import papermill

    return papermill.execute_notebook(str(notebook), str(out), parameters=parameters, cwd=str(notebook.parent),
                                      kernel_name="python3", progress_bar=False)


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=lambda p: p.stem)
def test_committed_without_outputs_and_with_parameters(notebook):
    nb = nbformat.read(notebook, as_version=4)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert all(not c.outputs and c.execution_count is None for c in code), "clear outputs before committing"
    parameters = [c for c in code if "parameters" in c.metadata.get("tags", [])]
    assert len(parameters) == 1 and code[0] is parameters[0]
    assert 'profile = "auto"' in parameters[0].source and "run_dir = None" in parameters[0].source


@pytest.mark.notebook
def test_baseline_notebook_obeys_papermill_parameters(tmp_path):
    _execute(BASELINE, tmp_path / "out.ipynb", run_dir=str(tmp_path), profile="cpu", epochs=1, train_size=512)
    record = json.loads((tmp_path / "results" / "baseline.json").read_text())
    assert record["config"]["epochs"] == 1 and record["metrics"]["steps"] == 512 // 64
    assert record["metrics"]["parameters"] == 2_474_506
    resumed = json.loads((tmp_path / "results" / "section-baseline.json").read_text())
    assert resumed["title"].startswith("Single-GPU baseline")
    assert (tmp_path / "figures" / "baseline_curves.png").stat().st_size > 10_000


@pytest.mark.notebook
@pytest.mark.parametrize("notebook", [p for p in NOTEBOOKS if p != BASELINE], ids=lambda p: p.stem)
def test_notebook_runs_headless_and_reports(notebook, tmp_path):
    _execute(notebook, tmp_path / "out.ipynb", run_dir=str(tmp_path), profile="cpu")
    sections = [json.loads(p.read_text()) for p in (tmp_path / "results").glob("section-*.json")]
    assert sections, "every notebook adds at least one section to the main job's report"
    report = wu.write_report(tmp_path).read_text()
    for section in sections:
        assert f"## {section['title']}" in report
        for figure in section["figures"]:
            assert (tmp_path / figure).stat().st_size > 5_000, figure


@pytest.mark.notebook
def test_main_job_runs_notebooks_and_writes_the_report(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "workshop_utils.run_notebooks", "--only", "01",
                           "--run-dir", str(tmp_path)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-2000:]
    report = (tmp_path / "report.md").read_text()
    assert "## Single-GPU baseline (notebook 01)" in report and "| throughput" in report
    assert "Synthetic data" in report  # no CIFAR-10 here, and the report says so
    entry = json.loads((tmp_path / "notebooks.json").read_text())[0]
    assert (entry["status"], entry["profile"], entry["budget_s"], entry["error"]) == ("ok", "cpu", 300, "")
    assert f"ok      {BASELINE.name} {entry['seconds']:.1f} s" in proc.stdout
    assert f"| {BASELINE.name} | ok | {entry['seconds']:.1f} | 300 |" in report
    assert (tmp_path / "notebooks" / BASELINE.name).exists()


def test_main_job_rejects_an_unknown_notebook(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "workshop_utils.run_notebooks", "--only", "99",
                           "--run-dir", str(tmp_path)], capture_output=True, text=True)
    assert proc.returncode == 2 and "No notebook" in proc.stderr
