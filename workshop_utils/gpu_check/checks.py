"""The GPU check's paths through the package's own pieces: CUDA-event timing, the allocator's peak,
the precision modes and the GradScaler, the attention kernel, fused optimizers, the device loaders,
chunked evaluation, checkpoint and resume, NVML, TensorBoard, the profiler, torch.compile and CUDA graphs.

Each runs the same code the notebooks and the training command run, at a few steps, and returns one
line of what it measured. What a notebook, a benchmark or two GPUs run as a whole is in ``workloads``.
"""

from __future__ import annotations

import math
import time
from pathlib import Path

import torch

from .context import Context, Failed, Skip, finite_loss, sane_rate


def check_cuda_events(ctx: Context) -> str:
    from ..spine.timing import RegionTimer, time_repeats

    n = 4096 if ctx.on_gpu else 512
    a, b = (torch.randn(n, n, device=ctx.device, dtype=torch.bfloat16) for _ in range(2))
    timings = time_repeats(lambda: a @ b, repeats=20, warmup=3, device=ctx.device)
    if not (timings.seconds > 0).all():
        raise Failed(f"an event interval was not positive: {timings.seconds.tolist()}")
    tflops = 2 * n**3 / timings.median / 1e12
    if ctx.on_gpu:
        sane_rate(tflops, torch.cuda.get_device_name(ctx.device), "bf16", "bf16 matmul")
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
    from ..lessons.monitor import StepMemory, is_out_of_memory, release_failed_run
    from ..spine.timing import memory_in_use_mib, peak_memory_mib, reset_peak_memory

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
        loss = finite_loss(result, precision)
        mfu = result.metrics["mfu"]
        if ctx.on_gpu:
            tf32 = torch.backends.cuda.matmul.allow_tf32
            if tf32 != (precision == "tf32"):
                raise Failed(f"{precision}: TF32 matmuls are {'on' if tf32 else 'off'} after configure_precision")
            if mfu is not None and not 0 < mfu <= 1:
                raise Failed(f"{precision}: MFU {mfu} is outside (0, 1]")
        parts.append(f"{precision} loss {loss:.2f}, {result.metrics['samples_per_s']:,.0f} samples/s")
    return f"SimpleCNN, batch {ctx.config().batch_size}, 6 steps each: " + "; ".join(parts)


def check_grad_scaler(ctx: Context) -> str:
    ctx.need_gpu("fp16 with a GradScaler")
    from ..lessons.numerics import grad_scaler_trace, training_batches
    from ..spine.models import build_model

    model = build_model("simplecnn").to(ctx.device)
    trace = grad_scaler_trace(model, training_batches(ctx.images(), 128, ctx.device, 8), ctx.device)
    scales = trace["next scale"].tolist()
    if not scales or not all(math.isfinite(s) and s > 0 for s in scales):
        raise Failed(f"the GradScaler's scales are not positive and finite: {scales}")
    skipped = int(trace["event"].str.startswith("overflow").sum())
    return f"8 fp16 steps: scale {trace['scale'].iloc[0]:g} -> {scales[-1]:g}, {skipped} steps skipped on overflow"


def check_attention_kernel(ctx: Context) -> str:
    from ..lessons.profiling import attention_kernels
    from ..spine.gpt import build_gpt

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
    loss = finite_loss(result, "fused AdamW")
    sgd = ctx.train(name="check-fused-sgd", optimizer_kernels="fused")
    finite_loss(sgd, "fused SGD")
    return f"{ctx.gpt_size} bf16 with fused AdamW, loss {loss:.2f}; SimpleCNN with fused SGD"


def check_loaders(ctx: Context) -> str:
    parts = []
    for loader, extra in (("device", {}), ("torch", dict(num_workers=2, pin_memory=True, persistent_workers=True))):
        result = ctx.train(name=f"check-{loader}-loader", loader=loader, **extra)
        finite_loss(result, f"{loader} loader")
        parts.append(f"{loader}{' (2 workers, pinned)' if extra else ''} {result.metrics['samples_per_s']:,.0f} "
                     f"samples/s, data wait {result.metrics['data_wait_fraction']:.0%}")
    gpt = ctx.train(name="check-gpt-device-loader", model="gpt", loader="device")
    finite_loss(gpt, "the GPT's device loader")
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
    from ..lessons.monitor import DeviceMonitor

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
    from ..spine.scalar_log import ScalarLog

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
    from ..lessons.profiling import nsys_missing, profile_training, step_breakdown, top_ops

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
    loss = finite_loss(result, "compiled")
    return f"tiny GPT compiled: {result.metrics['warmup_s']:.1f} s of warm-up (the compile), loss {loss:.2f}"


def check_cuda_graphs(ctx: Context) -> str:
    ctx.need_gpu("CUDA graphs")
    from ..lessons.profiling import profile_training, step_breakdown

    config = ctx.config(name="check-cuda-graphs", compile=True, compile_mode="reduce-overhead", loader="device")
    run = profile_training(config, ctx.images(), ctx.folder, name="check-cuda-graphs", wait=0, warmup=3, active=3,
                           detail=False)
    counts = step_breakdown(run)
    if not counts.get("graph_launches_per_step"):
        raise Failed(f"no CUDA graph was replayed in the profiled steps: {counts}")
    return (f"SimpleCNN, the ladder's CUDA-graphs rung: {counts['graph_launches_per_step']:.0f} graph launches and "
            f"{counts.get('launches_per_step') or 0:.0f} other launches a step")


def check_fp8_matmul(ctx: Context) -> str:
    from ..lessons.numerics import fp8_matmul_benchmark, fp8_support

    reason = fp8_support(ctx.device)
    if reason:
        raise Skip(f"no fp8 here: {reason}")
    table = fp8_matmul_benchmark(ctx.device, size=4096, repeats=10)
    fp8 = table.loc["fp8 e4m3"]
    if not fp8["relative error"] < 0.1:
        raise Failed(f"the fp8 product is {fp8['relative error']:.1e} away from the exact one (relative)")
    return "4096x4096 matmul: " + "; ".join(f"{name} {row['TFLOP/s']:,.0f} TFLOP/s, relative error {row['relative error']:.1e}"
                                            for name, row in table.iterrows()) + f"; fp8 {fp8['speed-up vs bf16']:.2f}x bf16"
