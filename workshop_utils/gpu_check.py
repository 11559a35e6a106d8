"""``python -m workshop_utils.gpu_check``: every GPU-only code path of the kit once, small, in minutes.

    python -m workshop_utils.gpu_check                      # on a GPU node: one verdict line per path
    python -m workshop_utils.gpu_check --reference          # also keep the record in results/reference/gpu/
    python -m workshop_utils.gpu_check --device cpu         # a rehearsal on a CPU: GPU-only paths say so

The pre-flight runs every notebook at full size (up to half an hour). This answers the shorter
question an instructor has on the morning of a workshop, and a developer has with a few minutes
of GPU time: does every path that only runs on a GPU work on this node? Each path below runs
the same package code the notebooks and the training command run, at a few steps, and gets one
line: ✓ with what it measured, ✗ with the error's first line, or why it was not checked here.

The check keeps its own clock: a path that would start too close to the budget (300 s) is not
started, one still running at the budget is stopped, and both are listed as not reached. What
needs two or more GPUs (NCCL, FSDP2, tensor parallelism, the overlap measurement) runs only
where there are two; on one GPU it is listed as not checked. The record, with the environment
(GPU, driver, CUDA, PyTorch), goes to ``<run>/gpu_check.json``. Exit status: 0 when every path
that could run passed, 1 otherwise, 2 for a mistake in the arguments.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import math
import signal
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

import torch

from .system.errors import OneLineParser, WorkshopError, exit_on_workshop_error, positive_int
from .system.hardware import environment, peak_tflops, pick_device, wait_passively
from .system.results import git_commit, repo_root, resolve_run_dir, write_json

BUDGET_S = 300  # the whole check on one H100, compiles included
REFERENCE_FOLDER = Path("results") / "reference" / "gpu"


class Skip(Exception):
    """The path cannot run here (a missing package or tool, no GPU in a rehearsal): said, not failed."""


class Failed(Exception):
    """The path ran, and what it produced is wrong."""


class OutOfTime(BaseException):
    """The check's budget ran out while a path was running (raised by the alarm; not an Exception)."""


@dataclass
class Context:
    """What every path is given: the device, a folder for its files, and the sizes to use."""

    device: torch.device
    folder: Path
    _cache: dict = field(default_factory=dict)

    @property
    def on_gpu(self) -> bool:
        return self.device.type == "cuda"

    def need_gpu(self, what: str) -> None:
        if not self.on_gpu:
            raise Skip(f"{what} needs a GPU")

    @property
    def gpt_size(self) -> str:
        """GPT-2 small on a GPU (the gpu profile's size); the tiny GPT in a CPU rehearsal."""
        return "gpt2-small" if self.on_gpu else "tiny"

    @property
    def sequence(self) -> int:
        return 1024 if self.on_gpu else 128

    def images(self):
        """A small synthetic CIFAR-10 stand-in (the node need not hold the data set), loaded once."""
        if "images" not in self._cache:
            from .spine.data import load_data

            self._cache["images"] = load_data(train_size=2048, test_size=256, synthetic=True, quiet=True)
        return self._cache["images"]

    def text(self):
        if "text" not in self._cache:
            from .spine.text import load_text

            self._cache["text"] = load_text(quiet=True)
        return self._cache["text"]

    def config(self, **changes):
        """A short training run on this device, no progress bar; ``changes`` on top."""
        from .spine.config import TrainConfig

        base = dict(device=str(self.device), max_steps=6, warmup_steps=2, batch_size=128, progress=False,
                    test_size=256, train_size=2048, synthetic=True)
        if changes.get("model") == "gpt":
            base.update(gpt_size=self.gpt_size, sequence_length=self.sequence, batch_size=8, optimizer="adamw",
                        lr=6e-4, train_size=None, test_size=8, synthetic="auto")
        return TrainConfig(**{**base, **changes})

    def train(self, **changes):
        from .spine.trainer import train

        config = self.config(**changes)
        data = self.text() if config.model == "gpt" else self.images()
        return train(config, data)


@dataclass(frozen=True)
class GpuPath:
    """One GPU-only code path: its name, what is checked, the CUDA branches it runs, and how."""

    name: str
    what: str
    covers: tuple[str, ...]  # "module:function" (package-relative) of every CUDA branch it runs
    run: Callable[[Context], str]  # returns one line of what it measured; raises Skip or Failed
    gpus: int = 1
    least_s: float = 5  # not started with less than this left of the budget


def _finite_loss(result, what: str) -> float:
    loss = result.metrics["final_train_loss"]
    if loss is None or not math.isfinite(loss):
        raise Failed(f"{what}: the training loss is {loss}")
    return loss


def _sane_rate(tflops: float | None, name: str, precision: str, what: str) -> None:
    """A rate above the data sheet's peak means the clock measured queueing, not the GPU."""
    peak = peak_tflops(name, precision)
    if tflops is not None and peak is not None and tflops > 1.05 * peak:
        raise Failed(f"{what}: {tflops:.0f} TFLOP/s is above {name}'s {precision} peak of {peak:.0f}")


# ---------------------------------------------------------------- the paths


