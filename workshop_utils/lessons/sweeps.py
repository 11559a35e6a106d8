"""Measure, change one thing, measure again: the sweeps and the optimization ladder of notebook 04.

Every point of every sweep is one call of the one training loop (``train``) with
one field of ``TrainConfig`` changed, so a difference in the table can only come
from that field. Each function returns a pandas table and, given a run folder,
saves every run's full record there.

* ``dataloader_sweep``: ``num_workers`` x ``pin_memory``, with the share of each
  step spent waiting for data and Amdahl's bound on what fixing it could gain.
* ``batch_size_sweep``: 32, 64, ... until memory runs out; the out-of-memory
  error is caught and reported, never raised. A memory cap stands in for the limit on a CPU, and the row says so;
  there a step's tensor memory is measured, not the process's.
* ``climb_ladder``: the cumulative optimization ladder, one switch per rung. A rung that switches
  nothing here is not trained again, and a speed-up that the passes do not agree on is not credited.
"""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass

import numpy as np
import pandas as pd

from ..spine.data import CifarData
from ..system.benchmark import median_run
from ..system.errors import WorkshopError
from ..spine.precision import emulated_on_cpu
from ..system.hardware import cpu_cores, peak_tflops, pick_device
from .monitor import StepMemory, is_out_of_memory, release_failed_run
from .precision_sweep import step_memory
from ..spine.trainer import TrainConfig, train
from ..system.progress import progress_bar

METRICS = ("samples_per_s", "step_ms_median", "data_wait_fraction", "mfu")
# every rung reports speed, step-time spread, memory and MFU (the device name picks the stated peak)
LADDER_METRICS = ("samples_per_s", "step_ms_median", "step_ms_p90", "data_wait_fraction", "peak_memory_mib",
                  "tflops_per_device", "mfu", "device_name", "final_test_acc", "warmup_s")
# warmup_s: the untimed first steps, where torch.compile and CUDA-graph capture spend their time, shown apart
SAME_AS_BELOW = "same settings as the rung before it"
NO_MEASURABLE_CHANGE = "no measurable change"


def amdahl_speedup(fraction: float, factor: float = math.inf) -> float:
    """Amdahl's law: the overall speed-up when ``fraction`` of the time becomes ``factor`` times faster.

    With ``factor=inf`` it is the ceiling, 1 / (1 - fraction): removing a part of the work
    entirely can never gain more than the rest of the work allows.
    """
    if not 0 <= fraction <= 1:
        raise WorkshopError(f"fraction must be between 0 and 1, got {fraction}.", "pass a share of the time.")
    if factor <= 0:
        raise WorkshopError(f"factor must be positive, got {factor}.", "pass how many times faster the part gets.")
    if fraction == 1 and math.isinf(factor):
        return math.inf
    return 1 / ((1 - fraction) + fraction / factor)


def _run(config: TrainConfig, data: CifarData, run_dir, **extra):
    result = train(config, data, **extra)
    if run_dir is not None:
        result.save(run_dir, config.name)
    return result


def _metrics(result, keys=METRICS) -> dict:
    return {key: result.metrics.get(key) for key in keys}


def worker_counts(candidates=(0, 2, 4, 8), cores: int | None = None) -> list[int]:
    """The candidate worker counts this machine can run: more workers than cores only compete."""
    cores = cpu_cores() if cores is None else cores
    return sorted({c for c in candidates if c <= cores})


def dataloader_sweep(config: TrainConfig, data: CifarData, workers=(0, 2, 4, 8), pin_memory=(False, True),
                     run_dir=None) -> pd.DataFrame:
    """Throughput and data-wait share for each ``num_workers`` x ``pin_memory`` (torch loader)."""
    device = pick_device(config.device)
    if device.type != "cuda" and True in pin_memory:
        print("note: pinned memory only speeds up copies to a GPU; on the CPU only pin_memory=False is run.")
        pin_memory = (False,)
    rows = []
    for count in worker_counts(workers):
        for pin in pin_memory:
            run = config.replace(name=f"loader-w{count}-pin{int(pin)}", loader="torch", num_workers=count,
                                 pin_memory=pin, persistent_workers=count > 0)
            metrics = _metrics(_run(run, data, run_dir))
            wait = metrics["data_wait_fraction"] or 0.0
            rows.append({"num_workers": count, "pin_memory": pin, **metrics,
                         "amdahl_max_speedup": amdahl_speedup(wait)})
    return pd.DataFrame(rows)


