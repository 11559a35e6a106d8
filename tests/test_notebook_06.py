"""Notebook 06 executed against a real Slurm: the throw-away local one that tests/slurm_cluster.py starts.

The main job (tests/test_notebooks.py) runs notebook 06 where no Slurm is reachable, so there it
replays the recorded run. Here the notebook gets a cluster: one node with this machine's 2 CPUs,
cores bound per task. It is executed the way the main job executes it (``run_notebooks --only 06``,
cpu profile, papermill), its kernel finding the cluster through SLURM_CONF, under a time limit;
then the tests read what it recorded (``<run>/results/slurm/steps.json``, the report section): every
job completed 0:0, each task on its own core with its DataLoader workers there too, the sweep's one
table, the preempted job requeued once and ending with the uninterrupted run's parameters.

Recording the reference that the no-Slurm path shows: ``WORKSHOP_RECORD_SLURM_REFERENCE=1 pytest
tests/test_notebook_06.py`` copies the run's steps.json to results/reference/slurm/ (see the README there).

The fast tests at the end check the pieces without a cluster: flags generated from a TrainConfig read
back into the same config, the parsers of Slurm's output, the gathering of a sweep, and the replay.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import nbformat
import pytest

from slurm_cluster import SlurmCluster, missing_binaries

from workshop_utils.parallel.launch import stop_process_group
from workshop_utils.system.profiles import notebook_profiles

REPO = Path(__file__).resolve().parent.parent
NOTEBOOK = "06_slurm_deployment.ipynb"
REFERENCE = REPO / "results" / "reference" / "slurm"
# The notebook takes about 2 minutes on an idle 2-core machine; the limit leaves room for a busy one.
NOTEBOOK_LIMIT_S = 420
needs_slurm = pytest.mark.skipif(bool(missing_binaries()),
                                 reason=f"Slurm/munge not installed (missing: {', '.join(missing_binaries())}); "
                                        "install with: apt-get install slurm-wlm munge")


@pytest.fixture(scope="module")
def executed(tmp_path_factory):
    """Notebook 06 run once against a fresh local Slurm; (run folder, notebooks.json entry, console, steps)."""
    root = tmp_path_factory.mktemp("slurm06")
    cluster = SlurmCluster(root / "cluster")
    run_dir = root / "run"
    try:
        cluster.start()
        env = {**cluster.env, "PATH": f"{Path(sys.executable).parent}:{cluster.env.get('PATH', '/usr/bin:/bin')}",
               "WORKSHOP_PROFILE": "cpu", "WORKSHOP_RUNS": str(root / "runs")}
        env.pop("WORKSHOP_SLURM", None)  # the suite may turn Slurm off for the main job; this test wants it
        process = subprocess.Popen(
            [sys.executable, "-m", "workshop_utils.run_notebooks", "--profile", "cpu", "--only", "06",
             "--run-dir", str(run_dir), "--timeout", str(NOTEBOOK_LIMIT_S)],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, cwd=REPO, start_new_session=True)
        try:
            console, _ = process.communicate(timeout=NOTEBOOK_LIMIT_S + 60)
        except subprocess.TimeoutExpired:
            stop_process_group(process, grace_s=20)
            console = (process.stdout.read() if process.stdout else "") + "\n(stopped: over the time limit)"
    finally:
        cluster.stop()
    log = json.loads((run_dir / "notebooks.json").read_text()) if (run_dir / "notebooks.json").exists() else []
    entry = next((e for e in log if e["notebook"] == NOTEBOOK), {"status": "missing", "error": console[-3000:]})
    steps_path = run_dir / "results" / "slurm" / "steps.json"
    recorded = json.loads(steps_path.read_text()) if steps_path.exists() else {"about": {}, "steps": []}
    if os.environ.get("WORKSHOP_RECORD_SLURM_REFERENCE") == "1" and entry["status"] == "ok":
        REFERENCE.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(steps_path, REFERENCE / "steps.json")
    return run_dir, entry, console, recorded


def steps_of(recorded: dict, kind: str) -> list[dict]:
    return [s for s in recorded["steps"] if s["kind"] == kind]


def frame_rows(value: dict) -> list[dict]:
    """A table as the recording keeps it ({"__frame__": {"columns", "data"}}) as a list of dicts."""
    split = value["__frame__"]
    return [dict(zip(split["columns"], row)) for row in split["data"]]


@needs_slurm
@pytest.mark.notebook
@pytest.mark.slow
@pytest.mark.timeout(NOTEBOOK_LIMIT_S + 180)
def test_notebook_06_runs_live_against_the_local_slurm_within_its_limit(executed):
    run_dir, entry, console, recorded = executed
    assert entry["status"] == "ok", f"{entry.get('error')}\n{console[-3000:]}"
    assert 0 < entry["seconds"] < NOTEBOOK_LIMIT_S and not entry["timed_out"], entry
    assert "answers here" in recorded["about"]["site"] and "workshoptest" in recorded["about"]["where"]
    cells = nbformat.read(run_dir / "notebooks" / NOTEBOOK, as_version=4).cells
    printed = "".join(o.get("text", "") for c in cells if c.cell_type == "code" for o in c.outputs)
    assert "answers here" in printed and "[recorded]" not in printed, "a live run must not replay anything"
    kinds = [s["kind"] for s in recorded["steps"]]
    assert kinds[:2] == ["cluster", "submit"] and kinds[-3:] == ["timeline", "jobs", "usage"], kinds
    usage = recorded["steps"][-1]["value"]  # Exercise 6.3's input: the first job, read back after it ended
    assert usage["cpus"] == 1 and usage["gpus"] == 0 and 0 < usage["elapsed_s"] <= usage["time_limit_s"] == 600
    assert 0 < usage["cpu_time_s"] and usage["max_rss_mib"] > 100 and "no accounting" in usage["source"]
    nodes = frame_rows(recorded["steps"][0]["value"]["nodes"])
    assert len(nodes) == 1 and nodes[0]["cpus"] == "2" and nodes[0]["gres"] == "(null)"


@needs_slurm
@pytest.mark.notebook
@pytest.mark.slow
def test_every_job_completed_and_the_preempted_one_was_requeued_once(executed):
    _, entry, _, recorded = executed
    assert entry["status"] == "ok"
    jobs = frame_rows(steps_of(recorded, "jobs")[-1]["value"])
    names = [j["name"] for j in jobs]
    assert names == ["wu-env-check", "wu-one-gpu", "wu-sweep", "wu-sweep", "wu-sweep", "wu-gather",
                     "wu-preemptible"], names
    assert all((j["state"], j["exit_code"]) == ("COMPLETED", "0:0") for j in jobs), jobs
    assert [j["restarts"] for j in jobs] == [0, 0, 0, 0, 0, 0, 1]
    assert all(j["elapsed_s"] is not None and j["elapsed_s"] >= 0 for j in jobs)
    # The follow of the first job printed its log lines as they came, then COMPLETED.
    first = steps_of(recorded, "follow")[1]
    assert "step 60/60" in first["printed"] and "COMPLETED" in first["printed"]
    # The gather job waited for the array: it was pending on its dependency right after submission.
    assert "(Dependency)" in steps_of(recorded, "squeue")[-1]["printed"]


@needs_slurm
@pytest.mark.notebook
@pytest.mark.slow
def test_each_task_ran_on_its_own_core_with_its_loader_workers_there(executed):
    _, entry, _, recorded = executed
    assert entry["status"] == "ok"
    rows = frame_rows(steps_of(recorded, "bindings")[0]["value"])
    assert [r["rank"] for r in rows] == ["0", "1"]
    assert {r["cpus"] for r in rows} == {"0", "1"}, "each task bound to a core of its own"
    assert all(r["workers"] == r["cpus"] for r in rows), "workers inherit their rank's cores"
    assert all(r["omp"] == "1" and r["worker_threads"] == "1" and r["gpus"] == "none" for r in rows), rows


@needs_slurm
@pytest.mark.notebook
@pytest.mark.slow
def test_the_sweep_is_one_table_gathered_by_the_dependent_job(executed):
    run_dir, entry, _, recorded = executed
    assert entry["status"] == "ok"
    sweep = frame_rows(steps_of(recorded, "sweep")[0]["value"])
    assert [(r["task"], r["lr"], r["steps"]) for r in sweep] == [(0, 0.02, 30), (1, 0.05, 30), (2, 0.1, 30)]
    assert list(sweep[0])[:2] == ["task", "lr"], "only the swept setting comes before the measurements"
    assert all(r["final_train_loss"] > 0 for r in sweep)
    assert list((run_dir / "slurm-jobs").glob("wu-sweep-*/sweep.csv")), "the gather job wrote the CSV"


@needs_slurm
@pytest.mark.notebook
@pytest.mark.slow
def test_preempted_run_checkpointed_requeued_resumed_and_matches_the_uninterrupted_one(executed):
    _, entry, _, recorded = executed
    assert entry["status"] == "ok"
    resumed = steps_of(recorded, "follow")[-1]["printed"]
    for line in ("USR1 received", "Stop signal received: checkpointing at step", "requeueing job", "attempt 2",
                 "Resumed from", "restarts 1"):
        assert line in resumed, line
    compared = steps_of(recorded, "compare")[0]["value"]
    rows = {r["run"]: r for r in frame_rows(compared["table"])}
    assert rows["preempted"]["resumed_from_step"] in (30, 40, 50)
    assert rows["preempted"]["steps"] == rows["uninterrupted"]["steps"] == 60
    assert compared["identical"] and compared["max_abs_difference"] == 0.0
    assert rows["preempted"]["param_checksum"] == rows["uninterrupted"]["param_checksum"]
    events = steps_of(recorded, "timeline")[0]["value"]["events"]
    assert [e["what"] for e in events] == ["scancel --signal=USR1"]


# The kit's job scripts as the notebook submitted them: what tests/test_slurm.py would otherwise submit again.


def job_output(run_dir: Path, name: str) -> tuple[str, str, Path]:
    """(job id, output text, run folder) of the notebook's one job called ``name`` (its %x-%j.out in slurm-jobs/)."""
    outputs = sorted((run_dir / "slurm-jobs").glob(f"{name}-*.out"))
    assert len(outputs) == 1, outputs
    return outputs[0].stem.rsplit("-", 1)[1], outputs[0].read_text(), outputs[0].with_suffix("")


