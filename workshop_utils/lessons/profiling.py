"""Where does a training step spend its time? ``torch.profiler`` around the one training loop.

The profiler runs on a schedule: it skips ``wait`` steps (start-up), records but
throws away ``warmup`` steps (the profiler's own start-up cost), then keeps
``active`` steps. The kept steps become

* a table of the operators with the most *self* time (time in the operator
  itself, not in what it calls), which is where the work really is;
* a Chrome trace (``traces/<name>.json``): open it at https://ui.perfetto.dev
  (or chrome://tracing) to see every operator and kernel on a timeline. For summaries of
  such traces (GPU time by kernel, idle time and its causes, per rank of a distributed run),
  the maintained tool is Holistic Trace Analysis (``pip install HolisticTraceAnalysis``; the
  kit does not install it);
* the tensor memory of every kept step (``tensor_memory_by_step``): the bytes the profiler saw allocated and
  not yet freed, at their peak in each step, counted from its own allocation records. A process's resident size
  would grow step by step under the profiler, which keeps its records in memory.

``step_breakdown`` reads the kept steps back as one row: the milliseconds of a step spent in
each of its named phases (data, forward, backward, optimizer; the trainer names them when
``annotate`` is on), what is left between them, operators and kernels launched per step, and
host synchronisations per step. ``profile_rungs`` gives that row for every rung of the
optimization ladder, which shows what bounds each rung.
"""

from __future__ import annotations

import re
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import torch
from torch.profiler import ProfilerActivity, schedule

from ..spine.data import CifarData
from ..system.errors import WorkshopError
from ..system.results import path_for_message
from ..system.plotstyle import style
from ..system.hardware import pick_device
from ..spine.timing import PHASES, allocation_records, native_noise_filtered, profiler
from ..spine.trainer import RunResult, TrainConfig, train
from .sweeps import Rung, rung_configs, same_as_below
from ..system.progress import progress_bar


@dataclass
class ProfileRun:
    """What ``profile_training`` returns."""

    profiler: torch.profiler.profile
    result: RunResult
    chrome_trace: Path
    step_memory: pd.DataFrame
    device: torch.device

    def top_ops(self, n: int = 10) -> pd.DataFrame:
        return top_ops(self.profiler, n, self.device)


def _free_space(folder: Path) -> str:
    try:
        return f"{shutil.disk_usage(folder).free / 2**20:,.1f} MiB"
    except OSError:
        return "no telling how much is"


def _trace_is_whole(path: Path) -> bool:
    """Whether the Chrome trace ends as torch's exporter ends one: with its name, after every event."""
    with open(path, "rb") as f:
        f.seek(max(0, path.stat().st_size - 4096))
        tail = f.read()
    return re.search(rb'"traceName":\s*"(?:[^"\\]|\\.)*"\s*}\s*$', tail) is not None


def _exporter(chrome_trace: Path):
    def export(prof) -> None:
        chrome_trace.parent.mkdir(parents=True, exist_ok=True)
        prof.export_chrome_trace(str(chrome_trace))

    return export


