"""Run torchrun from a notebook: a real multi-process job, its output streamed into the cell.

A Jupyter kernel is one process; DDP needs one process per device. Forking
workers from the kernel (``mp.spawn``) ties their fate to the kernel and hides
their output, so instead we start ``torchrun`` as a subprocess, exactly as a
Slurm script would, print its output line by line as it arrives, and read the
result JSON that rank 0 writes back into Python.
"""

from __future__ import annotations

import json
import os
import queue
import shlex
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field, fields
from pathlib import Path

import torch

from ..spine.data import SYNTHETIC_HEADLINE, SYNTHETIC_SHOWN, note_synthetic_banner_shown, synthetic_banner_shown
from ..system.errors import WorkshopError
from ..system.server import cpu_cores
from .failures import RankFailed, RootCause, root_cause


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nobody listens on right now (the OS picks it)."""
    with socket.socket() as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


def check_port_free(port: int, host: str = "127.0.0.1") -> int:
    with socket.socket() as sock:
        try:
            sock.bind((host, port))
        except OSError:
            raise WorkshopError(f"Port {port} on {host} is already in use: the rendezvous could not listen there.",
                                "pass port=None (a free port is picked) or another port.") from None
    return port


def cpu_threads_per_process(processes_on_this_machine: int) -> int:
    """Share the cores this server may use (its CPU quota too): more threads than cores makes every rank slower."""
    return max(1, cpu_cores() // processes_on_this_machine)


def check_process_count(nproc_per_node: int, device: str | None) -> None:
    uses_gpu = device == "cuda" or (device in (None, "auto") and torch.cuda.is_available())
    if uses_gpu and nproc_per_node > torch.cuda.device_count():
        raise WorkshopError(f"{nproc_per_node} processes asked for, but this node has "
                            f"{torch.cuda.device_count()} GPU(s): DDP needs one GPU per process.",
                            f"use nproc <= {torch.cuda.device_count()}.")
    if nproc_per_node < 1:
        raise WorkshopError(f"nproc must be 1 or more, got {nproc_per_node}.", "start at least one process.")


def torchrun_command(module: str, args: list[str], nproc_per_node: int, *, port: int, nnodes: int = 1,
                     max_restarts: int = 0, rdzv_id: str = "workshop", is_host: bool | None = None,
                     log_dir: str | os.PathLike | None = None) -> list[str]:
    """The torchrun command line, with the venv's own torchrun (``sys.executable -m torch.distributed.run``).

    ``log_dir`` is where torchrun has each worker write its error file (``root_cause`` reads them);
    None leaves torchrun's default, a new folder in /tmp that nobody removes.
    """
    command = [sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={nproc_per_node}",
               f"--max-restarts={max_restarts}"]
    if log_dir is not None:
        command.append(f"--log-dir={log_dir}")
    if nnodes == 1:
        command += ["--master-addr=127.0.0.1", f"--master-port={port}"]
    else:  # several agents meet at a c10d rendezvous; the one with is_host=1 serves it
        command += [f"--nnodes={nnodes}", "--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{port}",
                    f"--rdzv-id={rdzv_id}", f"--rdzv-conf=is_host={int(bool(is_host))}"]
    return command + ["-m", module, *args]


@dataclass
class Launched:
    """What a launch left behind: exit status, every output line, and rank 0's result record."""

    returncode: int
    lines: list[str] = field(repr=False)
    record: dict | None = field(default=None, repr=False)
    seconds: float = 0.0
    layout: "NodeLayout | None" = field(default=None, repr=False)  # launch_nodes only: who got which device
    cause: RootCause | None = field(default=None, repr=False)  # a failed launch's first failing rank


def stop_process_group(process: subprocess.Popen, grace_s: float = 10) -> None:
    """Stop a process started in its own session and everything it started (the group's id is its pid).

    SIGTERM first, SIGKILL after ``grace_s`` seconds: torchrun and its workers, a main job and its kernels.
    """
    if process.poll() is not None:
        return
    for sig, wait in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 5)):
        try:
            os.killpg(process.pid, sig)
        except ProcessLookupError:
            return
        try:
            process.wait(wait)
            return
        except subprocess.TimeoutExpired:
            continue


