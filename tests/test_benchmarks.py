"""Every benchmark script has one shape: the same three flags, one JSON layout, one-line errors.

Each benchmark runs here with its smallest CPU sizes (a few seconds): the speed figures are
not checked, only that the script runs end to end and writes what the report reads.
"""

import importlib.util
import json
import math
import subprocess
import sys
from datetime import datetime
from pathlib import Path

import pytest
import torch

import workshop_utils as wu
from workshop_utils.system import benchmark

ROOT = Path(__file__).resolve().parents[1]
NAMES = sorted(p.stem for p in (ROOT / "benchmarks").glob("*.py") if not p.stem.startswith("_"))

# The smallest sizes that still run every path of each benchmark, and the options that keep it short.
TINY = {
    "accuracy_spread": (None, ["--only", "02"]),  # sizes from the notebooks; notebook 02's run is the shortest
    "annotation_overhead": (dict(train_images=64, test_images=16, steps=3, warmup_steps=1, batch_samples=16), []),
    "gpt_throughput": (dict(gpt_size="tiny", batch_sequences=2, sequence_tokens=32, steps=3, warmup_steps=1,
                            train_sequences=16, validation_sequences=4, lr=1e-3, compile=False), ["--modes", "fp32"]),
    "gpt_variants": (dict(gpt_size="tiny", batch_sequences=2, sequence_tokens=32, steps=3, warmup_steps=1,
                          validation_sequences=4, lr=1e-3, compile=False, budget_s=600),
                     ["--rungs", "before", "fused qkv", "max count"]),
    "loader_paths": (dict(train_images=256, batch_samples=32, timed_batches=3), []),
    "optimization_ladder": (dict(train_images=128, test_images=32, steps=3, warmup_steps=1, batch_samples=16,
                                 profiled_steps=1), ["--no-compile"]),
    "precision_modes": (None, ["--model", "simplecnn", "--modes", "fp32", "bf16", "--steps", "2",
                               "--warmup-steps", "1", "--batch-size", "16", "--train-size", "32"]),
}


