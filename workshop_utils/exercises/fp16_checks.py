"""Notebook 03's exercises: fp16's range (gradients lost to 0, the largest safe loss scale) and a training step
with autocast and GradScaler, run against the textbook step on a small model: GradScaler judges its own calls."""

import math
import traceback

import torch
import torch.nn.functional as F
from torch import nn

from ..spine.precision import autocast
from ..system.display import format_number
from ..system.hardware import as_device
from .answer_values import kind
from .cell_again import judge_cell_again
from .exercise_cells import NotYet, passed, require
from .exercise_judging import attendee_error, attendee_function, called, checked, kit_input, number, verdict


def _gradient_tensors(gradients) -> tuple[list[torch.Tensor] | None, str]:
    """The tensors ``gradients`` holds (one tensor or array, or a dict, list or tuple of them; else None), described."""
    held = list(gradients.values()) if isinstance(gradients, dict) else list(gradients) if isinstance(
        gradients, (list, tuple)) else [gradients]
    tensors = [torch.as_tensor(t) if type(t).__module__ == "numpy" else t for t in held]
    tensors = tensors if tensors and all(torch.is_tensor(t) for t in tensors) else None
    plural = tensors is not None and not torch.is_tensor(gradients)
    return tensors, f"{kind(gradients)} of {len(tensors)} tensors" if plural else kind(gradients)


@checked
def check_lost_fraction(lost_fraction, gradients: torch.Tensor, scale: float = 1.0,
                        exercise: str = "Exercise 3.1") -> bool:
    value = number(lost_fraction, exercise, "lost_fraction", "one number, a fraction between 0 and 1")
    tensors, described = _gradient_tensors(gradients)
    kit_input(tensors is not None and len(tensors) == 1, f"{exercise}: `gradients` should be one tensor of "
              f"gradients, got {described}.", "pass activation_grads, one tensor, as the check cell does.")
    g = tensors[0].detach().flatten().float().cpu()
    nonzero, cast_zero = g[g != 0], (g * scale).half() == 0
    kit_input(nonzero.numel() > 0, f"{exercise}: no non-zero gradient to judge against.",
              "pass the measured gradients.")
    zeros = ("that counts the values that were zero already; zeros do not count, a zero has nothing to lose.",
             "count only the non-zero values: g[g != 0].")
    # the notebook's text promises this one by name: a zero counted, in the numerator, the denominator or both
    verdict(value, ((nonzero * scale).half() == 0).double().mean().item(), exercise, "lost_fraction",
            [(float(wrong), *zeros) for wrong in ((cast_zero & (g != 0)).sum() / g.numel(), cast_zero.double().mean(),
                                                  cast_zero.sum() / nonzero.numel())],
            "non-zero values whose fp16 cast (.half()) is 0, divided by the number of non-zero values, as a fraction.",
            inputs=f"{nonzero.numel():,} non-zero values" + (f" scaled by {scale:g}" if scale != 1 else ""),
            limits=[(0 <= value <= 1, "a fraction of the values lies between 0 and 1.",
                     "divide the count of lost values by the count of non-zero values.")])
    # + 0.0: an answer of -0.0, which is right where nothing is lost, reads 0%, not -0%
    return passed(exercise, f"{format_number(100 * value + 0.0)}% of the non-zero gradients become 0 in fp16")


# Gradients to run 3.2's cell on again, where a method that gave the right power on the notebook's gradients by
# chance gives another: the largest (0.5) is an activation's, then a parameter's, and 65,504 / 0.5 lies just below a
# power of two, so rounding the exponent, 65,536 for float16's largest value, or one kind of gradient alone overflows.
OTHER_GRADIENTS = ({"parameters": torch.tensor([0.3, 1e-3, 0.0]), "activations": torch.tensor([0.5, 1e-4, 2e-9])},
                   {"parameters": torch.tensor([0.5, 1e-3, 0.0]), "activations": torch.tensor([0.3, 1e-4, 2e-9])})


@checked
def check_safe_loss_scale(safe_scale, gradients, dtype: torch.dtype = torch.float16,
                          exercise: str = "Exercise 3.2") -> bool:
    """The largest power of two S with S x the largest gradient <= ``finfo(dtype).max`` (or that the cast still rounds
    down to max: the cast decides); then the answer's cell run again on each of ``OTHER_GRADIENTS``."""
    value = number(safe_scale, exercise, "safe_scale", "one number, a power of two")
    tensors, described = _gradient_tensors(gradients)
    kit_input(tensors is not None, f"{exercise}: `gradients` should be tensors of gradients (the dict `grads`), got "
              f"{described}.", "pass grads, as the check cell does.")
    detail = _judge_scale(value, tensors, dtype, exercise)
    for other, kind_of in zip(OTHER_GRADIENTS, ("an activation's", "a parameter's")):
        again = f"{exercise} (your cell, run again on other gradients: the largest 0.5, {kind_of})"
        judge_cell_again(("safe_scale",), {"grads": other}, lambda answer: _judge_scale(number(
            answer["safe_scale"], again, "safe_scale", "one number, a power of two"), list(other.values()), dtype,
            again))
    return passed(exercise, detail)