def stream(commands: dict[str, list[str]], env: dict | None = None, timeout_s: float = 600,
           echo: bool = True, envs: dict[str, dict] | None = None,
           linger_s: float | None = None) -> tuple[list[int], list[str]]:
    """Run commands side by side, print their merged output line by line (prefixed by label), stop all at the end.

    ``envs`` gives a command its own environment (by label), in place of ``env``. ``linger_s``: once one command's
    output has ended, those still running that much later are stopped, as a cluster ends a job whose task failed
    (a torchrun agent whose ranks succeeded would otherwise wait minutes at its exit barrier for one that failed).
    """
    lines: queue.Queue = queue.Queue()
    processes = {}

    def pump(label, process):
        for line in process.stdout:
            lines.put(f"{label}{line.rstrip()}")
        lines.put(None)  # this process closed its output

    try:
        for label, command in commands.items():
            processes[label] = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                                bufsize=1, env=(envs or {}).get(label, env), start_new_session=True)
            threading.Thread(target=pump, args=(label, processes[label]), daemon=True).start()
        output, open_streams, deadline = [], len(processes), time.monotonic() + timeout_s
        lingered = deadline
        while open_streams:
            try:
                remaining = min(deadline, lingered) - time.monotonic()
                if remaining <= 0:  # checked on every line: a hung job that keeps printing still times out
                    raise queue.Empty
                line = lines.get(timeout=remaining)
            except queue.Empty:
                if time.monotonic() < deadline:  # lingered long enough after the first end: stop the rest
                    for process in processes.values():
                        stop_process_group(process, grace_s=linger_s)
                    break
                raise WorkshopError(f"The job ran longer than {timeout_s:.0f} s and was stopped.",
                                    "give it more time (timeout_s=...) or fewer steps.") from None
            if line is None:
                open_streams -= 1
                if linger_s is not None:
                    lingered = min(lingered, time.monotonic() + linger_s)
                continue
            output.append(line)
            if echo:
                print(line, flush=True)
                if SYNTHETIC_HEADLINE in line:  # a rank showed the banner here: later launches say it in one line
                    note_synthetic_banner_shown()
        return [p.wait() for p in processes.values()], output
    finally:  # normal end, error or a user pressing stop: no process outlives the cell
        for process in processes.values():
            stop_process_group(process)


def job_env(threads: int, hide_gpus: bool = False) -> dict:
    """The environment a launch's processes start in: ``threads`` OMP threads each, no GPU where ``hide_gpus``."""
    env = dict(os.environ, PYTHONUNBUFFERED="1", OMP_NUM_THREADS=str(threads))
    if synthetic_banner_shown():  # the ranks then say "synthetic" in one line, not the nine of the banner
        env[SYNTHETIC_SHOWN] = "1"
    for name in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "GROUP_RANK",
                 "TORCHELASTIC_RUN_ID"):
        env.pop(name, None)  # a kernel started inside a job must not pass its own rank on
    if hide_gpus:  # CPU ranks on a GPU node must not reach for GPU 0
        env["CUDA_VISIBLE_DEVICES"] = ""
    return env


def train_flags(options: dict) -> list[str]:
    """Flags of ``python -m workshop_utils.train`` for ``{field or flag name: value}``, in the dict's order.

    ``{"batch_size": 64, "resume": True, "compile": False}`` -> ``["--batch-size", "64", "--resume",
    "--no-compile"]``. The one place a value becomes a flag (``launch_training``, ``launch_nodes`` and
    ``config_flags`` all call it). A TrainConfig field's value that has a command-line word is given by
    that word (``device=None`` -> ``--device auto``, ``keep_checkpoints=None`` -> ``--keep-checkpoints
    all``, ``synthetic=False`` -> ``--synthetic no``); any other None leaves the command's default. False
    is the --no- form every on/off flag has (``no_progress=False`` is ``--progress``): skipping it would
    leave a default of True, or "auto", in place.
    """
    from ..spine.config import TrainConfig, setting_of

    words = {f.name: setting_of(f).words for f in fields(TrainConfig)}
    args = []
    for key, value in options.items():
        flag = key.replace("_", "-")
        word = next((w for w, v in words.get(key, {}).items() if v == value and type(v) is type(value)), None)
        if word is not None:
            args += [f"--{flag}", word]
        elif value is True:
            args.append(f"--{flag}")
        elif value is False:
            args.append(f"--{flag.removeprefix('no-')}" if flag.startswith("no-") else f"--no-{flag}")
        elif value is not None:
            args += [f"--{flag}", str(value)]
    return args