def check_cuda_events(ctx: Context) -> str:
    from .spine.timing import RegionTimer, time_repeats

    n = 4096 if ctx.on_gpu else 512
    a, b = (torch.randn(n, n, device=ctx.device, dtype=torch.bfloat16) for _ in range(2))
    timings = time_repeats(lambda: a @ b, repeats=20, warmup=3, device=ctx.device)
    if not (timings.seconds > 0).all():
        raise Failed(f"an event interval was not positive: {timings.seconds.tolist()}")
    tflops = 2 * n**3 / timings.median / 1e12
    if ctx.on_gpu:
        _sane_rate(tflops, torch.cuda.get_device_name(ctx.device), "bf16", "bf16 matmul")
    region = RegionTimer(ctx.device)
    with region:
        for _ in range(10):
            a @ b
    host_start = time.perf_counter()
    for _ in range(10):
        a @ b
    if ctx.on_gpu:
        torch.cuda.synchronize(ctx.device)
    host = time.perf_counter() - host_start
    events = region.times().total
    if events > 5 * host + 0.01:
        raise Failed(f"10 matmuls took {events * 1e3:.1f} ms by events but {host * 1e3:.1f} ms by the host clock")
    return (f"bf16 {n}x{n} matmul: {timings.median * 1e3:.3f} ms median of 20 ({tflops:,.0f} TFLOP/s); "
            f"a region of 10: {events * 1e3:.2f} ms by events, {host * 1e3:.2f} ms by the synchronized host clock")


def check_peak_memory(ctx: Context) -> str:
    from .lessons.monitor import StepMemory, is_out_of_memory, release_failed_run
    from .spine.timing import memory_in_use_mib, peak_memory_mib, reset_peak_memory

    reset_peak_memory(ctx.device)
    before = memory_in_use_mib(ctx.device)
    block = torch.empty(256 * 2**20, dtype=torch.uint8, device=ctx.device).fill_(1)
    del block
    peak, kind = peak_memory_mib(ctx.device)
    if peak - before < 255:
        raise Failed(f"a 256 MiB allocation raised the peak by {peak - before:.0f} MiB only ({kind})")
    probe = StepMemory(ctx.device)
    probe(1)
    if not ctx.on_gpu:
        return f"a 256 MiB block raised the peak by {peak - before:.0f} MiB ({kind}); no GPU: no out-of-memory probe"
    total = torch.cuda.get_device_properties(ctx.device).total_memory
    try:
        torch.empty(2 * total, dtype=torch.uint8, device=ctx.device)
        raise Failed("allocating twice the GPU's memory did not fail")
    except torch.cuda.OutOfMemoryError as err:
        if not is_out_of_memory(err):
            raise Failed(f"is_out_of_memory does not recognise {type(err).__name__}") from None
        release_failed_run(ctx.device)
    return (f"a 256 MiB block raised the peak by {peak - before:.0f} MiB; an allocation of "
            f"{2 * total / 2**30:.0f} GiB was recognised as out of memory and released")


def check_precisions(ctx: Context) -> str:
    parts = []
    for precision in ("fp32", "tf32", "fp16", "bf16"):
        if not ctx.on_gpu and precision == "fp16":
            continue  # emulated on a CPU: minutes per step, nothing a GPU path learns from
        result = ctx.train(name=f"check-{precision}", precision=precision)
        loss = _finite_loss(result, precision)
        mfu = result.metrics["mfu"]
        if ctx.on_gpu:
            tf32 = torch.backends.cuda.matmul.allow_tf32
            if tf32 != (precision == "tf32"):
                raise Failed(f"{precision}: TF32 matmuls are {'on' if tf32 else 'off'} after configure_precision")
            if mfu is not None and not 0 < mfu <= 1:
                raise Failed(f"{precision}: MFU {mfu} is outside (0, 1]")
        parts.append(f"{precision} loss {loss:.2f}, {result.metrics['samples_per_s']:,.0f} samples/s")
    return "SimpleCNN, 6 steps each: " + "; ".join(parts)


def check_grad_scaler(ctx: Context) -> str:
    ctx.need_gpu("fp16 with a GradScaler")
    from .lessons.numerics import grad_scaler_trace, training_batches
    from .spine.models import build_model

    model = build_model("simplecnn").to(ctx.device)
    trace = grad_scaler_trace(model, training_batches(ctx.images(), 128, ctx.device, 8), ctx.device)
    scales = trace["next scale"].tolist()
    if not scales or not all(math.isfinite(s) and s > 0 for s in scales):
        raise Failed(f"the GradScaler's scales are not positive and finite: {scales}")
    skipped = int(trace["event"].str.startswith("overflow").sum())
    return f"8 fp16 steps: scale {trace['scale'].iloc[0]:g} -> {scales[-1]:g}, {skipped} steps skipped on overflow"


