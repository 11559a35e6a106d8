"""The GPU check's paths through whole workloads: the GPT throughput benchmark, each notebook's
gpu-profile runs at a few steps, the GPUs' NUMA nodes, and what needs two GPUs (DDP over NCCL, FSDP2,
tensor parallelism, the overlap measurement, collectives, distributed checkpoints, the DDP lab).

The two-GPU ones run under torchrun through the same launchers the notebooks use.
"""

from __future__ import annotations

import contextlib
import importlib.util
import sys
from collections.abc import Callable
from pathlib import Path

from ..system.results import repo_root
from .context import Context, Failed, Skip, finite_loss


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
    from ..lessons.numerics import fp8_support

    modes = ("fp32", "tf32", "fp16", "bf16") if ctx.on_gpu else ("fp32", "bf16")
    parts = []
    if importlib.util.find_spec("torchvision") is not None:
        for mode in modes:
            result = ctx.train(name=f"check-nb03-resnet18-{mode}", model="resnet18", precision=mode,
                               channels_last=True, batch_size=256, max_steps=4, warmup_steps=1)
            finite_loss(result, f"ResNet-18 {mode}")
        parts.append(f"ResNet-18 channels_last in {', '.join(modes)}")
    for mode in modes:
        result = ctx.train(name=f"check-nb03-gpt-{mode}", model="gpt", precision=mode, max_steps=4, warmup_steps=1)
        finite_loss(result, f"GPT {mode}")
    parts.append(f"{ctx.gpt_size} in {', '.join(modes)}")
    fp8 = fp8_support(ctx.device)
    return "; ".join(parts) + (f"; fp8: {fp8.split(':')[0]}" if fp8 else "; fp8 tensor cores present")


def check_notebook_04(ctx: Context) -> str:
    from ..lessons.sweeps import climb_ladder, dataloader_sweep, gpt_ladder_rungs

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
    from ..lessons.recompute import measure_gpt_recompute, measure_recompute

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
    from ..lessons.slurm_binding import gpu_numa, numa_binding_problem

    where = gpu_numa()
    if where in ("-", "") or ":" not in where:
        raise Failed(f"no GPU listed with its NUMA node: {where!r}")
    binding = numa_binding_problem(1)
    return f"GPU:NUMA node {where}; torchrun --numa-binding=node " + (f"not usable: {binding}" if binding else "usable")


def two_gpu_demo(part: str, **options) -> Callable[[Context], str]:
    def run(ctx: Context) -> str:
        from ..parallel_demos import launch_demo

        record = launch_demo(part, nproc=2, device="cuda", timeout_s=120, echo=False, **options)
        return f"{part} on 2 GPUs over NCCL: {', '.join(sorted(record))}"

    return run


def check_ddp_nccl(ctx: Context) -> str:
    from ..parallel.launch import launch_training

    launched = launch_training(2, device="cuda", steps=10, batch_size=64, train_size=2048, test_size=256,
                               synthetic=True, echo=False, timeout_s=120)
    metrics = launched.record["metrics"]
    return f"DDP on 2 GPUs: {metrics['samples_per_s']:,.0f} samples/s, {metrics['all_reduces']} all-reduces"


def check_ddp_lab(ctx: Context) -> str:
    from ..exercises.ddp_lab import check_ddp_lab as judge, lab_device

    if lab_device(3) != "cuda":  # its launch of 2 runs as two nodes of 2 + 1 ranks
        raise Failed("the DDP lab would run on CPU processes although three GPUs are visible")
    script = (repo_root() or Path.cwd()) / "notebooks" / "labs" / "ddp_lab" / "train_ddp.py"
    if not script.exists():
        raise Skip("notebooks/labs/ddp_lab/train_ddp.py is not in this checkout")
    with contextlib.redirect_stdout(sys.stderr):
        judge(script, ctx.folder / "ddp_lab", nproc=2, echo=False)
    return "the DDP lab's solution judged on 3 GPUs over NCCL (a launch of 2 as two nodes, 2 + 1 ranks)"
