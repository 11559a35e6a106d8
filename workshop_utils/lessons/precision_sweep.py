"""Precision modes across batch sizes: why one batch size can hide the tensor-core gain.

A comparison of fp32, tf32 and bf16 at one batch size answers for that batch size only.
At a small batch a step is a handful of short kernels, and the time goes to launching them,
to Python and to the optimizer: faster arithmetic has little to speed up, and bf16 looks no
better than fp32. As the batch grows the matrix multiplies dominate, and on a GPU with tensor
cores the gain is expected to appear (the kit has not swept batch sizes on a GPU yet); a CPU
without bf16 instructions only emulates bf16, and its gap to fp32 can widen instead.
``precision_batch_sweep`` trains the same ``TrainConfig`` once per batch size and mode (the one
training loop, only ``batch_size`` and ``precision`` changed), so the table and
``plot_precision_batch_sweep``'s chart show what a machine does, batch by batch.

``step_memory`` measures, for one configuration, the tensor memory a training step adds at its
peak: the same way for every precision mode, whatever ran before in the process.

* A mode that runs out of memory ends its own sweep with a row saying so; the others go on.
* A mode a CPU only emulates (``precision_configs``) runs its few steps or is skipped, and its
  rows say which, instead of the mode silently vanishing from the table.
"""

from __future__ import annotations


import matplotlib.pyplot as plt
import pandas as pd
import torch

from ..spine.data import CifarData
from ..spine.losses import forward_loss
from ..spine.models import TOKEN_MODELS, build_model
from ..spine.precision import autocast, emulated_on_cpu, grad_scaler
from ..spine.timing import step_peak_mib
from ..spine.trainer import TrainConfig, build_optimizer, train
from ..system.errors import WorkshopError
from ..system.hardware import pick_device
from ..system.plotstyle import PALETTE, precision_color, style
from .monitor import StepMemory, is_out_of_memory, release_failed_run, stopped_by_memory
from .numerics import precision_configs, training_batches
from ..system.progress import progress_bar

METRICS = ("steps", "samples_per_s", "step_ms_median", "tflops_per_device", "peak_memory_mib")
REFERENCES = ("fp32", "tf32")  # speed-ups are against these, at the same batch size, where they were run


def step_memory(config: TrainConfig, data) -> dict:
    """The tensor memory one training step of ``config`` adds at its peak, above its model, optimizer state and batch.

    Measured outside the timed runs, on a fresh model and one batch of ``data`` (images, or text for the GPT), with
    the optimizer's state already made (an update from zero gradients: no forward or backward pass): activations,
    gradients and the temporaries of autocast and the loss scaler. A mode the CPU only emulates is not measured
    (its two-step speed probe already takes seconds a step): its entry is None and says why. Counted as
    ``step_peak_mib`` counts (the allocator on a GPU, the profiler's allocation records on a CPU), so
    every precision mode is measured the same way: a run's peak resident memory on a CPU also holds what the
    process's first runs left behind (the first mode run pays the allocator's growth), which is why the modes are
    not compared on that. Returns ``step_memory_mib`` and ``step_memory_measure`` (what was counted).
    """
    device = pick_device(config.device)
    emulated = emulated_on_cpu(config.precision, device)
    if emulated:
        return {"step_memory_mib": None, "step_memory_measure": f"not measured: {emulated.split(', so')[0]}"}
    text = config.model in TOKEN_MODELS
    torch.manual_seed(config.seed)
    model = build_model(config.model, size=config.gpt_size if text else None).to(device)
    if text:
        model.use_attention(config.attention)
        from ..spine.text import first_windows

        inputs, targets = first_windows(data.train_tokens, config.sequence_length, config.batch_size, device)
    else:
        inputs, targets = training_batches(data, config.batch_size, device, steps=1, seed=config.seed)[0]
    if config.channels_last:
        model = model.to(memory_format=torch.channels_last)
    optimizer, scaler = build_optimizer(config, model), grad_scaler(config.precision, device)

    def one_step():
        optimizer.zero_grad(set_to_none=True)
        with autocast(config.precision, device):
            loss, _ = forward_loss(model, inputs, targets, text)
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()

    for parameter in model.parameters():  # the optimizer's state, which every step after the first starts from
        parameter.grad = torch.zeros_like(parameter)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)  # each step makes its gradients anew: they count as the step's
    mib, measure = step_peak_mib(one_step, device)
    return {"step_memory_mib": mib, "step_memory_measure": f"{measure}, one step above the model, its optimizer "
                                                            "state and the batch"}


