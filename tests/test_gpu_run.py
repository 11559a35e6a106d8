"""The GPU run (make gpu-run) rehearsed on a CPU with small stand-ins: the check's paths, then each notebook in its
own process, within one budget, one record; a notebook run without Jupyter as a kernel runs it; the multi-GPU code
in a process group of one. No session notebook runs here: the main job's one run of each is in test_notebooks.py."""

import json
import time
from pathlib import Path

import pytest
import torch

from workshop_utils.gpu_check import PATHS, Context, Failed, GpuPath
from workshop_utils.gpu_check import gpu_run, notebook_cells, notebooks, one_rank
from workshop_utils.gpu_check.notebooks import NOTEBOOK_RUNS, NotebookRun


def _notebook(path: Path, *sources: str, parameters: str = 'profile = "auto"\nrun_dir = None\n') -> Path:
    cells = [{"cell_type": "markdown", "metadata": {}, "source": "# a notebook"},
             {"cell_type": "code", "metadata": {"tags": ["parameters"]}, "outputs": [], "execution_count": None,
              "source": parameters}]
    cells += [{"cell_type": "code", "metadata": {}, "outputs": [], "execution_count": None, "source": s} for s in sources]
    path.write_text(json.dumps({"cells": cells, "metadata": {}, "nbformat": 4, "nbformat_minor": 5}))
    return path


def test_cells_run_as_a_kernel_runs_them_and_the_first_error_stops_the_notebook(tmp_path, capsys):
    source = _notebook(
        tmp_path / "01_demo.ipynb",
        "def twice(x):\n    return 2 * x\n\nimport inspect\nprint(inspect.getsource(twice).splitlines()[0], profile)",
        "41 + 1",  # a last bare expression is shown
        "x = 3\nx * 2;",  # ... unless the line ends with ;
        "import matplotlib\nmatplotlib.use('Agg')\nimport matplotlib.pyplot as plt\nplt.plot([1, 2])",
        "display('shown by display')",
        "import sys\nprint('to stderr', file=sys.stderr)\nraise ValueError('the cell broke\\nsecond line')",
        "print('never')")
    executed = tmp_path / "out" / "01_demo.ipynb"
    outcome = notebook_cells.execute(source, executed, {"profile": "gpu", "run_dir": "runs/x"})
    cells = [c for c in json.loads(executed.read_text())["cells"] if c["cell_type"] == "code"]
    assert "injected-parameters" in cells[1]["metadata"]["tags"] and "profile = 'gpu'" in cells[1]["source"]
    outputs = {c["execution_count"]: c["outputs"] for c in cells if c["execution_count"]}
    # a function a cell defines has its source, as in a kernel (a check sends it to other processes)
    assert outputs[3] == [{"output_type": "stream", "name": "stdout", "text": "def twice(x): gpu\n"}]
    assert outputs[4][0]["output_type"] == "execute_result" and outputs[4][0]["data"]["text/plain"] == "42"
    assert outputs[5] == []
    assert [o["output_type"] for o in outputs[6]] == ["execute_result", "display_data"]  # the line's value, the figure
    assert "image/png" in outputs[6][1]["data"]
    assert outputs[7][0]["data"]["text/plain"] == "'shown by display'"
    assert outputs[8][0] == {"output_type": "stream", "name": "stderr", "text": "to stderr\n"}
    assert outputs[8][-1]["output_type"] == "error" and outputs[8][-1]["ename"] == "ValueError"
    assert cells[-1]["execution_count"] is None  # not run after the error
    assert outcome["failed_cell"] == 8 and outcome["error"] == "ValueError: the cell broke"
    assert "def twice(x): gpu" in capsys.readouterr().out  # passed on to the console as it runs


def _paths():
    return [GpuPath("quick", "a path", ("a:b",), lambda ctx: "measured 1"),
            GpuPath("notebook-01", "replaced by notebook 01's full run", ("a:b",), lambda ctx: "never"),
            GpuPath("gpt-throughput", "left out", ("a:b",), lambda ctx: "never")]


