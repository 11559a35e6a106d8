"""Making the numbers behind mixed precision visible.

Mixed precision is fast because half-width numbers move and multiply faster, and
it is safe only as long as the numbers a network produces fit the format. This
module lets a learner look at both sides with real tensors:

* ``format_table``: range and precision of fp32, fp16, bf16 (and fp8), read from ``torch.finfo``;
* ``capture_gradients`` / ``underflow_table`` / ``plot_gradient_magnitudes``: real gradient
  magnitudes against fp16's smallest numbers, and what loss scaling rescues;
* ``grad_scaler_trace``: the GradScaler's scale, step by step (growth, and back-off on overflow);
* ``autocast_dtypes``: which layer autocast ran in which dtype, read from a forward pass with hooks;
* ``find_first_nonfinite``: the first layer whose output or gradient is NaN/Inf;
* ``precision_configs`` / ``mode_table``: the four modes as ``TrainConfig`` variants, and their comparison;
* ``fp8_support`` / ``fp8_matmul_benchmark``: the next step, an FP8 matrix multiply (Ada/Hopper GPUs only).

The demonstrations that need the GradScaler's inner state run a few steps by hand
with ``precision.autocast``; real training always goes through ``trainer.train``.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import torch
import torch.nn.functional as F
from torch import nn

from ..spine.data import CifarData, make_loader
from ..system.errors import WorkshopError
from ..system.gpu_records import precision_sentence
from ..system.hardware import PRECISIONS, as_device, check_precision
from ..spine.timing import time_repeats
from ..spine.precision import autocast, emulated_on_cpu

DTYPE_NAMES = {torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16",
               torch.float8_e4m3fn: "fp8 e4m3", torch.float8_e5m2: "fp8 e5m2"}


# ---------------------------------------------------------------- what each format can hold


def smallest_subnormal(dtype: torch.dtype) -> float:
    """The smallest positive number of ``dtype``: its smallest normal times its epsilon."""
    info = torch.finfo(dtype)
    return info.smallest_normal * info.eps


def format_table(dtypes=(torch.float32, torch.float16, torch.bfloat16)) -> pd.DataFrame:
    """Bits, range and precision of each dtype, all derived from ``torch.finfo``."""
    rows = []
    for dtype in dtypes:
        info = torch.finfo(dtype)
        mantissa = round(-math.log2(info.eps))  # stored fraction bits: eps is 2**-mantissa
        rows.append({"format": DTYPE_NAMES.get(dtype, str(dtype)), "bits": info.bits,
                     "exponent bits": info.bits - 1 - mantissa, "mantissa bits": mantissa,
                     "largest": info.max, "smallest normal": info.smallest_normal,
                     "smallest subnormal": smallest_subnormal(dtype), "eps (gap above 1)": info.eps})
    return pd.DataFrame(rows).set_index("format")


# ---------------------------------------------------------------- gradients against fp16's range


def _leaf_modules(model: nn.Module):
    return [(name, module) for name, module in model.named_modules() if name and not list(module.children())]


def _loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits, labels)


def capture_gradients(model: nn.Module, images: torch.Tensor, labels: torch.Tensor) -> dict[str, torch.Tensor]:
    """|gradient| of every parameter and of every layer's output, from one fp32 forward/backward.

    The activation gradients matter most: under fp16 autocast they are the tensors that are
    stored in fp16 during backward, so they are where small values are lost.
    """
    activation_grads, handles = [], []

    def keep_grad(module, inputs, output):
        if isinstance(output, torch.Tensor) and output.requires_grad:
            output.register_hook(lambda grad: activation_grads.append(grad.detach().abs().flatten().float()))

    for _, module in _leaf_modules(model):
        if not getattr(module, "inplace", False):  # an in-place layer rewrites its input's tensor
            handles.append(module.register_forward_hook(keep_grad))
    model.zero_grad(set_to_none=True)
    try:
        _loss(model(images), labels).backward()
    finally:
        for handle in handles:
            handle.remove()
    parameter_grads = torch.cat([p.grad.detach().abs().flatten().float() for p in model.parameters()
                                 if p.grad is not None])
    model.zero_grad(set_to_none=True)
    return {"parameters": parameter_grads, "activations": torch.cat(activation_grads)}


def underflow_table(gradients: dict[str, torch.Tensor], scales=(1.0, 2.0**8, 2.0**16),
                    dtype: torch.dtype = torch.float16) -> pd.DataFrame:
    """What casting the (scaled) gradients to ``dtype`` does: share flushed to zero, subnormal, overflowed."""
    tiny = torch.finfo(dtype).smallest_normal
    rows = []
    for kind, grads in gradients.items():
        nonzero = grads[grads > 0].double()
        for scale in scales:
            cast = (nonzero * scale).to(dtype)
            rows.append({"gradients": kind, "loss scale": f"2^{round(math.log2(scale))}",
                         "values": nonzero.numel(),
                         "flushed to zero %": 100 * (cast == 0).double().mean().item(),
                         "subnormal (imprecise) %": 100 * ((cast != 0) & (cast.abs() < tiny)).double().mean().item(),
                         "overflowed to inf %": 100 * cast.isinf().double().mean().item()})
    return pd.DataFrame(rows)


def plot_gradient_magnitudes(gradients: dict[str, torch.Tensor], dtype: torch.dtype = torch.float16,
                             title: str = "Gradient magnitudes against fp16's range"):
    """Log-scale histograms of |gradient| with the format's smallest subnormal, smallest normal and largest value."""
    from ..system.plotstyle import style

    values = {k: v[v > 0].double().log10().cpu().numpy() for k, v in gradients.items()}
    low = min(min(v.min() for v in values.values()), math.log10(smallest_subnormal(dtype))) - 1
    high = max(max(v.max() for v in values.values()), math.log10(torch.finfo(dtype).max)) + 0.5
    bins = np.linspace(low, high, 90)
    name = DTYPE_NAMES.get(dtype, str(dtype))
    normal = math.log10(torch.finfo(dtype).smallest_normal)
    with style():
        fig, ax = plt.subplots(figsize=(8, 4))
        for kind, logs in values.items():
            ax.hist(logs, bins=bins, alpha=0.55, label=f"{kind} ({len(logs):,} values)", density=True)
        # Rounding to nearest: only values below half the smallest subnormal become 0; up to it they round to it.
        ax.axvspan(low, math.log10(smallest_subnormal(dtype) / 2), color="tab:red", alpha=0.12,
                   label=f"becomes 0 in {name} (below half its smallest subnormal)")
        for value, label, style_ in ((smallest_subnormal(dtype), "smallest subnormal", ":"),
                                     (torch.finfo(dtype).smallest_normal, "smallest normal", "--"),
                                     (torch.finfo(dtype).max, "largest", "-")):
            ax.axvline(math.log10(value), color="k", ls=style_, lw=1, label=f"{name} {label} {value:.2g}")
        below = ", ".join(f"{kind} {100 * (logs < normal).mean():.1f}%" for kind, logs in values.items())
        ax.set(xlabel="|gradient| (log10 scale)", ylabel="density (share of values per unit of log10)",
               title=f"{title}\nbelow {name}'s normal range (imprecise or zero): {below}")
        ax.legend(fontsize=7, loc="upper left")
        fig.tight_layout()
    return fig


