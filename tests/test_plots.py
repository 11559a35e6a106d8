"""Every chart the package draws explains itself: a title that states a finding, both axes labelled (with a unit
where the axis is a quantity), a legend for every line once there is more than one, the kit's shared style, and
the same colour for a precision or a ladder rung wherever it is drawn. Each plotting function runs on small data.
"""

from __future__ import annotations

import re

import matplotlib
import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import pytest
import torch

import workshop_utils as wu
from workshop_utils.lessons import plots
from workshop_utils.system.plotstyle import PRECISION_COLORS, RUNG_COLORS, STYLE

matplotlib.use("Agg")


def _training_record():
    return {"step_loss": list(np.linspace(2.3, 1.1, 30)), "first_step": 0, "config": {"name": "tiny"},
            "history": [{"epoch": e, "train_acc": 0.2 * e, "test_acc": 0.18 * e} for e in (1, 2, 3)]}


def _scaling():
    return pd.DataFrame({"mode": ["strong", "strong", "weak", "weak"], "world_size": [1, 2, 1, 2],
                         "samples_per_s": [100.0, 170.0, 100.0, 180.0], "efficiency": [1.0, 0.85, 1.0, 0.9]})


def _all_reduce_rows():
    link = wu.Link("test", 1.0, 100.0, "made up")
    sizes = [2**12 * 4**k for k in range(6)]
    return [{"size_bytes": n, "world_size": 2, "seconds": wu.ring_all_reduce_s(n, 2, link) * 1.1,
             "bus_bandwidth_gbps": n / (wu.ring_all_reduce_s(n, 2, link) * 1.1) / 1e9} for n in sizes], link


def _predicted():
    table = wu.predict_scaling(0.2, 4 * 2.5e6, [1, 8, 64, 512], wu.LINKS["nvlink4"], wu.LINKS["ib_ndr"])
    table.insert(0, "model", "NVLink + InfiniBand")
    return table


def _collective_rows():
    link = wu.Link("test", 1.0, 100.0, "made up")
    return [{"collective": name, "size_bytes": n, "world_size": 2, "bus_bandwidth_gbps": None,
             "seconds": (wu.ring_time_s(name, n, 2, link) or wu.ring_all_reduce_s(n, 2, link) / 2) * 1.2}
            for name in wu.COLLECTIVES for n in (2**12, 2**16, 2**20)]


def _mode_table():
    return pd.DataFrame({"model": ["simplecnn"] * 4, "precision": ["fp32", "tf32", "fp16", "bf16"],
                         "samples/s": [100.0, 120.0, 200.0, 210.0], "speed-up vs fp32": [1.0, 1.2, 2.0, 2.1]})


def _batch_rows():
    return [{"batch_size": 32, "status": "ok", "samples_per_s": 500.0, "peak_memory_mib": 100.0},
            {"batch_size": 64, "status": "ok", "samples_per_s": 800.0, "peak_memory_mib": 180.0},
            {"batch_size": 128, "status": "out of memory at batch 128", "samples_per_s": None,
             "peak_memory_mib": 400.0}]


def _monitor_frame(gpu: bool = False):
    """Samples as DeviceMonitor.frame() returns them; a CPU has no power or temperature reading."""
    t = np.arange(1, 9) * 0.25
    return pd.DataFrame({"t_s": t, "utilization_pct": [20.0, 55.0, 90.0, 95.0, 40.0, 92.0, 96.0, 60.0],
                         "memory_used_mib": [300.0, 420.0, 610.0, 615.0, 612.0, 640.0, 641.0, 630.0],
                         "power_w": list(np.linspace(90, 280, 8)) if gpu else [None] * 8,
                         "temperature_c": list(np.linspace(40, 61, 8)) if gpu else [None] * 8})


