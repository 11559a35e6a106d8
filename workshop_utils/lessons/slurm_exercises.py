"""Notebook 06's exercises: the checks of 6.1 and 6.2 run what the attendee wrote on the cluster.

Exercise 6.1: complete a job script.

The attendee fills the gaps of ``JOB_SCRIPT``: the resources (nodes, tasks per node, CPUs per task, time), the
signal that leaves the job time to checkpoint, and the launch line that starts torchrun on every node with its
rendezvous taken from Slurm's variables. ``check_job_script`` reads the script first (a mistake Slurm would
not report, or would report only after the queue, is named at once), then submits it to the cluster, waits,
and judges what happened from ``scontrol`` and the job's output: it ran, with the resources asked, every rank
joined the process group, a checkpoint was written. Each common mistake is one line. Without a reachable
Slurm the check says so and judges the text alone.

Exercise 6.2: a learning-rate sweep as a job array: the sweep file's lines and the ``--array`` spec. The check
names a miscount (a task without a line, a line no task reads) at once, then runs the array with the kit's
``train_array.sbatch``, gathers it with a job that waits for it (``afterok``), and finds one result per rate.

Exercise 6.3: a finished job's efficiency from what it asked for and used (``slurm_jobs.job_usage``), and the
request for the next run.
"""

from __future__ import annotations

import math
import re
import shlex
import uuid
from pathlib import Path

from ..system.errors import WorkshopError
from .exercises import NotYet, Unsolved, answered_number, exercise_check, judge, passed
from .slurm_jobs import find_slurm, job_env, job_records, seconds_of, submit, wait_for

EXERCISE = "Exercise 6.1"
GAPS = ("nodes", "ntasks_per_node", "cpus_per_task", "time", "signal", "nproc_per_node", "rdzv_endpoint")

JOB_SCRIPT = """\
#!/bin/bash
#SBATCH --job-name=ex61-train
#SBATCH --nodes={nodes}
#SBATCH --ntasks-per-node={ntasks_per_node}
#SBATCH --cpus-per-task={cpus_per_task}
#SBATCH --time={time}
#SBATCH --signal={signal}
#SBATCH --output=%x-%j.out
set -uo pipefail
export OMP_NUM_THREADS=1  # each of the processes torchrun starts computes in one thread
# The warning signal reaches this script (B:); pass it on to the training processes on every node, not to
# torchrun itself (its command line names the module too, but only the processes it starts run python -u).
forward() {{ srun --overlap --ntasks-per-node=1 pkill -USR1 -f "python[0-9.]* -u -m workshop_utils.train" || true; }}
trap forward USR1
# srun starts one task per node (torchrun); torchrun starts --nproc-per-node training processes.
srun --cpus-per-task="$SLURM_CPUS_PER_TASK" torchrun --nnodes="$SLURM_JOB_NUM_NODES" \\
    --nproc-per-node={nproc_per_node} --rdzv-backend=c10d --rdzv-endpoint={rdzv_endpoint} --rdzv-id="$SLURM_JOB_ID" \\
    -m workshop_utils.train "$@" &
# bash runs the trap only between commands: wait (which a signal interrupts) until training has ended.
while ! wait $!; do kill -0 $! 2>/dev/null || break; done
"""

# What the job must fit into its time limit: start-up and a few CPU steps take well under this; the
# signal's lead time comes on top.
NEEDED_S = 120
# What the training in the job does: a few CPU steps of the small CNN, a checkpoint every few, one line a step.
TRAINING = ("--device", "cpu", "--batch-size", "16", "--train-size", "256", "--test-size", "64", "--steps", "12",
            "--epochs", "100", "--lr", "0.01", "--warmup-steps", "0", "--checkpoint-every", "4", "--log-every", "4", "--no-progress")


def fill_job_script(answers: dict) -> str:
    """``JOB_SCRIPT`` with the gaps filled from ``answers``; any gap still ``...`` leaves it unsolved."""
    missing = [gap for gap in GAPS if answers.get(gap, ...) is ...]
    if missing:
        raise Unsolved(f"… {EXERCISE}: not yet solved: fill {', '.join(missing)}.",
                       "each is what goes after its flag in the script above.")
    return JOB_SCRIPT.format(**{gap: answers[gap] for gap in GAPS})


def _option(script: str, name: str) -> str | None:
    """The value of ``#SBATCH --name=value`` (the last one, as sbatch reads them), else None."""
    found = re.findall(rf"^#SBATCH\s+--{name}(?:=|\s+)(\S*)", script, re.M)
    return found[-1] if found else None


