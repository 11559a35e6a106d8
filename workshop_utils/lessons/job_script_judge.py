"""Exercise 6.1's judge of a job script's text: the first mistake it shows against the exercise's own
specification (``JOB_SPEC``), as "problem. Fix: hint". The resources, the time limit and the warning signal,
the launch (srun starting torchrun on every node with the job's cores, one thread per process), and the
rendezvous (job_script_rendezvous), as bash would expand them and torchrun would read them.
"""

from __future__ import annotations

import math
import re
import signal as signals

from .answer_values import Problem, show
from .bash_expansion import literal, render
from .job_script import (COMMAND_PREFIXES, JOB_SPEC, JobRequest, JobSpec, Launch, Refusal, node_text, read_job_script,
                         torchrun_args)
from .job_script_forward import forward_problem, signal_name
from .job_script_rendezvous import rendezvous_problem
from .job_script_text import syntax_problem, text_problem
from .slurm_rules import NO_LIMIT, SIGNAL_EARLY_S, slurm_signal, time_limit_s, whole

NO_LAUNCH = ("no torchrun line: the job would start nothing (torchrun, or python -m torch.distributed.run, with srun "
             "in front). Fix: keep the launch line of the template.")


def _n(count: int, noun: str) -> str:
    return f"one {noun}" if count == 1 else f"{count} {noun}s"


# ---------------------------------------------------------------------------------------------- the request


def _launch_problem(job: JobRequest, launch: Launch, spec: JobSpec) -> str | None:
    """srun in front of torchrun, where the exercise needs it on every node."""
    if launch.srun_refusal:
        return (f"srun would refuse its options: {show(launch.srun_refusal, 100)}. Fix: srun "
                "--cpus-per-task=\"$SLURM_CPUS_PER_TASK\" torchrun ..., as in the template.")
    if launch.srun is None and spec.every_node:
        return (f"{launch.launcher} is started without srun: the batch shell runs on the job's first node only, so "
                "with --nodes=2 (the notebook: only #SBATCH --nodes changes) the second node would start no agent "
                "and the rendezvous would wait for it until it times out. Fix: srun "
                f"--cpus-per-task=\"$SLURM_CPUS_PER_TASK\" {launch.launcher} ..., as in the template.")
    if "timeout" in launch.wrappers:
        return ("timeout on the launch line ends training on a clock of its own, before the job's time limit and its "
                "warning, so no checkpoint is written. Fix: leave timeout out: #SBATCH --time limits the job.")
    for name, value in (launch.srun or {}).items():
        why = _SRUN_BREAKS.get(name)
        if name == "--export" and value is not None and (literal(job.shell.decode(value)) or "ALL").split(",")[0] \
                .upper() != "ALL":
            why = "starts torchrun without the batch shell's environment (its PATH among it): torchrun is not found"
        if why:
            shown = f"{name}={show(render(job.shell.decode(value)))}" if value is not None else name
            return (f"srun {shown} on the launch line {why}. Fix: srun --cpus-per-task=\"$SLURM_CPUS_PER_TASK\" "
                    "torchrun ..., as in the template.")
    for nodes in (job.nodes[0], 2) if spec.every_node else (job.nodes[0],):
        value = (launch.srun or {}).get("--ntasks")
        count = whole(_on_nodes(job, job.shell.decode(value), nodes) or "") if value is not None else None
        if value is not None and count is not None and count != nodes * spec.tasks_per_node:
            return (f"srun --ntasks={show(render(job.shell.decode(value)))} starts {count} torchrun agent(s) in a job "
                    f"of {_n(nodes, 'node')}: every node needs exactly one. Fix: leave --ntasks out (srun starts "
                    "the job's tasks, one per node), or --ntasks=\"$SLURM_JOB_NUM_NODES\".")
    return None