def job_row(recorded: dict, job_id: str) -> dict:
    return next(j for j in frame_rows(steps_of(recorded, "jobs")[-1]["value"]) if j["job"] == job_id)


@needs_slurm
@pytest.mark.notebook
@pytest.mark.slow
def test_env_check_reports_each_task_and_writes_the_environment(executed):
    import torch

    run_dir, entry, _, recorded = executed
    assert entry["status"] == "ok"
    job_id, text, folder = job_output(run_dir, "wu-env-check")
    assert (job_row(recorded, job_id)["state"], job_row(recorded, job_id)["exit_code"]) == ("COMPLETED", "0:0")
    host = socket.gethostname().split(".")[0]
    assert "nodes: 1 (" in text and "tasks: 2" in text
    tasks = {}
    for rank in (0, 1):
        line = re.search(rf"^{rank}: {host} rank {rank} local {rank} cpus (\S+) numa \S+ omp 1 gpus none gpu_numa - "
                         rf"nics \S+ workers (\S+) worker_threads 1$", text, re.M)
        assert line, text
        tasks[rank] = line.groups()
    # Bound to a core each (srun --cpu-bind=cores), and each task's DataLoader workers run on its core alone.
    assert tasks[0][0] != tasks[1][0] and all(cpus == workers for cpus, workers in tasks.values()), tasks
    assert "UserWarning" not in text, "the crowded workers are shown on purpose, without PyTorch's warning"
    assert "== NUMA layout of" in text
    assert f"torch: {torch.__version__}" in text
    assert ("CPU-only node" in text) == (shutil.which("nvidia-smi") is None)
    env = json.loads((folder / "environment.json").read_text())
    assert env["torch"] == torch.__version__ and env["slurm"]["SLURM_JOB_ID"] == job_id