def load(name: str):
    spec = importlib.util.spec_from_file_location(f"benchmark_{name}", ROOT / "benchmarks" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def tiny(name: str, monkeypatch, profile: str = "cpu"):
    module = load(name)
    sizes, options = TINY[name]
    if sizes is not None:
        assert set(sizes) == set(module.PROFILES[profile]), f"TINY must set every size of the {profile} profile"
        monkeypatch.setitem(module.PROFILES, profile, sizes)
    return module, options


def test_the_median_run_is_the_middle_speed_and_a_run_without_one_counts_slowest():
    runs = [{"speed": 3.0}, {"speed": None}, {"speed": 1.0}, {"speed": 2.0}, {"speed": 5.0}]
    assert benchmark.median_run(runs, lambda r: r["speed"]) == {"speed": 2.0}
    assert benchmark.median_run(runs[:1], lambda r: r["speed"]) == {"speed": 3.0}
    assert benchmark.median_run([{"speed": None}, {"speed": 4.0}], lambda r: r["speed"]) == {"speed": 4.0}


def test_every_script_is_covered():
    assert NAMES == sorted(TINY)


@pytest.mark.parametrize("name", NAMES)
def test_every_benchmark_takes_the_same_three_flags(name):
    actions = {a.option_strings[0]: a for a in load(name).build_parser()._actions if a.option_strings}
    for flag in benchmark.SHARED_FLAGS:
        assert flag in actions, f"{name} lacks {flag}"
    assert tuple(actions["--profile"].choices) == ("auto", "cpu", "gpu") and actions["--profile"].default == "auto"
    assert actions["--run-dir"].default is None
    assert isinstance(actions["--repeats"].default, int) and actions["--repeats"].default >= 1
    assert "--out" not in actions and "--sizes" not in actions


@pytest.mark.slow  # each benchmark trains for real, if briefly (up to ~20 s on a busy 2-core machine)
@pytest.mark.parametrize("name", NAMES)
def test_every_benchmark_writes_the_one_layout(name, tmp_path, monkeypatch):
    module, options = tiny(name, monkeypatch)
    path = module.main(["--profile", "cpu", "--run-dir", str(tmp_path), "--repeats", "1", *options])
    assert path == tmp_path / "benchmarks" / f"{name}.json"
    record = json.loads(path.read_text())
    assert tuple(record)[:len(benchmark.LAYOUT_KEYS)] == benchmark.LAYOUT_KEYS
    assert set(record) - set(benchmark.LAYOUT_KEYS) <= {"tables"}  # a second table, where a benchmark has one
    assert record["benchmark"] == name and record["profile"] == "cpu"
    assert record["environment"]["device_type"] == "cpu"
    assert record["settings"]["repeats"] == 1
    assert record["rows"] and all(isinstance(row, dict) for row in record["rows"])
    assert datetime.fromisoformat(record["created"]).tzinfo is not None
    assert [r["benchmark"] for r in wu.read_benchmarks(tmp_path)] == [name]
    assert f"### {name}" in wu.write_report(tmp_path).read_text()
    if name == "gpt_throughput":  # tokens, not images: the second workload's own units
        (row,) = record["rows"]
        assert row["precision"] == "fp32" and row["tokens_per_s"] > 0 and row["timed_steps"] == 2
        assert record["summary"]["parameters"] == 840_960 and record["summary"]["tokens_per_step"] == 2 * 32
        assert record["summary"]["fp32_mfu"] is None  # a CPU has no data-sheet peak: unknown, never guessed
    if name == "gpt_variants":  # each change against the one before, the earlier model rebuilt for rung 0
        rows = {row["change"]: row for row in record["rows"]}
        assert list(rows) == ["before", "fused qkv", "max count"]
        assert rows["before"]["parameters"] == 840_960 + 4 * 3 * 128  # three layers with biases, as it was
        assert rows["fused qkv"]["parameters"] == rows["max count"]["parameters"] == 840_960
        assert rows["before"]["vs_previous"] is None and rows["max count"]["vs_previous"] == pytest.approx(
            rows["max count"]["tokens_per_s"] / rows["fused qkv"]["tokens_per_s"])
        assert all(math.isfinite(row["final_train_loss"]) for row in rows.values())
        assert record["summary"]["kit_model_tokens_per_s"] == pytest.approx(rows["max count"]["tokens_per_s"])
    if name == "optimization_ladder":  # beside its speeds, what bounds each rung that ran
        ran = [row["rung"] for row in record["rows"] if row["samples_per_s"] is not None]
        breakdown = record["tables"]["breakdown"]
        assert [row["rung"] for row in breakdown] == ran
        assert all(row["forward_ms"] > 0 and row["host_syncs_per_step"] == 0 for row in breakdown)
        assert record["summary"]["top_rung_biggest_part"] in ("data", "forward", "backward", "optimizer", "other")
        assert 0 < record["summary"]["top_rung_biggest_part_share"] <= 1
        assert record["summary"]["compile_wait_s"] is None  # --no-compile: no compiler wait to judge


@pytest.mark.slow
def test_without_a_run_dir_a_benchmark_gets_a_new_run_folder(tmp_path, monkeypatch):
    monkeypatch.setenv("WORKSHOP_RUNS", str(tmp_path))
    module, options = tiny("loader_paths", monkeypatch)
    first = module.main(["--profile", "cpu", "--repeats", "1", *options])
    second = module.main(["--profile", "cpu", "--repeats", "1", *options])
    assert first.parent.parent.parent == tmp_path and first.parent.parent.name.endswith("-bench-loader_paths")
    assert first != second and first.exists() and second.exists()  # never into an earlier run's folder


@pytest.mark.slow  # four tiny training runs
def test_annotation_overhead_measures_both_modes_and_their_ratio(tmp_path, monkeypatch):
    module, options = tiny("annotation_overhead", monkeypatch)
    path = module.main(["--profile", "cpu", "--run-dir", str(tmp_path), "--repeats", "2", *options])
    record = json.loads(path.read_text())
    assert tuple(record) == benchmark.LAYOUT_KEYS and record["settings"]["repeats"] == 2
    assert [(row["mode"], row["annotate"]) for row in record["rows"]] == [("annotate off", False),
                                                                           ("annotate on", True)]
    for row in record["rows"]:
        assert row["runs"] == 2 and row["samples_per_s"] > 0 and row["step_ms_median"] > 0
    summary = record["summary"]
    assert summary["annotate_on_vs_off"] > 0 and summary["annotate_on_vs_off_per_pass_median"] > 0
    assert summary["step_ms_median_off"] > 0 and summary["step_ms_median_on"] > 0
    assert len(summary["load_average_1_5_15_min"]) == 3


BAD_FLAGS = [(["--profile", "tpu"], "--profile"), (["--repeats", "0"], "--repeats"),
             (["--repeats", "many"], "--repeats"), (["--out", "x.json"], "Unrecognized arguments: --out")]


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("args, named", BAD_FLAGS, ids=["profile", "repeats-0", "repeats-word", "old-out"])
def test_bad_flags_are_one_line_and_exit_2(name, args, named, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("WORKSHOP_RUNS", str(tmp_path))
    with pytest.raises(SystemExit) as stop:
        load(name).main(args)
    assert stop.value.code == 2
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and " Fix: " in lines[0], captured.err
    assert named in lines[0] and "--run-dir DIR" in lines[0]
    assert not list(tmp_path.iterdir()), "a refused run must leave no folder behind"


@pytest.mark.slow  # a subprocess
@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without a GPU")
def test_a_missing_gpu_is_one_line_from_the_command_line(tmp_path):
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "loader_paths.py"), "--profile", "gpu",
                           "--run-dir", str(tmp_path / "run")], capture_output=True, text=True, cwd=tmp_path)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        "error: The 'gpu' profile was asked for, but PyTorch sees no CUDA GPU. "
        "Fix: use profile='auto' or 'cpu' on this machine."]
    assert not (tmp_path / "run").exists()


