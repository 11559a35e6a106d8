"""Exercise 6.1's simulated srun and torchrun: srun reads its options with Slurm's table, gets its step's cores
from the runner and starts its tasks on each node; torchrun reads its arguments with torchrun's own parser
(rebuilt from PyTorch's), meets the other agents through the runner and starts ``python -u -m MODULE ARGS``.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import sys

from . import job_script_standins as standins
from .answer_values import Problem
from .job_script_standins import Link, Loop, die_of, hostlist, say, status_code
from .slurm_rules import SRUN, getopt_long, megabytes, slurm_signal, time_limit_s

_KILLED = {"SIGKILL": "Killed", "SIGTERM": "Terminated"}  # how srun words a task's end by these signals


def srun(argv: list[str]) -> None:
    try:
        found, command = getopt_long(argv, SRUN)
    except Problem as problem:
        say(f"srun: {problem}\nTry \"srun --help\" for more information", 1)
    options = dict(found)
    link = Link("srun", options=options, command=command)
    job, config, names = os.environ.get("SLURM_JOB_ID"), link.config, link.config["nodes"]
    if not job:
        say("srun: error: no job allocation: SLURM_JOB_ID is not in the environment", 1)
    if not command:
        say("srun: fatal: No command given to execute.", 1)
    if "test-only" in options:
        say(f"srun: Job {job} to start at now using {config['cpus']} processors on nodes {names[0]} in partition "
            "cpu", 0)
    relative = options.get("relative")
    offset = 0 if relative is None else int(relative) if relative.isdigit() else -1
    if not 0 <= offset < len(names):
        say(f"srun: error: --relative={relative} is beyond the job's {len(names)} node(s)", 1)
    wanted = names if options.get("nodelist") is None else hostlist(options["nodelist"])
    if not set(wanted) <= set(names):
        say(f"srun: error: Requested node configuration is not available ({options['nodelist']} is not a node of "
            f"job {job})", 1)
    excluded = hostlist(options.get("exclude") or "")
    step_nodes = [k for k in range(offset, len(names)) if names[k] in wanted and names[k] not in excluded]
    numbers = {key: int(value) for key, value in options.items() if (value or "").isdigit()}
    asked = int(re.match(r"\d*", options["nodes"]).group() or 0) or None if options.get("nodes") else None
    if asked and asked > len(step_nodes):
        say(f"srun: error: Only allocated {len(step_nodes)} nodes asked for {asked}", 1)
    tasks = numbers.get("ntasks") or (numbers.get("ntasks-per-node") or 1) * (asked or len(step_nodes))
    if options.get("ntasks") is None and options.get("ntasks-per-node") is None and asked is None:
        tasks = int(os.environ.get("SLURM_NTASKS") or len(step_nodes))
    step_nodes = step_nodes[:asked or min(len(step_nodes), tasks)]
    per = -(-tasks // len(step_nodes)) if step_nodes else 0
    layout = [(k, t) for i, k in enumerate(step_nodes) for t in range(max(0, min(per, tasks - i * per)))]
    tres = re.search(r"cpu[=:](\d+)", options.get("tres-per-task") or "")
    cpt = int(numbers.get("cpus-per-task") or (tres and tres.group(1)) or os.environ.get("SRUN_CPUS_PER_TASK") or 1)
    need = {str(k): cpt * [node for node, _ in layout].count(k) for k in step_nodes}
    if any(n > config["cpus"] for n in need.values()) or not layout:
        say(f"srun: error: Unable to create step for job {job}: More processors requested than permitted", 1)
    limit = time_limit_s(options["time"]) if options.get("time") else None
    if options.get("time") and limit is None:
        say("srun: error: Invalid time limit specification", 1)
    link.send(op="step", cpus=need, overlap="overlap" in options)
    reply = link.wait("step")
    if reply["busy"]:
        say(f"srun: Job {job} step creation temporarily disabled, retrying (Requested nodes are busy)")
        link.wait("granted")
    env = _task_env(options, reply["step"], names, step_nodes, layout, cpt)
    _run_step(link, options, command, env, layout, names, None if limit == float("inf") else limit)


def _task_env(options: dict, step: int, names, step_nodes, layout, cpt) -> dict:
    """The tasks' environment: srun's own (--export=ALL), none of it (NONE) or the variables named, then Slurm's."""
    mode = (options.get("export") or "ALL").split(",")
    env = {k: v for k, v in os.environ.items() if mode[0].upper() == "ALL" or k.startswith("SLURM")}
    for item in mode:
        name, equals, value = item.partition("=")
        if equals:
            env[name] = value
        elif name in os.environ and name.upper() not in ("ALL", "NONE"):
            env[name] = os.environ[name]
    env.update(SLURM_STEP_ID=str(step), SLURM_STEPID=str(step), SLURM_STEP_NUM_NODES=str(len(step_nodes)),
               SLURM_STEP_NUM_TASKS=str(len(layout)), SLURM_STEP_NODELIST=",".join(names[k] for k in step_nodes),
               SLURM_CPUS_PER_TASK=str(cpt), JOBSIM_CPUS=str(cpt))
    mem = megabytes(options.get("mem")) or (megabytes(options.get("mem-per-cpu")) or 0) * cpt
    if mem:
        env["JOBSIM_MEM_MB"] = str(mem)
    return env


