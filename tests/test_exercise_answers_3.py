"""Findings of the third adversarial review of the exercise checks, each held here as a test.

Right answers the checks refused (Exercise 4.1 reading the sweep's Amdahl column, answers rounded to two or
more significant digits, ``check_baseline(profile="auto")``), refusals that named the wrong mistake
(a second command chained after the torchrun launch), and inputs an attendee types that made a check fail
on its own (``limit_mib``) or speak Python (``command=42``). The inputs and ``outcome`` are those of
tests/test_exercise_answers.py.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

import workshop_utils as wu
from test_exercise_answers import (ACHIEVED, BATCHES, LARGEST, LOST, MATMUL, SLOPE, breakdown_with, formula_giving,
                                   loader_choice, loader_table, outcome)
from workshop_utils.exercises import exercise_checks
from workshop_utils.exercises.ddp_lab import read_launch_line
from workshop_utils.exercises.exercise_cells import NotYet
from workshop_utils.exercises.exercise_checks import KitDefect
from workshop_utils.exercises.exercise_judging import rounded_digits
from workshop_utils.lessons import sweeps
from workshop_utils.system.errors import WorkshopError

REFERENCE_RECORD = Path(__file__).resolve().parents[1] / "results" / "reference" / "results" / "ladder-0-baseline.json"


def one_line_refusal(call, *words) -> str:
    """The one ``WorkshopError`` line ``call`` raises (no ``KitDefect``), holding every one of ``words``."""
    with pytest.raises(WorkshopError) as caught:
        call()
    said = str(caught.value)
    assert not isinstance(caught.value, KitDefect) and "\n" not in said and " Fix: " in said, said
    for word in words:
        assert word in said, said
    return said


# ---------------------------------------------------------------- finding 1: Exercise 4.1's second sweep


def notebook_sweep() -> pd.DataFrame:
    """``loader_table()`` with every column ``wu.dataloader_sweep`` builds: its metrics and the Amdahl ceiling."""
    table = loader_table()
    table["step_ms_median"] = 64e3 / table.samples_per_s
    table["mfu"] = table.samples_per_s / 1e5
    table["amdahl_max_speedup"] = [sweeps.amdahl_speedup(w) for w in table.data_wait_fraction]
    return table[["num_workers", "pin_memory", *sweeps.METRICS, "amdahl_max_speedup"]]


def test_the_checks_own_loader_sweep_has_every_column_of_the_notebooks():
    table, start = exercise_checks.constructed_loader_sweep()
    assert list(table.columns) == list(notebook_sweep().columns)
    assert all(math.isclose(row.amdahl_max_speedup, 1 / (1 - row.data_wait_fraction)) for row in table.itertuples())
    assert start.amdahl_max_speedup == pytest.approx(1 / (1 - start.data_wait_fraction))


@pytest.mark.parametrize("choice", [
    lambda sweep, start: (*loader_choice(sweep, start)[:2], start.amdahl_max_speedup),
    lambda sweep, start: (loader_choice(sweep, start)[0],
                          start.step_ms_median / sweep.loc[sweep.samples_per_s.idxmax()].step_ms_median,
                          loader_choice(sweep, start)[2]),
], ids=["bound-from-the-amdahl-column", "speedup-from-step-times"])
def test_a_loader_choice_reading_the_sweeps_other_columns_passes(choice, capsys):
    assert wu.check_loader_choice(choice, notebook_sweep(), 2) is True
    said = capsys.readouterr().out.strip()
    assert said.startswith("✓ Exercise 4.1") and "\n" not in said, said


# ---------------------------------------------------------------- finding 2: check_baseline's profile


def test_check_baseline_resolves_auto_as_the_notebooks_do(monkeypatch):
    record = json.loads(REFERENCE_RECORD.read_text())
    monkeypatch.setenv("WORKSHOP_PROFILE", "cpu")
    auto = wu.check_baseline(record, profile="auto")
    assert auto.equals(wu.check_baseline(record, profile=wu.resolve_profile("auto")))
    assert "expected 35-75% on the cpu profile" in auto.loc["accuracy in range", "detail"]


@pytest.mark.parametrize("profile", ["CPU", "", "fast", 42, "Auto"])
def test_check_baseline_names_the_valid_profiles_for_an_unknown_one(profile):
    record = json.loads(REFERENCE_RECORD.read_text())
    one_line_refusal(lambda: wu.check_baseline(record, profile=profile), "is no profile", "'auto', 'cpu', 'gpu'")


# ---------------------------------------------------------------- finding 3: Exercise 4.2's limit_mib


@pytest.mark.parametrize("limit", [None, float("inf"), "512", 0, -600, True])
def test_a_memory_limit_that_is_no_number_is_named_in_one_line(limit):
    one_line_refusal(lambda: wu.check_batch_memory(SLOPE, LARGEST, BATCHES, limit),
                     "✗ Exercise 4.2: `limit_mib` =", "no memory limit")


# ---------------------------------------------------------------- finding 4: Exercise 2.2's command


# an & after the launch runs it in the background, and says so first: what else runs beside it may land in the
# trace in either order (test_ddp_lab's wrong launch lines)
@pytest.mark.parametrize("chain, named", [("&& rm -rf /tmp/x", "chains a second command"),
                                          ("; echo done", "chains a second command"),
                                          ("|| true", "the command has ||, which runs what follows"),
                                          ("| tee log.txt", "chains a second command"),
                                          ("& echo started", "runs the launch with &, in the background")])
def test_a_second_command_chained_after_the_launch_is_named_before_any_launch(tmp_path, chain, named):
    script = wu.solve_ddp_lab(tmp_path / "my_train_ddp.py")
    with pytest.raises(NotYet) as caught:
        wu.check_ddp_lab(script, tmp_path, command=f"torchrun --nproc-per-node=2 {script} {chain}")
    said = str(caught.value)
    assert named in said and "starts with" not in said and "\n" not in said, said
    assert not list(tmp_path.glob("check*")), "nothing was launched"


def test_a_chain_glued_to_the_script_name_is_read_as_the_shell_reads_it(tmp_path):
    script = tmp_path / "my_train_ddp.py"
    with pytest.raises(NotYet, match="chains a second command"):
        read_launch_line(f"torchrun --nproc-per-node=2 {script};rm -rf /tmp/x", script, 2)


@pytest.mark.parametrize("before", ["cd {d} &&", "module load python/3.11 &&", "OMP_NUM_THREADS=1",
                                    "cd {d} && source venv/bin/activate &&",
                                    "module load anaconda3 && source activate pytorch &&"])  # conda's, on PATH
def test_what_comes_before_the_launch_is_still_taken_off(tmp_path, before):
    script = tmp_path / "my_train_ddp.py"
    (tmp_path / "venv" / "bin").mkdir(parents=True)
    (tmp_path / "venv" / "bin" / "activate").write_text("PATH=/nonexistent  # never run: the check sources nothing\n")
    line = f"{before.format(d=tmp_path)} torchrun --nproc-per-node=2 {script}"
    assert read_launch_line(line, script, 2).script_args == []


def test_a_line_continued_and_commented_reads_as_the_shell_reads_it(tmp_path):
    script = tmp_path / "my_train_ddp.py"
    launch = read_launch_line(f"torchrun --nproc-per-node=2 \\\n    {script}  # two processes", script, 2)
    assert launch.script_args == [] and launch.assigned == {}


@pytest.mark.parametrize("line, words", [
    ("torchrun --nproc-per-node=2 {s}\necho hi", ["chains a second command"]),
    ("torchrun --nproc-per-node=2 {s} > log 2>&1", ["redirects output (log), which the check's shell does not"]),
    ("torchrun --nproc-per-node=$(echo 2) {s}", ["shell expansion", "$(echo 2)"]),
    # shown whole, not cut at its first space
    ("torchrun --nproc-per-node=2 --master-port=$((RANDOM % 1000 + 20000)) {s}", ["$((RANDOM % 1000 + 20000))"]),
    # bash opens these as network connections: the check's shell never does
    ("torchrun --nproc-per-node=2 {s} < /dev/tcp/127.0.0.1/9", ["shell expansion", "/dev/tcp/127.0.0.1/9"]),
    ("torchrun --nproc-per-node=2 {s} < /dev/udp/127.0.0.1/9", ["shell expansion", "/dev/udp/127.0.0.1/9"]),
])
def test_what_the_check_would_not_run_as_a_shell_does_is_named(tmp_path, line, words):
    script = tmp_path / "my_train_ddp.py"
    with pytest.raises(NotYet) as caught:
        read_launch_line(line.format(s=script), script, 2)
    assert all(w in str(caught.value) for w in words) and "\n" not in str(caught.value), str(caught.value)


def test_assignments_in_front_of_the_launch_reach_it(tmp_path):
    script = tmp_path / "my_train_ddp.py"
    launch = read_launch_line(f"FOO=1 OMP_NUM_THREADS=3 torchrun --nproc-per-node=2 {script}", script, 2)
    assert launch.assigned == {"FOO": "1", "OMP_NUM_THREADS": "3"}


@pytest.mark.parametrize("command", [42, 2.5, {"torchrun": 2}])
def test_a_command_that_is_no_text_says_so_in_one_line(tmp_path, command):
    script = wu.solve_ddp_lab(tmp_path / "my_train_ddp.py")
    said = one_line_refusal(lambda: wu.check_ddp_lab(script, tmp_path, command=command), "must be a text (a str)")
    assert "not iterable" not in said
    assert not list(tmp_path.glob("check*")), "nothing was launched"


# ---------------------------------------------------------------- finding 5: rounded right answers


@pytest.mark.parametrize("value, right, digits", [
    (2.52, 2.5225, 3), (0.12, 0.1234, 2), (0.03, 0.0343, 1), (float(np.float32(2.52)), 2.5225, 3),
    (0.1, 0.0996, 2), (0.01, 0.0067, 0), (2, 2.5225, None), (0, 0.004, None), (1235, 1234.567, 4),
    # A float drops trailing zeros, a power of ten too: 1.0 is 1.0417 to one decimal (two digits), 0.1 is 0.0996
    # to three (0.100); 1 for 0.968 keeps one digit, 10 for 9.7 one.
    (1, 0.968, 1), (1.0, 0.968, 1), (10, 9.7, 1), (0.3, 0.2961, 2), (1.0, 1.0417, 2),
])
def test_a_rounding_is_told_by_the_decimals_written(value, right, digits):
    assert rounded_digits(value, right) == digits


def lost_gradients() -> torch.Tensor:
    """39 non-zero values, 6 of them lost in fp16, and one zero: 6/39 = 0.1538 rounds to 0.15, and dividing
    by all 40 values gives 0.15 exactly, the mistake's value."""
    return torch.tensor([1e-9] * 6 + [1e-3] * 33 + [0.0], dtype=torch.float64)


