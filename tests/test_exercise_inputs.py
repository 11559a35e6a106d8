"""A check reads the notebook's values it is handed (``flops``, ``budget_gib``, ``usage``): an answer's cell that
changed one of them is named in one line, instead of an answer judged against the changed value (right answers
refused, wrong ones passed). Findings of two reviews, one in which a room of attendees typed their answers and one
that tried to fool the rule; the cells run in a real IPython shell, as a notebook runs them."""

from __future__ import annotations

import atexit
import contextlib
import io
import re
import statistics
from fractions import Fraction

import numpy as np
import pytest
import torch

import workshop_utils as wu
from workshop_utils.exercises import exercise_inputs
from workshop_utils.exercises.exercise_cells import NotYet
from workshop_utils.system.errors import WorkshopError

SETUP = "import math\nimport workshop_utils as wu\nwu.install_notebook_error_handler()\nwu.watch_exercise_inputs()"


@pytest.fixture
def notebook():
    """Runs cells in a fresh IPython shell that watches the checks' inputs; returns each cell's error (None if it
    ran) and what it printed."""
    from IPython.core.interactiveshell import InteractiveShell

    shell = InteractiveShell.instance()

    def run(*cells: str):
        results = []
        for cell in cells:
            printed = io.StringIO()
            with contextlib.redirect_stdout(printed), contextlib.redirect_stderr(printed):
                outcome = shell.run_cell(cell, store_history=True)
            results.append((outcome.error_in_exec or outcome.error_before_exec, printed.getvalue()))
        return results

    run(SETUP)
    yield run
    exercise_inputs._watched.pop(id(shell.user_ns), None)
    # IPython's exit for this shell would reset it with a full gc.collect as pytest exits, one per shell: on a
    # 2-core runner at the end of the suite, over a minute for this file's shells together
    atexit.unregister(shell.atexit_operations)
    InteractiveShell.clear_instance()  # get_ipython() is None again for the tests after this one


BUBBLE = "stages, target = 8, 0.10"
BUBBLE_SOLVED = "microbatches = 1\nwhile (stages - 1) / (microbatches + stages - 1) > target:\n    microbatches += 1"
BUBBLE_CHECK = "wu.check_microbatches(microbatches, stages, target)"
ZERO = "parameters, budget_gib = 7e9, 35\nparam_bytes, grad_bytes, optimizer_bytes = wu.BYTES_PER_PARAMETER['mixed']"
ZERO_SOLVED = ("gib_per_byte = parameters / 2**30\n"
               "zero3_gpus = math.ceil((param_bytes + grad_bytes + optimizer_bytes) * gib_per_byte / budget_gib)\n"
               "zero1_gpus = math.ceil(optimizer_bytes * gib_per_byte / (budget_gib - (param_bytes + grad_bytes) * "
               "gib_per_byte))")
ZERO_CHECK = ("wu.check_fewest_gpus(zero3_gpus, parameters, budget_gib, stage=3)\n"
              "wu.check_fewest_gpus(zero1_gpus, parameters, budget_gib, stage=1)")
RING = "parameters = 7e9\nn_bytes, world_size, ndr_link = 2 * parameters, 64, wu.LINKS['ib_ndr']"
RING_SOLVED = ("alpha, bandwidth = ndr_link.latency_us * 1e-6, ndr_link.bandwidth_gbps * 1e9\np = world_size\n"
               "one_pass = (p - 1) * alpha + (p - 1) / p * n_bytes / bandwidth\nddp_s, fsdp_s = 2 * one_pass, "
               "3 * one_pass")
