"""Notebook 03's exercises: fp16's range (gradients lost to 0, the largest safe loss scale) and a
training step with autocast and GradScaler, run against the textbook step on a small model.
"""

from __future__ import annotations

import math
from collections import Counter

import torch
import torch.nn.functional as F
from torch import nn

from ..spine.precision import autocast
from ..system.display import format_number
from ..system.errors import WorkshopError
from ..system.hardware import as_device
from .exercise_cells import NotYet, passed, require
from .exercise_judging import attendee_error, attendee_function, called, checked, number, verdict


def _gradient_values(gradients, exercise: str) -> torch.Tensor:
    if not torch.is_tensor(gradients) or not gradients.numel():
        raise WorkshopError(f"{exercise}: the gradients to judge against are no tensor with values.",
                            "pass the tensor the exercise names.")
    return gradients.detach().flatten().float().cpu()


@checked
def check_lost_fraction(lost_fraction, gradients: torch.Tensor, scale: float = 1.0,
                        exercise: str = "Exercise 3.1") -> bool:
    """Share of the non-zero gradient values that become exactly 0 when (scaled and) cast to fp16."""
    value = number(lost_fraction, exercise, "lost_fraction", "one number, a fraction between 0 and 1")
    g = _gradient_values(gradients, exercise)
    nonzero = g[g != 0]
    if not nonzero.numel():
        raise WorkshopError(f"{exercise}: every gradient is 0, so none can be lost.", "pass the measured gradients.")
    right = ((nonzero * scale).half() == 0).double().mean().item()
    zeros = "that counts the values that were zero already; zeros do not count, a zero has nothing to lose."
    cast_zero = (g * scale).half() == 0
    # the notebook's text promises this one by name: a zero counted, in the numerator, the denominator or both
    counted_zeros = [(float(wrong), zeros, "count only the non-zero values: g[g != 0].") for wrong in (
        (cast_zero & (g != 0)).sum() / g.numel(), cast_zero.double().mean(), cast_zero.sum() / nonzero.numel())]
    verdict(value, right, exercise, "lost_fraction", counted_zeros, "non-zero values whose fp16 cast (.half()) is 0, "
            "divided by the number of non-zero values, as a fraction.",
            inputs=f"{nonzero.numel():,} non-zero values" + (f" scaled by {scale:g}" if scale != 1 else ""),
            limits=[(0 <= value <= 1, "a fraction of the values lies between 0 and 1.",
                     "divide the count of lost values by the count of non-zero values.")])
    return passed(exercise, f"{format_number(100 * value)}% of the non-zero gradients become 0 in fp16")


@checked
def check_safe_loss_scale(safe_scale, gradients, dtype: torch.dtype = torch.float16,
                          exercise: str = "Exercise 3.2") -> bool:
    """The largest power of two S with S x (largest gradient) at most ``finfo(dtype).max``, as the exercise asks.

    A cast rounds to nearest, so a product a little above max (below max + half a step at the top, 65,520 for
    float16) still becomes max, finite: where the next power's product falls in that sliver, it is accepted
    too. Past it the cast gives inf, and that power is "one power too far".
    """
    value = number(safe_scale, exercise, "safe_scale", "one number, a power of two")
    tensors = [t for t in (gradients.values() if isinstance(gradients, dict) else [gradients])
               if torch.is_tensor(t) and t.numel()]
    if not tensors:
        raise WorkshopError(f"{exercise}: no gradient tensor to judge against.",
                            "pass the gradients the exercise names.")
    largest = max(float(t.detach().abs().max()) for t in tensors)
    if not (math.isfinite(largest) and largest > 0):
        raise WorkshopError(f"{exercise}: the largest gradient is {largest}.", "pass the measured gradients.")
    info = torch.finfo(dtype)
    limit = info.max
    overflow = limit + 2.0 ** math.floor(math.log2(limit)) * info.eps / 2  # from here up, a cast rounds to inf
    right = 2.0 ** math.floor(math.log2(limit / largest))
    require(value > 0 and math.log2(value).is_integer(), exercise,
            f"`safe_scale` = {value:g} is not a power of two.",
            "use 2.0 ** k: scaling by a power of two changes only the exponent, so it is exact.")
    name = str(dtype).removeprefix("torch.")
    if value == 2 * right and value * largest < overflow:  # above max, but the cast rounds it down to max
        return passed(exercise, f"2^{math.log2(value):.0f}: the largest gradient {largest:.3g} becomes "
                                f"{value * largest:,.6g}, above {limit:,.0f} but below {overflow:,.0f}: cast to "
                                f"{name} it rounds to {limit:,.0f}, still finite")
    fix = f"the largest k with 2**k * largest <= finfo({name}).max ({limit:,.0f}): 2 ** floor(log2(max / largest))."
    require(value * largest < overflow, exercise, f"`safe_scale` = {value:g}: {value:g} x {largest:.6g} = "
            f"{value * largest:,.6g}, which the cast to {name} rounds to inf (only values below {overflow:,.0f} "
            f"round to {limit:,.0f}, the largest finite).", fix)
    require(value >= right, exercise, f"`safe_scale` = {value:g} is one power short or more: twice that, "
            f"{2 * value:g} x {largest:.6g} = {2 * value * largest:,.6g}, is still at most {limit:,.0f}.", fix)
    return passed(exercise, f"2^{math.log2(value):.0f}: the largest gradient {largest:.3g} becomes "
                            f"{value * largest:,.0f}, below {limit:,.0f}")