@pytest.mark.parametrize("name, answers", [
    ("4.2", {"mib_per_sample": round(SLOPE, 2)}),
    ("1.3 cpu", {"mfu": np.float32(round(ACHIEVED / MATMUL, 2))}),  # 0.3 as float32 is 0.30000001
    ("1.3", {"mfu": round(ACHIEVED / 19.5, 4)}),
    ("1.3 cpu", {"mfu": round(ACHIEVED / MATMUL, 2)}),
    ("3.1", {"lost_fraction": round(LOST, 2)}),
    ("1.1", {"achieved_tflops": round(ACHIEVED, 3)}),
    ("1.3", {"achieved_tflops": round(ACHIEVED, 3)}),  # MFU builds on Exercise 1.1's rounded answer
    ("1.3 cpu", {"matmul_tflops": float(f"{MATMUL:.2g}")}),  # and on Exercise 1.2's
], ids=["4.2", "1.3-cpu-float32", "1.3", "1.3-cpu", "3.1", "1.1", "1.3-on-a-rounded-1.1", "1.3-on-a-rounded-1.2"])
def test_a_right_answer_rounded_to_two_or_more_significant_digits_passes(name, answers, capsys):
    verdict, said = outcome(name, answers, capsys)
    assert verdict == "passed", said


def test_a_rounding_that_lands_on_a_mistake_is_still_the_right_value_rounded(capsys):
    """0.15 is both 6/39 rounded and 6/40, the mistake: every check takes a right answer rounded to two significant
    digits (notebook 01 says so), so the right reading wins; the mistake unrounded is still named."""
    gradients = lost_gradients()
    assert wu.check_lost_fraction(round(6 / 39, 2), gradients) is True
    assert wu.check_lost_fraction(round(6 / 39, 3), gradients) is True
    with pytest.raises(NotYet, match="were zero already"):
        wu.check_lost_fraction(6 / 40 * (1 + 1e-4), gradients)  # the mistake itself, unrounded


