"""One tolerance for every exercise, and the attendee's own numbers carrying from one exercise to the next.

A right answer rounded keeping two significant digits passes in every exercise (01-05 and 6.3 alike), one with
fewer is told so everywhere, and a count is right only when equal. A check that builds on an earlier answer
judges from that answer as the attendee's cell left it, as rounded as the earlier check accepted: the review
found 1.1's rate rounded to three decimals accepted, then 1.3's `mfu = achieved_tflops / peak` refused; the same
with 1.2's rounded seconds and 4.2's rounded slope.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

import workshop_utils as wu
from test_exercise_answers import (A100, ACHIEVED, BATCHES, CALLS, FLOPS, INTERCEPT, MATMUL, N, SAMPLES_PER_S, SLOPE,
                                   TIMINGS)
from workshop_utils.exercises import beyond_dp_checks
from workshop_utils.exercises.exercise_judging import SIGNIFICANT, accepted
from workshop_utils.exercises.exercise_cells import NotYet
from workshop_utils.spine.timing import Timings

ROUNDED = round(ACHIEVED, 3)  # 0.131 for 0.13083: three decimals, as 1.1 accepts it
assert not math.isclose(ROUNDED, ACHIEVED, rel_tol=1e-3), "the rounding must move the answer past the tolerance"


def passes(call) -> bool:
    assert call() is True
    return True


def test_1_3_judges_mfu_from_the_rate_1_1_accepted_rounded(capsys):
    assert passes(lambda: wu.check_achieved_tflops(ROUNDED, FLOPS, SAMPLES_PER_S))
    peak = wu.peak_tflops(A100, "fp32")
    # The solution's own line on the rounded rate, and the unrounded rates: both right.
    assert passes(lambda: CALLS["1.3"](achieved_tflops=ROUNDED, mfu=ROUNDED / peak))
    assert passes(lambda: CALLS["1.3"](achieved_tflops=ROUNDED, mfu=ACHIEVED / peak))
    assert passes(lambda: CALLS["1.3 cpu"](achieved_tflops=ROUNDED, mfu=ROUNDED / MATMUL))
    # A rate 1.1 refuses is still named as 1.1's to fix first.
    with pytest.raises(NotYet, match="from Exercise 1.1 is not right yet"):
        CALLS["1.3"](achieved_tflops=round(ACHIEVED, 1), mfu=round(ACHIEVED, 1) / peak)


def test_1_2_and_1_3_judge_from_the_seconds_as_rounded():
    timings = Timings(TIMINGS.seconds * 1.0061)  # a median of 0.0050305 s: rounded to 0.005, 0.6% off
    seconds = round(timings.median, 3)
    rate = 2 * N**3 / seconds / 1e12
    assert not math.isclose(rate, 2 * N**3 / timings.median / 1e12, rel_tol=1e-3)
    assert passes(lambda: CALLS["1.2"](timings=timings, seconds=seconds, matmul_tflops=rate))
    assert passes(lambda: CALLS["1.3 cpu"](timings=timings, seconds=seconds, matmul_tflops=rate, mfu=ACHIEVED / rate))
    # Both rounded, as 1.2 accepts them: 0.43 TFLOP/s from 0.005 s.
    assert passes(lambda: CALLS["1.2"](timings=timings, seconds=seconds, matmul_tflops=round(rate, 2)))
    assert passes(lambda: CALLS["1.3 cpu"](timings=timings, seconds=seconds, matmul_tflops=round(rate, 2),
                                           mfu=ACHIEVED / round(rate, 2)))


def test_4_2_judges_the_largest_batch_from_the_slope_as_rounded():
    slope = round(SLOPE, 2)  # 1.5 for 1.497
    largest = int((600 - INTERCEPT) // slope)
    assert largest != int((600 - INTERCEPT) // SLOPE)
    assert passes(lambda: wu.check_batch_memory(slope, largest, BATCHES, 600))
    assert passes(lambda: wu.check_batch_memory(slope, int((600 - INTERCEPT) // SLOPE), BATCHES, 600))
    with pytest.raises(NotYet, match="`largest_batch` = [0-9]+ is not right: too large"):
        wu.check_batch_memory(SLOPE, int((600 - INTERCEPT) // SLOPE) + 1, BATCHES, 600)


USAGE = {"job": "9", "elapsed_s": 97, "time_limit_s": 600, "cpus": 3, "gpus": 1, "cpu_time_s": 200.0,
         "max_rss_mib": 1000.0, "source": "made up"}
RIGHT = dict(cpu_efficiency=200 / 291, time_share=97 / 600, gpu_hours=97 / 3600, next_time_limit_s=180,
             next_memory_mib=1300)


@pytest.mark.parametrize("name", ["cpu_efficiency", "time_share", "gpu_hours"])
def test_6_3_takes_two_significant_digits_and_asks_for_two_as_01_to_05_do(name):
    two, one = float(f"{RIGHT[name]:.2g}"), float(f"{RIGHT[name]:.1g}")
    assert passes(lambda: wu.check_job_usage(**{**RIGHT, name: two}, usage=USAGE, cell=""))
    with pytest.raises(NotYet, match="fewer than two significant digits"):
        wu.check_job_usage(**{**RIGHT, name: one}, usage=USAGE, cell="")
    assert CALLS["1.1"](achieved_tflops=float(f"{ACHIEVED:.2g}")) is True  # the same rule in 01
    with pytest.raises(NotYet, match="fewer than two significant digits"):
        CALLS["1.1"](achieved_tflops=float(f"{ACHIEVED:.1g}"))


def test_a_count_is_right_only_when_equal_however_large():
    assert SIGNIFICANT == 2 and accepted(12_000, 12_345) and not accepted(12_000, 12_345, whole=True)
    with pytest.raises(NotYet):
        wu.check_job_usage(**{**RIGHT, "next_memory_mib": 1000 + 300.0001}, usage=USAGE, cell="")
    with pytest.raises(NotYet):
        CALLS["5.3"](microbatches=60)


def test_6_3_refuses_a_request_in_another_unit_by_its_value():
    with pytest.raises(NotYet, match="`next_memory_mib` = 1.3: the request is in whole 100 MiB"):
        wu.check_job_usage(**{**RIGHT, "next_memory_mib": 1.3}, usage=USAGE, cell="")  # 1300 MiB is 1.27 GiB


def test_5_1s_h100_is_the_kits_own_h100_record():
    records = sorted(Path(__file__).resolve().parent.parent.glob("results/reference/gpu/gpu_check-*h100*.json"))
    assert records, "the kit's H100 record"
    found = json.loads(records[0].read_text())
    memory = [v for v in _values(found, "memory_gib")]
    assert memory and beyond_dp_checks.H100_GIB == memory[0] == 79.2
    assert np.isclose(beyond_dp_checks.H100_GIB, 79.2)


def _values(data, key):
    if isinstance(data, dict):
        for k, v in data.items():
            yield from ([v] if k == key else _values(v, key))
    elif isinstance(data, list):
        for v in data:
            yield from _values(v, key)
