"""The all-reduce cost model: the fit recovers a known link, predictions behave, measurement runs."""

from __future__ import annotations

import subprocess
import sys

import pytest

from workshop_utils.comm_model import (LINKS, Link, bus_bandwidth_gbps, fit_link, predict_scaling,
                                       ring_all_reduce_s)
from workshop_utils.launch import launch_torchrun

LINK = Link("test link", bandwidth_gbps=2.0, latency_us=50.0, source="made up")


def test_fit_recovers_latency_and_bandwidth_of_the_ring_model():
    sizes = [4096 * 4**k for k in range(8)]
    times = [ring_all_reduce_s(n, 4, LINK) for n in sizes]
    fitted = fit_link(sizes, times, 4)
    assert fitted.bandwidth_gbps == pytest.approx(2.0, rel=1e-6)
    assert fitted.latency_us == pytest.approx(50.0, rel=1e-6)


def test_bus_bandwidth_of_a_two_process_ring_is_bytes_over_time():
    assert bus_bandwidth_gbps(1e9, 0.5, 2) == pytest.approx(2.0)
    assert bus_bandwidth_gbps(1e9, 0.5, 8) == pytest.approx(2.0 * 2 * 7 / 8)


def test_predictions_lose_efficiency_with_scale_and_across_nodes():
    table = predict_scaling(0.02, 45e6, [1, 8, 64, 512], LINKS["nvlink4"], LINKS["ib_ndr"])
    assert table.loc[0, "efficiency_no_overlap"] == 1.0 and table.loc[0, "all_reduce_ms"] == 0.0
    efficiency = table["efficiency_no_overlap"].tolist()
    assert efficiency == sorted(efficiency, reverse=True) and efficiency[-1] < efficiency[1]
    assert (table["efficiency_overlap"] >= table["efficiency_no_overlap"]).all()
    assert table.loc[1, "link"] == LINKS["nvlink4"].name and table.loc[2, "link"] == LINKS["ib_ndr"].name


def test_every_link_figure_says_where_it_comes_from():
    for link in LINKS.values():
        assert link.bandwidth_gbps > 0 and link.latency_us > 0 and len(link.source) > 20


def test_all_reduce_is_measured_on_two_gloo_processes(tmp_path):
    out = tmp_path / "all_reduce.json"
    args = ["--max-mib", "1", "--repeats", "3", "--device", "cpu", "--out", str(out)]
    launched = launch_torchrun("workshop_utils.comm_model", args, 2, device="cpu", out=out, echo=False,
                               timeout_s=180)
    record = launched.record
    assert record["world_size"] == 2 and record["backend"] == "gloo"
    assert [r["size_bytes"] for r in record["rows"]] == [4096 * 4**k for k in range(5)]  # 4 KiB .. 1 MiB
    assert all(r["seconds"] > 0 for r in record["rows"])
    assert record["link"]["bandwidth_gbps"] > 0


def test_one_process_has_nobody_to_all_reduce_with():
    result = subprocess.run([sys.executable, "-m", "workshop_utils.comm_model"], capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 2 and result.stderr.strip().startswith("error: One process")
