"""CPUs without native 16-bit arithmetic: the emulated modes are known from what the CPU reports, sized down
or skipped loudly, and the plan is the same on a busy machine as on an idle one."""

import json
import time
from pathlib import Path

import pytest
import torch

import workshop_utils as wu

ROOT = Path(__file__).resolve().parents[1]
CPU = torch.device("cpu")


@pytest.mark.parametrize("kind, native", [("avx2", False), ("avx512-bf16", True), ("avx512-no-bf16", False),
                                          ("arm-bf16", True)])
def test_bf16_is_native_only_where_the_cpu_has_bf16_instructions_and_onednn_uses_them(fake_cpu, kind, native):
    fake_cpu(kind)
    assert wu.cpu_16bit_support()["native_bf16"] is native
    assert (wu.emulated_on_cpu("bf16", CPU) is None) is native
    assert "emulated" in wu.emulated_on_cpu("fp16", CPU)  # fp16 on every CPU: most layers have no fp16 kernel
    assert wu.emulated_on_cpu("bf16", torch.device("cuda")) is None and wu.emulated_on_cpu("fp32", CPU) is None
    assert wu.environment(CPU)["cpu_native_bf16"] is native  # every record says which plan its CPU got


def test_the_reason_names_what_the_cpu_lacks(fake_cpu):
    fake_cpu("avx2")
    assert "(AVX2, oneDNN reports no native bf16)" in wu.emulated_on_cpu("bf16", CPU)
    fake_cpu("avx512-no-bf16")
    assert "(AVX512, no AVX-512 BF16 or AMX instructions)" in wu.emulated_on_cpu("bf16", CPU)


@pytest.mark.parametrize("kind", ["avx2", "avx512-bf16"])
def test_a_slow_clock_does_not_change_the_decision(fake_cpu, monkeypatch, kind):
    """A neighbour's job slows every timing; what runs must not follow it."""
    fake_cpu(kind)
    idle = [wu.emulated_on_cpu(mode, CPU) for mode in wu.PRECISIONS]
    clock = {"t": 0.0}

    def busy_clock():  # each reading 10 s after the last: any timed probe would see a crawling machine
        clock["t"] += 10.0
        return clock["t"]

    for name in ("perf_counter", "monotonic", "time", "process_time"):
        monkeypatch.setattr(time, name, busy_clock)
    assert [wu.emulated_on_cpu(mode, CPU) for mode in wu.PRECISIONS] == idle
    assert clock["t"] == 0.0  # and no clock was read to decide


def _notebook_03_plan(capsys):
    """Notebook 03's runs in its cpu profile, as its training cell plans them, and what it printed."""
    hp = wu.notebook_profiles(ROOT / "notebooks" / "03_mixed_precision.ipynb")["cpu"]
    base = wu.TrainConfig(batch_size=hp["batch_size"], max_steps=hp["max_steps"], warmup_steps=2, device="cpu")
    configs = wu.precision_plan(base, hp["modes"])
    return {(c.model, c.precision): c.max_steps for c in configs}, capsys.readouterr().out


def test_notebook_03_on_an_avx2_cpu_cuts_the_emulated_modes_and_says_what_a_gpu_shows(fake_cpu, capsys):
    fake_cpu("avx2")
    plan, out = _notebook_03_plan(capsys)
    assert plan == {("simplecnn", "fp32"): 60, ("simplecnn", "tf32"): 60, ("simplecnn", "fp16"): 2,
                    ("simplecnn", "bf16"): 2, ("resnet18", "fp32"): 60}
    assert "simplecnn-bf16: bf16 autocast is emulated on this CPU (AVX2" in out and "runs only 2 steps" in out
    assert "resnet18-bf16: bf16 autocast is emulated" in out and "so it is skipped;" in out
    assert "Cut short or skipped on this CPU: bf16, fp16;" in out and "GPU" in out.splitlines()[-1]


def test_a_speed_probe_evaluates_on_few_samples(fake_cpu, capsys):
    """Its accuracy is never compared, and its emulated evaluation of 512 images took longer than its steps."""
    fake_cpu("avx2")
    base = wu.TrainConfig(batch_size=16, max_steps=60, test_size=512, warmup_steps=2, device="cpu")
    sizes = {c.precision: c.test_size for c in wu.precision_plan(base, {"simplecnn": ("fp32", "fp16", "bf16")})}
    assert sizes == {"fp32": 512, "fp16": 64, "bf16": 64}


