"""A real, throw-away Slurm cluster on this machine for the job-script tests.

It installs nothing: it starts the munged, slurmctld and slurmd that the system's
packages provide (Debian: slurm-wlm, munge) with a generated munge key and a generated
slurm.conf (free ports, every state, spool and log file under one temporary folder, one
node named after this host), so it never touches a system Slurm or munge. Clients
(sbatch, squeue, scontrol, scancel) find it through SLURM_CONF. ``stop`` cancels the
jobs it ran and stops every daemon by its process id.
"""

from __future__ import annotations

import getpass
import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

from workshop_utils.parallel.launch import free_port

DAEMONS = ("munged", "slurmctld", "slurmd")
CLIENTS = ("sbatch", "squeue", "scontrol", "scancel", "srun", "sinfo")
SBIN = ("/usr/sbin", "/usr/local/sbin", "/sbin")  # daemons live here, often outside a user's PATH
FINISHED = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "PREEMPTED",
            "BOOT_FAIL", "DEADLINE"}


def which(name: str) -> str | None:
    return shutil.which(name) or shutil.which(name, path=os.pathsep.join(SBIN))


def missing_binaries() -> list[str]:
    return [name for name in DAEMONS + CLIENTS if which(name) is None]


SLURM_CONF = """\
ClusterName=workshoptest
SlurmctldHost={node}(127.0.0.1)
SlurmctldPort={ctld_port}
SlurmdPort={slurmd_port}
SlurmUser={user}
SlurmdUser={user}
AuthType=auth/munge
CredType=cred/munge
# Our own munged socket; cred_expire is also how long a requeued job waits (default 120 s).
AuthInfo=socket={munge_socket},cred_expire=5
StateSaveLocation={root}/state
SlurmdSpoolDir={root}/spool
SlurmctldPidFile={root}/slurmctld.pid
SlurmdPidFile={root}/slurmd.pid
SlurmctldLogFile={root}/log/slurmctld.log
SlurmdLogFile={root}/log/slurmd.log
MailProg=/bin/true
ProctrackType=proctrack/linuxproc
# Binds each task to its own cores (srun --cpu-bind), as clusters do: the binding tests need it.
TaskPlugin=task/affinity
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SchedulerType=sched/backfill
# Schedule every few seconds instead of every minute, so a requeued job starts promptly.
SchedulerParameters=sched_interval=2,bf_interval=1
JobRequeue=1
ReturnToService=2
MpiDefault=none
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/none
KillWait=5
InactiveLimit=0
MinJobAge=600
NodeName={node} NodeAddr=127.0.0.1 CPUs={cpus} RealMemory=1000 State=UNKNOWN
PartitionName=debug Nodes={node} Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES
"""


