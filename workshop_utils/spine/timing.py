"""Honest step timing on GPU and CPU.

GPU work is asynchronous: ``time.perf_counter()`` around a step measures how fast
Python *queued* the kernels, not how fast they ran. ``StepTimer`` records a CUDA
event after each step instead and reads them all once, after one synchronize, at
the end, so timing adds no host sync to the hot loop. On the CPU, where work is
synchronous, it uses ``perf_counter``. The first ``warmup_steps`` are dropped:
they pay for cuDNN autotuning, torch.compile and the allocator warming up.

Each interval runs from the end of one step to the end of the next, so waiting
for data counts: the throughput is what the user would see.

Everything else that is timed uses the same clock through two companions:

* ``time_repeats(fn, repeats, warmup, device)``: call ``fn`` ``warmup`` times untimed, then
  ``repeats`` times, each bracketed by two marks; returns a ``Timings`` (seconds per repeat,
  with ``median`` and ``mean``). The repeats run back to back, so on a GPU each one measures
  the device's time for its work, not how fast Python queued it.
* ``RegionTimer``: ``with timer: ...`` (or ``start()``/``stop()``) around a stretch of work
  that is host and device work together, such as a pass over a data loader. A region starts
  by waiting for the device, so work queued before it is not counted and its clock starts
  when the host's does.

On a GPU both record CUDA events on the device's current stream and read them after one
synchronize (none between back-to-back repeats); on the CPU they read ``perf_counter``.
Host-side wall clocks that are not performance measurements (a monitor's sampling clock, a
notebook's wall time, an asynchronous save's host stall) stay on ``time``.
"""

from __future__ import annotations

import contextlib
import ctypes
import gc
import os
import re
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from ..system.errors import WorkshopError


def _mark(device: torch.device):
    """A point in time on ``device``: a recorded CUDA event on its current stream, or ``perf_counter``."""
    if device.type == "cuda":
        event = torch.cuda.Event(enable_timing=True)
        event.record(torch.cuda.current_stream(device))
        return event
    return time.perf_counter()


def _seconds(start, end) -> float:
    """Seconds between two marks of ``_mark`` (CUDA events: only after a synchronize)."""
    if isinstance(start, (int, float)):
        return float(end - start)
    return start.elapsed_time(end) / 1e3


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class StepTimer:
    def __init__(self, device: torch.device, warmup_steps: int = 0):
        self.device = torch.device(device)
        self.cuda = self.device.type == "cuda"
        self.warmup_steps = warmup_steps
        self.segments: list[list] = []  # marks per uninterrupted stretch of training
        self.steps: list[list[int]] = []  # global step number of each mark after the first
        self.data_wait_s = 0.0  # host time spent blocked on the loader, timed steps only

    def _now(self):
        return _mark(self.device)

    def begin(self) -> None:
        """Start a stretch of timed steps (after evaluation or at an epoch start)."""
        self.segments.append([self._now()])
        self.steps.append([])

    def step_done(self, step: int) -> None:
        self.segments[-1].append(self._now())
        self.steps[-1].append(step)

    def add_data_wait(self, step: int, seconds: float) -> None:
        if step >= self.warmup_steps:
            self.data_wait_s += seconds

    def step_times(self, warmup: bool = False) -> np.ndarray:
        """Seconds per timed step, or per warm-up step with ``warmup`` (one synchronize here, none in the loop)."""
        _synchronize(self.device)
        times = []
        for marks, steps in zip(self.segments, self.steps):
            for (a, b), step in zip(zip(marks, marks[1:]), steps):
                if (step < self.warmup_steps) == warmup:
                    times.append(_seconds(a, b))
        return np.asarray(times, dtype=float)

    def last_stretch(self) -> tuple[list[int], list[float]]:
        """Step numbers and seconds per step of the latest stretch, warm-up included (one synchronize)."""
        _synchronize(self.device)
        if not self.segments:
            return [], []
        marks = self.segments[-1]
        return list(self.steps[-1]), [_seconds(a, b) for a, b in zip(marks, marks[1:])]

    def summary(self, samples_per_step: int) -> dict:
        """Throughput and step-time statistics; None values when no step was timed."""
        times = self.step_times()
        # Compilation, autotuning and CUDA-graph capture happen in the warm-up steps: reported on their own,
        # so a compiled rung's one-off cost is visible and never mixed into its steady-state throughput.
        warmup_s = float(self.step_times(warmup=True).sum())
        if times.size == 0:
            return {"timed_steps": 0, "samples_per_s": None, "step_ms_mean": None, "step_ms_median": None,
                    "step_ms_p90": None, "step_ms_std": None, "data_wait_fraction": None, "timed_s": 0.0,
                    "warmup_s": warmup_s}
        total = float(times.sum())
        return {
            "warmup_s": warmup_s,
            "timed_steps": int(times.size),
            "timed_s": total,
            "samples_per_s": samples_per_step * times.size / total,
            "step_ms_mean": 1e3 * float(times.mean()),
            "step_ms_median": 1e3 * float(np.median(times)),
            "step_ms_p90": 1e3 * float(np.percentile(times, 90)),
            "step_ms_std": 1e3 * float(times.std()),
            "data_wait_fraction": min(1.0, self.data_wait_s / total),
        }