def check_attention_kernel(ctx: Context) -> str:
    from .lessons.profiling import attention_kernels
    from .spine.gpt import build_gpt

    model = build_gpt(ctx.gpt_size).to(ctx.device).eval()
    tokens = torch.randint(0, model.size.vocab, (2, ctx.sequence), device=ctx.device)
    found = {precision: attention_kernels(model, tokens, precision) for precision in ("fp32", "bf16")}
    if ctx.on_gpu and not any("flash" in name.lower() for name in found["bf16"]):
        raise Failed(f"bf16 attention did not run a flash kernel: {found['bf16']}")
    if not found["fp32"] or not found["bf16"]:
        raise Failed(f"the profiler named no attention operator: {found}")
    short = {p: ", ".join(n for n in names if n.startswith("aten::")) or ", ".join(names)
             for p, names in found.items()}
    return f"{ctx.gpt_size}: bf16 {short['bf16']}; fp32 {short['fp32']}"


def check_fused_adamw(ctx: Context) -> str:
    result = ctx.train(name="check-fused-adamw", model="gpt", precision="bf16", optimizer_kernels="fused",
                       loader="device")
    loss = _finite_loss(result, "fused AdamW")
    sgd = ctx.train(name="check-fused-sgd", optimizer_kernels="fused")
    _finite_loss(sgd, "fused SGD")
    return f"{ctx.gpt_size} bf16 with fused AdamW, loss {loss:.2f}; SimpleCNN with fused SGD"


def check_loaders(ctx: Context) -> str:
    parts = []
    for loader, extra in (("device", {}), ("torch", dict(num_workers=2, pin_memory=True, persistent_workers=True))):
        result = ctx.train(name=f"check-{loader}-loader", loader=loader, **extra)
        _finite_loss(result, f"{loader} loader")
        parts.append(f"{loader}{' (2 workers, pinned)' if extra else ''} {result.metrics['samples_per_s']:,.0f} "
                     f"samples/s, data wait {result.metrics['data_wait_fraction']:.0%}")
    gpt = ctx.train(name="check-gpt-device-loader", model="gpt", loader="device")
    _finite_loss(gpt, "the GPT's device loader")
    return "SimpleCNN: " + "; ".join(parts) + f"; GPT tokens on the device {gpt.metrics['tokens_per_s']:,.0f} tokens/s"


def check_evaluation_memory(ctx: Context) -> str:
    """The GPT's evaluation in chunks: a 512-sequence evaluation batch must fit, and not count as training's peak."""
    result = ctx.train(name="check-gpt-evaluation", model="gpt", precision="bf16", max_steps=3, warmup_steps=1,
                       test_size=24, eval_batch_size=512)
    train_mib, eval_mib = result.metrics["peak_memory_mib"], result.metrics["eval_peak_memory_mib"]
    if not result.metrics["final_test_loss"] or not math.isfinite(result.metrics["final_test_loss"]):
        raise Failed(f"the test loss is {result.metrics['final_test_loss']}")
    return (f"{ctx.gpt_size}, 24 validation sequences in one batch of 512: training peak {train_mib:,.0f} MiB, "
            f"evaluation peak {eval_mib:,.0f} MiB, test loss {result.metrics['final_test_loss']:.2f}")


def check_checkpoint_resume(ctx: Context) -> str:
    folder = ctx.folder / "checkpoints"
    common = dict(max_steps=8, checkpoint_dir=str(folder), deterministic=True, seed=3)
    whole = ctx.train(name="check-uninterrupted", **{**common, "checkpoint_dir": str(ctx.folder / "whole")})
    ctx.train(name="check-interrupted", stop_after_step=4, **common)
    resumed = ctx.train(name="check-resumed", resume=True, **common)
    if resumed.metrics["resumed_from_step"] != 4:
        raise Failed(f"resumed from step {resumed.metrics['resumed_from_step']}, not 4")
    same = resumed.metrics["param_checksum"] == whole.metrics["param_checksum"]
    if not same:
        gap = abs(resumed.metrics["final_train_loss"] - whole.metrics["final_train_loss"])
        raise Failed(f"resumed weights differ from the uninterrupted run's (loss gap {gap:.2e}) with deterministic "
                     f"kernels")
    return "8 steps, stopped at 4 and resumed from its checkpoint: the same weights bit for bit as 8 uninterrupted"


def check_nvml_monitor(ctx: Context) -> str:
    ctx.need_gpu("NVML")
    from .lessons.monitor import DeviceMonitor

    with DeviceMonitor(interval_s=0.05, device=ctx.device) as monitor:
        ctx.train(name="check-monitor", max_steps=30)
    frame = monitor.frame()
    if monitor.source != "gpu":
        raise Failed("the monitor read the CPU: NVML did not answer")
    if frame.empty or not (frame["utilization_pct"].fillna(0) > 0).any():
        raise Failed(f"{len(frame)} samples, none with the GPU busy")
    return (f"{len(frame)} NVML samples: utilisation up to {frame['utilization_pct'].max():.0f}%, "
            f"{frame['memory_used_mib'].max():,.0f} MiB used, {frame['power_w'].max() or 0:.0f} W")


def check_tensorboard(ctx: Context) -> str:
    try:
        from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    except ImportError:
        raise Skip("the tensorboard package is not installed") from None
    from .spine.scalar_log import ScalarLog

    folder = ctx.folder / "tensorboard"
    ctx.train(name="check-tensorboard", tensorboard_dir=str(folder), max_steps=20)
    events = EventAccumulator(str(folder / "check-tensorboard"))
    events.Reload()
    tags = events.Tags()["scalars"]
    if "train/loss_per_step" not in tags:
        raise Failed(f"no loss scalar written: {tags}")
    if ctx.on_gpu and ScalarLog.UTILISATION not in tags:
        raise Failed(f"no GPU utilisation scalar: {tags}")
    return f"{len(tags)} scalars written" + (f", {ScalarLog.UTILISATION} among them" if ctx.on_gpu else "")


