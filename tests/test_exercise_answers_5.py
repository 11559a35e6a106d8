"""Findings of a review of the exercise checks from their public surface, each held here as a test.

Right answers rounded to two or three significant digits that were refused: between 100 and 10,000 (300 for
304.9), landing on 1.0, 0.1 or 10 (1.0 for 1.004), or landing on a mistake's value too (0.74 for 2.3's 0.74038,
which is also the GiB/s mistake's value to two digits); an MFU built on seconds that 1.2 refused; 6.3 refusing a
right cell that reads a value from an earlier cell; a near-whole count shown as the whole number it is not; and
the smaller things (an array of three, 35.0000%, "a int", warnings printed, 19224.0 GiB,
GiB named GB). A one-element list, once accepted here too, is refused now: it is how a trailing comma
looks (tests/test_exercises_fooled.py). The inputs are those of tests/test_exercise_answers.py.
"""

from __future__ import annotations

import contextlib
import math
import re
import warnings

import numpy as np
import pandas as pd
import pytest
import torch

import workshop_utils as wu
from test_exercise_answers import CALLS, GRADS
from workshop_utils.exercises.exercise_cells import NotYet
from workshop_utils.exercises.exercise_judging import KitDefect
from workshop_utils.spine.timing import Timings
from workshop_utils.system.errors import WorkshopError


def sig(x: float, digits: int) -> float:
    return float(f"{x:.{digits}g}")


def achieved(answer, right: float):
    """Exercise 1.1 with inputs whose right rate is ``right`` TFLOP/s."""
    return wu.check_achieved_tflops(answer, right * 1e9, 1000.0)


# ---------------------------------------------------------------- D1, D2: two or three digits, at any magnitude


@pytest.mark.parametrize("right, answer", [
    (304.9, 300), (1234.5, 1230), (143.7, 140), (104.9, 100), (3049, 3000), (3049, 3.0e3), (12_345, 12_000),
    # a rounding that lands on 1.0, 0.1 or 10 keeps the digits it was rounded to (a float drops the zeros of 1.00)
    (1.004, 1.0), (1.049, 1.0), (0.1049, 0.1), (0.0996, 0.1), (9.96, 10), (0.995, 1.0), (2.04, 2.0), (20.4, 20.0),
])
def test_a_right_answer_rounded_to_two_or_three_digits_passes_at_any_magnitude(right, answer, capsys):
    assert achieved(answer, right) is True
    assert capsys.readouterr().out.startswith("✓ Exercise 1.1: correct")


@pytest.mark.parametrize("right, answer", [(143.7, 100), (3049, 3e3 + 1e3), (1.49, 1), (0.968, 1), (9.7, 10)])
def test_one_significant_digit_is_refused_at_any_magnitude(right, answer):
    with pytest.raises(NotYet, match="fewer than two significant digits|is not right"):
        achieved(answer, right)


def memory_sweep(slope: float) -> pd.DataFrame:
    sizes = np.array([32, 64, 128, 256, 512])
    return pd.DataFrame({"batch_size": sizes, "status": ["ok"] * 4 + ["out of memory at batch 512"],
                         "peak_memory_mib": 500 + slope * sizes + np.array([0.3, -0.2, 0.1, -0.1, 0.0])})


