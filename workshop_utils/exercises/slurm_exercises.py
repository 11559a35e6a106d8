"""Notebook 06's exercises 6.1 and 6.2: each check judges the answer against the exercise's own specification
(``JOB_SPEC`` for 6.1), lets the real tools read it (sbatch its #SBATCH lines, bash the script, torchrun its
arguments, the training command its flags), then, where a Slurm answers, runs it and judges what the job did.
A wrong answer of any type is one line (``NotYet``), never a traceback. 6.3 is in ``slurm_usage``."""

from __future__ import annotations

import argparse
import functools
import json
import math
import numbers
import os
import re
import shlex
import uuid
from pathlib import Path

from ..lessons.slurm_jobs import find_slurm, job_env, job_records, submit, wait_for
from ..system.errors import WorkshopError
from ..system.results import write_atomically
from .answer_values import Problem, kind, number_of, show
from .exercise_cells import NotYet, Unsolved, passed
from .exercise_judging import accepted, checked
from .job_script import EXERCISE, GAPS, JOB_SCRIPT, JOB_SPEC, NEEDED_S, TRAINING, JobSpec, fill_job_script
from .job_script_run import namespaces_problem
from .job_script_static import ODD_SPACES, read_directives, request_problem, syntax_problem, text_problem
from .job_script_verdict import behaviour_problem
from .slurm_rules import NO_LIMIT, array_ranges, array_tasks, time_limit_s, whole
from .slurm_usage import ANSWERS, OTHER_JOB, USAGE, check_job_usage, next_request

__all__ = ["ANSWERS", "EXERCISE", "GAPS", "JOB_SCRIPT", "JOB_SPEC", "NEEDED_S", "OTHER_JOB", "SWEEP", "USAGE",
           "JobSpec", "array_tasks", "check_array_sweep", "check_job_script", "check_job_usage", "fill_job_script",
           "next_request", "script_problem", "sweep_problem"]


# ---------------------------------------------------------------------------------------------- Exercise 6.1


def script_problem(script: str, spec: JobSpec = JOB_SPEC) -> str | None:
    """The first mistake of a job script against ``spec``, as "problem. Fix: ..."; None when it is right. What
    no run shows first, then what bash did with it in a simulated job, where this machine can run one."""
    problem = text_problem(script)
    if problem:
        return problem
    try:
        read, written = read_directives(script)
    except Problem as problem:
        return str(problem)
    problem = request_problem(script, read, written, spec) or syntax_problem(script)
    if problem or namespaces_problem():
        return problem
    return behaviour_problem(script, read, written, spec)


def _judge_finished(job_id: str, output: Path, checkpoints: Path, result: Path, spec: JobSpec) -> str:
    """What the finished job shows: "" when everything is right, else the problem and its fix."""
    record = next(iter(job_records(job_id)), {})
    state = record.get("JobState", "unknown (Slurm forgot the job)")
    log = output.read_text(errors="replace") if output.exists() else ""
    if state == "TIMEOUT":
        return (f"job {job_id} ran out of time (state TIMEOUT at its limit of {record.get('TimeLimit', '?')}). Fix: "
                "ask for more --time than the job needs, with room for the signal's lead time.")
    if state != "COMPLETED":
        last = [line for line in log.splitlines() if line.strip()][-1:] or ["no output"]
        return (f"job {job_id} ended {state}, exit code {record.get('ExitCode', '?')}: {show(last[0], 200)}. Fix: "
                f"read {output.name}, the job's output.")
    nodes, cpus = whole(record.get("NumNodes")), whole(record.get("NumCPUs"))
    if nodes != spec.nodes or (cpus is not None and cpus < spec.nodes * spec.cores_per_task):
        return (f"job {job_id} got {nodes} node(s) and {cpus} CPU(s): the exercise asks for one node with a core for "
                "each training process. Fix: check the #SBATCH lines.")
    # Every rank is in the process group once it forms, and rank 0's record says how large it was. Each rank's
    # greeting says so too, but two ranks' lines may share one line of the log: they are searched, not anchored.
    try:
        world = json.loads(result.read_text())["metrics"]["world_size"]
    except (OSError, ValueError, KeyError, TypeError):
        world = None
    greeted = {int(rank) for rank, size in re.findall(r"rank (\d+) of (\d+) \(local rank", log)
               if int(size) == spec.ranks}
    if world != spec.ranks and greeted != set(range(spec.ranks)):
        said = f"trained with {world} process(es)" if world is not None else "wrote no result"
        return (f"job {job_id}: ranks {sorted(greeted) or 'none'} of the {spec.ranks} the exercise asks for said they "
                f"joined, and the run {said}. Fix: --nproc-per-node is the processes per node, --nnodes the nodes.")
    if not list(checkpoints.glob("*.pt")):
        return f"job {job_id} wrote no checkpoint into {checkpoints}. Fix: keep \"$@\" at the end of the launch line."
    return ""