def check_profiler(ctx: Context) -> str:
    from .lessons.profiling import nsys_missing, profile_training, step_breakdown, top_ops

    run = profile_training(ctx.config(name="check-profile"), ctx.images(), ctx.folder, name="check-profile",
                           wait=1, warmup=1, active=3)
    trace = Path(run.chrome_trace).read_text()
    table = top_ops(run.profiler, 5, ctx.device)
    breakdown = step_breakdown(run)
    if '"forward"' not in trace:
        raise Failed("the trace holds no 'forward' range: the step phases were not annotated")
    if ctx.on_gpu and '"cat": "kernel"' not in trace and '"cat":"kernel"' not in trace:
        raise Failed("the trace holds no CUDA kernel")
    nsys = nsys_missing()
    return (f"trace {len(trace) / 2**20:.1f} MiB with CUDA kernels and the phase ranges (NVTX on a GPU); top op "
            f"{table.iloc[0, 0] if len(table) else '?'}; {breakdown.get('kernels_per_step') or 0:.0f} kernels a step"
            + (f"; Nsight Systems not run: {nsys.split(' (')[0]}" if nsys else ""))


def check_compile(ctx: Context) -> str:
    result = ctx.train(name="check-compile", model="gpt", precision="bf16", compile=True, max_steps=8,
                       gpt_size="tiny", sequence_length=128, batch_size=16)
    loss = _finite_loss(result, "compiled")
    return f"tiny GPT compiled: {result.metrics['warmup_s']:.1f} s of warm-up (the compile), loss {loss:.2f}"


def check_cuda_graphs(ctx: Context) -> str:
    ctx.need_gpu("CUDA graphs")
    from .lessons.profiling import profile_training, step_breakdown

    config = ctx.config(name="check-cuda-graphs", compile=True, compile_mode="reduce-overhead", loader="device")
    run = profile_training(config, ctx.images(), ctx.folder, name="check-cuda-graphs", wait=0, warmup=3, active=3,
                           detail=False)
    counts = step_breakdown(run)
    if not counts.get("graph_launches_per_step"):
        raise Failed(f"no CUDA graph was replayed in the profiled steps: {counts}")
    return (f"SimpleCNN, the ladder's CUDA-graphs rung: {counts['graph_launches_per_step']:.0f} graph launches and "
            f"{counts.get('launches_per_step') or 0:.0f} other launches a step")


