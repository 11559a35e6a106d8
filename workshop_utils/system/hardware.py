"""What machine are we on, and how fast could it possibly go?

``environment()`` gathers the facts every result is saved with (device, versions,
CPU cores, Slurm allocation). ``peak_tflops()`` looks up the vendor's dense peak
for a GPU and precision so that achieved FLOP/s can be turned into MFU; for a
device not in the table it returns None, and MFU is then reported as unknown.
"""

from __future__ import annotations

import os
import platform
import re
import socket
from datetime import datetime, timezone
from pathlib import Path

import torch

from .errors import WorkshopError, choose
from .server import cpu_cores

PRECISIONS = ("fp32", "tf32", "fp16", "bf16")

# Dense (no structured sparsity) peak TFLOP/s from the vendors' data sheets.
# "fp32" is the plain FP32 pipeline (no tensor cores); "tf32", "fp16", "bf16" are
# tensor-core rates with FP32 accumulation. None means the GPU has no such mode.
# Order matters: the first pattern found in the device name wins. A pattern matches a whole
# model name only, so "L4" does not match an L40 nor "A10" an A10G, whose peaks differ.
PEAK_TFLOPS: dict[str, dict[str, float | None]] = {
    "GH200": {"fp32": 67.0, "tf32": 494.7, "fp16": 989.4, "bf16": 989.4},
    "H200 NVL": {"fp32": 60.0, "tf32": 417.5, "fp16": 835.5, "bf16": 835.5},  # PCIe, 600 W: not the SXM part's peaks
    "H200": {"fp32": 67.0, "tf32": 494.7, "fp16": 989.4, "bf16": 989.4},  # SXM
    "H100 NVL": {"fp32": 60.0, "tf32": 417.5, "fp16": 835.5, "bf16": 835.5},
    "H100 PCIe": {"fp32": 51.2, "tf32": 378.0, "fp16": 756.0, "bf16": 756.0},
    "H100": {"fp32": 67.0, "tf32": 494.7, "fp16": 989.4, "bf16": 989.4},  # SXM5
    "A100": {"fp32": 19.5, "tf32": 156.0, "fp16": 312.0, "bf16": 312.0},
    "L40S": {"fp32": 91.6, "tf32": 183.0, "fp16": 362.1, "bf16": 362.1},
    "A40": {"fp32": 37.4, "tf32": 74.8, "fp16": 149.7, "bf16": 149.7},
    "A10": {"fp32": 31.2, "tf32": 62.5, "fp16": 125.0, "bf16": 125.0},
    "L4": {"fp32": 30.3, "tf32": 60.0, "fp16": 121.0, "bf16": 121.0},
    "V100S": {"fp32": 16.4, "tf32": None, "fp16": 130.0, "bf16": None},  # PCIe
    "V100 PCIe": {"fp32": 14.0, "tf32": None, "fp16": 112.0, "bf16": None},
    "V100-PCIE": {"fp32": 14.0, "tf32": None, "fp16": 112.0, "bf16": None},  # how the driver names it
    "V100": {"fp32": 15.7, "tf32": None, "fp16": 125.0, "bf16": None},  # SXM2
    "T4": {"fp32": 8.1, "tf32": None, "fp16": 65.0, "bf16": None},
}


def pick_device(prefer: str | None = None) -> torch.device:
    """The device to train on: ``prefer`` if given, else the local-rank GPU when CUDA works, else CPU."""
    if prefer:
        device = torch.device(prefer)
        if device.type == "cuda" and not torch.cuda.is_available():
            raise WorkshopError(
                f"Device {prefer!r} was asked for, but PyTorch sees no CUDA GPU.",
                "run on a GPU node, or pass device='cpu'.",
            )
        return device
    if torch.cuda.is_available():
        return torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)) % torch.cuda.device_count())
    return torch.device("cpu")


