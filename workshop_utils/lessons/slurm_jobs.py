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
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shlex
import shutil
import socket
import subprocess
import sys
import time
import warnings
from pathlib import Path

from ..system.errors import WorkshopError
from ..system.results import repo_root

CLIENTS = ("sinfo", "scontrol", "sbatch", "squeue", "scancel")
# States after which a job runs no more (a requeued job passes through PENDING, not through these).
FINISHED = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "PREEMPTED",
            "BOOT_FAIL", "DEADLINE"}
# Fields of TrainConfig that the job scripts set themselves (from the job's name and run folder).
SCRIPT_FIELDS = ("name", "checkpoint_dir", "resume", "progress")
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


_KEY = re.compile(r"^[A-Za-z][\w/:.]*$")


def parse_scontrol(line: str) -> dict[str, str]:
    """One line of ``scontrol -o show ...`` as a dict; values with spaces (``OS=Linux 6.1 #1 SMP``) stay whole."""
    fields: dict[str, str] = {}
    key = None
    for token in line.split():
        name, eq, value = token.partition("=")
        if eq and _KEY.match(name):
            key, fields[name] = name, value
        elif key is not None:
            fields[key] += " " + token
    return fields


def seconds_of(duration: str | None) -> int | None:
    """Slurm's ``[D-]HH:MM:SS`` (or ``MM:SS``) as seconds; None for what is not a duration."""
    if not duration or not re.fullmatch(r"(\d+-)?(\d+:){1,2}\d+", duration):
        return None
    days, _, clock = duration.rpartition("-")
    parts = [int(p) for p in clock.split(":")]
    while len(parts) < 3:
        parts.insert(0, 0)
    return int(days or 0) * 86400 + parts[0] * 3600 + parts[1] * 60 + parts[2]


# ---------------------------------------------------------------------------------------------- the cluster


def frame_of(rows: list[dict], columns: list[str]):
    import pandas as pd

    return pd.DataFrame(rows, columns=columns)


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


def gpus_in_gres(gres) -> int:
    """GPUs a node's GRES string offers: "gpu:4", "gpu:h100:4(S:0-1)", "gpu:a100:2,shard:8"; 0 for "(null)"."""
    return sum(int(count) for count in re.findall(r"(?:^|,)gpu(?::[^:,(]+)?:(\d+)", str(gres or "")))