def _load_benchmark(name: str):
    root = repo_root() or Path.cwd()
    path = root / "benchmarks" / f"{name}.py"
    if not path.exists():
        raise Skip(f"benchmarks/{name}.py is not in this checkout")
    spec = importlib.util.spec_from_file_location(f"benchmark_{name}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def check_gpt_throughput(ctx: Context) -> str:
    import json

    bench = _load_benchmark("gpt_throughput")
    args = ["--profile", "gpu" if ctx.on_gpu else "cpu", "--modes", "bf16", "--run-dir", str(ctx.folder)]
    args += ["--steps", "40", "--warmup-steps", "15"] if ctx.on_gpu else ["--steps", "4", "--warmup-steps", "1"]
    with contextlib.redirect_stdout(sys.stderr):
        path = bench.main(args)
    written = json.loads(Path(path).read_text())
    summary, compiled = written["summary"], written["settings"]["compile"]
    mfu = summary.get("bf16_mfu")
    if ctx.on_gpu and (mfu is None or not 0 < mfu <= 1):
        raise Failed(f"MFU {mfu} is outside (0, 1]")
    return (f"{summary['parameters']:,} parameters, {summary['tokens_per_step']:,} tokens a step, {'compiled' if compiled else 'eager'}, bf16: "
            f"{summary['bf16_tokens_per_s']:,.0f} tokens/s"
            + (f", MFU {mfu:.1%}" if mfu is not None else ", MFU unknown (no peak for this device)"))


def check_notebook_01(ctx: Context) -> str:
    parts = []
    cnn = ctx.train(name="check-nb01-simplecnn", num_workers=2, max_steps=10)
    parts.append(f"SimpleCNN {cnn.metrics['samples_per_s']:,.0f} samples/s")
    if importlib.util.find_spec("torchvision") is not None:
        resnet = ctx.train(name="check-nb01-resnet18", model="resnet18", max_steps=5)
        parts.append(f"ResNet-18 {resnet.metrics['samples_per_s']:,.0f} samples/s")
    else:
        parts.append("ResNet-18 not run: torchvision is not installed")
    gpt = ctx.train(name="check-nb01-gpt", model="gpt", batch_size=16 if ctx.on_gpu else 8, max_steps=5,
                    warmup_steps=2, test_size=16)
    parts.append(f"{ctx.gpt_size} fp32 eager {gpt.metrics['tokens_per_s']:,.0f} tokens/s, "
                 f"MFU {gpt.metrics['mfu'] or 0:.1%}, peak {gpt.metrics['peak_memory_mib']:,.0f} MiB")
    return "; ".join(parts)


def check_notebook_03(ctx: Context) -> str:
    from .lessons.numerics import fp8_support

    modes = ("fp32", "tf32", "fp16", "bf16") if ctx.on_gpu else ("fp32", "bf16")
    parts = []
    if importlib.util.find_spec("torchvision") is not None:
        for mode in modes:
            result = ctx.train(name=f"check-nb03-resnet18-{mode}", model="resnet18", precision=mode,
                               channels_last=True, batch_size=256, max_steps=4, warmup_steps=1)
            _finite_loss(result, f"ResNet-18 {mode}")
        parts.append(f"ResNet-18 channels_last in {', '.join(modes)}")
    for mode in modes:
        result = ctx.train(name=f"check-nb03-gpt-{mode}", model="gpt", precision=mode, max_steps=4, warmup_steps=1)
        _finite_loss(result, f"GPT {mode}")
    parts.append(f"{ctx.gpt_size} in {', '.join(modes)}")
    fp8 = fp8_support(ctx.device)
    return "; ".join(parts) + (f"; fp8: {fp8.split(':')[0]}" if fp8 else "; fp8 tensor cores present")


def check_notebook_04(ctx: Context) -> str:
    from .lessons.sweeps import climb_ladder, dataloader_sweep, gpt_ladder_rungs

    sweep = dataloader_sweep(ctx.config(name="check-nb04-loader", max_steps=6), ctx.images(), workers=(0, 2))
    base = ctx.config(name="check-nb04-gpt", model="gpt", attention="math", loader="torch", max_steps=6,
                      warmup_steps=2, batch_size=16 if ctx.on_gpu else 8)
    rungs = gpt_ladder_rungs(base, compile=ctx.on_gpu, device=ctx.device)
    ladder = climb_ladder(base, ctx.text(), rungs=rungs, run_dir=None, progress=False)
    speeds = ladder["samples_per_s"].dropna()
    if speeds.empty:
        raise Failed("no rung of the GPT ladder trained")
    return (f"loader sweep {len(sweep)} points; GPT ladder {len(speeds)} rungs trained, fastest "
            f"{speeds.max() / speeds.iloc[0]:.2f}x the fp32 unfused baseline")


def check_notebook_05(ctx: Context) -> str:
    from .lessons.recompute import measure_gpt_recompute, measure_recompute

    mlp = measure_recompute(**(dict(width=1024, depth=24, tokens=16384) if ctx.on_gpu else {}), device=ctx.device)
    gpt = measure_gpt_recompute(ctx.gpt_size, batch=8, sequence=ctx.sequence, device=ctx.device)
    for what, found in (("MLP stack", mlp), ("GPT", gpt)):
        if not found["gradient_max_abs_difference"] <= 1e-5:
            raise Failed(f"{what}: gradients with recomputation differ from those without by "
                         f"{found['gradient_max_abs_difference']:.2e}")
    return (f"activation checkpointing: MLP stack memory x{mlp['memory_ratio']:.2f}, "
            f"{ctx.gpt_size} memory x{gpt['memory_ratio']:.2f}, time x{gpt['time_ratio']:.2f}")


def check_gpu_topology(ctx: Context) -> str:
    ctx.need_gpu("a GPU's NUMA node")
    from .lessons.slurm_jobs import gpu_numa, numa_binding_problem

    where = gpu_numa()
    if where in ("-", "") or ":" not in where:
        raise Failed(f"no GPU listed with its NUMA node: {where!r}")
    binding = numa_binding_problem(1)
    return f"GPU:NUMA node {where}; torchrun --numa-binding=node " + (f"not usable: {binding}" if binding else "usable")


def _two_gpu_demo(part: str, **options) -> Callable[[Context], str]:
    def run(ctx: Context) -> str:
        from .parallel_demos import launch_demo

        record = launch_demo(part, nproc=2, device="cuda", timeout_s=120, echo=False, **options)
        return f"{part} on 2 GPUs over NCCL: {', '.join(sorted(record))}"

    return run


def check_ddp_nccl(ctx: Context) -> str:
    from .parallel.launch import launch_training

    launched = launch_training(2, device="cuda", steps=10, batch_size=64, train_size=2048, test_size=256,
                               synthetic=True, echo=False, timeout_s=120)
    metrics = launched.record["metrics"]
    return f"DDP on 2 GPUs: {metrics['samples_per_s']:,.0f} samples/s, {metrics['all_reduces']} all-reduces"


def check_ddp_lab(ctx: Context) -> str:
    from .lessons.ddp_lab import check_ddp_lab as judge, lab_device

    if lab_device(2) != "cuda":
        raise Failed("the DDP lab would run on CPU processes although two GPUs are visible")
    script = (repo_root() or Path.cwd()) / "notebooks" / "labs" / "ddp_lab" / "train_ddp.py"
    if not script.exists():
        raise Skip("notebooks/labs/ddp_lab/train_ddp.py is not in this checkout")
    with contextlib.redirect_stdout(sys.stderr):
        judge(script, ctx.folder / "ddp_lab", nproc=2, echo=False)
    return "the DDP lab's solution judged on 2 GPUs over NCCL"


_TRAIN = ("spine.trainer:TrainingRun", "spine.trainer:_to_host_async", "spine.losses:evaluate",
          "spine.precision:configure_precision", "spine.precision:autocast", "spine.precision:grad_scaler",
          "spine.checkpoint:rng_state", "system.hardware:check_precision", "system.hardware:device_name",
          "system.hardware:pick_device", "spine.distributed:setup_distributed", "spine.distributed:rank_device",
          "spine.distributed:all_reduce_sum", "spine.timing:StepTimer", "spine.timing:_mark",
          "spine.timing:_synchronize")

PATHS: tuple[GpuPath, ...] = (
    GpuPath("cuda-events", "CUDA-event timing (time_repeats, RegionTimer) against the synchronized host clock",
            ("spine.timing:_mark", "spine.timing:_seconds", "spine.timing:_synchronize", "spine.timing:time_repeats",
             "spine.timing:RegionTimer"), check_cuda_events),
    GpuPath("peak-memory", "the allocator's peak and in-use readings; an out-of-memory error recognised and released",
            ("spine.timing:peak_memory_mib", "spine.timing:memory_in_use_mib", "spine.timing:reset_peak_memory",
             "spine.timing:init_cuda", "lessons.monitor:StepMemory", "lessons.monitor:release_failed_run",
             "lessons.monitor:is_out_of_memory"), check_peak_memory),
    GpuPath("precision-modes", "fp32 (TF32 off), tf32, fp16 with GradScaler and bf16 through the training loop",
            (*_TRAIN, "spine.precision:set_tf32", "system.hardware:peak_tflops", "system.hardware:environment",
             "system.hardware:_gpu_facts", "system.hardware:_nccl_version", "system.hardware:_driver_version"),
            check_precisions, least_s=15),
    GpuPath("grad-scaler", "notebook 03's GradScaler trace in fp16", ("lessons.numerics:grad_scaler_trace",),
            check_grad_scaler),
    GpuPath("attention-kernel", "scaled_dot_product_attention names the kernel it ran (flash in bf16)",
            ("lessons.profiling:attention_kernels",), check_attention_kernel),
    GpuPath("fused-optimizers", "fused AdamW (the GPT) and fused SGD", ("spine.trainer:build_optimizer",),
            check_fused_adamw, least_s=10),
    GpuPath("device-loaders", "the device-resident image and token loaders; the DataLoader with pinned memory",
            ("spine.data:DeviceLoader", "spine.data:build_dataloader", "spine.text:TokenDeviceLoader",
             "spine.text:make_token_loader"), check_loaders, least_s=10),
    GpuPath("gpt-evaluation", "the GPT's evaluation in chunks, its peak apart from training's",
            ("spine.losses:evaluation_chunks",), check_evaluation_memory, least_s=10),
    GpuPath("checkpoint-resume", "a checkpoint written on the GPU and resumed: the same weights as uninterrupted",
            ("spine.checkpoint:rng_state", "spine.checkpoint:set_rng_state", "spine.trainer:deterministic_kernels"),
            check_checkpoint_resume, least_s=10),
    GpuPath("nvml-monitor", "the NVML monitor samples the GPU while it trains",
            ("lessons.monitor:_nvml_handle", "lessons.monitor:DeviceMonitor", "system.hardware:mig_uuid"),
            check_nvml_monitor),
    GpuPath("tensorboard-gpu-scalar", "TensorBoard scalars, the GPU-utilisation one included",
            ("spine.scalar_log:ScalarLog",), check_tensorboard),
    GpuPath("profiler-cuda-nvtx", "torch.profiler with CUDA activity; the step phases as NVTX ranges",
            ("lessons.profiling:profile_training", "lessons.profiling:top_ops", "lessons.profiling:step_breakdown",
             "lessons.profiling:nsys_missing", "spine.timing:phase_ranges"), check_profiler, least_s=10),
    GpuPath("torch-compile", "torch.compile of the GPT", ("spine.trainer:TrainingRun",), check_compile, least_s=30),
    GpuPath("cuda-graphs", "the ladder's CUDA-graphs rung (compile mode reduce-overhead), replays counted",
            ("lessons.sweeps:ladder_rungs", "lessons.profiling:profile_rungs"), check_cuda_graphs, least_s=30),
    GpuPath("gpt-throughput", "benchmarks/gpt_throughput.py: GPT-2 small, sequence 1024, bf16, compiled: "
            "tokens/s and MFU", ("system.benchmark:start_benchmark",), check_gpt_throughput, least_s=60),
    GpuPath("notebook-01", "notebook 01's gpu-profile runs at a few steps: SimpleCNN, ResNet-18, GPT-2 small",
            ("spine.data:build_dataloader",), check_notebook_01, least_s=20),
    GpuPath("notebook-03", "notebook 03's gpu-profile modes at a few steps: ResNet-18 channels_last and GPT-2 small "
            "in all four; fp8 support", ("lessons.numerics:fp8_support", "lessons.numerics:precision_configs"),
            check_notebook_03, least_s=30),
    GpuPath("notebook-04", "notebook 04's loader sweep with pinned memory and the GPT ladder, compile rung included",
            ("lessons.sweeps:dataloader_sweep", "lessons.sweeps:gpt_ladder_rungs"), check_notebook_04, least_s=60),
    GpuPath("notebook-05", "notebook 05's one-GPU part: activation checkpointing, MLP stack and GPT-2 small",
            ("lessons.recompute:_step_peak_mib", "lessons.recompute:measure_gpt_recompute"), check_notebook_05,
            least_s=15),
    GpuPath("gpu-topology", "notebook 06: each GPU's NUMA node, and whether torchrun can bind ranks to it",
            ("lessons.slurm_jobs:gpu_numa", "lessons.slurm_jobs:numa_binding_problem"), check_gpu_topology, least_s=1),
    GpuPath("ddp-nccl", "DDP over NCCL through the training command", ("parallel.launch:launch_training",
            "parallel.launch:check_process_count", "parallel.launch:node_layout", "parallel.launch:resume_verdict",
            "parallel.launch:launch_nodes", "parallel.launch:world_sizes_for_this_machine",
            "spine.distributed:barrier", "spine.distributed:collective_device", "spine.distributed:teardown_distributed",
            "parallel_demos:demo_world", "parallel_demos:hide_gpus"), check_ddp_nccl, gpus=2),
    GpuPath("fsdp2", "FSDP2 and ZeRO against DDP (notebook 05)", ("parallel.sharding:compare_ddp_fsdp",),
            _two_gpu_demo("fsdp", steps=4, batch_size=32, train_size=256), gpus=2),
    GpuPath("tensor-parallel", "the GPT's tensor-parallel plan and FSDP2 per block (notebook 05)",
            ("parallel.gpt_parallel:compare_gpt_parallel",),
            _two_gpu_demo("gpt-parallel", size="tiny", steps=2, batch=4, sequence=64), gpus=2),
    GpuPath("ddp-overlap", "how much of DDP's all-reduce the backward pass hides (notebook 02)",
            ("parallel.overlap:measure_overlap", "parallel.overlap:_trace_one_backward"),
            _two_gpu_demo("ddp-overlap", repeats=3), gpus=2),
    GpuPath("collectives", "notebook 05's collectives timed over NCCL",
            ("parallel.collectives:measure_all_reduce",), _two_gpu_demo("collectives-time", max_mib=16, repeats=3),
            gpus=2),
    GpuPath("distributed-checkpoint", "notebook 05's sharded and asynchronous checkpoints on GPUs",
            ("parallel.dist_checkpoint:checkpoint_stall",), _two_gpu_demo("checkpoint", round_trip_steps=2,
                                                                           stall_steps=4, every=2), gpus=2),
    GpuPath("ddp-lab", "notebook 02's DDP lab on GPUs, one per rank", ("lessons.ddp_lab:lab_device",
            "lessons.ddp_lab:_crash", "lessons.ddp_lab:_gradients", "lessons.ddp_lab:_probe"), check_ddp_lab, gpus=2),
)

# CUDA branches that no path above runs, and why (tests/test_gpu_check.py holds every branch to one or the other).
ELSEWHERE = {
    "system.profiles:profile_choice": "which profile 'auto' means: read by every notebook and benchmark on a GPU "
                                      "node (the gpt-throughput path asks for 'gpu' explicitly)",
}


# ---------------------------------------------------------------- running them


@dataclass
class Verdict:
    name: str
    what: str
    status: str  # "ok", "failed", "skipped", "not checked", "not reached"
    detail: str
    seconds: float = 0.0

    SYMBOLS = {"ok": "✓", "failed": "✗", "skipped": "–", "not checked": "–", "not reached": "…"}

    def line(self) -> str:
        took = f" ({self.seconds:.1f} s)" if self.seconds else ""
        label = "" if self.status == "ok" else f"{self.status}: "
        return f"{self.SYMBOLS[self.status]} {self.name}{took}: {label}{self.detail}"


def _first_line(err: BaseException) -> str:
    text = str(err).strip().splitlines()
    return f"{type(err).__name__}: {text[0] if text else ''}".strip().rstrip(":")[:300]


def _where(err: BaseException) -> str:
    """The innermost frame of the kit's own code in a traceback: file:line, so a failure can be found."""
    frames = [f for f in traceback.extract_tb(err.__traceback__) if "workshop_utils" in f.filename
              or "benchmarks" in f.filename]
    if not frames:
        return ""
    frame = frames[-1]
    return f" [{Path(frame.filename).name}:{frame.lineno}]"


@contextlib.contextmanager
def _deadline(seconds: float):
    """Raise OutOfTime in the main thread when ``seconds`` have passed (SIGALRM, Unix main thread only)."""
    usable = hasattr(signal, "setitimer") and seconds > 0
    if usable:
        def alarm(signum, frame):
            raise OutOfTime()

        previous = signal.signal(signal.SIGALRM, alarm)
        signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        if usable:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, previous)