def as_device(device, what: str) -> torch.device:
    """``device`` as a ``torch.device``; anything torch cannot read as one is one line naming ``what`` asked."""
    try:
        return torch.device(device)
    except (TypeError, RuntimeError, ValueError):
        raise WorkshopError(f"{what}: {device!r} is no device.", "pass the device the model trained on.") from None


def device_name(device: torch.device | str | None = None) -> str:
    device = torch.device(device) if device is not None else pick_device()
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return platform.processor() or platform.machine() or "CPU"


# A MIG slice is named after its GPU plus its profile ("NVIDIA H100 80GB HBM3 MIG 1g.10gb"): <g>g is its share of
# the GPU's compute slices, 7 on an A100, H100 or H200 and 4 on an A30.
MIG_PROFILE = re.compile(r"\bMIG\s+(\d+)g\.(\d+)gb\b", re.IGNORECASE)
MIG_COMPUTE_SLICES = {"A30": 4}
FULL_GPU_SLICES = 7


def mig_share(name: str) -> tuple[int, int] | None:
    """(compute slices of this MIG instance, slices of the whole GPU), or None for a whole GPU."""
    match = MIG_PROFILE.search(name)
    if not match:
        return None
    whole = next((n for gpu, n in MIG_COMPUTE_SLICES.items()
                  if re.search(rf"(?<![a-z0-9]){gpu.lower()}(?![a-z0-9])", name.lower())), FULL_GPU_SLICES)
    return int(match.group(1)), whole


def peak_tflops(name: str, precision: str) -> float | None:
    """Vendor peak dense TFLOP/s for a GPU name and precision, or None when unknown.

    A MIG slice gets its share of the whole GPU's peak (``mig_share``; ``peak_note`` says so),
    not the whole GPU's: MFU against the full peak would read up to 7x too low on a 1g slice.
    """
    choose(precision, PRECISIONS, "precision")
    for pattern, peaks in PEAK_TFLOPS.items():
        if re.search(rf"(?<![a-z0-9]){re.escape(pattern.lower())}(?![a-z0-9])", name.lower()):
            peak, share = peaks.get(precision), mig_share(name)
            return peak * share[0] / share[1] if peak and share else peak
    return None


def peak_note(name: str) -> str | None:
    """One line on how the peak of a MIG slice was taken, or None for a whole GPU."""
    share = mig_share(name)
    if share is None:
        return None
    profile = MIG_PROFILE.search(name).group(0).split()[-1]
    known = peak_tflops(name, "bf16") is not None or peak_tflops(name, "fp32") is not None
    return (f"MIG slice {profile}: peak taken as {share[0]}/{share[1]} of the whole GPU's (its share of the compute "
            f"slices)" if known else f"MIG slice {profile} of a GPU not in the peak table: no peak, no MFU")


def mig_uuid(device: torch.device, env=None) -> str | None:
    """The MIG instance's UUID behind a CUDA device, when CUDA_VISIBLE_DEVICES names one (``MIG-...``).

    NVML numbers whole GPUs only: looked up by index, a slice would read its parent GPU (another tenant's
    memory and utilisation); by this UUID, NVML reads the slice itself.
    """
    text = (os.environ if env is None else env).get("CUDA_VISIBLE_DEVICES") or ""
    entries = [entry.strip() for entry in text.split(",") if entry.strip()]
    index = device.index or 0
    return entries[index] if index < len(entries) and entries[index].startswith("MIG-") else None


def _gpu_facts() -> list[dict]:
    facts = []
    for i in range(torch.cuda.device_count()):
        props = torch.cuda.get_device_properties(i)
        facts.append(
            {
                "index": i,
                "name": props.name,
                "memory_gib": round(props.total_memory / 2**30, 1),
                "compute_capability": f"{props.major}.{props.minor}",
                "multiprocessors": props.multi_processor_count,
            }
        )
    return facts


