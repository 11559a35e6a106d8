import json
import re
import subprocess
import sys

import pandas as pd
import pytest

import workshop_utils as wu
import workshop_utils.system.profiles  # noqa: F401  (for monkeypatching)


def test_report_gathers_sections_in_order(tmp_path):
    fig = wu.plot_bars(["a", "b"], [1.0, 2.0], "samples/s", "demo", baseline=1.0)
    png = wu.save_figure(fig, tmp_path, "demo")
    wu.add_report_section(tmp_path, "second", "Second section", order=2, text="later",
                          table=pd.DataFrame({"x": [1], "y": [2.5]}))
    wu.add_report_section(tmp_path, "first", "First section", order=1, text="hello", figures=[png])
    text = wu.write_report(tmp_path).read_text()
    assert text.index("## First section") < text.index("## Second section")
    assert "![demo](figures/demo.png)" in text and "| x |" in text.replace("|   x |", "| x |")
    assert "## Environment" in text and "PyTorch" in text


@pytest.mark.slow
def test_report_of_a_missing_folder_says_what_to_run(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "workshop_utils.report", str(tmp_path / "nope")],
                          capture_output=True, text=True)
    assert proc.returncode == 2 and "run the main job first" in proc.stderr
    assert proc.stderr.count("\n") == 1


def test_profiles_pick_cpu_without_a_gpu_and_apply_overrides(monkeypatch):
    monkeypatch.setattr(wu.system.profiles.torch.cuda, "is_available", lambda: False)
    profiles = {"cpu": {"epochs": 1, "batch_size": 8}, "gpu": {"epochs": 9, "batch_size": 512}}
    settings = wu.pick_settings(profiles, "auto", epochs=3, batch_size=None)
    assert settings == {"epochs": 3, "batch_size": 8, "profile": "cpu"}
    with pytest.raises(wu.WorkshopError, match="Unknown setting"):
        wu.pick_settings(profiles, "cpu", epoch=3)
    with pytest.raises(wu.WorkshopError, match="no CUDA GPU"):
        wu.pick_settings(profiles, "gpu")


# ---------------------------------------------------------------------- banners follow the records


def _env(device_type: str, name: str) -> dict:
    gpus = [{"index": 0, "name": name, "memory_gib": 79.2}] if device_type == "cuda" else []
    return {"device_type": device_type, "device_name": name, "gpus": gpus, "torch": "2.x", "cuda": "12.x",
            "cudnn": None, "nccl": None, "python": "3.x", "cpu_cores": 16, "hostname": "gpu-node",
            "slurm": {}, "date": "2026-01-01T00:00:00+00:00"}


def _record(run_dir, name: str, device_type: str, data_source: str = "cifar10"):
    device = "NVIDIA H100 80GB HBM3" if device_type == "cuda" else "x86_64"
    wu.save_record({"kind": "train", "metrics": {"data_source": data_source}, "environment": _env(device_type, device)},
                   run_dir, name)


def test_cpu_banner_follows_the_records_not_the_machine_writing_the_report(tmp_path, monkeypatch):
    """A GPU node's results read on a CPU login node get no CPU banner; a CPU fallback on the GPU node does."""
    monkeypatch.setattr(wu.system.profiles.torch.cuda, "is_available", lambda: False)  # the writer has no GPU
    gpu_run = tmp_path / "gpu"
    _record(gpu_run, "baseline", "cuda")
    _record(gpu_run, "ddp-strong-2", "cuda")
    text = wu.write_report(gpu_run).read_text()
    assert "Measured on a CPU" not in text and "Measured on the CPU" not in text
    assert "**NVIDIA H100 80GB HBM3** (cuda)" in text and "Synthetic data" not in text

    _record(gpu_run, "beyond-collectives", "cpu", data_source="synthetic")  # gloo ranks on the GPU node
    text = wu.write_report(gpu_run).read_text()
    assert "> Measured on the CPU, not on a GPU: `beyond-collectives`." in text
    assert "**NVIDIA H100 80GB HBM3** (cuda)" in text, "the header still describes the GPU run"
    assert "Synthetic data" in text

    monkeypatch.setattr(wu.system.profiles.torch.cuda, "is_available", lambda: True)  # now the writer has a GPU
    cpu_run = tmp_path / "cpu"
    _record(cpu_run, "baseline", "cpu")
    assert "> Measured on a CPU: speed figures show the method" in wu.write_report(cpu_run).read_text()


def test_report_names_the_cpu_a_run_was_measured_on(tmp_path):
    """CPU speeds depend on the CPU's vector instructions (bf16 is emulated without AVX-512): the report says which."""
    run = tmp_path / "run"
    env = {**_env("cpu", "x86_64"), "cpu_model": "AMD EPYC 7B12", "cpu_capability": "AVX2"}
    wu.save_record({"kind": "train", "metrics": {"data_source": "synthetic"}, "environment": env}, run, "baseline")
    assert "- CPU: AMD EPYC 7B12 (AVX2), 16 cores available" in wu.write_report(run).read_text()
    _record(tmp_path / "older", "baseline", "cpu")  # a record written before the CPU was recorded
    assert "- CPU: model not recorded, 16 cores available" in wu.write_report(tmp_path / "older").read_text()