@dataclass(frozen=True, eq=False)
class Timings:
    """Seconds per timed repeat or region (warm-up left out), and the statistics read from them."""

    seconds: np.ndarray
    # The shape and dtype of the tensor the timed function returned (time_repeats), None otherwise: what a check
    # reads to tell which workload these seconds belong to, with no second timing to compare (a bfloat16 product of
    # the same shape runs many times faster than a float32 one).
    output_shape: tuple | None = None
    output_dtype: torch.dtype | None = None

    def __len__(self) -> int:
        return len(self.seconds)

    def __iter__(self):  # the seconds themselves: statistics.median(timings), np.median(timings), sorted(timings)
        return iter(float(s) for s in self.seconds)

    def __getitem__(self, index):
        return self.seconds[index]

    def _need(self) -> np.ndarray:
        if len(self.seconds) == 0:
            raise WorkshopError("Nothing was timed: every repeat was warm-up.",
                                "time more repeats (or regions) than warm-up ones.")
        return self.seconds

    @property
    def median(self) -> float:
        return float(np.median(self._need()))

    @property
    def mean(self) -> float:
        return float(np.mean(self._need()))

    @property
    def total(self) -> float:
        return float(np.sum(self.seconds))


class RegionTimer:
    """Seconds per timed region: ``with timer: ...`` or ``timer.start()`` ... ``timer.stop()``.

    A region is host and device work together (a pass over a data loader, reading a storage
    layout into device tensors). On a GPU it starts with a synchronize, so the work queued before it is not
    counted and the start event fires when the host gets there; its end is a CUDA event, read
    with one synchronize in ``times()``, after all regions. On the CPU it reads ``perf_counter``.
    The first ``warmup`` regions are timed but left out of ``times()``.
    """

    def __init__(self, device: torch.device | str = "cpu", warmup: int = 0):
        self.device = torch.device(device)
        self.warmup = warmup
        self.marks: list[tuple] = []
        self._open = None

    def start(self) -> None:
        if self._open is not None:
            raise RuntimeError("RegionTimer.start() inside a region: stop() it first")
        _synchronize(self.device)
        self._open = _mark(self.device)

    def stop(self) -> None:
        if self._open is None:
            raise RuntimeError("RegionTimer.stop() without start()")
        self.marks.append((self._open, _mark(self.device)))
        self._open = None

    def __enter__(self) -> "RegionTimer":
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def times(self) -> Timings:
        """Seconds per region after the warm-up ones (one synchronize, here)."""
        _synchronize(self.device)
        return Timings(np.asarray([_seconds(a, b) for a, b in self.marks[self.warmup:]], dtype=float))