class _WatchedScaler(torch.amp.GradScaler):
    """A GradScaler that logs its calls in order (with each backward pass and each optimizer.step() of the
    attendee's) and stops at the first call that breaks GradScaler's order, naming it: GradScaler's own protest,
    where it makes one, says what it lacks ("No inf checks were recorded"), not which call came too early."""

    def __init__(self, *args, exercise: str, **kwargs):
        super().__init__(*args, **kwargs)
        self.log, self.stepping, self.exercise = [], False, exercise

    def _call(self, name: str, optimizer=None) -> None:
        since = self.log[len(self.log) - self.log[::-1].index("update"):] if "update" in self.log else self.log
        grads = [p.grad for group in optimizer.param_groups for p in group["params"]] if optimizer else []
        if misuse := _out_of_order(name, self.log, since, grads):
            raise NotYet(f"✗ {self.exercise}: {misuse[0]}", misuse[1])
        self.log.append(name)

    def scale(self, outputs):
        self._call("scale")
        return super().scale(outputs)

    def unscale_(self, optimizer):
        if not self.stepping:  # scaler.step unscales by itself: only the attendee's own calls are judged
            self._call("unscale_")
        return super().unscale_(optimizer)

    def step(self, optimizer, *args, **kwargs):
        self._call("step", optimizer)
        self.stepping = True
        try:
            return super().step(optimizer, *args, **kwargs)
        finally:
            self.stepping = False

    def update(self, new_scale=None):
        self._call("update")
        return super().update(new_scale)


_UNSCALED = ("the loss never went through scaler.scale, so GradScaler does not know the scale the gradients carry "
             "(scaling it by hand does not tell it).",
             "call scaler.scale(loss).backward() in place of loss.backward() or a loss you scaled.")
_IN_PLACE = ("optimizer.step() ran in place of scaler.step(optimizer).",
             "call scaler.step(optimizer) instead of optimizer.step(): it unscales and skips steps with inf/NaN.")
_ONE_STEP = "one call, one step: forward, scaler.scale(loss).backward(), scaler.step(optimizer), scaler.update()."


