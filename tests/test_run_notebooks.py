"""The main job and the pre-flight, on tiny notebooks written into tmp_path.

What an instructor relies on the day before a workshop: a failing notebook is reported with its
cell and its cause (a WorkshopError's message and fix, or any other exception's first line) in the
console, in notebooks.json and in report.md; a notebook that hangs is stopped at its limit and the
others still run; --check holds every notebook to its time budget; and the profile the notebooks
receive is the main job's choice, while tests get the cpu profile even where a GPU is visible.
"""

import json
import os
import subprocess
import sys
import time

import nbformat
import pytest
import torch
from nbformat.v4 import new_code_cell, new_notebook

import workshop_utils as wu
import workshop_utils.run_notebooks as rn
from workshop_utils.system.profiles import PROFILE_VARIABLE, profile_choice

PARAMETERS = 'profile = "auto"\nrun_dir = None'


def write_notebook(folder, name: str, *cells: str):
    """A notebook shaped like the workshop's: a parameters cell first, then ``cells``."""
    folder.mkdir(parents=True, exist_ok=True)
    nb = new_notebook(cells=[new_code_cell(PARAMETERS, metadata={"tags": ["parameters"]}),
                             *(new_code_cell(c) for c in cells)])
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(nb, folder / name)
    return folder / name


def main_job(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "workshop_utils.run_notebooks", *args], capture_output=True,
                          text=True, env={**os.environ, **(env or {})}, timeout=300)


def entries(run_dir) -> dict[str, dict]:
    return {e["notebook"]: e for e in json.loads((run_dir / "notebooks.json").read_text())}


# ---------------------------------------------------------------------- failures keep their cause


@pytest.mark.slow
def test_a_failing_notebook_is_reported_with_its_cell_and_cause(tmp_path):
    folder, run_dir = tmp_path / "nbs", tmp_path / "run"
    write_notebook(folder, "a_workshop_error.ipynb",
                   "import workshop_utils as wu\nwu.install_notebook_error_handler()",
                   "data = wu.resolve_run_dir(run_dir)\n"
                   "raise wu.WorkshopError('Folder /x | y holds no CIFAR-10.', 'pass data_root=... or unset it.')",
                   "print('never reached')")
    write_notebook(folder, "b_plain_error.ipynb", "x = 1",
                   "# section 3: gradient magnitudes\n"
                   "raise TypeError(\"can't convert cuda:0 device type tensor to numpy.\\nUse Tensor.cpu()\")")
    write_notebook(folder, "c_fine.ipynb", "print('fine', profile)")

    proc = main_job("--notebooks", str(folder), "--run-dir", str(run_dir), "--profile", "cpu")

    assert proc.returncode == 1, proc.stderr[-3000:]
    assert "error: 2 notebook(s) failed: a_workshop_error.ipynb, b_plain_error.ipynb" in proc.stderr
    console = proc.stdout + proc.stderr
    workshop_cause = "WorkshopError: Folder /x | y holds no CIFAR-10. Fix: pass data_root=... or unset it."
    plain_cause = "TypeError: can't convert cuda:0 device type tensor to numpy."
    assert f"in In [4] `data = wu.resolve_run_dir(run_dir)`: {workshop_cause}" in console
    assert f"in In [4] `# section 3: gradient magnitudes`: {plain_cause}" in console
    assert "Exception encountered" not in console

    log = entries(run_dir)
    bad, plain, fine = log["a_workshop_error.ipynb"], log["b_plain_error.ipynb"], log["c_fine.ipynb"]
    assert (bad["status"], bad["cell"], bad["error"]) == ("FAILED", 4, workshop_cause)
    assert bad["cell_source"] == "data = wu.resolve_run_dir(run_dir)"
    assert (plain["status"], plain["cell"], plain["error"]) == ("FAILED", 4, plain_cause)
    assert fine["status"] == "ok" and fine["error"] == "" and fine["cell"] is None
    assert all(e["seconds"] > 0 and e["budget_s"] == 300 and e["over_budget"] is False for e in log.values())

    report = (run_dir / "report.md").read_text()
    assert workshop_cause.replace("|", "\\|") in report and plain_cause in report
    assert "| a_workshop_error.ipynb | **FAILED** |" in report and "| c_fine.ipynb | ok |" in report
    assert "In [4] `data = wu.resolve_run_dir(run_dir)`" in report
    assert (run_dir / "notebooks" / "a_workshop_error.ipynb").exists(), "the executed copy is kept"