def profile_training(config: TrainConfig, data: CifarData, run_dir, name: str = "profile", wait: int = 1,
                     warmup: int = 1, active: int = 3, detail: bool = True) -> ProfileRun:
    """Train for ``wait + warmup + active`` steps under ``torch.profiler`` and export the Chrome trace.

    ``detail`` also records every operator's input shapes and allocations (the memory columns,
    the trace's shapes, ``step_memory``), which slows the profiled steps further; without it
    ``step_memory`` is empty.
    """
    if wait < 0 or warmup < 0 or active <= 0:
        raise WorkshopError(f"Profiler schedule wait={wait}, warmup={warmup}, active={active} is not valid.",
                            "use wait >= 0, warmup >= 0 and active >= 1.")
    device = pick_device(config.device)
    traces = Path(run_dir) / "traces"
    chrome_trace = traces / f"{name}.json"
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    # The profiled steps are also the timed ones, so the record's throughput matches the trace.
    config = config.replace(name=name, max_steps=wait + warmup + active, warmup_steps=wait + warmup, annotate=True)
    plan = schedule(wait=wait, warmup=warmup, active=active, repeat=1)
    chrome_trace.unlink(missing_ok=True)  # an earlier run's trace must not pass for this one's
    with native_noise_filtered(), profiler(activities=activities, schedule=plan, profile_memory=detail,
                                          on_trace_ready=_exporter(chrome_trace),
                                          record_shapes=detail) as prof:

        result = train(config, data, on_step=lambda step: prof.step())
    if chrome_trace.exists() and not _trace_is_whole(chrome_trace):
        chrome_trace.unlink()  # cut short by a full disk: torch's exporter prints that, and raises nothing
    if not chrome_trace.exists():
        Path(f"{chrome_trace}.tmp").unlink(missing_ok=True)  # what the profiler's failed write left behind
        if result.metrics.get("steps", 0) >= wait + warmup + active:  # it profiled them all, and could not write
            raise WorkshopError(f"The profiler ran its {wait + warmup + active} steps but could not write its trace "
                                f"{path_for_message(chrome_trace)}: {_free_space(traces)} free there, so the disk is "
                                "likely full or your quota used up.",
                                "free space there (delete old run folders under runs/) and run the cell again.")
        raise WorkshopError(f"The profiler wrote no trace: the run stopped before step {wait + warmup + active}.",
                            "use more training images or a smaller batch size.")
    return ProfileRun(prof, result, chrome_trace, tensor_memory_by_step(prof, device, first_step=wait + warmup + 1),
                      device)


def tensor_memory_by_step(prof, device: torch.device, first_step: int = 1) -> pd.DataFrame:
    """Per kept step of a profile recorded with ``profile_memory=True``: the step's number (``first_step`` for the
    first kept one) and ``tensor_peak_mib``, the bytes of tensors the profiler saw allocated on ``device`` and not yet
    freed, at their peak during the step, counted from the start of the kept steps.

    Every allocation and free is one of the profiler's own records, so the figure is the same on every run and
    grows only when tensors outlive their step (a leak); the process's resident size, by contrast, grows under the
    profiler as it keeps its records. Empty when the profile recorded no memory.
    """
    events = list(prof.profiler.kineto_results.events()) if prof.profiler is not None else []
    steps = sorted((e.start_ns(), e.end_ns()) for e in events if e.name().startswith("ProfilerStep#"))
    memory = allocation_records(prof, device)
    rows, held, index = [], 0, 0
    for number, (start, end) in enumerate(steps, start=first_step):
        peak = held
        while index < len(memory) and memory[index][0] <= end:
            held += memory[index][1]
            if memory[index][0] >= start:
                peak = max(peak, held)
            index += 1
        rows.append({"step": number, "tensor_peak_mib": peak / 2**20})
    return pd.DataFrame(rows if memory else [], columns=["step", "tensor_peak_mib"])


def top_ops(prof, n: int = 10, device: torch.device | None = None) -> pd.DataFrame:
    """The ``n`` operators with the most self time (device time on a GPU, CPU time otherwise)."""
    on_gpu = device is not None and torch.device(device).type == "cuda"
    rows = []
    for event in prof.key_averages():
        # Operators only: not the named ranges (steps, phases) nor, on a GPU, their copies on the GPU timeline
        # and the kernels themselves, whose time is already the launching operator's device time.
        if event.is_user_annotation or event.key.startswith("ProfilerStep") or event.device_type.name != "CPU":
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


# On a GPU, the runtime calls in which the host waits for it: a value read back (.item(), printing a
# tensor, a Python ``if`` on one) ends in one, as does an explicit synchronize. Counting the read-back
# operator as well would count each wait twice.
_GPU_WAITS = {"cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize"}
# The host calls that start work on the GPU: one kernel each, or a whole recorded CUDA graph.
_GRAPH_LAUNCHES = {"cudaGraphLaunch", "cuGraphLaunch"}
_LAUNCHES = {"cudaLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernel", "cuLaunchKernelEx",
             "cudaLaunchCooperativeKernel", *_GRAPH_LAUNCHES}