def _failure(codes: list[int], lines: list[str], cause: RootCause | None, echo: bool) -> WorkshopError:
    """The one line of a failed launch: the rank that failed first (``root_cause``), then, shown, its last lines."""
    code = max(codes, key=abs)
    if cause is None:  # no rank failed: torchrun itself did (a bad flag, a rendezvous that never met)
        errors = [line for line in lines if "error:" in line.lower()] or lines[-1:]
        return WorkshopError(f"torchrun exited with status {code}; first error: "
                             f"{errors[0].strip() if errors else '(no output)'}",
                             "read the streamed output above.")
    if echo and cause.last_lines:
        print(cause.last_lines_text(), flush=True)
    return RankFailed(f"torchrun exited with status {code}; {cause.line}.", cause)


def launch_torchrun(module: str, args: list[str], nproc: int = 1, *, max_restarts: int = 0, port: int | None = None,
           device: str | None = None, timeout_s: float = 600, check: bool = True, echo: bool = True,
           out: str | os.PathLike | None = None, threads: int | None = None) -> Launched:
    """``torchrun --nproc-per-node=nproc -m module args``; ``out`` is the JSON rank 0 writes (read back).

    ``threads`` is OMP_NUM_THREADS per process (None: the cores shared out evenly).
    """
    check_process_count(nproc, device)
    port = check_port_free(port) if port is not None else free_port()
    if echo:  # the line a reader would type; the run adds a --log-dir of its own for the error files
        print("$ torchrun " + shlex.join(torchrun_command(module, args, nproc, port=port,
                                                          max_restarts=max_restarts)[3:]), flush=True)
    # CPU ranks on a GPU node must not see the GPUs: library code (Adam's step, checkpoint writers) would
    # otherwise start CUDA on GPU 0 in every rank, costing time and memory there.
    env = job_env(threads or cpu_threads_per_process(nproc), hide_gpus=device == "cpu")
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="workshop-torchrun-") as logs:
        command = torchrun_command(module, args, nproc, port=port, max_restarts=max_restarts, log_dir=logs)
        codes, lines = stream({"": command}, env, timeout_s, echo)
        cause = root_cause(lines, nproc, logs) if any(codes) else None
    seconds = time.perf_counter() - started
    if check and any(codes):
        raise _failure(codes, lines, cause, echo)
    record = json.loads(Path(out).read_text()) if out is not None and Path(out).exists() else None
    return Launched(max(codes, key=abs), lines, record, seconds, cause=cause)


def launch_training(nproc: int = 1, *, max_restarts: int = 0, port: int | None = None, timeout_s: float = 600,
                    check: bool = True, echo: bool = True, threads: int | None = None, **options) -> Launched:
    """Train with ``python -m workshop_utils.train`` on ``nproc`` processes; options are its flags.

    ``launch_training(2, batch_size=32, steps=20)`` runs
    ``torchrun --nproc-per-node=2 -m workshop_utils.train --batch-size 32 --steps 20 --no-progress --out ...``.
    """
    options.setdefault("no_progress", True)  # progress bars redraw with \r: unreadable as streamed lines
    with tempfile.TemporaryDirectory(prefix="workshop-launch-") as folder:
        out = options.pop("out", None) or Path(folder) / "result.json"
        return launch_torchrun("workshop_utils.train", train_flags({**options, "out": out}), nproc, max_restarts=max_restarts,
                      port=port, device=options.get("device"), timeout_s=timeout_s, check=check, echo=echo, out=out,
                               threads=threads)