# ---------------------------------------------------------------- the GradScaler at work


def training_batches(data: CifarData, batch_size: int, device: torch.device, steps: int, seed: int = 0):
    """``steps`` augmented training batches on ``device``, cycling over epochs if needed."""
    loader = make_loader("device", data.train_images, data.train_labels, batch_size, device, train=True, seed=seed)
    if len(loader) == 0:
        raise WorkshopError(f"batch_size {batch_size} is larger than the {len(data.train_labels)} training images.",
                            "use a smaller batch size.")
    batches, epoch = [], 0
    while len(batches) < steps:
        batches += list(loader.epoch(epoch))[: steps - len(batches)]
        epoch += 1
    return batches


def grad_scaler_trace(model: nn.Module, batches, device: torch.device, init_scale: float = 2.0**16,
                      growth_interval: int = 2, lr: float = 1e-3) -> pd.DataFrame:
    """Train ``model`` in fp16 on ``batches`` and record the GradScaler's scale at every step.

    To show both of its moves in a few steps, pass an ``init_scale`` large enough for the
    first scaled gradients to overflow (the step is skipped and the scale halved); the scale
    grows again after ``growth_interval`` clean steps (PyTorch's default is 2000). The small
    learning rate keeps the gradients near the size the start was derived from: with a larger
    one a fresh model's gradients grow step after step, every few steps overflow again and the
    scale only falls, so the trace would never show a growth.
    """
    check_precision("fp16", device)
    scaler = torch.amp.GradScaler(device.type, init_scale=init_scale, growth_interval=growth_interval)
    optimizer = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    model.train()
    rows = []
    for step, (images, labels) in enumerate(batches, start=1):
        with autocast("fp16", device):
            loss = _loss(model(images), labels)
        optimizer.zero_grad(set_to_none=True)
        scaler.scale(loss).backward()
        scale = scaler.get_scale()
        scaler.step(optimizer)  # skipped when any gradient is inf/NaN
        scaler.update()
        new_scale = scaler.get_scale()
        event = "overflow: step skipped, scale halved" if new_scale < scale else (
            "grew: scale doubled" if new_scale > scale else "")
        rows.append({"step": step, "scale": scale, "loss": loss.item(), "next scale": new_scale, "event": event})
    return pd.DataFrame(rows)


