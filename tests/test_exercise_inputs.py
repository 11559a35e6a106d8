"""A check reads the notebook's values it is handed (``flops``, ``budget_gib``, ``usage``): an answer cell that
changes one of them is named in one line, instead of an answer judged against the changed value (right answers
refused, wrong ones passed). Findings of a review in which a room of attendees typed their answers; the cells run
here as IPython runs them, one after another in one namespace with its input history (``_ih``)."""

from __future__ import annotations

import math
import re
import statistics

import numpy as np
import pytest
import torch

import workshop_utils as wu
from workshop_utils.exercises.exercise_cells import NotYet, changed_input
from workshop_utils.system.errors import WorkshopError


def run_cells(*cells: str, **values):
    """The cells run as a notebook runs them; the value of the last one (the check cell), or what it raised."""
    namespace = {"wu": wu, "math": math, **values, "_ih": [""]}
    for cell in cells:
        namespace["_ih"].append(cell)
        exec(cell, namespace)
    return namespace.get("ok")


ZERO = "import math\nparameters, budget_gib = 7e9, 35\nparam_bytes, grad_bytes, optimizer_bytes = (2, 2, 12)\n"
ZERO_SOLVED = ("gib_per_byte = parameters / 2**30\n"
               "zero3_gpus = math.ceil((param_bytes + grad_bytes + optimizer_bytes) * gib_per_byte / budget_gib)\n"
               "zero1_gpus = math.ceil(optimizer_bytes * gib_per_byte / (budget_gib - (param_bytes + grad_bytes) * "
               "gib_per_byte))\n")
ZERO_CHECK = ("ok = wu.check_fewest_gpus(zero3_gpus, parameters, budget_gib, stage=3) and "
              "wu.check_fewest_gpus(zero1_gpus, parameters, budget_gib, stage=1)")
BUBBLE = "stages, target = 8, 0.10\n"
BUBBLE_SOLVED = "microbatches = 1\nwhile (stages - 1) / (microbatches + stages - 1) > target:\n    microbatches += 1\n"
BUBBLE_CHECK = "ok = wu.check_microbatches(microbatches, stages, target)"
RING = "parameters = 7e9\nn_bytes, world_size, ndr_link = 2 * parameters, 64, wu.LINKS['ib_ndr']\n"
RING_SOLVED = ("alpha, bandwidth = ndr_link.latency_us * 1e-6, ndr_link.bandwidth_gbps * 1e9\np = world_size\n"
               "one_pass = (p - 1) * alpha + (p - 1) / p * n_bytes / bandwidth\nddp_s, fsdp_s = 2 * one_pass, "
               "3 * one_pass\n")
RING_CHECK = "ok = wu.check_fsdp_traffic(ddp_s, fsdp_s, n_bytes, world_size, ndr_link)"
RATE = "samples_per_s = 638.1\n"
RATE_CHECK = "ok = wu.check_achieved_tflops(achieved_tflops, flops, samples_per_s)"
EFFICIENCY = ("gpus, link = 64, wu.LINKS['ib_ndr']\n"
              "all_reduce_s = sum(2 * (gpus - 1) * link.latency_us * 1e-6 + 2 * (gpus - 1) / gpus * bucket / "
              "(link.bandwidth_gbps * 1e9) for bucket in wu.ddp_buckets(grad_bytes))\n")
EFFICIENCY_CHECK = "ok = wu.check_ddp_efficiency(efficiency_64, step_s, grad_bytes, world_size=64)"


@pytest.mark.parametrize("cells, values, words", [
    # 5.3: the target typed in percent, then compared as a fraction (m = 1 passed) or in percent (m = 63 refused)
    ((BUBBLE + "target = 10  # percent\n" + BUBBLE_SOLVED, BUBBLE_CHECK), {}, r"changes `target` \(target = 10\)"),
    ((BUBBLE + "target = 10\n" + BUBBLE_SOLVED.replace("(stages - 1) /", "100 * (stages - 1) /"), BUBBLE_CHECK), {},
     "changes `target`"),
    # 5.1: the budget turned into bytes in place (right answers refused), or the whole card's 80 GiB
    ((ZERO + "budget_gib = budget_gib * 2**30\n" + ZERO_SOLVED.replace("/ 2**30", ""), ZERO_CHECK), {},
     r"changes `budget_gib` \(budget_gib = budget_gib \* 2\*\*30\)"),
    ((ZERO.replace("35", "80") + ZERO_SOLVED, ZERO_CHECK), {}, "`budget_gib` = 80, not the 35 the exercise gives"),
    ((ZERO + "budget_gib = 80\n" + ZERO_SOLVED, ZERO_CHECK), {}, "changes `budget_gib`"),
    # 5.2: the gradients' bytes counted in fp32 by a second line
    ((RING + "n_bytes = 4 * parameters\n" + RING_SOLVED, RING_CHECK), {}, r"changes `n_bytes` \(n_bytes = 4"),
    # 1.1: the FLOPs turned into TFLOPs in place
    (("flops = flops / 1e12\n" + RATE + "achieved_tflops = flops * samples_per_s\n", RATE_CHECK),
     {"flops": 2.462e8}, r"changes `flops` \(flops = flops / 1e12\)"),
    # 2.3: the step in milliseconds, the gradients in bf16
    (("step_s = step_s * 1e3\n" + EFFICIENCY + "efficiency_64 = step_s / (step_s + 1e3 * all_reduce_s)\n",
      EFFICIENCY_CHECK), {"step_s": 0.05, "grad_bytes": 4 * 11.2e6}, "changes `step_s`"),
    (("grad_bytes = grad_bytes / 2  # bf16\n" + EFFICIENCY + "efficiency_64 = step_s / (step_s + all_reduce_s)\n",
      EFFICIENCY_CHECK), {"step_s": 0.05, "grad_bytes": 4 * 11.2e6}, "changes `grad_bytes`"),
    (("grad_bytes //= 2\n" + EFFICIENCY + "efficiency_64 = step_s / (step_s + all_reduce_s)\n", EFFICIENCY_CHECK),
     {"step_s": 0.05, "grad_bytes": 4 * 11.2e6}, r"changes `grad_bytes` \(grad_bytes //= 2\)"),
])
def test_an_answer_cell_that_changes_an_input_is_named_not_judged(cells, values, words):
    with pytest.raises(NotYet, match=words) as caught:
        run_cells(*cells, **values)
    assert "\n" not in str(caught.value) and re.search("Fix: (set|leave) .* run", str(caught.value))


