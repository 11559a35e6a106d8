"""The all-reduce cost model: the fit recovers a known link, predictions behave, measurement runs."""

from __future__ import annotations

import json
import math
import subprocess
import sys

import pytest

import workshop_utils as wu

from workshop_utils.parallel.comm_model import (LINKS, Link, bus_bandwidth_gbps, ddp_buckets, exposed_communication_s,
                                       fit_link, link_measurement_plan, predict_scaling, ring_all_reduce_s)
from workshop_utils.system.errors import WorkshopError
from workshop_utils.parallel.launch import launch_torchrun

LINK = Link("test link", bandwidth_gbps=2.0, latency_us=50.0, source="made up")


def test_ring_all_reduce_time_is_the_alpha_beta_formula():
    # 4 processes, 8 MB over LINK (2 GB/s, 50 us), by hand: 2(p-1) = 6 latency hops and 2(p-1)/p = 1.5 times
    # the message over the link: 6 * 50e-6 s + 1.5 * 8e6 B / 2e9 B/s = 0.0003 s + 0.006 s.
    assert ring_all_reduce_s(8e6, 4, LINK) == pytest.approx(0.0063, rel=1e-12)
    assert ring_all_reduce_s(1e6, 2, LINK) == pytest.approx(2 * 50e-6 + 1e6 / 2e9, rel=1e-12)  # 0.0006 s
    assert ring_all_reduce_s(0, 8, LINK) == pytest.approx(14 * 50e-6)  # an empty message still pays the hops
    assert ring_all_reduce_s(8e6, 1, LINK) == 0.0


def test_fit_recovers_latency_and_bandwidth_from_times_made_by_hand():
    # Times of a 4-process ring on a 2 GB/s, 50 us link, written out without the model: 300 us + 1.5 n / 2e9.
    sizes = [4096 * 4**k for k in range(8)]
    times = [300e-6 + 1.5 * n / 2e9 for n in sizes]
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


@pytest.mark.parametrize("step_s,grad_bytes", [(0.02, 45e6), (0.1, 9.9e6), (0.005, 45e6), (0.5, 2e5), (0.03, 4e8)])
def test_overlap_hides_some_communication_but_never_all(step_s, grad_bytes):
    table = predict_scaling(step_s, grad_bytes, [1, 2, 8, 64, 512], LINKS["nvlink4"], LINKS["ib_ndr"])
    assert (table["efficiency_overlap"] <= 1).all()
    assert (table["efficiency_overlap"] >= table["efficiency_no_overlap"]).all()
    talking = table[table.all_reduce_ms > 0]
    assert len(talking) == 4 and (talking["efficiency_overlap"] < 1).all(), "the last bucket can never hide"
    assert table.loc[0, "efficiency_overlap"] == 1.0  # one process: nothing to communicate
    overlap = table["efficiency_overlap"].tolist()
    assert overlap[-1] < overlap[1], "at 512 processes more is exposed than at 2"


def test_ddp_buckets_follow_the_default_caps():
    mib = 2**20
    assert ddp_buckets(45 * mib) == [1 * mib, 25 * mib, 19 * mib]
    assert ddp_buckets(0.5 * mib) == [0.5 * mib]
    assert sum(ddp_buckets(123_456_789)) == pytest.approx(123_456_789)
    assert ddp_buckets(0) == []


def test_exposed_time_is_the_last_bucket_when_backward_is_long_and_everything_when_it_is_one_bucket():
    buckets = ddp_buckets(45 * 2**20)
    last = ring_all_reduce_s(buckets[-1], 8, LINK)
    total = sum(ring_all_reduce_s(b, 8, LINK) for b in buckets)
    assert exposed_communication_s(100.0, buckets, 8, LINK) == pytest.approx(last)  # a very long backward pass
    assert exposed_communication_s(1e-9, buckets, 8, LINK) == pytest.approx(total, rel=1e-6)  # no time to hide
    one = ddp_buckets(2**19)
    assert exposed_communication_s(1.0, one, 8, LINK) == pytest.approx(ring_all_reduce_s(2**19, 8, LINK))
    assert exposed_communication_s(1.0, buckets, 1, LINK) == 0.0