@pytest.mark.slow
def test_the_gpu_run_runs_the_kept_paths_then_every_notebook_and_keeps_one_record(tmp_path):
    folder = tmp_path / "notebooks"
    folder.mkdir()
    record = {"metrics": {"samples_per_s": 1234.5, "mfu": 0.25, "parameters": 7, "step_ms_median": 2.0}}
    _notebook(folder / "01_first.ipynb",
              "import json, pathlib\nfolder = pathlib.Path(run_dir) / 'results'\nfolder.mkdir(parents=True, exist_ok=True)\n"
              f"(folder / 'baseline.json').write_text(json.dumps({record!r}))\nprint('trained')")
    _notebook(folder / "02_second.ipynb", "x = 1", "1 / 0")
    run_dir = tmp_path / "run"
    lines = []
    runs = (NotebookRun("01", 10, replaces=("notebook-01",)), NotebookRun("02", 10), NotebookRun("03", 10))
    done, written = gpu_run.run_gpu_run(_paths(), Context(torch.device("cpu"), run_dir), 120, "cells",
                                        {"device_name": "cpu"}, folder, say=lines.append, runs=runs)
    assert done["kind"] == "gpu_run" and written == [run_dir / "gpu_run.json"]
    assert [p["name"] for p in done["paths"]] == ["quick"]
    assert set(done["left_out"]) == {"notebook-01", "gpt-throughput"}
    first, second, third = done["notebooks"]
    assert first["status"] == "ok" and first["records"] == ["baseline.json"]
    assert first["headlines"] == {"baseline": {"samples_per_s": 1234.5, "mfu": 0.25, "step_ms_median": 2.0}}
    assert second["status"] == "FAILED" and second["cell"] == 4 and "ZeroDivisionError" in second["error"]
    assert third["status"] == "FAILED" and "no notebook 03_" in third["error"]
    assert (run_dir / "notebooks" / "01_first.ipynb").exists()
    assert any(line.startswith("✓ notebook 01_first.ipynb") and "1,234 samples/s, MFU 25.0%" in line for line in lines)
    assert any(line.startswith("✗ notebook 02_second.ipynb") and "cell 4 `1 / 0`" in line for line in lines)
    assert "notebooks: 1 of 3 ran end to end" in done["summary"] and "2 failed" in done["summary"]
    kept = gpu_run.keep_as_reference(done, [{**first, "outputs": notebooks.outputs_text(Path(first["executed"]))},
                                            second], run_dir, root=tmp_path)
    assert kept.parent == tmp_path / "results" / "reference" / "gpu" and kept.name.startswith("gpu_run-cpu-")
    assert json.loads((kept / "notebook-01.json").read_text())["outputs"][-1]["outputs"] == "trained\n"
    assert (kept / "results" / "baseline.json").exists() and (kept / "gpu_run.json").exists()


def test_a_notebook_stopped_at_its_limit_names_the_cell_it_was_in(tmp_path, monkeypatch):
    import subprocess

    folder = tmp_path / "notebooks"
    folder.mkdir()
    notebook = _notebook(folder / "04_slow.ipynb", "x = 1", "import time\ntime.sleep(600)")

    def stopped_in_cell_4(command, timeout, **options):  # as the executor leaves it: written after every cell
        executed = Path(command[command.index(str(notebook)) + 1])
        cells = json.loads(notebook.read_text())["cells"]
        cells.insert(2, notebook_cells.parameters_cell({"profile": "cpu"}))
        for number, cell in enumerate(cells[1:4], 1):  # the parameters, the injected ones, x = 1; not the sleep
            cell["execution_count"] = number
        executed.parent.mkdir(parents=True, exist_ok=True)
        executed.write_text(json.dumps({"cells": cells}))
        raise subprocess.TimeoutExpired(command, timeout)

    monkeypatch.setattr(notebooks.subprocess, "run", stopped_in_cell_4)
    entry = notebooks.run_notebook(NotebookRun("04", 100), folder, tmp_path / "run", "cpu", 30, "cells")
    assert entry["status"] == "FAILED" and entry["cell"] == 4
    assert entry["error"] == "stopped at its time limit of 30 s, in the cell after cell 3 (`x = 1`)"


def test_what_does_not_fit_the_budget_is_not_reached_and_said(tmp_path):
    slow = [GpuPath("slow", "x", ("a:b",), lambda ctx: time.sleep(5) or "late", least_s=0.1)]
    lines = []
    done, _ = gpu_run.run_gpu_run(slow, Context(torch.device("cpu"), tmp_path), 1, "cells", {"device_name": "cpu"},
                                  tmp_path, say=lines.append, runs=(NotebookRun("01", 10),))
    assert done["paths"][0]["status"] == "not reached" and done["notebooks"][0]["status"] == "not reached"
    assert any(line.startswith("… notebook 01: not reached") for line in lines)