def _refuse(exercise: str, problem: str):
    """A "problem. Fix: hint" line of the readers above, raised as the check's one-line answer."""
    said, _, fix = problem.partition(". Fix: ")
    raise NotYet(f"✗ {exercise}: {said}.", fix)


def _check_call(exercise: str, jobs_dir, timeout_s) -> None:
    """The check's own arguments, read alike with or without a cluster, so no mistake shows only in class."""
    if isinstance(timeout_s, bool) or not isinstance(timeout_s, numbers.Real) or not 0 < timeout_s < math.inf:
        raise NotYet(f"✗ {exercise}: timeout_s={show(repr(timeout_s), 30)} is no time to wait for the check's job.",
                     "a number of seconds above 0, e.g. timeout_s=300.")
    fix = "a folder's path (made if missing), or None for the current folder."
    if jobs_dir is not None and not isinstance(jobs_dir, (str, os.PathLike)):
        raise NotYet(f"✗ {exercise}: jobs_dir is {kind(jobs_dir)}, not a folder's path.", fix)
    if jobs_dir is not None and Path(jobs_dir).exists() and not Path(jobs_dir).is_dir():
        raise NotYet(f"✗ {exercise}: jobs_dir {show(str(jobs_dir))} is a file, not a folder.", fix)


def _text_then_cluster(exercise: str, problem: str | None, reads_right: str, unsubmitted: str, prefix: str,
                       jobs_dir) -> Path | None:
    """First the text: a mistake is the check's one line. Then the cluster: without one, the check passes on
    the text and says so (None); with one, a new folder for the check's jobs (a check run twice keeps both)."""
    if problem:
        _refuse(exercise, problem)
    site = find_slurm()
    if not site.available:
        passed(exercise, f"{reads_right}; {site.line}, so {unsubmitted}")
        return None
    folder = Path(jobs_dir or ".").resolve() / f"{prefix}-{uuid.uuid4().hex[:8]}"
    folder.mkdir(parents=True)
    return folder