# srun options that change where or how the launch runs, and what each does to it.
_SRUN_BREAKS = {
    "--nodelist": "ties the step to named nodes: with --nodes=2 the other node starts no agent",
    "--exclude": "leaves nodes of the job out: their agents never start",
    "--relative": "starts the step at a node other than the job's first, which srun refuses on one node",
    "--test-only": "only estimates when the step would start: nothing runs",
    "--multi-prog": "reads the first word after the options as a configuration file, not as the program to run",
    "--time": "gives the step its own time limit, one the warning was not planned on",
    "--mem": "gives the step its own memory limit, one the processes may not fit",
    "--mem-per-cpu": "gives the step its own memory limit, one the processes may not fit",
    "--immediate": "gives up when the step's resources are not free at once",
    "--signal": "makes Slurm signal the step's tasks, the torchrun agents, which SIGUSR1 ends",
}


_NODE_COUNTS = ("SLURM_JOB_NUM_NODES", "SLURM_NNODES")
_TASK_COUNTS = ("SLURM_NTASKS", "SLURM_NPROCS")


def _on_nodes(job: JobRequest, parts: list, nodes: int) -> str | None:
    """The parts' text in a job of ``nodes`` nodes (Slurm's node and task counts filled in); None if unknown."""
    tasks = whole(job.directives.ntasks) if job.directives.ntasks is not None else nodes * job.tasks_per_node
    filled = [str(nodes) if p in [("var", v) for v in _NODE_COUNTS] else
              str(tasks) if p in [("var", v) for v in _TASK_COUNTS] else p for p in parts]
    return literal(filled)


def _node_count_problem(job: JobRequest, args, launch: Launch, spec: JobSpec) -> str | None:
    """torchrun's --nnodes (and srun's --nodes) in this job, and in the same script run with --nodes=2."""
    fix = "Fix: --nnodes=\"$SLURM_JOB_NUM_NODES\", Slurm's count of the job's nodes."
    low = job.nodes[0]
    parts = job.shell.decode(args.nnodes)
    shown = show(render(parts))
    for nodes in (low, 2) if spec.every_node else (low,):
        text = _on_nodes(job, parts, nodes)
        first, _, last = (text or "").partition(":")
        least, most = whole(first.strip()), whole(last.strip()) if last else whole(first.strip())
        if text is None or least is None or most is None:
            return f"--nnodes={shown} is not a count of nodes the check can read before the job runs. {fix}"
        if not least <= nodes <= most:
            if nodes == low:
                return (f"--nnodes={shown}: torchrun would wait for that many nodes to join, and the job has "
                        f"{_n(low, 'node')}. {fix}")
            return (f"--nnodes={shown}: right for {_n(low, 'node')}, but the same script must train on two nodes "
                    "with only #SBATCH --nodes changed (the notebook), and there torchrun would still take "
                    f"{_n(most, 'node')}: the other node's agent could not join the rendezvous. {fix}")
        step = (launch.srun or {}).get("--nodes")
        if step is not None and _on_nodes(job, job.shell.decode(step), nodes) != str(nodes):
            return (f"srun --nodes={show(render(job.shell.decode(step)))}: the step must span the job's own nodes "
                    f"({_n(nodes, 'node')} with --nodes={nodes}); srun cannot take more than the job holds, and "
                    "fewer would leave a node without its agent. Fix: leave srun's --nodes out.")
    return None


def _step_cpus(job: JobRequest, launch: Launch) -> tuple[str | None, bool]:
    """(srun's cores per task as written, whether any reach it): --cpus-per-task, a cpu= in --tres-per-task,
    or SRUN_CPUS_PER_TASK exported (which srun reads from 22.05 to 23.02, where it ignores SLURM_CPUS_PER_TASK)."""
    srun = launch.srun or {}
    if srun.get("--cpus-per-task") is not None:
        return srun["--cpus-per-task"], True
    tres = re.search(r"(?:^|,)cpu[=:](\d+)", literal(job.shell.decode(srun.get("--tres-per-task") or "")) or "")
    if tres:
        return tres.group(1), True
    return None, "SRUN_CPUS_PER_TASK" in job.shell.exported or "SRUN_CPUS_PER_TASK" in launch.env


