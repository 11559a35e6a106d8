"""What this server may use: its cores, memory and GPUs as its limits say, not as the node has them.

On a portal thirty attendees share a few nodes. Each server gets a slice: a CPU quota and a memory
limit in a cgroup (JupyterHub's ``cpu_limit``/``mem_limit`` through systemd or Kubernetes, Slurm's
task/cgroup), some cores (an affinity mask), some GPUs (``CUDA_VISIBLE_DEVICES``, a MIG slice).
``os.cpu_count()`` and ``/proc/meminfo`` describe the whole node: sized from them, every attendee's
PyTorch would start one thread per core of the node, thirty times over, and a notebook would be killed
by the kernel's out-of-memory killer ("kernel died") instead of saying what it needs.

The limits are read from the cgroups this process is in (v1 and v2, every level up to the root, the
smallest wins), from what JupyterHub tells a server it was given (``CPU_LIMIT``, ``MEM_LIMIT``) and
Slurm a job (``SLURM_MEM_PER_NODE``), whichever is smallest.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from pathlib import Path

from .errors import WorkshopError

# A cgroup v1 memory limit at or above this is "no limit" (the kernel shows 2**63 rounded down to a page).
_NO_LIMIT = 2**60


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except (OSError, UnicodeDecodeError):
        return None


def cgroup_folders(proc: Path = Path("/proc/self")) -> dict[str, list[Path]]:
    """For each controller ("cpu", "memory"), the folders of this process's cgroup and of its parents.

    /proc/self/cgroup names the cgroup within each hierarchy; /proc/self/mountinfo says where each
    hierarchy is mounted and which part of it (a container sees only its own subtree, mounted as "/").
    The v2 hierarchy ("0::/path") holds every controller its folders list in cgroup.controllers.
    """
    lines = (_read(proc / "cgroup") or "").splitlines()
    mounts = []  # (root within the hierarchy, mount point, "cgroup2" or the v1 controllers)
    for line in (_read(proc / "mountinfo") or "").splitlines():
        left, _, right = line.partition(" - ")
        parts, rest = left.split(), right.split()
        if len(parts) < 5 or len(rest) < 3 or rest[0] not in ("cgroup", "cgroup2"):
            continue
        kind = "cgroup2" if rest[0] == "cgroup2" else frozenset(rest[2].split(","))
        mounts.append((parts[3], Path(parts[4].replace("\\040", " ")), kind))
    folders: dict[str, list[Path]] = {}
    for line in lines:
        number, controllers, path = (line.split(":", 2) + ["", ""])[:3]
        v2 = number == "0" and controllers == ""
        for root, point, kind in mounts:
            if (kind == "cgroup2") != v2 or (not v2 and not set(controllers.split(",")) & kind):
                continue
            relative = os.path.relpath(path, root) if path.startswith(root) else "."  # outside: the mount's own
            folder = Path(os.path.normpath(point / relative)) if relative != "." else point
            chain = [folder]
            while chain[-1] != point and point in chain[-1].parents:
                chain.append(chain[-1].parent)
            names = ["cpu", "memory"] if v2 else sorted(set(controllers.split(",")) & {"cpu", "memory"})
            for name in names:
                folders.setdefault(name, chain)
    return folders


def cgroup_cpu_limit(folders: dict[str, list[Path]] | None = None) -> float | None:
    """The CPU quota in cores (1.5 = one and a half cores' time per period), or None when there is none."""
    folders = cgroup_folders() if folders is None else folders
    limits = []
    for folder in folders.get("cpu", []):
        v2 = (_read(folder / "cpu.max") or "").split()
        if len(v2) == 2 and v2[0] != "max" and v2[0].isdigit() and v2[1].isdigit() and int(v2[1]) > 0:
            limits.append(int(v2[0]) / int(v2[1]))
        quota, period = _read(folder / "cpu.cfs_quota_us"), _read(folder / "cpu.cfs_period_us")
        if quota and period and quota.lstrip("-").isdigit() and period.isdigit() and int(quota) > 0 < int(period):
            limits.append(int(quota) / int(period))
    return min(limits) if limits else None


def cgroup_memory(folders: dict[str, list[Path]] | None = None) -> tuple[int | None, int | None]:
    """(the memory limit in bytes, what the cgroup may still use) of the tightest level, or (None, None).

    What it may still use is the limit less what is charged, the page cache not counted as charged: the kernel
    drops file pages (PyTorch's libraries read from disk, data files) before it kills anything.
    """
    folders = cgroup_folders() if folders is None else folders
    best: tuple[int | None, int | None] = (None, None)
    for folder in folders.get("memory", []):
        for limit_file, usage_file, cache_keys in (("memory.max", "memory.current", ("active_file", "inactive_file")),
                                                   ("memory.limit_in_bytes", "memory.usage_in_bytes",
                                                    ("total_active_file", "total_inactive_file"))):
            limit = _read(folder / limit_file)
            if not (limit and limit.isdigit() and int(limit) < _NO_LIMIT):
                continue
            usage = _read(folder / usage_file)
            stat = dict(line.split(" ", 1) for line in (_read(folder / "memory.stat") or "").splitlines()
                        if " " in line)
            cache = sum(int(stat[key]) for key in cache_keys if stat.get(key, "").isdigit())
            left = int(limit) - int(usage) + cache if usage and usage.isdigit() else int(limit)
            if best[0] is None or int(limit) < best[0]:
                best = (int(limit), max(0, min(left, int(limit))))
    return best


def _limit_from_environment(variable: str, notes: list[str] | None = None) -> float | None:
    """A positive finite number from ``$variable``, else None; a value set but unreadable is noted, not ignored."""
    text = os.environ.get(variable)
    if text is None or not text.strip():
        return None
    try:
        value = float(text)
    except ValueError:
        value = None
    if value is None or not math.isfinite(value) or value <= 0:
        if notes is not None:
            notes.append(f"{variable}={text!r} is not a positive number: left out")
        return None
    return value


def affinity_cores() -> int:
    """Cores the scheduler lets this process run on (Slurm's and taskset's binding), else the node's."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def cpu_limit(notes: list[str] | None = None) -> tuple[float | None, str]:
    """The tightest CPU limit in cores, and where it comes from (a cgroup quota, or JupyterHub's CPU_LIMIT)."""
    found = [(value, source) for value, source in (
        (cgroup_cpu_limit(), "CPU quota"),
        (_limit_from_environment("CPU_LIMIT", notes), "JupyterHub's cpu_limit"),
    ) if value is not None]
    return min(found) if found else (None, "")


def cpu_cores() -> int:
    """Cores this process may use: its affinity, or its CPU quota rounded up where that is smaller (at least 1).

    A quota of 1.5 cores gives 2 threads their share of time; a quota of 0.5 still needs 1 thread,
    which then runs at half speed (``this_server`` says so).
    """
    quota, _ = cpu_limit()
    cores = affinity_cores()
    return max(1, min(cores, math.ceil(quota - 1e-9))) if quota is not None else cores


def _meminfo_available() -> int | None:
    for line in (_read(Path("/proc/meminfo")) or "").splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024
    return None


@dataclass
class GpuShare:
    """One GPU this server sees, and how much of its memory is free now (other tenants use the rest)."""

    index: int
    name: str
    total_gib: float
    free_gib: float


@dataclass
class Server:
    """What this server may use, each figure with the limit it comes from."""

    cores: int
    cores_source: str  # "CPU quota", "JupyterHub's cpu_limit", "affinity" or "the node"
    cpu_quota: float | None  # in cores, when a quota below the cores it may run on is the limit
    memory_gib: float | None  # what it may still use, or None where nothing says
    memory_source: str  # "memory limit", "JupyterHub's mem_limit", "Slurm's --mem", "free on the node"
    memory_limit_gib: float | None
    gpus: list[GpuShare] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # limits set but unreadable, said rather than dropped

    def line(self) -> str:
        """``this server: 2 cores (CPU quota), 5.8 GiB free of its 6.0 GiB memory limit, no GPU``."""
        quota = self.cpu_quota
        if quota is not None and quota < 1 - 1e-9:
            slower = f"; everything runs about {1 / quota:.0f}x slower" if quota < 0.5 else ""
            cores = f"1 core at {quota:.2g} of its speed (a CPU quota of {quota:.2g} cores{slower})"
        elif quota is not None and abs(quota - self.cores) > 1e-9:
            cores = f"{self.cores} core{'s' * (self.cores != 1)} ({self.cores_source} of {quota:.3g} cores)"
        else:
            cores = f"{self.cores} core{'s' * (self.cores != 1)} ({self.cores_source})"
        if self.memory_gib is None:
            memory = "memory unknown"
        elif self.memory_limit_gib is not None:
            memory = f"{self.memory_gib:.1f} GiB free of its {self.memory_limit_gib:.1f} GiB ({self.memory_source})"
        else:
            memory = f"{self.memory_gib:.1f} GiB {self.memory_source}"
        gpus = "; ".join(f"GPU {g.index} {g.name}, {g.free_gib:.0f} of {g.total_gib:.0f} GiB free" for g in self.gpus)
        notes = "".join(f" ({note})" for note in self.notes)
        return f"this server: {cores}, {memory}, {gpus or 'no GPU'}{notes}"


def _gpus() -> list[GpuShare]:
    import torch

    shares = []
    if not torch.cuda.is_available():
        return shares
    for index in range(torch.cuda.device_count()):
        try:
            free, total = torch.cuda.mem_get_info(index)
        except RuntimeError:  # a GPU another tenant holds in exclusive mode, or one that fell off the bus
            continue
        shares.append(GpuShare(index, torch.cuda.get_device_name(index), total / 2**30, free / 2**30))
    return shares


def this_server(gpus: bool = True) -> Server:
    """Read the limits now (memory left changes as the notebook runs)."""
    notes: list[str] = []
    quota, quota_source = cpu_limit(notes)
    cores, allowed = cpu_cores(), affinity_cores()
    if quota is not None and quota < allowed - 1e-9:
        source = quota_source
    else:
        source, quota = ("affinity" if allowed < (os.cpu_count() or 1) else "the node"), None
    limit, left = cgroup_memory()
    candidates = [(left, limit, "memory limit")] if limit is not None else []
    held = None  # what this process and its children hold: a limit that no cgroup counts against is shared with it
    per_cpu = _limit_from_environment("SLURM_MEM_PER_CPU", notes)
    slurm_cpus = _limit_from_environment("SLURM_CPUS_ON_NODE", notes)
    for value, name in ((_limit_from_environment("MEM_LIMIT", notes), "JupyterHub's mem_limit"),
                        (_limit_from_environment("SLURM_MEM_PER_NODE", notes) and
                         _limit_from_environment("SLURM_MEM_PER_NODE") * 2**20, "Slurm's --mem"),
                        (per_cpu and slurm_cpus and per_cpu * slurm_cpus * 2**20, "Slurm's --mem-per-cpu")):
        if value:
            held = tree_rss_bytes() if held is None else held
            candidates.append((max(0.0, value - held), value, name))
    available = _meminfo_available()
    if available is not None:
        candidates.append((available, None, "free on the node"))
    memory = min(candidates, key=lambda c: c[0]) if candidates else (None, None, "")
    return Server(cores, source, quota, None if memory[0] is None else memory[0] / 2**30, memory[2],
                  None if memory[1] is None else memory[1] / 2**30, _gpus() if gpus else [], notes)


def _need(value, name: str) -> float | None:
    """A profile's ``memory_gib`` or ``gpu_memory_gib``: None, or a positive finite number of GiB."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise WorkshopError(f"{name}={value!r} is not a number of GiB above 0.",
                            f"give {name} as a number such as {name}=2.5 (what the work needs), or leave it out.")
    return float(value)


def fit_to_server(memory_gib: float | None = None, gpu_memory_gib: float | None = None,
                  what: str = "This notebook", quiet: bool = False) -> Server:
    """Size this process to its server: one PyTorch thread per core it may use; stop early if it is too small.

    ``memory_gib`` and ``gpu_memory_gib`` are what the work needs (a notebook's profile says); below
    them this raises a one-line WorkshopError now, instead of the kernel dying mid-run. Prints the
    server's line unless ``quiet``.
    """
    import torch

    memory_gib, gpu_memory_gib = _need(memory_gib, "memory_gib"), _need(gpu_memory_gib, "gpu_memory_gib")
    server = this_server()
    if torch.get_num_threads() > server.cores:
        torch.set_num_threads(server.cores)  # PyTorch counts the node's cores, not the quota's
    if torch.get_num_interop_threads() > server.cores:
        try:
            torch.set_num_interop_threads(server.cores)
        except RuntimeError:  # settable once, before any parallel work: a kernel that trained already keeps its own
            pass
    if not quiet:
        print(server.line())
    # This kernel already holds part of what the work needs (PyTorch loaded, data read): only the rest must be free.
    still_needed = None if memory_gib is None else memory_gib - tree_rss_bytes() / 2**30
    if still_needed is not None and server.memory_gib is not None and server.memory_gib < still_needed:
        of = f" of its {server.memory_limit_gib:.1f} GiB" if server.memory_limit_gib is not None else ""
        raise WorkshopError(
            f"{what} needs about {memory_gib:g} GiB of memory at this size; this server has {server.memory_gib:.1f} "
            f"GiB free{of} ({server.memory_source}).",
            "shut down your other notebooks' kernels (Kernel > Shut Down Kernel), or ask for a server with more "
            "memory (docs/portal.md says what each notebook needs).")
    if gpu_memory_gib is not None and server.gpus and max(g.free_gib for g in server.gpus) < gpu_memory_gib:
        best = max(server.gpus, key=lambda g: g.free_gib)
        raise WorkshopError(
            f"{what} needs about {gpu_memory_gib:g} GiB of GPU memory at this size; the freest GPU here, "
            f"{best.name}, has {best.free_gib:.1f} GiB free (others use the rest).",
            "wait for the GPU to free up, ask for a GPU of your own, or pass smaller sizes (batch_size).")
    return server


def tree_rss_bytes(root=None, include_root: bool = True, proportional: bool = True) -> int:
    """Memory of a process and everything it started (kernels, torchrun's ranks, loader workers).

    Each process's proportional share (PSS, on Linux): a page two ranks share (PyTorch's libraries) counts half
    in each, as a cgroup charges it once; elsewhere, or with ``proportional=False``, resident memory, which counts
    it twice (an upper bound, read in about a millisecond where PSS takes tens: the kernel walks every mapping).
    """
    import psutil

    root = psutil.Process() if root is None else root
    total = 0
    for process in ([root] if include_root else []) + root.children(recursive=True):
        try:
            info = process.memory_full_info() if proportional and hasattr(psutil.Process, "memory_full_info") else None
            total += getattr(info, "pss", None) or process.memory_info().rss
        except psutil.Error:  # exited between listing and reading, or not ours to read
            pass
    return total


class PeakMemory:
    """The highest ``tree_rss_bytes`` of this process's children while the block runs, sampled in a thread.

    ``with PeakMemory() as peak: run(...)`` then ``peak.mib``: what a server's memory limit must allow
    for the work done in the block by the processes it starts (a notebook's kernel and its launches).
    """

    def __init__(self, interval_s: float = 0.2, proportional_every_s: float = 2.0):
        import threading

        self.interval_s, self.proportional_every_s, self.peak = interval_s, proportional_every_s, 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="peak-memory")

    def _run(self) -> None:
        # PSS read every 0.2 s took a tenth of a core from the notebooks it measured: it is read when the cheap
        # resident total reaches a new high (memory grew) and every few seconds (sharing changed), else skipped
        import time

        resident_high, last_read = 0, -math.inf
        while not self._stop.is_set():
            resident = tree_rss_bytes(include_root=False, proportional=False)
            if resident > resident_high or time.monotonic() - last_read >= self.proportional_every_s:
                resident_high, last_read = max(resident_high, resident), time.monotonic()
                self.peak = max(self.peak, tree_rss_bytes(include_root=False))
            self._stop.wait(self.interval_s)

    @property
    def mib(self) -> float:
        return self.peak / 2**20

    def __enter__(self) -> "PeakMemory":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