def _is_kernel(event) -> bool:
    """A kernel on the GPU timeline: not a named range's copy there, not a memory copy or fill."""
    return (event.device_type.name == "CUDA" and not event.is_user_annotation
            and not event.name.startswith(("Memcpy", "Memset")))


# On a CPU nothing waits, but a read-back is counted all the same: it is the line that would stall a GPU loop.
_READ_BACK = {"aten::_local_scalar_dense"}


def _optimizer_counter_read(event) -> bool:
    """A read-back inside ``Optimizer.step``: Adam and AdamW read each parameter's step counter, which they keep
    on the host unless fused or capturable (where it stays on the GPU and is never read back). On a GPU that
    read waits for nothing, so it is no host sync of the training loop."""
    parent = event.cpu_parent
    while parent is not None:
        if parent.name.startswith("Optimizer.step"):
            return True
        parent = parent.cpu_parent
    return False


def _host_range(event) -> bool:
    """A range the host recorded (a step, a phase), not its copy on the GPU timeline (``gpu_user_annotation``)."""
    return event.device_type.name == "CPU"


def step_breakdown(run: ProfileRun) -> dict:
    """Where the profiled steps went, per step: milliseconds per phase, launches and host syncs.

    On a CPU a phase's time is its wall time. On a GPU it is the time of the kernels launched
    during the phase, and ``idle_ms`` is the rest of the step: the GPU waiting for the host
    (launch overhead, Python, data, syncs). A kernel belongs to the phase of the host call that
    launched it (the runtime call shares the kernel's correlation id), whichever thread made it
    (autograd runs the backward pass on its own thread) and whether the kernel ran alone or inside
    a replayed CUDA graph. ``kernels_per_step`` counts kernels that ran; ``launches_per_step``
    counts the host's launch calls, of which ``graph_launches_per_step`` replayed a whole graph.
    """
    events = run.profiler.events()
    # On a GPU each named range appears twice, on the host and on the GPU timeline: the host's copy decides.
    steps = [e.time_range for e in events if e.name.startswith("ProfilerStep") and _host_range(e)]
    windows = {name: [e.time_range for e in events if e.name == name and _host_range(e)] for name in PHASES}
    if not steps or not windows["forward"]:
        raise WorkshopError("The profile holds no named steps or phases.",
                            "profile with profile_training, which names the phases.")
    n = len(steps)
    step_ms = sum(r.end - r.start for r in steps) / n / 1e3
    on_gpu = run.device.type == "cuda"
    phase_ms = {name: 0.0 for name in PHASES}
    counts = {}
    if on_gpu:
        launches = {e.id: e.time_range.start for e in events if _host_range(e) and e.name in _LAUNCHES}
        kernels = [e for e in events if _is_kernel(e)]
        for kernel in kernels:
            launched = launches.get(kernel.id)
            phase = None if launched is None else next(
                (name for name, ranges in windows.items() if any(r.start <= launched <= r.end for r in ranges)), None)
            if phase is not None:
                phase_ms[phase] += (kernel.time_range.end - kernel.time_range.start) / n / 1e3
        graph_launches = sum(1 for e in events if _host_range(e) and e.name in _GRAPH_LAUNCHES)
        counts = {"kernels_per_step": len(kernels) / n, "launches_per_step": len(launches) / n,
                  "graph_launches_per_step": graph_launches / n}
    else:
        for name, ranges in windows.items():
            phase_ms[name] = sum(r.end - r.start for r in ranges) / n / 1e3
    data_windows = windows["data"]
    waits = _GPU_WAITS if on_gpu else _READ_BACK
    # outside the data loader, whose own cost is data_ms (on a CPU it reads its crop offsets back, harmlessly)
    syncs = sum(1 for e in events if e.name in waits
                and not any(r.start <= e.time_range.start <= r.end for r in data_windows)
                and (on_gpu or not _optimizer_counter_read(e)))
    # Operators called from Python or autograd, not the ones they call in turn.
    operators = sum(1 for e in events if e.name.startswith("aten::")
                    and not (e.cpu_parent is not None and e.cpu_parent.name.startswith("aten::")))
    rest = max(0.0, step_ms - sum(phase_ms.values()))
    return {"step_ms": step_ms, **{f"{name}_ms": ms for name, ms in phase_ms.items()},
            ("idle_ms" if on_gpu else "other_ms"): rest,
            "operators_per_step": operators / n,
            **{key: counts.get(key) for key in ("kernels_per_step", "launches_per_step", "graph_launches_per_step")},
            "host_syncs_per_step": syncs / n}


