"""Wrong answers to the exercises of notebooks 01-05 whose one line named another mistake than the one made, or that
passed: each is the notebook's solution with one change, judged through the public ``wu.check_*``, and its line
must name what happened (and not the mistake it was mistaken for).
"""

from __future__ import annotations

import math
from pathlib import Path

import nbformat
import numpy as np
import pandas as pd
import pytest
import torch
import torch.nn.functional as F

import workshop_utils as wu
from workshop_utils.exercises.exercise_cells import NotYet
from workshop_utils.spine.timing import Timings
from workshop_utils.system.errors import WorkshopError

CPU = torch.device("cpu")


def refusal(call) -> str:
    with pytest.raises(NotYet) as caught:
        call()
    message = str(caught.value)
    assert message.startswith("✗ Exercise ") and "\n" not in message, message
    return message


def said(message: str, named: list[str], not_named: list[str]) -> None:
    for words in named:
        assert words in message, message
    for words in not_named:
        assert words not in message, message


# ---------------------------------------------------------------- 3.3: GradScaler's calls out of order


def amp_step(zero=lambda optimizer: optimizer.zero_grad(set_to_none=True), middle=None,
             calls=lambda scaler, optimizer, scaled: (scaled.backward(), scaler.step(optimizer), scaler.update())):
    """Exercise 3.3's solution with its zero_grad, what runs after the backward pass, or its scaler calls changed."""
    def step(model, images, labels, optimizer, scaler):
        zero(optimizer)
        with wu.autocast("fp16", CPU):
            loss = F.cross_entropy(model(images), labels)
        calls(scaler, optimizer, scaler.scale(loss), *([middle] if middle else []))
        return loss
    return step


def backward_then(*rest):
    return lambda scaler, optimizer, scaled: (scaled.backward(), *[call(scaler, optimizer) for call in rest])


STEP, UPDATE = (lambda scaler, optimizer: scaler.step(optimizer)), (lambda scaler, optimizer: scaler.update())
UNSCALE = lambda scaler, optimizer: scaler.unscale_(optimizer)  # noqa: E731


@pytest.mark.parametrize("step, named, not_named", [
    (amp_step(calls=backward_then(UPDATE, STEP)), ["No inf checks were recorded prior to update."],
     ["optimizer.step()", "without"]),
    (amp_step(calls=backward_then(lambda s, o: o.zero_grad(set_to_none=True), STEP, UPDATE)),
     ["No inf checks were recorded for this optimizer."], ["never called"]),
    (amp_step(calls=backward_then(lambda s, o: o.zero_grad(set_to_none=False), STEP, UPDATE)),
     ["after an overflow the scale went from 2^40 to 2^41"], ["not halved", "never called"]),
    (amp_step(calls=lambda scaler, optimizer, scaled: (scaler.step(optimizer), scaled.backward(), scaler.update())),
     ["No inf checks were recorded for this optimizer."], ["never called"]),
    (amp_step(calls=backward_then(UNSCALE, UNSCALE, STEP, UPDATE)),
     ["unscale_() has already been called on this optimizer"], ["never called", "instead of optimizer.step()"]),
    (amp_step(calls=backward_then(STEP, UNSCALE, UPDATE)), ["unscale_() is being called after step()"], []),
    (amp_step(calls=backward_then(lambda s, o: o.step(), UPDATE)), ["No inf checks were recorded prior to update."],
     ["before scaler.step"]),
], ids=["update-before-step", "zero-grad-to-none-after-backward", "zero-grad-to-zeros-after-backward",
        "step-before-backward", "unscale-twice", "unscale-after-step", "optimizer-step-then-update"])
def test_3_3_a_call_out_of_order_is_refused_in_gradscalers_own_words(step, named, not_named):
    said(refusal(lambda: wu.check_amp_step(step, CPU)), named, not_named)


def test_3_3_a_step_that_gives_a_weight_another_shape_is_judged_not_called_the_checks_failure():
    def reshaping(model, images, labels, optimizer, scaler):
        loss = amp_step()(model, images, labels, optimizer, scaler)
        next(model.parameters()).data = torch.zeros(7)  # no longer the layer's shape, nor one that broadcasts
        return loss

    said(refusal(lambda: wu.check_amp_step(reshaping, CPU)), ["changed the model", "0.weight has the shape (7,)"],
         ["the check itself failed", "optimizer.step() yourself"])


def _then(change):
    def step(model, images, labels, optimizer, scaler):
        loss = amp_step()(model, images, labels, optimizer, scaler)
        change(model)
        return loss
    return step


def _replace_last(model):
    model[2] = torch.nn.Identity()