def _flag(script: str, name: str) -> str | None:
    """The value of ``--name=value`` on the torchrun line (empty string when the value is empty)."""
    found = re.search(rf"--{name}(?:=|\s+)(\"[^\"]*\"|'[^']*'|\S*)", _launch(script))
    return found.group(1).strip("\"'") if found else None


def _launch(script: str) -> str:
    """The torchrun command, its continuation lines joined."""
    joined = script.replace("\\\n", " ")
    return next((line for line in joined.splitlines() if re.search(r"(^|[\s;&|])torchrun\s+-", line)
                 and not line.lstrip().startswith("#")), "")


def _minutes(value: str | None) -> int | None:
    """A bare number of minutes, as --time also takes it, in seconds."""
    return int(value) * 60 if value is not None and value.isdigit() else None


def _whole_number(value: str | None) -> int | None:
    return int(value) if value is not None and value.isdigit() else None


def script_problem(script: str) -> str | None:
    """The first mistake the script's text shows, as "problem. Fix: ..."; None when the text is right."""
    if not _launch(script):
        return "no torchrun line: the job would start nothing. Fix: keep the launch line of the template."
    endpoint = _flag(script, "rdzv-endpoint")
    if not endpoint or endpoint.endswith(":") or endpoint.startswith(":"):
        return ("no rendezvous endpoint: torchrun's agents on the job's nodes have nowhere to meet. Fix: "
                "--rdzv-endpoint=HOST:PORT with HOST the job's first node, "
                "$(scontrol show hostnames \"$SLURM_JOB_NODELIST\" | head -n 1), and a free port such as 29500.")
    signal = _option(script, "signal")
    warning = re.fullmatch(r"(?:[BR]+:)*(?:SIG)?USR1@(\d+)", signal or "")
    if not signal:
        return ("no --signal: when the time limit comes, Slurm ends the job without warning and the steps since "
                "the last checkpoint are lost. Fix: #SBATCH --signal=B:USR1@60 sends SIGUSR1 to the script 60 s "
                "before the end; its trap passes it on and the training loop checkpoints and stops.")
    if not warning:
        return (f"--signal={signal}: the trap and the training loop listen for SIGUSR1. Fix: "
                "--signal=B:USR1@SECONDS, SECONDS the warning's lead time.")
    lead, limit = int(warning.group(1)), seconds_of(_option(script, "time")) or _minutes(_option(script, "time"))
    if limit is None:
        return ("--time is not a duration Slurm reads. Fix: HH:MM:SS (00:05:00) or minutes (5).")
    if lead < 30:
        return (f"--signal gives {lead} s of warning: too little to write a checkpoint on a busy file system. Fix: "
                "give it a minute or more (B:USR1@60).")
    if limit < NEEDED_S + lead:
        return (f"--time of {limit} s: the job needs about {NEEDED_S} s, and the warning comes {lead} s before the "
                f"end, so it would run out of time. Fix: at least {NEEDED_S + lead} s, e.g. 00:05:00.")
    tasks, nproc = _whole_number(_option(script, "ntasks-per-node")), _whole_number(_flag(script, "nproc-per-node"))
    if tasks is None or nproc is None:
        return ("--ntasks-per-node and --nproc-per-node must be whole numbers. Fix: one task per node "
                "(torchrun), and as many processes per node as it has GPUs (here: 2 CPU processes).")
    if tasks > 1 and nproc > 1:
        return (f"--ntasks-per-node={tasks} and --nproc-per-node={nproc}: srun starts {tasks} torchruns on each "
                f"node and each starts {nproc} processes, {tasks * nproc} per node, {tasks} times too many. Fix: "
                "--ntasks-per-node=1 (the one task is torchrun) and --nproc-per-node the processes per node.")
    cpus = _whole_number(_option(script, "cpus-per-task"))
    if cpus is not None and cpus < nproc:
        return (f"--cpus-per-task={cpus} for {nproc} training processes: they would take turns on "
                f"{cpus} core(s). Fix: --cpus-per-task of at least {nproc} (one core per process here).")
    return None