def test_the_reader_names_a_file_that_is_not_in_the_layout(tmp_path):
    path = benchmark.write_benchmark("demo", "cpu", "cpu", {"timed_batches": 3}, [{"x_s": 1.0}], tmp_path)
    assert benchmark.read_benchmark(path)["rows"] == [{"x_s": 1.0}]
    (tmp_path / "benchmarks" / "old.json").write_text(json.dumps({"kind": "benchmark", "table": []}))
    with pytest.raises(wu.WorkshopError, match="old.json is not in the benchmark layout"):
        wu.read_benchmarks(tmp_path)
    problems = []
    assert [r["benchmark"] for r in wu.read_benchmarks(tmp_path, problems)] == ["demo"]
    assert len(problems) == 1 and "old.json" in problems[0]
    with pytest.raises(wu.WorkshopError, match="'cpu' or 'gpu'"):
        benchmark.write_benchmark("demo", "auto", "cpu", {}, [], tmp_path)


class ReachedTraining(Exception):
    """Raised where a run would start on the (fake) GPU: every argument up to there was accepted."""


@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.slow) if n == "accuracy_spread" else n
                                  for n in NAMES if n != "loader_paths"])  # loader_paths trains nothing
def test_every_training_benchmark_hands_its_gpu_device_to_training_in_a_form_training_accepts(name, tmp_path, monkeypatch):
    # On a GPU a benchmark's device is torch.device("cuda:0"): str() of it once made every training run refuse
    # to start ("Unknown device 'cuda:0'"). Here a fake GPU goes as far as the training loop's device choice.
    from workshop_utils.spine import distributed, trainer
    from workshop_utils.system import hardware

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA H100 80GB HBM3")
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    monkeypatch.setattr(benchmark, "pick_device", lambda prefer=None: torch.device("cuda", 0))
    monkeypatch.setattr(hardware, "pick_device", lambda prefer=None: torch.device("cuda", 0))
    reached = []

    def device_choice(device=None, timeout_s=300):
        reached.append(distributed.rank_device(0, device, env={}))  # the real choice, on the fake GPU
        raise ReachedTraining

    monkeypatch.setattr(trainer, "setup_distributed", device_choice)
    module, options = tiny(name, monkeypatch, "gpu")
    with pytest.raises(ReachedTraining):
        module.main(["--profile", "gpu", "--run-dir", str(tmp_path), "--repeats", "1", *options])
    assert reached == [torch.device("cuda", 0)]