def attention_kernels(model: torch.nn.Module, tokens: torch.Tensor, precision: str = "fp32") -> list[str]:
    """The operators that computed the GPT's attention in one forward pass, as the profiler recorded them.

    ``scaled_dot_product_attention`` dispatches to one of several kernels (flash, memory-efficient, cuDNN,
    or the math fallback) by device, dtype and shapes; this names the one it took. On a GPU the CUDA
    kernel's own name is listed too. The unfused path shows as its softmax.
    """
    from ..spine.precision import autocast

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if tokens.is_cuda else [])
    with native_noise_filtered(), torch.no_grad(), autocast(precision, tokens.device), \
            profiler(activities=activities) as prof:
        model(tokens)
    wanted = ("scaled_dot_product", "flash", "efficient_attention", "cudnn_attention", "fmha")
    names = {event.key for event in prof.key_averages()}
    found = sorted(name for name in names if any(w in name.lower() for w in wanted))
    return found or sorted(name for name in names if name in ("aten::softmax", "aten::_softmax"))


def profile_rungs(base: TrainConfig, data: CifarData, rungs: list[Rung], run_dir, active: int = 3,
                  warmup: int = 1, progress: bool = True) -> pd.DataFrame:
    """``step_breakdown`` of every rung that applies here and changes something, each profiled for ``active`` steps.

    A profiled step runs slower than a timed one (the profiler records every operator), so
    these rows say where the time goes, and the ladder's own table says how fast each rung is.
    ``warmup`` steps run first and are not kept: compiled rungs compile there.
    """
    rows = []
    configs = rung_configs(base, rungs)
    trained = [(rung, config) for rung, config, same in zip(rungs, configs, same_as_below(configs))
               if config is not None and not same]
    for rung, config in progress_bar(trained, desc="profiled rungs", unit="rung", disable=not progress, file=sys.stderr):
        # CUDA graph trees run a step eagerly, record the graph on the next and replay from the third on
        graphs = config.compile and config.compile_mode != "default"
        run = profile_training(config.replace(progress=False), data, run_dir, name=f"{config.name}-profile",
                               wait=0, warmup=max(warmup, 2) if graphs else warmup, active=active, detail=False)
        # Samples a step: a rung that changes the batch does more work a step, so steps compare per sample.
        rows.append({"rung": rung.label, "samples_per_step": config.batch_size * config.accumulation_steps,
                     **step_breakdown(run)})
    return pd.DataFrame(rows)