def _request_problem(job: JobRequest, args, launch: Launch, spec: JobSpec) -> str | None:
    """Nodes, tasks, processes and cores against the exercise's."""
    low, high = job.nodes
    if (low, high) != (spec.nodes, spec.nodes):
        return (f"--nodes={node_text(job)}: the exercise asks for {_n(spec.nodes, 'node')}, with "
                f"{spec.procs_per_node} training processes on it. Fix: --nodes={spec.nodes}.")
    problem = _launch_problem(job, launch, spec)
    if problem:
        return problem
    tasks, tasks_flag = job.tasks_per_node, "--ntasks-per-node"
    for flag in ("--ntasks-per-node", "--ntasks"):  # srun's own count wins over the #SBATCH line's
        value = (launch.srun or {}).get(flag)
        if value is not None:
            number = whole(_on_nodes(job, job.shell.decode(value), low) or "")
            if number is None or number < 1:
                return (f"srun {flag}={show(render(job.shell.decode(value)))} is not a count the check can read. "
                        "Fix: leave it out: srun starts the job's tasks, one per node.")
            tasks, tasks_flag = (number if flag == "--ntasks-per-node" else math.ceil(number / low)), f"srun {flag}"
            break
    nproc_text = literal(job.shell.decode(args.nproc_per_node))
    if nproc_text in ("auto", "cpu", "gpu"):
        per = "GPU" if nproc_text == "gpu" else "core (or GPU)"
        return (f"--nproc-per-node={nproc_text}: torchrun would start one process per {per} of the node, not the "
                f"{spec.procs_per_node} the exercise asks for. Fix: --nproc-per-node={spec.procs_per_node}.")
    nproc = whole(nproc_text)
    if nproc is None or nproc < 1:
        return (f"--nproc-per-node={show(render(job.shell.decode(args.nproc_per_node)))} is not a number of "
                f"processes the check can read before the job runs. Fix: --nproc-per-node={spec.procs_per_node}.")
    if tasks != spec.tasks_per_node:
        if nproc > 1:
            return (f"{tasks_flag}={tasks} and --nproc-per-node={nproc}: srun starts {tasks} torchruns on each node "
                    f"and each starts {nproc} processes, {tasks * nproc} per node, {tasks} times too many. Fix: "
                    "--ntasks-per-node=1 (the one task is torchrun) and --nproc-per-node the processes per node.")
        return (f"{tasks_flag}={tasks} and --nproc-per-node={nproc}: srun starts {tasks} torchrun agents on the "
                f"node, each with {_n(nproc, 'process')} and each taken for a node of its own by the rendezvous: "
                f"{tasks} agents for one node. Fix: --ntasks-per-node=1 (the one task is torchrun) and "
                f"--nproc-per-node={spec.procs_per_node}.")
    if nproc != spec.procs_per_node:
        return (f"--nproc-per-node={nproc}: torchrun starts {nproc} training process(es) on the node, not the "
                f"{spec.procs_per_node} the exercise asks for. Fix: --nproc-per-node={spec.procs_per_node}.")
    problem = _node_count_problem(job, args, launch, spec)
    if problem:
        return problem
    cpus = job.cpus_per_task
    step, reaches = _step_cpus(job, launch)
    step_cpus = whole(literal(job.shell.decode(step))) if step is not None else None
    if step_cpus is not None and step_cpus != cpus:
        return (f"srun --cpus-per-task={step_cpus} for a job with --cpus-per-task={cpus}: the launch would ask for "
                "other cores than the job holds. Fix: srun --cpus-per-task=\"$SLURM_CPUS_PER_TASK\".")
    problem = _threads_problem(job, nproc, cpus, spec)
    if problem:
        return problem
    need = nproc * spec.cores_per_proc
    if cpus < need:
        given = "" if job.directives.cpus_per_task is not None else " (sbatch's default without --cpus-per-task)"
        return (f"--cpus-per-task={cpus}{given} for {nproc} training processes: they would take turns on {cpus} "
                f"core(s). Fix: --cpus-per-task of at least {nproc} (one core per process here).")
    if cpus > need:
        return (f"--cpus-per-task={cpus} for {nproc} training processes of one thread each (OMP_NUM_THREADS=1): "
                f"{cpus - need} core(s) would sit idle, held from everyone else. Fix: --cpus-per-task={need}, "
                "one core per process.")
    if launch.srun is not None and not reaches and cpus > 1:
        return (f"srun starts torchrun without --cpus-per-task: Slurm 22.05 to 23.02 do not pass the job's "
                f"--cpus-per-task on to srun, so there its one task gets one core and the {nproc} training processes "
                "(and their DataLoader workers) take turns on it. Fix: srun --cpus-per-task=\"$SLURM_CPUS_PER_TASK\" "
                "torchrun ..., as in the template, which every Slurm reads alike.")
    return None


