"""Exercise 6.1's simulated job, the check's side: a folder with the script, the stand-ins on ``PATH`` and a fake
``workshop_utils.train``, run by ``job_script_runner`` as PID 1 of new PID and mount namespaces (whatever the
script kills or deletes stays inside), in the environment sbatch and slurmd give a batch shell. What happened
comes back as an ``Outcome``.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

# The job's own modules, imported here and so compiled: the job sees their folder read-only.
from . import job_script_launch, job_script_runner, job_script_standins
from .job_script import TRAINING, torch_modules, torchrun_options
from .job_script_standins import PROGRAMS
from .slurm_rules import whole

KIT = str(Path(__file__).resolve().parents[2])
STANDINS = ("srun", "torchrun", "python", "python3", *PROGRAMS)
NODE_NAMES = ("gpu-a017", "gpu-a018")
SUBMIT_HOST = "login01"  # sbatch passes the submitting shell's environment on, HOSTNAME among it
MOST_PROCESSES = 400  # a job of the exercise runs about 30 at once; more, and the runner ends it as a fork bomb
MACHINE_SLEEP_S = 10  # a sleep on the machine's clock (/bin/sleep) the check waits for; a longer one it refuses


@dataclasses.dataclass(frozen=True)
class JobRun:
    """One simulated run: the job the #SBATCH lines ask for (``options``: sbatch's reading), on ``nodes`` nodes."""

    options: dict
    time_s: int
    warning: tuple | None  # (signal number, lead in seconds, to the batch shell alone)
    nodes: int = 1
    job_id: int = 1000
    python: str = "python3"  # what torchrun's processes are called (a pattern must find python3.11 too)
    fail: bool = False  # the training fails at its start: the batch shell must then end
    random: int | None = None  # what bash's $RANDOM gives in this run (every bash reads BASH_ENV: it fixes it)


@dataclasses.dataclass
class Outcome:
    reason: str  # batch_end, time_limit, spinning, wall_limit, runaway, machine_sleep
    events: list  # each with the job's clock (t, in seconds)
    log: str
    run: JobRun

    def of(self, what: str, **where) -> list[dict]:
        return [e for e in self.events if e["what"] == what and all(e.get(k) == v for k, v in where.items())]


def job_environment(run: JobRun, work: str, bin_dir: str) -> dict:
    """What slurmd gives a batch shell: the submitting shell's environment (a plain one here) and Slurm's."""
    nodes, options = run.nodes, run.options
    names = NODE_NAMES[:nodes]
    # before any run the check refuses --ntasks and a count that is not a whole number above 0
    per_node = whole(options.get("ntasks-per-node"))
    ntasks = per_node * nodes if per_node else None
    cpt = whole(options.get("cpus-per-task"))
    cpus = (cpt or 1) * (per_node or 1)
    listed = names[0] if nodes == 1 else f"gpu-a[017-{17 + nodes - 1:03d}]"
    env = dict(PATH=f"{bin_dir}:{os.environ.get('PATH', '/usr/bin:/bin')}", HOME=work, USER="attendee",
               LOGNAME="attendee", LANG="C.UTF-8", SHELL="/bin/bash", HOSTNAME=SUBMIT_HOST, TMPDIR=work,
               SLURM_JOB_ID=str(run.job_id), SLURM_JOBID=str(run.job_id),
               SLURM_JOB_NAME=options.get("job-name") or "job.sbatch", SLURM_JOB_NODELIST=listed,
               SLURM_NODELIST=listed, SLURM_JOB_NUM_NODES=str(nodes), SLURM_NNODES=str(nodes), SLURM_NODEID="0",
               SLURMD_NODENAME=names[0], SLURM_PROCID="0", SLURM_LOCALID="0", SLURM_CPUS_ON_NODE=str(cpus),
               SLURM_JOB_CPUS_PER_NODE=f"{cpus}(x{nodes})" if nodes > 1 else str(cpus),
               SLURM_TASKS_PER_NODE=f"{per_node or 1}(x{nodes})" if nodes > 1 else str(per_node or 1),
               SLURM_SUBMIT_DIR=work, SLURM_SUBMIT_HOST=SUBMIT_HOST, SLURM_CLUSTER_NAME="cluster",
               SLURM_JOB_PARTITION="cpu", SLURM_JOB_USER="attendee", SLURM_GTIDS="0", SLURM_JOB_UID="1000",
               SLURM_JOB_GID="1000", SLURM_JOB_QOS="normal", SLURM_JOB_ACCOUNT="workshop", SLURM_PRIO_PROCESS="0",
               SLURM_TOPOLOGY_ADDR=names[0], SLURM_TOPOLOGY_ADDR_PATTERN="node", SLURM_TASK_PID="3")
    asked = dict(SLURM_CPUS_PER_TASK=cpt, SLURM_NTASKS=ntasks, SLURM_NPROCS=ntasks, SLURM_NTASKS_PER_NODE=per_node)
    env.update({name: str(value) for name, value in asked.items() if value})  # set only where the job asks for it
    return env