def _judge_finished(job_id: str, output: Path, checkpoints: Path, asked: dict) -> str:
    """What the finished job shows: "" when everything is right, else the problem and its fix."""
    records = job_records(job_id)
    record = records[0] if records else {}
    state = record.get("JobState", "unknown (Slurm forgot the job)")
    log = output.read_text(errors="replace") if output.exists() else ""
    if state == "TIMEOUT":
        limit = record.get("TimeLimit", asked.get("time"))
        return (f"job {job_id} ran out of time (state TIMEOUT at its limit of {limit}). Fix: ask for more --time "
                "than the job needs, with room for the signal's lead time.")
    if state != "COMPLETED":
        last = [line for line in log.splitlines() if line.strip()][-1:] or ["no output"]
        return (f"job {job_id} ended {state}, exit code {record.get('ExitCode', '?')}: {last[0][:200]}. Fix: read "
                f"{output.name}, the job's output.")
    nodes, cpus = _whole_number(record.get("NumNodes")), _whole_number(record.get("NumCPUs"))
    if nodes != asked["nodes"] or (cpus is not None and cpus < asked["cpus"]):
        return (f"job {job_id} got {nodes} node(s) and {cpus} CPU(s), not the {asked['nodes']} node(s) and "
                f"{asked['cpus']} CPU(s) the script asks for. Fix: check the #SBATCH lines.")
    joined = {int(rank) for rank, world in re.findall(r"^rank (\d+) of (\d+) ", log, re.M)
              if int(world) == asked["ranks"]}  # every training process says its rank as it starts
    if joined != set(range(asked["ranks"])):
        return (f"job {job_id}: ranks {sorted(joined) or 'none'} of the {asked['ranks']} the script asks for "
                "joined the process group. Fix: --nproc-per-node is the processes per node, --nnodes the nodes.")
    if not list(checkpoints.glob("*.pt")):
        return f"job {job_id} wrote no checkpoint into {checkpoints}. Fix: keep \"$@\" at the end of the launch line."
    return ""


def _refuse(exercise: str, problem: str):
    """A "problem. Fix: hint" line of the readers above, raised as the check's one-line answer."""
    said, _, fix = problem.partition(". Fix: ")
    raise NotYet(f"✗ {exercise}: {said}.", fix)


def _text_then_cluster(exercise: str, problem: str | None, reads_right: str, subject: str, prefix: str,
                       jobs_dir) -> Path | None:
    """First the text: a mistake is the check's one line. Then the cluster: without one, the check passes on
    the text and says so (None); with one, a new folder for the check's jobs (a check run twice keeps both)."""
    if problem:
        _refuse(exercise, problem)
    site = find_slurm()
    if not site.available:
        passed(exercise, f"{reads_right}; {site.line}, so {subject} not run here")
        return None
    folder = Path(jobs_dir or ".").resolve() / f"{prefix}-{uuid.uuid4().hex[:8]}"
    folder.mkdir(parents=True)
    return folder


@exercise_check
def check_job_script(script, jobs_dir=None, timeout_s: float = 300, exercise: str = EXERCISE) -> bool:
    """Read the script (or ``JOB_SCRIPT`` filled from a dict of answers), then run it on the cluster when one
    answers, and judge what it did."""
    if script is ...:
        raise Unsolved(f"… {exercise}: not yet solved: fill the gaps of the job script.",
                       "each is what goes after its flag in the script.")
    if isinstance(script, dict):
        script = fill_job_script(script)
    folder = _text_then_cluster(exercise, script_problem(script), "the script reads right", "it was", "ex61", jobs_dir)
    if folder is None:
        return True
    (folder / "job.sbatch").write_text(script)
    checkpoints = folder / "checkpoints"
    try:
        job_id = submit(folder / "job.sbatch", [*TRAINING, "--checkpoint-dir", str(checkpoints)], cwd=folder,
                        env=job_env(folder))
    except WorkshopError as err:
        said = str(err.problem)
        if "partition" in said.lower():
            raise NotYet(f"✗ {exercise}: sbatch refused the script: {said}",
                         "name a partition that sinfo lists, or leave --partition out for the default.") from None
        raise NotYet(f"✗ {exercise}: sbatch refused the script: {said}", "read sbatch's message above.") from None
    wait_for([job_id], timeout_s=timeout_s)
    nodes = _whole_number(_option(script, "nodes")) or 1
    nproc = _whole_number(_flag(script, "nproc-per-node")) or 1
    asked = {"nodes": nodes, "cpus": nodes * (_whole_number(_option(script, "cpus-per-task")) or 1),
             "ranks": nodes * nproc, "time": _option(script, "time")}
    output = next(folder.glob(f"*-{job_id}.out"), folder / f"slurm-{job_id}.out")
    problem = _judge_finished(job_id, output, checkpoints, asked)
    if problem:
        _refuse(exercise, problem)
    limit = seconds_of(_option(script, "time"))
    return passed(exercise, f"job {job_id} ({folder / 'job.sbatch'}) ran on {nodes} node(s) with {asked['ranks']} "
                            "ranks, wrote its checkpoints"
                            + (f", inside its {limit} s limit" if limit else ""))


# ---------------------------------------------------------------------------------------------- Exercise 6.2

SWEEP = "Exercise 6.2"