def plot_scale_trace(trace: pd.DataFrame):
    """The GradScaler's loss scale per step (log2), with the steps it skipped on an overflow marked."""
    from ..system.plotstyle import style

    skipped = trace[trace["next scale"] < trace["scale"]]
    with style():
        fig, ax = plt.subplots(figsize=(7, 3.6))
        ax.step(trace["step"], np.log2(trace["scale"]), where="post", label="scale used at the step")
        ax.plot(skipped["step"], np.log2(skipped["scale"]), "x", color="#D55E00", ms=9, mew=2,
                label="overflow: step skipped, scale halved")
        grew = int((trace["next scale"] > trace["scale"]).sum()) if len(trace) else 0
        finding = (f"{len(skipped)} of {len(trace)} steps skipped, {grew} growth(s); scale from "
                   f"2^{np.log2(trace['scale'].iloc[0]):.0f} to 2^{np.log2(trace['next scale'].iloc[-1]):.0f}"
                   ) if len(trace) else "no step recorded"
        moves = " and ".join(name for name, seen in (("back-off", len(skipped)), ("growth", grew)) if seen)
        ax.set(xlabel="training step", ylabel="loss scale (log2)",
               title=f"GradScaler: {moves or 'no change'}\n{finding}")
        ax.xaxis.get_major_locator().set_params(integer=True)  # steps and powers of two are whole numbers
        ax.yaxis.get_major_locator().set_params(integer=True)
        ax.legend()
        fig.tight_layout()
    return fig


# ---------------------------------------------------------------- which dtype did autocast use?


def _dtype_of(value) -> str:
    if isinstance(value, (tuple, list)):
        value = next((v for v in value if isinstance(v, torch.Tensor)), None)
    return DTYPE_NAMES.get(value.dtype, str(value.dtype)) if isinstance(value, torch.Tensor) else "-"