RING_CHECK = "wu.check_fsdp_traffic(ddp_s, fsdp_s, n_bytes, world_size, ndr_link)"
RATE = "flops = 2.462e8\nsamples_per_s = 638.1"
RATE_SOLVED = "achieved_tflops = flops * samples_per_s / 1e12"
RATE_CHECK = "wu.check_achieved_tflops(achieved_tflops, flops, samples_per_s)"
STEP = "step_s, grad_bytes = 0.05, 4 * 11.2e6"
STEP_SOLVED = ("gpus, link = 64, wu.LINKS['ib_ndr']\n"
               "all_reduce_s = sum(2 * (gpus - 1) * link.latency_us * 1e-6 + 2 * (gpus - 1) / gpus * bucket / "
               "(link.bandwidth_gbps * 1e9) for bucket in wu.ddp_buckets(grad_bytes))\n"
               "efficiency_64 = step_s / (step_s + all_reduce_s)")
STEP_CHECK = "wu.check_ddp_efficiency(efficiency_64, step_s, grad_bytes, world_size=64)"
USAGE = "usage = dict(elapsed_s=900, cpu_time_s=279, cpus=1, gpus=0, time_limit_s=1800, max_rss_mib=1040.43)"
USAGE_SOLVED = ('cpu_efficiency = usage["cpu_time_s"] / (usage["elapsed_s"] * usage["cpus"])\n'
                'time_share = usage["elapsed_s"] / usage["time_limit_s"]\n'
                'gpu_hours = usage["elapsed_s"] * usage["gpus"] / 3600\n'
                'next_time_limit_s = 60 * math.ceil(1.5 * usage["elapsed_s"] / 60)\n'
                'next_memory_mib = 100 * math.ceil(1.25 * usage["max_rss_mib"] / 100)')
USAGE_CHECK = ("wu.check_job_usage(cpu_efficiency, time_share, gpu_hours, next_time_limit_s, next_memory_mib, "
               "usage)")
FRACTION = "grads = {'activations': torch.tensor([1e-9, 3e-8, 1e-4, 0.5, 0.0, 2e-6])}\n" \
           "activation_grads = grads['activations']"
FRACTION_SOLVED = ("nonzero = activation_grads[activation_grads != 0]\n"
                   "lost_fraction = float((nonzero.half() == 0).float().mean())")
FRACTION_CHECK = "wu.check_lost_fraction(lost_fraction, activation_grads)"
# as large as the cpu profile's (8.4 million), which is not summed before every cell
LARGE_FRACTION = (f"grads = {{'activations': torch.rand({exercise_inputs.LARGE_TENSOR + 1}) * 1e-6}}\n"
                  "activation_grads = grads['activations']")


CHANGED = "is not what the notebook set it to"