@dataclass(frozen=True)
class NodeLayout:
    """How ``launch_nodes`` places its agents on this machine's devices."""

    backend: str  # "nccl" or "gloo"
    device: str  # "cuda" or "cpu": what every rank trains on
    visible_devices: tuple[str, ...]  # CUDA_VISIBLE_DEVICES of each agent; "" hides every GPU
    reason: str  # one line for the reader


def visible_gpu_ids(env=None) -> list[str] | None:
    """The entries of CUDA_VISIBLE_DEVICES (indices or UUIDs), or None when it is not set."""
    text = (os.environ if env is None else env).get("CUDA_VISIBLE_DEVICES")
    if text is None:
        return None
    return [part.strip() for part in text.split(",") if part.strip()]


def node_layout(gpus: int, nnodes: int, nproc_per_node: int, device: str | None = "auto",
                visible: list[str] | None = None) -> NodeLayout:
    """Give each simulated node's agent its own GPUs, or fall back to gloo on CPU processes.

    Every agent numbers its processes from local rank 0 and each takes ``cuda:<local rank>``:
    two agents that see the same GPUs would put two ranks on one GPU, which NCCL refuses
    ("Duplicate GPU detected"). So agent ``n`` sees only GPUs ``n*nproc ... n*nproc+nproc-1``
    (its CUDA_VISIBLE_DEVICES slice), as a real node sees only its own. With fewer GPUs than
    ranks (or ``device="cpu"``) every agent runs gloo on CPU processes and sees no GPU.
    ``visible`` is this process's CUDA_VISIBLE_DEVICES list: a child's entries must name the
    same physical GPUs, not indices into the parent's list.
    """
    if device is None:
        device = "auto"
    if device not in ("auto", "cuda", "cpu"):
        raise WorkshopError(f"Unknown device {device!r} for the agents.", "use 'auto', 'cuda' or 'cpu'.")
    if nnodes < 1 or nproc_per_node < 1:
        raise WorkshopError(f"{nnodes} node(s) x {nproc_per_node} process(es) is not a job.",
                            "use 1 or more nodes and 1 or more processes per node.")
    ranks = nnodes * nproc_per_node
    shape = f"{nnodes} agent(s) x {nproc_per_node} process(es)"
    if device != "cpu" and gpus >= ranks:
        ids = visible[:gpus] if visible is not None and len(visible) >= gpus else [str(i) for i in range(gpus)]
        slices = tuple(",".join(ids[n * nproc_per_node:(n + 1) * nproc_per_node]) for n in range(nnodes))
        where = "; ".join(f"agent {n}: GPU {ids_}" for n, ids_ in enumerate(slices))
        return NodeLayout("nccl", "cuda", slices, f"{shape} on distinct GPUs ({where}), NCCL.")
    if device == "cuda":
        raise WorkshopError(f"{shape} need {ranks} distinct GPUs, but this machine has {gpus}: NCCL cannot put "
                            "two ranks on one GPU ('Duplicate GPU detected').",
                            f"use at most {gpus} ranks in all, or device='cpu' (gloo).")
    if device == "cpu":
        why = "as asked (device='cpu')"
    elif gpus == 0:
        why = "no GPU here"
    else:
        why = f"{ranks} ranks need {ranks} distinct GPUs and this machine has {gpus}"
    return NodeLayout("gloo", "cpu", ("",) * nnodes, f"{shape} as gloo CPU processes: {why}.")


