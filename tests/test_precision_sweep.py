"""The precision x batch-size sweep: a row per (batch, mode), honest speed-ups, no silently dropped mode,
an out-of-memory that ends one mode's sweep, and a chart that states its finding.

Most tests replace the training loop with a fake whose throughput is known, so they check the sweep's
bookkeeping in milliseconds; one trains for real, briefly.
"""

from __future__ import annotations

import re
from types import SimpleNamespace

import matplotlib
import matplotlib.pyplot as plt
import pandas as pd
import pytest
import torch

import workshop_utils as wu
from workshop_utils.lessons import precision_sweep
from workshop_utils.system.plotstyle import PRECISION_COLORS, STYLE

matplotlib.use("Agg")

SPEED_PER_SAMPLE = {"fp32": 10.0, "tf32": 15.0, "bf16": 20.0, "fp16": 1.0}  # samples/s per sample of batch


class CompileFailed(RuntimeError):
    """What torch.compile raises for any error while it compiles, with that error as the cause."""


def fake_train(out_of_memory_at: dict[str, int] | None = None, calls: list | None = None, failure=None):
    """A stand-in for ``train``: throughput = batch x the mode's factor; OOM for ``mode`` at ``batch``.

    ``failure(error)`` turns that out-of-memory error into the one raised (default: raised as it is).
    """

    def train(config, data=None, on_step=None):
        if calls is not None:
            calls.append((config.precision, config.batch_size, config.max_steps))
        if (out_of_memory_at or {}).get(config.precision) == config.batch_size:
            error = torch.OutOfMemoryError(f"CUDA out of memory. Tried to allocate {config.batch_size} MiB")
            if failure is None:
                raise error
            raise failure(error)
        speed = config.batch_size * SPEED_PER_SAMPLE[config.precision]
        metrics = {"steps": config.max_steps, "samples_per_s": speed, "step_ms_median": 1e3 * config.batch_size / speed,
                   "tflops_per_device": speed * 1e-6, "peak_memory_mib": float(config.batch_size)}
        return SimpleNamespace(metrics=metrics, save=lambda run_dir, name: None)

    return train


@pytest.fixture(scope="module")
def images():
    return wu.make_synthetic_cifar(256, 8)  # made once: generating it takes seconds


@pytest.fixture
def sweep(monkeypatch, images, fake_cpu):
    """The sweep on a fake training loop: ``sweep(modes, batches, out_of_memory_at=..., calls=..., **options)``."""
    fake_cpu("avx512-bf16")  # fp16 emulated, bf16 native

    def run(modes, batches, out_of_memory_at=None, calls=None, failure=None, **options):
        monkeypatch.setattr(precision_sweep, "train", fake_train(out_of_memory_at, calls, failure))
        base = wu.TrainConfig(model="simplecnn", device="cpu", loader="device")
        return wu.precision_batch_sweep(base, images, modes, batches, steps=4, warmup_steps=1, progress=False,
                                        **options)

    return run


def test_a_row_per_batch_and_mode_with_speedups_against_fp32_and_tf32(sweep):
    table = sweep(("fp32", "tf32", "bf16"), (64, 16, 256))
    assert list(zip(table["batch_size"], table["precision"])) == [
        (b, m) for b in (16, 64, 256) for m in ("fp32", "tf32", "bf16")]  # batches in order, every mode at each
    assert (table["status"] == "ok").all() and (table["steps"] == 4).all()
    for column in ("samples_per_s", "step_ms_median", "tflops_per_device"):
        assert table[column].notna().all()
    assert (table[table["precision"] == "fp32"]["speedup_vs_fp32"] == 1.0).all()
    assert (table[table["precision"] == "tf32"]["speedup_vs_tf32"] == 1.0).all()
    assert table[table["precision"] == "bf16"]["speedup_vs_fp32"].tolist() == pytest.approx([2.0] * 3)
    assert table[table["precision"] == "bf16"]["speedup_vs_tf32"].tolist() == pytest.approx([4 / 3] * 3)
    assert wu.speedup_by_batch(table).to_dict() == pytest.approx({16: 2.0, 64: 2.0, 256: 2.0})