def precision_batch_sweep(base: TrainConfig, data: CifarData | None, modes=("fp32", "bf16"),
                          batch_sizes=(16, 64, 256), steps: int = 20, warmup_steps: int = 5, run_dir=None,
                          cpu_emulated_steps: int = 2, memory_cap_mib: float | None = None,
                          progress: bool = True) -> pd.DataFrame:
    """Train ``base`` once per batch size and mode; one row each, with speed-ups against fp32 (and tf32).

    Every run takes ``steps`` optimizer steps, the first ``warmup_steps`` untimed. Rows: batch_size,
    precision, status, steps, samples_per_s, step_ms_median, tflops_per_device, peak_memory_mib and
    ``speedup_vs_fp32`` / ``speedup_vs_tf32`` (at the same batch size; a reference mode not swept
    has no column). ``status`` is "ok", "emulated on this CPU: ..." (a few steps, not a fair speed),
    "skipped: ..." (not run, and why), or "out of memory at batch B", after which that mode is
    not tried at larger batches. ``memory_cap_mib`` makes a step that needs more raise an
    out-of-memory error on any device (``StepMemory``). With ``run_dir`` every run's record is saved.
    """
    if not modes or not batch_sizes:
        raise WorkshopError("Nothing to sweep: no modes or no batch sizes.", "pass at least one of each.")
    if not 0 <= warmup_steps < steps:
        raise WorkshopError(f"warmup_steps {warmup_steps} leaves no timed step of {steps}.",
                            "use 0 <= warmup_steps < steps.")
    device = pick_device(base.device)
    images = None if data is None else len(data.train_labels)
    # As many epochs as steps: every epoch holds at least one step, so ``steps`` decides, at any batch size.
    sized = base.replace(max_steps=steps, warmup_steps=warmup_steps, epochs=max(base.epochs, steps), progress=False)
    configs = {c.precision: c for c in precision_configs(sized, modes, cpu_emulated_steps)}  # says what it sizes down
    sizes = sorted(set(batch_sizes))
    rows, out_of_memory = [], set()
    bar = progress_bar(total=len(sizes) * len(configs), desc="precision x batch", unit="run", disable=not progress)
    for size in sizes:
        for mode in modes:
            row = {"batch_size": size, "precision": mode}
            config = configs.get(mode)
            if config is None:
                reason = emulated_on_cpu(mode, torch.device("cpu")) or "not run here"
                rows.append({**row, "status": f"skipped: {reason.split(', so')[0]}"})
                continue
            if mode in out_of_memory:
                bar.update()
                continue  # its sweep ended at a smaller batch, with a row saying so
            if images is not None and size > images:
                rows.append({**row, "status": f"skipped: batch larger than the {images} training images"})
                bar.update()
                continue
            bar.set_postfix_str(f"{mode}, batch {size}")
            probe = StepMemory(device, limit_mib=memory_cap_mib) if memory_cap_mib is not None else None
            failed = None
            try:
                result = train(config.replace(name=f"{config.name}-b{size}", batch_size=size), data, on_step=probe)
            except Exception as err:
                if not is_out_of_memory(err):
                    raise
                failed = str(err).splitlines()[0][:160] if str(err) else "out of memory"
            bar.update()
            if failed is not None:
                out_of_memory.add(mode)
                rows.append({**row, "status": probe.stop_status(size) if probe else f"out of memory at batch {size}",
                             "peak_memory_mib": probe.max_mib if probe else None, "detail": failed})
                release_failed_run(device)
                continue
            if run_dir is not None:
                result.save(run_dir, f"{config.name}-b{size}")
            metrics = {key: result.metrics.get(key) for key in METRICS}
            status = (f"emulated on this CPU: {config.max_steps} steps, not a fair speed"
                      if emulated_on_cpu(mode, device) else
                      "ok" if metrics["samples_per_s"] else "not timed: no step left after warm-up")
            rows.append({**row, "status": status, **metrics})
    bar.close()
    table = pd.DataFrame(rows)
    for column in ("status", *METRICS):
        if column not in table:
            table[column] = None
    for reference in REFERENCES:
        if reference in modes:
            table[f"speedup_vs_{reference}"] = [_ratio(table, size, mode, reference)
                                                for size, mode in zip(table["batch_size"], table["precision"])]
    first = ["batch_size", "precision", "status", *METRICS]
    return table[first + [c for c in table.columns if c not in first and c != "detail"]
                 + (["detail"] if "detail" in table else [])]


