"""No value makes an exercise check raise anything but its one line: hypothesis over every check's answers.

Each check is called through ``CALLS`` of tests/test_exercise_answers.py, with its right answers as defaults
and one or more answer slots drawn from arbitrary values (and arbitrary functions, where the answer is a
function): any exception other than the kit's one-line ``NotYet``/``WorkshopError`` fails, ``KitDefect``
(an exception inside a check) included.
"""

from __future__ import annotations

import decimal
import math

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from test_exercise_answers import ACHIEVED, BREAKDOWN, CALLS, H100, ONE_PASS, TIMINGS, amp_with, outcome
from workshop_utils.exercises import exercise_checks
from workshop_utils.exercises.exercise_checks import KitDefect
from workshop_utils.system.errors import WorkshopError


# ---------------------------------------------------------------------- arbitrary values


def _tensor(shape, dtype, value):
    return torch.full(shape, value, dtype=torch.float64).to(dtype) if shape else torch.tensor(value).to(dtype)


class Weird:
    """An object that converts badly."""

    def __float__(self):
        raise RuntimeError("no float here")

    def __repr__(self):
        return "Weird()"


class Unprintable(Weird):
    """An object whose repr fails too (hypothesis itself shows its examples, so it is tried apart)."""

    def __repr__(self):
        raise RuntimeError("no repr either")


@pytest.mark.parametrize("name, slot", [("1.1", "achieved_tflops"), ("3.3", "amp_step"), ("4.1", "loader_choice"),
                                        ("4.3", "biggest_phase"), ("5.1 zero1", "gpus")])
def test_an_object_that_cannot_even_be_shown_is_named_by_its_type(name, slot, capsys):
    verdict, said = outcome(name, {slot: Unprintable()}, capsys)
    assert verdict == "refused" and "Unprintable" in said, said


SCALARS = st.one_of(
    st.none(), st.just(...), st.booleans(), st.integers(), st.integers(-2**70, 2**70), st.just(10**400),
    st.floats(allow_nan=True, allow_infinity=True), st.floats(-1e4, 1e4), st.text(max_size=6), st.binary(max_size=3),
    st.complex_numbers(allow_nan=True, allow_infinity=True), st.fractions(),
    st.decimals(allow_nan=True, allow_infinity=True), st.floats(allow_nan=True).map(np.float64),
    st.floats(width=32, allow_nan=True).map(np.float32), st.integers(-2**63, 2**63 - 1).map(np.int64),
    st.sampled_from([np.bool_(True), object(), print, math, {"a": 1}, (), [], np.array([]), torch.tensor([]),
                     Weird(), decimal.Decimal("sNaN"), "backward_ms", "step_ms", "backward", float("-0.0")]),
)
TENSORS = st.builds(_tensor, st.sampled_from([(), (1,), (2,), (1, 1), (0,)]),
                    st.sampled_from([torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int64,
                                     torch.uint8, torch.bool, torch.complex64]),
                    st.floats(-1e6, 1e6) | st.sampled_from([math.nan, math.inf, -math.inf, 0.0]))
def _array(shape, value, dtype):
    with np.errstate(all="ignore"):
        return np.full(shape, value).astype(dtype, casting="unsafe")


ARRAYS = st.builds(_array,
                   st.sampled_from([(), (1,), (3,)]), st.floats(allow_nan=True),
                   st.sampled_from(["float64", "float32", "int64", "bool", "complex128", "object", "U3"]))
ANYTHING = st.one_of(SCALARS, TENSORS, ARRAYS, st.lists(SCALARS, max_size=3), st.tuples(SCALARS, SCALARS),
                     st.dictionaries(st.text(max_size=3), SCALARS, max_size=2))
ERRORS = st.sampled_from([ValueError, RuntimeError, ZeroDivisionError, AssertionError, KeyError, TypeError,
                          AttributeError, IndexError, NotImplementedError, StopIteration, WorkshopError])


def _raiser(error):
    def function(*args, **kwargs):
        raise error("from the attendee's code")
    return function


def _returning(value):
    return lambda *args, **kwargs: value