def test_without_a_reference_mode_there_is_no_speedup_column_for_it(sweep):
    table = sweep(("fp32", "bf16"), (16,))
    assert "speedup_vs_fp32" in table and "speedup_vs_tf32" not in table


def wrapped_by_the_compiler(error):
    try:
        raise error
    except torch.OutOfMemoryError as cause:
        try:
            raise CompileFailed("backend='inductor' raised: OutOfMemoryError") from cause
        except CompileFailed as wrapped:
            return wrapped


def test_an_out_of_memory_while_compiling_ends_the_sweep_like_any_other(sweep):
    table = sweep(("fp32", "bf16"), (16, 64), out_of_memory_at={"fp32": 64}, failure=wrapped_by_the_compiler)
    assert table[table["precision"] == "fp32"]["status"].tolist() == ["ok", "out of memory at batch 64"]
    assert table[table["precision"] == "bf16"]["status"].tolist() == ["ok", "ok"]


def test_an_error_that_is_not_out_of_memory_is_not_swallowed(sweep):
    with pytest.raises(CompileFailed, match="no memory involved"):
        sweep(("fp32",), (16, 64), out_of_memory_at={"fp32": 64},
              failure=lambda error: CompileFailed("no memory involved"))


def test_an_out_of_memory_ends_that_modes_sweep_with_a_row_and_the_others_go_on(sweep):
    calls = []
    table = sweep(("fp32", "bf16"), (16, 64, 256), out_of_memory_at={"fp32": 64}, calls=calls)
    fp32 = table[table["precision"] == "fp32"]
    assert fp32["batch_size"].tolist() == [16, 64]  # nothing tried after the failure
    assert fp32["status"].tolist() == ["ok", "out of memory at batch 64"]
    assert "out of memory" in fp32["detail"].iloc[-1].lower()
    assert table[table["precision"] == "bf16"]["status"].tolist() == ["ok"] * 3
    assert ("fp32", 256, 4) not in calls and ("bf16", 256, 4) in calls
    # bf16 has no fp32 to compare with at 64 and 256: unknown, not guessed
    assert table[table["precision"] == "bf16"]["speedup_vs_fp32"].isna().tolist() == [False, True, True]


def test_an_emulated_mode_is_marked_not_silently_dropped(sweep):
    calls = []
    table = sweep(("fp32", "fp16"), (16, 64), calls=calls, cpu_emulated_steps=2)
    fp16 = table[table["precision"] == "fp16"]
    assert len(fp16) == 2 and fp16["status"].str.startswith("emulated on this CPU: 2 steps").all()
    assert {c for c in calls if c[0] == "fp16"} == {("fp16", 16, 2), ("fp16", 64, 2)}  # a few steps only
    skipped = sweep(("fp32", "fp16"), (16, 64), cpu_emulated_steps=0)
    fp16 = skipped[skipped["precision"] == "fp16"]
    assert fp16["batch_size"].tolist() == [16, 64] and fp16["status"].str.startswith("skipped: fp16").all()
    assert fp16["samples_per_s"].isna().all()


def test_a_batch_larger_than_the_training_set_is_marked(sweep):
    table = sweep(("fp32",), (16, 1024))
    assert table["status"].tolist() == ["ok", "skipped: batch larger than the 256 training images"]


def test_nothing_to_sweep_is_one_clear_error(sweep):
    with pytest.raises(wu.WorkshopError, match="Nothing to sweep"):
        sweep((), (16,))
    with pytest.raises(wu.WorkshopError, match="no timed step"):
        wu.precision_batch_sweep(wu.TrainConfig(device="cpu"), None, ("fp32",), (16,), steps=2, warmup_steps=2)


def _legend_texts(ax) -> set[str]:
    legend = ax.get_legend()
    return {t.get_text() for t in legend.get_texts()} if legend is not None else set()


