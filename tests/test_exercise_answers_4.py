"""Findings of the fourth adversarial review of the exercise checks of notebooks 01-05, each held here as a test.

Wrong answers the checks accepted (Exercise 4.1 taking the row that waits least; Exercise 1.2's rate computed
from timings of another multiply), refusals that named the wrong mistake (4.3 without ``idle_ms``, 1.4's
width squared, 3.3's loss scaled by hand) and inputs that made a check fail on its own (2.3's inputs as
tensors, ``sys.exit`` in the attendee's function).
"""

from __future__ import annotations

import sys

import pandas as pd
import pytest
import torch
import torch.nn.functional as F

import workshop_utils as wu
from test_exercise_answers import COUNTED, GPT_N, GPT_T, TINY
from test_exercise_answers_3 import one_line_refusal
from workshop_utils.exercises.exercise_cells import NotYet

CPU = torch.device("cpu")


def least_waiting(sweep, start):
    """The row with the smallest data_wait_fraction taken for the fastest: on most sweeps the same row."""
    row = sweep.loc[sweep.data_wait_fraction.idxmin()]
    return int(row.num_workers), row.samples_per_s / start.samples_per_s, 1 / (1 - start.data_wait_fraction)


def test_4_1_the_row_that_waits_least_is_not_taken_for_the_fastest():
    # On the attendee's sweep the row that waits least is the fastest: only the check's own sweep tells them apart.
    sweep = pd.DataFrame({"num_workers": [0, 2, 4, 8], "pin_memory": [False] * 4,
                          "samples_per_s": [800.0, 1100.0, 1300.0, 1000.0],
                          "data_wait_fraction": [0.35, 0.10, 0.05, 0.20]})
    one_line_refusal(lambda: wu.check_loader_choice(least_waiting, sweep, 0), "second sweep",
                     "`best_workers` = 8 is not the num_workers of the fastest row")


def test_1_2_timings_of_another_multiply_are_refused_whatever_the_stopwatch_says():
    n = 1024
    a, b = torch.randn(512, 512), torch.randn(512, 512)  # an earlier run of the cell, at another size

    def matmul():
        return a @ b

    stale = wu.time_repeats(matmul, repeats=3)
    a, b = torch.randn(n, n), torch.randn(n, n)  # remade: matmul now multiplies the exercise's matrices
    seconds = stale.median
    one_line_refusal(lambda: wu.check_matmul_tflops(2 * n**3 / seconds / 1e12, n, seconds, "x86_64", CPU,
                                                    timings=stale, timed=matmul),
                     "512 x 512 result", "another workload")
    thin = wu.time_repeats(lambda: a @ torch.randn(n, 64), repeats=3)
    one_line_refusal(lambda: wu.check_matmul_tflops(2 * n**3 / thin.median / 1e12, n, thin.median, "x86_64", CPU,
                                                    timings=thin, timed=matmul), "1024 x 64 result")


def test_1_2_timings_keep_the_shape_of_what_was_timed_and_nothing_else():
    x = torch.randn(8, 3)
    assert wu.time_repeats(lambda: x @ x.T, repeats=2).output_shape == (8, 8)
    assert wu.time_repeats(lambda: x.sum(), repeats=2).output_shape == ()
    assert wu.time_repeats(lambda: None, repeats=2).output_shape is None


def test_4_3_leaving_idle_out_is_refused_at_the_last_rows_value_not_the_baselines():
    speedup = 1 / ((1 - 20 / 80) + 20 / 80 / 2)
    breakdown = pd.DataFrame({"rung": ["baseline", "CUDA graphs"], "step_ms": [100.0, 80.0], "data_ms": [30.0, 2.0],
                              "forward_ms": [20.0, 12.0], "backward_ms": [40.0, 20.0], "optimizer_ms": [5.0, 3.0],
                              "idle_ms": [5.0, 43.0]})
    said = one_line_refusal(lambda: wu.check_next_fix("backward_ms", speedup, breakdown),
                            "backward_ms is not the top rung's largest part", "it takes 20 ms")
    assert "baseline" not in said
    # The second largest part, idle time no part of it, is no omission: it is the part that is not the largest.
    said = one_line_refusal(lambda: wu.check_next_fix("forward_ms", speedup, breakdown.assign(idle_ms=[5.0, 5.0])),
                            "is not the top rung's largest part")
    assert "only without" not in said


def test_1_4_a_mistake_hit_exactly_is_named_alone_when_another_lands_within_the_tolerance():
    # At the second configuration width squared and half of attention come within 0.1% of each other.
    def width_squared(parameters, layers, width, sequence):
        return 6 * parameters + 12 * layers * width * width

    said = one_line_refusal(lambda: wu.check_flops_per_token(width_squared, GPT_N, TINY, GPT_T, COUNTED),
                            "= 14,405,844 is not right")
    assert "causal mask" not in said and "mistakes give here" not in said


def test_1_4_sys_exit_in_the_function_is_its_line_not_an_escape():
    def exits(parameters, layers, width, sequence):
        sys.exit(1)

    with pytest.raises(NotYet) as caught:
        wu.check_flops_per_token(exits, GPT_N, TINY, GPT_T, COUNTED)
    assert "raised SystemExit" in str(caught.value) and "\n" not in str(caught.value)


def test_3_3_a_loss_scaled_by_hand_is_named_as_such():
    def by_hand(model, images, labels, optimizer, scaler):
        optimizer.zero_grad()
        with wu.autocast("fp16", CPU):
            loss = F.cross_entropy(model(images), labels)
        (loss * scaler.get_scale()).backward()
        scaler.step(optimizer)
        scaler.update()
        return loss

    one_line_refusal(lambda: wu.check_amp_step(by_hand, CPU), "Attempted step but _scale is None",
                     "scaler.step(optimizer)")


def test_2_3_the_kits_inputs_as_tensors_are_read(capsys):
    assert wu.check_ddp_efficiency(0.7673, torch.tensor(0.0123), torch.tensor(4 * 11_689_512.0), world_size=64)
    assert "✓ Exercise 2.3: correct" in capsys.readouterr().out
    one_line_refusal(lambda: wu.check_ddp_efficiency(0.7673, "fast", 1e6), "step_s = 'fast' should be a number")


def test_1_4_a_formula_that_rounds_to_three_significant_digits_passes_at_both_sizes(capsys):
    def rounded(parameters, layers, width, sequence):
        return float(f"{6 * parameters + 12 * layers * width * sequence:.3g}")

    assert wu.check_flops_per_token(rounded, GPT_N, TINY, GPT_T, COUNTED)
    assert "✓ Exercise 1.4: correct" in capsys.readouterr().out


def test_a_small_whole_answer_is_no_rounding_of_a_larger_one():
    from workshop_utils.exercises.exercise_judging import rounded_digits

    assert rounded_digits(30, 32) is None and rounded_digits(1.48e7, 14_765_268) == 3