def array_tasks(spec: str) -> list[int] | None:
    """The task ids of ``--array=SPEC`` ("0-2", "0-2%2", "0,1,2", "0-6:2"); None when Slurm would not read it."""
    body = str(spec).removeprefix("--array=").split("%")[0]
    tasks = []
    for part in body.split(","):
        found = re.fullmatch(r"(\d+)(?:-(\d+)(?::(\d+))?)?", part.strip())
        if not found:
            return None
        first, last, step = int(found.group(1)), int(found.group(2) or found.group(1)), int(found.group(3) or 1)
        tasks += range(first, last + 1, step)
    return sorted(set(tasks))


def sweep_problem(lines, spec, values) -> str | None:
    """The first mistake in a sweep file's ``lines`` and its ``--array`` spec for the learning rates ``values``."""
    if isinstance(lines, str) or not all(isinstance(line, str) for line in lines):
        return "sweep_lines must be a list of strings, one line of flags per task. Fix: e.g. [\"--lr 0.02\", ...]."
    if len(lines) != len(values):
        return (f"{len(lines)} line(s) for {len(values)} learning rates: the sweep file needs one line per task. "
                "Fix: one line per learning rate, in their order.")
    found = [re.search(r"--lr(?:=|\s+)(\S+)", line) for line in lines]
    missing = [i + 1 for i, f in enumerate(found) if f is None]
    if missing:
        return f"line(s) {missing} set no --lr: those tasks would all train with the default. Fix: --lr VALUE."
    read = [float(f.group(1)) for f in found]
    if len(set(read)) < len(read):
        return (f"the lines set learning rates {read}: some tasks train the same run twice. Fix: one learning "
                "rate per line.")
    if read != [float(v) for v in values]:
        return f"the lines set {read}, not {list(values)}. Fix: the learning rates in their given order."
    tasks = array_tasks(spec)
    if tasks is None:
        return f"--array={spec} is not a task list Slurm reads. Fix: FIRST-LAST, e.g. 0-{len(lines) - 1}."
    wanted = list(range(len(lines)))
    if tasks != wanted:
        beyond = [t for t in tasks if t >= len(lines)]
        unread = [t for t in wanted if t not in tasks]
        said = (f"task(s) {beyond} would find no line in the sweep file" if beyond else
                f"line(s) {[t + 1 for t in unread]} would never train")
        return (f"--array={spec} starts tasks {tasks}: task i reads line i+1 of the sweep file, so {said}. Fix: "
                f"--array=0-{len(lines) - 1} (with %K to run at most K at a time).")
    return None


@exercise_check
def check_array_sweep(sweep_lines, array, values, config, jobs_dir=None, timeout_s: float = 300,
                      exercise: str = SWEEP) -> bool:
    """Read the sweep file's lines and the array spec; where Slurm answers, run the array, gather it with a job
    that waits for it, and check one result per learning rate."""
    from .slurm_jobs import SCRIPT_FIELDS, config_flags, gather_array, template

    if sweep_lines is ... or array is ...:
        raise Unsolved(f"… {exercise}: not yet solved: write sweep_lines and array.",
                       "one line of flags per learning rate; --array names the task ids.")
    folder = _text_then_cluster(exercise, sweep_problem(sweep_lines, array, values),
                                f"{len(sweep_lines)} tasks read their lines", "they were", "ex62", jobs_dir)
    if folder is None:
        return True
    (folder / "sweep.txt").write_text("\n".join(sweep_lines) + "\n")
    shared = config_flags(config, skip=(*SCRIPT_FIELDS, "lr"))
    env = job_env(folder)  # WORKSHOP_RUNS: the tasks' results go to <folder>/wu-sweep-<array id>/
    job_id = submit(template("train_array.sbatch"), ["sweep.txt", *shared],
                    [f"--array={str(array).removeprefix('--array=')}", "--cpus-per-task=1", "--time=00:10:00",
                     "--output=%x-%A_%a.out"], cwd=folder, env=env)
    code = "import sys, workshop_utils as wu; print(wu.gather_array(*sys.argv[1:]).to_string(index=False))"
    gather = submit(None, options=[f"--dependency=afterok:{job_id}", "--job-name=ex62-gather", "--time=00:05:00",
                                   "--output=%x-%j.out",
                                   "--wrap=" + " ".join(shlex.quote(a) for a in ["python", "-c", code,
                                                                                  f"wu-sweep-{job_id}",
                                                                                  f"wu-sweep-{job_id}/sweep.csv"])],
                    cwd=folder, env=env)
    wait_for([job_id, gather], timeout_s=timeout_s)
    table = folder / f"wu-sweep-{job_id}" / "sweep.csv"
    if not table.exists():
        raise NotYet(f"✗ {exercise}: the gather job {gather} wrote no {table.name}: a task of array {job_id} failed.",
                     f"read the tasks' output files in {folder}.")
    gathered = gather_array(table.parent)
    rates = sorted(float(v) for v in gathered["lr"]) if "lr" in gathered else []
    if rates != sorted(float(v) for v in values):
        raise NotYet(f"✗ {exercise}: the gathered table holds learning rates {rates}, not {sorted(values)}.",
                     f"read {table}.")
    return passed(exercise, f"array {job_id}: {len(gathered)} tasks, one per learning rate, gathered by job {gather}")