def plot_step_breakdown(table: pd.DataFrame):
    """One stacked bar per rung: a step's milliseconds by phase, and what is left between phases."""
    import matplotlib.pyplot as plt

    rest = "idle_ms" if "idle_ms" in table else "other_ms"
    parts = [f"{name}_ms" for name in PHASES] + [rest]
    names = {rest: "GPU idle (launches, Python, waits)" if rest == "idle_ms" else "between phases"}
    with style():
        fig, ax = plt.subplots(figsize=(8, 0.5 * len(table) + 1.8))
        left = np.zeros(len(table))
        for part in parts:
            values = table[part].to_numpy(dtype=float)
            ax.barh(table["rung"], values, left=left, label=names.get(part, part.removesuffix("_ms")))
            left += values
        ax.invert_yaxis()  # the ladder reads top-down, baseline first
        top = table.iloc[-1]
        biggest = max(parts, key=lambda part: top[part])
        ax.set(xlabel="milliseconds per profiled step" + (" (GPU kernel time by launching phase)"
                                                          if rest == "idle_ms" else " (wall time)"),
               ylabel="ladder rung (cumulative)",
               title=f"Where a step goes, rung by rung\nTop rung: {names.get(biggest, biggest.removesuffix('_ms'))} "
                     f"takes {top[biggest] / max(top[parts].sum(), 1e-9):.0%} of the step")
        ax.legend(loc="lower right", fontsize=8)
        fig.tight_layout()
    return fig


def nsys_missing() -> str | None:
    """Why Nsight Systems cannot profile here, or None when it can (an ``nsys`` binary and a GPU)."""
    if shutil.which("nsys") is None:
        return "no nsys command on this machine (Nsight Systems comes with the CUDA toolkit; on a cluster: " \
               "module load nsight-systems or cuda)"
    if not torch.cuda.is_available():
        return "no GPU visible: Nsight Systems traces CUDA kernels and NVTX ranges on a GPU"
    return None


def nsys_command(config: TrainConfig, report: Path) -> list[str]:
    """``nsys profile`` around ``python -m workshop_utils.train``, recording the timed steps only.

    The trainer (with ``annotate``) opens the CUDA profiler's capture range when warm-up ends and
    closes it after the last step of that epoch, before its evaluation; ``--capture-range=cudaProfilerApi``
    makes nsys record exactly that span, so start-up, compilation and evaluation stay out of the report.
    """
    from .slurm_jobs import config_flags

    # Against a base with no name, so --name is always given: the command's default name is its own.
    flags = config_flags(config.replace(annotate=True), base=TrainConfig(name=""), skip=())
    return ["nsys", "profile", "--trace=cuda,nvtx,osrt", "--capture-range=cudaProfilerApi",
            "--capture-range-end=stop", "--force-overwrite=true", "--output", str(report),
            sys.executable, "-m", "workshop_utils.train", *flags]


def nsys_profile(config: TrainConfig, run_dir, name: str = "nsys", timeout_s: float = 600) -> pd.DataFrame:
    """Profile a training run with Nsight Systems; return its NVTX summary (time per named phase).

    The report, ``traces/<name>.nsys-rep``, opens in the Nsight Systems GUI on a laptop.
    """
    import subprocess

    reason = nsys_missing()
    if reason:
        raise WorkshopError(f"Nsight Systems cannot run here: {reason}.", "run this on a GPU node with nsys.")
    report = Path(run_dir) / "traces" / name
    report.parent.mkdir(parents=True, exist_ok=True)
    ran = subprocess.run(nsys_command(config, report), capture_output=True, text=True, timeout=timeout_s)
    if ran.returncode != 0:
        raise WorkshopError(f"nsys profile failed ({ran.returncode}): {(ran.stderr or ran.stdout).strip()[-300:]}",
                            "run the printed command in a terminal to see all of it.")
    # The NVTX summary report is nvtx_sum since Nsight Systems 2023.2, nvtxsum before.
    for report_name in ("nvtx_sum", "nvtxsum"):
        stats = subprocess.run(["nsys", "stats", "--report", report_name, "--format", "csv", "--output", "-",
                                f"{report}.nsys-rep"], capture_output=True, text=True, timeout=timeout_s)
        if stats.returncode == 0 and "," in stats.stdout:
            import io

            lines = stats.stdout[stats.stdout.find("Time"):]  # skip the lines nsys prints before the table
            return pd.read_csv(io.StringIO(lines))
    raise WorkshopError(f"nsys stats found no NVTX ranges in {report}.nsys-rep.",
                        "check that the run trained past its warm-up steps.")
