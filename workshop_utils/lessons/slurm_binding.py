"""Where one task of a job may run, and what is near it: its cores and their NUMA node, its GPUs and
theirs, the network cards, the cores its DataLoader workers end up on; and whether ``torchrun
--numa-binding=node`` could bind its ranks here.

``binding_line`` is what each task of ``slurm/env_check.sbatch`` prints and ``binding_table`` reads
those lines back. torch is imported inside the functions that need it, so the line costs a job little.
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import sys
import warnings
from pathlib import Path

from .slurm_text import frame_of

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