@pytest.mark.parametrize("cells, words", [
    # 5.3: the target typed in percent, then compared as a fraction (m = 1 passed) or in percent (m = 63 refused)
    ((BUBBLE, "target = 10  # percent\n" + BUBBLE_SOLVED, BUBBLE_CHECK),
     "`target` = 10, not the 0.1 the exercise gives"),
    ((BUBBLE, "target = 10\n" + BUBBLE_SOLVED.replace("(stages - 1) /", "100 * (stages - 1) /"), BUBBLE_CHECK),
     "`target` = 10, not"),
    # ... in a cell of its own before the answer, or in the cell that gives it, edited
    ((BUBBLE, "target = target * 100  # percent", BUBBLE_SOLVED, BUBBLE_CHECK), "`target` = 10.0, not the 0.1"),
    (("stages, target = 8, 10", BUBBLE_SOLVED, BUBBLE_CHECK), "`target` = 10, not the 0.1"),
    # 5.1: the budget turned into bytes in place (right answers refused), or the whole card's 80 GiB
    ((ZERO, "budget_gib = budget_gib * 2**30\n" + ZERO_SOLVED.replace("/ 2**30", ""), ZERO_CHECK),
     "`budget_gib` = 37580963840, not the 35 the exercise gives"),
    ((ZERO, "budget_gib = 80\n" + ZERO_SOLVED, ZERO_CHECK), "`budget_gib` = 80, not the 35"),
    # 5.2: the gradients' bytes counted in fp32 by a second line
    ((RING, "n_bytes = 4 * parameters\n" + RING_SOLVED, RING_CHECK), "`n_bytes` = 28000000000.0, not the 1.4e"),
    # 1.1: the FLOPs turned into TFLOPs in place; in a scratch cell run between the answer and the check; in the
    # answer's cell run once more, or before the fixed one, before any check
    ((RATE, "flops = flops / 1e12\nachieved_tflops = flops * samples_per_s", RATE_CHECK),
     rf"`flops` {CHANGED} \(246200000 then, 0.0002462 now\)"),
    ((RATE, RATE_SOLVED, "flops = flops / 1e12", RATE_CHECK), f"`flops` {CHANGED}"),
    ((RATE, "flops = flops / 1e12\nachieved_tflops = flops * samples_per_s", RATE_SOLVED, RATE_CHECK),
     f"`flops` {CHANGED}"),
    # 2.3: the step in milliseconds, the gradients in bf16, a value typed fresh, and the change hidden from a reader
    # of the cell: in %%time's or %time's string, with the check in the same cell, by walrus or through globals()
    ((STEP, "step_s = step_s * 1e3\n" + STEP_SOLVED, STEP_CHECK), f"`step_s` {CHANGED}"),
    ((STEP, "grad_bytes = grad_bytes / 2  # bf16\n" + STEP_SOLVED, STEP_CHECK), r"\(44800000 then, 22400000 now\)"),
    ((STEP, "grad_bytes = grad_bytes / 2\n" + STEP_SOLVED, "grad_bytes = grad_bytes / 2\n" + STEP_SOLVED, STEP_CHECK),
     r"\(44800000 then, 11200000 now\)"),
    ((STEP, "step_s = 50  # ms, as printed above\n" + STEP_SOLVED, STEP_CHECK), f"`step_s` {CHANGED}"),
    ((STEP, "%%time\nstep_s = step_s * 1e3\n" + STEP_SOLVED, STEP_CHECK), f"`step_s` {CHANGED}"),
    ((STEP, "%time step_s = step_s * 1e3\n" + STEP_SOLVED, STEP_CHECK), f"`step_s` {CHANGED}"),
    ((STEP, "step_s = step_s * 1e3\n" + STEP_SOLVED + "\n" + STEP_CHECK,), f"`step_s` {CHANGED}"),
    ((STEP, "(step_s := step_s * 1e3)\n" + STEP_SOLVED, STEP_CHECK), f"`step_s` {CHANGED}"),
    ((STEP, "globals()['grad_bytes'] = 1e6\n" + STEP_SOLVED, STEP_CHECK), f"`grad_bytes` {CHANGED}"),
    # 6.3: the memory scaled in place, by update(), through another name; the limit in minutes, typed fresh
    ((USAGE, 'usage["max_rss_mib"] = 1.25 * usage["max_rss_mib"]\n' + USAGE_SOLVED.replace("1.25 * ", ""),
      USAGE_CHECK), rf"`usage\['max_rss_mib'\]` {CHANGED} \(1040.43 then, 1300.5375 now\)"),
    ((USAGE, 'usage.update(max_rss_mib=usage["max_rss_mib"] * 1.25)\n' + USAGE_SOLVED, USAGE_CHECK),
     rf"`usage\['max_rss_mib'\]` {CHANGED}"),
    ((USAGE, 'u = usage\nu["time_limit_s"] /= 60\n' + USAGE_SOLVED, USAGE_CHECK), r"`usage\['time_limit_s'\]`"),
    ((USAGE, USAGE.replace("1800", "30") + "  # minutes\n" + USAGE_SOLVED, USAGE_CHECK), r"\(1800 then, 30 now\)"),
    ((USAGE, 'del usage["gpus"]\n' + USAGE_SOLVED.replace('usage["gpus"]', "0"), USAGE_CHECK),
     rf"`usage\['gpus'\]` {CHANGED} \(0 then, no such key now\)"),
    # 5.2 on another link than the exercise's, in the cell that gives it or in one of its own
    ((RING.replace("ib_ndr", "nvlink4"), RING_SOLVED, RING_CHECK),
     r'`ndr_link` = wu.LINKS\["nvlink4"\], not the wu.LINKS\["ib_ndr"\] the exercise gives'),
    ((RING, "ndr_link = wu.LINKS['nvlink4']", RING_SOLVED, RING_CHECK), "`ndr_link` = wu.LINKS"),
    # a first run of the answer's cell that changed an input, then the fixed cell, before any check
    ((ZERO, "budget_gib = 80\n" + ZERO_SOLVED, ZERO_SOLVED, ZERO_CHECK), "`budget_gib` = 80, not the 35"),
    ((USAGE, 'usage["time_limit_s"] /= 60\n' + USAGE_SOLVED, USAGE_SOLVED, USAGE_CHECK), r"\(1800 then, 30 now\)"),
    ((BUBBLE, "target = 10\n" + BUBBLE_SOLVED, "microbatches = int(microbatches)", BUBBLE_CHECK), "`target` = 10"),
    ((USAGE, 'usage["elapsed_s"] = "900"\n' + USAGE_SOLVED.replace('usage["elapsed_s"]', "900"), USAGE_CHECK),
     r"\(900 then, '900' now\)"),
    # 3.1: a tensor scaled in place through another name (the same storage), or through the dict that holds it
    ((FRACTION, "scaled = activation_grads\nscaled *= 1024\n" + FRACTION_SOLVED, FRACTION_CHECK),
     f"`activation_grads` {CHANGED}"),
    ((FRACTION, "grads['activations'].mul_(1024)\n" + FRACTION_SOLVED, FRACTION_CHECK),
     f"`activation_grads` {CHANGED}"),
    ((LARGE_FRACTION, "activation_grads = activation_grads * 1024\n" + FRACTION_SOLVED, FRACTION_CHECK),
     f"`activation_grads` {CHANGED}"),
    ((LARGE_FRACTION, "activation_grads = activation_grads.clone()\nactivation_grads[0] += 1\n" + FRACTION_SOLVED,
      FRACTION_CHECK), f"`activation_grads` {CHANGED}"),
])
def test_an_answer_cell_that_changes_an_input_is_named_not_judged(notebook, cells, words):
    error, _ = notebook("import torch", *cells)[-1]
    assert isinstance(error, NotYet), error
    assert "\n" not in str(error) and re.search("Fix: (give|run the cells again)", str(error))
    assert re.search(words, str(error)), error