# The job runs as a user of its own (uid 1000 inside, this user outside), as a cluster's jobs never run as root:
# pkill -U root finds nothing there either. A user namespace needs no privilege; unshare before 2.35 lacks
# --map-user, and then the job runs as this user.
_USERS = (["--user", "--map-user=1000", "--map-group=1000"], ["--user", "--map-root-user"], [])


def _calling(module, function: str, args: str, kit: str = "sys.argv[1]") -> str:
    """Python code that calls ``function(args)`` of ``module``, imported from the kit alone (python -I -S)."""
    return f"import sys\nsys.path.insert(0, {kit})\nfrom {module.__name__} import {function}\n{function}({args})\n"


def _confined(keep: str, command: list[str]) -> list[str]:
    """``command``, everything but the simulation's folder ``keep`` made read-only, on a machine named as the job's
    first node, where its batch shell runs (``job_script_standins.confine``)."""
    confine = _calling(job_script_standins, "confine", "sys.argv[2], sys.argv[4:], sys.argv[3]")
    return ["unshare", "--user", "--map-root-user", "--mount", "--uts", sys.executable, "-I", "-S", "-c", confine, KIT,
            keep, NODE_NAMES[0], *command]


@functools.cache
def _unshare() -> tuple[list[str] | None, str, bool]:
    """(the unshare command line this machine permits, or None; why none; whether ``_confined`` works here)."""
    if not sys.platform.startswith("linux") or shutil.which("unshare") is None:
        return None, "no Linux unshare here", False
    said = "?"
    for user in _USERS:
        command = ["unshare", *user, "--pid", "--fork", "--mount-proc", "--kill-child"]
        try:
            tried = subprocess.run([*command, "true"], capture_output=True, text=True, timeout=30)
            if tried.returncode == 0:
                with tempfile.TemporaryDirectory(prefix="jobsim-") as keep:
                    confined = subprocess.run([*_confined(keep, command), "true"], capture_output=True, timeout=30)
                return command, "", confined.returncode == 0
        except (OSError, subprocess.TimeoutExpired) as err:
            return None, f"unshare failed ({err})", False
        said = (tried.stderr.strip().splitlines() or ["?"])[-1]
    return None, f"unshare --pid is not permitted here ({said})", False


def read_only_elsewhere() -> bool:
    """Whether the simulated job sees every folder but its own read-only."""
    return _unshare()[2]


def namespaces_problem() -> str | None:
    """Why this machine cannot run the simulation (no Linux PID namespaces for this user); None when it can."""
    return _unshare()[1] or None


def _write(path: Path, text: str, mode: int = 0o644) -> None:
    path.write_text(text)
    path.chmod(mode)