@checked
def check_job_script(script, jobs_dir=None, timeout_s: float = 300, exercise: str = EXERCISE) -> bool:
    """Judge the script (or ``JOB_SCRIPT`` filled from a dict) against ``JOB_SPEC``, then on the cluster."""
    _check_call(exercise, jobs_dir, timeout_s)
    if script is ...:
        raise Unsolved(f"… {exercise}: not yet solved: fill the gaps of the job script.",
                       "each is what goes after its flag in the script.")
    if isinstance(script, dict):
        script = fill_job_script(script, exercise)
    elif not isinstance(script, str):
        raise NotYet(f"✗ {exercise}: the answer is {kind(script)}: the check takes the dict of answers "
                     "(answers = dict(nodes=..., ...)) or the whole script as text.",
                     "fill the dict in the exercise cell and pass it.")
    problem = script_problem(script)
    unrun = namespaces_problem()
    how = (f"its #SBATCH lines read right; its commands were not run here ({unrun})" if unrun else
           "bash ran it right in a simulated job, on 1 node and on 2")
    folder = _text_then_cluster(exercise, problem, how, "it was not submitted", "ex61", jobs_dir)
    if folder is None:
        return True
    write_atomically(folder / "job.sbatch", lambda tmp: tmp.write_text(script), "Job script")
    checkpoints, result = folder / "checkpoints", folder / "result.json"
    try:
        job_id = submit(folder / "job.sbatch", [*TRAINING, "--checkpoint-dir", str(checkpoints), "--out", str(result)],
                        cwd=folder, env=job_env(folder))
    except WorkshopError as err:
        said = show(str(err.problem), 300)
        fix = ("name a partition that sinfo lists, or leave --partition out for the default." if "partition" in
               said.lower() else "read sbatch's message above.")
        raise NotYet(f"✗ {exercise}: sbatch refused the script: {said}", fix) from None
    wait_for([job_id], timeout_s=timeout_s)
    output = next(folder.glob(f"*-{job_id}.out"), folder / f"slurm-{job_id}.out")
    problem = _judge_finished(job_id, output, checkpoints, result, JOB_SPEC)
    if problem:
        _refuse(exercise, problem)
    limit = time_limit_s(read_directives(script)[0].get("time"))
    return passed(exercise, f"job {job_id} ({folder / 'job.sbatch'}) ran on {JOB_SPEC.nodes} node(s) with "
                            f"{JOB_SPEC.ranks} ranks, wrote its checkpoints"
                            + (f", inside its {limit} s limit" if limit and limit != NO_LIMIT else ""))


# ---------------------------------------------------------------------------------------------- Exercise 6.2

SWEEP = "Exercise 6.2"


class Refusal(Exception):
    """argparse's error, raised instead of printed with an exit."""


class RaisingParser(argparse.ArgumentParser):
    def error(self, message):  # no flag of the training command prints and exits: help is off
        raise Refusal(message)


@functools.cache
def _train_flags() -> RaisingParser:
    """The flags of ``python -m workshop_utils.train``, from the same generator the command uses."""
    from ..spine.config_flags import add_config_flags

    parser = RaisingParser(prog="python -m workshop_utils.train", add_help=False)
    add_config_flags(parser)
    parser.add_argument("--global-batch-size", type=int, default=argparse.SUPPRESS)
    parser.add_argument("--out", default=argparse.SUPPRESS)
    return parser


def _sweep_line(number: int, line: str) -> float | None:
    """The learning rate a sweep file's line sets (None: it sets none), read as the task reads it: split at white
    space (``read -r -a``), then the training command's flags; ``Problem`` where the command would stop."""
    shown = show(line)
    odd = ODD_SPACES.search(line)
    odd = "\r" if "\r" in line else "\n" if "\n" in line else odd and odd.group()
    if odd:
        what = {"\r": "a carriage return (\\r), a Windows line end, which bash's read keeps in the flag's value",
                "\n": "a line break: the sweep file would get more lines than tasks"}.get(
            odd, f"a U+{ord(odd):04X} space (a non-breaking space), where bash's read -a does not split")
        raise Problem(f"line {number} ({shown}) holds {what}. Fix: one line of flags per learning rate, plain spaces "
                      "between, e.g. \"--lr 0.01\".")
    if re.search(r"\{[A-Za-z_][\w.\[\]'\"]*\}", line):
        raise Problem(f"line {number} ({shown}) still holds its braces: without the f in front, a string keeps "
                      "{lr} as it is. Fix: an f-string, f\"--lr {lr}\".")
    try:
        flags = _train_flags().parse_args([w for w in re.split(r"[ \t\n]+", line) if w])  # read -a's IFS
    except Refusal as err:
        raise Problem(f"line {number} ({shown}): python -m workshop_utils.train would stop with "
                      f"\"{show(str(err))}\". Fix: flags as the command takes them, e.g. \"--lr 0.01\".") from None
    given = vars(flags)
    lr = given.pop("lr", None)
    others = sorted(name for name, value in given.items() if value is not None)
    if others and lr is not None:  # a line with no --lr is named with the others that have none
        flags_shown = ", ".join("--" + name.replace("_", "-") for name in others)
        raise Problem(f"line {number} ({shown}) also sets {flags_shown}: a task's flags come after the sweep's shared "
                      "ones and override them, and the exercise's lines vary the learning rate alone. "
                      "Fix: only --lr on each line, e.g. \"--lr 0.01\".")
    return None if lr is None else float(lr)