@pytest.mark.parametrize("change, named", [
    # a layer gone from the end passed: compared layer by layer with the start, the shorter model ran out first
    (_replace_last, "it removed 2.weight, 2.bias"),
    (lambda model: setattr(model[2], "bias", None), "it removed 2.bias"),
    # told "stepped an optimizer of its own": the new layer had no optimizer state
    (lambda model: model.append(torch.nn.Linear(10, 10)), "it added 3.weight, 3.bias"),
    # told "the check itself failed" (a tensor on meta compared with one on the CPU)
    (lambda model: model.to("meta"), "0.weight has the device meta, not cpu"),
    (lambda model: model.double(), "0.weight has the dtype torch.float64, not torch.float32"),
], ids=["last-layer-replaced", "last-bias-removed", "layer-added", "moved-to-meta", "made-double"])
def test_3_3_a_step_that_changes_the_model_itself_is_told_what_it_changed(change, named):
    said(refusal(lambda: wu.check_amp_step(_then(change), CPU)), ["changed the model, not only its weights' values",
                                                                  named], ["the check itself failed", "its own"])


def test_3_3_a_model_made_half_after_the_step_is_told_autocast_chooses_float16():
    said(refusal(lambda: wu.check_amp_step(_then(lambda model: model.half()), CPU)), ["dtype torch.float16",
                                                                                      "let autocast"], [])


def test_3_3_the_solution_still_passes(capsys):
    assert wu.check_amp_step(amp_step(), CPU) is True
    assert capsys.readouterr().out.startswith("✓ Exercise 3.3: correct")


# ---------------------------------------------------------------- a list or tuple of one number is no number

RATE = 1.2345e9 * 456.78 / 1e12  # Exercise 1.1's TFLOP/s for these inputs


@pytest.mark.parametrize("call, words", [
    (lambda: wu.check_achieved_tflops((RATE,), 1.2345e9, 456.78), ["got a tuple", "a comma after the number"]),
    (lambda: wu.check_mfu(RATE / 19.5, (RATE,), "NVIDIA A100-SXM4-80GB", "fp32", 50.0), ["got a tuple"]),
    (lambda: wu.check_matmul_tflops([2 * 1024**3 / 0.02 / 1e12], 1024, 0.02), ["got a list"]),
    (lambda: wu.check_microbatches((63,), 8, 0.1), ["got a tuple", "a comma after the number"]),
    (lambda: wu.check_fewest_gpus([3], 7e9, 35, stage=3), ["got a list"]),
], ids=["1.1-trailing-comma", "1.3-carried-tuple", "1.2-list", "5.3-tuple", "5.1-list"])
def test_a_sequence_of_one_number_is_refused(call, words):
    said(refusal(call), ["should be", *words], ["correct"])


# ---------------------------------------------------------------- 5.1, 5.2: a count or a time two mistakes give

G = 7e9 / 2**30  # GiB per byte a parameter, 7e9 parameters
NDR = wu.LINKS["ib_ndr"]


def one_pass(n_bytes: float = 14e9, bandwidth: float = NDR.bandwidth_gbps * 1e9) -> float:
    return 63 * NDR.latency_us * 1e-6 + 63 / 64 * n_bytes / bandwidth


@pytest.mark.parametrize("call, named, not_named", [
    # ZeRO-1 with all 16 bytes divided into what the whole parameters and gradients leave: 12, as GB for GiB gives
    (lambda: wu.check_fewest_gpus(math.ceil(16 * G / (35 - 4 * G)), 7e9, 35, stage=1),
     ["`zero1_gpus` = 12: too many: fewer GPUs already hold it"], []),
    # ZeRO-1 with Adam's 8 bytes, the fp32 master copy forgotten: 6, rounded up as asked
    (lambda: wu.check_fewest_gpus(math.ceil(8 * G / (35 - 4 * G)), 7e9, 35, stage=1),
     ["`zero1_gpus` = 6: at 6 GPUs each holds 39.1 GiB"], ["round up", "math.ceil"]),
    # a count no mistake gives, too few: what each GPU would hold, and no guess at a rounding
    (lambda: wu.check_fewest_gpus(7, 7e9, 35, stage=1), ["at 7 GPUs each holds"], ["round up", "math.ceil"]),
    # the link's bandwidth doubled (both directions): the same time as one byte per parameter
    (lambda: wu.check_fsdp_traffic(2 * one_pass(bandwidth=2 * NDR.bandwidth_gbps * 1e9),
                                   3 * one_pass(bandwidth=2 * NDR.bandwidth_gbps * 1e9), 14e9, 64, NDR),
     ["`ddp_s` = 0.2763 is not right", "B = 50 GB/s"], []),
], ids=["5.1-all-bytes-into-the-rest", "5.1-no-master-copy", "5.1-too-few", "5.2-bandwidth-doubled"])
def test_5_a_wrong_count_says_what_each_gpu_holds_and_a_wrong_time_what_was_expected(call, named, not_named):
    said(refusal(call), named, not_named)