@pytest.mark.parametrize("cells, values", [
    ((ZERO + ZERO_SOLVED, ZERO_CHECK), {}),
    ((BUBBLE + BUBBLE_SOLVED, BUBBLE_CHECK), {}),
    ((RING + RING_SOLVED, RING_CHECK), {}),
    # what is computed from an input goes under a new name; an answer set twice is no input changed
    ((RATE + "tflops = flops / 1e12\nachieved_tflops = 0\nachieved_tflops = tflops * samples_per_s\n", RATE_CHECK),
     {"flops": 2.462e8}),
    ((BUBBLE + "def bubble(m, stages=stages):\n    target = 0.5\n    return (stages - 1) / (m + stages - 1)\n"
      "microbatches = min(m for m in range(1, 1000) if bubble(m) <= target)\n", BUBBLE_CHECK), {}),
    ((BUBBLE + "for stage in range(stages):\n    pass\n" + BUBBLE_SOLVED, BUBBLE_CHECK), {}),
    # the check cell run a second time: the cell before it is the check's own
    ((BUBBLE + BUBBLE_SOLVED, BUBBLE_CHECK, BUBBLE_CHECK), {}),
])
def test_an_answer_cell_that_keeps_its_inputs_is_judged(cells, values):
    assert run_cells(*cells, **values) is True


def test_exercise_63_a_usage_changed_in_place_is_named():
    usage = dict(elapsed_s=900, cpu_time_s=279, cpus=1, gpus=0, time_limit_s=1800, max_rss_mib=1040.43)
    cell = ('import math\nusage["max_rss_mib"] = 1.25 * usage["max_rss_mib"]\n'
            'cpu_efficiency = usage["cpu_time_s"] / (usage["elapsed_s"] * usage["cpus"])\n'
            'time_share = usage["elapsed_s"] / usage["time_limit_s"]\n'
            'gpu_hours = usage["elapsed_s"] * usage["gpus"] / 3600\n'
            'next_time_limit_s = 60 * math.ceil(1.5 * usage["elapsed_s"] / 60)\n'
            'next_memory_mib = 100 * math.ceil(usage["max_rss_mib"] / 100)\n')
    check = "ok = wu.check_job_usage(cpu_efficiency, time_share, gpu_hours, next_time_limit_s, next_memory_mib, usage)"
    with pytest.raises(NotYet, match=r"changes `usage` \(usage\[\"max_rss_mib\"\] = 1.25"):
        run_cells(cell, check, usage=usage)


@pytest.mark.parametrize("cell, changed", [
    ("x += 1", "x"), ("x[0] = 1", "x"), ("x.a = 1", "x"), ("x['a']['b'] = 1", "x"), ("del x[0]", "x"),
    ("y, x = 1, x", "x"), ("x = 1\nx = 2", "x"), ("x: float = x * 2", "x"), ("for x in range(3):\n    pass", None),
    ("x = 1\nfor x in range(3):\n    pass", "x"), ("if True:\n    x = x / 2", "x"), ("[*x] = [1, 2]", None),
    ("y = x\ny = y / 2", None), ("def f(x):\n    x = x + 1", None), ("z = [x for x in range(3)]", None),
    ("class C:\n    x = 1\n    x = 2", None), ("with open('f') as x:\n    pass", None),
])
def test_what_counts_as_changing_an_input(cell, changed):
    found = changed_input(cell, {"x"})
    assert (found and found[0]) == changed


def test_exercise_51_a_count_of_zero_or_less_names_the_room_left_not_a_count_from_one():
    for wrong in (0, -4):
        with pytest.raises(NotYet, match="at least 1; 0 or less comes from dividing by a room") as caught:
            wu.check_fewest_gpus(wrong, 7e9, 35, stage=1)
        assert "26.1 GiB under stage 1" in str(caught.value) and "count from 1" not in str(caught.value)


def test_time_repeats_given_a_result_instead_of_a_function_says_so_in_one_line():
    a = torch.ones(4, 4)
    with pytest.raises(WorkshopError, match="fn must be a function to call, not Tensor") as caught:
        wu.time_repeats(a @ a, repeats=2)
    assert "lambda: a @ b" in str(caught.value)
    with pytest.raises(WorkshopError, match="before must be a function to call, not int"):
        wu.time_repeats(lambda: a @ a, repeats=2, before=3)


def test_timings_are_the_seconds_of_each_repeat_to_any_statistics_function():
    timings = wu.time_repeats(lambda: None, repeats=5, warmup=0)
    seconds = [float(s) for s in timings.seconds]
    assert list(timings) == seconds and timings[0] == seconds[0] and len(timings) == 5
    assert statistics.median(timings) == pytest.approx(timings.median) == pytest.approx(float(np.median(timings)))
    assert sorted(timings) == sorted(seconds)
