import subprocess
import sys

import pandas as pd
import pytest

import workshop_utils as wu
import workshop_utils.profiles  # noqa: F401  (for monkeypatching)


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


def test_report_of_a_missing_folder_says_what_to_run(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "workshop_utils.report", str(tmp_path / "nope")],
                          capture_output=True, text=True)
    assert proc.returncode == 2 and "run the main job first" in proc.stderr
    assert proc.stderr.count("\n") == 1


def test_profiles_pick_cpu_without_a_gpu_and_apply_overrides(monkeypatch):
    monkeypatch.setattr(wu.profiles.torch.cuda, "is_available", lambda: False)
    profiles = {"cpu": {"epochs": 1, "batch_size": 8}, "gpu": {"epochs": 9, "batch_size": 512}}
    settings = wu.pick_settings(profiles, "auto", epochs=3, batch_size=None)
    assert settings == {"epochs": 3, "batch_size": 8, "profile": "cpu"}
    with pytest.raises(wu.WorkshopError, match="Unknown setting"):
        wu.pick_settings(profiles, "cpu", epoch=3)
    with pytest.raises(wu.WorkshopError, match="no CUDA GPU"):
        wu.pick_settings(profiles, "gpu")