# ---------------------------------------------------------------- 3.2 at float16's edge: the arithmetic reads true


def gradients(largest: float) -> dict:
    return {"parameters": torch.tensor([1e-3, largest]), "activations": torch.tensor([0.0, 1e-3])}


def test_3_2_65536_taken_for_the_largest_value_is_shown_to_overflow():
    largest = 65521 / 2**10  # 1024 x largest = 65,521: inf in float16, though floor(log2(65536 / largest)) = 10
    message = refusal(lambda: wu.check_safe_loss_scale(2.0 ** math.floor(math.log2(65536 / largest)),
                                                       gradients(largest)))
    said(message, ["1024 x 63.9854 = 65,521", "rounds to inf"], [])


def test_3_2_one_power_short_at_exactly_the_largest_value_says_at_most():
    message = refusal(lambda: wu.check_safe_loss_scale(512.0, gradients(65504 / 2**10)))
    said(message, ["one power short", "a larger power of two still keeps the largest gradient at most 65,504"],
         ["below 65,504", "x 64 =", "1024"])


# ---------------------------------------------------------------- 4.1 and 1.3: what a pass says reads true

def loader_sweep(rows) -> pd.DataFrame:
    return pd.DataFrame(rows, columns=["num_workers", "pin_memory", "samples_per_s", "step_ms_median",
                                       "data_wait_fraction"])


def loader_choice(pick=lambda samples: samples.idxmax()):
    def choose(sweep, start):
        fastest = sweep.loc[pick(sweep.samples_per_s)]
        return fastest.num_workers, fastest.samples_per_s / start.samples_per_s, 1 / (1 - start.data_wait_fraction)
    return choose


def test_4_1_either_row_of_a_tie_for_fastest_passes(capsys):
    tie = loader_sweep([(0, False, 500.0, 127.0, 0.06), (0, True, 600.0, 120.0, 0.05),
                        (2, False, 600.0, 120.0, 0.02), (2, True, 550.0, 125.0, 0.02)])
    assert wu.check_loader_choice(loader_choice(lambda samples: samples[::-1].idxmax()), tie, 0) is True
    assert capsys.readouterr().out.startswith("✓ Exercise 4.1: correct (2 workers")


def test_4_1_a_speed_up_a_little_above_amdahls_bound_is_not_said_to_be_within_it(capsys):
    sweep = loader_sweep([(0, False, 500.0, 127.0, 0.123), (2, False, 575.0, 120.0, 0.02),
                          (4, False, 560.0, 125.0, 0.02)])
    assert wu.check_loader_choice(loader_choice(), sweep, 0) is True
    out = capsys.readouterr().out
    said(out, ["1.15x measured, above the 1.14x that Amdahl allows by less than 2%"], ["within"])


def test_1_3_an_mfu_just_above_a_measured_rate_is_shown_above_100_percent(capsys):
    assert wu.check_mfu(1.004, 0.1004, "x86_64", "fp32", 0.1) is True
    said(capsys.readouterr().out, ["MFU 100.4% of the measured matmul rate: above 100% means"], ["MFU 100%"])


# ---------------------------------------------------------------- 01-05: a refusal shows no right value, reads true

def _with_wait(sweep, start):  # 4.1 with the row that waits least taken for the fastest
    fastest = sweep.loc[sweep.samples_per_s.idxmax()]
    return (int(sweep.loc[sweep.data_wait_fraction.idxmin()].num_workers),
            fastest.samples_per_s / start.samples_per_s, 1 / (1 - start.data_wait_fraction))


def _half_step(model, images, labels, optimizer, scaler):  # 3.3 with model.half() in place of autocast
    optimizer.zero_grad()
    loss = F.cross_entropy(model.half()(images.half()).float(), labels)
    scaler.scale(loss).backward()
    scaler.step(optimizer)
    scaler.update()
    return loss


def _mfu_on_a_cpu(mfu):  # 1.3 against a measured rate of 0.09 TFLOP/s, 0.12 achieved: the right MFU is 1.333
    n, seconds = 1024, 2 * 1024**3 / 0.09e12
    return wu.check_mfu(mfu, 0.12, "x86_64", "fp32", 0.09, flops_per_sample=2e8, samples_per_s=600.0, n=n,
                        timings=Timings(seconds=np.full(10, seconds)), seconds=seconds)


LOADER = loader_sweep([(0, False, 700.0, 127.0, 0.31), (2, False, 640.0, 120.0, 0.12)])  # 0 workers is fastest
LOADER_2 = loader_sweep([(0, False, 900.0, 1, 0.62), (2, False, 2100.0, 1, 0.25), (4, False, 3900.0, 1, 0.05),
                         (8, False, 3800.0, 1, 0.03)])