def test_the_plan_leaves_out_what_a_notebook_runs_whole_and_says_why():
    kept, left_out = gpu_run.plan(PATHS)
    names = [p.name for p in kept]
    replaced = {name for run in NOTEBOOK_RUNS for name in run.replaces}
    assert set(left_out) == replaced | set(notebooks.LEFT_OUT) and not set(names) & set(left_out)
    assert names[:len(one_rank.PARTS)] == [part.name for part in one_rank.PARTS]  # the newest evidence first
    assert {"cuda-events", "peak-memory", "gpt-evaluation", "gpu-topology"} <= set(names)
    assert {run.prefix for run in NOTEBOOK_RUNS} == {"01", "02", "03", "04", "05"}


def test_the_one_rank_parts_share_one_process_and_each_keeps_its_verdict(tmp_path, monkeypatch):
    parts = [p for p in one_rank.one_rank_paths()][:3]
    launched = []

    def one_launch(names, ctx, timeout_s):  # the first part passes, the second fails, the process ends before the third
        launched.append(names)
        return ({names[0]: {"line": "it ran", "seconds": 2.0}, names[1]: {"failed": "wrong", "seconds": 1.0}},
                "exit status -11: Segmentation fault")

    monkeypatch.setattr(one_rank, "_launch", one_launch)
    lines = []
    verdicts = one_rank.run_group(parts, Context(torch.device("cpu"), tmp_path), 100, say=lines.append)
    assert launched == [[p.name for p in parts]]
    assert [v.status for v in verdicts] == ["ok", "failed", "failed"] and verdicts[0].seconds == 2.0
    assert "it cannot show" in verdicts[0].detail and "Segmentation fault" in verdicts[2].detail
    assert len(lines) == 4 and lines[0].startswith("3 parts in one process group of one (cpu): ")


def test_a_one_rank_part_that_breaks_says_so_in_one_line(tmp_path, monkeypatch):
    def broken(device, folder):
        raise Failed("the sharded weights differ")

    monkeypatch.setitem(one_rank.BY_NAME, "pipeline-one-rank",
                        one_rank.OneRankPart("pipeline-one-rank", "x", ("a:b",), broken, "nothing"))
    out = tmp_path / "said.json"
    assert one_rank.main(["pipeline-one-rank", "--device", "cpu", "--out", str(out)]) == 1
    said = json.loads(out.read_text())["pipeline-one-rank"]
    assert said["failed"] == "the sharded weights differ" and said["seconds"] >= 0
    assert not torch.distributed.is_initialized()  # the group of one is gone with the part


@pytest.mark.slow
def test_a_one_rank_part_runs_in_a_group_of_one_and_says_what_one_rank_cannot_show(tmp_path):
    path = next(p for p in one_rank.one_rank_paths() if p.name == "collectives-one-rank")
    line = path.run(Context(torch.device("cpu"), tmp_path))
    assert "all-reduce sweep over 3 sizes" in line and line.endswith("it cannot show a link's latency and bandwidth")


def test_with_papermill_a_notebook_runs_as_the_main_job_runs_it(tmp_path, monkeypatch):
    from workshop_utils import run_notebooks

    folder = tmp_path / "notebooks"
    folder.mkdir()
    _notebook(folder / "03_modes.ipynb", "x = 1")
    seen = []

    def run_one(notebook, run_dir, profile, limit_s=None, check=False):  # the main job's own runner, its arguments
        seen.append((notebook.name, profile, limit_s, (run_dir / "notebooks").is_dir()))
        return {"status": "ok", "seconds": 12.5, "cell": None, "cell_source": "", "error": ""}

    monkeypatch.setattr(run_notebooks, "run_one", run_one)
    entry = notebooks.run_notebook(NotebookRun("03", 75), folder, tmp_path / "run", "gpu", 200, "papermill")
    assert seen == [("03_modes.ipynb", "gpu", 200, True)]
    assert entry["status"] == "ok" and entry["executor"] == "papermill" and entry["estimate_s"] == 75