def _out_of_order(name: str, log: list, since: list = (), grads: list = ()) -> tuple[str, str] | None:
    """The rule of GradScaler's order that calling ``name`` now ("end": ending the step) breaks, given the ``log``
    of this step's calls so far (``since`` the last update): (problem, fix); None when it keeps them all."""
    calls = Counter(log)
    rules = {"step": [
        (calls["step"], f"scaler.step(optimizer) ran {calls['step'] + 1} times in one call of `amp_step`: that is "
                        "more than one training step.", _ONE_STEP),
        (calls["scale"] == 0, *_UNSCALED),
        ("backward" not in log, "scaler.step(optimizer) ran before the backward pass: there were no gradients of "
                                "this batch yet.",
         "backward first: scaler.scale(loss).backward(), then scaler.step(optimizer), then scaler.update()."),
        (all(g is None or not g.any() for g in grads), "the gradients were cleared after the backward pass, before "
         "scaler.step(optimizer): it had nothing to apply, and no overflow to find.",
         "clear them at the start of the step, before the forward pass: optimizer.zero_grad(set_to_none=True)."),
    ], "update": [
        (calls["update"] and "step" not in since,
         f"scaler.update() ran {calls['update'] + 1} times for {calls['step']} scaler.step(): GradScaler refuses an "
         "update with no step since the last one.",
         "call scaler.update() once per step, after scaler.step(optimizer)."),
        ("step" not in since and "optimizer.step" in log, *_IN_PLACE),
        ("step" not in since, "scaler.update() ran before scaler.step(optimizer): update sets the next scale from "
                              "what step found.", "call scaler.step(optimizer) first, then scaler.update()."),
    ], "unscale_": [
        ("unscale_" in since, "scaler.unscale_(optimizer) ran twice for one update: a step's gradients are unscaled "
                              "once.", "call it at most once, before scaler.step(optimizer)."),
        ("step" in since, "scaler.unscale_(optimizer) ran after scaler.step(optimizer), which unscales by itself.",
         "call unscale_ before scaler.step(optimizer) (to clip the gradients), or not at all."),
    ], "end": [
        (calls["scale"] == 0, *_UNSCALED),
        (calls["step"] == 0 and "optimizer.step" in log, *_IN_PLACE),
        (calls["step"] == 0, "scaler.step was never called.", _IN_PLACE[1]),
        (calls["update"] == 0, "scaler.update() was never called.",
         "call scaler.update() after scaler.step(): without it the scale never adapts."),
    ]}.get(name, [])
    return next(((problem, fix) for broken, problem, fix in rules if broken), None)


def _amp_failure(err: Exception, amp_step, exercise: str) -> NotYet:
    """The one line for an exception raised while ``amp_step`` ran: a call out of order, float16 weights, or
    the attendee's line."""
    if isinstance(err, NotYet):
        return err
    if isinstance(err, ValueError) and "unscale FP16 gradients" in str(err):
        return NotYet(f"✗ {exercise}: the gradients are float16: the model's weights were cast to float16 "
                      "(model.half()?), and GradScaler unscales only float32 gradients.",
                      "keep the weights in float32: autocast runs the forward pass in float16 by itself.")
    return attendee_error(err, amp_step, exercise, "amp_step")


def _amp_model(device: torch.device) -> nn.Module:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 10))
    with torch.no_grad():  # logits far from uniform: the first loss is not ln(10), which a constant could return
        model[2].bias.copy_(torch.linspace(-3.0, 3.0, 10))
    return model.to(device)


def _amp_trial(amp_step, device: torch.device, init_scale: float, zero_grad: bool = True,
               exercise: str = "Exercise 3.3"):
    """One step on a small seeded MLP with stale gradients in place: (model, scaler, loss, dtypes seen).

    With ``amp_step=None`` the step is the textbook one (or the one that forgets ``zero_grad``).
    """
    model = _amp_model(device)
    images = torch.randn(16, 32, device=device)
    labels = torch.randint(0, 10, (16,), device=device)
    for p in model.parameters():
        p.grad = torch.full_like(p, 1e3)  # the previous step's gradients, which the step must clear
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = _WatchedScaler(device.type, init_scale=init_scale, growth_interval=1, exercise=exercise)
    dtypes = []
    log = scaler.log.append
    hooks = [model[0].register_forward_hook(lambda module, inputs, output: dtypes.append(output.dtype)),
             model[0].weight.register_hook(lambda grad: log("backward")),
             optimizer.register_step_pre_hook(lambda *_: None if scaler.stepping else log("optimizer.step"))]
    try:
        if amp_step is not None:
            loss = called(amp_step, exercise, "amp_step", model, images, labels, optimizer, scaler,
                          failure=lambda err: _amp_failure(err, amp_step, exercise))
        else:
            if zero_grad:
                optimizer.zero_grad(set_to_none=True)
            with autocast("fp16", device):
                loss = F.cross_entropy(model(images), labels)
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
    finally:
        for hook in hooks:
            hook.remove()
    return model, scaler, loss, dtypes