@needs_slurm
@pytest.mark.notebook
@pytest.mark.slow
def test_one_gpu_script_trains_and_writes_its_result(executed):
    run_dir, entry, _, recorded = executed
    assert entry["status"] == "ok"
    steps = notebook_profiles(REPO / "notebooks" / NOTEBOOK)["cpu"]["steps"]
    job_id, text, folder = job_output(run_dir, "wu-one-gpu")
    assert (job_row(recorded, job_id)["state"], job_row(recorded, job_id)["exit_code"]) == ("COMPLETED", "0:0")
    assert "rank 0 of 1" in text and "GPUs none" in text
    assert re.search(r"GPUs none, cores \d+, 1 CPU thread\(s\)", text), "one core by default, and one thread on it"
    assert re.search(rf"Done: {steps} steps on 1 process\(es\)", text), text
    assert f"results in {folder}" in text
    result = json.loads((folder / "result.json").read_text())
    assert result["metrics"]["steps"] == steps and result["metrics"]["world_size"] == 1
    assert result["metrics"]["interrupted"] is False
    assert result["environment"]["slurm"]["SLURM_JOB_ID"] == job_id


@needs_slurm
@pytest.mark.notebook
@pytest.mark.slow
def test_preempted_job_checkpoints_requeues_and_ends_like_an_uninterrupted_run(executed):
    run_dir, entry, _, recorded = executed
    assert entry["status"] == "ok"
    steps = notebook_profiles(REPO / "notebooks" / NOTEBOOK)["cpu"]["steps"]
    job_id, text, folder = job_output(run_dir, "wu-preemptible")
    job = job_row(recorded, job_id)
    assert (job["state"], job["exit_code"], job["restarts"]) == ("COMPLETED", "0:0", 1), job
    stopped = re.search(r"Stop signal received: checkpointing at step (\d+)", text)
    assert "USR1 received" in text and stopped, text
    assert f"requeueing job {job_id}" in text and "attempt 2" in text
    assert f"at step {stopped.group(1)}." in text.split("attempt 2")[1], "the requeued run did not resume there"

    result = json.loads((folder / "result.json").read_text())
    reference = json.loads((job_output(run_dir, "wu-one-gpu")[2] / "result.json").read_text())
    assert 10 <= result["metrics"]["resumed_from_step"] < steps
    assert result["metrics"]["resumed_from_step"] == int(stopped.group(1))
    assert result["metrics"]["steps"] == steps and not result["metrics"]["interrupted"]
    assert result["metrics"]["param_checksum"] == reference["metrics"]["param_checksum"], "work was lost or changed"