def _threads_problem(job: JobRequest, nproc: int, cpus: int, spec: JobSpec) -> str | None:
    """OMP_NUM_THREADS as the training processes get it (exported, or set on the launch line, srun's --export
    included; torchrun sets 1 only where it is unset) against the exercise's one thread per process."""
    word = job.shell.assigned.get("OMP_NUM_THREADS") if "OMP_NUM_THREADS" in job.shell.exported else None
    launch_words = job.ran[job.launched_at].words if 0 <= job.launched_at < len(job.ran) else []
    for text in launch_words:
        found = re.search(r"(?:^|[=,])OMP_NUM_THREADS=([^,\s]*)", text)
        word = found.group(1) if found else word
    value = literal(job.shell.parts(word)) if word is not None else None
    counts = re.fullmatch(r"\s*(\d+)(?:,\d+)*\s*", value or "")
    if counts is None:
        return None  # unset (torchrun sets 1), or known only when the job runs
    threads, fix = int(counts.group(1)), "Fix: export OMP_NUM_THREADS=1, one thread per process, as the template does."
    if threads == 0:
        return (f"OMP_NUM_THREADS={value.strip()} is no thread count: OpenMP ignores it and starts a thread per "
                f"core. {fix}")
    if threads != spec.cores_per_proc:
        crowd = (f": {threads * nproc} threads would take turns on them, each process slowed by the others"
                 if threads * nproc > cpus else "")
        return (f"OMP_NUM_THREADS={value.strip()} for {nproc} training processes on {cpus} core(s), where the exercise "
                f"gives each process one core and one thread{crowd}. {fix}")
    return None


def _time_problem(job: JobRequest, spec: JobSpec) -> str | None:
    """--time and --signal against the exercise's: the limit fits the work and the warning, which the batch
    shell receives in time to pass on."""
    text = job.directives.time
    if text is None:
        return ("no --time: the job would get the partition's default limit, perhaps shorter than it needs, perhaps "
                "far longer than it asks for. Fix: --time with the work and the warning's lead, e.g. 00:05:00.")
    if text == "":
        return ("--time= is empty, which sbatch refuses (\"Invalid --time specification\") before it queues "
                "anything. Fix: --time with the work and the warning's lead, e.g. 00:05:00.")
    limit = time_limit_s(text)
    if limit is None:
        return (f"--time={show(text)} is not a duration Slurm reads. Fix: minutes (5), MM:SS, HH:MM:SS (00:05:00), "
                "D-HH, D-HH:MM or D-HH:MM:SS.")
    if limit == NO_LIMIT:
        return (f"--time={show(text)} asks for no time limit: the job gets the partition's longest, waits longer "
                "for a slot, and its warning comes only then. Fix: a limit the job fits into, e.g. 00:05:00.")
    flag = job.directives.signal
    if flag is None or flag == "":
        empty = "--signal= is empty, which sbatch refuses (\"Invalid --signal specification\"); and with " if (
            flag == "") else ""
        return (f"{empty}no --signal: when the time limit comes, Slurm ends the job without warning and the steps "
                "since the last checkpoint are lost. Fix: #SBATCH --signal=B:USR1@60 sends SIGUSR1 to the script 60 s "
                "before the end; its trap passes it on and the training loop checkpoints and stops.")
    warning = slurm_signal(flag)
    if warning is None:
        return (f"--signal={show(flag)} is not a signal option sbatch reads ([B:]SIGNAL[@SECONDS]). Fix: "
                "--signal=B:USR1@SECONDS, SECONDS the warning's lead time.")
    if warning.signal != int(getattr(signals, "SIG" + spec.warning)):
        return (f"--signal={show(flag)} sends {signal_name(warning.signal)}: the trap and the training loop "
                f"listen for SIG{spec.warning}. Fix: --signal=B:{spec.warning}@SECONDS, SECONDS the warning's lead "
                "time.")
    if not warning.to_batch_shell:
        return (f"--signal={show(flag)} has no B:, so Slurm sends SIG{spec.warning} to the job's steps (the tasks "
                "srun started), not to the batch shell: the script's trap never fires. Fix: "
                f"--signal=B:{spec.warning}@{warning.lead_s}.")
    lead = warning.lead_s
    if lead < spec.min_lead_s:
        return (f"--signal gives {lead} s of warning: too little to write a checkpoint on a busy file system. Fix: "
                f"at least {spec.min_lead_s} s, a minute to be safe (B:{spec.warning}@60).")
    # sbatch may send the signal up to 60 s before the time asked for (its manual): that minute counts too.
    if limit < spec.needed_s + lead + SIGNAL_EARLY_S:
        return (f"--time of {limit:g} s: the job needs about {spec.needed_s} s, and the warning comes {lead} s before "
                f"the end, up to {SIGNAL_EARLY_S} s earlier still (sbatch's resolution), so it could run out of time. "
                f"Fix: {_longer(spec, lead)}.")
    if limit > spec.max_time_s:
        return (f"--time={show(text)} asks for {limit / 3600:g} h for about {spec.needed_s // 60} minutes of work: "
                "a long request waits longer for its slot and holds what it does not use. Fix: the work and the "
                "warning's lead, with some room: e.g. 00:05:00.")
    return None