@pytest.mark.slow
def test_a_hung_notebook_is_stopped_at_its_limit_and_the_others_still_run(tmp_path):
    folder, run_dir = tmp_path / "nbs", tmp_path / "run"
    write_notebook(folder, "a_hangs.ipynb", "import time", "time.sleep(600)  # waits on something that never comes")
    write_notebook(folder, "b_fine.ipynb", "print('fine')")

    with pytest.raises(SystemExit) as failed:
        rn.main(["--notebooks", str(folder), "--run-dir", str(run_dir), "--profile", "cpu", "--timeout", "2"])

    assert failed.value.code == 1
    log = entries(run_dir)
    hung = log["a_hangs.ipynb"]
    assert hung["status"] == "FAILED" and hung["timed_out"] is True and hung["limit_s"] == 2
    assert hung["cell"] == 4 and hung["cell_source"].startswith("time.sleep(600)")
    assert "stopped at its time limit of 2 s" in hung["error"]
    assert hung["seconds"] < 120, "the limit did not stop the notebook"
    assert log["b_fine.ipynb"]["status"] == "ok"
    assert "stopped at its time limit of 2 s" in (run_dir / "report.md").read_text()


@pytest.mark.slow
def test_check_holds_every_notebook_to_its_budget(tmp_path, monkeypatch, capsys):
    """Budget 1 s here: a run flags the 2-s notebook over budget; the pre-flight stops it at 1 s and fails."""
    monkeypatch.setitem(rn.TIME_BUDGET_S, "cpu", 1)
    folder = tmp_path / "nbs"
    write_notebook(folder, "a_slow.ipynb", "import time\ntime.sleep(2)")

    rn.main(["--notebooks", str(folder), "--run-dir", str(tmp_path / "run"), "--profile", "cpu"])
    slow = entries(tmp_path / "run")["a_slow.ipynb"]
    assert slow["status"] == "ok" and slow["over_budget"] is True and slow["limit_s"] is None
    assert "SLOW    a_slow.ipynb" in capsys.readouterr().out
    assert "| a_slow.ipynb | ok, **over budget** |" in (tmp_path / "run" / "report.md").read_text()

    with pytest.raises(SystemExit) as stopped:
        rn.main(["--check", "--notebooks", str(folder), "--run-dir", str(tmp_path / "check"), "--profile", "cpu"])
    assert stopped.value.code == 1
    assert "Pre-flight: NOT ready: 0 of 1 notebook(s) pass within their budget; failed: a_slow.ipynb" \
        in capsys.readouterr().out
    checked = entries(tmp_path / "check")["a_slow.ipynb"]
    assert checked["status"] == "FAILED" and checked["timed_out"] is True and checked["limit_s"] == 1
    assert checked["check"] is True
    assert "**Pre-flight: NOT ready.**" in (tmp_path / "check" / "report.md").read_text()


def _running_cell(executed) -> int | None:
    """Index of the cell papermill marked as running in an executed copy (None before there is one)."""
    try:
        cells = json.loads(executed.read_text())["cells"]
    except (OSError, ValueError, KeyError):  # not written yet, or caught mid-write
        return None
    return next((i for i, c in enumerate(cells) if c["metadata"].get("papermill", {}).get("status") == "running"),
                None)