# Exercises 6.1 and 6.2 as the notebook's check cells ran them on the cluster: what tests/test_slurm.py would
# otherwise submit again. The notebook's answers are the solutions, so each check submitted and judged a real job.


def check_said(run_dir: Path, call: str) -> str:
    """The last line the notebook's check cell that calls ``call`` showed (printed, or displayed as the ✓ line)."""
    cells = nbformat.read(run_dir / "notebooks" / NOTEBOOK, as_version=4).cells
    cell = next(c for c in cells if "check" in c.metadata.get("tags", []) and call in c.source)
    printed = "".join(o.get("text", "") or o.get("data", {}).get("text/plain", "") for o in cell.outputs).strip()
    return printed.splitlines()[-1] if printed else ""


@needs_slurm
@pytest.mark.notebook
@pytest.mark.slow
def test_exercise_61_runs_the_attendees_script_and_judges_what_the_job_did(executed):
    run_dir, entry, _, _ = executed
    assert entry["status"] == "ok"
    said = check_said(run_dir, "wu.check_job_script(")
    assert re.fullmatch(r"✓ Exercise 6\.1: correct \(job \d+ \(\S+job.sbatch\) ran on 1 node\(s\) with 2 ranks, "
                        r"wrote its checkpoints, inside its 300 s limit\)\.", said), said
    folder = next((run_dir / "slurm-jobs").glob("ex61-*"))
    log = next(folder.glob("ex61-train-*.out")).read_text()
    assert "rank 0 of 2" in log and "rank 1 of 2" in log and list((folder / "checkpoints").glob("step_*.pt"))


@needs_slurm
@pytest.mark.notebook
@pytest.mark.slow
def test_exercise_62_runs_the_array_gathers_it_and_finds_each_rate(executed):
    run_dir, entry, _, _ = executed
    assert entry["status"] == "ok"
    said = check_said(run_dir, "wu.check_array_sweep(")
    assert re.fullmatch(r"✓ Exercise 6\.2: correct \(array \d+: 3 tasks, one per learning rate, gathered by job \d+\)\.",
                        said), said
    gathered = next((run_dir / "slurm-jobs").glob("ex62-*/wu-sweep-*/sweep.csv")).read_text()
    assert all(str(lr) in gathered for lr in (0.01, 0.03, 0.1))