BATCHES = pd.DataFrame({"batch_size": [32, 64, 128, 256], "status": ["ok"] * 4,
                        "peak_memory_mib": [95 + 1.3681 * b for b in (32, 64, 128, 256)]})  # largest: 369 in 600 MiB


@pytest.mark.parametrize("call, named, not_named", [
    (lambda: wu.check_fewest_gpus(4, 7e9, 35, stage=3), ["`zero3_gpus` = 4: too many: fewer GPUs already hold it"],
     ["3 GPUs", "34.8"]),
    (lambda: wu.check_fewest_gpus(10, 7e9, 35, stage=1), ["too many"], ["9 GPUs", "34.8"]),
    (lambda: wu.check_microbatches(64, 8, 0.1), ["`microbatches` = 64: too many"], ["63", "0.100"]),
    (lambda: wu.check_safe_loss_scale(8192.0, {"g": torch.tensor([0.5, 3.7])}),
     ["a larger power of two still keeps the largest gradient at most 65,504"],
     ["16384", "16,384", "60,620", "floor(log2", "2 **"]),
    (lambda: wu.check_loader_choice(_with_wait, LOADER, 0), ["`best_workers` = 2 is not the num_workers of the "
                                                             "fastest row"], ["0 for", "should be 0", "too large"]),
    (lambda: wu.check_lost_fraction(0.001, torch.rand(1000, generator=torch.Generator().manual_seed(0)) + 0.1),
     ["`lost_fraction` = 0.001 is not right for what 1,000 non-zero values"], ["should be 0", "too large"]),
    (lambda: _mfu_on_a_cpu(1.6), ["`mfu` = 1.6 is not right: too large"], ["faster than the peak", "between 0 and 1"]),
    (lambda: _mfu_on_a_cpu(133.3), ["`mfu` = 133.3 is not right: about 100x too large"], ["faster than the peak"]),
    (lambda: _mfu_on_a_cpu(1.0), ["`mfu` = 1: that caps MFU at 1"], ["significant digits"]),
    (lambda: wu.check_batch_memory(1.3681, 371, BATCHES, 600), ["`largest_batch` = 371 is not right: too large for"],
     ["includes the intercept", "within 10x", "MiB, above"]),
    (lambda: wu.check_batch_memory(1.3681, 3690, BATCHES, 600), ["is not right: about 10x too large for"],
     ["includes the"]),
    (lambda: wu.check_batch_memory(1.3681, math.floor(600 / 1.3681), BATCHES, 600), ["leaves the intercept out"],
     []),
    (lambda: wu.check_amp_step(_half_step, CPU), ["the weights are float16 (model.half())", "autocast"],
     ["GradScaler's order"]),
    (lambda: wu.check_loader_choice(_with_wait, LOADER_2, 2), ["`best_workers` = 8 is not the num_workers of the "
                                                               "fastest row"], ["10x", "too large"]),
    (lambda: wu.check_achieved_tflops(1e-30, 246183936.0, 1234.5678), ["more than 1,000,000x too small"], ["999"]),
    (lambda: wu.check_achieved_tflops(1e308, 246183936.0, 1234.5678), ["more than 1,000,000x too large"], ["infx"]),
    (lambda: wu.check_achieved_tflops(5e-324, 1e150, 1e150), ["more than 1,000,000x too small"], ["failed"]),
    (lambda: wu.check_fewest_gpus(1, 7e9, 35, stage=1), ["at 1 GPU each holds"], ["1 GPUs"]),
    (lambda: wu.check_mfu(0.07, None, "NVIDIA H100 80GB HBM3", "fp32", 50.0, flops_per_sample=2.46e8,
                          samples_per_s=2e4), ["`achieved_tflops` from Exercise 1.1 is None"], ["(Exercise 1.1)`"]),
    (lambda: wu.check_matmul_tflops(50.0, 4096, 2 * 4096**3 / 50e12, timings=Timings(seconds=np.array([]))),
     ["`timings` holds no repeats"], ["should be what"]),
], ids=["1a-5.1-one-too-many", "1a-5.1-zero1-one-too-many", "1b-5.3-one-too-many", "1c-3.2-one-power-short",
        "1e-4.1-right-is-0-workers", "1f-3.1-right-is-0", "2a-1.3-cpu-above-1", "2a-1.3-cpu-percent",
        "2a-1.3-cpu-capped-at-1", "2b-4.2-two-above", "2b-4.2-ten-times", "2b-4.2-no-intercept", "2c-3.3-model-half",
        "2d-4.1-a-row-not-the-fastest", "5-1.1-tiny", "5-1.1-huge", "5-1.1-ratio-underflows", "5-5.1-one-gpu",
        "5-1.3-achieved-none", "5-1.2-empty-timings"])
def test_a_refusal_shows_no_value_to_paste_and_reads_true(call, named, not_named):
    said(refusal(call), named, not_named)


