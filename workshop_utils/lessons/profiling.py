"""Where does a training step spend its time? ``torch.profiler`` around the one training loop.

The profiler runs on a schedule: it skips ``wait`` steps (start-up), records but
throws away ``warmup`` steps (the profiler's own start-up cost), then keeps
``active`` steps. The kept steps become

* a table of the operators with the most *self* time (time in the operator
  itself, not in what it calls), which is where the work really is;
* a Chrome trace (``traces/<name>.json``): open it at https://ui.perfetto.dev
  or chrome://tracing to see every operator and kernel on a timeline;
* the same trace in TensorBoard's layout (``traces/tensorboard/``), for
  ``tensorboard --logdir`` with the ``torch-tb-profiler`` plugin;
* the peak memory of every step (``monitor.StepMemory``).
"""

from __future__ import annotations

import contextlib
import os
import re
import socket
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import torch
from torch.profiler import ProfilerActivity, profile, schedule

from ..spine.data import CifarData
from ..system.errors import WorkshopError
from ..system.hardware import pick_device
from .monitor import StepMemory
from ..spine.trainer import RunResult, TrainConfig, train


@dataclass
class ProfileRun:
    """What ``profile_training`` returns."""

    profiler: torch.profiler.profile
    result: RunResult
    chrome_trace: Path
    tensorboard_dir: Path
    step_memory: pd.DataFrame
    device: torch.device

    def top_ops(self, n: int = 10) -> pd.DataFrame:
        return top_ops(self.profiler, n, self.device)


def _exporter(chrome_trace: Path, tensorboard_dir: Path):
    def export(prof) -> None:
        chrome_trace.parent.mkdir(parents=True, exist_ok=True)
        tensorboard_dir.mkdir(parents=True, exist_ok=True)
        prof.export_chrome_trace(str(chrome_trace))
        # The name pattern the TensorBoard profiler plugin looks for: <worker>.<time>.pt.trace.json
        worker = f"{socket.gethostname()}_{os.getpid()}"
        (tensorboard_dir / f"{worker}.{time.time_ns()}.pt.trace.json").write_bytes(chrome_trace.read_bytes())

    return export


# What the profiler's C++ side prints on a machine whose PyTorch was built with CUDA but has no
# GPU (Kineto probing for devices, CUPTI, allocator notices): true but irrelevant, and an
# attendee reads "ERROR" as a failure of their cell.
_NATIVE_NOISE = re.compile(r"gpuGetDeviceCount|cudaGetDeviceCount|CUPTI|ActivityProfiler|^USDT:|"
                           r"^\[W\d* [^\]]*Allocator\.cpp", re.IGNORECASE)


@contextlib.contextmanager
def native_noise_filtered(noise: re.Pattern = _NATIVE_NOISE):
    """Hold back what native libraries write to the process's stderr in the block; replay all but the noise.

    Python's own warnings and prints are untouched where they do not go through file
    descriptor 2 (a notebook), and replayed in order where they do (a terminal).
    """
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as sink:
        os.dup2(sink.fileno(), 2)
        try:
            yield
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            sink.seek(0)
            kept = [line for line in sink.read().decode(errors="replace").splitlines()
                    if line.strip() and not noise.search(line)]
            if kept:
                print("\n".join(kept), file=sys.stderr, flush=True)


def profile_training(config: TrainConfig, data: CifarData, run_dir, name: str = "profile", wait: int = 1,
                     warmup: int = 1, active: int = 3) -> ProfileRun:
    """Train for ``wait + warmup + active`` steps under ``torch.profiler`` and export the traces."""
    if wait < 0 or warmup < 0 or active <= 0:
        raise WorkshopError(f"Profiler schedule wait={wait}, warmup={warmup}, active={active} is not valid.",
                            "use wait >= 0, warmup >= 0 and active >= 1.")
    device = pick_device(config.device)
    traces = Path(run_dir) / "traces"
    chrome_trace, tensorboard_dir = traces / f"{name}.json", traces / "tensorboard"
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    # The profiled steps are also the timed ones, so the record's throughput matches the trace.
    config = config.replace(name=name, max_steps=wait + warmup + active, warmup_steps=wait + warmup)
    memory = StepMemory(device)
    plan = schedule(wait=wait, warmup=warmup, active=active, repeat=1)
    with native_noise_filtered(), profile(activities=activities, schedule=plan, profile_memory=True,
                                          on_trace_ready=_exporter(chrome_trace, tensorboard_dir),
                                          record_shapes=True) as prof:

        def on_step(step: int) -> None:
            memory(step)
            prof.step()

        result = train(config, data, on_step=on_step)
    if not chrome_trace.exists():
        raise WorkshopError(f"The profiler wrote no trace: the run stopped before step {wait + warmup + active}.",
                            "use more training images or a smaller batch size.")
    return ProfileRun(prof, result, chrome_trace, tensorboard_dir, memory.frame(), device)


def top_ops(prof, n: int = 10, device: torch.device | None = None) -> pd.DataFrame:
    """The ``n`` operators with the most self time (device time on a GPU, CPU time otherwise)."""
    on_gpu = device is not None and torch.device(device).type == "cuda"
    rows = []
    for event in prof.key_averages():
        if event.key.startswith("ProfilerStep"):  # one wrapper per step, not an operator
            continue
        row = {"operator": event.key, "calls": event.count,
               "self_cpu_ms": event.self_cpu_time_total / 1e3, "cpu_total_ms": event.cpu_time_total / 1e3}
        if on_gpu:
            row["self_gpu_ms"] = getattr(event, "self_device_time_total", 0) / 1e3
        rows.append(row)
    table = pd.DataFrame(rows)
    if table.empty:
        return table
    key = "self_gpu_ms" if on_gpu else "self_cpu_ms"
    table["self_share"] = table[key] / table[key].sum()
    return table.sort_values(key, ascending=False).head(n).reset_index(drop=True)