def batch_sizes(start: int = 32, largest: int = 4096) -> list[int]:
    if start <= 0 or largest < start:
        raise WorkshopError(f"Cannot sweep batch sizes from {start} to {largest}.", "use 0 < start <= largest.")
    sizes = [start]
    while sizes[-1] * 2 <= largest:
        sizes.append(sizes[-1] * 2)
    return sizes


def batch_size_sweep(config: TrainConfig, data: CifarData, start: int = 32, largest: int = 4096,
                     memory_cap_mib: float | None = None, run_dir=None) -> pd.DataFrame:
    """Double the batch size from ``start`` until ``largest`` or until memory runs out.

    Out of memory ends the sweep with a row instead of an exception: "out of memory at batch B" when the
    device ran out (a GPU), "over the N MiB memory cap at batch B" when a step needed more than
    ``memory_cap_mib`` (any device: a CPU, where running out would mean swapping). On a GPU peak memory is the
    run's record's (what its training steps added above the memory in use before its model was built), and the cap
    watches every step. On a CPU it is one step's tensor memory above the model, its optimizer state and the batch,
    from the profiler's allocation records (``step_memory``), which the cap judges before the run: the process's
    resident memory also holds what earlier runs left behind, so it does not grow with the batch from one run to
    the next (notebook 04's batch 32 read 245 to 492 MiB in five runs on one machine, and 64 less than 32 in three).
    A precision mode the CPU only emulates is not measured that way, and falls back to the resident memory.
    """
    device = pick_device(config.device)
    sizes = [b for b in batch_sizes(start, largest) if b <= len(data.train_labels)]
    if not sizes:
        raise WorkshopError(f"Only {len(data.train_labels)} training images: no batch of {start} fits.",
                            "use more training images or a smaller start.")
    rows = []
    for size in sizes:
        sized = config.replace(name=f"batch-{size}", batch_size=size)
        tensors = step_memory(sized, data)["step_memory_mib"] if device.type == "cpu" else None
        probe = StepMemory(device, limit_mib=memory_cap_mib)
        try:
            if tensors is not None:
                probe.record(tensors)  # over the cap it raises here, as a step over it would, and nothing trains
            result = _run(sized, data, run_dir, on_step=probe if tensors is None else None)
        except Exception as err:
            if not is_out_of_memory(err):
                raise
            rows.append({"batch_size": size, "status": probe.stop_status(size),
                         "peak_memory_mib": probe.max_mib, "detail": str(err).splitlines()[0][:160]})
            break
        metrics = _metrics(result)
        status = "ok" if metrics["samples_per_s"] else "not timed: no step left after warm-up"
        peak = result.metrics["peak_memory_mib"] if tensors is None else tensors
        rows.append({"batch_size": size, "status": status, **metrics, "peak_memory_mib": peak})
    release_failed_run(device)
    return pd.DataFrame(rows)


@dataclass(frozen=True)
class Rung:
    """One step of the ladder: a label, the TrainConfig fields it changes, and why it helps.

    ``not_here`` says why the rung does not apply on this machine (a format the CPU only emulates,
    compilation switched off): the ladder shows it with that reason instead of training it, and the
    rungs after it do not inherit its switch.
    """

    label: str
    changes: dict
    why: str
    not_here: str | None = None


