"""Process-group set-up: the only place that knows whether we run under torchrun, srun or neither.

The training loop asks ``setup_distributed()`` who it is. Under torchrun the
launcher sets RANK, LOCAL_RANK and WORLD_SIZE; under ``srun`` without torchrun,
Slurm's SLURM_PROCID, SLURM_LOCALID and SLURM_NTASKS say the same. With neither,
this is one process and no process group is created at all. GPUs use NCCL (one
GPU per local rank), CPUs use gloo, so the same code runs on a laptop.
"""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist

from .errors import WorkshopError


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


def setup_distributed(device_type: str | None = None, timeout_s: int = 300) -> tuple[DistInfo, torch.device]:
    """Join the process group (if there is one) and pick this rank's device."""
    info = read_dist_env()
    use_cuda = torch.cuda.is_available() if device_type is None else device_type == "cuda"
    if use_cuda:
        if not torch.cuda.is_available():
            raise WorkshopError("A GPU run was asked for, but PyTorch sees no CUDA GPU.", "run on a GPU node or use the CPU.")
        gpus = torch.cuda.device_count()
        # torchrun says how many processes share this node: refuse before any of them waits at the rendezvous.
        per_node = _int_env("LOCAL_WORLD_SIZE")
        if per_node is not None and per_node > gpus:
            raise WorkshopError(
                f"{per_node} processes per node were started, but this node has {gpus} GPU(s).",
                f"start at most one process per GPU (torchrun --nproc-per-node={gpus}).",
            )
        if info.local_rank >= gpus:
            raise WorkshopError(
                f"Local rank {info.local_rank} has no GPU: this node has {gpus}.",
                f"start at most {gpus} processes per node (torchrun --nproc_per_node={gpus}).",
            )
        device = torch.device("cuda", info.local_rank)
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
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
            # torchrun keeps its store across restarts: a per-attempt prefix stops a restarted rank from
            # reading the address of a predecessor that no longer listens.
            attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT") or os.environ.get("SLURM_RESTART_COUNT") or "0"
            dist.init_process_group(backend, store=dist.PrefixStore(f"attempt-{attempt}/", store),
                                    rank=info.rank, world_size=info.world_size, timeout=timeout)
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


def all_reduce_sum(tensor: torch.Tensor) -> torch.Tensor:
    """Sum a tensor over all ranks in place (a no-op for a single process)."""
    if dist.is_available() and dist.is_initialized():
        dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
    return tensor


def barrier() -> None:
    if dist.is_available() and dist.is_initialized():
        dist.barrier()