class SlurmCluster:
    def __init__(self, root: Path, cpus: int = 2):
        self.root = Path(root)
        self.node = socket.gethostname().split(".")[0]
        self.cpus = cpus
        self.processes: dict[str, subprocess.Popen] = {}
        self.jobs: list[str] = []
        self.conf = self.root / "slurm.conf"
        self.env = {**os.environ, "SLURM_CONF": str(self.conf)}
        for key in [k for k in self.env if k.startswith(("SLURM_", "SBATCH_", "SRUN_", "SQUEUE_"))]:
            if key != "SLURM_CONF":  # a test run inside a Slurm job must not leak that job's settings
                del self.env[key]

    # ------------------------------------------------------------------ start and stop

    def start(self, timeout_s: float = 60) -> "SlurmCluster":
        for folder in ("state", "spool", "log", "munge-key", "munge-run"):
            (self.root / folder).mkdir(parents=True, exist_ok=True)
        key_dir, run_dir = self.root / "munge-key", self.root / "munge-run"
        key_dir.chmod(0o700)
        run_dir.chmod(0o755)  # clients must reach the socket
        key = key_dir / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o400)
        self.munge_socket = run_dir / "munge.socket"
        self._spawn("munged", [which("munged"), "--foreground", "--force", f"--socket={self.munge_socket}",
                               f"--key-file={key}", f"--pid-file={run_dir / 'munged.pid'}",
                               f"--seed-file={key_dir / 'munged.seed'}", f"--log-file={self.root / 'log/munged.log'}"])
        self._wait_for(lambda: self.munge_socket.exists(), timeout_s, "munged to create its socket")
        self.conf.write_text(SLURM_CONF.format(
            node=self.node, ctld_port=free_port(), slurmd_port=free_port(), user=getpass.getuser(),
            munge_socket=self.munge_socket, root=self.root, cpus=self.cpus))
        # -i: start with no saved state; -D: stay in the foreground, so the pid we hold is the daemon's.
        self._spawn("slurmctld", [which("slurmctld"), "-D", "-i", "-f", str(self.conf)])
        self._wait_for(lambda: self.run("scontrol", "ping", check=False).returncode == 0, timeout_s,
                       "slurmctld to answer")
        self._spawn("slurmd", [which("slurmd"), "-D", "-N", self.node, "-f", str(self.conf)])
        self._wait_for(lambda: "idle" in self.run("sinfo", "-h", "-o", "%T", check=False).stdout, timeout_s,
                       "the node to register as idle")
        return self

    def stop(self) -> None:
        """Cancel every job (their processes belong to slurmstepd, not to us), then stop each daemon by pid.

        Every job of this private cluster is ours, also those a notebook submitted, whose ids we never saw.
        """
        if "slurmctld" in self.processes and self.processes["slurmctld"].poll() is None:
            if self.jobs or self.run("squeue", "-h", check=False).stdout.strip():
                self.run("scancel", "--user", getpass.getuser(), check=False)
            self._wait_for(lambda: not self.run("squeue", "-h", check=False).stdout.strip(), 30, "jobs to end",
                           fail=False)
        for name in reversed(DAEMONS):
            process = self.processes.pop(name, None)
            if process is None or process.poll() is not None:
                continue
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(15)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(5)

    def _spawn(self, name: str, command: list[str]) -> None:
        log = open(self.root / "log" / f"{name}.out", "ab")
        self.processes[name] = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=self.env,
                                                stdin=subprocess.DEVNULL)
        log.close()

    def _wait_for(self, ready, timeout_s: float, what: str, fail: bool = True) -> bool:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for name, process in self.processes.items():
                if process.poll() is not None and fail:
                    raise RuntimeError(f"{name} exited with {process.returncode} while waiting for {what}:\n"
                                       f"{self.logs()}")
            if ready():
                return True
            time.sleep(0.25)
        if fail:
            raise TimeoutError(f"timed out after {timeout_s} s waiting for {what}:\n{self.logs()}")
        return False

    def logs(self, tail: int = 30) -> str:
        parts = []
        for path in sorted((self.root / "log").glob("*")):
            lines = path.read_text(errors="replace").splitlines()[-tail:]
            parts.append(f"--- {path.name}\n" + "\n".join(lines))
        return "\n".join(parts)

    # ------------------------------------------------------------------ clients

    def run(self, *command: str, check: bool = True, env: dict | None = None, timeout: float = 60):
        return subprocess.run(command, capture_output=True, text=True, check=check, timeout=timeout,
                              env={**self.env, **(env or {})})

    def sbatch(self, script, *args: str, options: tuple[str, ...] = (), env: dict | None = None) -> str:
        """Submit ``script`` (its own arguments in ``args``); return the job id."""
        out = self.run("sbatch", "--parsable", *options, str(script), *args, env=env).stdout.strip()
        job_id = out.split(";")[0]
        self.jobs.append(job_id)
        return job_id

    def job(self, job_id: str) -> dict[str, str]:
        """``scontrol show job`` as a dict (empty once Slurm forgot the job)."""
        out = self.run("scontrol", "-o", "show", "job", job_id, check=False).stdout
        return dict(field.split("=", 1) for field in out.split() if "=" in field)

    def wait(self, job_id: str, timeout_s: float = 120, until=None) -> dict[str, str]:
        """Poll until the job has ended (or ``until(job)`` is true); return its last record."""
        until = until or (lambda job: job.get("JobState") in FINISHED)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            job = self.job(job_id)
            if job and until(job):
                return job
            time.sleep(0.5)
        raise TimeoutError(f"job {job_id} not done after {timeout_s} s: {self.job(job_id)}\n{self.logs()}")