def ladder_rungs(tuned_loader: dict | None = None, compile: bool = True, device=None, base: TrainConfig | None = None,
                 batch_factor: int = 4, lr_warmup_steps: int = 50) -> list[Rung]:
    """The workshop's ladder; each rung keeps everything before it and switches one more thing.

    ``device`` (default: the one ``pick_device`` chooses) decides which rungs apply here.

    The large-batch rung multiplies ``base``'s batch size and learning rate by ``batch_factor``
    (the linear scaling rule) and raises the learning rate over ``lr_warmup_steps`` steps: a step
    then launches the same kernels for ``batch_factor`` times the samples.
    """
    device = pick_device(device)
    base = TrainConfig() if base is None else base
    tuned_loader = tuned_loader or dict(num_workers=min(8, cpu_cores()), pin_memory=True,
                                        persistent_workers=True, prefetch_factor=4)
    rungs = [
        Rung("baseline", {}, "notebook 01's settings: fp32, PIL DataLoader"),
        Rung("tuned DataLoader", tuned_loader, "worker processes decode and augment ahead of the model"),
        Rung("BF16 autocast", {"precision": "bf16"}, "tensor cores at half the bytes per value",
             emulated_on_cpu("bf16", device)),
        Rung("channels_last", {"channels_last": True}, "the NHWC layout tensor-core convolutions read directly"),
        Rung("device-resident loader", {"loader": "device"}, "data set on the device: no decode, no copies"),
        Rung("fused optimizer", {"optimizer_kernels": "fused"}, "the SGD update of every tensor in one kernel"),
        # As many epochs more as the batch is larger: the run still gets its planned number of steps.
        Rung(f"{batch_factor}x batch", {"batch_size": base.batch_size * batch_factor, "lr": base.lr * batch_factor,
                                        "lr_warmup_steps": max(base.lr_warmup_steps, lr_warmup_steps),
                                        "epochs": base.epochs * batch_factor},
             f"{batch_factor}x the samples per launch and per Python step; learning rate scaled and warmed up",
             None if batch_factor > 1 else "batch_factor 1 changes nothing"),
        Rung("torch.compile", {"compile": True}, "fused kernels, fewer launches and memory trips",
             None if compile else "compilation is switched off in this profile (minutes on a small CPU)"),
        Rung("CUDA graphs", {"compile_mode": "reduce-overhead"}, "forward and backward each replayed as one recorded graph: one launch each; "
             "loss, optimizer and loader launch as before",
             "CUDA graphs need a GPU" if device.type != "cuda" else
             None if compile else "it builds on torch.compile, switched off in this profile"),
    ]
    return rungs


def gpt_ladder_rungs(base: TrainConfig, compile: bool = True, device=None, micro_batches: int = 2) -> list[Rung]:
    """The ladder on the GPT, from fp32 eager with unfused attention and a DataLoader (``base`` sets those).

    The last rung is a trade, not a speed-up: ``micro_batches`` forward and backward passes of 1/k the
    sequences add up to the same tokens per optimizer step, for about 1/k of the activation memory.
    """
    device = pick_device(device)
    splits = micro_batches > 1 and base.batch_size % micro_batches == 0
    return [
        Rung("baseline", {}, "fp32, attention as matmul, mask, softmax, matmul; DataLoader; AdamW's default kernels"),
        Rung("fused attention", {"attention": "fused"},
             "scaled_dot_product_attention: one flash or memory-efficient kernel, no attention matrix stored"),
        Rung("device-resident loader", {"loader": "device"}, "the token array on the device: a batch is one gather"),
        Rung("BF16 autocast", {"precision": "bf16"}, "the matmuls on tensor cores at half the bytes per value",
             emulated_on_cpu("bf16", device)),
        Rung("fused AdamW", {"optimizer_kernels": "fused"}, "the AdamW update of every tensor in one kernel"),
        Rung("torch.compile", {"compile": True}, "layer norms, GELU and residual adds fused into the matmuls' neighbours",
             None if compile else "compilation is switched off in this profile (minutes on a small CPU)"),
        Rung(f"{micro_batches} micro-batches", {"batch_size": base.batch_size // max(micro_batches, 1),
                                                "accumulation_steps": micro_batches},
             f"the same tokens per optimizer step in {micro_batches} passes: activation memory for time",
             None if splits else f"batch {base.batch_size} does not split into {micro_batches} micro-batches"),
    ]


def rung_configs(base: TrainConfig, rungs: list[Rung]) -> list[TrainConfig | None]:
    """Each rung's config: ``base`` with the switches of every applicable rung up to it; None where not here."""
    if not rungs:
        raise WorkshopError("The ladder has no rungs.", "pass ladder_rungs() or a list of Rung.")
    configs, config = [], base
    prefix = "ladder" if base.model == "simplecnn" else f"{base.model}-ladder"  # two ladders share a run folder
    for index, rung in enumerate(rungs):
        slug = rung.label.lower().replace(" ", "-").replace(".", "-")
        if rung.not_here:
            configs.append(None)  # shown with its reason, not trained; later rungs do not inherit it
            continue
        config = config.replace(name=f"{prefix}-{index}-{slug}", **rung.changes)
        configs.append(config)
    return configs


