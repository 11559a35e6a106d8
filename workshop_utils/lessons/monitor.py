"""What the machine is doing while it trains: live utilisation and per-step peak memory.

``DeviceMonitor`` samples in a background thread, so the training loop is not
slowed down or changed. On a GPU it reads NVML (the library behind
``nvidia-smi``, here through ``nvidia-ml-py``): utilisation, memory in use, power
and temperature. On a CPU it reads, through ``psutil``, how busy this process
and its DataLoader workers keep the cores, and their memory. The rule of thumb
from the workshop slides: a GPU busy less than about 80% of the time is waiting
for something (data, Python, synchronisation), so there is a bottleneck to find.

``StepMemory`` is a per-step probe for ``train(..., on_step=...)``: the peak
memory of each step, optionally with a cap that turns "too much" into the same
``torch.OutOfMemoryError`` a full GPU raises, so out-of-memory handling can be
shown, and tested, on a CPU.
"""

from __future__ import annotations

import sys
import threading
import time

import pandas as pd
import torch

from ..system.errors import WorkshopError
from ..system.hardware import cpu_cores, mig_uuid, pick_device
from ..spine.timing import host_peak_rss_mib, memory_in_use_mib, reset_host_peak_rss, reset_peak_memory

BUSY_THRESHOLD_PCT = 80  # below this a GPU is usually starved (rule of thumb of the workshop slides)


class StepMemory:
    """Peak memory of every training step, measured above the level in use when the probe was made.

    Pass it as ``train(config, data, on_step=probe)``. On a GPU it reads the caching allocator's
    peak; on a CPU the process's resident-memory high-water mark. With ``limit_mib`` a step that
    needs more raises ``torch.OutOfMemoryError``: a memory cap that works on any device.
    """

    def __init__(self, device: torch.device | str | None = None, limit_mib: float | None = None):
        self.device = pick_device(device) if not isinstance(device, torch.device) else device
        self.limit_mib = limit_mib
        self.over_cap = False  # whether a step went over limit_mib: the stop was the cap's, not the device's
        self.peaks: list[tuple[int, float]] = []
        self.cuda = self.device.type == "cuda"
        reset_peak_memory(self.device)
        self.base_mib = memory_in_use_mib(self.device)

    def _peak_and_reset(self) -> float:
        if self.cuda:
            peak = torch.cuda.max_memory_allocated(self.device) / 2**20
            torch.cuda.reset_peak_memory_stats(self.device)
        else:
            peak = host_peak_rss_mib()
            reset_host_peak_rss()
        return max(0.0, peak - self.base_mib)

    def __call__(self, step: int) -> None:
        self.record(self._peak_and_reset(), step)

    def record(self, peak: float, step: int | None = None) -> None:
        """Keep a step's peak measured some other way, and raise as a step over ``limit_mib`` does."""
        self.peaks.append((step, peak))
        if self.limit_mib is not None and peak > self.limit_mib:
            self.over_cap = True
            raise torch.OutOfMemoryError(f"{'a step' if step is None else f'step {step}'} needed {peak:,.0f} MiB, "
                                         f"more than the {self.limit_mib:,.0f} MiB memory cap")

    def stop_status(self, batch_size: int) -> str:
        """The row's status for a run this probe watched that ran out of memory: the cap's, or the device's own."""
        if self.over_cap:
            return f"over the {self.limit_mib:,g} MiB memory cap at batch {batch_size}"
        return f"out of memory at batch {batch_size}"

    @property
    def max_mib(self) -> float | None:
        return max((p for _, p in self.peaks), default=None)

    def frame(self) -> pd.DataFrame:
        return pd.DataFrame(self.peaks, columns=["step", "peak_memory_mib"])


MEMORY_STOPS = ("out of memory", "over the")  # how a sweep's status starts when memory ended it: the device, a cap


def stopped_by_memory(status) -> bool:
    """Whether a sweep row's ``status`` says memory ended it: the device's own ("out of memory at batch B") or a
    cap standing in for it ("over the 600 MiB memory cap at batch B")."""
    return str(status).startswith(MEMORY_STOPS)