FUNCTIONS = st.one_of(ANYTHING, ANYTHING.map(_returning), ERRORS.map(_raiser),
                      st.tuples(ANYTHING, ANYTHING, ANYTHING).map(_returning))
AMP_STEPS = st.one_of(FUNCTIONS, ANYTHING.map(lambda value: amp_with(returns=lambda loss: value)),
                      st.sampled_from([amp_with(after=lambda scaler: scaler.update()),
                                       amp_with(before=lambda model: model.half()),
                                       amp_with(after=lambda scaler: scaler.step(torch.optim.SGD([torch.zeros(1)]))),
                                       amp_with(context=lambda: torch.autocast("cpu", dtype=torch.bfloat16))]))

# Every check with its answer slots: the strategy each slot draws from.
FUZZED = {
    "1.1": {"achieved_tflops": ANYTHING},
    "1.2": {"matmul_tflops": ANYTHING, "seconds": ANYTHING, "timings": ANYTHING | st.just(TIMINGS),
            "timed": st.none() | FUNCTIONS, "device_name": st.sampled_from(["x86_64", H100, None]) | ANYTHING},
    "1.3": {"mfu": ANYTHING, "achieved_tflops": ANYTHING | st.just(ACHIEVED), "matmul_tflops": ANYTHING},
    "1.3 cpu": {"mfu": ANYTHING, "achieved_tflops": ANYTHING | st.just(ACHIEVED), "matmul_tflops": ANYTHING,
                "timings": ANYTHING | st.just(TIMINGS)},
    "1.4": {"flops_per_token": ANYTHING, "formula": st.none() | FUNCTIONS},
    "2.3": {"efficiency": ANYTHING | st.floats(-2, 2)},
    "2.4": {"micro_batch": ANYTHING | st.integers(-3, 200), "accumulation": ANYTHING | st.integers(-3, 9)},
    "3.1": {"lost_fraction": ANYTHING},
    "3.2": {"safe_scale": ANYTHING | st.integers(-5, 30).map(lambda k: 2.0**k)},
    "3.3": {"amp_step": AMP_STEPS},
    "4.1": {"loader_choice": FUNCTIONS},
    "4.2": {"mib_per_sample": ANYTHING, "largest_batch": ANYTHING | st.integers(-10, 1000)},
    "4.3": {"biggest_phase": ANYTHING | st.sampled_from(list(BREAKDOWN.columns)), "step_speedup": ANYTHING},
    "5.1 zero3": {"gpus": ANYTHING | st.integers(-2, 20)},
    "5.1 zero1": {"gpus": ANYTHING | st.integers(-2, 20)},
    "5.1 none": {"gpus": ANYTHING},
    "5.2": {"ddp_s": ANYTHING, "fsdp_s": ANYTHING | st.just(3 * ONE_PASS)},
    "5.3": {"microbatches": ANYTHING | st.integers(-5, 10**6)},
}


def test_every_check_of_the_exercises_is_fuzzed():
    exported = {n for n in dir(exercise_checks) if n.startswith("check_")} | {"check_ddp_efficiency"}
    called = {"check_achieved_tflops", "check_matmul_tflops", "check_mfu", "check_flops_per_token",
              "check_ddp_efficiency", "check_micro_batch_plan", "check_lost_fraction", "check_safe_loss_scale",
              "check_amp_step", "check_loader_choice", "check_batch_memory", "check_next_fix", "check_fewest_gpus",
              "check_fsdp_traffic", "check_microbatches"}
    assert exported == called and set(FUZZED) == set(CALLS)


@pytest.mark.parametrize("name", FUZZED)
def test_no_value_makes_a_check_raise_anything_but_its_one_line(name):
    slots = FUZZED[name]
    examples = 60 if name == "3.3" else 120

    @settings(max_examples=examples, deadline=None, derandomize=True,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
    @given(st.fixed_dictionaries({slot: strategy for slot, strategy in slots.items()}))
    def judged(answers):
        try:
            CALLS[name](**answers)
        except KitDefect as err:
            raise AssertionError(f"{name} {answers!r}: a check failed on its own: {err}") from err.__cause__
        except WorkshopError as err:  # NotYet, or a one-line problem with the inputs
            assert "\n" not in str(err), str(err)

    judged()