def autocast_dtypes(model: nn.Module, images: torch.Tensor, labels: torch.Tensor, precision: str,
                    device: torch.device) -> pd.DataFrame:
    """Input, output and weight dtype of every layer (and the loss) in one real forward pass under ``precision``."""
    check_precision(precision, device)
    rows, handles = [], []

    def record(name):
        def hook(module, inputs, output):
            weight = getattr(module, "weight", None)
            rows.append({"layer": name, "type": type(module).__name__, "input": _dtype_of(inputs),
                         "output": _dtype_of(output), "weights": _dtype_of(weight)})
        return hook

    loss_fn = nn.CrossEntropyLoss()  # a module, so the loss is hooked like a layer
    for name, module in [*_leaf_modules(model), ("loss", loss_fn)]:
        handles.append(module.register_forward_hook(record(name)))
    try:
        with torch.no_grad(), autocast(precision, device):
            loss_fn(model(images), labels)
    finally:
        for handle in handles:
            handle.remove()
    return pd.DataFrame(rows)


def dtype_summary(table: pd.DataFrame) -> pd.DataFrame:
    """The per-layer table folded by layer type: which output dtypes each type produced."""
    return (table.groupby("type", sort=False)
            .agg(layers=("layer", "size"), input=("input", lambda s: ", ".join(sorted(set(s)))),
                 output=("output", lambda s: ", ".join(sorted(set(s)))),
                 weights=("weights", lambda s: ", ".join(sorted(set(s))))))


# ---------------------------------------------------------------- where did the first NaN/Inf appear?


@dataclass
class NonFinite:
    """The first non-finite tensor of a pass: where it was and what it held."""

    phase: str  # "parameters" | "forward" | "loss" | "backward"
    layer: str
    kind: str  # module type
    dtype: str
    nan: int
    inf: int
    largest_finite: float

    def __str__(self) -> str:
        where = {"parameters": "weights of", "forward": "output of", "loss": "value of",
                 "backward": "gradient arriving at the output of"}[self.phase]
        largest = ("no finite value left" if math.isnan(self.largest_finite)
                   else f"largest finite magnitude {self.largest_finite:.3g}")
        return (f"{self.phase}: {where} {self.layer} ({self.kind}, {self.dtype}) has {self.inf} inf and "
                f"{self.nan} NaN; {largest}")


def _non_finite(tensor: torch.Tensor, phase: str, layer: str, kind: str) -> NonFinite | None:
    tensor = tensor.detach()
    bad = ~torch.isfinite(tensor)
    if not bad.any():
        return None
    finite = tensor[~bad].abs()
    return NonFinite(phase, layer, kind, _dtype_of(tensor), int(tensor.isnan().sum()), int(tensor.isinf().sum()),
                     float(finite.max()) if finite.numel() else float("nan"))


class _Found(Exception):
    """Raised from a hook to stop the pass at the first non-finite tensor (nothing after it matters)."""

    def __init__(self, found: NonFinite):
        self.found = found


def find_first_nonfinite(model: nn.Module, images: torch.Tensor, labels: torch.Tensor, precision: str = "fp32",
                         device: torch.device | None = None, loss_scale: float = 1.0) -> NonFinite | None:
    """Run one forward (and, if that is clean, backward) pass; return the first NaN/Inf and its layer.

    ``loss_scale`` multiplies the loss before backward, as a GradScaler does. Returns None
    when every tensor stayed finite. Gradients are cleared afterwards and parameters are
    untouched (in training mode, BatchNorm's running statistics do see the batch).
    """
    device = device or images.device
    check_precision(precision, device)
    for name, parameter in model.named_parameters():
        found = _non_finite(parameter, "parameters", name.rsplit(".", 1)[0], "parameter")
        if found:
            return found

    def check(tensor, phase, name, module):
        found = _non_finite(tensor, phase, name, type(module).__name__)
        if found:
            raise _Found(found)
        return None  # a tensor hook returning None leaves the gradient as it is

    def watch(name):
        def hook(module, inputs, output):
            if isinstance(output, torch.Tensor):
                check(output, "forward", name, module)
                if output.requires_grad and not getattr(module, "inplace", False):
                    output.register_hook(lambda grad: check(grad, "backward", name, module))
        return hook

    handles = [module.register_forward_hook(watch(name)) for name, module in _leaf_modules(model)]
    model.zero_grad(set_to_none=True)
    try:
        with autocast(precision, device):
            loss = _loss(model(images), labels)
        check(loss, "loss", "cross_entropy", nn.CrossEntropyLoss())
        (loss * loss_scale).backward()
        # The hooks see the gradients of the layers' outputs; a weight's own gradient, a sum over the whole batch,
        # can overflow where none of those did. Read last to first: the order backward computes them.
        for name, parameter in reversed(list(model.named_parameters())):
            if parameter.grad is not None:
                found = _non_finite(parameter.grad, "backward", name, "parameter gradient")
                if found:
                    return found
        return None
    except _Found as stop:
        return stop.found
    finally:
        for handle in handles:
            handle.remove()
        model.zero_grad(set_to_none=True)