def test_3_2_a_product_of_exactly_the_largest_finite_says_at_most(capsys):
    assert wu.check_safe_loss_scale(16384.0, {"g": torch.tensor([65504 / 16384, 0.1])}) is True
    said(capsys.readouterr().out, ["becomes 65,504, at most 65,504"], ["below"])


def test_1_4_a_pass_shows_the_formulas_value_not_the_answers_rounding(capsys):
    size = wu.GPT_SIZES["tiny"]
    two_digits = lambda N, L, d, T: float(f"{6 * N + 12 * L * d * T:.2g}")  # noqa: E731
    assert wu.check_flops_per_token(two_digits, 842_496, size, 128, 5_701_632.0) is True
    said(capsys.readouterr().out, ["5.84 MFLOP per token by the formula"], ["5.80 MFLOP", "5.8 MFLOP"])


# ---------------------------------------------------------------- the fifth review's findings (R5)


def _amp(own_optimizer=False, own_scaler=False, update=lambda scaler: scaler.update(), returns=lambda loss: loss):
    """3.3's solution stepping an optimizer or a GradScaler of its own, updating the scale another way, or
    returning something else."""
    def step(model, images, labels, optimizer, scaler):
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9) if own_optimizer else optimizer
        scaler = torch.amp.GradScaler("cpu") if own_scaler else scaler
        optimizer.zero_grad(set_to_none=True)
        with wu.autocast("fp16", CPU):
            loss = F.cross_entropy(model(images), labels)
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        update(scaler)
        return returns(loss)
    return step


def _fastest_of(rows):  # 4.1 with the fastest row taken among some rows only
    def choose(sweep, start):
        chosen = rows(sweep)
        fastest = chosen.loc[chosen.samples_per_s.idxmax()]
        return int(fastest.num_workers), fastest.samples_per_s / start.samples_per_s, 1 / (1 - start.data_wait_fraction)
    return choose


GPU_LOADER = loader_sweep([(0, False, 2100.0, 30.0, 0.62), (0, True, 2150.0, 30.0, 0.61),
                           (2, False, 5200.0, 12.0, 0.18), (2, True, 5600.0, 11.0, 0.12),
                           (4, False, 5500.0, 12.0, 0.15), (4, True, 5450.0, 12.0, 0.16)])  # fastest: pinned, 2 workers
PHASES = pd.DataFrame({"step_ms": [10.0], "data_ms": [1.0], "backward_ms": [6.0], "operators_per_step": [40.0]})


@pytest.mark.parametrize("call, named, not_named", [
    (lambda: wu.check_amp_step(_amp(own_optimizer=True), CPU), ["an optimizer of its own", "`optimizer` argument"],
     []),
    (lambda: wu.check_amp_step(_amp(own_scaler=True), CPU), ["never used the `scaler` it is given"],
     ["optimizer.step()"]),
    (lambda: wu.check_amp_step(_amp(returns=lambda loss: (loss, loss)), CPU),
     ["what `amp_step` returns", "one value, not 2"], ["tuple of one", "`returned loss`"]),
    (lambda: wu.check_amp_step(_amp(update=lambda scaler: scaler.update(2.0**16)), CPU), ["with no argument"], []),
    (lambda: wu.check_loader_choice(_fastest_of(lambda s: s[s.pin_memory]), GPU_LOADER, 2),
     ["on a second sweep", "`best_workers` = 4 is not the num_workers of the fastest row"], []),
    (lambda: wu.check_loader_choice(_fastest_of(lambda s: s[s.num_workers > 0]), GPU_LOADER, 2),
     ["on a second sweep", "is not the num_workers of the fastest row"], []),
    (lambda: wu.check_batch_memory(1.3681, 329, BATCHES, 600 / 1024), ["is below the line's intercept"],
     ["its sign is wrong"]),
    (lambda: wu.check_batch_memory(1.3681, 329, BATCHES, 50), ["`limit_mib` = 50 MiB is below"], ["sign"]),
    (lambda: wu.check_achieved_tflops(0.995 * RATE, 1.2345e9, 456.78), ["is not right: slightly too small (within 1%)"],
     ["10x"]),
    (lambda: wu.check_achieved_tflops(1, 1.2345e9, 1026.0), ["is not right, or keeps fewer than two significant"], []),
    (lambda: wu.check_next_fix("operators_per_step", 1.25, PHASES), ["no column of the step's parts"],
     ["of the table"]),
    (lambda: wu.check_matmul_tflops(50.0, 4096, 2 * 4096**3 / 50e12, timings=Timings(
        seconds=np.full(3, 2 * 4096**3 / 50e12), output_shape=())), ["single number", "time the product itself"],
     ["from the top"]),
    (lambda: wu.check_mfu(59.0, 0.059, "x86_64", "fp32", 0.1), ["a percentage, above 1"], ["which no run is"]),
    (lambda: wu.check_micro_batch_plan(-32, -4, wu.GPT_SIZES["gpt2-small"], 1024, 2**19, 4, 32 * 2**30),
     ["at least one of each is needed"], ["sequences fit"]),
    (lambda: wu.check_fewest_gpus(-math.inf, 7e9, 35, stage=3), ["`zero3_gpus` = -inf, but a finite number"],
     ["what stays whole fits"]),
], ids=["F1-3.3-own-optimizer", "F2-3.3-own-scaler", "F3-3.3-two-values", "F4-3.3-update-with-a-scale",
        "F20-4.1-fastest-pinned", "F20-4.1-fastest-with-workers", "F5-4.2-limit-in-gib", "F5-4.2-limit-below",
        "F7-1.1-near-miss", "F9-1.1-a-one-not-rounded", "F8-4.3-not-a-part", "F12-1.2-sum-timed",
        "F13-1.3-measured-percentage", "F14-2.4-negative", "cosmetic-5.1-minus-inf"])
