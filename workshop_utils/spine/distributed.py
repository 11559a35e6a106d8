"""Process-group set-up: the only place that knows whether we run under torchrun, srun or neither.

The training loop asks ``setup_distributed()`` who it is. Under torchrun the
launcher sets RANK, LOCAL_RANK and WORLD_SIZE; under ``srun`` without torchrun,
Slurm's SLURM_PROCID, SLURM_LOCALID and SLURM_NTASKS say the same. With neither,
this is one process and no process group is created at all. GPUs use NCCL (one
GPU per process: the local rank's, or under ``srun --gpus-per-task`` the task's own), CPUs
use gloo, so the same code runs on a laptop.
"""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist

from ..system.errors import WorkshopError


@dataclass(frozen=True)
class DistInfo:
    rank: int = 0  # this process among all processes of the job
    local_rank: int = 0  # this process among those on its node: picks the GPU
    world_size: int = 1  # how many processes train together
    backend: str | None = None  # "nccl", "gloo", or None for a single process

    @property
    def is_main(self) -> bool:
        """Rank 0 alone prints, logs and writes files."""
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.world_size > 1


def _int_env(*names: str) -> int | None:
    for name in names:
        if os.environ.get(name, "").strip():
            return int(os.environ[name])
    return None


def read_dist_env() -> DistInfo:
    """Rank, local rank and world size from torchrun's variables, else Slurm's, else a single process."""
    world = _int_env("WORLD_SIZE", "SLURM_NTASKS") or 1
    if world == 1:
        return DistInfo()
    rank = _int_env("RANK", "SLURM_PROCID") or 0
    local_rank = _int_env("LOCAL_RANK", "SLURM_LOCALID") or 0
    return DistInfo(rank, local_rank, world)


def _first_slurm_host() -> str | None:
    nodelist = os.environ.get("SLURM_JOB_NODELIST")
    if not nodelist:
        return None
    try:
        out = subprocess.run(["scontrol", "show", "hostnames", nodelist], capture_output=True, text=True, check=True)
        return out.stdout.split()[0]
    except (OSError, subprocess.CalledProcessError, IndexError):
        return None


def _gpus_per_task(env) -> int | None:
    """GPUs Slurm gave each task (``--gpus-per-task=[type:]N``, several types comma-separated), or None."""
    text = env.get("SLURM_GPUS_PER_TASK", "").strip()
    if not text:
        return None
    try:
        return sum(int(part.rsplit(":", 1)[-1]) for part in text.split(","))
    except ValueError:
        return None


def gpu_for_local_rank(local_rank: int, visible: int, env=None) -> int:
    """Which of the GPUs this process sees it trains on (an index for ``cuda:<index>``).

    Under torchrun every process of a node sees all the node's GPUs and ``LOCAL_RANK`` picks
    one. Under ``srun`` without torchrun, ``--gpus-per-task`` makes Slurm bind GPUs per task:
    each task sees only its own (``CUDA_VISIBLE_DEVICES`` differs per task), so ``cuda:0`` is
    this task's own GPU whatever its ``SLURM_LOCALID``. Otherwise the tasks of a node share the
    GPUs they see, and two of them on one GPU would make NCCL fail: then the local rank must
    name a distinct GPU, or the error says there are too few.
    """
    env = os.environ if env is None else env
    if visible < 1:
        raise WorkshopError("A GPU run was asked for, but PyTorch sees no CUDA GPU.", "run on a GPU node or use the CPU.")
    under_torchrun = bool(env.get("LOCAL_RANK", "").strip())
    if under_torchrun:
        # torchrun says how many processes share this node: refuse before any of them waits at the rendezvous.
        per_node = int(env["LOCAL_WORLD_SIZE"]) if env.get("LOCAL_WORLD_SIZE", "").strip() else None
        if per_node is not None and per_node > visible:
            raise WorkshopError(
                f"{per_node} processes per node were started, but this node has {visible} GPU(s).",
                f"start at most one process per GPU (torchrun --nproc-per-node={visible}).",
            )
    else:
        per_task = _gpus_per_task(env)
        # A task that sees no more GPUs than Slurm gave it sees only its own (a binding like
        # --gpu-bind=none would show it every task's GPUs, and then the local rank must choose).
        if per_task is not None and visible <= per_task:
            return 0
    if local_rank >= visible:
        fix = (f"start at most {visible} processes per node (torchrun --nproc-per-node={visible})." if under_torchrun
               else f"start at most {visible} tasks per node (srun --ntasks-per-node={visible}), or give each task "
                    "its own GPU (srun --gpus-per-task=1).")
        raise WorkshopError(
            f"Local rank {local_rank} has no GPU: this process sees {visible}, shared by every process of its node.",
            fix)
    return local_rank


