"""Readable summaries of a run, and the "what you should see" checks.

The checks compare a run with what a healthy run looks like and say, in plain
words, what to do when a number is off. They never fail a notebook: a slow
shared node is information, not an error.

``what_you_should_see`` ends a demo with one line: whether its headline number is in the range
expected for the hardware profile, and where to look if not. The cpu ranges are the kit's reference
runs on small x86 machines, widened so that a laptop or a busy CI runner lands inside. The gpu ranges
are first estimates from published peaks and the kit's performance goals (``benchmarks/``): wide on
purpose, to be narrowed by GPU reference runs (``results/reference/``).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from ..system.display import show_verdict
from ..system.errors import WorkshopError
from ..system.profiles import PROFILE_NAMES, resolve_profile

SIMPLECNN_PARAMETERS = 2_474_506
# benchmarks/accuracy_spread.py trains each compared run with several seeds and records the spread here.
SPREAD_RECORDS = Path(__file__).resolve().parents[2] / "results" / "reference" / "benchmarks"


def _fmt(value, spec: str) -> str:
    return "unknown" if value is None else format(value, spec)


def summary_table(record: dict) -> pd.DataFrame:
    """The headline figures of one training run, with units."""
    m, c = record["metrics"], record["config"]
    rows = [
        ("device", m["device_name"], ""),
        ("model / precision", f"{c['model']} / {c['precision']}", ""),
        ("loader", f"{c['loader']} (workers={c['num_workers']}, pin_memory={c['pin_memory']})", ""),
        ("processes x batch", f"{m['world_size']} x {c['batch_size']}", "samples per step"),
        ("steps (timed)", f"{m['steps']} ({m['timed_steps']})", "first warm-up steps not timed"),
        ("throughput", _fmt(m["samples_per_s"], ",.0f"), "samples/s"),
        ("step time median / p90", f"{_fmt(m['step_ms_median'], '.1f')} / {_fmt(m['step_ms_p90'], '.1f')}", "ms"),
        ("waiting for data", _fmt(m["data_wait_fraction"] and 100 * m["data_wait_fraction"], ".1f"), "% of step time"),
        ("peak memory", _fmt(m["peak_memory_mib"], ",.0f"), f"MiB, {m['memory_kind']}"),
        ("training FLOPs per sample", _fmt(m["flops_per_sample"] / 1e6, ",.1f"), "MFLOP (torch.utils.flop_counter)"),
        ("achieved", _fmt(m["tflops_per_device"], ".3f"), "TFLOP/s per device"),
        ("MFU", _fmt(m["mfu"] and 100 * m["mfu"], ".2f"), "% of the device's peak (unknown if not in the table)"),
        ("final test accuracy", _fmt(m["final_test_acc"] and 100 * m["final_test_acc"], ".1f"), f"% on {m['data_source']}"),
        ("wall time", _fmt(m["wall_s"], ".1f"), "s, including evaluation and start-up"),
    ]
    return pd.DataFrame(rows, columns=["metric", "value", "unit"]).set_index("metric")


BASELINE_METRICS = ("parameters", "final_test_acc", "step_ms_median", "data_wait_fraction", "mfu", "data_source")


def check_baseline(record: dict, expected_parameters: int = SIMPLECNN_PARAMETERS, *,
                   profile: str | None = None) -> pd.DataFrame:
    """Healthy-run checks for a training record: each row says ok or what to look at.

    With ``profile`` ("cpu" or "gpu") the accuracy is held to that profile's expected range; "auto" is the
    profile the notebooks resolve it to (``resolve_profile``).
    """
    m = record.get("metrics") if isinstance(record, dict) else None
    missing = [key for key in BASELINE_METRICS if not isinstance(m, dict) or key not in m]
    if missing or not isinstance(record.get("step_loss"), (list, tuple)):
        raise WorkshopError(f"check_baseline: {type(record).__name__} is no training record "
                            f"(it lacks {', '.join(missing) or 'step_loss'}).",
                            "pass what wu.train(...) returned: result.record, or the run's record.json read back.")
    if isinstance(profile, str) and profile == "auto":
        profile = resolve_profile(profile)
    if profile is not None and not (isinstance(profile, str) and profile in EXPECTED["baseline accuracy"].ranges):
        raise WorkshopError(f"check_baseline: profile={' '.join(repr(profile).split())[:60]} is no profile.",
                            f"use one of {', '.join(repr(p) for p in PROFILE_NAMES)}, as the notebook's parameter "
                            "cell does (or leave profile out).")
    checks = []

    def add(name: str, ok: bool, detail: str, fix: str = "") -> None:
        checks.append({"check": name, "result": "ok" if ok else "LOOK", "detail": detail if ok else f"{detail} {fix}"})

    add("parameter count", m["parameters"] == expected_parameters,
        f"{m['parameters']:,} trainable parameters (expected {expected_parameters:,}).",
        "The model definition differs from the workshop's.")
    losses = record["step_loss"]
    head, tail = losses[: max(1, len(losses) // 10)], losses[-max(1, len(losses) // 10):]
    learning = bool(losses) and sum(tail) / len(tail) < 0.8 * sum(head) / len(head)
    add("loss goes down", learning, f"mean loss {sum(head) / max(len(head), 1):.3f} at the start, "
        f"{sum(tail) / max(len(tail), 1):.3f} at the end.",
        "Lower the learning rate, or train longer.")
    acc = m["final_test_acc"] or 0.0
    if profile is None:
        add("accuracy above chance", acc >= 0.3, f"test accuracy {100 * acc:.1f}% (chance is 10%).",
            "Train for more epochs; with real CIFAR-10 expect 60-75% after a few epochs.")
    else:
        expected = EXPECTED["baseline accuracy"]
        low, high = expected.ranges[profile]
        add("accuracy in range", low <= 100 * acc <= high,
            f"test accuracy {100 * acc:.1f}% (expected {low:g}-{high:g}% on the {profile} profile; chance is 10%).",
            f"Look at {expected.look_at}.")
    if m["step_ms_median"] and m.get("step_ms_p90"):  # a record without step times (a replay) has no spread
        spread = m["step_ms_p90"] / m["step_ms_median"]
        add("steady step time", spread < 1.5, f"p90 step is {spread:.2f}x the median.",
            "Steps stall now and then: data loading, other jobs on the node, or thermal throttling.")
    wait = m["data_wait_fraction"]
    if wait is not None:
        add("data keeps up", wait < 0.2, f"{100 * wait:.0f}% of step time spent waiting for the next batch.",
            "The input pipeline is the bottleneck: more num_workers, pin_memory, or loader='device' (notebook 04).")
    if m["mfu"] is not None:
        add("GPU is busy", m["mfu"] > 0.05, f"MFU {100 * m['mfu']:.1f}% of peak.",
            "Expected for a model this small in fp32: notebooks 03 and 04 raise it.")
    if m["data_source"] == "synthetic":
        checks.append({"check": "real data", "result": "LOOK",
                       "detail": "Synthetic stand-in used: accuracies are not CIFAR-10 accuracies (see the banner)."})
    return pd.DataFrame(checks).set_index("check")


@dataclass(frozen=True)
class Expectation:
    what: str  # the quantity, as the one line names it
    unit: str  # "%", "x", "points", "nats" or "s"
    ranges: dict[str, tuple[float, float]]  # profile -> (lowest, highest) that is still normal
    look_at: str  # where to look when the value is outside
    # Profiles whose range no run of the kit has measured yet, which the line says: no GPU reference is recorded.
    estimated: tuple[str, ...] = ("gpu",)


EXPECTED: dict[str, Expectation] = {
    "baseline accuracy": Expectation(
        "baseline test accuracy", "%", {"cpu": (35, 75), "gpu": (40, 90)},
        "the loss curve: flat means too few steps or a learning rate too small, jumps mean one too large; "
        "above 82% on the synthetic set is impossible, so check the data line"),
    "ddp accuracy": Expectation(
        "test accuracy of the DDP runs (lowest)", "%", {"cpu": (20, 70), "gpu": (20, 90)},
        "the learning rate of the larger global batch (linear scaling) and its warm-up"),
    "weak-scaling efficiency": Expectation(
        "weak-scaling efficiency at the largest world size", "x", {"cpu": (0.4, 1.15), "gpu": (0.7, 1.05)},
        "the all-reduce sweep (transport and bandwidth) and, on a CPU, whether each process has cores of its own"),
    "amp accuracy gap": Expectation(
        "largest accuracy gap of a 16-bit run to FP32 beyond FP32's own seed-to-seed spread", "points",
        {"cpu": (0, 6), "gpu": (0, 1.5)},
        "the GradScaler's trace (fp16) and the run-to-run spread of FP32 itself: a gap inside it is noise"),
    # cpu: only a CPU with native bf16 (AVX-512 BF16 or AMX) runs ResNet-18 in bf16 at all; on the reference
    # Xeon (AMX) the main job read 1.39x, 1.74x and 1.78x across runs, idle and loaded.
    "bf16 speed-up": Expectation(
        "ResNet-18 BF16 over strict FP32", "x", {"cpu": (0.5, 2.5), "gpu": (1.5, 12)},
        "the batch sweep per mode: small batches hide the tensor cores; on a GPU also channels_last"),
    "ladder speed-up": Expectation(
        "top of the ladder over its baseline", "x", {"cpu": (0.7, 3), "gpu": (3, 60)},
        "the per-rung breakdown: the phase that grows is the one that bounds the rung"),
    "compile wait": Expectation(
        "wait for the compiler before the first timed step (slowest compiled rung)", "s",
        {"cpu": (0, 60), "gpu": (0, 60)},
        "the compiled rungs' warmup_s: point TORCHINDUCTOR_CACHE_DIR at a folder that survives the job (not a "
        "node's /tmp) and run the notebook once the day before, so the kernels come from that cache; or present "
        "with torch_compile=False"),
    "recompute memory": Expectation(
        "activation memory with checkpointing, as a share of without", "x", {"cpu": (0.1, 0.6), "gpu": (0.1, 0.6)},
        "which blocks are checkpointed: each one keeps only its input"),
    "recompute time": Expectation(
        "step time with checkpointing over without", "x", {"cpu": (0.9, 2.6), "gpu": (0.95, 2.0)},
        "how many forwards run twice; on a CPU, other processes taking its cores"),
    # The GPT's own. cpu: the tiny GPT in the cpu profile on the standard library's source. Its 40 steps in notebook
    # 01 end 3% below the training split's unigram entropy (0.966 on an AVX-512 machine); notebook 01 now divides by
    # the validation split's, 1.4% higher, the split the loss is measured on (about 0.95): it has learned how common
    # each byte is and only begun to read context.
    "gpt loss against unigram": Expectation(
        "GPT validation loss as a share of the text's unigram entropy", "x", {"cpu": (0.85, 0.99), "gpu": (0.2, 0.7)},
        "the loss curve and the learning rate: 1.0 is a model that learned which bytes are common, nothing of "
        "context"),
    "gpt 16-bit loss gap": Expectation(
        "largest test-loss gap of a 16-bit GPT run to FP32, beyond the seed spread", "nats",
        {"cpu": (0, 0.1), "gpu": (0, 0.05)},
        "the loss curves of both runs; in fp16, the GradScaler's trace and the attention logits (section 5)"),
    "gpt ladder speed-up": Expectation(
        "fastest rung of the GPT's ladder over its fp32 baseline", "x", {"cpu": (0.8, 2.5), "gpu": (3, 30)},
        "the per-rung breakdown, and which attention kernel each rung ran"),
    "gpt sharded bytes": Expectation(
        "bytes an FSDP2 rank holds for the GPT, times the ranks, over the unsharded model's", "x",
        {"cpu": (0.95, 1.2), "gpu": (0.95, 1.2)},
        "which modules fully_shard wrapped: a module left out stays whole on every rank"),
}


def _shown(value: float, unit: str) -> str:
    if unit == "%":
        return f"{value:.1f}%"
    if unit == "points":
        return f"{value:.1f} points"
    if unit == "s":
        return f"{value:.0f} s"
    if unit == "nats":
        return f"{value:.3f} nats"
    return f"{value:.2f}x"


def what_you_should_see(name: str, value: float | None, profile: str) -> bool:
    """One line: whether ``value`` is in the range expected for ``profile`` ("cpu" or "gpu"), and where to look if not."""
    if name not in EXPECTED:
        raise WorkshopError(f"No expectation named {name!r}.", f"use one of: {', '.join(EXPECTED)}.")
    expected = EXPECTED[name]
    if profile not in expected.ranges:
        raise WorkshopError(f"No {profile!r} range for {name!r}.", f"use one of: {', '.join(expected.ranges)}.")
    low, high = expected.ranges[profile]
    span = f"{_shown(low, expected.unit)} to {_shown(high, expected.unit)} on the {profile} profile"
    if profile in expected.estimated:
        span += ", an estimate: no run of the kit has measured it yet"
    if value is None or (isinstance(value, float) and math.isnan(value)):
        show_verdict(f"? What you should see: {expected.what} was not measured in this run (expected {span}).")
        return False
    if low <= value <= high:
        show_verdict(f"✓ What you should see: {expected.what} {_shown(value, expected.unit)}, in range ({span}).")
        return True
    show_verdict(f"⚠ What you should see: {expected.what} {_shown(value, expected.unit)} is outside {span}: "
                 f"look at {expected.look_at}.")
    return False


def _recorded_spreads(run_name: str, profile: str) -> list[tuple[dict, int, str]]:
    """(row, seeds, cpu kind) of every spread benchmarks/accuracy_spread.py recorded for ``run_name`` in ``profile``."""
    found = []
    for path in sorted(SPREAD_RECORDS.glob("accuracy_spread*.json")):
        record = json.loads(path.read_text())
        if record.get("profile") != profile:
            continue
        seeds, cpu = record["settings"]["seeds"], record["environment"].get("cpu_capability") or "GPU"
        found += [(row, seeds, cpu) for row in record["tables"]["spread"] if row["case"].split(" ", 1)[-1] == run_name]
    return found


def recorded_spread_points(run_name: str, profile: str) -> float | None:
    """The widest seed-to-seed accuracy range (max - min, points) recorded for ``run_name`` on any kind of CPU.

    The widest, so that every machine reads the same spread; None when none was recorded for ``profile``
    (the gpu profile trains a second seed instead). benchmarks/accuracy_spread.py records it for the
    notebooks' current sizes, and tests/test_expectations.py fails when those sizes change without it.
    """
    found = _recorded_spreads(run_name, profile)
    return max(row["max_pct"] - row["min_pct"] for row, _, _ in found) if found else None


def seed_spread(run_name: str, profile: str) -> str:
    """The seed-to-seed accuracy range recorded for the notebooks' run ``run_name`` (e.g. "ladder-6-2x-batch").

    An accuracy gap between two short runs is a finding only when it is larger than this range; the line says
    where the range was measured, or that none was recorded for ``profile``.
    """
    found = [f"{row['min_pct']:.0f}% to {row['max_pct']:.0f}% over {seeds} seeds ({cpu})"
             for row, seeds, cpu in _recorded_spreads(run_name, profile)]
    if not found:
        return (f"no seed spread recorded for {run_name} in the {profile} profile: run benchmarks/accuracy_spread.py "
                "before reading a gap as an effect")
    return f"seed spread recorded for {run_name} (benchmarks/accuracy_spread.py): " + "; ".join(found)


def layer_intensities(model, example, bytes_per_number: int = 4) -> pd.DataFrame:
    """FLOPs per byte moved by the matrix multiply of each convolution and linear layer, for a forward pass on ``example``.

    A linear layer on ``m`` rows is an (m x in) @ (in x out) product; a convolution is the product it amounts to
    (im2col): (batch x output pixels) x (input channels x kernel area) by (that x output channels). Each product
    does 2mkn FLOPs and, counted as in notebook 01, moves its three matrices once: ``bytes_per_number`` x (mk + kn
    + mn) bytes. One row per layer call: ``layer``, ``m``, ``k``, ``n``, ``flops_share`` (of all these layers'
    FLOPs) and ``flop_per_byte``; ``table.attrs["weighted"]`` is the FLOP-weighted mean of ``flop_per_byte``.
    Build the model and ``example`` under ``torch.device("meta")`` to read only shapes: nothing is computed.
    """
    import torch
    from torch import nn

    rows = []

    def hook(module, inputs, output):
        if isinstance(module, nn.Conv2d):
            m = output.shape[0] * output.shape[-1] * output.shape[-2]
            k = module.in_channels // module.groups * module.kernel_size[0] * module.kernel_size[1]
            n = module.out_channels
        else:
            m, k, n = inputs[0].numel() // inputs[0].shape[-1], module.in_features, module.out_features
        rows.append({"layer": names[module], "m": m, "k": k, "n": n, "flops": 2 * m * k * n,
                     "flop_per_byte": 2 * m * k * n / (bytes_per_number * (m * k + k * n + m * n))})

    names = {module: name for name, module in model.named_modules() if isinstance(module, (nn.Conv2d, nn.Linear))}
    handles = [module.register_forward_hook(hook) for module in names]
    try:
        with torch.no_grad():
            model(example)
    finally:
        for handle in handles:
            handle.remove()
    table = pd.DataFrame(rows)
    table.insert(4, "flops_share", table.pop("flops") / sum(r["flops"] for r in rows))
    table.attrs["weighted"] = float((table.flops_share * table.flop_per_byte).sum())
    return table