def _judge_scale(value: float, tensors: list[torch.Tensor], dtype: torch.dtype, exercise: str) -> str:
    largest = max((float(t.detach().abs().max()) for t in tensors if t.numel()), default=math.nan)
    kit_input(math.isfinite(largest) and largest > 0, f"{exercise}: the largest gradient is {largest}.",
              "pass the measured gradients.")
    limit, name = torch.finfo(dtype).max, str(dtype).removeprefix("torch.")
    require(value > 0 and math.log2(value).is_integer(), exercise, f"`safe_scale` = {value:g} is not a power of two.",
            "use 2.0 ** k: scaling by a power of two changes only the exponent, so it is exact.")
    fix = f"take the largest power of two S with S x the largest gradient <= finfo({name}).max ({limit:,.0f})."
    product = value * largest
    cast = torch.tensor(product, dtype=torch.float64).to(dtype).item()
    require(math.isfinite(cast), exercise, f"`safe_scale` = {value:g}: {value:g} x {largest:.6g} = {product:,.6g}, "
            f"which the cast to {name} rounds to inf.", fix)
    require(value >= 2.0 ** math.floor(math.log2(limit / largest)), exercise, f"`safe_scale` = {value:g} is one "
            f"power short or more: a larger power of two still keeps the largest gradient at most {limit:,.0f}.", fix)
    becomes = (f"{product:,.6g}, above {limit:,.0f}: cast to {name} it rounds to {cast:,.0f}, still finite"
               if product > limit else f"{product:,.0f}, {'below' if round(product) < limit else 'at most'} "
                                       f"{limit:,.0f}")
    return f"2^{math.log2(value):.0f}: the largest gradient {largest:.3g} becomes {becomes}"


_ORDER = ("once each, in GradScaler's order: scaler.scale(loss).backward(), then scaler.step(optimizer), then "
          "scaler.update().")
_HALF = ("the weights are float16 (model.half()): keep the model in float32 and let autocast (wu.autocast) choose "
         "float16 per operation.")


def _amp_model(device: torch.device) -> nn.Module:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 10))
    with torch.no_grad():  # logits far from uniform: the first loss is not ln(10), which a constant could return
        model[2].bias.copy_(torch.linspace(-3.0, 3.0, 10))
    return model.to(device)


def _amp_trial(amp_step, device: torch.device, init_scale: float, exercise: str, zero_grad: bool = True):
    """One step (the textbook one for ``amp_step=None``) on a small seeded MLP with stale gradients in place:
    (model, scaler, loss, dtypes seen, optimizer)."""
    model = _amp_model(device)
    images, labels = torch.randn(16, 32, device=device), torch.randint(0, 10, (16,), device=device)
    for p in model.parameters():
        p.grad = torch.full_like(p, 1e3)  # the previous step's gradients, which the step must clear
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)  # its state shows it was stepped
    scaler = torch.amp.GradScaler(device.type, init_scale=init_scale, growth_interval=1)
    dtypes = []  # the model is the trial's own: its hook needs no removing
    model[0].register_forward_hook(lambda module, inputs, output: dtypes.append(output.dtype))
    if amp_step is not None:
        def refused(err):  # GradScaler's own refusal of calls out of order gets the order as its fix, unless fp16
            half = any(p.dtype == torch.float16 for p in model.parameters())
            said_by = traceback.extract_tb(err.__traceback__)[-1].filename
            return attendee_error(err, amp_step, exercise, "amp_step",
                                  _HALF if half else _ORDER if "grad_scaler" in said_by else None)

        loss = called(amp_step, exercise, "amp_step", model, images, labels, optimizer, scaler, failure=refused)
        return model, scaler, loss, dtypes, optimizer
    if zero_grad:
        optimizer.zero_grad(set_to_none=True)
    with autocast("fp16", device):
        loss = F.cross_entropy(model(images), labels)
    scaler.scale(loss).backward()
    scaler.step(optimizer)
    scaler.update()
    return model, scaler, loss, dtypes, optimizer


def _reshaped(model: nn.Module, start: nn.Module) -> str:
    """What the step changed of the model but its weights' values (a layer gone or added, a shape, a dtype, the
    device), in words; "" for nothing. A value compared layer by layer would miss a layer gone from the end."""
    mine, before = dict(model.named_parameters()), dict(start.named_parameters())
    gone, added = [n for n in before if n not in mine], [n for n in mine if n not in before]
    if gone or added:
        return "; ".join(f"{words} {', '.join(names)}" for words, names in (("it removed", gone), ("it added", added))
                         if names)
    for name, p in mine.items():
        for what, now, was in (("shape", tuple(p.shape), tuple(before[name].shape)), ("dtype", p.dtype,
                               before[name].dtype), ("device", p.device.type, before[name].device.type)):
            if now != was:
                return f"{name} has the {what} {now}, not {was}"
    return ""


