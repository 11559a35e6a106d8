"""The four precision modes come from one TrainConfig, and their comparison and benchmark report them faithfully."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

import workshop_utils as wu

ROOT = Path(__file__).resolve().parents[1]


def test_precision_configs_differ_only_in_precision_and_name():
    base = wu.TrainConfig(model="resnet18", max_steps=50, channels_last=True, device="cuda", lr=0.2)
    configs = wu.precision_configs(base)
    assert [c.precision for c in configs] == list(wu.PRECISIONS)
    assert [c.name for c in configs] == [f"resnet18-{m}-cl" for m in wu.PRECISIONS]
    for config in configs:
        assert config.replace(name=base.name, precision=base.precision) == base


def test_an_emulated_mode_on_cpu_runs_only_a_few_steps(fake_cpu):
    fake_cpu("avx512-bf16")  # fp16 emulated, bf16 native
    base = wu.TrainConfig(max_steps=40, warmup_steps=5, device="cpu")
    fp16 = {c.precision: c for c in wu.precision_configs(base, cpu_emulated_steps=3)}["fp16"]
    assert fp16.max_steps == 3 and fp16.warmup_steps == 2  # at least one step is still timed
    assert {c.max_steps for c in wu.precision_configs(base, ("fp32", "bf16"))} == {40}


def record(model, precision, samples_per_s, acc, channels_last=False):
    metrics = {"steps": 10, "samples_per_s": samples_per_s, "step_ms_median": 1000 / samples_per_s,
               "peak_memory_mib": 100.0, "final_train_loss": 1.0, "final_test_acc": acc}
    return {"config": {"model": model, "precision": precision, "channels_last": channels_last}, "metrics": metrics}


def test_mode_table_computes_speedups_against_fp32_and_tf32_of_the_same_model():
    records = [record("resnet18", "fp32", 100, 0.80), record("resnet18", "tf32", 200, 0.80),
               record("resnet18", "bf16", 600, 0.795), record("simplecnn", "fp32", 1000, 0.70),
               record("simplecnn", "bf16", 1500, 0.71)]
    table = wu.mode_table(records).set_index(["model", "precision"])
    assert table.loc[("resnet18", "bf16"), "speed-up vs fp32"] == pytest.approx(6)
    assert table.loc[("resnet18", "bf16"), "speed-up vs tf32"] == pytest.approx(3)
    assert table.loc[("resnet18", "bf16"), "acc vs fp32 (points)"] == pytest.approx(-0.5)
    assert table.loc[("simplecnn", "bf16"), "speed-up vs fp32"] == pytest.approx(1.5)
    assert table["speed-up vs tf32"].isna().loc["simplecnn"].all()  # no tf32 run of that model: unknown, not guessed


@pytest.mark.slow
@pytest.mark.parametrize("cpu, bf16_steps", [("avx512-bf16", 3), ("avx2", 2)])
def test_trainer_runs_the_modes_and_the_table_reads_the_records(fake_cpu, cpu, bf16_steps):
    # The same verdict on every machine: the plan follows the CPU kind this test names, not the one it runs on.
    fake_cpu(cpu)
    data = wu.make_synthetic_cifar(64, 32)
    base = wu.TrainConfig(batch_size=16, max_steps=3, warmup_steps=1, device="cpu", loader="device", progress=False)
    records = [wu.train(c, data).record for c in wu.precision_configs(base, ("fp32", "bf16"))]
    assert [r["config"]["precision"] for r in records] == ["fp32", "bf16"]
    table = wu.mode_table(records).set_index("precision")
    assert (table.loc["fp32", "steps"], table.loc["bf16", "steps"]) == (3, bf16_steps)
    assert table["samples/s"].gt(0).all()


@pytest.mark.slow
def test_benchmark_script_writes_json(tmp_path):
    subprocess.run([sys.executable, str(ROOT / "benchmarks" / "precision_modes.py"), "--profile", "cpu",
                    "--model", "simplecnn", "--modes", "fp32", "bf16", "--steps", "2", "--warmup-steps", "1",
                    "--batch-size", "16", "--train-size", "32", "--run-dir", str(tmp_path)],
                   check=True, cwd=tmp_path, capture_output=True)
    record = json.loads((tmp_path / "benchmarks" / "precision_modes.json").read_text())
    assert record["benchmark"] == "precision_modes" and record["profile"] == "cpu"
    assert [row["precision"] for row in record["rows"]] == ["fp32", "bf16"]
    assert record["rows"][0]["speed-up vs fp32"] == 1
    assert record["settings"]["model"] == "simplecnn" and record["settings"]["steps"] == 2
    assert record["environment"]["device_type"] == "cpu"
    assert "tables" not in record, "the cpu profile sweeps no batch sizes unless asked"


@pytest.mark.slow
def test_benchmark_rejects_an_unknown_mode_in_one_line(tmp_path):
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "precision_modes.py"), "--profile", "cpu",
                           "--modes", "fp32", "fp8", "--run-dir", str(tmp_path / "run")],
                          cwd=tmp_path, capture_output=True, text=True)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines()[-1].startswith("error: Unknown precision 'fp8'.")
    assert not (tmp_path / "run").exists()


@pytest.mark.slow
def test_benchmark_batch_sweep_goes_into_the_json_beside_the_comparison(tmp_path, capsys):
    import importlib.util

    script = ROOT / "benchmarks" / "precision_modes.py"
    spec = importlib.util.spec_from_file_location("benchmark_precision_modes", script)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    path = module.main(["--profile", "cpu", "--model", "simplecnn", "--modes", "fp32", "bf16", "--steps", "2",
                        "--warmup-steps", "1", "--batch-size", "16", "--train-size", "32", "--run-dir", str(tmp_path),
                        "--batch-sweep", "8", "16"])
    assert "modes compared at batch 16" in capsys.readouterr().out
    record = json.loads(path.read_text())
    assert record["settings"]["batch_samples"] == 16 and record["summary"]["modes_compared_at_batch_samples"] == 16
    assert record["settings"]["batch_sweep_samples"] == [8, 16]
    sweep = record["tables"]["batch_sweep"]
    assert [(row["batch_size"], row["precision"]) for row in sweep] == [(8, "fp32"), (8, "bf16"), (16, "fp32"),
                                                                        (16, "bf16")]
    assert [row["speedup_vs_fp32"] for row in sweep if row["precision"] == "fp32"] == [1, 1]
    assert (path.parent / "precision_modes_batch_sweep.png").stat().st_size > 0
    assert [r["benchmark"] for r in wu.read_benchmarks(tmp_path)] == ["precision_modes"]  # still the one layout