def run_paths(paths, ctx: Context, budget_s: float = BUDGET_S, gpus: int | None = None,
              say: Callable[[str], None] = print, clock: Callable[[], float] = time.monotonic) -> list[Verdict]:
    """Run each path in order within ``budget_s``; one verdict each, said as soon as it is known."""
    gpus = (torch.cuda.device_count() if torch.cuda.is_available() else 0) if gpus is None else gpus
    start, verdicts = clock(), []
    for path in paths:
        left = budget_s - (clock() - start)
        if path.gpus > max(gpus, 1) or (path.gpus > 1 and not ctx.on_gpu):
            verdict = Verdict(path.name, path.what, "not checked", f"needs {path.gpus} GPUs, this node has {gpus}")
        elif left < path.least_s:
            verdict = Verdict(path.name, path.what, "not reached",
                              f"{left:.0f} s of the {budget_s:.0f} s budget left, it needs at least {path.least_s:.0f}")
        else:
            began = clock()
            try:
                with _deadline(left):
                    status, detail = "ok", path.run(ctx)
            except OutOfTime:
                status, detail = "not reached", f"stopped when the {budget_s:.0f} s budget ran out"
            except Skip as err:
                status, detail = "skipped", str(err)
            except Failed as err:
                status, detail = "failed", str(err)
            except Exception as err:  # any error of the path is its verdict; the check goes on
                status, detail = "failed", _first_line(err) + _where(err)
            verdict = Verdict(path.name, path.what, status, detail, clock() - began)
            if ctx.on_gpu:
                torch.cuda.empty_cache()
        verdicts.append(verdict)
        say(verdict.line())
    return verdicts