def _same_update(model: nn.Module, reference: nn.Module, start: nn.Module, tolerance: float = 0.02) -> bool:
    """Every parameter moved as the reference step moved it, to ``tolerance``: fp16 rounding moves the update by far
    less than 1%, every mistake by far more."""
    if _reshaped(model, start):
        return False
    for p, q, s in zip(model.parameters(), reference.parameters(), start.parameters()):
        mine, theirs = p.detach().float() - s.detach().float(), q.detach().float() - s.detach().float()
        if not bool(torch.isfinite(mine).all()) or \
                float((mine - theirs).norm()) > tolerance * float(theirs.norm()) + 1e-7:
            return False
    return True


@checked
def check_amp_step(amp_step, device: torch.device, exercise: str = "Exercise 3.3") -> bool:
    """``amp_step`` against the textbook step, with a scale that overflows (skipped, halved) and one that fits."""
    attendee_function(amp_step, exercise, "amp_step", "model, images, labels, optimizer, scaler")
    device = as_device(device, exercise)
    scale, overflow = 2.0**8, 2.0**40  # 2**40 times a logit gradient of order 1/16 is far beyond fp16's 65,504
    start = _amp_model(device)
    model, scaler, loss, dtypes, optimizer = _amp_trial(amp_step, device, scale, exercise)
    require(loss is not None, exercise, "`amp_step` returns nothing.", "end it with `return loss`.")
    require(bool(dtypes), exercise, "`amp_step` never ran the model.", "compute the loss from model(images).")
    require(dtypes[0] == torch.float16, exercise, f"the forward pass ran in {dtypes[0]}, not float16.",
            f"compute the output and the loss inside `with wu.autocast('fp16', device):`, an autocast "
            f"for {device.type} (one for another device, such as torch.cuda.amp.autocast on a CPU, does nothing here).")
    # GradScaler sets its _scale on the first scaler.scale(loss): still None, the step scaled with another one
    require(scaler._scale is not None, exercise, "`amp_step` never used the `scaler` it is given: a GradScaler made "
            "in the step starts from its first scale every step.", "scale, step and update through `scaler`.")
    changed = _reshaped(model, start)
    require(not changed, exercise, f"`amp_step` changed the model, not only its weights' values: {changed}.",
            _HALF if "dtype torch.float16" in changed else "leave the model as it is given: the step only moves its "
            "weights, through scaler.step(optimizer).")
    skipped, skipped_scaler, *_ = _amp_trial(amp_step, device, overflow, exercise)
    require(_same_update(skipped, start, start, tolerance=0), exercise, "a step whose gradients overflowed changed "
            "the weights.", "let scaler.step(optimizer) decide: do not call optimizer.step() yourself.")

    def scaled(scaler, before: float, after: float, when: str) -> None:  # GradScaler halves, or doubles, once
        require(scaler.get_scale() == after, exercise, f"after {when} the scale went from 2^{math.log2(before):g} to "
                f"2^{math.log2(scaler.get_scale()):g}, not 2^{math.log2(after):g}.",
                "call scaler.update() once per step, with no argument, after scaler.step(optimizer).")

    scaled(skipped_scaler, overflow, overflow / 2, "an overflow")
    reference, _, reference_loss, *_ = _amp_trial(None, device, scale, exercise)
    if not _same_update(model, reference, start):  # named where the step that forgets zero_grad moves it alike
        stale = _same_update(model, _amp_trial(None, device, scale, exercise, zero_grad=False)[0], start)
        raise NotYet(f"✗ {exercise}: " + ("the previous step's gradients were added to this step's: the exercise "
                                          "asks the step to clear them first." if stale else
                                          "the weights after the step differ from a correct fp16 step's."),
                     "call optimizer.zero_grad(set_to_none=True) at the start of the step, as item 1 of the exercise "
                     "says." if stale else "zero the gradients, forward and loss under autocast, "
                     "scaler.scale(loss).backward(), scaler.step(optimizer), scaler.update().")
    require(all(optimizer.state.get(p) for p in model.parameters()), exercise, "`amp_step` stepped an optimizer of "
            "its own, not the `optimizer` it is given: made anew every step, it loses its state and settings.",
            "step the `optimizer` argument: scaler.step(optimizer).")
    returned = number(loss, exercise, "loss", "one number (the loss tensor)", returned_by="amp_step")
    right = reference_loss.item()
    require(math.isclose(returned, right, rel_tol=1e-2), exercise, f"`amp_step` returns {returned:.4g}, not the "
            "batch's loss" + (", but the scaled loss." if math.isclose(returned, scale * right, rel_tol=1e-2) else "."),
            "return the loss computed under autocast, before scaler.scale.")
    scaled(scaler, scale, 2 * scale, "a clean step")
    return passed(exercise, "fp16 forward, scaled backward, overflowing step skipped, scale halved after it "
                            "and doubled after a clean one")