def _learning_rates(values) -> list[float]:
    if isinstance(values, (str, bytes, dict)) or not hasattr(values, "__iter__"):
        raise Problem(f"learning_rates is {kind(values)}, not a few numbers. Fix: e.g. (0.01, 0.03, 0.1).")
    rates = []
    for value in values:
        try:
            rate = number_of(value)
        except Problem as problem:
            raise Problem(f"a learning rate {problem}. Fix: learning_rates holds positive numbers.") from None
        if rate <= 0:
            raise Problem(f"a learning rate of {rate:g}: it must be positive. Fix: learning_rates holds positive "
                          "numbers.")
        rates.append(rate)
    if not rates:
        raise Problem("learning_rates is empty: a sweep needs a rate or more. Fix: e.g. (0.01, 0.03, 0.1).")
    twice = next((rate for k, rate in enumerate(rates) if any(accepted(rate, other) for other in rates[:k])), None)
    if twice is not None:  # no line could tell the two tasks apart: the lines are not where the mistake is
        raise Problem(f"learning_rates holds {twice:g} twice: a sweep trains each rate once. Fix: each rate once, "
                      "e.g. (0.01, 0.03, 0.1).")
    return rates


def _as_list(lines):
    """A NumPy array or a pandas Series of lines, read as the list it holds."""
    return lines.tolist() if hasattr(lines, "tolist") else lines


def sweep_problem(lines, spec, values) -> str | None:
    """The first mistake in a sweep file's ``lines`` and its ``--array`` spec for the learning rates ``values``."""
    try:
        return _sweep_problem(_as_list(lines), spec, _learning_rates(values))
    except Problem as problem:
        return str(problem)


def _sweep_problem(lines, spec, values: list[float]) -> str | None:
    if not isinstance(lines, (list, tuple)):
        return (f"sweep_lines is {kind(lines)}: it must be a list of strings, one line of flags per task. Fix: e.g. "
                "[\"--lr 0.02\", ...].")
    wrong = next((k for k, line in enumerate(lines) if not isinstance(line, str)), None)
    if wrong is not None:
        return (f"sweep_lines must be a list of strings: line {wrong + 1} is {kind(lines[wrong])}. Fix: one line of "
                "flags per task, e.g. [\"--lr 0.02\", ...].")
    if len(lines) != len(values):
        return (f"{len(lines)} line(s) for {len(values)} learning rates: the sweep file needs one line per task. "
                "Fix: one line per learning rate, in their order.")
    read = [_sweep_line(k + 1, line) for k, line in enumerate(lines)]
    missing = [k + 1 for k, lr in enumerate(read) if lr is None]
    if missing:
        return f"line(s) {missing} set no --lr: those tasks would all train with the default. Fix: --lr VALUE."
    if len(set(read)) < len(read):
        return (f"the lines set learning rates {read}: some tasks train the same run twice. Fix: one learning "
                "rate per line.")
    # the one tolerance of every exercise: 0.1 * 0.1 and a float32 0.01 (0.009999999776) are 0.01
    foreign = [k for k, got in enumerate(read) if not any(accepted(got, want) for want in values)]
    if foreign:
        k = foreign[0]
        return (f"line {k + 1} sets --lr {read[k]:g}, which is none of the learning rates {values}. Fix: line i sets "
                f"the i-th learning rate, here \"--lr {values[k]:g}\".")
    if not all(accepted(got, want) for got, want in zip(read, values)):
        return f"the lines set {read}, not {values}. Fix: the learning rates in their given order."
    if not isinstance(spec, str):
        return f"`array` is {kind(spec)}, not the text that goes after --array=. Fix: FIRST-LAST, as text."
    ranges = array_ranges(spec)
    wanted = list(range(len(lines)))
    count = sum(len(r) for r in ranges)
    if count > 10 * len(lines) + 100:
        return (f"--array={show(spec)} starts {count} tasks for {len(lines)} lines: task i reads line i+1 of the "
                "sweep file. Fix: one task per line.")
    tasks = sorted({task for r in ranges for task in r})
    if tasks != wanted:
        beyond = [t for t in tasks if t >= len(lines)]
        unread = [t for t in wanted if t not in tasks]
        said = (f"task(s) {beyond} would find no line in the sweep file" if beyond else
                f"line(s) {[t + 1 for t in unread]} would never train")
        return (f"--array={show(spec)} starts tasks {tasks}: task i reads line i+1 of the sweep file, so {said}. Fix: "
                "task ids from 0, one per line.")
    return None


