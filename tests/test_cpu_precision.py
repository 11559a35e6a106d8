"""CPUs without native 16-bit arithmetic: the emulated modes are noticed and sized down or skipped, loudly."""

import torch

import workshop_utils as wu
from workshop_utils.spine import precision


def test_the_probe_measures_a_ratio_once_per_process(monkeypatch):
    monkeypatch.setattr(precision, "_slowdowns", {})
    ratio = precision.autocast_slowdown("bf16", repeats=1)
    assert 0 < ratio < 1000
    assert precision.autocast_slowdown("bf16") == ratio  # cached: the notebooks ask several times
    assert precision.autocast_slowdown("fp32") == 1.0 and precision.autocast_slowdown("tf32") == 1.0


def test_an_avx2_only_cpu_sizes_bf16_down_and_says_why(monkeypatch, capsys):
    # what an AVX2-only CPU measured: bf16 autocast 15x, fp16 19x slower than fp32
    monkeypatch.setattr(precision, "_slowdowns", {"bf16": 15.3, "fp16": 19.4})
    base = wu.TrainConfig(model="simplecnn", device="cpu", max_steps=8, warmup_steps=2)
    configs = {c.precision: c for c in wu.precision_configs(base)}
    assert {p: c.max_steps for p, c in configs.items()} == {"fp32": 8, "tf32": 8, "fp16": 2, "bf16": 2}
    out = capsys.readouterr().out
    assert "bf16 autocast is emulated on this CPU" in out and "15x slower" in out and "runs 2 steps" in out


def test_emulated_modes_can_be_skipped_with_a_reason(monkeypatch, capsys):
    monkeypatch.setattr(precision, "_slowdowns", {"bf16": 15.3, "fp16": 19.4})
    base = wu.TrainConfig(model="resnet18", device="cpu", max_steps=8)
    assert [c.precision for c in wu.precision_configs(base, cpu_emulated_steps=0)] == ["fp32", "tf32"]
    assert capsys.readouterr().out.count("so it is skipped") == 2


def test_a_cpu_with_native_bf16_runs_it_in_full_and_a_gpu_is_never_probed(monkeypatch, capsys):
    monkeypatch.setattr(precision, "_slowdowns", {"bf16": 0.9, "fp16": 30.0})
    base = wu.TrainConfig(model="simplecnn", device="cpu", max_steps=8)
    steps = {c.precision: c.max_steps for c in wu.precision_configs(base)}
    assert steps["bf16"] == 8 and steps["fp16"] == 2
    assert "bf16" not in capsys.readouterr().out
    assert wu.emulated_on_cpu("fp16", torch.device("cuda")) is None


def test_fp16_counts_as_emulated_on_a_cpu_even_when_the_small_probe_runs_fast(monkeypatch):
    # seen on an AVX-512 CPU: the probe's conv ran fp16 at 0.97x fp32, a ResNet-18 fp16 step took minutes
    monkeypatch.setattr(precision, "_slowdowns", {"bf16": 0.9, "fp16": 0.97})
    assert "emulated" in wu.emulated_on_cpu("fp16", torch.device("cpu"))
    assert wu.emulated_on_cpu("bf16", torch.device("cpu")) is None