@needs_slurm
@pytest.mark.notebook
@pytest.mark.slow
def test_notebook_06_adds_its_section_and_timeline_to_the_report(executed):
    run_dir, entry, _, _ = executed
    assert entry["status"] == "ok"
    section = json.loads((run_dir / "results" / "section-slurm.json").read_text())
    assert section["title"] == "Slurm and deployment (notebook 06)"
    assert section["text"].startswith("Live on ") and "bit for bit" in section["text"]
    assert (run_dir / "figures" / "slurm_timeline.png").stat().st_size > 5_000
    assert "## Slurm and deployment (notebook 06)" in (run_dir / "report.md").read_text()


# ---------------------------------------------------------------------- without a cluster


def test_config_flags_read_back_into_the_same_config():
    import workshop_utils as wu
    from workshop_utils.train import build_parser, config_from_args

    config = wu.TrainConfig(model="resnet18", batch_size=16, epochs=100, max_steps=60, lr=0.1, device="cpu",
                            synthetic=True, keep_checkpoints=None, pin_memory=True, compile=False,
                            checkpoint_every=10, log_every=10, train_size=512, name="ignored", resume=True)
    flags = wu.config_flags(config)
    assert "--name" not in flags and "--resume" not in flags, "the job scripts set these"
    assert flags[flags.index("--synthetic") + 1] == "yes" and flags[flags.index("--keep-checkpoints") + 1] == "all"
    parsed = config_from_args(build_parser().parse_args(flags), world_size=1)
    assert parsed == config.replace(name="train", resume=False)
    # Only the fields asked for, default or not: what a sweep file's lines hold.
    assert wu.config_flags(config, only=("lr", "seed")) == ["--lr", "0.1", "--seed", "0"]


def test_a_sweep_sweeps_the_fields_that_differ_between_its_configs():
    import workshop_utils as wu
    from workshop_utils.lessons.slurm_jobs import varying_fields

    base = wu.TrainConfig()
    assert varying_fields([base.replace(lr=x) for x in (0.02, 0.05)]) == ("lr",)
    assert varying_fields([base, base]) == ()


def test_scontrol_lines_durations_and_core_lists_are_read_as_slurm_writes_them():
    from workshop_utils.lessons.slurm_jobs import cpu_list, parse_cpu_list, parse_scontrol, seconds_of

    fields = parse_scontrol("NodeName=vm Arch=x86_64 CPUTot=2 OS=Linux 6.1.0 #1 SMP PREEMPT_DYNAMIC Gres=gpu:h100:4 "
                            "CfgTRES=cpu=2,mem=1000M AllocNode:Sid=host:123 CPUs/Task=1")
    assert fields["OS"] == "Linux 6.1.0 #1 SMP PREEMPT_DYNAMIC" and fields["Gres"] == "gpu:h100:4"
    assert fields["CfgTRES"] == "cpu=2,mem=1000M" and fields["AllocNode:Sid"] == "host:123"
    assert fields["CPUs/Task"] == "1"
    assert [seconds_of(t) for t in ("00:00:39", "1-02:03:04", "05:06", "UNLIMITED", None)] == \
        [39, 93784, 306, None, None]
    assert cpu_list({0, 1, 2, 5, 7, 8}) == "0-2,5,7-8" and cpu_list(set()) == "none"
    assert parse_cpu_list("0-2,5,7-8") == {0, 1, 2, 5, 7, 8}


def test_binding_lines_of_the_env_check_become_one_row_per_rank():
    from workshop_utils.lessons.slurm_jobs import binding_line, binding_table

    line = binding_line(workers=0)
    assert line.split()[1:3] == ["rank", "0"] and " cpus " in line and " workers - " in line
    table = binding_table([f"1: node7 {line.split(' ', 1)[1].replace('rank 0', 'rank 1')}", "noise", f"0: node7 "
                           f"{line.split(' ', 1)[1]}"])
    assert list(table["rank"]) == ["0", "1"] and set(table["host"]) == {"node7"}


def test_a_dataloader_worker_runs_on_the_cores_of_the_process_that_started_it():
    from workshop_utils.lessons.slurm_jobs import cpu_list, loader_worker_cores

    mine = os.sched_getaffinity(0)
    only = {min(mine)}
    os.sched_setaffinity(0, only)
    try:
        cores, threads = loader_worker_cores(2)
    finally:
        os.sched_setaffinity(0, mine)
    assert cores == cpu_list(only) and threads == 1