@checked
def check_array_sweep(sweep_lines, array, values, config, jobs_dir=None, timeout_s: float = 300,
                      exercise: str = SWEEP) -> bool:
    """Judge the sweep's lines and array spec, then run and gather the array where Slurm answers."""
    from ..lessons.slurm_jobs import SCRIPT_FIELDS, config_flags, gather_array, template

    _check_call(exercise, jobs_dir, timeout_s)
    if sweep_lines is ... or array is ...:
        raise Unsolved(f"… {exercise}: not yet solved: write sweep_lines and array.",
                       "one line of flags per learning rate; --array names the task ids.")
    sweep_lines = _as_list(sweep_lines)
    problem = sweep_problem(sweep_lines, array, values)
    folder = _text_then_cluster(exercise, problem, problem or f"{len(sweep_lines)} tasks read their lines",
                                "they were not run here", "ex62", jobs_dir)
    if folder is None:
        return True
    write_atomically(folder / "sweep.txt", lambda tmp: tmp.write_text("\n".join(sweep_lines) + "\n"), "Sweep file")
    shared = config_flags(config, skip=(*SCRIPT_FIELDS, "lr"))
    env = job_env(folder)  # WORKSHOP_RUNS: the tasks' results go to <folder>/wu-sweep-<array id>/
    job_id = submit(template("train_array.sbatch"), ["sweep.txt", *shared],
                    [f"--array={array.removeprefix('--array=')}", "--cpus-per-task=1", "--time=00:10:00",
                     "--output=%x-%A_%a.out"], cwd=folder, env=env)
    code = "import sys, workshop_utils as wu; print(wu.gather_array(*sys.argv[1:]).to_string(index=False))"
    gather = submit(None, options=[f"--dependency=afterok:{job_id}", "--job-name=ex62-gather", "--time=00:05:00",
                                   "--output=%x-%j.out", "--wrap=" + shlex.join(
                                       ["python", "-c", code, f"wu-sweep-{job_id}", f"wu-sweep-{job_id}/sweep.csv"])],
                    cwd=folder, env=env)
    wait_for([job_id, gather], timeout_s=timeout_s)
    table = folder / f"wu-sweep-{job_id}" / "sweep.csv"
    if not table.exists():
        raise NotYet(f"✗ {exercise}: the gather job {gather} wrote no {table.name}: a task of array {job_id} failed.",
                     f"read the tasks' output files in {folder}.")
    gathered = gather_array(table.parent)
    rates = sorted(float(v) for v in gathered["lr"]) if "lr" in gathered else []
    wanted = sorted(_learning_rates(values))
    if len(rates) != len(wanted) or not all(accepted(a, b) for a, b in zip(rates, wanted)):
        raise NotYet(f"✗ {exercise}: the gathered table holds learning rates {rates}, not {wanted}.",
                     f"read {table}.")
    return passed(exercise, f"array {job_id}: {len(gathered)} tasks, one per learning rate, gathered by job {gather}")