def _run_step(link: Link, options: dict, command: list[str], env: dict, layout, names, limit) -> None:
    loop, tasks, codes, config = Loop(link), {}, {}, link.config
    warning = slurm_signal(options.get("signal"))  # srun --signal: the step's tasks are warned before its end
    end = min(config["end"], config["now"] + limit) if limit else config["end"]

    def start(node: int):
        for rank, (k, local) in enumerate(layout):
            if k == node:
                pid = os.fork()
                if pid == 0:
                    task_env = dict(env, SLURM_PROCID=str(rank), SLURM_LOCALID=str(local), SLURM_NODEID=str(k),
                                    SLURMD_NODENAME=names[k], JOBSIM_NODE=str(k))
                    _exec_task(options, command, task_env, rank, names[k])
                tasks[pid] = (rank, k)
        link.send(op="tasks", pids={str(pid): k for pid, (_, k) in tasks.items()})

    def on_message(message):
        tag = message.get("tag", "")
        if tag.startswith("node "):
            start(int(tag.split()[1]))
        elif tag == "limit":
            say(f"slurmstepd: error: *** STEP {env['SLURM_JOB_ID']}.{env['SLURM_STEP_ID']} ON {names[layout[0][0]]} "
                "CANCELLED DUE TO TIME LIMIT ***")
            signal_tasks(signal.SIGTERM)
            link.send(op="timer", s=config["kill_wait"], tag="kill")
        elif tag in ("kill", "warn"):
            signal_tasks(signal.SIGKILL if tag == "kill" else warning.signal)

    def signal_tasks(number):
        for pid in tasks:
            if pid not in codes:
                with contextlib.suppress(OSError):
                    os.killpg(pid, number)

    def on_child(pid, status):
        if pid not in tasks:
            return
        codes[pid] = status_code(status)
        rank, k = tasks[pid]
        if codes[pid]:
            name = "" if os.WIFEXITED(status) else signal.Signals(os.WTERMSIG(status)).name
            how = _KILLED.get(name, name) if name else f"Exited with exit code {codes[pid]}"
            say(f"srun: error: {names[k]}: task {rank}: {how}")
        with contextlib.suppress(OSError):
            os.killpg(pid, signal.SIGKILL)  # what the task leaves behind ends with it, as slurmstepd does
        if len(codes) == len(layout):
            link.send(op="step_end", codes=list(codes.values()))
            sys.exit(max(codes.values()))

    if limit:
        link.send(op="timer", at=end, tag="limit")
    if warning:
        link.send(op="timer", at=end - warning.lead_s, tag="warn")
    first = layout[0][0]
    start(first)
    for k in sorted({k for k, _ in layout} - {first}):
        link.send(op="timer", s=config["skew"] * k, tag=f"node {k}")
    loop.run(on_message, signal_tasks, on_child)


def _exec_task(options: dict, command: list[str], env: dict, rank: int, node: str) -> None:
    """In the forked task: its process group, output and program, as slurmstepd sets them up."""
    try:
        os.setpgid(0, 0)
        if options.get("chdir"):
            os.chdir(options["chdir"])
        for fd, key in ((1, "output"), (2, "error")):
            if options.get(key):
                path = re.sub(r"%[jJ]", env["SLURM_JOB_ID"], options[key]).replace("%t", str(rank)).replace("%N", node)
                os.dup2(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644), fd)
        program = command[0]
        if "multi-prog" in options and not os.path.exists(program):
            say(f"srun: error: Unable to open configuration file {program}")
            os._exit(1)
        found = shutil.which(program, path=env.get("PATH", "/bin:/usr/bin"))
        base = os.path.basename(found or program)
        simulated = base == "torchrun" or re.fullmatch(r"python[0-9.]*", base)  # the cluster's, wherever they are:
        if found is None and not (simulated and "/" in program):                 # the simulation's, if srun finds them
            raise FileNotFoundError(2, "No such file or directory")
        if simulated:
            found = os.path.join(standins.SIM, "bin", "torchrun" if base == "torchrun" else "python3")
        os.execve(found, command, env)
    except OSError as err:
        say(f"slurmstepd: error: execve(): {command[0]}: {err.strerror}")
        os._exit(2)