def launch_nodes(nnodes: int = 2, nproc_per_node: int = 1, *, port: int | None = None, timeout_s: float = 300,
                 echo: bool = True, threads: int | None = None, **options) -> Launched:
    """Pretend to be ``nnodes`` machines: one torchrun agent per "node", all meeting at one c10d rendezvous.

    On a cluster each agent runs on its own node (``srun torchrun ...``) with the same
    ``--rdzv-endpoint=<first node>:<port>``; here they all run on this machine, each agent with
    its own GPUs when there are enough, else as gloo CPU processes (``node_layout``; one line says which).
    """
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    layout = node_layout(gpus, nnodes, nproc_per_node, options.get("device"), visible_gpu_ids())
    port = check_port_free(port) if port is not None else free_port()
    options = {**options, "device": layout.device, "no_progress": options.get("no_progress", True)}
    announce = f"Layout: {layout.reason}"
    if echo:
        print(announce, flush=True)
    with tempfile.TemporaryDirectory(prefix="workshop-nodes-") as folder:
        out = Path(folder) / "result.json"
        args = train_flags({**options, "out": out})
        rdzv_id = f"workshop-{port}"
        commands = {f"[agent {n}] ": torchrun_command("workshop_utils.train", args, nproc_per_node, port=port,
                                                      nnodes=nnodes, rdzv_id=rdzv_id, is_host=n == 0,
                                                      log_dir=Path(folder) / "logs")
                    for n in range(nnodes)}
        if echo:
            for label, command in commands.items():
                print(f"{label}$ torchrun " + shlex.join(command[3:]), flush=True)
        started = time.perf_counter()
        env = job_env(threads or cpu_threads_per_process(nnodes * nproc_per_node))
        envs = {label: {**env, "CUDA_VISIBLE_DEVICES": visible}
                for label, visible in zip(commands, layout.visible_devices)}
        codes, lines = stream(commands, env, timeout_s, echo, envs)
        if any(codes):
            raise _failure(codes, lines, root_cause(lines, nnodes * nproc_per_node, Path(folder) / "logs"), echo)
        record = json.loads(out.read_text()) if out.exists() else None
        return Launched(max(codes, key=abs), [announce, *lines], record, time.perf_counter() - started, layout)


def world_sizes_for_this_machine(candidates=(1, 2, 4, 8), at_most: int | None = None) -> list[int]:
    """Process counts to scale over: one per GPU up to the GPUs present; 1 and 2 gloo processes on a CPU.

    ``at_most`` keeps that many: the smallest ones and the largest (every launch costs a start-up).
    """
    if at_most is not None and at_most < 2:
        raise WorkshopError(f"at_most={at_most} leaves nothing to scale over.", "use 2 or more, or None for all.")
    limit = torch.cuda.device_count() if torch.cuda.is_available() else 2
    sizes = [p for p in candidates if p <= limit]
    if at_most is not None and len(sizes) > at_most:
        sizes = sizes[:at_most - 1] + sizes[-1:]
    return sizes


def resume_verdict(crashed: dict, reference: dict, fail_step: int, device_type: str) -> tuple[bool, str]:
    """Did a crash-and-resume run really crash and resume, and does it end where the uninterrupted run ends?

    Returns (identical, one line). Equal parameters prove exact resume only when the run
    resumed from a checkpoint written *before* the failure; a run that resumed from a later
    step, or not at all, did not redo the work, so its equality proves nothing.
    """
    resumed = crashed["metrics"].get("resumed_from_step")
    if resumed is None:
        return False, ("Not a resume test: the run never loaded a checkpoint, so its parameters say nothing "
                       "about resuming.")
    if resumed >= fail_step:
        return False, (f"Not a resume test: the failure was injected at step {fail_step}, but the run resumed from "
                       f"step {resumed}, a checkpoint the crashed run cannot have written (an earlier run's?).")
    head = f"Failed at step {fail_step}, resumed from step {resumed}: "
    if crashed["metrics"]["steps"] != reference["metrics"]["steps"]:
        return False, head + (f"it ran {crashed['metrics']['steps']} steps, the uninterrupted run "
                              f"{reference['metrics']['steps']}: not comparable.")
    if crashed["metrics"]["param_checksum"] == reference["metrics"]["param_checksum"]:
        return True, head + "final parameters identical to the uninterrupted run, bit for bit."
    losses = (f" (final training loss {crashed['metrics']['final_train_loss']:.4f} vs "
              f"{reference['metrics']['final_train_loss']:.4f})")
    why = ("GPU kernels and NCCL reductions are not bitwise deterministic, so two runs drift apart" if
           device_type == "cuda" else "on CPUs they should match bit for bit: something was not restored")
    return False, head + f"final parameters differ from the uninterrupted run{losses}: {why}."