def env_check_request(nodes, tasks: int, gpus_per_task: int) -> tuple[list[str], str]:
    """sbatch options for env_check's tasks, sized to the nodes ``node_table`` lists, and one line saying why.

    Tasks with GPUs go to as few nodes as hold them; a cluster with fewer GPUs than asked for gets
    fewer tasks, not a request sbatch refuses ("Requested node configuration is not available").
    """
    if not gpus_per_task:
        return [f"--ntasks={tasks}"], f"env_check: {tasks} task(s), no GPU."
    per_node = sorted((gpus_in_gres(g) // gpus_per_task for g in nodes["gres"]), reverse=True) if len(nodes) else []
    per_node = [n for n in per_node if n > 0]
    if not per_node:
        raise WorkshopError(f"No node lists a GPU in its GRES, so {tasks} task(s) with {gpus_per_task} GPU(s) each "
                            "cannot be placed.", "run the cpu profile (profile='cpu') or ask your admins which "
                            "partition has GPUs (sinfo -o '%P %G').")
    fit, used = 0, 0
    for capacity in per_node:  # the nodes with most GPUs first: as few nodes as possible
        if fit >= tasks:
            break
        fit, used = fit + min(capacity, tasks - fit), used + 1
    options = [f"--nodes={used}", f"--ntasks={fit}", f"--gpus-per-task={gpus_per_task}"]
    said = (f"env_check: {fit} task(s) with {gpus_per_task} GPU(s) each on {used} node(s)"
            + ("." if fit == tasks else f" ({tasks} asked for; this cluster's nodes hold {sum(per_node)} such "
                                        f"task(s) at most)."))
    return options, said


# ---------------------------------------------------------------------------------------------- job scripts


def slurm_folder() -> Path:
    root = repo_root()
    folder = (root / "slurm") if root is not None else Path.cwd() / "slurm"
    if not folder.is_dir():
        raise WorkshopError("The kit's job scripts (slurm/) are not here.",
                            "run this notebook from a checkout of the workshop.")
    return folder


def template(name: str) -> Path:
    """One of the kit's job scripts, by file name."""
    path = slurm_folder() / name
    if not path.is_file():
        known = ", ".join(p.name for p in sorted(slurm_folder().glob("*.sbatch")))
        raise WorkshopError(f"No job script {name!r} in {slurm_folder()}.", f"use one of: {known}.")
    return path


def script_lines(name: str, *patterns: str) -> str:
    """The lines of a job script that match any of ``patterns`` (all of it when none), numbered."""
    lines = template(name).read_text().splitlines()
    keep = [(i, line) for i, line in enumerate(lines, 1)
            if not patterns or any(re.search(p, line) for p in patterns)]
    return "\n".join(f"{i:3d}  {line}" for i, line in keep)


def config_flags(config, base=None, skip: tuple[str, ...] = SCRIPT_FIELDS, only: tuple[str, ...] | None = None
                 ) -> list[str]:
    """The flags of ``python -m workshop_utils.train`` that turn ``base`` (default: TrainConfig()) into ``config``.

    Generated from the config's fields, so a job script receives exactly what the notebook built. The
    fields in ``skip`` are the ones the job scripts set themselves, and are left out; ``only`` names the
    fields to give, whether or not they differ from ``base``. Each value is spelt by ``train_flags``
    (workshop_utils.parallel.launch), the one spelling that ``launch_training`` uses too.
    """
    from ..parallel.launch import train_flags
    from ..spine.config import TrainConfig, setting_of, validate_config

    # Checked as the command will see it: the skipped fields are the script's to set.
    validate_config(config.replace(**{name: getattr(TrainConfig(), name) for name in skip}))
    base = TrainConfig() if base is None else base
    chosen = {}
    for f in dataclasses.fields(TrainConfig):
        value, default = getattr(config, f.name), getattr(base, f.name)
        if f.name in skip or (only is not None and f.name not in only):
            continue
        if only is None and value == default and type(value) is type(default):
            continue
        if value is None and None not in setting_of(f).words.values():  # no word says None on the command line
            if only is not None and getattr(TrainConfig(), f.name) is None:
                continue  # the command's own default is None too
            raise WorkshopError(f"{f.name}=None has no flag: the command's default is {default!r}.",
                                f"leave {f.name} at its default in the config.")
        chosen[f.name] = value
    return train_flags(chosen)


def varying_fields(configs) -> tuple[str, ...]:
    """The TrainConfig fields whose values differ between ``configs`` (what a sweep sweeps)."""
    names = [f.name for f in dataclasses.fields(configs[0])]
    return tuple(n for n in names if len({repr(getattr(c, n)) for c in configs}) > 1)


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


# ---------------------------------------------------------------------------------------------- results


def run_folder(runs: str | os.PathLike, job_id: str) -> Path:
    """The run folder a kit job script made for ``job_id`` (``<runs>/<job name>-<job id>``)."""
    found = sorted(Path(runs).glob(f"*-{job_id}"))
    if not found:
        raise WorkshopError(f"Job {job_id} left no run folder in {runs}.", "read its output file: it failed early.")
    return found[0]


def duration_s(text: str | None) -> float | None:
    """sacct's ``[D-][HH:]MM:SS[.mmm]`` (TotalCPU has milliseconds) as seconds; None for what is not one."""
    if not text:
        return None
    whole, _, fraction = text.partition(".")
    seconds = seconds_of(whole)
    return None if seconds is None else seconds + (float(f"0.{fraction}") if fraction.isdigit() else 0.0)


def memory_mib(text: str | None) -> float | None:
    """sacct's memory (``123456K``, ``1.5G``; a bare number is bytes) in MiB; None for what is not one."""
    found = re.fullmatch(r"([\d.]+)([KMGT]?)", (text or "").strip())
    if not found:
        return None
    return float(found.group(1)) * {"": 2**-20, "K": 2**-10, "M": 1, "G": 2**10, "T": 2**20}[found.group(2)]


def tres_gpus(tres: str | None) -> int:
    """GPUs in a TRES list (``cpu=8,mem=64G,node=1,gres/gpu=4``, or ``gres/gpu:h100=4``)."""
    return sum(int(n) for n in re.findall(r"gres/gpu(?::[\w-]+)?=(\d+)", tres or ""))


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


SWEEP_METRICS = ("steps", "final_train_loss", "final_test_loss", "final_test_acc", "samples_per_s", "wall_s")


def gather_array(folder: str | os.PathLike, out: str | os.PathLike | None = None):
    """One row per task of a ``train_array.sbatch`` sweep (``<folder>/task-<i>/result.json``), the settings
    that differ between tasks first, then what each task measured; written to ``out`` (CSV) when given."""
    import pandas as pd

    folder = Path(folder)
    records = {}
    for path in sorted(folder.glob("task-*/result.json")):
        records[int(path.parent.name.removeprefix("task-"))] = json.loads(path.read_text())
    if not records:
        raise WorkshopError(f"No task of the sweep wrote a result under {folder}.",
                            "read the tasks' output files (%x-%A_%a.out): they failed.")
    configs = pd.DataFrame([r["config"] for r in records.values()], index=list(records))
    varying = [c for c in configs.columns if configs[c].astype(str).nunique() > 1 and c not in SCRIPT_FIELDS]
    rows = []
    for task, record in sorted(records.items()):
        rows.append({"task": task, **{c: record["config"][c] for c in varying},
                     **{m: record["metrics"].get(m) for m in SWEEP_METRICS}})
    frame = pd.DataFrame(rows)
    if out is not None:
        Path(out).parent.mkdir(parents=True, exist_ok=True)
        frame.to_csv(out, index=False)
    return frame


def compare_final_parameters(reference_run: Path, resumed_run: Path) -> dict:
    """Did the interrupted and resumed run end with the uninterrupted run's parameters? Both runs' records and
    their last checkpoints, loaded and compared tensor by tensor."""
    from ..spine.checkpoint import latest_checkpoint, load_checkpoint
    from ..spine.models import build_model, max_parameter_difference, parameter_checksum

    records, models = {}, {}
    for label, run in (("uninterrupted", reference_run), ("preempted", resumed_run)):
        records[label] = json.loads((Path(run) / "result.json").read_text())
        last = latest_checkpoint(Path(run) / "checkpoints")
        if last is None:
            raise WorkshopError(f"The {label} run left no checkpoint in {run}/checkpoints.",
                                "train with checkpoint_every set.")
        models[label] = build_model(records[label]["config"]["model"])
        load_checkpoint(last, model=models[label], restore_rng=False)
    difference = max_parameter_difference(models["uninterrupted"], models["preempted"])
    rows = [{"run": label, "steps": r["metrics"]["steps"], "resumed_from_step": r["metrics"]["resumed_from_step"],
             "final_train_loss": r["metrics"]["final_train_loss"], "param_checksum": r["metrics"]["param_checksum"],
             "checkpoint_checksum": parameter_checksum(models[label])} for label, r in records.items()]
    same = (difference == 0.0 and rows[0]["param_checksum"] == rows[1]["param_checksum"]
            and rows[0]["steps"] == rows[1]["steps"])
    return {"rows": rows, "max_abs_difference": difference, "identical": same}


def preemption_verdict(result: dict) -> str:
    """One line on ``compare_final_parameters``: was the run really interrupted, and did it end where the
    uninterrupted run ended?"""
    table = result["table"] if "table" in result else None
    rows = {r["run"]: r for r in (table.to_dict("records") if table is not None else result["rows"])}
    hit, reference = rows["preempted"], rows["uninterrupted"]
    resumed = hit["resumed_from_step"]
    if resumed is None or resumed != resumed:  # None, or NaN once it passed through a table
        return "Not a preemption test: the run never resumed from a checkpoint, so its parameters prove nothing."
    head = (f"Checkpointed at step {int(resumed)} on the signal, requeued, resumed there and ran to step "
            f"{int(hit['steps'])}: ")
    if hit["steps"] != reference["steps"]:
        return head + f"not comparable with the uninterrupted run's {int(reference['steps'])} steps."
    if result["identical"]:
        return head + ("final parameters identical to the uninterrupted run, bit for bit (largest difference "
                       f"{result['max_abs_difference']:g}, checksums {hit['param_checksum']}).")
    return head + (f"final parameters differ from the uninterrupted run by up to {result['max_abs_difference']:.3g}: "
                   "something the checkpoint should hold was not restored.")


# ---------------------------------------------------------------------------------------------- binding


def cpu_list(cores) -> str:
    """{0, 1, 2, 5} -> "0-2,5" (the notation of Cpus_allowed_list and numactl)."""
    cores, parts = sorted(cores), []
    for core in cores:
        if parts and core == parts[-1][1] + 1:
            parts[-1][1] = core
        else:
            parts.append([core, core])
    return ",".join(f"{a}-{b}" if b > a else f"{a}" for a, b in parts) or "none"


def parse_cpu_list(text: str) -> set[int]:
    cores: set[int] = set()
    for part in text.strip().split(","):
        if part:
            a, _, b = part.partition("-")
            cores.update(range(int(a), int(b or a) + 1))
    return cores


def _read(path) -> str | None:
    try:
        return Path(path).read_text().strip()
    except OSError:
        return None


def numa_nodes_of(cores: set[int], root: str = "/sys/devices/system/node") -> str:
    """The NUMA node(s) that hold these cores, e.g. "0" or "0,1"; "?" where the system does not say."""
    nodes = []
    for folder in sorted(Path(root).glob("node[0-9]*"), key=lambda p: int(p.name[4:])):
        listed = _read(folder / "cpulist")
        if listed is not None and parse_cpu_list(listed) & cores:
            nodes.append(folder.name[4:])
    return ",".join(nodes) or "?"


def _device_numa(device_path: Path) -> str:
    """The NUMA node of a PCI device: its own numa_node file or its nearest parent's; "?" for -1 or none."""
    path = device_path.resolve()
    for folder in (path, *path.parents):
        value = _read(folder / "numa_node")
        if value is not None:
            return "?" if value.startswith("-") else value
    return "?"


def nic_numa(net_root: str = "/sys/class/net", ib_root: str = "/sys/class/infiniband") -> str:
    """Physical network cards (Ethernet and InfiniBand) with their NUMA node, e.g. "eth0:?,mlx5_0:1"."""
    found = []
    for root in (net_root, ib_root):
        for nic in sorted(Path(root).glob("*")):
            device = nic / "device"
            if device.exists():  # virtual interfaces (lo, bridges, veth) have no device behind them
                found.append(f"{nic.name}:{_device_numa(device)}")
    return ",".join(found) or "none"


def gpu_numa() -> str:
    """The NUMA node of each GPU this process sees ("0:1,1:1"); "-" without GPUs."""
    try:
        import torch
    except ImportError:
        return "-"
    if not torch.cuda.is_available():
        return "-"
    found = []
    for i in range(torch.cuda.device_count()):
        p = torch.cuda.get_device_properties(i)
        domain, bus, dev = (getattr(p, f"pci_{k}_id", None) for k in ("domain", "bus", "device"))
        where = "?"
        if bus is not None:
            where = _device_numa(Path(f"/sys/bus/pci/devices/{domain or 0:04x}:{bus:02x}:{dev or 0:02x}.0"))
        found.append(f"{i}:{where}")
    return ",".join(found)


def numa_binding_problem(nproc: int, node_root: str = "/sys/devices/system/node") -> str:
    """Why ``torchrun --numa-binding=node`` would fail for local ranks 0..nproc-1 here ("" when it would work).

    torchrun binds rank i to the cores of GPU i's NUMA node that this job may use, and stops the job when
    there are none (Slurm can give a job cores on one socket and GPUs on the other), when numactl is
    missing, or when its PyTorch has no NUMA binding at all. The job scripts ask first and run unbound,
    saying why, rather than fail.
    """
    import importlib.util

    try:
        if importlib.util.find_spec("torch.numa.binding") is None:
            return "this PyTorch's torchrun has no --numa-binding"
    except ModuleNotFoundError:
        return "this PyTorch's torchrun has no --numa-binding"
    if shutil.which("numactl") is None:
        return "numactl is not installed"
    import torch

    if not torch.cuda.is_available() or torch.cuda.device_count() < nproc:
        return f"{nproc} rank(s) but {torch.cuda.device_count() if torch.cuda.is_available() else 0} GPU(s) visible"
    allowed = os.sched_getaffinity(0)
    for local_rank, where in enumerate(gpu_numa().split(",")[:nproc]):
        node = where.split(":")[1]
        if node == "?":
            return f"GPU {local_rank} reports no NUMA node"
        cores = parse_cpu_list(_read(Path(node_root) / f"node{node}" / "cpulist") or "")
        if not cores & allowed:
            return f"GPU {local_rank} sits on NUMA node {node}, where this job has no core"
    return ""


def _worker_cores(_):
    import torch

    return sorted(os.sched_getaffinity(0)), torch.get_num_threads()


def loader_worker_cores(workers: int = 2) -> tuple[str, int]:
    """Start a DataLoader with ``workers`` worker processes and ask each where it may run: (cores, threads)."""
    from torch.utils.data import DataLoader

    with warnings.catch_warnings():
        # More workers than cores makes PyTorch warn (it counts the cores of this process's affinity mask):
        # that crowding is what this line is there to show, not a mistake.
        warnings.simplefilter("ignore", UserWarning)
        loader = DataLoader(list(range(workers)), batch_size=None, num_workers=workers, collate_fn=_worker_cores,
                            multiprocessing_context="fork" if sys.platform.startswith("linux") else None)
        seen = list(loader)
    cores = set().union(*(set(c) for c, _ in seen))
    return cpu_list(cores), max(t for _, t in seen)


def rank_binding(workers: int = 2) -> dict:
    """Where this process (one task of a job) may run, and what is near it."""
    cores = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else set(range(os.cpu_count() or 1))
    worker_cores, worker_threads = loader_worker_cores(workers) if workers else ("-", 0)
    return {"host": socket.gethostname().split(".")[0], "rank": os.environ.get("SLURM_PROCID", "0"),
            "local": os.environ.get("SLURM_LOCALID", "0"), "cpus": cpu_list(cores), "numa": numa_nodes_of(cores),
            "omp": os.environ.get("OMP_NUM_THREADS", "unset"), "gpus": os.environ.get("CUDA_VISIBLE_DEVICES") or "none",
            "gpu_numa": gpu_numa(), "nics": nic_numa(), "workers": worker_cores, "worker_threads": worker_threads}


BINDING_KEYS = ("rank", "local", "cpus", "numa", "omp", "gpus", "gpu_numa", "nics", "workers", "worker_threads")


def binding_line(workers: int = 2) -> str:
    """One line: ``host rank R local L cpus C numa N omp T gpus G gpu_numa .. nics .. workers W worker_threads 1``."""
    b = rank_binding(workers)
    return " ".join([b["host"], *(f"{key} {b[key]}" for key in BINDING_KEYS)])


def binding_table(lines) -> "object":
    """The per-task lines env_check.sbatch printed (``0: host rank 0 ...``) as a table, one row per task."""
    rows = []
    pattern = re.compile(r"^\s*(\d+): (\S+) (rank .*)$")
    for line in lines:
        found = pattern.match(line)
        if not found:
            continue
        tokens = found.group(3).split()
        row = {"host": found.group(2), **dict(zip(tokens[0::2], tokens[1::2]))}
        rows.append(row)
    rows.sort(key=lambda r: int(r.get("rank", 0)))  # srun prints the tasks' lines in the order they come
    return frame_of(rows, ["host", *BINDING_KEYS])