def _sim(key: str):
    """One entry of sim.json, which ``job_script_run`` writes for the simulated programs."""
    with open(os.path.join(standins.SIM, "sim.json")) as file:
        return json.load(file)[key]


def _torch(name: str) -> dict:
    """The globals of one of ``job_script.torch_modules``, run from its file: importing PyTorch would take seconds."""
    import runpy

    return runpy.run_path(_sim("torch")[name])


def _torchrun_parser():
    """torchrun's own parser, rebuilt from its options as the check read them from PyTorch, with its actions."""
    import argparse

    actions = _torch("argparse_util")
    parser = argparse.ArgumentParser(prog="torchrun")
    for option in _sim("torchrun"):
        kind, flags, dest = option["kind"], option["flags"], option["dest"]
        type_ = {"int": int, "float": float}.get(option["type"], str)
        if kind in ("check_env", "store_true"):
            parser.add_argument(*flags, dest=dest, action=actions["check_env"] if kind == "check_env" else kind)
        elif kind == "remainder":
            parser.add_argument(dest, nargs=argparse.REMAINDER)
        elif flags:
            parser.add_argument(*flags, dest=dest, type=type_, default=option["default"], choices=option["choices"],
                                **({"action": actions["env"]} if kind == "env" else {}))
        else:
            parser.add_argument(dest, type=type_)
    return parser


def _launch_config(args, cores: int) -> dict:
    """What torchrun's config_from_args makes of its arguments; ValueError or RuntimeError where it stops."""
    import uuid

    parts = args.nnodes.split(":")
    implicit = args.standalone or (args.rdzv_backend == "static" and not args.rdzv_endpoint and
                                   args.master_port is None and parts[-1].strip() == "1")
    if implicit:  # torchrun's own choice: one node meets on its own localhost, at a port the system picks
        args.rdzv_backend, args.rdzv_endpoint, args.rdzv_id = "c10d", "localhost:0", str(uuid.uuid4())
    args.master_port = 29500 if args.master_port is None else args.master_port
    if len(parts) > 2:
        raise RuntimeError(f'nnodes={args.nnodes} is not in "MIN:MAX" format')
    low, high = int(parts[0]), int(parts[-1])
    if not 0 < low <= high:
        raise AssertionError(f"min_nodes must be > 0 and <= max_nodes, got min_nodes={low}, max_nodes={high}")
    if args.nproc_per_node == "gpu":  # no GPU is visible to a job that asked for none
        raise ValueError("Cuda is not available.")
    try:
        nproc = cores if args.nproc_per_node in ("cpu", "auto") else int(args.nproc_per_node)
    except ValueError:
        raise ValueError(f"Unsupported nproc_per_node value: {args.nproc_per_node}") from None
    rendezvous = _torch("rendezvous_utils")
    conf = rendezvous["_parse_rendezvous_config"](args.rdzv_conf)
    static = args.rdzv_backend == "static"
    endpoint = f"{args.master_addr}:{args.master_port}" if static and not args.rdzv_endpoint else args.rdzv_endpoint
    host, port = rendezvous["parse_rendezvous_endpoint"](endpoint, 29500 if static else 29400)
    if args.no_python and args.module:
        raise ValueError("Don't use both the '--no-python' flag and the '--module' flag at the same time.")
    return dict(backend=args.rdzv_backend, host=host, port=port, run_id=args.rdzv_id, min=low, max=high,
                nproc=nproc, node_rank=args.node_rank if static else None, conf=conf, local_addr=args.local_addr,
                implicit=implicit)