@pytest.mark.parametrize("cells", [
    (BUBBLE, BUBBLE_SOLVED, BUBBLE_CHECK),
    (ZERO, ZERO_SOLVED, ZERO_CHECK),
    (RING, RING_SOLVED, RING_CHECK),
    (RATE, RATE_SOLVED, RATE_CHECK),
    (STEP, STEP_SOLVED, STEP_CHECK),
    (USAGE, USAGE_SOLVED, USAGE_CHECK),
    (FRACTION, FRACTION_SOLVED, FRACTION_CHECK),
    # what is computed from an input goes under a new name; an answer set twice is no input changed
    (RATE, "tflops = flops / 1e12\nachieved_tflops = 0\nachieved_tflops = tflops * samples_per_s", RATE_CHECK),
    # the same value again, in another type or from a branch that never runs; a key added beside the others
    (BUBBLE, "target = 0.10\nstages = int(stages)\nif target > 1:\n    target = target / 100\n" + BUBBLE_SOLVED,
     BUBBLE_CHECK),
    (USAGE, 'usage["elapsed_min"] = usage["elapsed_s"] / 60\n' + USAGE_SOLVED, USAGE_CHECK),
    (FRACTION, "activation_grads = activation_grads.float()\n" + FRACTION_SOLVED, FRACTION_CHECK),
    # a copy with the same values, of a tensor too large to sum before every cell (a review: refused as changed)
    (LARGE_FRACTION, "activation_grads = activation_grads.clone()\n" + FRACTION_SOLVED, FRACTION_CHECK),
    (LARGE_FRACTION, "activation_grads = activation_grads.double().abs()\n" + FRACTION_SOLVED, FRACTION_CHECK),
    (STEP, "step_s = torch.tensor(step_s, dtype=torch.float64)\n" + STEP_SOLVED, STEP_CHECK),
    # the check cell run twice, a %%time around a cell that changes nothing, the answer and the check in one cell
    (BUBBLE, BUBBLE_SOLVED, BUBBLE_CHECK, BUBBLE_CHECK),
    (STEP, "%%time\n" + STEP_SOLVED, STEP_CHECK),
    (STEP, STEP_SOLVED + "\n" + STEP_CHECK),
    # an input's own cell run again with another value (a new measurement), then the answer: judged on the new one
    (STEP, STEP_SOLVED, STEP.replace("0.05", "0.08"), STEP_SOLVED, STEP_CHECK),
    # a changed input set again by its own cell, then the fixed answer
    (RATE, "flops = flops / 1e12\nachieved_tflops = flops * samples_per_s", RATE_CHECK, RATE, RATE_SOLVED,
     RATE_CHECK),
    # the answer run before the watch began, and a scratch cell that only reads
    (RATE.replace("flops =", "import time\nflops ="), "start = time.perf_counter()\nprint(flops)", RATE_SOLVED,
     RATE_CHECK),
])
def test_an_answer_cell_that_keeps_its_inputs_is_judged(notebook, cells):
    results = notebook("import torch", *cells)
    assert results[-1][0] is None, results
    assert "✓" in results[-1][1]


