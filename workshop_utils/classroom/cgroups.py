"""One cgroup per attendee's server: a CPU quota and a memory limit, as a portal's spawner sets them.

JupyterHub's ``cpu_limit`` and ``mem_limit`` are enforced by the spawner: systemd's CPUQuota and MemoryMax
(SystemdSpawner), a pod's limits (KubeSpawner), Slurm's cgroups (batchspawner). Here the class makes the
cgroups itself, under the one this process is in, and reads back what each server used at its peak and
whether the kernel's out-of-memory killer struck. Writing cgroups takes root and a writable hierarchy (v1
or v2); ``Cgroups.unavailable()`` says in one line why a machine has none, and the class then runs without
limits.
"""

from __future__ import annotations

import os
import signal
import time
import uuid
from pathlib import Path

from ..system.server import cgroup_folders

CONTROLLERS = ("cpu", "memory")


def _write(path: Path, value) -> None:
    path.write_text(f"{value}\n")


def _read_int(path: Path) -> int | None:
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


def _events(path: Path) -> dict[str, int]:
    """A cgroup's key-value file (v1 memory.oom_control, v2 memory.events) as numbers."""
    try:
        pairs = [line.split() for line in path.read_text().splitlines()]
    except OSError:
        return {}
    return {p[0]: int(p[1]) for p in pairs if len(p) == 2 and p[1].isdigit()}


class Cgroups:
    """A parent cgroup per controller for the class, a child per attendee; removed, with what ran in it, at the end."""

    def __init__(self, name: str | None = None):
        self.name = name or f"workshop-classroom-{uuid.uuid4().hex[:8]}"
        found = cgroup_folders()
        self.parents = {c: found[c][0] / self.name for c in CONTROLLERS if c in found}
        self.v2 = {c: (found[c][0] / "cgroup.controllers").exists() for c in self.parents}
        self.children: dict[str, dict[str, Path]] = {}

    @staticmethod
    def unavailable() -> str | None:
        """Why this machine cannot make the class's cgroups, in one line, or None when it can."""
        if not hasattr(os, "geteuid") or os.geteuid() != 0:
            return "not root: the class runs without CPU quotas or memory limits"
        found = cgroup_folders()
        missing = [c for c in CONTROLLERS if c not in found]
        if missing:
            return f"no {' or '.join(missing)} cgroup controller is mounted: the class runs without limits"
        trial = Cgroups(f"workshop-probe-{uuid.uuid4().hex[:8]}")
        try:
            trial.make("probe", 1.0, 2**30)
        except OSError as err:
            return f"cgroups cannot be written here ({err.strerror or err}): the class runs without limits"
        finally:
            trial.remove()
        return None

    def make(self, attendee: str, cpu_cores: float | None, memory_bytes: int | None,
             cpu_weight: int | None = None) -> dict[str, Path]:
        """The attendee's cgroups, with the quota and the limit written; their folders by controller.

        ``cpu_weight`` (v2's units: 1 to 10,000, 100 for an equal share; v1's cpu.shares are 10.24x) ranks the
        group when the CPUs are contended: every process in it, whatever its session. A weight counts only among a
        group's siblings, so the class's parent takes it too, or the parent would take an equal share for it.
        """
        folders = {}
        for controller, parent in self.parents.items():
            parent.mkdir(exist_ok=True)
            if self.v2[controller]:  # v2: a child may only use the controllers its parent hands down
                _write(parent.parent / "cgroup.subtree_control", f"+{controller}")
                _write(parent / "cgroup.subtree_control", f"+{controller}")
            folder = parent / attendee
            folder.mkdir(exist_ok=True)
            folders[controller] = folder
            self.children[attendee] = folders  # kept before any limit is written: remove() finds it whatever fails
            if controller == "cpu" and cpu_cores:
                if self.v2[controller]:
                    _write(folder / "cpu.max", f"{int(cpu_cores * 100_000)} 100000")
                else:
                    _write(folder / "cpu.cfs_period_us", 100_000)
                    _write(folder / "cpu.cfs_quota_us", int(cpu_cores * 100_000))
            if controller == "cpu" and cpu_weight:
                for group in (parent, folder):
                    if self.v2[controller]:
                        _write(group / "cpu.weight", cpu_weight)
                    else:
                        _write(group / "cpu.shares", max(2, round(cpu_weight * 1024 / 100)))
            if controller == "memory" and memory_bytes:
                if self.v2[controller]:
                    _write(folder / "memory.max", memory_bytes)
                    _write(folder / "memory.swap.max", 0)
                else:
                    _write(folder / "memory.limit_in_bytes", memory_bytes)
                    if (folder / "memory.memsw.limit_in_bytes").exists():
                        _write(folder / "memory.memsw.limit_in_bytes", memory_bytes)  # no swap past the limit
        return folders

    def usage(self, attendee: str) -> dict:
        """What the attendee's server used: peak memory (MiB, None where the kernel keeps none) and OOM kills."""
        folder = self.children.get(attendee, {}).get("memory")
        if folder is None:
            return {"peak_memory_mib": None, "oom_kills": None}
        peak = _read_int(folder / "memory.max_usage_in_bytes") or _read_int(folder / "memory.peak")
        events = _events(folder / "memory.oom_control") or {}
        kills = events.get("oom_kill")
        if kills is None:
            kills = _events(folder / "memory.events").get("oom_kill")
        return {"peak_memory_mib": None if peak is None else round(peak / 2**20), "oom_kills": kills}

    def pids(self, attendee: str) -> list[int]:
        pids = set()
        for folder in self.children.get(attendee, {}).values():
            try:
                pids |= {int(p) for p in (folder / "cgroup.procs").read_text().split()}
            except OSError:
                pass
        return sorted(pids)

    def remove(self) -> None:
        """Stop what still runs in the class's cgroups (by id), then remove them."""
        for attendee in self.children:
            for sig in (signal.SIGTERM, signal.SIGKILL):
                pids = self.pids(attendee)
                for pid in pids:
                    try:
                        os.kill(pid, sig)
                    except ProcessLookupError:
                        pass
                deadline = time.monotonic() + 10
                while self.pids(attendee) and time.monotonic() < deadline:
                    time.sleep(0.2)
        for folders in self.children.values():
            for folder in folders.values():
                try:
                    folder.rmdir()
                except OSError:
                    pass
        for parent in self.parents.values():
            try:
                parent.rmdir()
            except OSError:
                pass