def _same_update(model: nn.Module, reference: nn.Module, start: nn.Module, tolerance: float = 0.02) -> bool:
    """The step moved every parameter as the reference step did, to ``tolerance`` of the reference's move.

    Judged on the update, not the weights: fp16 rounding in a loss computed another way (a log-softmax
    that autocast runs in fp16 on one device and fp32 on another) moves the update by far less than 1%,
    every mistake by far more.
    """
    for p, q, s in zip(model.parameters(), reference.parameters(), start.parameters()):
        if p.shape != q.shape:
            return False
        mine, theirs = p.detach().float() - s.detach().float(), q.detach().float() - s.detach().float()
        if not bool(torch.isfinite(mine).all()):
            return False
        if float((mine - theirs).norm()) > tolerance * float(theirs.norm()) + 1e-7:
            return False
    return True


@checked
def check_amp_step(amp_step, device: torch.device, exercise: str = "Exercise 3.3") -> bool:
    """Run ``amp_step(model, images, labels, optimizer, scaler)`` on a small model against the textbook step.

    Once with a scale that fits (the step must move the weights as a correct fp16 step does and the
    scale must grow, the scaler growing after every clean step here) and once with a scale that
    overflows (the step must be skipped and the scale halved). Which GradScaler methods ran and the
    dtype the first layer produced tell the common mistakes apart; any loss that computes the
    cross-entropy of the logits passes, whichever operations autocast runs it in on this device.
    """
    attendee_function(amp_step, exercise, "amp_step", "model, images, labels, optimizer, scaler")
    device = as_device(device, exercise)
    scale = 2.0**8
    start = _amp_model(device)
    model, scaler, loss, dtypes = _amp_trial(amp_step, device, scale, exercise=exercise)
    require(loss is not None, exercise, "`amp_step` returns nothing.", "end it with `return loss`.")
    require(bool(dtypes), exercise, "`amp_step` never ran the model.", "compute the loss from model(images).")
    require(dtypes[0] != torch.float32, exercise,
            f"the forward pass ran in float32: no autocast for {device.type} was active (one for another device, "
            "such as torch.cuda.amp.autocast on a CPU, does nothing here).",
            "compute the output and the loss inside `with wu.autocast('fp16', device):`.")
    require(dtypes[0] == torch.float16, exercise, f"the forward pass ran in {dtypes[0]}, not float16.",
            "use autocast with dtype torch.float16 (wu.autocast('fp16', device)): the mode that needs a scaler.")
    if misuse := _out_of_order("end", scaler.log):
        raise NotYet(f"✗ {exercise}: {misuse[0]}", misuse[1])
    overflow = 2.0**40  # times a logit gradient of order 1/16, far beyond fp16's 65,504
    skipped, skipped_scaler, _, _ = _amp_trial(amp_step, device, overflow, exercise=exercise)
    require(_same_update(skipped, start, start, tolerance=0), exercise,
            "a step whose gradients overflowed changed the weights.",
            "let scaler.step(optimizer) decide: do not also call optimizer.step().")
    require(skipped_scaler.get_scale() == overflow / 2, exercise, "after an overflow the scale was not halved.",
            "call scaler.update() once, after scaler.step(optimizer).")
    reference, _, reference_loss, _ = _amp_trial(None, device, scale)
    stale, _, _, _ = _amp_trial(None, device, scale, zero_grad=False)
    require(not (_same_update(model, stale, start) and not _same_update(model, reference, start)), exercise,
            "the previous step's gradients were added to this step's: they were not cleared at the start of "
            "the step.", "call optimizer.zero_grad(set_to_none=True) first, before the backward pass (zeroing "
                         "at the end of a step leaves whatever came before the first call).")
    require(_same_update(model, reference, start), exercise,
            "the weights after the step differ from a correct fp16 step's.",
            "zero the gradients, forward and loss under autocast, scaler.scale(loss).backward(), "
            "scaler.step(optimizer), scaler.update().")
    returned = number(loss, exercise, "returned loss", "one number (the loss tensor)")
    right = reference_loss.item()
    require(not math.isclose(returned, scale * right, rel_tol=1e-2), exercise,
            "`amp_step` returns the scaled loss.", "return the loss itself, before scaler.scale.")
    require(math.isclose(returned, right, rel_tol=1e-2), exercise,
            f"`amp_step` returns {returned:.4g}, not the batch's loss.", "return the loss computed under autocast.")
    require(scaler.get_scale() == 2 * scale, exercise, "the scale did not grow after a clean step.",
            "call scaler.update() once per step, after scaler.step(optimizer).")
    return passed(exercise, "fp16 forward, scaled backward, overflowing step skipped, scale halved after it "
                            "and doubled after a clean one")