def test_the_fixed_answer_alone_is_told_the_input_is_still_changed_until_its_own_cell_runs(notebook):
    changed = "flops = flops / 1e12\nachieved_tflops = flops * samples_per_s"
    results = notebook(RATE, changed, RATE_CHECK, RATE_SOLVED, RATE_CHECK)
    assert all(CHANGED in str(results[k][0]) for k in (2, 4))
    assert "(246200000 then, 0.0002462 now)" in str(results[4][0])
    results = notebook(RATE, RATE_SOLVED, RATE_CHECK)
    assert results[-1][0] is None and "✓ Exercise 1.1: correct" in results[-1][1]


MATMUL = ("env = wu.environment()\ndevice = torch.device('cpu')\nn = 1024\n"
          "a, b = torch.randn(n, n), torch.randn(n, n)\nmatmul = lambda: a @ b\n"
          "timings = wu.time_repeats(matmul, repeats=5, device=device)\n"
          "seconds = timings.median\nmatmul_tflops = 2 * n**3 / seconds / 1e12")
MFU = "peak = wu.peak_tflops(env['device_name'], 'fp32') or matmul_tflops\nmfu = achieved_tflops / peak"
MFU_CHECK = ("wu.check_mfu(mfu, achieved_tflops, env['device_name'], 'fp32', matmul_tflops, flops_per_sample=flops, "
             "samples_per_s=samples_per_s, n=n, timings=timings, seconds=seconds)")


@pytest.mark.parametrize("cells", [
    (RATE, "achieved_tflops = flops * samples_per_s", RATE_CHECK, RATE_SOLVED, RATE_CHECK, MATMUL, MFU, MFU_CHECK),
    (RATE, "achieved_tflops = 0", RATE_SOLVED, MATMUL, MFU, MFU_CHECK),
    (RATE, RATE_SOLVED, MATMUL, MFU, MFU_CHECK, RATE.replace("638.1", "700.0"), RATE_SOLVED, MFU, MFU_CHECK),
], ids=["1.1 wrong, then right", "1.1 overwritten before a check", "run again on a new measurement"])
def test_an_answer_that_is_a_later_exercise_input_is_set_anew_by_its_own_cell(notebook, cells):
    """1.1's answer is 1.3's input: each run of 1.1's cell sets it, only 1.3's cell would change it."""
    results = notebook("import torch", *cells)
    assert results[-1][0] is None and "✓ Exercise 1.3: correct" in results[-1][1], results[-1]