def overshoot(model: nn.Module, images: torch.Tensor, labels: torch.Tensor, lr: float) -> nn.Module:
    """A copy of ``model`` after one plain SGD step at learning rate ``lr``: what far too large a step does."""
    broken = copy.deepcopy(model)
    broken.zero_grad(set_to_none=True)
    _loss(broken(images), labels).backward()
    with torch.no_grad():
        for parameter in broken.parameters():
            if parameter.grad is not None:
                parameter -= lr * parameter.grad
    broken.zero_grad(set_to_none=True)
    return broken


def overshoot_until_nonfinite(model: nn.Module, images: torch.Tensor, labels: torch.Tensor, precision: str = "fp16",
                              lrs=(1e2, 1e3, 1e4, 1e5, 1e6, 1e7)) -> tuple[nn.Module, float, NonFinite | None]:
    """The first learning rate in ``lrs`` whose one overshooting step overflows under ``precision`` but not in fp32.

    How large a step breaks a model depends on its gradients: a well-trained model on a GPU
    has small ones and survives a learning rate that breaks a fresh one. Searching keeps the
    demonstration true on every machine. Returns the broken copy, its learning rate and the
    first non-finite tensor (None when no rate in ``lrs`` overflowed: then say so).
    """
    broken, lr, found = model, lrs[-1], None
    for lr in lrs:
        broken = overshoot(model, images, labels, lr)
        if find_first_nonfinite(broken, images, labels, "fp32") is not None:
            break  # too far: even fp32 overflows, so larger rates show nothing fp16-specific
        found = find_first_nonfinite(broken, images, labels, precision)
        if found is not None:
            break
    return broken, lr, found


def overflowing_scale(gradients: dict[str, torch.Tensor], dtype: torch.dtype = torch.float16,
                      margin: float = 4.0) -> float:
    """A power-of-two loss scale that pushes the largest of these gradients past ``dtype``'s largest value.

    Derived from measured gradients rather than fixed, so an "overflow" demonstration overflows
    whatever the model's state; ``margin`` keeps it overflowing while the gradients shrink a little.
    """
    largest = max(float(g.max()) for g in gradients.values() if g.numel())
    if largest <= 0:
        raise WorkshopError("All gradients are zero: no loss scale can overflow them.", "use a batch with a loss > 0.")
    exponent = math.ceil(math.log2(torch.finfo(dtype).max / largest) + math.log2(margin))
    return float(2.0 ** min(exponent, 120))  # 2**120 x a gradient stays finite in fp32


# ---------------------------------------------------------------- the four modes side by side