def summary_line(verdicts: list[Verdict], seconds: float, budget_s: float) -> str:
    counts = {status: [v.name for v in verdicts if v.status == status] for status in Verdict.SYMBOLS}
    ran = len(verdicts) - len(counts["not checked"])
    text = f"GPU check: {len(counts['ok'])} of {ran} paths passed"
    for status in ("failed", "not reached", "skipped"):
        if counts[status]:
            text += f", {len(counts[status])} {status} ({', '.join(counts[status])})"
    if counts["not checked"]:
        text += f"; {len(counts['not checked'])} not checked here ({', '.join(counts['not checked'])}: need 2 GPUs)"
    return text + f"; {seconds:.0f} s of the {budget_s:.0f} s budget."


def _slug(text: str) -> str:
    return "-".join("".join(c if c.isalnum() else " " for c in text.lower()).split())


def build_parser() -> OneLineParser:
    parser = OneLineParser(prog="python -m workshop_utils.gpu_check", description=__doc__,
                           formatter_class=argparse.RawDescriptionHelpFormatter,
                           fix="see `python -m workshop_utils.gpu_check --help`.")
    parser.add_argument("--run-dir", metavar="DIR", help="run folder for the record and the paths' files "
                                                         "(default: a new runs/<time>-gpu-check/)")
    parser.add_argument("--budget", type=positive_int, default=BUDGET_S, metavar="SECONDS",
                        help=f"time for the whole check; paths that do not fit are listed as not reached "
                             f"(default {BUDGET_S})")
    parser.add_argument("--only", nargs="+", metavar="PATH", choices=[p.name for p in PATHS],
                        help="run these paths only (default: all)")
    parser.add_argument("--device", choices=("auto", "cuda", "cpu"), default="auto",
                        help="auto: the GPU, or an error without one; cpu: a rehearsal of the paths a CPU can run")
    parser.add_argument("--reference", action="store_true",
                        help=f"also write the record into {REFERENCE_FOLDER}/ (GPU, driver, PyTorch and date in "
                             f"its name)")
    return parser