def test_a_sweep_folder_is_gathered_into_one_table_of_what_differs(tmp_path):
    import workshop_utils as wu

    for task, lr in enumerate((0.02, 0.1)):
        folder = tmp_path / f"task-{task}"
        folder.mkdir()
        record = {"config": {"name": f"wu-sweep-{task}", "lr": lr, "seed": 0, "checkpoint_dir": str(folder)},
                  "metrics": {"steps": 30, "final_train_loss": 2.0 + task}}
        (folder / "result.json").write_text(json.dumps(record))
    table = wu.gather_array(tmp_path, tmp_path / "sweep.csv")
    assert list(table.columns[:2]) == ["task", "lr"] and "checkpoint_dir" not in table.columns
    assert table["lr"].tolist() == [0.02, 0.1] and (tmp_path / "sweep.csv").exists()
    with pytest.raises(wu.WorkshopError, match="No task of the sweep wrote a result"):
        wu.gather_array(tmp_path / "empty")


def test_without_slurm_the_lesson_says_so_in_one_line_and_replays_the_reference(tmp_path, monkeypatch, capsys):
    import workshop_utils as wu

    monkeypatch.setenv("PATH", str(tmp_path))  # no sinfo, sbatch, ... on it
    monkeypatch.delenv("WORKSHOP_SLURM", raising=False)  # the suite's own "off": this test looks for Slurm
    started = time.monotonic()
    site = wu.find_slurm()
    assert not site.available and site.line.startswith("No Slurm here (") and "\n" not in site.line
    assert time.monotonic() - started < 1
    if not (REFERENCE / "steps.json").exists():
        pytest.skip("no recorded run in results/reference/slurm yet")
    lesson = wu.SlurmLesson(tmp_path / "run")
    first = capsys.readouterr().out
    assert first.count("\n") == 1 and "showing the run recorded on" in first
    cluster = lesson.cluster()
    assert "[recorded] $ sinfo" in capsys.readouterr().out
    assert list(cluster["nodes"].columns[:2]) == ["node", "state"]
    with pytest.raises(wu.WorkshopError, match="recorded by another version of this notebook"):
        lesson.squeue(["1"])  # the recording's second step is a submission


def test_workshop_slurm_off_keeps_the_notebook_from_submitting_anything(monkeypatch):
    import workshop_utils as wu

    monkeypatch.setenv("WORKSHOP_SLURM", "off")
    site = wu.find_slurm()
    assert not site.available and site.line == "Slurm not used here (WORKSHOP_SLURM=off)"


def test_without_slurm_and_without_a_reference_the_lesson_stops_in_one_line(tmp_path, monkeypatch):
    import workshop_utils as wu

    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.delenv("WORKSHOP_SLURM", raising=False)
    with pytest.raises(wu.WorkshopError, match=r"^No Slurm here .*no recorded run to show instead.*Fix: "):
        wu.SlurmLesson(tmp_path / "run", reference=tmp_path / "nothing")


def test_numa_binding_is_only_asked_for_where_it_can_work():
    """The GPU job scripts call this before torchrun --numa-binding: without GPUs (or numactl) it says why not."""
    import torch

    from workshop_utils.lessons.slurm_jobs import numa_binding_problem

    why = numa_binding_problem(1)
    if not torch.cuda.is_available() or shutil.which("numactl") is None:
        assert why and "\n" not in why, why
    assert numa_binding_problem(64) != "" or torch.cuda.device_count() >= 64


# ---------------------------------------------------------------------- Exercise 6.3: what a job used

USAGE = {"job": "7", "elapsed_s": 90, "time_limit_s": 600, "cpus": 4, "gpus": 2, "cpu_time_s": 180.0,
         "max_rss_mib": 1000.0, "source": "sacct"}
RIGHT = dict(cpu_efficiency=0.5, time_share=0.15, gpu_hours=0.05, next_time_limit_s=180, next_memory_mib=1300)


def test_exercise_63_passes_the_arithmetic_and_says_what_to_ask_for_next(capsys):
    import workshop_utils as wu

    assert wu.check_job_usage(**RIGHT, usage=USAGE)
    assert capsys.readouterr().out.strip() == ("✓ Exercise 6.3: correct (50% of 4 core(s) busy, 15% of the time "
                                               "limit used; next time ask --time=3 --mem=1300M).")


