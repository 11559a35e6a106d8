"""Slurm from a notebook: look at the cluster, submit the kit's job scripts, watch them, gather what they wrote.

Notebook 06 drives a real Slurm through the same clients a user types at a login node (sinfo,
scontrol, sbatch, squeue, sacct, scancel). The jobs are the scripts in ``slurm/``, used as
templates; the training flags after the script name are generated from a ``TrainConfig``
(``config_flags``, spelt by ``parallel.launch.train_flags``), so no flag is typed twice.

Where no Slurm answers, the notebook still runs: ``slurm_lesson.SlurmLesson`` records every step it runs
live and replays a recorded run where it cannot.

``binding_line`` is what each task of ``slurm/env_check.sbatch`` prints: the cores it may run on,
their NUMA node, its GPUs and their NUMA node, the network cards near it, and the cores its
DataLoader workers end up on.

Heavy imports (torch, through the spine) happen inside the functions that need them, so a job that
only gathers a sweep's results starts in a second.

This module runs the clients (``slurm``): the cluster's tables, submitting, watching and waiting for
jobs, and what a finished job used. Below it: ``slurm_text`` (what the clients print, read as values),
``slurm_scripts`` (the job scripts and the flags after them), ``slurm_results`` (what the jobs wrote)
and ``slurm_binding`` (where a task may run, ``binding_line``); every name is importable from here.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

from ..system.errors import WorkshopError
from .slurm_binding import (BINDING_KEYS, binding_line, binding_table, cpu_list, gpu_numa, loader_worker_cores,
                            nic_numa, numa_binding_problem, numa_nodes_of, parse_cpu_list, rank_binding)
from .slurm_results import SWEEP_METRICS, compare_final_parameters, gather_array, preemption_verdict, run_folder
from .slurm_scripts import (SCRIPT_FIELDS, config_flags, env_check_request, script_lines, slurm_folder, template,
                            varying_fields)
from .slurm_text import duration_s, frame_of, gpus_in_gres, memory_mib, parse_scontrol, seconds_of, tres_gpus

# What was defined here before the job scripts, results, binding and text readers moved below it; importers
# (notebook 06, the job scripts, the exercises) keep this one path.
__all__ = [
    "BINDING_KEYS", "CLIENTS", "FINISHED", "JOB_COLUMNS", "POLL_S", "SCRIPT_FIELDS", "SWEEP_METRICS", "SlurmSite",
    "WorkshopError", "binding_line", "binding_table", "cancel", "compare_final_parameters", "config_flags",
    "cpu_list", "duration_s", "env_check_request", "find_slurm", "first_line", "frame_of", "gather_array",
    "give_up", "gpu_numa", "gpus_in_gres", "job_env", "job_finished", "job_label", "job_records", "job_table",
    "job_usage", "last_line", "loader_worker_cores", "memory_mib", "nic_numa", "node_table", "numa_binding_problem",
    "numa_nodes_of", "parse_cpu_list", "parse_scontrol", "partition_table", "preemption_verdict", "rank_binding",
    "run_folder", "script_lines", "seconds_of", "slurm", "slurm_folder", "squeue_text", "submit", "tres_gpus",
    "template", "varying_fields", "wait_for",
]

CLIENTS = ("sinfo", "scontrol", "sbatch", "squeue", "scancel")
# States after which a job runs no more (a requeued job passes through PENDING, not through these).
FINISHED = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "PREEMPTED",
            "BOOT_FAIL", "DEADLINE"}
POLL_S = 0.5  # how often a wait asks slurmctld: often enough to watch a job, rarely enough not to load it

# ---------------------------------------------------------------------------------------------- clients


def job_env(runs: str | os.PathLike | None = None) -> dict:
    """The environment sbatch passes to the jobs: this one, with this Python first on PATH.

    SLURM_* variables (but SLURM_CONF, which names the cluster) are dropped: a notebook that itself
    runs inside a job must not hand that job's CPU count or ids to the jobs it submits. SBATCH_*
    variables stay: ``SBATCH_ACCOUNT`` and ``SBATCH_PARTITION`` are how a site's account and
    partition reach every sbatch below.
    """
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_") or k == "SLURM_CONF"}
    here = str(Path(sys.executable).parent)
    env["PATH"] = here + os.pathsep + env.get("PATH", "/usr/bin:/bin")
    env["PYTHONUNBUFFERED"] = "1"  # a job's log grows line by line, not in 4 KiB blocks
    if runs is not None:
        env["WORKSHOP_RUNS"] = str(runs)
    return env


def slurm(*command: str, timeout_s: float = 30, check: bool = True, cwd=None, env=None) -> subprocess.CompletedProcess:
    """Run one Slurm client; a missing client, a controller that does not answer or a refusal is one line."""
    try:
        proc = subprocess.run(command, capture_output=True, text=True, timeout=timeout_s, cwd=cwd,
                              env=env or job_env(), stdin=subprocess.DEVNULL)
    except FileNotFoundError:
        raise WorkshopError(f"`{command[0]}` is not installed on this machine.",
                            "run this on a login node of a Slurm cluster.") from None
    except subprocess.TimeoutExpired:
        raise WorkshopError(f"`{shlex.join(command[:2])}` did not answer within {timeout_s:g} s.",
                            "slurmctld is busy or unreachable: `scontrol ping` says which; try again later.") from None
    if check and proc.returncode != 0:
        said = first_line(proc.stderr) or first_line(proc.stdout) or f"exit status {proc.returncode}"
        raise WorkshopError(f"`{shlex.join(command[:2])}` failed: {said}",
                            "read Slurm's message: an account or partition is often missing "
                            "(export SBATCH_ACCOUNT=... SBATCH_PARTITION=...).")
    return proc


def last_line(text: str | None) -> str:
    lines = [line.strip() for line in (text or "").splitlines() if line.strip()]
    return lines[-1][:300] if lines else ""


def first_line(text: str | None) -> str:
    lines = [line.strip() for line in (text or "").splitlines() if line.strip()]
    return lines[0][:300] if lines else ""


@dataclasses.dataclass(frozen=True)
class SlurmSite:
    """Whether a Slurm controller answers here, and a one-line account of it."""

    available: bool
    line: str
    version: str = ""
    cluster: str = ""


def find_slurm(timeout_s: float = 10) -> SlurmSite:
    """Is there a Slurm we can submit to? Quick (``scontrol ping``, at most ``timeout_s``), never raises.

    ``WORKSHOP_SLURM=off`` says no without asking: a test suite or a pre-flight on a login node then
    submits nothing.
    """
    if os.environ.get("WORKSHOP_SLURM", "").strip().lower() == "off":
        return SlurmSite(False, "Slurm not used here (WORKSHOP_SLURM=off)")
    missing = [c for c in CLIENTS if shutil.which(c) is None]
    if missing:
        return SlurmSite(False, f"No Slurm here ({', '.join(missing)} not found on PATH)")
    try:
        ping = subprocess.run(["scontrol", "ping"], capture_output=True, text=True, timeout=timeout_s,
                              env=job_env(), stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        return SlurmSite(False, f"No Slurm reachable here (`scontrol ping` did not answer within {timeout_s:g} s)")
    said = last_line(ping.stdout) or last_line(ping.stderr)
    if ping.returncode != 0 or " is UP" not in ping.stdout:
        return SlurmSite(False, f"No Slurm reachable here (`scontrol ping` says: {said or 'nothing'})")
    try:
        version = first_line(subprocess.run(["sinfo", "--version"], capture_output=True, text=True,
                                            timeout=timeout_s, env=job_env()).stdout)
        config = subprocess.run(["scontrol", "show", "config"], capture_output=True, text=True, timeout=timeout_s,
                                env=job_env()).stdout
    except subprocess.TimeoutExpired:  # the controller answered the ping: these are niceties, not conditions
        version, config = "", ""
    cluster = next((line.split("=", 1)[1].strip() for line in config.splitlines()
                    if line.split("=", 1)[0].strip() == "ClusterName"), "")
    return SlurmSite(True, f"{version or 'Slurm'} answers here (cluster {cluster or '?'}, {said}): "
                           "every job below really runs.", version, cluster)


# ---------------------------------------------------------------------------------------------- the cluster


def partition_table():
    """Every partition: state, nodes, CPUs, time limits, whether jobs share nodes or preempt each other."""
    rows = []
    for line in slurm("scontrol", "-o", "show", "partition").stdout.splitlines():
        p = parse_scontrol(line)
        if not p:
            continue
        rows.append({"partition": p.get("PartitionName", "") + ("*" if p.get("Default") == "YES" else ""),
                     "state": p.get("State"), "nodes": p.get("Nodes"), "total_nodes": p.get("TotalNodes"),
                     "total_cpus": p.get("TotalCPUs"), "max_time": p.get("MaxTime"),
                     "default_time": p.get("DefaultTime"), "oversubscribe": p.get("OverSubscribe"),
                     "preempt_mode": p.get("PreemptMode"), "tres": p.get("TRES")})
    return frame_of(rows, ["partition", "state", "nodes", "total_nodes", "total_cpus", "max_time", "default_time",
                         "oversubscribe", "preempt_mode", "tres"])


def node_table():
    """Every node: state, CPUs (total and allocated), its sockets x cores x threads, memory and GRES (GPUs)."""
    rows = []
    for line in slurm("scontrol", "-o", "show", "node").stdout.splitlines():
        n = parse_scontrol(line)
        if not n:
            continue
        rows.append({"node": n.get("NodeName"), "state": n.get("State"), "partitions": n.get("Partitions"),
                     "cpus": n.get("CPUTot"), "cpus_allocated": n.get("CPUAlloc"), "sockets": n.get("Sockets"),
                     "cores_per_socket": n.get("CoresPerSocket"), "threads_per_core": n.get("ThreadsPerCore"),
                     "memory_mib": n.get("RealMemory"), "gres": n.get("Gres"), "features": n.get("AvailableFeatures")})
    return frame_of(rows, ["node", "state", "partitions", "cpus", "cpus_allocated", "sockets", "cores_per_socket",
                         "threads_per_core", "memory_mib", "gres", "features"])


# ---------------------------------------------------------------------------------------------- jobs


def submit(script: str | os.PathLike | None, args=(), options=(), *, cwd=None, env=None) -> str:
    """``sbatch --parsable [options] script [args]``; returns the job id (the array's id for an array).

    ``script`` None: the options hold the job (``--wrap=COMMAND``)."""
    command = ["sbatch", "--parsable", *map(str, options), *([str(script)] if script is not None else []),
               *map(str, args)]
    out = slurm(*command, cwd=cwd, env=env).stdout.strip()
    job_id = out.split(";")[0]  # "id" or "id;cluster"
    if not job_id.isdigit():
        raise WorkshopError(f"sbatch answered {out!r}, not a job id.", "run the sbatch command above by hand.")
    return job_id


def job_records(job_id: str) -> list[dict]:
    """``scontrol -o show job ID``: one dict per job (every task of an array); [] once Slurm forgot it."""
    proc = slurm("scontrol", "-o", "show", "job", str(job_id), check=False)
    return [parse_scontrol(line) for line in proc.stdout.splitlines() if line.strip()]


def job_label(record: dict) -> str:
    """12 for a job, 12_3 for task 3 of array 12 (as squeue and sacct name them)."""
    task = record.get("ArrayTaskId")
    if task and task != "N/A" and record.get("ArrayJobId"):
        return f"{record['ArrayJobId']}_{task}"
    return record.get("JobId", "?")


def _scontrol_rows(job_ids) -> list[dict]:
    rows = []
    for job_id in job_ids:
        for r in job_records(job_id):
            rows.append({"job": job_label(r), "name": r.get("JobName"), "state": r.get("JobState"),
                         "exit_code": r.get("ExitCode"), "elapsed": r.get("RunTime"),
                         "elapsed_s": seconds_of(r.get("RunTime")), "restarts": int(r.get("Restarts", 0) or 0),
                         "start": r.get("StartTime"), "end": r.get("EndTime"), "node": r.get("NodeList"),
                         "reason": r.get("Reason")})
    return sorted(rows, key=_job_order)


def _job_order(row: dict):
    """12 before 12_0 before 12_1 before 13: the order jobs were submitted, tasks in their order."""
    job, _, task = str(row["job"]).partition("_")
    return (int(job) if job.isdigit() else 0, int(task) if task.isdigit() else -1)


def _sacct_rows(job_ids) -> list[dict] | None:
    """sacct's view of the jobs, or None where this cluster keeps no accounting (sacct then cannot answer)."""
    if shutil.which("sacct") is None:
        return None
    proc = slurm("sacct", "-n", "-P", "-X", "-j", ",".join(map(str, job_ids)),
                 "-o", "JobID,JobName,State,ExitCode,Elapsed,Start,End,NodeList", check=False)
    if proc.returncode != 0 or "disabled" in (proc.stdout + proc.stderr).lower():
        return None
    rows = []
    for line in proc.stdout.splitlines():
        parts = line.split("|")
        if len(parts) != 8:
            continue
        job, name, state, exit_code, elapsed, start, end, node = parts
        rows.append({"job": job, "name": name, "state": state.split()[0], "exit_code": exit_code,
                     "elapsed": elapsed, "elapsed_s": seconds_of(elapsed), "restarts": None,
                     "start": start, "end": end, "node": node, "reason": ""})
    return sorted(rows, key=_job_order)


JOB_COLUMNS = ["job", "name", "state", "exit_code", "elapsed", "elapsed_s", "restarts", "start", "end", "node",
               "reason"]


def job_table(job_ids):
    """State, exit code and elapsed time of each job (each array task): from sacct where the cluster keeps
    accounting, else from slurmctld's memory (scontrol), which forgets a job MinJobAge seconds after it ends.
    ``frame.attrs["source"]`` says which answered."""
    ids = [str(j) for j in job_ids]
    accounted = _sacct_rows(ids)

    def answered(rows):
        return {str(r["job"]).split("_")[0] for r in rows}

    if accounted is not None and answered(accounted) >= set(ids):
        rows, source = accounted, "sacct"
    else:
        # A job only seconds old may not have reached the accounting database yet: the controller knows it.
        rows, source = _scontrol_rows(ids), "scontrol"
        rows += [r for r in accounted or [] if str(r["job"]).split("_")[0] not in answered(rows)]
        rows.sort(key=_job_order)
    frame = frame_of(rows, JOB_COLUMNS)
    frame.attrs["source"] = source
    return frame


def squeue_text(job_ids) -> str:
    """squeue as a user sees it, every array task on its own line (-r)."""
    return slurm("squeue", "-r", "-j", ",".join(map(str, job_ids)), check=False).stdout.rstrip()


def cancel(job_ids) -> None:
    ids = [str(j) for j in job_ids]
    if ids:
        slurm("scancel", *ids, check=False)


def job_finished(records: list[dict], restarts: int = 0) -> bool:
    """Every job or task ended; with ``restarts``, a COMPLETED job counts only after that many requeues."""
    if not records:
        return False
    for r in records:
        state = r.get("JobState", "")
        if state not in FINISHED:
            return False
        if state == "COMPLETED" and int(r.get("Restarts", 0) or 0) < restarts:
            return False
    return True


def wait_for(job_ids, timeout_s: float = 300, restarts: int = 0):
    """Wait until every job has ended (a job Slurm forgot counts as ended); return ``job_table``.

    A job still queued or running after ``timeout_s`` is cancelled, and the wait ends in one line.
    """
    ids = [str(j) for j in job_ids]
    deadline = time.monotonic() + timeout_s
    while True:
        records = {j: job_records(j) for j in ids}
        pending = [j for j in ids if records[j] and not job_finished(records[j], restarts)]
        if not pending:
            return job_table(ids)
        stuck = [j for j in pending if any(r.get("Reason") == "DependencyNeverSatisfied" for r in records[j])]
        if stuck:
            cancel(stuck)
            raise WorkshopError(f"Job(s) {', '.join(stuck)} can never start: a job they wait for (afterok) did not "
                                "succeed, so they were cancelled.",
                                "read the failed job's output file (its state is FAILED in squeue -t all), fix it, "
                                "and submit again.")
        if time.monotonic() > deadline:
            give_up(pending, timeout_s)
        time.sleep(POLL_S)


def give_up(job_ids: list[str], timeout_s: float):
    states = ", ".join(f"{job_label(r)} {r.get('JobState')} ({r.get('Reason')})"
                       for j in job_ids for r in job_records(j))
    cancel(job_ids)
    raise WorkshopError(f"Job(s) not finished after {timeout_s:g} s, so they were cancelled: {states}.",
                        "the queue is busy (reason Priority/Resources): run the notebook again later, or point "
                        "SBATCH_PARTITION at a partition with idle nodes (sinfo shows them).")


# ---------------------------------------------------------------------------------------------- what a job used


def _sacct_usage(job_id: str) -> dict | None:
    """What the accounting database says the job used, or None where the cluster keeps no accounting."""
    if shutil.which("sacct") is None:
        return None
    proc = slurm("sacct", "-n", "-P", "-j", str(job_id), "-o", "JobID,Elapsed,TotalCPU,AllocCPUS,MaxRSS,AllocTRES",
                 check=False)
    rows = [line.split("|") for line in proc.stdout.splitlines() if line.count("|") == 5]
    job = next((row for row in rows if row[0] == str(job_id)), None)
    if proc.returncode != 0 or job is None:
        return None
    peaks = [m for m in (memory_mib(row[4]) for row in rows) if m is not None]  # MaxRSS is per job step
    return {"elapsed_s": duration_s(job[1]), "cpu_time_s": duration_s(job[2]), "cpus": int(job[3] or 0),
            "max_rss_mib": max(peaks) if peaks else None, "gpus": tres_gpus(job[5])}


def job_usage(job_id: str, runs: str | os.PathLike) -> dict:
    """What a finished job asked for and what it used: sacct where the cluster keeps accounting; else the
    controller's record (elapsed, limit, CPUs, GPUs) and the training record the job wrote (its run's CPU
    time and peak resident memory, what sacct calls TotalCPU and MaxRSS)."""
    record = next(iter(job_records(job_id)), {})
    usage = {"job": str(job_id), "elapsed_s": seconds_of(record.get("RunTime")),
             "time_limit_s": seconds_of(record.get("TimeLimit")), "cpus": int(record.get("NumCPUs") or 0),
             "gpus": tres_gpus(record.get("AllocTRES") or record.get("TRES"))}
    accounted = _sacct_usage(job_id)
    if accounted:
        usage.update({key: value for key, value in accounted.items() if value is not None}, source="sacct")
    else:
        metrics = json.loads((run_folder(runs, job_id) / "result.json").read_text())["metrics"]
        usage.update(cpu_time_s=metrics.get("cpu_time_s"), max_rss_mib=metrics.get("max_rss_mib"),
                     source="scontrol and the job's own training record (this cluster keeps no accounting)")
    if not usage["elapsed_s"] or not usage["cpus"] or usage.get("cpu_time_s") is None:
        raise WorkshopError(f"Job {job_id}'s use cannot be read back ({usage}).",
                            "ask soon after it ended: without accounting the controller forgets a job in minutes.")
    return usage