def test_r5_a_refusal_names_what_happened(call, named, not_named):
    said(refusal(call), named, not_named)


def test_r5_the_runs_numbers_and_an_accepted_ddp_time_carry(capsys):
    # F16: the run's samples_per_s as a 0-d tensor is a number; F21: FSDP's 3 passes from the accepted 0.55 s for 2
    assert wu.check_achieved_tflops(RATE, 1.2345e9, torch.tensor(456.78, dtype=torch.float64)) is True
    assert wu.check_fsdp_traffic(0.55, 1.5 * 0.55, 14e9, 64, NDR) is True
    assert wu.check_fsdp_traffic(0.5519, 3 * one_pass(), 14e9, 64, NDR) is True
    with pytest.raises(NotYet, match="`fsdp_s` = 1.1 is not right"):
        wu.check_fsdp_traffic(0.55, 2 * 0.55, 14e9, 64, NDR)
    # F19: a row of the table in place of the table is one line on its input, no defect of the kit
    with pytest.raises(WorkshopError, match="`breakdown` should be the table") as caught:
        wu.check_next_fix("backward_ms", 1.25, PHASES.iloc[-1])
    assert type(caught.value) is WorkshopError


# ---------------------------------------------------------------- the sixth review's findings (R6)

MATMUL_N, MATMUL_S = 1024, 0.02  # a CPU's multiply of the exercise: 0.1074 TFLOP/s


def _timings(shape=(MATMUL_N, MATMUL_N), dtype=torch.float32) -> Timings:
    return Timings(seconds=np.full(10, MATMUL_S), output_shape=shape, output_dtype=dtype)


def _matmul(timings, seconds=MATMUL_S, n=MATMUL_N, **given):
    return wu.check_matmul_tflops(2 * MATMUL_N**3 / MATMUL_S / 1e12, n, seconds, "x86_64", timings=timings, **given)


def _mfu(timings, seconds=MATMUL_S, n=MATMUL_N):  # 1.3 on a CPU, 1.1 and 1.2 right but for what is changed
    rate = 2 * MATMUL_N**3 / MATMUL_S / 1e12
    return wu.check_mfu(0.05 / rate, 0.05, "x86_64", "fp32", rate, flops_per_sample=5e7, samples_per_s=1000.0, n=n,
                        timings=timings, seconds=seconds)


def test_r6_f1_time_repeats_keeps_the_dtype_of_what_it_timed():
    x = torch.ones(8, 8, dtype=torch.bfloat16)
    assert wu.time_repeats(lambda: x @ x, repeats=2).output_dtype == torch.bfloat16
    assert wu.time_repeats(lambda: None, repeats=2).output_dtype is None


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float64])
def test_r6_f1_1_2_refuses_timings_of_a_multiply_in_another_dtype(dtype, capsys):
    a, b = torch.randn(MATMUL_N, MATMUL_N), torch.randn(MATMUL_N, MATMUL_N)
    other = str(dtype).removeprefix("torch.")
    said(refusal(lambda: _matmul(_timings(dtype=dtype), timed=lambda: a @ b)),
         [f"`timings` measured a function that returned a {other} result, not the 1024 x 1024 float32",
          "time the product itself"], ["correct"])
    assert _matmul(_timings(), timed=lambda: a @ b) is True  # the same multiply in float32 passes