def test_the_chart_follows_the_chart_rules_and_states_the_gain(sweep):
    table = sweep(("fp32", "bf16", "fp16"), (16, 64, 256), out_of_memory_at={"fp32": 256},
                  cpu_emulated_steps=2)
    table.loc[table["precision"] == "bf16", "samples_per_s"] *= [0.5, 1.0, 1.5]  # the gain grows with the batch
    table = table.drop(columns=["speedup_vs_fp32"])
    before = matplotlib.rcParams["axes.labelsize"]
    fig = wu.plot_precision_batch_sweep(table)
    assert matplotlib.rcParams["axes.labelsize"] == before  # drawn inside style(), which is undone afterwards
    try:
        ax = fig.axes[0]
        assert ax.get_xlabel() == "batch size (samples per step)" and ax.get_xscale() == "log"
        assert re.search(r"\(.+\)", ax.get_ylabel()), ax.get_ylabel()  # a unit
        assert ax.yaxis.label.get_size() == STYLE["axes.labelsize"] and not ax.spines["top"].get_visible()
        labels = [line.get_label() for line in ax.get_lines()]
        assert labels == ["fp32", "fp32: out of memory at batch 256", "bf16", "fp16 (emulated on this CPU)"]
        assert set(labels) <= _legend_texts(ax)
        colors = {line.get_label(): matplotlib.colors.to_hex(line.get_color()) for line in ax.get_lines()}
        assert colors["fp32"] == PRECISION_COLORS["fp32"].lower() and colors["bf16"] == PRECISION_COLORS["bf16"].lower()
        assert "bf16 runs 1.0x fp32's speed at batch 16 and 2.0x at batch 64" in ax.get_title()
        assert re.search(r"\d", ax.get_title())
    finally:
        plt.close(fig)


def test_the_chart_of_a_sweep_without_fp32_still_states_a_number():
    table = pd.DataFrame({"batch_size": [16, 64], "precision": ["bf16", "bf16"], "status": ["ok", "ok"],
                          "samples_per_s": [100.0, 300.0]})
    fig = wu.plot_precision_batch_sweep(table)
    try:
        assert "fastest: bf16 at batch 64 (300 samples/s)" in fig.axes[0].get_title()
    finally:
        plt.close(fig)


@pytest.mark.slow
def test_the_sweep_trains_for_real_on_a_cpu(tmp_path):
    data = wu.make_synthetic_cifar(64, 16)
    base = wu.TrainConfig(model="simplecnn", device="cpu", loader="device", lr=0.01)
    table = wu.precision_batch_sweep(base, data, ("fp32", "bf16"), (8, 16), steps=2, warmup_steps=1,
                                     run_dir=tmp_path, progress=False)
    assert len(table) == 4 and table["steps"].tolist() == [2, 2, 2, 2]
    timed = table[table["status"] == "ok"]
    assert timed["samples_per_s"].gt(0).all() and timed["tflops_per_device"].gt(0).all()
    assert table[table["precision"] == "fp32"]["speedup_vs_fp32"].tolist() == [1.0, 1.0]
    assert len(wu.read_records(tmp_path)) == 4  # every run's record saved


@pytest.mark.parametrize("kind, bf16_steps, bf16_status", [("avx2", 2, "emulated on this CPU: 2 steps, not a fair speed"),
                                                          ("avx512-bf16", 4, "ok")])
def test_notebook_03s_sweep_on_each_kind_of_cpu(sweep, fake_cpu, kind, bf16_steps, bf16_status):
    fake_cpu(kind)  # after the fixture's own choice
    calls = []
    table = sweep(("fp32", "bf16"), (8, 32, 128), calls=calls)
    assert {(mode, steps) for mode, _, steps in calls} == {("fp32", 4), ("bf16", bf16_steps)}
    assert table[table["precision"] == "bf16"]["status"].tolist() == [bf16_status] * 3