def rank_device(local_rank: int, device: str | None = None, env=None, world_size: int = 1) -> torch.device:
    """The device this rank trains on: ``cuda:<i>`` (see ``gpu_for_local_rank``) or the CPU. Touches no GPU.

    ``device`` is None (a GPU when there is one), ``cpu``, ``cuda`` or ``cuda:N``: one process may
    name its GPU; several may not, since every rank would then pick the same one.
    """
    wanted = torch.device(device) if device is not None else None
    use_cuda = torch.cuda.is_available() if wanted is None else wanted.type == "cuda"
    if not use_cuda:
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise WorkshopError("A GPU run was asked for, but PyTorch sees no CUDA GPU.", "run on a GPU node or use the CPU.")
    visible = torch.cuda.device_count()
    if wanted is None or wanted.index is None:
        return torch.device("cuda", gpu_for_local_rank(local_rank, visible, env))
    if world_size > 1:
        raise WorkshopError(f"device={device!r} would put all {world_size} ranks on the same GPU.",
                            "pass device='cuda' (each rank takes its local rank's GPU) and choose the GPUs "
                            "with CUDA_VISIBLE_DEVICES.")
    if wanted.index >= visible:
        raise WorkshopError(f"device={device!r} was asked for, but this process sees {visible} GPU(s) "
                            f"(cuda:0..cuda:{visible - 1}).", f"pick an index below {visible}, or device='cuda'.")
    return wanted


def _this_start(store, world_size: int) -> str:
    """A store prefix for this start of the job: the same on every rank, new at every restart.

    torchrun keeps its store across restarts, so a restarted rank without its own prefix reads the address
    of a predecessor that no longer listens. The agent of one node numbers its restarts for all its ranks
    (TORCHELASTIC_RESTART_COUNT), but agents on several nodes need not agree: one whose ranks were still
    running when another node's rank failed restarts them as a "membership change", which it does not
    count. There every rank counts itself in the store instead: the whole world joins once per start, so
    the n-th join belongs to start (n - 1) // world_size.
    """
    if os.environ.get("TORCHELASTIC_RESTART_COUNT") is not None and os.environ.get("GROUP_WORLD_SIZE", "1") != "1":
        return f"start-{(store.add('workshop/ranks-joined', 1) - 1) // world_size}/"
    return f"attempt-{os.environ.get('TORCHELASTIC_RESTART_COUNT') or os.environ.get('SLURM_RESTART_COUNT') or '0'}/"


def setup_distributed(device: str | None = None, timeout_s: int = 300) -> tuple[DistInfo, torch.device]:
    """Join the process group (if there is one) and pick this rank's device (see ``rank_device``)."""
    info = read_dist_env()
    device = rank_device(info.local_rank, device, world_size=info.world_size)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    if not info.distributed:
        return info, device
    backend = "nccl" if device.type == "cuda" else "gloo"
    if "MASTER_ADDR" not in os.environ:  # srun without torchrun: rendezvous on the job's first node
        os.environ["MASTER_ADDR"] = _first_slurm_host() or "127.0.0.1"
        os.environ.setdefault("MASTER_PORT", "29500")
    if not dist.is_initialized():
        try:
            timeout = timedelta(seconds=timeout_s)
            store, _, _ = next(dist.rendezvous("env://", info.rank, info.world_size, timeout=timeout))
            # device_id binds NCCL's communicator to this rank's GPU at once; without it every barrier()
            # warns that it guesses the device from the current context.
            dist.init_process_group(backend, store=dist.PrefixStore(_this_start(store, info.world_size), store),
                                    rank=info.rank, world_size=info.world_size, timeout=timeout,
                                    device_id=device if device.type == "cuda" else None)
        except dist.DistNetworkError as err:
            if "EADDRINUSE" not in str(err) and "in use" not in str(err).lower():
                raise
            address = f"{os.environ['MASTER_ADDR']}:{os.environ.get('MASTER_PORT')}"
            raise WorkshopError(f"Rank {info.rank} cannot listen on {address}: the port is already in use.",
                                "pick a free port (MASTER_PORT=..., torchrun --master-port=...; "
                                "wu.free_port() finds one).") from None
    return DistInfo(info.rank, info.local_rank, info.world_size, backend), device


def teardown_distributed() -> None:
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def collective_device() -> torch.device:
    """Where a tensor must live for this process group's collectives: this rank's GPU under NCCL, else the CPU.

    NCCL reduces GPU memory only; a helper that makes its buffers with ``torch.zeros(...)``
    (on the CPU) fails under NCCL unless it asks here first.
    """
    if dist.is_available() and dist.is_initialized() and dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def all_reduce_sum(tensor: torch.Tensor) -> torch.Tensor:
    """Sum a tensor over all ranks in place (a no-op for a single process), wherever the tensor lives."""
    if dist.is_available() and dist.is_initialized():
        target = collective_device()
        if target.type == "cuda" and tensor.device.type != "cuda":
            # A CPU tensor under NCCL: reduce a GPU copy, then write the sum back into the caller's tensor.
            staged = tensor.to(target)
            dist.all_reduce(staged, op=dist.ReduceOp.SUM)
            tensor.copy_(staged)
        else:
            dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
    return tensor


def barrier() -> None:
    if dist.is_available() and dist.is_initialized():
        dist.barrier()