def same_as_below(configs: list[TrainConfig | None]) -> list[bool]:
    """Whether each rung's config equals, apart from its name, that of the last rung below it that applies.

    Such a rung switches nothing on this machine (the tuned loader where the best setting found is the
    baseline's own): training it again would measure only run-to-run noise, and its ratio would credit
    that noise as a gain.
    """
    flags, below = [], None
    for config in configs:
        flags.append(config is not None and below is not None and config.replace(name=below.name) == below)
        below = config if config is not None else below
    return flags


def _per_pass_range(speeds, against) -> tuple[float, float]:
    """The smallest and largest of the per-pass ratios ``speeds / against``; NaN where there is no spread."""
    if speeds is None or against is None or len(speeds) < 2:
        return math.nan, math.nan
    ratios = np.asarray(speeds, dtype=float) / np.asarray(against, dtype=float)
    ratios = ratios[np.isfinite(ratios)]
    return (float(ratios.min()), float(ratios.max())) if len(ratios) >= 2 else (math.nan, math.nan)


def _credit_measurable_changes(table: pd.DataFrame, passes: list) -> pd.DataFrame:
    """Put each ratio's run-to-run spread beside it, and take back the ratios that the spread does not support.

    ``passes`` holds, per row of ``climb_ladder``'s table, the rung's samples/s in every round-robin pass
    (in pass order), or None for a rung that did not run. The ratio of the same two rungs is taken pass by
    pass: ``vs_previous_min``/``_max`` and ``vs_baseline_min``/``_max`` are the smallest and largest. Where
    1 lies between them, some passes found the rung faster and others slower: the difference is inside the
    noise, so the ratio is left empty (NaN) and the note says "no measurable change". With one pass there
    is no spread, and the ratios stand as measured.
    """
    below, baseline = None, passes[0]
    spreads = {"vs_previous": [], "vs_baseline": []}
    for index, speeds in enumerate(passes):
        spreads["vs_previous"].append(_per_pass_range(speeds, below))
        # the baseline against itself is the denominator, not a change
        spreads["vs_baseline"].append(_per_pass_range(speeds, baseline) if index else (math.nan, math.nan))
        below = speeds if speeds is not None else below
    notes = [[] for _ in passes]
    for column, against in (("vs_previous", "the rung below"), ("vs_baseline", "the baseline")):
        low, high = (pd.Series([s[i] for s in spreads[column]], index=table.index) for i in (0, 1))
        inside = (low <= 1) & (1 <= high)
        table[column] = table[column].astype(float).mask(inside)
        for index in np.flatnonzero(inside.to_numpy()):
            notes[index].append(f"against {against} (per-pass ratios {low.iloc[index]:.2f}–{high.iloc[index]:.2f}x)")
        position = table.columns.get_loc(column)
        table.insert(position + 1, f"{column}_min", low)
        table.insert(position + 2, f"{column}_max", high)
    table["note"] = [f"{NO_MEASURABLE_CHANGE} " + " nor ".join(found) if found else note
                     for found, note in zip(notes, table["note"])]
    return table


def speedup_text(row, column: str = "vs_baseline") -> str:
    """One ratio of a ladder row as a reader should take it: "1.52x (per pass 1.48–1.57x)", "no measurable
    change (per pass 0.97–1.04x)", or the row's note where the rung has no ratio (not trained here)."""
    value, low, high = row[column], row.get(f"{column}_min"), row.get(f"{column}_max")
    spread = f" (per pass {low:.2f}–{high:.2f}x)" if pd.notna(low) and pd.notna(high) else ""
    if pd.notna(value):
        return f"{value:.2f}x{spread}"
    if spread:
        return NO_MEASURABLE_CHANGE + spread
    return row.get("note") or "no ratio"