def is_out_of_memory(error: BaseException) -> bool:
    """Whether ``error`` is, or was caused by, running out of memory.

    torch.compile wraps an error raised while it compiles (max-autotune trying kernels at a large batch)
    in its own exception, with the out-of-memory error as the cause.
    """
    while error is not None:
        if isinstance(error, torch.OutOfMemoryError):
            return True
        error = error.__cause__
    return False


def release_failed_run(device: torch.device) -> None:
    """After an out-of-memory run: free its tensors and hand the GPU allocator's cached blocks back.

    Call it outside the ``except`` block: inside it the traceback still holds the failed run's frames.
    """
    import gc

    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


# ---------------------------------------------------------------- live sampling


def _nvml_handle(device: torch.device):
    try:
        import pynvml
    except ImportError:
        return None, "nvidia-ml-py is not installed, so GPU metrics cannot be read (pip install nvidia-ml-py)"
    try:
        pynvml.nvmlInit()
        slice_uuid = mig_uuid(device)
        if slice_uuid is not None:  # a MIG slice: by index NVML would read the whole physical GPU
            return pynvml.nvmlDeviceGetHandleByUUID(slice_uuid), None
        try:  # NVML numbers GPUs physically; CUDA_VISIBLE_DEVICES may renumber them for PyTorch
            index = torch.cuda._get_nvml_device_index(device)
        except Exception as err:
            return None, f"NVML cannot tell which GPU is {device} ({err}), so GPU metrics are not read"
        return pynvml.nvmlDeviceGetHandleByIndex(index), None
    except pynvml.NVMLError as err:
        return None, f"NVML is not usable here ({err})"


def _gpu_sample(handle) -> dict:
    import pynvml

    def read(fn, scale=1.0):
        try:
            return fn(handle) * scale
        except pynvml.NVMLError:  # some boards do not report power or temperature
            return None

    return {
        "utilization_pct": read(lambda h: pynvml.nvmlDeviceGetUtilizationRates(h).gpu),
        "memory_used_mib": read(lambda h: pynvml.nvmlDeviceGetMemoryInfo(h).used, 1 / 2**20),
        "power_w": read(pynvml.nvmlDeviceGetPowerUsage, 1e-3),
        "temperature_c": read(lambda h: pynvml.nvmlDeviceGetTemperature(h, pynvml.NVML_TEMPERATURE_GPU)),
    }


class _ProcessTreeSampler:
    """CPU use and memory of this process and its children (DataLoader workers), not the whole machine.

    On a shared node the machine-wide figure mostly shows other people's jobs. Utilisation is the
    share of the cores this process may use, 100% meaning all of them busy with our training.
    """

    def __init__(self):
        import psutil

        self.psutil = psutil
        self.cores = cpu_cores()
        self.known: dict[int, object] = {}
        self.sample()  # the first cpu_percent of each process only starts its interval

    def sample(self) -> dict:
        me = self.psutil.Process()
        busy, rss = 0.0, 0
        for process in [me, *me.children(recursive=True)]:
            process = self.known.setdefault(process.pid, process)
            try:
                busy += process.cpu_percent(interval=None)
                rss += process.memory_info().rss
            except self.psutil.Error:  # a worker that exited between listing and reading
                self.known.pop(process.pid, None)
        return {"utilization_pct": min(100.0, busy / self.cores), "memory_used_mib": rss / 2**20,
                "power_w": None, "temperature_c": None}


class DeviceMonitor:
    """Background sampler: ``with DeviceMonitor() as mon: train(...)``, then ``mon.frame()``.

    Samples every ``interval_s`` seconds. It reads the GPU training runs on, or the CPU when
    there is none (or when NVML cannot be used, which it says once).
    """

    def __init__(self, interval_s: float = 0.25, device: torch.device | str | None = None):
        if interval_s <= 0:
            raise WorkshopError(f"interval_s must be positive, got {interval_s}.", "try interval_s=0.25.")
        self.interval_s = interval_s
        self.device = pick_device(device) if not isinstance(device, torch.device) else device
        self.samples: list[dict] = []
        self.source = "cpu"
        self._handle = None
        if self.device.type == "cuda":
            self._handle, problem = _nvml_handle(self.device)
            if self._handle is not None:
                self.source = "gpu"
            else:
                print(f"note: {problem}; sampling the CPU instead.", file=sys.stderr)
        if self.source == "cpu":
            try:
                self._cpu = _ProcessTreeSampler()
            except ImportError:
                raise WorkshopError("psutil is not installed, so CPU utilisation cannot be read.",
                                    "pip install psutil") from None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="device-monitor")

    def _sample(self) -> dict:
        return _gpu_sample(self._handle) if self.source == "gpu" else self._cpu.sample()

    def _run(self) -> None:
        start = time.perf_counter()
        while not self._stop.wait(self.interval_s):
            self.samples.append({"t_s": time.perf_counter() - start, **self._sample()})

    def __enter__(self) -> "DeviceMonitor":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()

    def frame(self) -> pd.DataFrame:
        columns = ["t_s", "utilization_pct", "memory_used_mib", "power_w", "temperature_c"]
        return pd.DataFrame(self.samples, columns=columns)