@pytest.mark.parametrize("timings, seconds", [
    (_timings(shape=(512, 512)), MATMUL_S), (_timings(shape=()), MATMUL_S), (_timings(shape=(1024, 2048)), MATMUL_S),
    (_timings(dtype=torch.bfloat16), MATMUL_S), (_timings(), None),
], ids=["512-product", "a-number", "1024x2048", "bfloat16", "seconds-none"])
def test_r6_f2_1_3_refuses_what_1_2_refuses_naming_1_2_first_in_its_words(timings, seconds):
    in_1_2 = refusal(lambda: _matmul(timings, seconds)).removeprefix("✗ Exercise 1.2: ")
    problem, fix = in_1_2.split(" Fix: ")
    said(refusal(lambda: _mfu(timings, seconds)),
         [f"✗ Exercise 1.3: Exercise 1.2, which this exercise builds on, is not right yet: {problem}",
          f"Fix: fix Exercise 1.2 first: {fix}"], ["correct"])


def test_r6_f5_1_3_says_of_a_float_n_what_1_2_says(capsys):
    for call, exercise in ((lambda: _matmul(_timings(), n=1024.0), "Exercise 1.2"),
                           (lambda: _mfu(_timings(), n=1024.0), "Exercise 1.3: Exercise 1.2, which this exercise "
                                                                  "builds on, is not right yet")):
        with pytest.raises(WorkshopError) as caught:
            call()
        said(str(caught.value), [f"{exercise}: n = 1024.0 is no matrix size."], ["smaller than"])
    assert _mfu(_timings()) is True


NOTEBOOK_05 = Path(__file__).resolve().parent.parent / "notebooks" / "05_beyond_data_parallel.ipynb"


def _exercise_05(answer: str) -> tuple[str, str, str]:
    """(its inputs' cell, the solution's cell, the check cell) of notebook 05's exercise that sets ``answer``."""
    cells = nbformat.read(NOTEBOOK_05, as_version=4).cells
    at = next(i for i, c in enumerate(cells) if "exercise" in c.metadata.get("tags", []) and f"{answer} =" in c.source)
    return cells[at - 1].source, cells[at].source, cells[at + 1].source


def _notebook_05(answer: str, cell: str | None = None) -> dict:
    """The exercise's inputs' cell, ``cell`` (the notebook's solution by default), then its check cell, run one after
    another in one namespace with IPython's history (``_ih``), as a notebook runs them."""
    inputs, solution, check = _exercise_05(answer)
    namespace = {"wu": wu, "math": math, "_ih": [""]}  # math, as an earlier cell of the notebook imports it
    checks = [line.strip().rstrip(";") for line in check.splitlines() if line.strip()]  # 5.1's cell checks twice
    for source in (inputs, solution if cell is None else cell, f"ok = all([{', '.join(checks)}])"):
        namespace["_ih"].append(source)
        exec(source, namespace)
    return namespace


GIB = ("gib_per_byte = parameters / 2**30\n"
       "zero3_share = (param_bytes + grad_bytes + optimizer_bytes) * gib_per_byte / budget_gib\n"
       "zero1_share = optimizer_bytes * gib_per_byte / (budget_gib - (param_bytes + grad_bytes) * gib_per_byte)\n")
BUBBLE = "bound = (stages - 1) / target - (stages - 1)\n"


@pytest.mark.parametrize("answer, cell, named", [
    ("zero3_gpus", GIB + "zero3_gpus, zero1_gpus = round(zero3_share), round(zero1_share)",
     "(your cell, run again on other inputs: parameters = 13,000,000,000, budget_gib = 58): `zero3_gpus` = 3: at 3 "
     "GPUs each holds"),
    ("zero3_gpus", GIB + "zero3_gpus, zero1_gpus = math.ceil(zero3_share), round(zero1_share)",
     "(your cell, run again on other inputs: parameters = 13,000,000,000, budget_gib = 58): `zero1_gpus` = 15: at 15 "
     "GPUs each holds"),
    ("microbatches", BUBBLE + "microbatches = round(bound)",
     "(your cell, run again on other inputs: stages = 6, target = 0.15): `microbatches` = 28: with m = 28 the bubble"),
    ("microbatches", BUBBLE + "microbatches = int(bound)",
     "(your cell, run again on other inputs: stages = 6, target = 0.15): `microbatches` = 28: with m = 28 the bubble"),
    ("microbatches", BUBBLE + "microbatches = bound",
     "(your cell, run again on other inputs: stages = 6, target = 0.15): `microbatches` = 28.333333333333336 is not a "
     "whole number"),
], ids=["5.1-round", "5.1-zero1-round", "5.3-round", "5.3-int", "5.3-no-ceiling"])
def test_r6_f3_a_rounding_right_by_chance_is_refused_on_other_inputs(answer, cell, named):
    said(refusal(lambda: _notebook_05(answer, cell)), [f"✗ Exercise 5.{1 if 'gpus' in answer else 3} {named}"],
         ["correct"])