# ---------------------------------------------------------------------------------------------- Exercise 6.3

USAGE = "Exercise 6.3"
TIME_MARGIN, MEMORY_MARGIN = 1.5, 1.25  # the next request: what the job used, with room to spare


def next_request(usage: dict) -> tuple[int, int]:
    """(seconds, MiB) to ask for next time: 1.5 x the elapsed time in whole minutes, 1.25 x the peak memory in
    whole 100 MiB."""
    return (60 * math.ceil(TIME_MARGIN * usage["elapsed_s"] / 60),
            100 * math.ceil(MEMORY_MARGIN * usage["max_rss_mib"] / 100))


@exercise_check
def check_job_usage(cpu_efficiency, time_share, gpu_hours, next_time_limit_s, next_memory_mib, usage: dict,
                    exercise: str = USAGE) -> bool:
    """Each answer against the same arithmetic on ``usage``, the usual mistakes named."""
    elapsed, cpus, gpus = usage["elapsed_s"], usage["cpus"], usage["gpus"]
    busy = usage["cpu_time_s"] / elapsed  # cores kept busy on average
    value = answered_number(cpu_efficiency, exercise, "cpu_efficiency")
    judge(value, busy / cpus, exercise, "cpu_efficiency", [
        (busy, "that is the cores kept busy on average; efficiency divides by the cores allocated.",
         "cpu_time_s / (elapsed_s x cpus)."),
        (100 * busy / cpus, "a percentage: keep it a share between 0 and 1.", "drop the x 100."),
    ], "cpu_time_s / (elapsed_s x cpus): the share of the allocated core-seconds that computed.")
    value = answered_number(time_share, exercise, "time_share")
    judge(value, elapsed / usage["time_limit_s"], exercise, "time_share", [
        (usage["time_limit_s"] / elapsed, "upside down: the share of the limit the job used is below 1.",
         "elapsed_s / time_limit_s."),
    ], "elapsed_s / time_limit_s.")
    value = answered_number(gpu_hours, exercise, "gpu_hours")
    judge(value, elapsed * gpus / 3600, exercise, "gpu_hours", [
        (elapsed * gpus, "GPU-seconds: an hour has 3,600 of them.", "divide by 3600."),
        (elapsed / 3600, "the job's hours, not its GPU-hours: every GPU it held counts.", "multiply by gpus."),
    ], "elapsed_s x gpus / 3600 (0 for a job without GPUs).", abs_tol=1e-9)
    right_time, right_memory = next_request(usage)
    value = answered_number(next_time_limit_s, exercise, "next_time_limit_s")
    judge(value, right_time, exercise, "next_time_limit_s", [
        (TIME_MARGIN * elapsed, "not rounded up to whole minutes: Slurm's limits are minutes.",
         "60 x ceil(1.5 x elapsed_s / 60)."),
        (60 * math.ceil(TIME_MARGIN * usage["time_limit_s"] / 60), "that grows the old limit; the new one comes "
         "from what the job used.", "start from elapsed_s, not time_limit_s."),
    ], "60 x ceil(1.5 x elapsed_s / 60).", rel=0)
    value = answered_number(next_memory_mib, exercise, "next_memory_mib")
    judge(value, right_memory, exercise, "next_memory_mib", [
        (MEMORY_MARGIN * usage["max_rss_mib"], "not rounded up to whole 100 MiB.", "100 x ceil(1.25 x max_rss_mib / 100)."),
        (100 * math.ceil(usage["max_rss_mib"] / 100), "no room to spare: the next run's peak can be higher.",
         "1.25 x the peak, then round up."),
    ], "100 x ceil(1.25 x max_rss_mib / 100).", rel=0)
    return passed(exercise, f"{100 * busy / cpus:.0f}% of {cpus} core(s) busy, {100 * elapsed / usage['time_limit_s']:.0f}% "
                            f"of the time limit used; next time ask --time={right_time // 60} --mem={right_memory}M")