def test_bad_prediction_inputs_are_one_line_errors():
    with pytest.raises(WorkshopError, match="step time"):
        predict_scaling(0, 45e6, [1, 2], LINK)
    with pytest.raises(WorkshopError, match="backward_share"):
        predict_scaling(0.02, 45e6, [1, 2], LINK, backward_share=1.5)
    with pytest.raises(WorkshopError, match="World sizes"):
        predict_scaling(0.02, 45e6, [0, 2], LINK)


@pytest.mark.parametrize("gpus", [0, 1, 2, 4, 8])
def test_the_link_measured_is_the_one_the_ranks_use(gpus):
    world_sizes = [p for p in (1, 2, 4, 8) if p <= max(gpus, 2)]
    plan = link_measurement_plan(gpus, world_sizes)
    if gpus >= 2:
        assert plan.device == "cuda" and plan.is_training_link and plan.processes == gpus
    elif gpus == 1:
        # A CPU gloo link is only a demonstration on a GPU node, never the GPU's link.
        assert plan.device == "cpu" and not plan.is_training_link and "no GPU-to-GPU link" in plan.note
    else:
        assert plan.device == "cpu" and plan.is_training_link and plan.processes == 2
    assert "\n" not in plan.note


def test_every_link_figure_says_where_it_comes_from():
    for link in LINKS.values():
        assert link.bandwidth_gbps > 0 and link.latency_us > 0 and len(link.source) > 20


@pytest.mark.slow
def test_all_reduce_is_measured_on_two_gloo_processes(tmp_path):
    out = tmp_path / "all_reduce.json"
    args = ["--max-mib", "1", "--repeats", "3", "--device", "cpu", "--out", str(out)]
    launched = launch_torchrun("workshop_utils.comm_model", args, 2, device="cpu", out=out, echo=False,
                               timeout_s=180)
    record = launched.record
    assert record["world_size"] == 2 and record["backend"] == "gloo"
    assert [r["size_bytes"] for r in record["rows"]] == [4096 * 4**k for k in range(5)]  # 4 KiB .. 1 MiB
    assert all(r["seconds"] > 0 for r in record["rows"])
    # Two processes: 2(p-1)/p = 1, so the bus bandwidth is plainly bytes over seconds.
    assert all(r["bus_bandwidth_gbps"] == pytest.approx(r["size_bytes"] / r["seconds"] / 1e9) for r in record["rows"])
    # The link the record reports is the fit of the times it recorded, not a figure from elsewhere.
    refit = fit_link([r["size_bytes"] for r in record["rows"]], [r["seconds"] for r in record["rows"]], 2)
    if math.isinf(refit.bandwidth_gbps):  # a busy machine: times that do not grow with size fix no bandwidth
        assert record["link"]["bandwidth_gbps"] is None and "--max-mib" in record["link"]["note"]
        assert any("bandwidth not measurable" in line for line in launched.lines)
    else:
        assert record["link"]["bandwidth_gbps"] == pytest.approx(refit.bandwidth_gbps, rel=1e-6)
    assert record["link"]["latency_us"] == pytest.approx(refit.latency_us, rel=1e-6, abs=1e-9)