def monitor_verdict(frame: pd.DataFrame, threshold: float = BUSY_THRESHOLD_PCT, source: str = "gpu") -> str:
    """One sentence: mean utilisation, share of samples under ``threshold``, and what it suggests."""
    util = frame["utilization_pct"].dropna()
    if frame.empty:
        return "No samples were taken: the run was shorter than one sampling interval."
    if util.empty:
        # NVML answers "not supported" for a MIG slice's utilisation (and on some virtual GPUs).
        return ("This GPU does not report its utilisation (a MIG slice or virtual GPU does not): read the "
                "profiler's GPU time per step instead (section 1), or DCGM's profiling metrics where the site has them.")
    below = float((util < threshold).mean())
    what = "GPU" if source == "gpu" else "CPU (this process and its workers, share of all cores)"
    verdict = ("a bottleneck outside the device's arithmetic: look at data loading, Python overhead and syncs"
               if util.mean() < threshold else "the device is kept busy; speed now depends on the work itself")
    return (f"{what} utilisation averaged {util.mean():.0f}% ({below:.0%} of samples under {threshold:.0f}%): "
            f"{verdict}.")


def plot_monitor(frame: pd.DataFrame, title: str = "Device metrics while training",
                 threshold: float = BUSY_THRESHOLD_PCT):
    """Utilisation (with the threshold line) and memory over time; power and temperature when known.

    The title's second line states the finding: mean utilisation and the share of samples under
    ``threshold``, and the peak memory in use.
    """
    import matplotlib.pyplot as plt

    from ..system.plotstyle import PALETTE, style

    extra = [c for c in ("power_w", "temperature_c") if frame[c].notna().any()]
    util = frame["utilization_pct"].dropna()
    memory = frame["memory_used_mib"].dropna()
    with style():
        fig, axes = plt.subplots(1, 2 + len(extra), figsize=(4.2 * (2 + len(extra)), 3.4))
        ax = axes[0]
        measured = f"utilisation (mean {util.mean():.0f}%)" if not util.empty else "utilisation (not reported)"
        ax.plot(frame["t_s"], frame["utilization_pct"], lw=1.2, color=PALETTE[0], label=measured)
        ax.axhline(threshold, color=PALETTE[3], ls="--", lw=1, label=f"{threshold:.0f}% rule of thumb")
        ax.set(xlabel="time since sampling began (s)", ylabel="utilisation (%)", ylim=(0, 105), title="Utilisation")
        ax.legend(loc="lower right")
        labels = {"memory_used_mib": "memory used (MiB)", "power_w": "power (W)", "temperature_c": "temperature (°C)"}
        colors = {"memory_used_mib": PALETTE[2], "power_w": PALETTE[1], "temperature_c": PALETTE[4]}
        for ax, column in zip(axes[1:], ["memory_used_mib", *extra]):
            ax.plot(frame["t_s"], frame[column], lw=1.2, color=colors[column])
            ax.set(xlabel="time since sampling began (s)", ylabel=labels[column],
                   title=labels[column].split(" (")[0].capitalize())
        if util.empty:
            finding = "utilisation not reported"
        else:
            below = float((util < threshold).mean())
            finding = f"utilisation averaged {util.mean():.0f}%, {below:.0%} of samples under {threshold:.0f}%"
        if not memory.empty:
            finding += f"; peak memory {memory.max():,.0f} MiB"
        fig.suptitle(f"{title}\n{finding}")
        fig.tight_layout()
    return fig