def test_report_lists_each_notebook_with_its_time_budget_and_cause(tmp_path):
    runs = [
        {"notebook": "01_a.ipynb", "status": "ok", "seconds": 95.04, "profile": "gpu", "budget_s": 300,
         "limit_s": 300, "over_budget": False, "check": True, "cell": None, "cell_source": "", "error": ""},
        {"notebook": "03_b.ipynb", "status": "FAILED", "seconds": 40.2, "profile": "gpu", "budget_s": 300,
         "limit_s": 300, "over_budget": False, "check": True, "cell": 9,
         "cell_source": "fig = wu.plot_gradient_magnitudes(grads)",
         "error": "TypeError: can't convert cuda:0 device type tensor to numpy | use .cpu()"},
        {"notebook": "05_c.ipynb", "status": "ok", "seconds": 301.5, "profile": "gpu", "budget_s": 300,
         "limit_s": 300, "over_budget": True, "check": True, "cell": None, "cell_source": "", "error": ""},
        {"notebook": "old.ipynb", "status": "ok", "seconds": 24.1, "error": ""},  # a log from before budgets
    ]
    (tmp_path / "notebooks.json").write_text(json.dumps(runs))
    text = wu.write_report(tmp_path).read_text()
    assert "Profile gpu; time budget 300 s per notebook, each stopped at 300 s." in text
    assert "**Pre-flight: NOT ready.** 1 failed, 1 passed over their time budget." in text
    assert "| 01_a.ipynb | ok | 95.0 | 300 |  |" in text
    assert ("| 03_b.ipynb | **FAILED** | 40.2 | 300 | In [9] `fig = wu.plot_gradient_magnitudes(grads)`: "
            "TypeError: can't convert cuda:0 device type tensor to numpy \\| use .cpu() |") in text
    assert "| 05_c.ipynb | ok, **over budget** | 301.5 | 300 |" in text and "Over budget: 05_c.ipynb." in text
    assert "| old.ipynb | ok | 24.1 |  |  |" in text


def test_one_unreadable_record_does_not_cost_the_report(tmp_path):
    _record(tmp_path, "baseline", "cuda")
    (tmp_path / "results" / "cut-short.json").write_text('{"kind": "train", "metr')
    with pytest.raises(wu.WorkshopError, match="cut-short.json is not a readable result record"):
        wu.read_records(tmp_path)
    (tmp_path / "notebooks.json").write_text('[{"notebook": "01_a.ipynb", "sta')  # an edit gone wrong
    text = wu.write_report(tmp_path).read_text()
    assert "Unreadable results, left out of this report" in text and "cut-short.json" in text
    assert "**notebooks.json is unreadable**" in text
    assert "**NVIDIA H100 80GB HBM3** (cuda)" in text


def test_report_shows_every_benchmark_as_a_table_and_counts_it_as_a_measurement(tmp_path, monkeypatch):
    from workshop_utils.system import benchmark

    monkeypatch.setattr(benchmark, "environment", lambda device: _env("cuda", "NVIDIA H100 80GB HBM3"))
    wu.add_report_section(tmp_path, "ladder", "The ladder", order=1, text="notebook 04")
    wu.write_benchmark("optimization_ladder", "gpu", "cuda", {"steps": 300, "batch_samples": 128},
                       pd.DataFrame({"rung": ["baseline", "bf16"], "samples_per_s": [1000.0, 4000.0]}), tmp_path,
                       summary={"top_vs_baseline": 4.0}, repeats=3,
                       tables={"breakdown": pd.DataFrame({"rung": ["baseline", "bf16"], "idle_ms": [0.75, 0.5]})})
    wu.write_benchmark("loader_paths", "gpu", "cuda", {"timed_batches": 200}, [{"path": "device", "samples_per_s": 9e5}],
                       tmp_path)
    (tmp_path / "benchmarks" / "broken.json").write_text('{"benchmark": "bro')
    text = wu.write_report(tmp_path).read_text()
    assert text.index("## The ladder") < text.index("## Benchmarks")
    assert text.index("### loader_paths") < text.index("### optimization_ladder")  # by name
    assert "Settings: steps=300, batch_samples=128, repeats=3." in text
    ladder = text[text.index("### optimization_ladder"):]  # a benchmark's second table is in the report too
    assert "Breakdown:" in ladder and re.search(r"\|\s*baseline\s*\|\s*0\.75\s*\|", ladder)
    assert "| baseline |" in text.replace("| baseline   |", "| baseline |") and "Summary: top_vs_baseline = 4." in text
    assert "**NVIDIA H100 80GB HBM3** (cuda)" in text and "Measured on" not in text
    assert "broken.json is not a readable benchmark result" in text  # named, and the rest still reported
    assert "No notebook recorded a report section" not in text


def test_a_folder_with_only_benchmarks_gets_a_report_with_their_environment(tmp_path):
    wu.write_benchmark("loader_paths", "cpu", "cpu", {"timed_batches": 3}, [{"path": "device", "samples_per_s": 1.0}],
                       tmp_path)
    text = wu.write_report(tmp_path).read_text()
    assert "### loader_paths" in text and "(no results recorded)" not in text
    assert "> Measured on a CPU" in text