def _nccl_version() -> str | None:
    try:
        return ".".join(map(str, torch.cuda.nccl.version())) if torch.cuda.is_available() else None
    except (AttributeError, RuntimeError):
        return None


def _driver_version() -> str | None:
    """The NVIDIA driver's version through NVML, or None without a GPU or NVML."""
    if not torch.cuda.is_available():
        return None
    try:
        import pynvml

        pynvml.nvmlInit()
        version = pynvml.nvmlSystemGetDriverVersion()
        return version.decode() if isinstance(version, bytes) else str(version)
    except Exception:  # no NVML library, or one that does not answer: the version stays unknown
        return None


def wait_passively(env=None) -> None:
    """Have the PyTorch processes started from here sleep, not spin, while their CPU threads wait for work.

    PyTorch's CPU kernels split work over OpenMP threads, one per core, and by default a thread that
    finishes first spins on its core until the others catch up. On a machine whose cores other work
    also wants (a shared CI runner, a login node, two ranks on two cores), the spinning threads take
    the cores the late ones need: a small convolution step measured 400 ms spinning against 135 ms
    waiting passively with two busy processes beside it on two cores, and 52 against 55 ms idle.
    Set before the process loads PyTorch (OpenMP reads it once), so it is for the processes started
    from here; a value the user set is kept.
    """
    (os.environ if env is None else env).setdefault("OMP_WAIT_POLICY", "PASSIVE")


def cpu_model() -> str:
    """The CPU's model name ("Intel(R) Xeon(R) ...", "AMD EPYC ..."), or the architecture where it cannot be read.

    Speeds measured on a CPU depend on it more than on the core count: an AVX2-only CPU emulates
    bf16 autocast at a tenth of the speed of one with bf16 instructions (``cpu_16bit_support``).
    """
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return " ".join(line.split(":", 1)[1].split())
    except OSError:  # not Linux
        pass
    return platform.processor() or platform.machine()


_X86 = ("x86_64", "amd64", "i386", "i686")


def cpu_16bit_support() -> dict:
    """Which 16-bit formats this CPU computes in natively, from what the CPU and PyTorch report.

    No stopwatch: a timing probe reads "emulated" on a busy machine and "native" on an idle one, so what
    a notebook runs would change with a neighbour's job. bf16 is native on x86 when the CPU has bf16
    instructions (AVX-512 BF16 or AMX) *and* oneDNN, PyTorch's CPU kernel library, will use them (it
    will not when ``ONEDNN_MAX_CPU_ISA`` caps it below); on other architectures (Arm with its BF16
    extension) oneDNN's own check decides. fp16 counts as emulated on every CPU: PyTorch's CPU fp16
    kernels cover only some layers, and a ResNet-18 step takes minutes even where AMX-FP16 exists.
    """
    cpu = getattr(torch, "cpu", None)

    def asks(name: str) -> bool:  # a private PyTorch probe that older releases lack counts as "no"
        probe = getattr(cpu, name, None)
        return bool(probe()) if probe is not None else False

    facts = {
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "avx512_bf16": asks("_is_avx512_bf16_supported"),
        "amx_bf16": asks("_is_amx_tile_supported"),
        "onednn_bf16": bool(torch.ops.mkldnn._is_mkldnn_bf16_supported()),
    }
    x86 = platform.machine().lower() in _X86
    facts["native_bf16"] = facts["onednn_bf16"] and (facts["avx512_bf16"] or facts["amx_bf16"] or not x86)
    facts["native_fp16"] = False
    return facts