def climb_ladder(base: TrainConfig, data: CifarData, rungs: list[Rung], run_dir=None,
                 repeats: int = 1, progress: bool = False) -> pd.DataFrame:
    """Train once per rung, each with all switches so far; speed-ups against the previous rung and the base.

    With ``repeats`` > 1 the rungs are trained round-robin that many times and each rung keeps
    its median run: a neighbour's job that slows a shared machine for a while then slows every
    rung alike instead of one, so the ratios stay meaningful. Each ratio then comes with the range
    of its per-pass values, and one whose range includes 1 is not credited
    (``_credit_measurable_changes``). A rung whose settings equal the rung's below (``same_as_below``)
    is not trained again: it has no ratio and its note says so. ``progress`` shows a bar over the
    runs (the benchmark's; a notebook's runs print their own lines).
    """
    if not isinstance(repeats, int) or repeats < 1:
        raise WorkshopError(f"repeats must be a whole number >= 1, got {repeats!r}.", "use repeats=1 or more.")
    configs = rung_configs(base, rungs)
    unchanged = same_as_below(configs)
    runs = [[] for _ in rungs]
    trained = [(index, config) for index, config in enumerate(configs) if config is not None and not unchanged[index]]
    bar = progress_bar(total=repeats * len(trained), desc="ladder runs", unit="run", disable=not progress, file=sys.stderr)
    for repeat in range(repeats):
        for index, config in trained:
            name = config.name if repeats == 1 else f"{config.name}-r{repeat + 1}"
            bar.set_postfix_str(f"{rungs[index].label}, pass {repeat + 1}/{repeats}")
            runs[index].append(_metrics(_run(config.replace(name=name), data, run_dir), LADDER_METRICS))
            bar.update()
    bar.close()
    rows, passes = [], []
    for rung, config, measured, same in zip(rungs, configs, runs, unchanged):
        changes = ", ".join(f"{k}={v}" for k, v in rung.changes.items()) or "-"
        if not measured:
            note = SAME_AS_BELOW if same else f"not applicable: {rung.not_here}"
            print(f"{rung.label}: {SAME_AS_BELOW}, not trained again." if same else
                  f"{rung.label}: not applicable here: {rung.not_here}.")
            rows.append({"rung": rung.label, "switch": changes, **{key: None for key in LADDER_METRICS},
                         "note": note, "compiled": False})
            passes.append(None)
            continue
        passes.append([m["samples_per_s"] for m in measured])  # in pass order: pass p of every rung ran side by side
        median = median_run(measured, lambda m: m["samples_per_s"])
        # compiled: whether the rung ran through torch.compile, its own switch or one inherited from below
        rows.append({"rung": rung.label, "switch": changes, **median, "note": "", "compiled": config.compile})
    table = pd.DataFrame(rows)
    speed = table["samples_per_s"].astype(float)
    table.insert(3, "vs_previous", speed / speed.ffill().shift(1))  # against the last rung that ran
    table.insert(4, "vs_baseline", speed / speed.iloc[0])
    table = _credit_measurable_changes(table, passes)
    # MFU against one stated peak, the device's dense BF16 one, so that switching precision never makes a
    # rung look worse; the peak of the rung's own precision (what the training record reports) beside it.
    stated = peak_tflops(table["device_name"].dropna().iloc[0], "bf16") if table["device_name"].notna().any() else None
    table.insert(table.columns.get_loc("mfu"), "mfu_bf16_peak",
                 table["tflops_per_device"].astype(float) / stated if stated else float("nan"))
    # accuracy kept beside speed: a switch that is faster but learns worse (a large batch) must show it
    table["test_acc_pct"] = 100 * table["final_test_acc"].astype(float)
    table = table.rename(columns={"mfu": "mfu_own_precision_peak"}).drop(columns=["device_name", "final_test_acc"])
    table.attrs["stated_peak"] = (f"MFU against the dense BF16 peak, {stated:g} TFLOP/s" if stated else
                                  "no published peak for this device: MFU left empty")
    return table


def compile_wait_s(ladder: pd.DataFrame) -> float | None:
    """Seconds the slowest compiling rung of ``climb_ladder``'s table spent before its first timed step.

    Compilation, autotuning and CUDA-graph capture happen in a run's untimed warm-up steps, so this is how
    long a live demo waits on the compiler. None where no rung compiled here (not applicable, or switched off).
    """
    compiled = ladder[ladder["compiled"].astype(bool) & ladder["warmup_s"].notna()]
    return float(compiled["warmup_s"].max()) if len(compiled) else None