@pytest.mark.parametrize("name, answers", [
    ("1.3", {"mfu": round(ACHIEVED / 19.5, 2)}),  # 0.0067 -> 0.01
    ("3.1", {"lost_fraction": round(LOST, 1)}),  # 0.364 -> 0.4
], ids=["1.3", "3.1"])
def test_a_rounding_to_one_significant_digit_asks_for_two(name, answers, capsys):
    verdict, said = outcome(name, answers, capsys)
    assert verdict == "refused" and "two significant digits" in said, said


def test_a_value_no_rounding_gives_is_not_called_a_rounding(capsys):
    verdict, said = outcome("4.3", {"step_speedup": 2.0}, capsys)  # right: 1.25; 2.0 is no rounding of it
    assert verdict == "refused" and "= 2 is not right" in said and "significant digits" not in said, said
    table = breakdown_with(backward_ms=3.0, step_ms=7.5)
    verdict, said = outcome("4.3", {"breakdown": table, "step_speedup": 1.3}, capsys)  # 1.25 to one decimal
    assert verdict == "passed", said


# ---------------------------------------------------------------- finding 6: two messages


def test_fp8_on_a_machine_without_a_gpu_says_there_is_none(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    said = one_line_refusal(lambda: wu.check_fp8("cuda"), "there is no GPU here")
    assert "cuda is none" not in said


@pytest.mark.parametrize("returned, words", [
    (None, "make `gpt_flops_per_token` end with `return`"),
    ("5701632", "make `gpt_flops_per_token` return the number itself"),
    ([5701632, 5701632], "make `gpt_flops_per_token` return one number"),
])
def test_exercise_1_4_asks_the_function_to_return_the_number(returned, words, capsys):
    verdict, said = outcome("1.4", {"formula": formula_giving(returned)}, capsys)
    assert verdict == "refused" and words in said and "assign the number to `what" not in said, said


@pytest.mark.parametrize("check, words", [
    # 0.968: 1 is the communication left out, and named so (it was called a rounding to too few digits)
    (lambda: wu.check_ddp_efficiency(1, 0.05, int(9.4 * 2**20), world_size=64), "leaves the communication out"),
    (lambda: wu.check_achieved_tflops(10, 1e9, 9700.0), "two significant digits"),  # 9.7
])
def test_a_power_of_ten_that_rounds_away_the_answer_is_refused(check, words):
    with pytest.raises(NotYet, match=words):
        check()


def test_a_one_row_series_or_frame_is_the_number_it_holds(capsys):
    """predict_scaling's row at 64 GPUs, as pandas selects it: one element, accepted as a one-element array is."""
    links = wu.LINKS["nvlink4"], wu.LINKS["ib_ndr"]
    table = wu.predict_scaling(0.0345, 4 * 11_173_962, [1, 8, 64], *links)
    row = table.loc[table.world_size == 64, "efficiency_no_overlap"]
    for answer in (row, row.to_frame()):
        assert wu.check_ddp_efficiency(answer, 0.0345, 4 * 11_173_962) == pytest.approx(float(row.iloc[0]))
    assert "✓ Exercise 2.3: correct" in capsys.readouterr().out
    said = one_line_refusal(lambda: wu.check_ddp_efficiency(table.efficiency_no_overlap, 0.0345, 4 * 11_173_962),
                            "should be one number, a fraction, got a Series of shape (3,)")
    assert "Name:" not in said