@pytest.mark.slow
def test_a_main_job_stopped_by_the_batch_system_still_writes_its_report(tmp_path):
    """SIGTERM (Slurm's time limit, scancel) mid-notebook: what finished is reported, the rest is named."""
    folder, run_dir = tmp_path / "nbs", tmp_path / "run"
    write_notebook(folder, "a_fine.ipynb", "print('fine')")
    write_notebook(folder, "b_long.ipynb", "import time", "print('started', flush=True)\ntime.sleep(600)")
    job = subprocess.Popen([sys.executable, "-m", "workshop_utils.run_notebooks", "--notebooks", str(folder),
                            "--run-dir", str(run_dir), "--profile", "cpu"], stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, text=True)
    try:
        for line in job.stdout:
            if "=== [2/2] b_long.ipynb" in line:
                break
        while _running_cell(run_dir / "notebooks" / "b_long.ipynb") != 3:  # papermill saves as a cell starts
            assert job.poll() is None, "the main job ended before the long cell began"
            time.sleep(0.2)
        job.terminate()
        rest = job.communicate(timeout=120)[0]
    finally:
        job.kill()
    assert job.returncode == 143, rest
    assert "Stopped (SIGTERM): the report covers the notebooks that finished." in rest
    log = entries(run_dir)
    assert log["a_fine.ipynb"]["status"] == "ok"
    stopped = log["b_long.ipynb"]
    assert stopped["status"] == "FAILED" and stopped["error"].startswith("the main job was stopped (SIGTERM)")
    assert stopped["cell"] == 4 and stopped["cell_source"] == "print('started', flush=True)"
    report = (run_dir / "report.md").read_text()
    assert "| a_fine.ipynb | ok |" in report and "the main job was stopped (SIGTERM)" in report


@pytest.mark.parametrize("args, message", [
    (["--timeout", "-1"], "is not a positive number of seconds"),
    (["--timeout", "inf"], "is not a positive number of seconds"),
    (["--notebooks", "/nonexistent/notebooks"], "does not exist"),
    (["--only", "99"], "No notebook"),
])
def test_bad_arguments_get_one_line_and_exit_2(tmp_path, capsys, args, message):
    with pytest.raises(SystemExit) as refused:
        rn.main(["--run-dir", str(tmp_path / "run"), "--profile", "cpu", *args])
    stderr = capsys.readouterr().err
    assert refused.value.code == 2 and message in stderr, stderr
    assert stderr.count("\n") == 1 and stderr.startswith("error: ")
    assert not (tmp_path / "run").exists(), "nothing is created before the arguments are checked"


# ---------------------------------------------------------------------- the profile: tests cpu, main job auto