def _fsdp_record(world: int = 2, parameters: int = 62_006):
    """What compare_ddp_fsdp returns: Adam's 4 + 4 + 8 bytes per parameter, FSDP holding 1/world of each."""
    rows = []
    for strategy, share in (("DDP", 1), ("FSDP", world)):
        for rank in range(world):
            held = {"parameters": 4 * parameters // share, "gradients": 4 * parameters // share,
                    "optimizer": 8 * parameters // share}
            rows.append({"strategy": strategy, "rank": rank, **held, "total": sum(held.values())})
    ddp = [2.30, 2.21, 2.10]
    return {"kind": "ddp_vs_fsdp", "model": "simplecnn", "parameters": parameters, "world_size": world, "steps": 3,
            "batch_per_rank": 8, "data_source": "synthetic", "held_bytes": rows,
            "losses": {"DDP": ddp, "FSDP": [x + 1e-7 for x in ddp]}}


def _gpt_parallel_record(world: int = 2, parameters: int = 842_496):
    """What compare_gpt_parallel returns: four strategies, the first the unsharded reference."""
    record = _fsdp_record(world, parameters)
    shares = {"one model (unsharded)": 1, "FSDP2 per block": world, "FSDP2 per block, bf16 policy": world,
              "tensor parallel per block": 1.9}
    rows = []
    for strategy, share in shares.items():
        for rank in range(world):
            held = {"parameters": int(4 * parameters / share), "gradients": int(4 * parameters / share),
                    "optimizer": int(8 * parameters / share)}
            rows.append({"strategy": strategy, "rank": rank, **held, "total": sum(held.values())})
    losses = [5.55, 5.11, 4.89]
    return {**record, "kind": "gpt_parallel", "model": "GPT tiny", "held_bytes": rows,
            "losses": {name: [x + (1e-3 if "bf16" in name else 0) for x in losses] for name in shares}}


def _gpipe_timeline(stages: int, m: int, forward_s: float = 1e-3, backward_s: float = 2e-3):
    """GPipe's schedule on equal stages: every forward, then every backward in reverse micro-batch order."""
    end, rows = {}, []
    for i in range(m):
        for s in range(stages):
            start = max(end.get(("F", s - 1, i), 0.0), end.get(("F", s, i - 1), 0.0))
            end["F", s, i] = start + forward_s
            rows.append({"stage": s, "pass": "F", "microbatch": i, "start": start, "end": start + forward_s})
    for i in reversed(range(m)):
        for s in reversed(range(stages)):
            start = max(end.get(("B", s + 1, i), 0.0), end.get(("B", s, i + 1), end["F", s, m - 1]))
            end["B", s, i] = start + backward_s
            rows.append({"stage": s, "pass": "B", "microbatch": i, "start": start, "end": start + backward_s})
    return rows


def _pipeline_record(stages: int = 2, counts=(1, 2, 4)):
    """What measure_bubble returns, from the schedule above (so the measured bubble is the formula's)."""
    rows, timelines = [], {}
    for m in counts:
        timeline = _gpipe_timeline(stages, m)
        step = max(r["end"] for r in timeline)
        idle = np.mean([1 - sum(r["end"] - r["start"] for r in timeline if r["stage"] == s) / step
                        for s in range(stages)])
        rows.append({"microbatches": m, "microbatch_size": 64 // m, "stages": stages, "step_ms": 1e3 * step,
                     "bubble_measured": float(idle), "bubble_formula": wu.bubble_fraction(stages, m)})
        timelines[str(m)] = timeline
    return {"kind": "pipeline", "stages": stages, "batch": 64, "width": 64, "layers_per_stage": 1, "rows": rows,
            "timelines": timelines, "gradient_max_abs_difference": 0.0}


def _overlap_record():
    """What measure_overlap returns for three bucket sizes."""
    rows = [{"bucket_cap_mb": cap, "buckets": buckets, "gradient_mib": 3.2, "compute_ms": 60.0,
             "communication_ms": communication, "overlapped_ms": 60.0 + exposed, "exposed_ms": exposed,
             "exposed_p25_ms": exposed - 1, "exposed_p75_ms": exposed + 1, "repeats": 12}
            for cap, buckets, communication, exposed in ((25.0, 1, 7.0, 7.0), (1.0, 4, 10.0, 6.0), (0.25, 13, 24.0, 20.0))]
    return {"kind": "ddp_overlap", "model": "GPT tiny", "world_size": 2, "rows": rows}


CHARTS = {
    "training curves": lambda: wu.plot_training_curves(_training_record()),
    "step times": lambda: wu.plot_step_times([10.0, 11.0, 10.5, 30.0, 10.2] * 4, "Step times"),
    "bars by batch size": lambda: wu.plot_bars(pd.Series([32, 64], name="batch_size"), [500.0, 800.0], "samples/s",
                                               "Throughput by batch size", baseline=500.0),
    "bars of a list": lambda: wu.plot_bars(["0 workers", "2 workers"], [10.0, 12.0], "samples/s", "Loader",
                                           xlabel="DataLoader setting"),
    "bars in ms": lambda: wu.plot_bars(pd.Series(["sync", "async"], name="mode"), [59.2, 25.4], "ms per save",
                                       "Training blocked by each checkpoint", annotate_fmt="{:,.1f}"),
    "batch sweep": lambda: plots.plot_batch_sweep(_batch_rows()),
    "scaling": lambda: wu.plot_scaling(_scaling(), "DDP scaling"),
    "all-reduce": lambda: wu.plot_all_reduce(*_all_reduce_rows(), title="gloo between 2 CPU processes"),
    "predicted scaling": lambda: wu.plot_predicted_vs_measured(_predicted(), _scaling()[lambda t: t["mode"] == "weak"],
                                                               "Weak scaling"),
    "collectives": lambda: wu.plot_collective_times(_collective_rows()),
    "gradient magnitudes": lambda: wu.plot_gradient_magnitudes({"parameters": torch.tensor([1e-9, 1e-4, 1e-2]),
                                                                "activations": torch.tensor([1e-7, 1e-6, 1e-3])}),
    "scale trace": lambda: wu.plot_scale_trace(pd.DataFrame({"step": [1, 2, 3], "scale": [2.0**16, 2.0**15, 2.0**15],
                                                             "next scale": [2.0**15, 2.0**15, 2.0**16]})),
    "precision modes": lambda: wu.plot_mode_speeds(_mode_table()),
    "device monitor on a CPU": lambda: wu.plot_monitor(_monitor_frame(), "CPU while training the baseline"),
    "device monitor on a GPU": lambda: wu.plot_monitor(_monitor_frame(gpu=True), "GPU while training the baseline"),
    "held memory": lambda: wu.plot_held_memory(_fsdp_record()),
    "held memory, four strategies": lambda: wu.plot_held_memory(_gpt_parallel_record()),
    "pipeline": lambda: wu.plot_pipeline(_pipeline_record(), show=(1, 4)),
    "exposed communication": lambda: wu.plot_overlap(_overlap_record()),
}


def _legend_texts(ax) -> set[str]:
    legends = [ax.get_legend(), *ax.figure.legends]
    return {t.get_text() for legend in legends if legend is not None for t in legend.get_texts()}


def _titles(fig) -> str:
    suptitle = fig._suptitle.get_text() if fig._suptitle is not None else ""
    return " ".join([suptitle, *(ax.get_title() for ax in fig.axes)])


@pytest.mark.parametrize("name", sorted(CHARTS))
def test_every_chart_explains_itself_in_the_shared_style(name):
    before = matplotlib.rcParams["axes.labelsize"]
    fig = CHARTS[name]()
    assert matplotlib.rcParams["axes.labelsize"] == before  # the style applies to the chart, not to the session
    try:
        axes = [ax for ax in fig.axes if ax.has_data()]
        assert axes, f"{name}: nothing drawn"
        for ax in axes:
            assert ax.get_xlabel().strip() and ax.get_ylabel().strip(), f"{name}: an axis without a label"
            assert re.search(r"\(.+\)|%", ax.get_ylabel()), f"{name}: y axis {ax.get_ylabel()!r} has no unit"
            assert ax.yaxis.label.get_size() == STYLE["axes.labelsize"] and not ax.spines["top"].get_visible()
            lines = ax.get_lines()
            if len(lines) > 1:
                labels = [line.get_label() for line in lines]
                assert not [l for l in labels if l.startswith("_")], f"{name}: an unlabelled line in {labels}"
                assert set(labels) <= _legend_texts(ax), f"{name}: lines {labels} not all in a legend"
        assert re.search(r"\d", _titles(fig)), f"{name}: the title states no finding: {_titles(fig)!r}"
    finally:
        plt.close(fig)


def _bar_colors(ax) -> list[str]:
    return [matplotlib.colors.to_hex(patch.get_facecolor()) for patch in ax.patches]


def test_a_precision_has_one_colour_everywhere():
    modes = wu.plot_mode_speeds(_mode_table())
    bars = wu.plot_bars(pd.Series(["fp32", "bf16"], name="precision"), [1.0, 2.0], "samples/s", "demo")
    try:
        expected = [PRECISION_COLORS[p].lower() for p in ("fp32", "tf32", "fp16", "bf16")]
        assert _bar_colors(modes.axes[0]) == expected
        assert _bar_colors(bars.axes[0]) == [expected[0], expected[3]]
    finally:
        plt.close(modes)
        plt.close(bars)


def test_a_ladder_rung_has_one_colour_and_bf16_is_bf16s():
    rungs = ["baseline", "tuned DataLoader", "BF16 autocast", "channels_last", "torch.compile"]
    fig = wu.plot_bars(pd.Series(rungs, name="rung"), [1.0, 1.1, 1.5, 1.6, 2.0], "samples/s", "The ladder",
                       baseline=1.0)
    try:
        assert _bar_colors(fig.axes[0]) == [RUNG_COLORS[r.lower()].lower() for r in rungs]
        assert RUNG_COLORS["bf16 autocast"] == PRECISION_COLORS["bf16"]
        assert fig.axes[0].get_xlabel().startswith("ladder rung")
        assert "highest: torch.compile" in fig.axes[0].get_title()
    finally:
        plt.close(fig)


def test_the_predicted_scaling_chart_separates_what_a_linear_efficiency_axis_hides():
    """Overlapped efficiencies of 0.9996 and 0.97 look like one line at 1.0; the share lost tells them apart."""
    fig = CHARTS["predicted scaling"]()
    try:
        ax = fig.axes[0]
        assert ax.get_yscale() == "log" and "lost" in ax.get_ylabel()
        overlap = next(line for line in ax.get_lines() if "overlapped" in line.get_label())
        lost = np.asarray(overlap.get_ydata(), float)
        assert (lost > 0).all() and lost.max() / lost.min() > 10
    finally:
        plt.close(fig)


def test_the_batch_sweep_shows_memory_and_marks_the_out_of_memory_batch():
    fig = CHARTS["batch sweep"]()
    try:
        speed, memory = fig.axes
        assert "samples per step" in speed.get_xlabel() and "memory" in memory.get_ylabel()
        assert "out of memory at batch 128" in _legend_texts(memory)
        assert "batch 128 ran out of memory" in _titles(fig)
    finally:
        plt.close(fig)


def test_collective_model_lines_are_labelled():
    fig = CHARTS["collectives"]()
    try:
        labels = [line.get_label() for line in fig.axes[0].get_lines()]
        assert "ring model: all-reduce" in labels
        assert any("all-gather and reduce-scatter" in label for label in labels)
    finally:
        plt.close(fig)


def test_the_pipeline_chart_tells_forward_from_backward_and_states_the_bubble():
    fig = CHARTS["pipeline"]()
    try:
        gantt = fig.axes[0]
        assert {"forward pass (F)", "backward pass (B)"} <= _legend_texts(gantt)
        assert "bubble 50% of the step at m = 1" in _titles(fig) and "20% at m = 4" in _titles(fig)
    finally:
        plt.close(fig)


def test_the_held_memory_chart_states_fsdps_saving():
    fig = CHARTS["held memory"]()
    try:
        assert "held per rank with FSDP, 2.0x less than DDP" in _titles(fig)
        assert fig.axes[0].get_xlabel() and "MiB" in fig.axes[0].get_ylabel()
    finally:
        plt.close(fig)


def test_the_held_memory_chart_measures_every_strategy_against_the_first():
    fig = CHARTS["held memory, four strategies"]()
    try:
        titles = _titles(fig)
        assert "held per rank with FSDP2 per block, 2.0x less than one model (unsharded)" in titles
        assert "losses differ by at most 1.0e-03" in titles  # the bf16 policy's gap, the largest
        assert len(fig.axes[1].get_lines()) == 4
    finally:
        plt.close(fig)


def test_the_monitor_chart_copes_with_a_gpu_that_reports_no_utilisation():
    frame = _monitor_frame(gpu=True).assign(utilization_pct=None)
    fig = wu.plot_monitor(frame)
    try:
        assert "utilisation not reported; peak memory 641 MiB" in _titles(fig)
    finally:
        plt.close(fig)


def test_finished_progress_bars_leave_nothing_behind_in_a_notebook(monkeypatch):
    """A notebook of forty runs kept forty finished bars in every saved copy; a terminal keeps its last line."""
    import sys
    import types

    from workshop_utils.system.progress import progress_bar

    monkeypatch.delitem(sys.modules, "ipykernel", raising=False)
    assert progress_bar(total=1, disable=True).leave is True
    monkeypatch.setitem(sys.modules, "ipykernel", types.ModuleType("ipykernel"))
    assert progress_bar(total=1, disable=True).leave is False
    assert progress_bar(total=1, disable=True, leave=True).leave is True


def test_collective_chart_of_flat_times_says_there_is_no_bandwidth_not_inf():
    rows = [{"collective": "all_reduce", "size_bytes": n, "world_size": 2, "bus_bandwidth_gbps": None, "seconds": t}
            for n, t in ((2**12, 3e-4), (2**16, 2e-4), (2**20, 1e-4))]
    fig = wu.plot_collective_times(rows)
    titles = " ".join(ax.get_title() for ax in fig.axes)
    assert "no bandwidth" in titles and "inf" not in titles
    plt.close(fig)