def precision_configs(base, modes=PRECISIONS, cpu_emulated_steps: int = 2) -> list:
    """One ``TrainConfig`` per mode, identical except for the precision (and the name).

    On a CPU without native 16-bit arithmetic (fp16 on most CPUs, bf16 on AVX2-only ones) autocast is
    emulated and takes seconds per step, so such a mode runs only ``cpu_emulated_steps`` steps there
    (0: it is skipped), enough to see it work, not to compare accuracy; one line says which and why.
    """
    on_cpu = base.device == "cpu" or (base.device is None and not torch.cuda.is_available())
    configs = []
    for mode in modes:
        config = base.replace(name=f"{base.model}-{mode}{'-cl' if base.channels_last else ''}", precision=mode)
        reason = emulated_on_cpu(mode, torch.device("cpu")) if on_cpu else None
        if reason:
            steps = min(base.max_steps or cpu_emulated_steps, cpu_emulated_steps)
            print(f"{config.name}: {reason.replace('it is skipped here', 'it is skipped' if not steps else f'it runs only {steps} steps here')}.")
            if not steps:
                continue
            # A probe's accuracy is never compared: 64 test samples keep its emulated evaluation (seconds for 512
            # images) from costing more than its steps.
            config = config.replace(max_steps=steps, warmup_steps=min(base.warmup_steps, steps - 1),
                                    test_size=min(base.test_size or PROBE_TEST_SIZE, PROBE_TEST_SIZE))
        configs.append(config)
    return configs


# Steps a mode the CPU only emulates runs, per model: enough SimpleCNN and tiny-GPT steps (seconds each) to see
# it work; no ResNet-18 step, which takes minutes emulated.
EMULATED_STEPS = {"simplecnn": 2, "resnet18": 0, "gpt": 2}
PROBE_TEST_SIZE = 64
def gpu_reference_speedup(model: str = "resnet18", mode: str = "bf16") -> str:
    """What a GPU measured for ``mode`` against fp32 on ``model``, with the GPU and date; or that nothing was."""
    return precision_sentence(model, mode)


def precision_plan(base, modes_by_model: dict, emulated_steps: dict | None = None) -> list:
    """Notebook 03's runs: ``precision_configs`` for each model and its modes, in order.

    A mode this CPU only emulates runs ``emulated_steps[model]`` steps (0: skipped); the decision comes from
    what the CPU reports (``emulated_on_cpu``), so a busy machine runs the same plan as an idle one. When
    anything was cut, one more line says what a GPU shows instead.
    """
    steps = {**EMULATED_STEPS, **(emulated_steps or {})}
    configs = []
    for model, modes in modes_by_model.items():
        configs += precision_configs(base.replace(model=model), modes, cpu_emulated_steps=steps.get(model, 0))
    planned = {(c.model, c.precision): c.max_steps for c in configs}
    cut = sorted({(model, mode) for model, modes in modes_by_model.items() for mode in modes
                  if planned.get((model, mode)) != base.max_steps}, key=lambda pair: (pair[1] != "bf16", pair))
    if cut:
        model, mode = cut[0]  # bf16 first: the mode a GPU run of the kit measures on every model
        print(f"Cut short or skipped on this CPU: {', '.join(sorted({m for _, m in cut}))}; "
              + gpu_reference_speedup(model, mode) + ".")
    return configs