def torchrun(argv: list[str]) -> None:
    import subprocess

    link = Link("torchrun")
    args = _torchrun_parser().parse_args(argv)  # argparse's usage and error, exit 2, as torchrun's own parser
    config, cores = link.config, int(os.environ.get("JOBSIM_CPUS") or 1)
    try:
        launch = _launch_config(args, cores)
    except (ValueError, RuntimeError, AssertionError) as err:
        link.send(op="note", what="torchrun_error", error=f"{type(err).__name__}: {err}")
        say(f"{type(err).__name__}: {err}", 1)
    link.send(op="note", what="launch", **launch, module=args.module, script=args.training_script,
              script_args=args.training_script_args, no_python=args.no_python, run_path=args.run_path)
    link.send(op="rdzv", **launch)
    round_ = link.wait("round")
    if round_.get("error"):
        say(round_["error"], 1)
    env = dict(os.environ)
    if "OMP_NUM_THREADS" not in env and launch["nproc"] > 1:
        say("*****************************************\nSetting OMP_NUM_THREADS environment variable for each "
            "process to be 1 in default, to avoid your system being overloaded, please further tune the variable "
            "for optimal performance in your application as needed. \n*****************************************")
        env["OMP_NUM_THREADS"] = "1"
    python = config["python"]
    if args.run_path:
        command = [python, "-u", "-c", "import runpy, sys; sys.argv.pop(0); runpy.run_path(sys.argv[0], "
                   "run_name='__main__')", args.training_script]
    elif args.no_python:
        command = [args.training_script]
    else:
        command = [python, "-u", *(["-m"] if args.module else []), args.training_script]
    command += args.training_script_args
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [os.path.join(standins.SIM, "fake"), env.get("PYTHONPATH")]))
    found = shutil.which(command[0], path=env.get("PATH", "/bin:/usr/bin"))
    program = python if command[0] == python else found or command[0]
    workers = {}
    for local in range(min(launch["nproc"], config["max_workers"])):
        rank = round_["rank_offset"] + local
        worker_env = dict(env, LOCAL_RANK=str(local), RANK=str(rank), GROUP_RANK=str(round_["group_rank"]),
                          ROLE_RANK=str(rank), ROLE_NAME="default", LOCAL_WORLD_SIZE=str(launch["nproc"]),
                          WORLD_SIZE=str(round_["world"]), GROUP_WORLD_SIZE=str(round_["groups"]),
                          ROLE_WORLD_SIZE=str(round_["world"]), MASTER_ADDR=round_["master_addr"],
                          MASTER_PORT=str(round_["master_port"]), TORCHELASTIC_RESTART_COUNT="0",
                          TORCHELASTIC_MAX_RESTARTS=str(args.max_restarts), TORCHELASTIC_RUN_ID=str(launch["run_id"]))
        try:
            workers[subprocess.Popen(command, executable=program, env=worker_env).pid] = rank
        except OSError as err:
            say(f"torchrun: {command[0]}: {err.strerror}", 1)
    _watch_workers(link, workers, args.training_script)


def _watch_workers(link: Link, workers: dict, script: str) -> None:
    """torchrun's agent after the start: it ends when every worker has; a failed one takes the others down."""
    loop, ended, failed = Loop(link), {}, []

    def on_signal(number):
        if number in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT):  # torchrun's signals_to_handle
            link.send(op="note", what="signal", role="torchrun", signal=signal.Signals(number).name)
            for pid in set(workers) - set(ended):
                os.kill(pid, number)
            failed.append(number)
        else:
            die_of(link, number, "torchrun")

    def on_child(pid, status):
        if pid not in workers:
            return
        ended[pid] = status_code(status)
        if ended[pid] and not failed:
            failed.append(pid)
            say(f"torch.distributed.elastic.multiprocessing.errors.ChildFailedError: {script} FAILED: rank "
                f"{workers[pid]} (pid {pid}) exited with code {ended[pid]}")
            for other in set(workers) - set(ended):
                os.kill(other, signal.SIGTERM)
        if len(ended) == len(workers):
            sys.exit(1 if failed else 0)

    loop.run(lambda message: None, on_signal, on_child)


def python(argv: list[str]) -> None:
    """python with -m torch.distributed.run is torchrun; anything else runs in the real interpreter."""
    i = 0
    while i < len(argv) and argv[i].startswith("-") and argv[i] not in ("-", "-c") and not argv[i].startswith("-m"):
        i += 2 if argv[i] in ("-X", "-W") else 1
    option = argv[i] if i < len(argv) else ""
    module = option[2:] or "".join(argv[i + 1:i + 2])  # -mMODULE or -m MODULE
    if option.startswith("-m") and module == "torch.distributed.run":
        return torchrun(argv[i + (1 if option[2:] else 2):])
    os.execv(_sim("python"), [sys.argv[0], *argv])


def main(sim: str) -> None:
    """srun, torchrun or python, by the name this file was started under."""
    standins.SIM = sim
    name = os.path.basename(sys.argv[0])
    {"srun": srun, "torchrun": torchrun, "python": python, "python3": python}[name](sys.argv[1:])