def test_notebook_03_on_a_cpu_with_native_bf16_runs_bf16_in_full(fake_cpu, capsys):
    fake_cpu("avx512-bf16")
    plan, out = _notebook_03_plan(capsys)
    assert plan == {("simplecnn", "fp32"): 60, ("simplecnn", "tf32"): 60, ("simplecnn", "fp16"): 2,
                    ("simplecnn", "bf16"): 60, ("resnet18", "fp32"): 60, ("resnet18", "bf16"): 60}
    assert "bf16 autocast" not in out and "Cut short or skipped on this CPU: fp16;" in out


@pytest.mark.parametrize("cpu, bf16_steps", [("avx2", 2), ("avx512-bf16", 40)])
def test_notebook_03s_gpt_runs_bf16_in_full_only_where_the_cpu_computes_it(fake_cpu, capsys, cpu, bf16_steps):
    fake_cpu(cpu)
    hp = wu.notebook_profiles(ROOT / "notebooks" / "03_mixed_precision.ipynb")["cpu"]
    base = wu.TrainConfig(model="gpt", batch_size=hp["gpt_batch"], sequence_length=hp["gpt_sequence"],
                          max_steps=hp["gpt_steps"], warmup_steps=2, device="cpu")
    plan = {c.precision: c.max_steps for c in wu.precision_plan(base, {"gpt": hp["gpt_modes"]})}
    assert plan == {"fp32": 40, "bf16": bf16_steps}
    assert ("gpt-bf16: bf16 autocast is emulated" in capsys.readouterr().out) == (cpu == "avx2")


def test_the_gpu_figure_comes_from_a_gpu_run_when_one_is_recorded(tmp_path, monkeypatch):
    from workshop_utils.system import gpu_records

    monkeypatch.setattr(gpu_records, "GPU_RECORDS", tmp_path)
    assert "no GPU run of resnet18 in bf16 is recorded" in wu.gpu_reference_speedup()
    env = {"device_name": "NVIDIA H100 80GB HBM3", "date": "2027-01-02T10:00:00+00:00"}
    (tmp_path / "gpu_run-x" / "results").mkdir(parents=True)
    (tmp_path / "gpu_run-x" / "gpu_run.json").write_text(json.dumps({"kind": "gpu_run", "profile": "gpu",
                                                                      "environment": env, "created": "2027-01-02"}))
    for mode, speed in (("fp32", 1000.0), ("bf16", 3100.0)):
        (tmp_path / "gpu_run-x" / "results" / f"resnet18-{mode}-cl.json").write_text(json.dumps(
            {"metrics": {"samples_per_s": speed}, "environment": env}))
    assert wu.gpu_reference_speedup() == ("on one H100 80GB HBM3, 2027-01-02, notebook 03's gpu profile ran resnet18 "
                                          "in bf16 at 3.10x fp32's samples/s (results/reference/gpu/)")


@pytest.mark.parametrize("kind, bf16_rung", [("avx2", False), ("avx512-bf16", True)])
def test_the_ladder_has_its_bf16_rung_only_where_bf16_is_native(fake_cpu, kind, bf16_rung):
    fake_cpu(kind)
    rungs = {r.label: r for r in wu.ladder_rungs(compile=False, device="cpu")}
    assert (rungs["BF16 autocast"].not_here is None) is bf16_rung


def test_an_emulated_mode_runs_a_few_steps_and_keeps_one_timed_step(fake_cpu, capsys):
    fake_cpu("avx2")
    base = wu.TrainConfig(model="simplecnn", device="cpu", max_steps=8, warmup_steps=5)
    configs = {c.precision: c for c in wu.precision_configs(base, cpu_emulated_steps=3)}
    assert {p: c.max_steps for p, c in configs.items()} == {"fp32": 8, "tf32": 8, "fp16": 3, "bf16": 3}
    assert configs["bf16"].warmup_steps == 2
    assert wu.precision_configs(base, ("fp32", "bf16"), cpu_emulated_steps=0)[-1].precision == "fp32"
    assert capsys.readouterr().out.count("bf16 autocast is emulated") == 2