def mode_table(records: list[dict]) -> pd.DataFrame:
    """The comparison of training records that differ in precision: speed, memory, loss, accuracy, speed-ups.

    Speed-ups are relative to the strict-fp32 and the tf32 record of the same model
    (and memory layout); accuracy differences are in percentage points against fp32. ``step memory MiB`` is
    the tensor memory of one training step (``step_memory``, added to a record's metrics by the notebook; empty
    without it): the same measure in every mode, where a run's own peak would not be. A run cut
    short (a mode the CPU only emulates runs two steps) is a speed probe: its accuracy is left
    blank rather than compared with runs that trained longer.
    """
    rows = []
    for record in records:
        c, m = record["config"], record["metrics"]
        rows.append({"model": c["model"], "precision": c["precision"], "channels_last": c["channels_last"],
                     "steps": m["steps"], "samples/s": m["samples_per_s"], "step ms (median)": m["step_ms_median"],
                     "step memory MiB": m.get("step_memory_mib"), "final train loss": m["final_train_loss"],
                     "test acc %": None if m["final_test_acc"] is None else 100 * m["final_test_acc"]})
        if "tokens_per_s" in m:  # the GPT: its loss is nats per token, its accuracy next-token accuracy
            rows[-1].update({"tokens/s": m["tokens_per_s"], "test loss (nats/token)": m["final_test_loss"],
                             "test bits/byte": m["final_test_bits_per_byte"]})
    table = pd.DataFrame(rows)
    longest = table.groupby(["model", "channels_last"])["steps"].transform("max")
    short = table["steps"] < longest
    for column in ("test acc %", "test loss (nats/token)", "test bits/byte"):
        if column in table:
            table[column] = table[column].where(~short, None)
    table["note"] = ["" if not cut else f"speed probe: {steps} of {most} steps, accuracy not compared"
                     for cut, steps, most in zip(short, table["steps"], longest)]
    for reference in ("fp32", "tf32"):
        base = table[table["precision"] == reference].set_index(["model", "channels_last"])
        keys = list(zip(table["model"], table["channels_last"]))
        speed = [base["samples/s"].get(k) for k in keys]
        table[f"speed-up vs {reference}"] = [s / b if s and b else None for s, b in zip(table["samples/s"], speed)]
    base_acc = table[table["precision"] == "fp32"].set_index(["model", "channels_last"])["test acc %"]
    table["acc vs fp32 (points)"] = [a - base_acc.get(k) if a is not None and base_acc.get(k) is not None else None
                                     for a, k in zip(table["test acc %"], zip(table["model"], table["channels_last"]))]
    return table


def accuracy_parity(table: pd.DataFrame, repeats: list[dict], recorded: dict | None = None) -> pd.DataFrame:
    """Each mode's accuracy gap to fp32 beside fp32's own run-to-run spread (``repeats``: fp32 records of other seeds;
    ``recorded``: {(model, channels_last): points}, a spread recorded over more seeds, ``recorded_spread_points``).

    A short run's accuracy moves by several points with the seed alone, so a gap is only a finding
    when it is larger than that spread: ``beyond spread (points)`` is what is left of the gap after it.
    """
    parity = table[["model", "precision", "channels_last", "steps", "test acc %", "acc vs fp32 (points)"]].copy()
    fp32 = parity[parity["precision"] == "fp32"].set_index(["model", "channels_last"])["test acc %"]
    spread = dict(recorded or {})
    for record in repeats:
        c, m = record["config"], record["metrics"]
        key = (c["model"], c["channels_last"])
        if m["final_test_acc"] is not None and fp32.get(key) is not None:
            spread[key] = max(spread.get(key, 0.0), abs(100 * m["final_test_acc"] - fp32[key]))
    keys = list(zip(parity["model"], parity["channels_last"]))
    parity["fp32 seed spread (points)"] = [spread.get(k) for k in keys]
    parity["beyond spread (points)"] = [
        None if gap is None or pd.isna(gap) or spread.get(k) is None or p == "fp32" else max(0.0, abs(gap) - spread[k])
        for gap, k, p in zip(parity["acc vs fp32 (points)"], keys, parity["precision"])]
    return parity