@pytest.mark.parametrize("slope", [104.9, 304.9, 1.049, 0.1049, 3049.0])
def test_4_2_takes_a_slope_rounded_to_two_digits_and_the_batch_from_it(slope):
    sweep, limit = memory_sweep(slope), 500 + slope * 400
    fitted = sweep[sweep.status == "ok"]
    right, intercept = np.polyfit(fitted.batch_size.astype(float), fitted.peak_memory_mib.astype(float), 1)
    for answer in (right, sig(right, 2), sig(right, 3)):
        assert wu.check_batch_memory(answer, int((limit - intercept) // answer), sweep, limit) is True


def test_4_2_does_not_take_a_batch_from_an_intercept_rounded_like_the_slope():
    """Rounded to the slope's two digits, an intercept near the limit moves the batch by hundreds: 7,649 as 7,600
    gave 784 where the line gives 685, past the limit and past the sweep's own out-of-memory batch (700). So the
    intercept does not carry: 1.4 and 140 (328 for 329) are refused too, as a batch the line does not give."""
    sizes = np.array([16, 32, 64, 128, 256, 512, 700])
    sweep = pd.DataFrame({"batch_size": sizes, "status": ["ok"] * 6 + ["out of memory at batch 700"],
                          "peak_memory_mib": 7649 + 0.5123 * sizes})
    assert int((8000 - 7649) // 0.5123) == 685 and int((8000 - sig(7649, 2)) // 0.51) == 784
    with pytest.raises(NotYet, match="`largest_batch` = 784 is not right: too large"):
        wu.check_batch_memory(0.51, 784, sweep, 8000)
    assert wu.check_batch_memory(0.51, int((8000 - 7649) // 0.51), sweep, 8000) is True  # the slope alone carries
    sweep = pd.DataFrame({"batch_size": sizes[:5], "status": ["ok"] * 4 + ["out of memory at batch 256"],
                          "peak_memory_mib": 144.7 + 1.383 * sizes[:5]})
    with pytest.raises(NotYet, match="`largest_batch` = 328 is not right: too small"):
        wu.check_batch_memory(1.4, 328, sweep, 600)


@pytest.mark.parametrize("intercept, limit, batch, words", [
    (9962.0, 9990.0, -834, "its sign is wrong"),  # 9,962 as 10,000: past the limit, a negative batch
    (9951.0, 10000.0, 0, "it should not be 0"),  # 9,951 as 10,000: the limit itself, no batch
    (9949.0, 10000.0, 8333, "too large"),  # 9,949 as 9,900: twice the line's 4,132
])
def test_4_2_a_batch_from_an_intercept_rounded_near_the_limit_is_refused(intercept, limit, batch, words):
    sizes = np.array([100, 200, 400, 800, 1600])
    sweep = pd.DataFrame({"batch_size": sizes, "status": ["ok"] * 5, "peak_memory_mib": intercept + 0.01234 * sizes})
    assert int((limit - sig(intercept, 2)) // 0.012) == batch
    with pytest.raises(NotYet, match=f"`largest_batch` = {batch:,} is not right: {words}"):
        wu.check_batch_memory(0.012, batch, sweep, limit)


@pytest.mark.parametrize("sweep, got", [(None, "got None"), ({"batch_size": [32]}, "got a dict"),
                                        (pd.DataFrame({"batch_size": [32]}), "got a table of columns ['batch_size']"),
                                        (pd.DataFrame(), "got a table of columns []")])
def test_4_2_a_sweep_that_is_no_sweep_table_is_named_not_called_the_kits_defect(sweep, got):
    with pytest.raises(WorkshopError, match=rf"`batch_sweep` should be the sweep's table, {re.escape(got)}") as caught:
        wu.check_batch_memory(1.4, 327, sweep, 600.0)
    assert "\n" not in str(caught.value) and "defect" not in str(caught.value)


@pytest.mark.parametrize("sizes, slope, intercept, batch", [([64, 128, 192, 256], 2.6, 100.5, 640),
                                                             ([32, 64, 128, 256], 0.7, 123.0, 1000)])
def test_4_2_an_exactly_linear_sweep_takes_the_batch_that_meets_the_limit_and_floors_one_below(sizes, slope,
                                                                                              intercept, batch):
    """Where the line meets the limit at a whole batch, the division lands a hair to either side of it (639.99999):
    the batch itself is right, and so is the notebook's own ``int((limit - intercept) // slope)``."""
    sweep = pd.DataFrame({"batch_size": sizes, "status": ["ok"] * len(sizes),
                          "peak_memory_mib": [intercept + slope * size for size in sizes]})
    limit = intercept + slope * batch
    fitted_slope, fitted_intercept = np.polyfit(np.array(sizes, float), sweep.peak_memory_mib.to_numpy(), 1)
    solution = int((limit - fitted_intercept) // fitted_slope)
    assert solution in (batch - 1, batch)
    for answer in {batch, solution}:
        assert wu.check_batch_memory(fitted_slope, answer, sweep, limit) is True
    for wrong, words in ((batch + 1, "too large"), (batch - 2, "too small")):
        with pytest.raises(NotYet, match=f"`largest_batch` = {wrong:,} is not right: {words}"):
            wu.check_batch_memory(fitted_slope, wrong, sweep, limit)


@pytest.mark.parametrize("peaks, limit, notebooks, line", [
    ([103.2, 106.4, 112.8, 125.6], 200.0, 999, 1000),  # the division lands a hair above 1000: floor gives 1000
    ([166.9658, 201.1108, 260.7987, 389.6619], 2589.4, 2479, 2480),  # measured, meeting the limit within 1e-13
])
def test_4_2_the_notebooks_floor_division_passes_where_the_division_lands_a_hair_above_the_whole_batch(
        peaks, limit, notebooks, line):
    """The notebook's ``(limit - intercept) // slope`` gave one less than floor of the division where that landed a
    hair above the whole batch, and was refused as too small (a review's finding)."""
    sweep = pd.DataFrame({"batch_size": [32, 64, 128, 256], "status": ["ok"] * 4, "peak_memory_mib": peaks})
    slope, intercept = np.polyfit(sweep.batch_size.astype(float), sweep.peak_memory_mib, 1)
    assert int((limit - intercept) // slope) == notebooks and math.floor((limit - intercept) / slope) == line
    for answer in (notebooks, line):
        assert wu.check_batch_memory(slope, answer, sweep, limit) is True
    with pytest.raises(NotYet, match=f"`largest_batch` = {line + 1:,} is not right: too large"):
        wu.check_batch_memory(slope, line + 1, sweep, limit)


def test_4_2_a_batch_past_the_limit_passes_by_no_leeway_at_large_batches():
    """The leeway for float noise is a ten-billionth of the limit in MiB, not a billionth of the batch: at a hundred
    million samples a batch whose line is over the limit by a tenth of a sample's MiB is refused."""
    sizes = np.array([1e6, 2e6, 4e6, 8e6])
    sweep = pd.DataFrame({"batch_size": sizes, "status": ["ok"] * 4, "peak_memory_mib": 100.0 + 1.7e-3 * sizes})
    limit = 100.0 + 1.7e-3 * (123_456_789 + 0.9)
    assert wu.check_batch_memory(1.7e-3, 123_456_789, sweep, limit) is True
    with pytest.raises(NotYet, match="too large"):
        wu.check_batch_memory(1.7e-3, 123_456_790, sweep, limit)


@pytest.mark.parametrize("column, cell", [("peak_memory_mib", "n/a"), ("peak_memory_mib", None),
                                          ("peak_memory_mib", math.nan), ("batch_size", pd.NA),
                                          ("batch_size", math.nan)])
def test_4_2_a_row_that_fit_without_a_number_is_named_in_one_line_not_called_the_kits_defect(column, cell):
    sweep = pd.DataFrame({"batch_size": pd.array([32, 64, 128, 256], dtype="Int64"), "status": ["ok"] * 4,
                          "peak_memory_mib": pd.array([168.0, 208.0, 364.0, 497.0], dtype=object)})
    sweep.loc[2, column] = cell
    shown = {"batch_size": "<NA>", "peak_memory_mib": repr(cell)}[column]  # a nullable int column holds nan as NA
    with pytest.raises(WorkshopError, match="a row of the sweep that fit has no finite number for its batch_size or "
                                            "peak_memory_mib: batch_size = ") as caught:
        wu.check_batch_memory(1.4, 300, sweep, 600.0)
    assert "defect" not in str(caught.value) and "\n" not in str(caught.value)
    assert f"{column} = {shown}" in str(caught.value), caught.value  # the value at fault, not a row cut short


@pytest.mark.parametrize("nudge", [0.0, 1e-7])
def test_4_2_a_flat_sweep_is_named_as_no_growth_not_judged_as_a_line(nudge):
    """A flat sweep fits a slope of float noise (2e-16), above 0: its batch of 4.6e17 was called "far too large"."""
    sweep = pd.DataFrame({"batch_size": [32, 64, 128, 256], "status": ["ok"] * 4,
                          "peak_memory_mib": [100.0, 100.0, 100.0, 100.0 + nudge]})
    with pytest.raises(WorkshopError, match="grows by less than a millionth of itself across the sweep"):
        wu.check_batch_memory(1e-9, 10**9, sweep, 600.0)


def test_4_2_says_a_small_slope_with_its_digits_and_a_limit_at_the_intercept_as_at_it_not_below(capsys):
    sizes = np.array([32, 64, 128, 256])
    sweep = pd.DataFrame({"batch_size": sizes, "status": ["ok"] * 4, "peak_memory_mib": 100.0 + 0.0049 * sizes})
    slope, intercept = np.polyfit(sizes.astype(float), sweep.peak_memory_mib, 1)
    assert wu.check_batch_memory(slope, int((600 - intercept) // slope), sweep, 600.0) is True
    assert "(0.0049 MiB per sample;" in capsys.readouterr().out  # was 0.00
    with pytest.raises(NotYet, match="MiB is at the line's intercept"):
        wu.check_batch_memory(slope, 0, sweep, intercept)


def test_4_2_no_batch_below_0_passes_where_the_line_meets_the_limit_at_batch_0():
    """A limit a hair above the intercept meets the line at batch 0: 0 passes, and the one below it (-1) passed too."""
    sweep = pd.DataFrame({"batch_size": [32, 64, 128, 256], "status": ["ok"] * 4,
                          "peak_memory_mib": [164.0, 228.0, 356.0, 612.0]})
    assert wu.check_batch_memory(2.0, 0, sweep, 100.0 + 1e-8) is True
    with pytest.raises(NotYet, match="`largest_batch` = -1 is not right"):
        wu.check_batch_memory(2.0, -1, sweep, 100.0 + 1e-8)


def test_4_2_a_sweep_of_one_batch_size_measured_twice_is_named_in_one_line():
    """Two rows of one batch size give no line: named as the sweep's, not numpy's RankWarning nor the kit's defect."""
    sweep = pd.DataFrame({"batch_size": [64, 64, 512], "status": ["ok", "ok", "out of memory at batch 512"],
                          "peak_memory_mib": [200.0, 201.0, 0.0]})
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(WorkshopError, match="only 1 batch size fit, and a line needs two") as caught:
            wu.check_batch_memory(1.0, 10, sweep, 823.0)
    assert "defect" not in str(caught.value)


def test_4_2_shows_the_lines_slope_with_its_four_digits():
    """1.0004 shown as "1" read as a slope of exactly one MiB a sample."""
    sizes = np.array([64, 128, 256])
    sweep = pd.DataFrame({"batch_size": sizes, "status": ["ok"] * 3, "peak_memory_mib": 100.0 + 1.0004 * sizes})
    with pytest.raises(NotYet, match=re.escape("+ 1.000 MiB x b <= 1,000 MiB")):
        wu.check_batch_memory(1.0004, 3, sweep, 1000.0)


def bf16(value: float) -> torch.Tensor:
    return torch.tensor(value, dtype=torch.bfloat16)


def test_a_mistake_held_in_bf16_where_the_answer_in_bf16_is_the_same_value_is_refused():
    """Why the right value held in bf16 passes in 2.3 alone, not everywhere: bf16 keeps about 0.4%, and mistakes that
    close land on the answer's own bf16 value (a review tried the rule everywhere): 5.2 without the latency term on
    the notebook's own inputs, 3.1 with the zeros in the denominator, 4.3 with f over the parts' sum."""
    ib, sent, gpus = wu.LINKS["ib_ndr"], 2 * 7e9, 64
    pass_s = (gpus - 1) / gpus * sent / (ib.bandwidth_gbps * 1e9)  # the ring's bandwidth term, no latency
    assert bf16(2 * pass_s) == bf16(2 * (pass_s + (gpus - 1) * ib.latency_us * 1e-6))
    with pytest.raises(NotYet):
        wu.check_fsdp_traffic(bf16(2 * pass_s), bf16(3 * pass_s), sent, gpus, ib)
    grads = torch.full((200_000,), 1e-3)
    grads[:26756], grads[26756:27154] = 1e-9, 0.0
    assert bf16(26756 / 200_000) == bf16(26756 / (200_000 - 398))
    with pytest.raises(NotYet):
        wu.check_lost_fraction(bf16(26756 / 200_000), grads)
    breakdown = pd.DataFrame([{"data_ms": 1.2, "forward_ms": 18.4, "backward_ms": 40.7, "optimizer_ms": 4.9,
                               "step_ms": 65.5}])
    share = 40.7 / (1.2 + 18.4 + 40.7 + 4.9)
    assert bf16(1 / (1 - share / 2)) == bf16(1 / (1 - 40.7 / 65.5 / 2))
    with pytest.raises(NotYet):
        wu.check_next_fix("backward_ms", bf16(1 / (1 - share / 2)), breakdown)


@pytest.mark.parametrize("overflowed", [torch.tensor(70000.0, dtype=torch.float16), -np.float16(np.inf),
                                        torch.tensor([70000.0], dtype=torch.float16)])
def test_an_answer_that_overflowed_float16_is_told_so_not_to_take_item(overflowed):
    """inf from float16 was told "a tensor's .item() gives one": its .item() is inf too."""
    with pytest.raises(NotYet, match="is -?inf: float16 holds at most 65,504") as caught:
        achieved(overflowed, 0.5)
    assert ".item()" not in str(caught.value)
    with pytest.raises(NotYet, match=r"is inf\. Fix"):  # bfloat16 reaches float32's range: an inf there is no overflow
        achieved(torch.tensor(math.inf, dtype=torch.bfloat16), 0.5)


@pytest.mark.parametrize("flops, samples_per_s, named", [("x", 5.0, "the run's flops_per_sample = 'x'"),
                                                          (1e9, True, "the run's samples_per_s = True"),
                                                          (1e9, -2.0, "the run's samples_per_s = -2.0")])
def test_1_1_a_run_number_that_is_none_is_named_with_its_value_in_one_line(flops, samples_per_s, named):
    """The run's numbers are the kit's inputs, read as 2.3 reads its cell's: named with their value, never judged."""
    with pytest.raises(WorkshopError, match=re.escape(f"{named} should be a number above 0")) as caught:
        wu.check_achieved_tflops(1.0, flops, samples_per_s)
    assert "\n" not in str(caught.value) and "rerun the training cell" in str(caught.value)


def test_a_refused_value_is_never_shown_as_a_value_that_passes():
    """np.float16(1.27) is 1.2695...: refused, it read "`achieved_tflops` = 1.27 is not right" while 1.27 passes."""
    assert achieved(1.27, 1.2666) is True
    with pytest.raises(NotYet, match=r"`achieved_tflops` = 1\.2695312 is not right: slightly too large") as caught:
        achieved(np.float16(1.27), 1.2666)
    assert "= 1.27 " not in str(caught.value)


def loader_sweep(fastest_samples: float) -> pd.DataFrame:
    """A loader sweep whose fastest row (2 workers) is ``fastest_samples`` against the start's 485.7."""
    return pd.DataFrame({"num_workers": [0, 0, 2, 2], "pin_memory": [False, True, False, True],
                         "samples_per_s": [485.7, 480.1, fastest_samples, 470.0],
                         "data_wait_fraction": [0.0644, 0.065, 0.0098, 0.01]})


def rounded_choice(digits: int | None):
    def loader_choice(sweep, start):
        fastest = sweep.loc[sweep.samples_per_s.idxmax()]
        speedup, bound = fastest.samples_per_s / start.samples_per_s, 1 / (1 - start.data_wait_fraction)
        return (int(fastest.num_workers), *(round(x, digits) if digits else x for x in (speedup, bound)))
    return loader_choice


@pytest.mark.parametrize("digits", [None, 2, 3, 4])
def test_4_1_a_speedup_that_rounds_to_1_0_is_right_not_the_speedup_over_another_row(digits, capsys):
    """The fastest row 0.39% faster than the start: round(measured_speedup, 2) is 1.0, the right value to two
    decimals, and also the fastest row's speed-up over itself, a mistake's value: the right reading wins."""
    assert wu.check_loader_choice(rounded_choice(digits), loader_sweep(487.6), 0) is True
    assert "another row" not in capsys.readouterr().out


def test_4_1_with_the_start_the_fastest_row_takes_answers_rounded_to_two_digits():
    sweep = loader_sweep(473.3)  # the start (485.7) is the fastest: speed-up 1.0, Amdahl's bound 1.0688 -> 1.1
    def two_digits(sweep, start):
        workers, speedup, bound = rounded_choice(None)(sweep, start)
        return workers, sig(speedup, 2), sig(bound, 2)

    assert two_digits(sweep, sweep.iloc[0])[1:] == (1.0, 1.1)
    assert wu.check_loader_choice(two_digits, sweep, 0) is True


# ---------------------------------------------------------------- D3: a rounding that is also a mistake's value


@pytest.mark.parametrize("answer", [0.74, 0.740, 0.7404, 0.74038])
def test_2_3_the_reference_runs_efficiency_rounded_to_two_digits_passes(answer, capsys):
    """Step 4.70 ms, 9.4 MiB of gradients: right 0.74038; 0.74 is also the GiB/s mistake's value to two digits."""
    assert wu.check_ddp_efficiency(answer, 0.0047, int(9.4 * 2**20), world_size=64) == pytest.approx(0.74038,
                                                                                                      abs=1e-5)
    assert "✓ Exercise 2.3: correct (74.0%" in capsys.readouterr().out


@pytest.mark.parametrize("step_s, grad_bytes", [(0.0123, 4 * 620_362), (0.05, 4 * 11_689_512),
                                                (0.35, 4 * 25_557_032 * 4)])
def test_2_3_two_and_three_digits_pass_at_other_inputs(step_s, grad_bytes):
    link = wu.LINKS["ib_ndr"]
    right = step_s / (step_s + sum(126 * link.latency_us * 1e-6 + 126 / 64 * b / (link.bandwidth_gbps * 1e9)
                                   for b in wu.ddp_buckets(grad_bytes)))
    for digits in (2, 3):
        assert wu.check_ddp_efficiency(sig(right, digits), step_s, grad_bytes, world_size=64) == pytest.approx(right)


def test_2_3_a_mistake_unrounded_is_still_named():
    link = wu.LINKS["ib_ndr"]
    gib = 0.0047 / (0.0047 + sum(126 * link.latency_us * 1e-6 + 126 / 64 * b / (link.bandwidth_gbps * 2**30)
                                 for b in wu.ddp_buckets(int(9.4 * 2**20))))
    with pytest.raises(NotYet, match="GiB/s"):
        wu.check_ddp_efficiency(gib, 0.0047, int(9.4 * 2**20), world_size=64)


# A CPU's timings, as the review measured them: a median of 0.02007 s.
N = 1024
SECONDS = np.array([0.02283084, 0.01681373, 0.0228181, 0.01971608, 0.01451605, 0.02308368, 0.02005621, 0.02020485,
                    0.02008047, 0.0171257])
TIMED = Timings(seconds=SECONDS, output_shape=(N, N))
FLOPS, SAMPLES_PER_S = 123_456_789.0, 2345.678
ACHIEVED = FLOPS * SAMPLES_PER_S / 1e12


def matmul(seconds, rate=None):
    rate = 2 * N**3 / seconds / 1e12 if rate is None else rate
    return wu.check_matmul_tflops(rate, N, seconds, None, timings=TIMED)


def mfu(seconds, rate=None):
    rate = 2 * N**3 / seconds / 1e12 if rate is None else rate
    return wu.check_mfu(ACHIEVED / rate, ACHIEVED, "cpu", "fp32", rate, flops_per_sample=FLOPS,
                        samples_per_s=SAMPLES_PER_S, n=N, timings=TIMED, seconds=seconds)


def test_1_2_takes_seconds_rounded_to_two_digits_though_a_mistake_rounds_alike():
    assert matmul(0.02) is True and matmul(round(TIMED.median, 4)) is True


@pytest.mark.parametrize("seconds, rate", [
    (0.02, None), (0.0201, None), (round(TIMED.median, 5), None), (0.02, 0.1),  # a rate 1.2 refuses
    (0.03, None), (float(SECONDS.mean()), None), (float(SECONDS.sum()), None), (1e3 * TIMED.median, None),
])
def test_1_3_builds_on_exactly_what_1_2_accepts(seconds, rate):
    """1.2 refused 0.02 s while 1.3 accepted an MFU built on it: now both take it, and what 1.2 refuses, 1.3 sends
    back to 1.2 ("fix Exercise 1.2 first")."""
    try:
        right_in_1_2 = matmul(seconds, rate) is True
    except NotYet:
        right_in_1_2 = False
    if right_in_1_2:
        assert mfu(seconds, rate) is True
    else:
        with pytest.raises(NotYet, match="fix Exercise 1.2 first"):
            mfu(seconds, rate)


@pytest.mark.parametrize("digits", [2, 3])
def test_1_4_a_formula_rounded_to_two_or_three_digits_passes_at_both_sizes(digits, capsys):
    def rounded(parameters, layers, width, sequence):
        return sig(6 * parameters + 12 * layers * width * sequence, digits)

    assert wu.check_flops_per_token(rounded, 842_496, wu.GPT_SIZES["tiny"], 128, 5_701_632.0) is True


# ---------------------------------------------------------------- D5: 6.3 run again on another job

USAGE = dict(cpu_time_s=61.3, elapsed_s=131.0, cpus=1, time_limit_s=600, gpus=0, max_rss_mib=1517.0)
SOLVED = ('cpu_efficiency = usage["cpu_time_s"] / (usage["elapsed_s"] * usage["cpus"])\n'
          'time_share = usage["elapsed_s"] / usage["time_limit_s"]\n'
          'gpu_hours = usage["elapsed_s"] * usage["gpus"] / 3600\n'
          'next_time_limit_s = 60 * math.ceil(1.5 * usage["elapsed_s"] / 60)\n'
          'next_memory_mib = 100 * math.ceil(1.25 * usage["max_rss_mib"] / 100)\n')
CHECK = "ok = wu.check_job_usage(cpu_efficiency, time_share, gpu_hours, next_time_limit_s, next_memory_mib, usage)"


def notebook(*cells: str) -> dict:
    """The cells run one after another in one namespace, with IPython's history (``_ih``), then 6.3's check."""
    namespace = {"usage": dict(USAGE), "math": math, "wu": wu, "_ih": ["", "usage = lesson.usage(job)"]}
    for cell in (*cells, CHECK):
        namespace["_ih"].append(cell)
        exec(cell, namespace)
    return namespace


@pytest.mark.parametrize("earlier, old, new, name", [
    ("cpus = usage['cpus']", 'usage["cpus"]', "cpus", "cpus"),
    ("limit_s = usage['time_limit_s']", 'usage["time_limit_s"]', "limit_s", "limit_s"),
])
def test_6_3_a_right_cell_that_reads_an_earlier_cells_value_passes_judged_on_this_job(earlier, old, new, name,
                                                                                     capsys):
    assert notebook(earlier, SOLVED.replace(old, new))["ok"] is True
    said = capsys.readouterr().out
    assert said.startswith("✓ Exercise 6.3: correct") and "judged on this job alone" in said
    assert f"reads `{name}` from an earlier cell" in said


def test_6_3_a_cell_of_usage_alone_is_still_run_on_another_job():
    with pytest.raises(NotYet, match="run on another job.*`cpu_efficiency` = 4.8: "):
        notebook(SOLVED.replace(' * usage["cpus"]', ""))


def test_6_3_numbers_typed_in_from_the_replayed_job_are_refused_as_not_computed():
    typed = ("cpu_efficiency, time_share, gpu_hours = 0.468, 0.218, 0\n"  # a review: passed as correct
             "next_time_limit_s, next_memory_mib = 240, 1900\n")
    with pytest.raises(NotYet, match="same five answers for another job .* typed-in numbers, not arithmetic on "
                                     "`usage`"):
        notebook(typed)
    assert notebook(SOLVED)["ok"] is True  # the arithmetic, whose answers move with the job


def test_6_3_a_request_in_whole_gib_is_refused_in_mib():
    with pytest.raises(NotYet, match="`next_memory_mib` = 2: .*MiB"):
        wu.check_job_usage(61.3 / 131, 131 / 600, 0, 240, math.ceil(1.25 * 1517 / 1024), usage=USAGE, cell="")


# ---------------------------------------------------------------- D11 and the smaller findings


@pytest.mark.parametrize("call, shown", [
    (lambda: CALLS["5.3"](microbatches=62.99999999999999), "`microbatches` = 62.99999999999999 is not a whole number"),
    (lambda: CALLS["5.1 zero3"](gpus=3.000000000001), "`zero3_gpus` = 3.000000000001 is not a whole number"),
])
def test_a_near_whole_count_is_shown_as_given(call, shown):
    with pytest.raises(NotYet) as caught:
        call()
    assert shown in str(caught.value)


@pytest.mark.parametrize("container", [np.array, torch.tensor, list])
def test_4_1_three_answers_in_an_array_pass_as_in_a_tuple(container):
    def loader_choice(sweep, start):
        fastest = sweep.loc[sweep.samples_per_s.idxmax()]
        return container([float(fastest.num_workers), fastest.samples_per_s / start.samples_per_s,
                          1 / (1 - start.data_wait_fraction)])

    assert wu.check_loader_choice(loader_choice, loader_sweep(487.6), 0) is True


def test_3_1_shows_a_share_to_three_digits(capsys):
    CALLS["3.1"]()
    said = capsys.readouterr().out
    assert "0000%" not in said and "% of the non-zero gradients" in said
    lost = (GRADS[GRADS != 0].half() == 0).double().mean().item()
    assert f"{100 * lost:.3g}%" in said or f"{100 * lost:.2g}%" in said


@pytest.mark.parametrize("answer, words", [(10**400, "got an int"), (np.array("0.29"), "got text ('0.29')"),
                                           (np.array(0.29, dtype=object), "= 0.29 is not right")],
                         ids=["huge-int", "array-of-text", "array-of-objects"])
def test_a_kind_is_named_with_its_article(answer, words):
    with pytest.raises(NotYet) as caught:
        wu.check_next_fix(answer, 1.46, pd.DataFrame({"step_ms": [120.3], "data_ms": [2.9], "backward_ms": [75.9]}))
    said = str(caught.value) if isinstance(answer, int) else None
    if said is None:
        with pytest.raises(NotYet) as caught:
            CALLS["1.1"](achieved_tflops=answer)
        said = str(caught.value)
    assert words in said and " a int" not in said and " a array" not in said


@pytest.mark.parametrize("answer", [torch.tensor(3.0, requires_grad=True), np.complex128(3), np.ma.masked],
                         ids=["tensor-with-gradient", "complex", "masked"])
def test_5_1_an_odd_answer_prints_no_warning(answer):
    with warnings.catch_warnings(record=True) as shown:
        warnings.simplefilter("always")
        with pytest.raises(NotYet) if not torch.is_tensor(answer) else contextlib.nullcontext():
            CALLS["5.1 zero3"](gpus=answer)  # 3, the right count, in a tensor that requires its gradient
    assert not shown, [str(w.message) for w in shown]


def test_2_4_a_micro_batch_far_too_large_shows_its_gib_to_read():
    with pytest.raises(NotYet) as caught:
        CALLS["2.4"](micro_batch=32_768)
    assert "32,768 sequences keep 19,224 GiB" in str(caught.value)


# ---------------------------------------------------------------- 3.1 and 3.2 handed their gradients in another holder

HELD = {"parameters": torch.tensor([0.25, 1e-9, 0.0]), "activations": torch.tensor([1e-9, 3e-8, 1e-4, 0.5])}


@pytest.mark.parametrize("call, said", [
    # a review: "no non-zero gradient to judge against" and "the largest gradient is nan", both untrue
    (lambda: wu.check_lost_fraction(0.5, HELD), "`gradients` should be one tensor of gradients, got a dict of 2 "
                                                "tensors"),
    (lambda: wu.check_lost_fraction(0.5, "activation_grads"), "should be one tensor of gradients, got text"),
    (lambda: wu.check_safe_loss_scale(2.0 ** 16, None), "should be tensors of gradients (the dict `grads`), got None"),
    (lambda: wu.check_safe_loss_scale(2.0 ** 16, {"activations": "0.5"}), "got a dict."),
])
def test_3_1_and_3_2_name_a_holder_of_gradients_they_cannot_read(call, said):
    with pytest.raises(WorkshopError) as caught:
        call()
    assert said in str(caught.value) and "\n" not in str(caught.value)


def test_3_1_and_3_2_read_gradients_as_an_array_or_a_list_of_tensors():
    activations = HELD["activations"]
    lost = float((activations[activations != 0].half() == 0).double().mean())
    assert wu.check_lost_fraction(lost, activations.numpy()) is True
    assert wu.check_safe_loss_scale(2.0 ** 16, list(HELD.values())) is True  # 0.5 x 2^17 would round to inf


# ---------------------------------------------------------------- 3.2 run again on other gradients

# the largest, 0.4015, is a parameter's and 65,504 / 0.4015 = 2^17.32: rounding the exponent gives the floor here
GRADIENTS_32 = {"parameters": torch.tensor([0.4015, 1e-3]), "activations": torch.tensor([0.02, 3e-9])}
SCALE_SOLVED = ("largest = max(g.max().item() for g in grads.values())\n"
                "safe_scale = 2.0 ** math.floor(math.log2(torch.finfo(torch.float16).max / largest))")


def scale_notebook(*cells: str, grads=GRADIENTS_32, **values) -> dict:
    """The cells, then 3.2's check, run one after another in one namespace with IPython's history (``_ih``)."""
    namespace = {"grads": dict(grads), "math": math, "torch": torch, "wu": wu, **values,
                 "activation_grads": GRADIENTS_32["activations"], "_ih": ["", "grads = wu.capture_gradients(...)"]}
    for cell in (*cells, "ok = wu.check_safe_loss_scale(safe_scale, grads)"):
        namespace["_ih"].append(cell)
        exec(cell, namespace)
    return namespace


@pytest.mark.parametrize("cell", [
    SCALE_SOLVED.replace("math.floor(", "round("),  # a review: passed whenever the exponent's fraction was below .5
    SCALE_SOLVED.replace("torch.finfo(torch.float16).max", "65536"),
    SCALE_SOLVED.replace("max(g.max().item() for g in grads.values())", "grads['parameters'].max().item()"),
])
def test_3_2_a_method_right_by_chance_is_refused_on_other_gradients(cell):
    with pytest.raises(NotYet, match=r"\(your cell, run again on other gradients: the largest 0.5, an activation's\)"
                                     r": `safe_scale` = 131072: .* rounds to inf"):
        scale_notebook(cell)


@pytest.mark.parametrize("cell", [
    SCALE_SOLVED,
    SCALE_SOLVED.replace("max(g.max().item() for g in grads.values())",
                         "float(torch.cat(list(grads.values())).abs().max())"),
    # what it reads from an earlier cell stays the notebook's on the other gradients: no verdict there
    "largest = max(grads['parameters'].max().item(), activation_grads.max().item())\n"
    "safe_scale = 2.0 ** math.floor(math.log2(torch.finfo(torch.float16).max / largest))",
])
def test_3_2_a_right_cell_passes_run_again(cell):
    assert scale_notebook(cell)["ok"] is True


# ---------------------------------------------------------------- 4.2 run again on another sweep

# as a CPU measures it, on one line exactly: the row over the cap lies on it too, and 600 MiB meets it at 462.03
LINE_SWEEP = pd.DataFrame({"batch_size": [32, 64, 128, 256, 512], "status": ["ok"] * 4 + [
    "over the 600 MiB memory cap at batch 512"], "peak_memory_mib": [8.03 + 1.28125 * b for b in (32, 64, 128, 256,
                                                                                                  512)]})
MEMORY_SOLVED = ("mib_per_sample, fixed_mib = np.polyfit(fitted.batch_size.astype(float), "
                 "fitted.peak_memory_mib.astype(float), 1)\n"
                 "largest_batch = int((limit_mib - fixed_mib) // mib_per_sample)")


def memory_notebook(*cells: str) -> dict:
    """The cells, then 4.2's check, run one after another in one namespace with IPython's history (``_ih``)."""
    namespace = {"np": np, "wu": wu, "batch_sweep": LINE_SWEEP, "fitted": LINE_SWEEP[LINE_SWEEP.status == "ok"],
                 "limit_mib": 600, "_ih": ["", "limit_mib = hp['memory_cap_mib']"]}
    for cell in (*cells, "ok = wu.check_batch_memory(mib_per_sample, largest_batch, batch_sweep, limit_mib)"):
        namespace["_ih"].append(cell)
        exec(cell, namespace)
    return namespace


@pytest.mark.parametrize("cell, said", [
    # a review: on a line every row lies on, each of these gave the right numbers
    (MEMORY_SOLVED.replace("fitted.", "batch_sweep."), "`mib_per_sample` = 1.951: that fits every row, "
                                                        "the one memory stopped too"),
    (MEMORY_SOLVED.replace("int((limit_mib - fixed_mib) // mib_per_sample)",
                           "round((limit_mib - fixed_mib) / mib_per_sample)"), "`largest_batch` = 501 is not right"),
    ("first, last = fitted.iloc[0], fitted.iloc[-1]\n"
     "mib_per_sample = (last.peak_memory_mib - first.peak_memory_mib) / (last.batch_size - first.batch_size)\n"
     "largest_batch = int((limit_mib - first.peak_memory_mib) // mib_per_sample) + int(first.batch_size)",
     "`mib_per_sample` = 1.232 is not right"),
    ("mib_per_sample, largest_batch = 1.28, 462", "`mib_per_sample` = 1.28 is not right"),
])
def test_4_2_a_method_right_on_one_line_is_refused_on_another_sweep(cell, said):
    assert memory_notebook(MEMORY_SOLVED)["ok"] is True
    with pytest.raises(NotYet) as caught:
        memory_notebook(cell)
    assert "(your cell, run again on another sweep: 640 MiB, batches 32 to 256)" in str(caught.value)
    assert said in str(caught.value)


def test_4_2_a_right_cell_that_reads_an_earlier_value_is_judged_on_the_notebooks_sweep_alone():
    # `cap` stays the notebook's on the other sweep, whose answers then speak for the cell only in part
    assert memory_notebook("cap = 600", MEMORY_SOLVED.replace("limit_mib - fixed_mib", "cap - fixed_mib"))["ok"]


# ---------------------------------------------------------------- mistakes a review found unnamed

@pytest.mark.parametrize("call, said", [
    # 1.3 on a device with a data-sheet peak, divided by 1.2's rate as the notebook does only without one
    (lambda: wu.check_mfu(30.0 / 45.0, 30.0, "NVIDIA H100 80GB HBM3", "fp32", 45.0),
     "`mfu` = 0.6667: that divides by your measured matmul rate; NVIDIA H100 80GB HBM3 has a data-sheet fp32 peak "
     "of 67 TFLOP/s"),
    # 6.3's time limit in minutes, where the answer is in seconds
    (lambda: wu.check_job_usage(61.3 / 131, 131 / 600, 0, 4, 1900, usage=USAGE, cell=""),
     "`next_time_limit_s` = 4: that is in minutes"),
])
def test_a_unit_or_peak_mistake_is_named(call, said):
    with pytest.raises(NotYet, match=re.escape(said)):
        call()


def test_6_3_a_job_busier_than_its_cores_passes_saying_why_it_is_above_100_percent(capsys):
    busy = dict(USAGE, cpu_time_s=1.2 * 131.0)  # threads on more cores than the job was given
    assert wu.check_job_usage(1.2, 131 / 600, 0, 240, 1900, usage=busy, cell="") is True
    said = capsys.readouterr().out
    assert "120% of 1 core(s) busy" in said and "above 100%: its threads ran on more than the 1 core(s)" in said


# ---------------------------------------------------------------- a second review of the cells run again

@pytest.mark.parametrize("run, cell", [
    # one kind of gradient alone, a limit typed in, rounding where ceil is asked (a review: each passed)
    (lambda cell: scale_notebook(cell, grads={"parameters": torch.tensor([0.02]), "activations": torch.tensor([
        0.4015])}), SCALE_SOLVED.replace("max(g.max().item() for g in grads.values())",
                                         "grads['activations'].max().item()")),
    (lambda cell: memory_notebook(cell), MEMORY_SOLVED.replace("limit_mib - fixed_mib", "600 - fixed_mib")),
    (lambda cell: notebook(cell), SOLVED.replace('100 * math.ceil(1.25 * usage["max_rss_mib"] / 100)',
                                                 'round(1.25 * usage["max_rss_mib"], -2)')),
    (lambda cell: notebook(cell), SOLVED.replace('60 * math.ceil(1.5 * usage["elapsed_s"] / 60)',
                                                 '60 * (int(1.5 * usage["elapsed_s"] / 60) + 1)')),
    # a value of an earlier cell that flows into no answer is no reason to skip the second verdict
    (lambda cell: scale_notebook("device = 'cpu'", cell), "print(device)\n" + SCALE_SOLVED.replace("math.floor(",
                                                                                                  "round(")),
])
def test_a_wrong_method_is_refused_on_the_checks_second_input(run, cell):
    with pytest.raises(NotYet, match=r"run again on (an)?other|run on another job"):
        run(cell)


@pytest.mark.parametrize("cells", [
    # a function of an earlier cell that reads the notebook's gradients itself: no verdict on other gradients
    ("def biggest():\n    return max(g.max().item() for g in grads.values())",
     "safe_scale = 2.0 ** math.floor(math.log2(torch.finfo(torch.float16).max / biggest()))"),
    # the answer made a whole number in a cell of its own, after the one that computed it
    (SCALE_SOLVED, "safe_scale = int(safe_scale)"),
])
def test_a_right_answer_that_the_second_input_cannot_reach_passes(cells):
    assert scale_notebook(*cells)["ok"] is True


def test_a_cell_run_again_changes_nothing_the_attendee_has_and_waits_for_nothing(tmp_path):
    log, report = [], tmp_path / "report.md"
    cell = SCALE_SOLVED + (f"\nlog.append(largest)\nopen({str(report)!r}, 'a').write(f'{{largest}}\\n')"
                           "\ntime.sleep(0.5)")
    namespace = scale_notebook("import time", cell, log=log)
    assert namespace["ok"] is True
    # once, by the cell itself: the second run's list was a copy, its file write and its pause refused
    assert log == [pytest.approx(0.4015)] and report.read_text() == f"{log[0]}\n"


def test_6_3_a_cell_that_sets_usage_anew_is_told_to_leave_it_not_to_compute_from_it(capsys):
    assert notebook("usage = dict(usage)\n" + SOLVED)["ok"] is True
    said = capsys.readouterr().out
    assert "judged on this job alone" in said and "leave `usage` as the notebook set it" in said
    assert "compute each answer from `usage` in one cell" not in said  # which the cell already does


# ---------------------------------------------------------------- 4.3 from f rounded; a measured table with a hole

PHASES_43 = pd.DataFrame({"rung": ["baseline", "2x batch"], "step_ms": [948.0, 1809.0], "data_ms": [78.4, 19.6],
                          "forward_ms": [332.0, 462.0], "backward_ms": [514.0, 1308.0], "optimizer_ms": [19.2, 15.3]})


def amdahl_half(f: float) -> float:
    return 1 / ((1 - f) + f / 2)


@pytest.mark.parametrize("f", [0.72, 0.723, 0.7231])
def test_4_3_a_speedup_built_from_f_rounded_to_two_or_more_digits_passes(f, capsys):
    """f = 1308 / 1809 = 0.72305: an attendee who rounds f first, as any check takes a rounding, lands 0.2% off."""
    assert wu.check_next_fix("backward_ms", amdahl_half(f), PHASES_43) is True
    assert "✓ Exercise 4.3" in capsys.readouterr().out


@pytest.mark.parametrize("answer", [amdahl_half(0.7), amdahl_half(0.73), amdahl_half(0.725), 1.5625 * 0.997])
def test_4_3_a_speedup_from_f_rounded_to_one_digit_or_wrongly_is_refused(answer):
    """f = 0.7 keeps one digit of 0.723, 0.73 and 0.725 are no rounding of it, and a value near 0.72's speed-up
    that no rounded f gives is no rounding either."""
    with pytest.raises(NotYet, match=r"`step_speedup` = 1\.\d+ is not right"):
        wu.check_next_fix("backward_ms", answer, PHASES_43)


@pytest.mark.parametrize("column", ["backward_ms", "forward_ms", "step_ms"])
def test_4_3_a_hole_in_the_top_rungs_row_is_named_as_the_table_not_the_answer(column):
    """A NaN in the last row read as "takes — ms, less than another part" or as f = 1; it is the run's, not yours."""
    table = PHASES_43.copy()
    table.loc[1, column] = math.nan
    with pytest.raises(WorkshopError, match=rf"`breakdown` holds no measured number \(NaN, inf or text\) in {column} "
                                            r"of the row the exercise reads\. Fix: run the cell that made `breakdown` "
                                            "again") as caught:
        wu.check_next_fix("backward_ms", amdahl_half(1308 / 1809), table)
    assert not isinstance(caught.value, NotYet)
    table.loc[0, column] = math.nan  # the baseline's row is no input of 4.3: its holes are not read
    table.loc[1, column] = PHASES_43.loc[1, column]
    assert wu.check_next_fix("backward_ms", amdahl_half(1308 / 1809), table) is True


@pytest.mark.parametrize("column, hole", [("samples_per_s", math.nan), ("data_wait_fraction", math.nan),
                                          ("samples_per_s", "100"), ("data_wait_fraction", math.inf)])
def test_4_1_a_hole_in_the_starting_row_is_named_as_the_table_not_as_the_answers_nan(column, hole):
    """A NaN in the starting row was told "`measured_speedup` is nan"; text there, "your code raised TypeError"."""
    sweep = loader_sweep(520.0).astype({column: object})
    sweep.loc[0, column] = hole
    with pytest.raises(WorkshopError, match=rf"`loader_sweep` holds no measured number \(NaN, inf or text\) in "
                                            f"{column} of the row the exercise reads") as caught:
        wu.check_loader_choice(rounded_choice(None), sweep, 0)
    assert not isinstance(caught.value, NotYet)


def test_4_1_a_row_without_a_measurement_is_no_candidate_for_the_fastest():
    """A sweep row whose run measured nothing (NaN) is passed over, as idxmax passes it over; the rest is judged."""
    sweep = loader_sweep(520.0)
    sweep.loc[3, "samples_per_s"] = math.nan
    assert wu.check_loader_choice(rounded_choice(None), sweep, 0) is True


@pytest.mark.parametrize("start", ["0", None, 0.5, -1, True])
def test_4_1_a_starting_row_that_is_no_worker_count_is_named_so(start):
    """"0" was told "no row of the table has 0 workers, unpinned", beside a row of 0 workers, unpinned."""
    with pytest.raises(WorkshopError, match=r"the starting row's workers should be a whole number, got ") as caught:
        wu.check_loader_choice(rounded_choice(None), loader_sweep(520.0), start)
    assert not isinstance(caught.value, NotYet)
    assert wu.check_loader_choice(rounded_choice(None), loader_sweep(520.0), 0.0) is True


@pytest.mark.parametrize("hole", ["10", math.inf, None], ids=["text", "inf", "None"])
def test_4_3_text_or_inf_in_the_judged_row_is_the_tables_not_the_checks_failure(hole):
    """Text "10" in step_ms was a KitDefect (a division of text); inf passed with any answer near 1."""
    table = PHASES_43.astype({"step_ms": object})
    table.loc[1, "step_ms"] = hole
    with pytest.raises(WorkshopError, match=r"holds no measured number \(NaN, inf or text\) in step_ms") as caught:
        wu.check_next_fix("backward_ms", 1.0, table)
    assert not isinstance(caught.value, (NotYet, KitDefect))


@pytest.mark.parametrize("start", [torch.tensor(0), np.array(0), np.int64(0)], ids=["tensor", "array", "int64"])
def test_4_1_a_starting_worker_count_held_in_a_0d_tensor_is_read(start):
    """A 0-d tensor or array was a KitDefect ("len() of a 0-d tensor"); the kit reads numbers one way everywhere."""
    assert wu.check_loader_choice(rounded_choice(None), loader_sweep(520.0), start) is True


def test_4_3_an_empty_table_is_named_not_the_checks_failure():
    with pytest.raises(WorkshopError, match="should hold a row per rung") as caught:
        wu.check_next_fix("backward_ms", 1.5, PHASES_43.iloc[0:0])
    assert not isinstance(caught.value, KitDefect)