@pytest.mark.parametrize("wrong, said", [
    (dict(cpu_efficiency=2.0), "`cpu_efficiency` = 2: a share of the allocated core-seconds lies between 0 and 1"),
    (dict(cpu_efficiency=50.0), "`cpu_efficiency` = 50: a share of the allocated core-seconds lies between 0 and 1"),
    (dict(time_share=600 / 90), "`time_share` = 6.667: a finished job used between none and all of its time limit"),
    (dict(gpu_hours=180.0), "`gpu_hours` = 180 is not right"),
    (dict(gpu_hours=0.025), "`gpu_hours` = 0.025 is not right"),
    (dict(next_time_limit_s=135), "`next_time_limit_s` = 135: Slurm's time limits are whole minutes"),
    (dict(next_time_limit_s=900), "`next_time_limit_s` = 900 is not right"),
    (dict(next_memory_mib=1250), "`next_memory_mib` = 1,250: the request is in whole 100 MiB"),
    (dict(next_memory_mib=1000), "`next_memory_mib` = 1,000 is not right"),
])
def test_exercise_63_names_each_mistake_in_one_line(wrong, said):
    import workshop_utils as wu

    with pytest.raises(wu.WorkshopError) as err:
        wu.check_job_usage(**{**RIGHT, **wrong}, usage=USAGE)
    assert said in str(err.value) and "\n" not in str(err.value)


def test_a_jobs_use_comes_from_sacct_where_the_cluster_keeps_accounting(monkeypatch, tmp_path):
    """sacct -P as a cluster with accounting prints it: the job, its batch step and a job step."""
    from workshop_utils.lessons import slurm_jobs

    sacct = ("7|00:01:30|02:59.512|4||cpu=4,mem=16G,node=1,billing=4,gres/gpu:h100=2\n"
             "7.batch|00:01:30|00:00.210|4|6264K|cpu=4,mem=16G,node=1,gres/gpu:h100=2\n"
             "7.0|00:01:28|02:59.302|4|1024000K|cpu=4,mem=16G,node=1,gres/gpu:h100=2\n")
    monkeypatch.setattr(slurm_jobs.shutil, "which", lambda name: f"/usr/bin/{name}")
    monkeypatch.setattr(slurm_jobs, "slurm", lambda *a, **k: subprocess.CompletedProcess(a, 0, sacct, ""))
    monkeypatch.setattr(slurm_jobs, "job_records", lambda job: [{"RunTime": "00:01:30", "TimeLimit": "00:10:00",
                                                                 "NumCPUs": "4", "AllocTRES": "gres/gpu=2"}])
    usage = slurm_jobs.job_usage("7", tmp_path)  # no run folder needed: accounting answers
    assert usage == {"job": "7", "elapsed_s": 90.0, "time_limit_s": 600, "cpus": 4, "gpus": 2,
                     "cpu_time_s": pytest.approx(179.512), "max_rss_mib": 1000.0, "source": "sacct"}


def test_without_accounting_a_jobs_use_comes_from_its_own_training_record(monkeypatch, tmp_path):
    from workshop_utils.lessons import slurm_jobs

    monkeypatch.setattr(slurm_jobs.shutil, "which", lambda name: None)  # no sacct
    monkeypatch.setattr(slurm_jobs, "job_records", lambda job: [{"RunTime": "00:00:15", "TimeLimit": "00:10:00",
                                                                 "NumCPUs": "1", "TRES": "cpu=1,node=1"}])
    (tmp_path / "wu-one-gpu-2").mkdir()
    (tmp_path / "wu-one-gpu-2" / "result.json").write_text(json.dumps({"metrics": {"cpu_time_s": 4.5,
                                                                                   "max_rss_mib": 830.0}}))
    usage = slurm_jobs.job_usage("2", tmp_path)
    assert (usage["elapsed_s"], usage["cpus"], usage["gpus"], usage["cpu_time_s"], usage["max_rss_mib"]) == \
        (15, 1, 0, 4.5, 830.0) and "no accounting" in usage["source"]
    monkeypatch.setattr(slurm_jobs, "job_records", lambda job: [])  # the controller forgot the job
    with pytest.raises(slurm_jobs.WorkshopError, match="cannot be read back"):
        slurm_jobs.job_usage("2", tmp_path)


def test_every_training_record_says_its_cpu_time_and_peak_memory(tiny_data):
    import workshop_utils as wu

    metrics = wu.train(wu.TrainConfig(batch_size=32, max_steps=2, progress=False, device="cpu"), tiny_data).metrics
    assert 0 < metrics["cpu_time_s"] and metrics["max_rss_mib"] > 50  # a Python with PyTorch loaded