@exit_on_workshop_error
def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    if args.device == "cpu":
        device = torch.device("cpu")
    elif not torch.cuda.is_available():
        raise WorkshopError("PyTorch sees no CUDA GPU, so there is no GPU path to check.",
                            "run this on a GPU node (srun --gpus=1 ...), or pass --device cpu for a rehearsal.")
    else:
        device = pick_device("cuda")
    wait_passively()
    folder = resolve_run_dir(args.run_dir, "gpu-check")
    paths = [p for p in PATHS if not args.only or p.name in args.only]
    env = environment(device)
    print(f"GPU check on {env['device_name']} (driver {env['driver']}, CUDA {env['cuda']}, PyTorch {env['torch']}), "
          f"{len(paths)} paths within {args.budget} s; files in {folder}", flush=True)
    started = time.monotonic()
    verdicts = run_paths(paths, Context(device, folder), args.budget, say=lambda line: print(line, flush=True))
    seconds = time.monotonic() - started
    line = summary_line(verdicts, seconds, args.budget)
    record = {"kind": "gpu_check", "summary": line, "budget_s": args.budget, "seconds": seconds,
              "paths": [vars(v) for v in verdicts], "environment": env, "git_commit": git_commit(),
              "created": datetime.now(timezone.utc).isoformat(timespec="seconds")}
    written = [write_json(record, folder / "gpu_check.json")]
    if args.reference:
        root = repo_root() or Path.cwd()
        name = f"gpu_check-{_slug(env['device_name'])}-{record['created'][:10]}.json"
        written.append(write_json(record, root / REFERENCE_FOLDER / name))
    print(line)
    print("Record: " + ", ".join(map(str, written)))
    failed = any(v.status in ("failed", "not reached") for v in verdicts)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