def _build(sim: Path, script: str, run: JobRun) -> Path:
    """The simulation's folder: interpreters, stand-ins, the fake training module, the script, the config."""
    real = os.path.realpath(sys.executable)
    for name in ("py/kernel", "bin", "fake/workshop_utils", "work"):
        (sim / name).mkdir(parents=True, exist_ok=True)
    for name in ("rt", "python3"):  # the stand-ins' interpreter, without site (-IS): it starts at once
        (sim / "py" / name).symlink_to(real)
    (sim / "py" / "kernel" / "python3").symlink_to(shutil.which("bash") or "/bin/bash")
    os.mkfifo(sim / "kernel.fifo")
    # The training processes run in this Python itself, under its own name (python3, python3.11): a pattern
    # that pkill takes must find either.
    here = Path(sys.executable).parent
    python = next((str(here / n) for n in (run.python, "python3") if (here / n).exists()), sys.executable)
    for name in STANDINS:
        interpreter = "python3" if name in ("torchrun", "python", "python3") else "rt"
        module = job_script_launch if name in ("srun", "torchrun", "python", "python3") else job_script_standins
        code = _calling(module, "main", repr(str(sim)), repr(KIT))
        _write(sim / "bin" / name, f"#!{sim}/py/{interpreter} -IS\n{code}", 0o755)
    standins = str(Path(__file__).with_name("job_script_standins.py"))
    loader = ("import importlib.util\nspec = importlib.util.spec_from_file_location('job_script_standins', "
              f"{standins!r})\nmodule = importlib.util.module_from_spec(spec)\nspec.loader.exec_module(module)\n"
              f"module.SIM = {str(sim)!r}\n")
    _write(sim / "fake" / "workshop_utils" / "__init__.py", "")
    _write(sim / "fake" / "workshop_utils" / "train.py", loader + "module.training()\n")
    _write(sim / "sim.json", json.dumps(dict(python=sys.executable, torch=torch_modules(),
                                             torchrun=torchrun_options())))
    _write(sim / "job.sbatch", script, 0o755)
    env = job_environment(run, str(sim / "work"), str(sim / "bin"))
    # #!/bin/bash -l reads this machine's /etc/profile, which may set PATH anew (Debian's does); a cluster's login
    # profile keeps the PATH sbatch passed on, as the attendee's own profile would where the site's does not
    _write(sim / "work" / ".bash_profile", f"PATH={shlex.quote(env['PATH'])}\n")
    if run.random is not None:  # unset, RANDOM is a plain variable: the same in every subshell, one draw of a job
        _write(sim / "random.sh", f"unset RANDOM\nRANDOM={run.random}\n")
        env["BASH_ENV"] = str(sim / "random.sh")
    config = dict(sim=str(sim), env=env, cwd=str(sim / "work"), args=list(TRAINING), node_names=NODE_NAMES[:run.nodes],
                  job_id=run.job_id, time_s=run.time_s, warning=run.warning,
                  cpus_per_node=int(env["SLURM_CPUS_ON_NODE"]), skew_s=5, checkpoint_s=20, kill_wait_s=30,
                  python=python, max_workers=4, fail=run.fail, spin_cpu_s=1, wall_s=120, most_starts=60,
                  most_processes=MOST_PROCESSES, machine_sleep_s=MACHINE_SLEEP_S)
    _write(sim / "config.json", json.dumps(config))
    return sim / "config.json"


def simulate(script: str, run: JobRun) -> Outcome:
    """Run ``script`` as the job ``run`` describes, in its own namespaces, and say what happened."""
    sim = Path(tempfile.mkdtemp(prefix="jobsim-"))
    try:
        config = _build(sim, script, run)
        command, _, confined = _unshare()
        command = _confined(str(sim), command) if confined else command
        code = _calling(job_script_runner, "serve", "sys.argv[2]")
        done = subprocess.run([*command, str(sim / "py" / "rt"), "-I", "-S", "-c", code, KIT, str(config)],
                              capture_output=True, text=True, timeout=180, stdin=subprocess.DEVNULL)
        outcome = sim / "outcome.json"
        if not outcome.exists():
            raise RuntimeError(f"the simulated job left no outcome (unshare: {done.returncode}, "
                               f"{done.stderr.strip()[-300:]})")
        found = json.loads(outcome.read_text())
        log = (sim / "job.log").read_text(errors="replace") if (sim / "job.log").exists() else ""
        return Outcome(found["reason"], found["events"], log.replace(str(sim), "."), run)
    finally:
        shutil.rmtree(sim, ignore_errors=True)