def _speed(table: pd.DataFrame, size: int, mode: str) -> float | None:
    match = table[(table["batch_size"] == size) & (table["precision"] == mode)]["samples_per_s"].dropna()
    return float(match.iloc[0]) if len(match) and match.iloc[0] else None


def _ratio(table: pd.DataFrame, size: int, fast: str, slow: str) -> float | None:
    fast_speed, slow_speed = _speed(table, size, fast), _speed(table, size, slow)
    return fast_speed / slow_speed if fast_speed and slow_speed else None


def speedup_by_batch(table: pd.DataFrame, fast: str = "bf16", slow: str = "fp32") -> pd.Series:
    """``fast``'s throughput over ``slow``'s at each batch size where both were timed (index: batch size)."""
    sizes = sorted(set(table["batch_size"]))
    ratios = {size: _ratio(table, size, fast, slow) for size in sizes}
    return pd.Series({s: r for s, r in ratios.items() if r is not None}, name=f"{fast} vs {slow}", dtype=float)


def _finding(table: pd.DataFrame) -> str:
    """One sentence with numbers: the fastest mode's gain over fp32 at the smallest and largest batch timed."""
    modes = list(dict.fromkeys(table["precision"]))
    fast = next((m for m in ("bf16", "fp16", "tf32") if m in modes and m != "fp32"), None)
    gains = speedup_by_batch(table, fast, "fp32") if fast and "fp32" in modes else pd.Series(dtype=float)
    if len(gains) >= 2:
        (small, low), (large, high) = (gains.index[0], gains.iloc[0]), (gains.index[-1], gains.iloc[-1])
        return f"{fast} runs {low:.1f}x fp32's speed at batch {small} and {high:.1f}x at batch {large}"
    if len(gains) == 1:
        return f"{fast} runs {gains.iloc[0]:.1f}x fp32's speed at batch {gains.index[0]} (one batch size timed)"
    timed = table.dropna(subset=["samples_per_s"])
    if timed.empty:
        return "no run was timed"
    best = timed.loc[timed["samples_per_s"].astype(float).idxmax()]
    return f"fastest: {best['precision']} at batch {best['batch_size']} ({best['samples_per_s']:,.0f} samples/s)"


def plot_precision_batch_sweep(table: pd.DataFrame, title: str = "Throughput by precision and batch size"):
    """Samples/s against batch size (log2 axis), one line per precision in its colour; the title states the gain.

    An emulated mode's line says so in its label; a mode that ran out of memory gets an X at the
    batch that failed, on the x axis.
    """
    with style():
        fig, ax = plt.subplots(figsize=(7.5, 4.2))
        for index, mode in enumerate(dict.fromkeys(table["precision"])):
            part = table[table["precision"] == mode]
            timed = part.dropna(subset=["samples_per_s"])
            color = precision_color(mode) or PALETTE[index % len(PALETTE)]
            emulated = timed["status"].astype(str).str.startswith("emulated").any()
            if not timed.empty:
                ax.plot(timed["batch_size"], timed["samples_per_s"].astype(float), "o-", color=color,
                        label=f"{mode} (emulated on this CPU)" if emulated else mode)
            for _, row in part[part["status"].map(stopped_by_memory)].iterrows():
                ax.plot([row["batch_size"]], [0], "X", color=color, markersize=11, clip_on=False,
                        label=f"{mode}: {row['status']}")
        sizes = sorted(set(table["batch_size"]))
        ax.set_xscale("log", base=2)
        ax.set_xticks(sizes, [str(s) for s in sizes])
        ax.minorticks_off()
        ax.set(xlabel="batch size (samples per step)", ylabel="throughput (samples/s)", ylim=(0, None),
               title=f"{title}\n{_finding(table)}")
        if ax.get_lines():
            ax.legend(loc="upper left")
        fig.tight_layout()
    return fig