@pytest.mark.slow
def test_one_process_has_nobody_to_all_reduce_with():
    result = subprocess.run([sys.executable, "-m", "workshop_utils.comm_model"], capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 2 and result.stderr.strip().startswith("error: One process")


def _one_process_record(device_type="cpu", step_ms=230.0):
    return {"config": {"name": "weak-1", "model": "simplecnn", "precision": "fp32", "batch_size": 64},
            "metrics": {"step_ms_median": step_ms, "parameters": 2_474_506, "flops_per_sample": 246_183_936},
            "environment": {"device_type": device_type, "device_name": "x86_64" if device_type == "cpu" else "H100",
                            "date": "2026-11-25T00:00:00+00:00"}}


def test_a_cpu_run_predicts_the_gpu_cluster_from_a_stated_gpu_step_not_its_own(tmp_path):
    # A 230 ms CPU step hides any all-reduce: the 64-GPU efficiency it gave (99%) was no GPU's.
    record = _one_process_record()
    step = wu.cluster_step(record, records=tmp_path)  # no GPU record at all
    expected = 246_183_936 * 64 / (wu.peak_tflops("H100 SXM", "fp32") * 1e12 * 0.05)
    assert step.step_s == pytest.approx(expected) and step.step_s < 0.23 / 10
    assert step.grad_bytes == 4 * 2_474_506
    assert step.source.startswith("GPU step estimated, not measured (no GPU record of simplecnn in fp32") \
        and "5% MFU" in step.source
    cpu_64 = predict_scaling(0.23, step.grad_bytes, [64], LINKS["nvlink4"], LINKS["ib_ndr"]).iloc[0]
    gpu_64 = predict_scaling(step.step_s, step.grad_bytes, [64], LINKS["nvlink4"], LINKS["ib_ndr"]).iloc[0]
    assert gpu_64.efficiency_no_overlap < cpu_64.efficiency_no_overlap


def test_notebook_02s_own_gpu_run_is_preferred_and_named(tmp_path):
    reference = _one_process_record("cuda", step_ms=12.5)
    reference["config"].update(model="resnet18", batch_size=256, precision="bf16")
    reference["metrics"]["parameters"] = 11_173_962
    run = tmp_path / "gpu_run-h100-2026-11-25"
    (run / "results").mkdir(parents=True)
    (run / "results" / "ddp-weak-1.json").write_text(json.dumps(reference))
    (run / "gpu_run.json").write_text(json.dumps({"kind": "gpu_run", "profile": "gpu", "created": "2026-11-25",
                                                  "environment": reference["environment"], "notebooks": []}))
    step = wu.cluster_step(_one_process_record(), records=tmp_path)
    assert step.step_s == pytest.approx(0.0125) and step.grad_bytes == 4 * 11_173_962
    assert "measured on one H100, 2026-11-25, by notebook 02's gpu profile (resnet18, bf16, batch 256)" in step.source


def test_on_a_gpu_the_measured_step_is_the_input():
    step = wu.cluster_step(_one_process_record("cuda", step_ms=3.0))
    assert step.step_s == pytest.approx(0.003) and step.source == "step measured here on H100"


def test_times_that_do_not_grow_with_size_give_no_bandwidth_not_an_infinite_one(tmp_path, monkeypatch, capsys):
    """A busy machine can time 1 MiB faster than 4 KiB: the record says the bandwidth is unknown, and why."""
    import torch

    from workshop_utils import comm_model
    from workshop_utils.spine.distributed import DistInfo

    sizes = [4096 * 4**k for k in range(3)]
    flat = [{"size_bytes": n, "seconds": t, "world_size": 2, "bus_bandwidth_gbps": n / t / 1e9}
            for n, t in zip(sizes, [3e-4, 2e-4, 1e-4])]
    monkeypatch.setattr(comm_model, "setup_distributed", lambda device: (DistInfo(0, 0, 2, "gloo"), torch.device("cpu")))
    monkeypatch.setattr(comm_model, "teardown_distributed", lambda: None)
    monkeypatch.setattr(comm_model, "measure_all_reduce", lambda sizes, repeats, device: flat)
    out = tmp_path / "all_reduce.json"
    comm_model.main(["--max-mib", "1", "--out", str(out)])
    printed = capsys.readouterr().out
    assert "bandwidth not measurable" in printed and "inf GB/s" not in printed
    link = json.loads(out.read_text())["link"]
    assert link["bandwidth_gbps"] is None and "--max-mib" in link["note"] and link["latency_us"] >= 0
