"""Live utilisation sampling and the per-step memory probe (CPU paths; the GPU path reads NVML)."""

import json
import subprocess
import sys
import time

import pandas as pd
import pytest
import torch

import workshop_utils as wu


def test_monitor_samples_cpu_utilisation_while_work_runs():
    with wu.DeviceMonitor(interval_s=0.05, device="cpu") as monitor:
        x = torch.randn(300, 300)
        until = time.perf_counter() + 0.6  # a fixed time, not a fixed amount of work: machines differ 10x
        while time.perf_counter() < until:
            x = torch.tanh(x @ x)
    frame = monitor.frame()
    assert monitor.source == "cpu" and len(frame) >= 3
    assert frame["t_s"].is_monotonic_increasing
    assert frame["utilization_pct"].between(0, 100).all() and (frame["memory_used_mib"] > 0).all()
    assert frame["power_w"].isna().all()  # a CPU sample has no power or temperature reading


def test_monitor_rejects_a_non_positive_interval():
    with pytest.raises(wu.WorkshopError, match="interval_s"):
        wu.DeviceMonitor(interval_s=0)


def test_verdict_flags_a_starved_device_and_passes_a_busy_one():
    starved = pd.DataFrame({"utilization_pct": [30.0, 50.0, 90.0]})
    busy = pd.DataFrame({"utilization_pct": [95.0, 99.0, 97.0]})
    assert "bottleneck" in wu.monitor_verdict(starved) and "67% of samples under 80%" in wu.monitor_verdict(starved)
    assert "busy" in wu.monitor_verdict(busy)
    assert "No samples" in wu.monitor_verdict(pd.DataFrame({"utilization_pct": []}))


def test_plot_shows_the_threshold_and_skips_missing_power():
    frame = pd.DataFrame({"t_s": [0.1, 0.2], "utilization_pct": [50.0, 90.0], "memory_used_mib": [10.0, 12.0],
                          "power_w": [None, None], "temperature_c": [None, None]})
    fig = wu.plot_monitor(frame)
    assert len(fig.axes) == 2  # utilisation and memory; no empty power or temperature panels
    assert any("80%" in text.get_text() for text in fig.axes[0].get_legend().get_texts())


def test_monitor_records_memory_allocated_while_it_samples():
    with wu.DeviceMonitor(interval_s=0.05, device="cpu") as monitor:
        time.sleep(0.3)
        block = torch.ones(128 * 2**20 // 4)  # 128 MiB, written to, so resident
        time.sleep(0.4)
    frame = monitor.frame()
    before = frame.loc[frame["t_s"] < 0.25, "memory_used_mib"]
    after = frame["memory_used_mib"].iloc[-3:]
    assert len(before) >= 2, frame
    assert after.min() - before.max() == pytest.approx(128, abs=24), frame
    steps = frame["t_s"].diff().dropna()
    assert steps.min() >= 0.045 and steps.median() < 0.2, "samples come every interval_s, not faster, not stalled"
    del block


# Run in a fresh interpreter: after hundreds of tests glibc's heap may hold a large free region, and a
# 64 MiB tensor carved from pages already resident moves neither the resident size nor its high-water mark.
STEP_MEMORY_SCRIPT = """
import json, torch
import workshop_utils as wu
probe = wu.StepMemory("cpu")
block = torch.ones(64 * 2**20 // 4)  # 64 MiB held in the first step
probe(1)
del block  # freed, but it was still held as step 2 began
probe(2)
small = torch.ones(40 * 2**20 // 4)  # 40 MiB: step 3's peak only
probe(3)
del small
capped = wu.StepMemory("cpu", limit_mib=1.0)
big = torch.ones(64 * 2**20 // 4)  # 64 MiB: over the cap
try:
    capped(1)
    refused = ""
except torch.OutOfMemoryError as error:
    refused = str(error)
print(json.dumps({"frame": probe.frame().to_dict("list"), "max_mib": probe.max_mib, "refused": refused}))
"""


@pytest.mark.slow  # a subprocess
def test_step_memory_records_every_step_and_enforces_its_cap():
    done = subprocess.run([sys.executable, "-c", STEP_MEMORY_SCRIPT], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout.splitlines()[-1])
    assert result["frame"]["step"] == [1, 2, 3]
    peaks = result["frame"]["peak_memory_mib"]
    assert peaks == pytest.approx([64, 64, 40], abs=8), peaks
    assert result["max_mib"] == max(peaks)
    assert "memory cap" in result["refused"], result