def time_repeats(fn: Callable[[], object], repeats: int, warmup: int = 1, device: torch.device | str = "cpu",
                 before: Callable[[], object] | None = None) -> Timings:
    """Seconds of each of ``repeats`` calls of ``fn``, after ``warmup`` untimed calls.

    ``device`` is where ``fn``'s work runs: on a GPU every call is bracketed by two CUDA events
    and the device is synchronized once, after the last call, so back-to-back calls measure
    the device's time for each, not how fast Python queued them; on the CPU the marks are
    ``perf_counter`` readings. ``before``, when given, runs untimed before every call (warm-up
    ones included): resetting a buffer, a barrier among ranks. On a GPU the device is
    synchronized after it, so its work is not counted either.
    """
    if not isinstance(repeats, int) or repeats < 1:
        raise WorkshopError(f"repeats must be a whole number >= 1, got {repeats!r}.", "use repeats=1 or more.")
    if not isinstance(warmup, int) or warmup < 0:
        raise WorkshopError(f"warmup must be a whole number >= 0, got {warmup!r}.", "use warmup=0 or more.")
    for name, given in (("fn", fn), ("before", before)):
        if not callable(given) and (name == "fn" or given is not None):
            raise WorkshopError(f"{name} must be a function to call, not {type(given).__name__}: time_repeats calls "
                                "it once per repeat.", f"pass the work as a function of no arguments, e.g. "
                                f"{name}=lambda: a @ b (not the result a @ b).")
    device = torch.device(device)
    for _ in range(warmup):
        if before is not None:
            before()
        fn()
    _synchronize(device)  # the warm-up's queued work is finished before the first timed call
    marks, shape, dtype = [], None, None
    for _ in range(repeats):
        if before is not None:
            before()
            _synchronize(device)
        start = _mark(device)
        out = fn()
        marks.append((start, _mark(device)))
        shape, dtype = (tuple(out.shape), out.dtype) if torch.is_tensor(out) else (None, None)
        del out  # the shape is kept, not the tensor: the next call runs with the memory it had before
    _synchronize(device)
    return Timings(np.asarray([_seconds(a, b) for a, b in marks], dtype=float), shape, dtype)


_STATUS = "/proc/self/status"


def peak_memory_mib(device: torch.device) -> tuple[float, str]:
    """Peak memory in MiB since ``reset_peak_memory`` and what it measures.

    On a GPU: the caching allocator's peak. On a CPU: the process's peak resident size
    (Linux's VmHWM), which ``reset_peak_memory`` lowers so that each run reports its own peak.
    """
    if device.type == "cuda":
        init_cuda()
        return torch.cuda.max_memory_allocated(device) / 2**20, "GPU memory allocated (peak)"
    return host_peak_rss_mib(), "host RSS of this process (peak during the run)"


def memory_in_use_mib(device: torch.device) -> float:
    """Memory in use now, measured as ``peak_memory_mib`` measures the peak: subtract it to get a run's own peak."""
    if device.type == "cuda":
        init_cuda()
        return torch.cuda.memory_allocated(device) / 2**20
    return host_rss_mib()


def init_cuda() -> None:
    """Initialise CUDA in this process if nothing has yet.

    The caching allocator's statistics exist only once CUDA is initialised: resetting them
    as the first CUDA call of a process fails ("Invalid device argument ... did you call
    init?"), and reading them returns zeros. Every memory probe calls this first.
    """
    torch.cuda.init()


def reset_peak_memory(device: torch.device, release: bool = True) -> None:
    """Start a new peak from what is in use now. On a CPU, ``release`` first hands freed memory back to the system
    (a garbage collection: a run's start wants it; the loop's split between training and evaluation does not)."""
    if device.type == "cuda":
        init_cuda()
        torch.cuda.reset_peak_memory_stats(device)
    else:
        if release:
            release_free_host_memory()
        reset_host_peak_rss()


def step_peak_mib(step: Callable[[], object], device: torch.device) -> tuple[float, str]:
    """The memory one call of ``step`` adds at its peak, above what was held when it began, and what was measured.

    On a GPU the caching allocator counts every byte the step allocates. A CPU has no such counter: the
    process's resident size also moves with whatever else the process does (other threads, malloc keeping freed
    memory, a first run's one-off growth), which once made a 0.3 ratio read 0.87 and halved one precision mode's
    memory against another's for the same computation. So on a CPU the step runs under the profiler, which records
    every allocation and free of a tensor (``profile_memory``): the same number on every run, whatever ran before
    in the process, at about the cost of the step itself.
    """
    if device.type == "cuda":
        reset_peak_memory(device)
        before = memory_in_use_mib(device)
        step()
        peak, measure = peak_memory_mib(device)
        return peak - before, measure
    cpu = [torch.profiler.ProfilerActivity.CPU]
    with native_noise_filtered(), profiler(activities=cpu, profile_memory=True) as prof:
        step()
    held = peak = 0
    for _, nbytes in allocation_records(prof, device):
        held += nbytes
        peak = max(peak, held)
    return peak / 2**20, "tensor memory (the profiler's allocation records, peak during the step)"