def plot_mode_speeds(table: pd.DataFrame, title: str = "Throughput by precision mode"):
    """Bars of samples/s per model and mode, each precision in its own colour, labelled with its speed-up over fp32."""
    from ..system.plotstyle import PALETTE, precision_color, style

    models = list(dict.fromkeys(table["model"]))
    findings = []
    with style():
        fig, axes = plt.subplots(1, len(models), figsize=(5 * len(models), 4), squeeze=False)
        for ax, model in zip(axes[0], models):
            part = table[table["model"] == model]
            colors = [precision_color(p) or PALETTE[-1] for p in part["precision"]]
            bars = ax.bar(part["precision"], part["samples/s"].fillna(0), color=colors)
            for bar, speedup in zip(bars, part["speed-up vs fp32"]):
                if speedup:
                    ax.annotate(f"{speedup:.2f}x", (bar.get_x() + bar.get_width() / 2, bar.get_height()),
                                ha="center", va="bottom", fontsize=8)
            ax.set(title=model, ylabel="throughput (samples/s)", xlabel="precision mode (labels: speed-up over fp32)")
            ax.grid(axis="x", visible=False)
            ax.margins(y=0.2)
            if part["samples/s"].notna().any():
                best = part.loc[part["samples/s"].idxmax()]
                findings.append(f"{model} fastest in {best['precision']}")
        fig.suptitle(f"{title}\n{'; '.join(findings)}" if findings else title)
        fig.tight_layout()
    return fig


# ---------------------------------------------------------------- the next step: FP8


def fp8_support(device: torch.device) -> str | None:
    """None when ``device`` can run FP8 matrix multiplies; otherwise the reason it cannot."""
    if (device := as_device(device, "FP8")).type != "cuda" or not torch.cuda.is_available():
        return "FP8 matrix multiplies need an NVIDIA GPU with FP8 tensor cores, " + (
            f"and {device} is none." if device.type != "cuda" else "and there is no GPU here (PyTorch sees none).")
    major, minor = torch.cuda.get_device_capability(device)
    if (major, minor) < (8, 9):
        return (f"{torch.cuda.get_device_name(device)} (sm_{major}{minor}) has no FP8 tensor cores: "
                "they start with Ada (sm_89) and Hopper (sm_90).")
    if not hasattr(torch, "_scaled_mm"):
        return f"this PyTorch ({torch.__version__}) has no torch._scaled_mm."
    return None


def check_fp8(device: torch.device) -> None:
    reason = fp8_support(device)
    if reason:
        raise WorkshopError(reason, "skip the FP8 measurement, or run it on an H100/H200 (Hopper) or L40S (Ada) node.")


def fp8_matmul_benchmark(device: torch.device, size: int = 8192, repeats: int = 50) -> pd.DataFrame:
    """Time a size x size matrix multiply in bf16 and in fp8 (e4m3, per-tensor scales, bf16 output)."""
    check_fp8(device)
    a = torch.randn(size, size, device=device)
    b = torch.randn(size, size, device=device)
    a16, b16 = a.bfloat16(), b.bfloat16()
    fp8_max = torch.finfo(torch.float8_e4m3fn).max
    # Per-tensor scaling: map each matrix's largest magnitude onto fp8's largest value, undo it in the output.
    scale_a, scale_b = a.abs().max() / fp8_max, b.abs().max() / fp8_max
    a8 = (a / scale_a).to(torch.float8_e4m3fn)
    b8 = (b / scale_b).to(torch.float8_e4m3fn).t().contiguous().t()  # the fp8 kernel wants b column-major
    runs = {"bf16": lambda: a16 @ b16,
            "fp8 e4m3": lambda: torch._scaled_mm(a8, b8, scale_a=scale_a.float(), scale_b=scale_b.float(),
                                                 out_dtype=torch.bfloat16)}
    reference = a.double() @ b.double()
    rows = []
    for name, fn in runs.items():
        # One untimed call, then back-to-back calls timed with CUDA events: the mean is the device's time per multiply.
        ms = 1e3 * time_repeats(fn, repeats, warmup=1, device=device).mean
        error = ((fn().double() - reference).norm() / reference.norm()).item()
        rows.append({"format": name, "ms": ms, "TFLOP/s": 2 * size**3 / ms / 1e9, "relative error": error})
    table = pd.DataFrame(rows).set_index("format")
    table["speed-up vs bf16"] = table.loc["bf16", "ms"] / table["ms"]
    return table