def test_an_input_is_compared_by_its_values_whatever_holds_them():
    import pandas as pd

    fingerprint = exercise_inputs.fingerprint
    frame = pd.DataFrame({"batch_size": [32, 64], "peak_memory_mib": [100.5, 180.25]})
    assert fingerprint(frame) == fingerprint(frame.astype({"batch_size": float, "peak_memory_mib": "float32"}))
    assert fingerprint(frame) != fingerprint(frame.assign(peak_memory_mib=[100.5, 181.0]))
    assert fingerprint(torch.tensor(0.5)) == fingerprint(0.5) == fingerprint(np.float32(0.5))
    assert fingerprint(torch.tensor([1.0, float("nan")])) == fingerprint(torch.tensor([1.0, float("nan")]))
    assert wu.check_microbatches(63, 8, Fraction(1, 10)) is True  # a Fraction is a number
    large = torch.zeros(exercise_inputs.LARGE_TENSOR + 1)
    before = fingerprint(large)
    large[7] = 1.0  # an in-place write PyTorch counts
    assert fingerprint(large) != before
    assert fingerprint(large.clone()) == fingerprint(large)  # the values, not the storage


def test_without_the_watch_or_outside_ipython_a_check_judges_as_before(notebook):
    from IPython.core.interactiveshell import InteractiveShell

    exercise_inputs._watched.clear()  # as in a notebook that never called watch_exercise_inputs
    InteractiveShell.instance().events.callbacks["pre_run_cell"].clear()
    error, _ = notebook(BUBBLE, "target = 10\n" + BUBBLE_SOLVED, BUBBLE_CHECK)[-1]
    assert error is None
    assert wu.check_microbatches(63, 8, 0.10) is True


def test_exercise_51_a_count_of_zero_or_less_names_the_room_left_not_a_count_from_one():
    for wrong in (0, -4):
        with pytest.raises(NotYet, match="at least 1; 0 or less comes from dividing by a room") as caught:
            wu.check_fewest_gpus(wrong, 7e9, 35, stage=1)
        assert "26.1 GiB under stage 1" in str(caught.value) and "count from 1" not in str(caught.value)
    with pytest.raises(NotYet, match="round the quotient up") as caught:  # under ZeRO-3 nothing stays whole
        wu.check_fewest_gpus(0, 7e9, 35, stage=3)
    assert "room" not in str(caught.value)


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


def test_exercise_63_in_a_time_cell_is_run_again_on_another_job_as_without_it(notebook):
    results = notebook(USAGE, "%%time\n" + USAGE_SOLVED, USAGE_CHECK)
    assert results[-1][0] is None and "✓ Exercise 6.3: correct" in results[-1][1]
    assert "judged on this job alone" not in results[-1][1]


def test_an_answers_cell_run_again_on_other_inputs_shows_nothing_twice_and_changes_nothing(notebook):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    given = "grads = {'parameters': torch.tensor([0.4015, 1e-3]), 'activations': torch.tensor([0.02, 3e-9])}"
    cell = ("from IPython.display import display\n"
            "largest = max(g.max().item() for g in grads.values())\n"
            "safe_scale = 2.0 ** math.floor(math.log2(torch.finfo(torch.float16).max / largest))\n"
            "print('largest', largest)\ndisplay('shown by the cell')\nplt.figure()\ncount = count + 1")
    results = notebook("import torch\nimport matplotlib.pyplot as plt\ncount = 0", given, cell,
                       "figures = len(plt.get_fignums())\nwu.check_safe_loss_scale(safe_scale, grads)",
                       "print(count, len(plt.get_fignums()) - figures, largest)")
    assert [error for error, _ in results] == [None] * 5, results
    assert "largest" in results[2][1] and "shown by the cell" in results[2][1]
    printed = results[3][1]
    assert printed.startswith("✓ Exercise 3.2: correct") and "largest 0.5" not in printed and "shown" not in printed
    assert results[4][1].split() == ["1", "0", "0.40149998664855957"]  # the notebook's values, no figure more
    plt.close("all")