def environment(device: torch.device | str | None = None) -> dict:
    """Everything needed to interpret a measurement later, as a JSON-ready dict.

    ``device`` is the device the measurement ran on (default: the one ``pick_device`` would
    choose). A CPU run on a GPU node must say "cpu", or its figures read as the GPU's.
    """
    device = torch.device(device) if device is not None else pick_device()
    slurm = {k: v for k, v in sorted(os.environ.items()) if k.startswith("SLURM_") and k in _SLURM_KEYS}
    return {
        "device_type": device.type,
        "device_name": device_name(device),
        "gpus": _gpu_facts() if torch.cuda.is_available() else [],
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "driver": _driver_version(),
        "cudnn": torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None,
        "nccl": _nccl_version(),
        "python": platform.python_version(),
        "cpu_cores": cpu_cores(),
        "cpu_model": cpu_model(),
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),  # the vector instructions PyTorch uses
        "cpu_native_bf16": cpu_16bit_support()["native_bf16"],  # whether bf16 autocast runs full-length here
        "cpu_threads": torch.get_num_threads(),
        "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY", "default"),  # see wait_passively
        "peak_note": peak_note(device_name(device)) if device.type == "cuda" else None,
        "hostname": socket.gethostname(),
        "platform": platform.platform(),
        "slurm": slurm,
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
    }


_SLURM_KEYS = {
    "SLURM_JOB_ID",
    "SLURM_JOB_NAME",
    "SLURM_JOB_PARTITION",
    "SLURM_JOB_NUM_NODES",
    "SLURM_JOB_NODELIST",
    "SLURM_NTASKS",
    "SLURM_PROCID",
    "SLURM_LOCALID",
    "SLURM_CPUS_PER_TASK",
    "SLURM_GPUS_ON_NODE",
    "SLURM_RESTART_COUNT",
}


def environment_table(env: dict | None = None):
    """The environment as a two-column pandas table for display."""
    import pandas as pd

    env = env or environment()
    rows = {k: v for k, v in env.items() if k not in ("gpus", "slurm")}
    for gpu in env["gpus"]:
        rows[f"gpu{gpu['index']}"] = (
            f"{gpu['name']}, {gpu['memory_gib']} GiB, sm_{gpu['compute_capability'].replace('.', '')}"
        )
    rows["slurm"] = ", ".join(f"{k}={v}" for k, v in env["slurm"].items()) or "(not in a Slurm job)"
    return pd.DataFrame({"value": [str(v) for v in rows.values()]}, index=list(rows))


def check_precision(precision: str, device: torch.device | str) -> list[str]:
    """Raise when ``device`` cannot run ``precision``; return warnings for modes that run but mean little."""
    choose(precision, PRECISIONS, "precision")
    try:
        device = torch.device(device)
    except (RuntimeError, TypeError, ValueError):
        raise WorkshopError(f"{device!r} is not a device.", "pass 'cpu', 'cuda' or a torch.device.") from None
    notes = []
    if device.type == "cuda":
        try:
            major, _ = torch.cuda.get_device_capability(device)
            name = torch.cuda.get_device_name(device)
        except (RuntimeError, AssertionError, ValueError) as err:  # no driver, no such GPU
            raise WorkshopError(f"{device} cannot be used here: {str(err).splitlines()[0] if str(err) else type(err).__name__}",
                                "pass device='cpu' on a machine without a GPU.") from None
        if precision == "bf16" and major < 8:  # of this device, not of the current one
            raise WorkshopError(
                f"{name} has no bfloat16 support (it needs an Ampere or newer GPU).",
                "use precision='fp16' (with loss scaling) or 'fp32'.",
            )
        if precision == "fp16" and major < 6:
            raise WorkshopError(f"{name} is too old for fast float16.", "use precision='fp32'.")
        if precision == "tf32" and major < 8:
            notes.append(f"{name} has no TF32 tensor cores: 'tf32' runs as plain FP32 here.")
    elif device.type == "cpu":
        if precision == "tf32":
            notes.append("TF32 is a GPU tensor-core format: on the CPU 'tf32' runs as plain FP32.")
        if precision == "fp16":
            notes.append("float16 on the CPU is emulated and slow: use it here only to see the mechanics.")
    else:
        raise WorkshopError(f"Device type {device.type!r} is not supported.", "use 'cuda' or 'cpu'.")
    return notes