def allocation_records(prof, device: torch.device) -> list[tuple[int, int]]:
    """A finished profile's allocations (+bytes) and frees (-bytes) of tensors on ``device``'s kind, in time order,
    as (nanoseconds, bytes); empty when it recorded no memory (``profile_memory`` off)."""
    from torch.autograd import DeviceType

    kinds = (DeviceType.CUDA,) if torch.device(device).type == "cuda" else (DeviceType.CPU, DeviceType.MKLDNN,
                                                                            DeviceType.IDEEP)
    events = prof.profiler.kineto_results.events() if prof.profiler is not None else []
    return sorted((e.start_ns(), e.nbytes()) for e in events if e.name() == "[memory]" and e.device_type() in kinds)


def host_peak_rss_mib() -> float:
    """This process's peak resident memory (VmHWM) in MiB; since the last reset where supported."""
    try:
        with open(_STATUS) as f:
            return int(re.search(r"VmHWM:\s+(\d+)", f.read()).group(1)) / 1024
    except (OSError, AttributeError):  # not Linux
        import resource

        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def host_rss_mib() -> float:
    """This process's resident memory now, in MiB."""
    try:
        with open(_STATUS) as f:
            return int(re.search(r"VmRSS:\s+(\d+)", f.read()).group(1)) / 1024
    except (OSError, AttributeError):
        return host_peak_rss_mib()


def release_free_host_memory() -> None:
    """Hand memory that is freed but still held by glibc's malloc back to the system.

    Without this, the resident size stays high after a large run, and the next run's
    peak looks smaller than it is because it reuses memory the process already holds.
    """
    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc: measurements are only less precise
        pass


def reset_host_peak_rss() -> bool:
    """Lower the high-water mark to the current RSS (Linux >= 4.0); False where that is not possible."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


PHASES = ("data", "forward", "backward", "optimizer")  # the named parts of one training step


def phase_ranges(enabled: bool, device: torch.device) -> Callable[[str], contextlib.AbstractContextManager]:
    """``phase(name)`` context managers for the step's parts: named ranges when ``enabled``, else nothing.

    A range is a ``torch.profiler.record_function`` (shown in the profiler's tables and traces)
    and, on a GPU, an NVTX range too (shown by Nsight Systems). Switched off, ``phase`` returns
    one shared do-nothing context: the hot loop pays no profiler or NVTX call.
    """
    if not enabled:
        nothing = contextlib.nullcontext()
        return lambda name: nothing
    nvtx = device.type == "cuda"

    @contextlib.contextmanager
    def phase(name: str):
        with torch.profiler.record_function(name):
            if nvtx:
                torch.cuda.nvtx.range_push(name)
            try:
                yield
            finally:
                if nvtx:
                    torch.cuda.nvtx.range_pop()

    return phase


# Kineto detaches CUPTI when a session ends only with this set (pytorch/pytorch#144455); without it every kernel
# launched after the first session pays CUPTI's callbacks, so a throughput timed after a profile reads low.
CUPTI_TEARDOWN = "TEARDOWN_CUPTI"


# What the profiler's C++ side prints on a machine whose PyTorch was built with CUDA but has no
# GPU (Kineto probing for devices, CUPTI, allocator notices): true but irrelevant, and an
# attendee reads "ERROR" as a failure of their cell.
NATIVE_NOISE = re.compile(r"gpuGetDeviceCount|cudaGetDeviceCount|CUPTI|ActivityProfiler|^USDT:|"
                          r"^\[W\d* [^\]]*Allocator\.cpp", re.IGNORECASE)


@contextlib.contextmanager
def native_noise_filtered(noise: re.Pattern = NATIVE_NOISE):
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


def profiler(**options) -> torch.profiler.profile:
    """``torch.profiler.profile(**options)`` whose session leaves no profiler behind: CUPTI is torn down when it
    ends (``TEARDOWN_CUPTI=1``, unless the environment already says otherwise), so steps timed after it run at
    the speed they would have without it. Every profiler session of the kit starts here."""
    os.environ.setdefault(CUPTI_TEARDOWN, "1")
    return torch.profiler.profile(**options)