@pytest.mark.parametrize("answer, cell", [
    ("zero3_gpus", None), ("microbatches", None),  # the notebook's own solutions
    ("zero3_gpus", GIB + "zero3_gpus, zero1_gpus = math.ceil(zero3_share), math.ceil(zero1_share)"),
    ("zero3_gpus", GIB + "zero3_gpus, zero1_gpus = -(-zero3_share // 1), -(-zero1_share // 1)"),
    ("zero3_gpus", GIB + "zero3_gpus, zero1_gpus = np.ceil(zero3_share), np.ceil(zero1_share)"),
    ("zero3_gpus", GIB + "zero3_gpus = next(p for p in range(1, 1000) if zero3_share / p * budget_gib <= "
                         "budget_gib)\nzero1_gpus = 1\nwhile (param_bytes + grad_bytes) * gib_per_byte + "
                         "optimizer_bytes * gib_per_byte / zero1_gpus > budget_gib:\n    zero1_gpus += 1"),
    ("microbatches", BUBBLE + "microbatches = math.ceil(bound)"),
    ("microbatches", BUBBLE + "microbatches = -(-bound // 1)"),
    ("microbatches", "microbatches = math.ceil((stages - 1) * (1 - target) / target)"),
    ("microbatches", "microbatches = next(m for m in range(1, 10**6) if (stages - 1) / (m + stages - 1) <= target)"),
], ids=["5.1-solution", "5.3-solution", "5.1-ceil", "5.1-floor-division", "5.1-np-ceil", "5.1-loops", "5.3-ceil",
        "5.3-floor-division", "5.3-ceil-of-another-form", "5.3-counting-up"])
def test_r6_f3_a_right_method_passes_run_again(answer, cell):
    assert _notebook_05(answer, "import numpy as np\n" + (cell or _exercise_05(answer)[1]))["ok"] is True


def test_r6_f4_4_1_a_list_of_rows_is_no_sweep_table():
    rows = LOADER.to_dict("records")
    with pytest.raises(WorkshopError, match=r"Exercise 4.1: `loader_sweep` should be the sweep's table, got a list") \
            as caught:
        wu.check_loader_choice(loader_choice(), rows, 0)
    assert type(caught.value) is WorkshopError and "the check itself failed" not in str(caught.value)


def test_r6_f7_a_pass_line_shows_no_minus_zero(capsys):
    assert wu.check_lost_fraction(-0.0, torch.rand(100, generator=torch.Generator().manual_seed(0)) + 1) is True
    said(capsys.readouterr().out, ["(0% of the non-zero gradients"], ["-0%"])


def test_r6_f7_a_tiny_mfu_is_shown_to_two_significant_digits(capsys):
    tiny = 0.0008 / 67.0  # 0.0012% of an H100's float32 peak
    assert wu.check_mfu(tiny, 0.0008, "NVIDIA H100 80GB HBM3", "fp32", 50.0) is True
    said(capsys.readouterr().out, ["MFU 0.0012% of the data-sheet peak"], ["MFU 0.0%"])
    assert wu.check_mfu(0.3, 20.1, "NVIDIA H100 80GB HBM3", "fp32", 50.0) is True  # from 1% on, one decimal
    said(capsys.readouterr().out, ["MFU 30.0% of the data-sheet peak"], [])


def test_r6_f7_a_speed_up_given_to_two_digits_is_shown_with_two(capsys):
    sweep = loader_sweep([(0, False, 500.0, 127.0, 0.2), (2, False, 702.0, 120.0, 0.02)])  # 1.404x measured

    def two_digits(sweep, start):  # the speed-up rounded to two significant digits, 1.4
        workers, speedup, bound = loader_choice()(sweep, start)
        return workers, float(f"{speedup:.2g}"), bound

    assert wu.check_loader_choice(two_digits, sweep, 0) is True
    said(capsys.readouterr().out, ["2 workers: 1.4x measured"], ["1.40x"])
    assert wu.check_next_fix("backward_ms", 1.4, PHASES) is True  # 1 / (0.4 + 0.3) = 1.43
    said(capsys.readouterr().out, ["twice as fast gives 1.4x"], ["1.40x"])


def _generator_step(model, images, labels, optimizer, scaler):
    yield amp_step()(model, images, labels, optimizer, scaler)


async def _coroutine_step(model, images, labels, optimizer, scaler):
    return amp_step()(model, images, labels, optimizer, scaler)


@pytest.mark.parametrize("step, named", [(_generator_step, "is a generator (its body holds yield)"),
                                         (_coroutine_step, "is a coroutine (async def)")], ids=["yield", "async"])
def test_a_function_answer_that_a_call_does_not_run_is_named_for_what_it_is(step, named):
    """Told "`amp_step` never ran the model": a generator's or a coroutine's body does not run when it is called."""
    said(refusal(lambda: wu.check_amp_step(step, CPU)), [named, "without yield or async"], ["never ran the model"])
    said(refusal(lambda: wu.check_loader_choice(step, None, 0)), [f"`loader_choice` {named}"], [])