def _longer(spec: JobSpec, lead: int) -> str:
    """The fix for a limit the warning's lead leaves too short: a longer limit, or a shorter lead."""
    need = spec.needed_s + lead + SIGNAL_EARLY_S
    minutes = math.ceil(need / 60)
    example = f"{minutes // 60:02d}:{minutes % 60:02d}:00"
    if need > spec.max_time_s:
        return (f"a warning of a minute or two (B:{spec.warning}@60): a {lead} s lead would need a limit of {need} s, "
                "far more than the work")
    shorter = f", or a shorter warning (B:{spec.warning}@60)" if lead > 2 * spec.min_lead_s * 2 else ""
    return f"at least {need} s, e.g. {example}{shorter}"


def _command_word(fields: list[str]) -> str:
    words = [w for w in fields if w not in COMMAND_PREFIXES]
    return words[0] if words else ""


def _job_problem(job: JobRequest, spec: JobSpec) -> str | None:
    if not job.launches:
        return NO_LAUNCH
    if len(job.launches) > 1:
        return (f"the script starts torchrun {len(job.launches)} times: the job would train {len(job.launches)} "
                "times over. Fix: one launch line, as in the template.")
    launch = job.launches[0]
    try:
        args = torchrun_args(launch.args)
    except Refusal as err:
        return (f"torchrun would refuse its arguments: {show(job.shell.readable(str(err)), 100)}. Fix: keep the options of the "
                "template's launch line.")
    problem = _request_problem(job, args, launch, spec) or _time_problem(job, spec) or rendezvous_problem(
        job, args, spec)
    if problem:
        return problem
    script = literal(job.shell.decode(args.training_script))
    if not args.module or script != "workshop_utils.train":
        return (f"the launch line runs {show(render(job.shell.decode(args.training_script)))}, not the training "
                "(-m workshop_utils.train). Fix: -m workshop_utils.train \"$@\" at its end, as in the template.")
    if not any(("var", "@") in job.shell.decode(a) for a in args.training_script_args):
        return ("the launch line does not pass \"$@\" on: the check's training flags (steps, checkpoints) would never "
                "reach the training. Fix: keep \"$@\" at the end of the launch line.")
    return forward_problem(job, launch, spec)


def script_problem(script: str, spec: JobSpec = JOB_SPEC) -> str | None:
    """The first mistake the script's text shows against the exercise (``spec``), as "problem. Fix: ...";
    None when the text is right."""
    problem = text_problem(script) if isinstance(script, str) else None
    if problem:
        return problem
    try:
        job = read_job_script(script, spec)
        problem = syntax_problem(script) or _job_problem(job, spec)
        return job.shell.readable(problem) if problem else None  # no encoded word reaches a message
    except Problem as problem:
        return str(problem)
    except RecursionError:
        return ("the script nests its quotes and substitutions deeper than the check follows. Fix: the launch line "
                "of the template, its gaps filled.")