def test_tests_get_the_cpu_profile_even_where_a_gpu_is_visible(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert os.environ[PROFILE_VARIABLE] == "cpu", "the root conftest.py sets it for every test and kernel"
    assert wu.resolve_profile("auto") == "cpu"
    assert wu.resolve_profile("gpu") == "gpu", "an explicit profile wins over the variable"
    monkeypatch.delenv(PROFILE_VARIABLE)
    assert profile_choice("auto") == ("gpu", "auto: a CUDA GPU is visible")


def test_the_variable_is_checked_like_any_input(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setenv(PROFILE_VARIABLE, "gpu-large")
    with pytest.raises(wu.WorkshopError, match="WORKSHOP_PROFILE='gpu-large' is not a profile"):
        wu.resolve_profile("auto")
    monkeypatch.setenv(PROFILE_VARIABLE, "gpu")
    with pytest.raises(wu.WorkshopError, match="WORKSHOP_PROFILE=gpu asks for the 'gpu' profile.*unset"):
        wu.resolve_profile("auto")
    assert wu.resolve_profile("cpu") == "cpu"
    monkeypatch.setenv(PROFILE_VARIABLE, "auto")
    assert wu.resolve_profile("auto") == "cpu"


@pytest.mark.slow
def test_the_main_job_decides_the_profile_and_the_notebooks_receive_it(tmp_path, monkeypatch):
    """The main job without --profile: gpu where a GPU is visible, and the notebook gets that name.

    The kernel pretends to see a GPU too: under the tests' WORKSHOP_PROFILE=cpu its own "auto"
    is cpu (what the kernels of the notebooks the tests run get); without the variable it would be gpu.
    """
    folder = tmp_path / "nbs"
    write_notebook(folder, "a_profile.ipynb",
                   "import json, torch\nimport workshop_utils as wu\ntorch.cuda.is_available = lambda: True\n"
                   "json.dump({'given': profile, 'auto_in_kernel': wu.resolve_profile('auto')},\n"
                   "          open(f'{run_dir}/profile.json', 'w'))")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    seen = {}
    for case, variable in (("tests", "cpu"), ("main job", None)):
        if variable:
            monkeypatch.setenv(PROFILE_VARIABLE, variable)
        else:
            monkeypatch.delenv(PROFILE_VARIABLE, raising=False)
        rn.main(["--notebooks", str(folder), "--run-dir", str(tmp_path / case)])
        seen[case] = (entries(tmp_path / case)["a_profile.ipynb"]["profile"],
                      json.loads((tmp_path / case / "profile.json").read_text()))
    assert seen["tests"] == ("cpu", {"given": "cpu", "auto_in_kernel": "cpu"})
    assert seen["main job"] == ("gpu", {"given": "gpu", "auto_in_kernel": "gpu"})


@pytest.mark.slow
def test_the_kernels_threads_wait_passively_unless_the_user_chose_otherwise(tmp_path):
    """Spinning OpenMP threads take the cores a busy machine's other work needs (wu.wait_passively).

    The main job sets the policy for its kernels when no one has; a policy the user set is theirs. The
    kernel's own environment record says which one ran, next to the thread count it used.
    """
    folder = tmp_path / "nbs"
    write_notebook(folder, "a_policy.ipynb",
                   "import json\nimport workshop_utils as wu\n"
                   "json.dump(wu.environment('cpu'), open(f'{run_dir}/env.json', 'w'))")
    seen = {}
    for case, policy in (("unset", None), ("user's", "ACTIVE")):
        env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
        if policy:
            env["OMP_WAIT_POLICY"] = policy
        done = subprocess.run([sys.executable, "-m", "workshop_utils.run_notebooks", "--notebooks", str(folder),
                               "--run-dir", str(tmp_path / case)], capture_output=True, text=True, env=env,
                              timeout=300)
        assert done.returncode == 0, done.stdout + done.stderr
        seen[case] = json.loads((tmp_path / case / "env.json").read_text())
    assert seen["unset"]["omp_wait_policy"] == "PASSIVE"
    assert seen["user's"]["omp_wait_policy"] == "ACTIVE"
    assert seen["unset"]["cpu_threads"] == torch.get_num_threads()


def test_wait_passively_keeps_a_policy_the_user_set():
    fresh, chosen = {}, {"OMP_WAIT_POLICY": "ACTIVE"}
    wu.wait_passively(fresh)
    wu.wait_passively(chosen)
    assert (fresh, chosen) == ({"OMP_WAIT_POLICY": "PASSIVE"}, {"OMP_WAIT_POLICY": "ACTIVE"})


def test_a_saved_copy_keeps_what_a_front_end_shows_of_a_progress_bar(tmp_path):
    """papermill saves every refresh of a bar as an output; the executed copy keeps the last state only, in order."""
    import nbformat

    from workshop_utils.run_notebooks import settle_streams

    bar = [nbformat.v4.new_output("stream", name="stderr", text=f"\rtraining: {i}/3") for i in range(4)]
    bar.append(nbformat.v4.new_output("stream", name="stderr", text="\r" + " " * 20 + "\r"))  # leave=False
    table = nbformat.v4.new_output("display_data", data={"text/plain": "a table"})
    cell = nbformat.v4.new_code_cell("run()", outputs=[
        nbformat.v4.new_output("stream", name="stdout", text="before\n"), *bar, table,
        nbformat.v4.new_output("stream", name="stdout", text="after\rAFTER\n"),
        nbformat.v4.new_output("stream", name="stderr", text="warning: kept\n")])
    path = tmp_path / "executed.ipynb"
    nbformat.write(nbformat.v4.new_notebook(cells=[cell]), path)
    settle_streams(path)
    outputs = nbformat.read(path, as_version=4).cells[0].outputs
    shown = [(o.output_type, o.get("name"), o.get("text") or o.data["text/plain"]) for o in outputs]
    assert shown == [("stream", "stdout", "before\n"), ("display_data", None, "a table"),
                     ("stream", "stdout", "AFTER\n"), ("stream", "stderr", "warning: kept\n")]
