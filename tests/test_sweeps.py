"""The sweeps and the ladder: one switch per run, out-of-memory caught, Amdahl's bound."""

import json
import math

import pandas as pd
import pytest

import workshop_utils as wu

def _config(**changes):
    settings = dict(batch_size=32, max_steps=3, warmup_steps=1, progress=False, device="cpu")
    return wu.TrainConfig(**{**settings, **changes})


def test_amdahl_gives_the_ceiling_and_the_partial_gain():
    assert wu.amdahl_speedup(0.5) == pytest.approx(2.0)  # removing half the time at best doubles speed
    assert wu.amdahl_speedup(0.5, factor=2) == pytest.approx(1 / 0.75)
    assert wu.amdahl_speedup(0.0) == 1.0
    assert math.isinf(wu.amdahl_speedup(1.0))


@pytest.mark.parametrize("fraction, factor", [(-0.1, 2), (1.5, 2), (0.5, 0)])
def test_amdahl_rejects_impossible_inputs(fraction, factor):
    with pytest.raises(wu.WorkshopError):
        wu.amdahl_speedup(fraction, factor)


def test_worker_counts_never_exceed_the_cores():
    assert wu.worker_counts((0, 2, 4, 8), cores=2) == [0, 2]
    assert wu.worker_counts((8, 0, 4), cores=16) == [0, 4, 8]


def test_dataloader_sweep_caps_workers_and_skips_pinning_on_cpu(tiny_data, capsys):
    table = wu.dataloader_sweep(_config(), tiny_data, workers=(0, 10_000), pin_memory=(False, True))
    assert table[["num_workers", "pin_memory"]].values.tolist() == [[0, False]]
    assert "pinned memory" in capsys.readouterr().out
    row = table.iloc[0]
    assert row["samples_per_s"] > 0 and 0 <= row["data_wait_fraction"] <= 1
    assert row["amdahl_max_speedup"] == pytest.approx(1 / (1 - row["data_wait_fraction"]))


def test_batch_size_sweep_reports_out_of_memory_instead_of_crashing(tiny_data):
    table = wu.batch_size_sweep(_config(), tiny_data, start=32, largest=128, memory_cap_mib=1e-3)
    # a cap, not the device, stopped it, and the row says so; the sweep stopped there
    assert table["status"].tolist() == ["over the 0.001 MiB memory cap at batch 32"]
    assert wu.stopped_by_memory(table["status"][0])
    assert "memory cap" in table["detail"][0]


@pytest.mark.slow
def test_batch_size_sweep_doubles_and_measures_memory_without_a_cap(tiny_data, tmp_path):
    table = wu.batch_size_sweep(_config(), tiny_data, start=32, largest=128, run_dir=tmp_path)
    assert table["batch_size"].tolist() == [32, 64, 128]
    assert (table["status"] == "ok").all() and (table["peak_memory_mib"] > 0).all()
    saved = json.loads((tmp_path / "results" / "batch-128.json").read_text())
    assert saved["config"]["batch_size"] == 128


def test_batch_size_sweep_on_a_cpu_fits_a_line_that_every_run_repeats_and_its_cap_trains_nothing_over(tiny_data,
                                                                                                        tmp_path):
    # resident memory made batch 64 read below batch 32 in three of five runs: the tensor count must not
    peaks = wu.batch_size_sweep(_config(), tiny_data, start=32, largest=64)["peak_memory_mib"].tolist()
    assert 0 < peaks[0] < peaks[1]
    capped = wu.batch_size_sweep(_config(), tiny_data, start=32, largest=64, memory_cap_mib=sum(peaks) / 2,
                                 run_dir=tmp_path)
    assert capped["status"].tolist() == ["ok", f"over the {sum(peaks) / 2:g} MiB memory cap at batch 64"]
    assert capped["peak_memory_mib"].tolist() == peaks  # the second run reads the same, to the byte
    assert not (tmp_path / "results" / "batch-64.json").exists()  # judged before its run, not after


def test_batch_size_sweep_needs_room_for_one_batch(tiny_data):
    with pytest.raises(wu.WorkshopError, match="no batch"):
        wu.batch_size_sweep(_config(), tiny_data, start=1024, largest=2048)


@pytest.mark.slow
def test_ladder_is_cumulative_one_switch_per_rung(tiny_data, tmp_path):
    rungs = [wu.Rung("baseline", {}, ""), wu.Rung("channels_last", {"channels_last": True}, ""),
             wu.Rung("device-resident loader", {"loader": "device"}, "")]
    table = wu.climb_ladder(_config(), tiny_data, rungs, run_dir=tmp_path)
    assert table["rung"].tolist() == ["baseline", "channels_last", "device-resident loader"]
    assert table["vs_baseline"].iloc[0] == 1.0
    assert table["vs_baseline"].iloc[2] == pytest.approx(table["samples_per_s"].iloc[2] / table["samples_per_s"][0])
    assert table["vs_previous"].iloc[2] == pytest.approx(table["samples_per_s"].iloc[2] / table["samples_per_s"][1])
    configs = [json.loads(p.read_text())["config"] for p in sorted((tmp_path / "results").glob("ladder-*.json"))]
    assert [(c["channels_last"], c["loader"]) for c in configs] == [(False, "torch"), (True, "torch"),
                                                                    (True, "device")]


def test_default_ladder_follows_the_workshop_order():
    labels = [r.label for r in wu.ladder_rungs(compile=True)]
    assert labels == ["baseline", "tuned DataLoader", "BF16 autocast", "channels_last", "device-resident loader",
                      "fused optimizer", "4x batch", "torch.compile", "CUDA graphs"]
    big = {r.label: r for r in wu.ladder_rungs(base=_config(batch_size=32, lr=0.1, epochs=2), batch_factor=8)}
    assert big["8x batch"].changes == {"batch_size": 256, "lr": 0.8, "lr_warmup_steps": 50, "epochs": 16}
    on_cpu = {r.label: r.not_here for r in wu.ladder_rungs(compile=True, device="cpu")}
    assert on_cpu["CUDA graphs"] == "CUDA graphs need a GPU" and on_cpu["fused optimizer"] is None
    off = {r.label: r.not_here for r in wu.ladder_rungs(compile=False)}
    assert "switched off" in off["torch.compile"]  # shown with its reason, never silently dropped
    with pytest.raises(wu.WorkshopError):
        wu.climb_ladder(_config(), None, [])


@pytest.mark.slow
def test_ladder_repeats_round_robin_and_keeps_one_row_per_rung(tiny_data, tmp_path, capsys):
    rungs = [wu.Rung("baseline", {}, ""), wu.Rung("channels_last", {"channels_last": True}, "")]
    table = wu.climb_ladder(_config(max_steps=2), tiny_data, rungs, run_dir=tmp_path, repeats=2, progress=True)
    assert table["rung"].tolist() == ["baseline", "channels_last"]
    err = capsys.readouterr().err  # the progress bar: two passes over two rungs
    assert "ladder runs" in err and "4/4" in err
    saved = sorted(p.stem for p in (tmp_path / "results").glob("ladder-*.json"))
    assert saved == ["ladder-0-baseline-r1", "ladder-0-baseline-r2", "ladder-1-channels_last-r1",
                     "ladder-1-channels_last-r2"]
    with pytest.raises(wu.WorkshopError, match="repeats"):
        wu.climb_ladder(_config(), tiny_data, rungs, repeats=0)


def test_a_rung_that_does_not_apply_is_shown_with_its_reason_and_not_inherited(tiny_data, tmp_path, capsys,
                                                                             fake_cpu):
    fake_cpu("avx2")  # bf16 emulated
    rungs = {r.label: r for r in wu.ladder_rungs(compile=False, device="cpu")}
    assert "emulated on this CPU" in rungs["BF16 autocast"].not_here
    ladder = [wu.Rung("baseline", {}, ""), rungs["BF16 autocast"], wu.Rung("channels_last", {"channels_last": True}, "")]
    table = wu.climb_ladder(_config(), tiny_data, ladder, run_dir=tmp_path)
    assert table["note"].tolist()[1].startswith("not applicable: bf16 autocast is emulated")
    assert table["samples_per_s"].isna().tolist() == [False, True, False]
    assert table["vs_previous"].iloc[2] == pytest.approx(table["samples_per_s"].iloc[2] / table["samples_per_s"][0])
    assert "BF16 autocast: not applicable here" in capsys.readouterr().out
    configs = [json.loads(p.read_text())["config"] for p in sorted((tmp_path / "results").glob("ladder-*.json"))]
    assert [c["precision"] for c in configs] == ["fp32", "fp32"]  # the skipped switch is not carried on


def test_ladder_mfu_uses_one_stated_peak_whatever_the_precision(tiny_data, monkeypatch):
    from workshop_utils.lessons import sweeps

    def fake_train(config, data, **_):  # an H100 at 100 TFLOP/s in fp32 and in bf16
        peak = {"fp32": 67.0, "bf16": 989.0}[config.precision]
        metrics = {"samples_per_s": 1000.0, "step_ms_median": 1.0, "step_ms_p90": 1.2, "data_wait_fraction": 0.0,
                   "peak_memory_mib": 10.0, "tflops_per_device": 100.0, "mfu": 100.0 / peak,
                   "device_name": "NVIDIA H100 80GB HBM3"}
        return type("R", (), {"metrics": metrics, "save": lambda *a: None})()

    monkeypatch.setattr(sweeps, "train", fake_train)
    table = wu.climb_ladder(_config(), tiny_data, [wu.Rung("baseline", {}, ""),
                                                   wu.Rung("BF16 autocast", {"precision": "bf16"}, "")])
    stated = wu.peak_tflops("NVIDIA H100 80GB HBM3", "bf16")
    assert table["mfu_bf16_peak"].tolist() == pytest.approx([100.0 / stated] * 2)  # same work, same MFU
    assert table["mfu_own_precision_peak"].iloc[0] > table["mfu_own_precision_peak"].iloc[1]
    assert f"{stated:g} TFLOP/s" in table.attrs["stated_peak"]


def test_the_compile_wait_is_the_slowest_compiled_rungs_warm_up(tiny_data, monkeypatch, capsys):
    from workshop_utils.lessons import sweeps

    def fake_train(config, data, **_):  # compiling costs warm-up seconds; eager runs warm up in one
        warmup_s = {None: 1.0, "default": 40.0, "reduce-overhead": 75.0}[config.compile_mode if config.compile else None]
        metrics = {"samples_per_s": 1000.0, "step_ms_median": 1.0, "warmup_s": warmup_s}
        return type("R", (), {"metrics": metrics, "save": lambda *a: None})()

    monkeypatch.setattr(sweeps, "train", fake_train)
    rungs = [wu.Rung("baseline", {}, ""), wu.Rung("torch.compile", {"compile": True, "compile_mode": "default"}, ""),
             wu.Rung("CUDA graphs", {"compile_mode": "reduce-overhead"}, "")]
    table = wu.climb_ladder(_config(), tiny_data, rungs)
    assert table["compiled"].tolist() == [False, True, True]  # CUDA graphs inherits compile from the rung below
    assert wu.compile_wait_s(table) == 75.0
    assert wu.what_you_should_see("compile wait", 75.0, "gpu") is False
    assert "75 s is outside 0 s to 60 s" in capsys.readouterr().out
    # where no rung compiles (switched off, or no GPU for graphs) there is no wait to judge
    eager = [rungs[0], wu.Rung("torch.compile", {"compile": True}, "", "compilation is switched off in this profile")]
    table = wu.climb_ladder(_config(), tiny_data, eager)
    assert table["compiled"].tolist() == [False, False]
    assert wu.compile_wait_s(table) is None


def _fake_speeds(monkeypatch, speeds: dict[int, list[float]]):
    """``train`` replaced by a table: samples/s by rung index and pass (run names "ladder-<index>-<slug>[-r<pass>]")."""
    import re

    from workshop_utils.lessons import sweeps

    trained = []

    def fake_train(config, data, **_):
        index, repeat = re.fullmatch(r"ladder-(\d+)-.*?(?:-r(\d+))?", config.name).groups()
        trained.append(config.name)
        metrics = {"samples_per_s": speeds[int(index)][int(repeat or 1) - 1], "step_ms_median": 1.0, "warmup_s": 0.1}
        return type("R", (), {"metrics": metrics, "save": lambda *a: None})()

    monkeypatch.setattr(sweeps, "train", fake_train)
    return trained


def test_a_rung_with_the_settings_of_the_rung_below_is_not_trained_and_gets_no_ratio(tiny_data, monkeypatch):
    base = _config(num_workers=0)
    # the notebook's tuned loader where the best setting of the loader sweep is the baseline's own
    same_loader = dict(num_workers=0, pin_memory=False, persistent_workers=False, prefetch_factor=None)
    rungs = wu.ladder_rungs(same_loader, compile=False, device="cpu", base=base)
    assert wu.same_as_below(wu.rung_configs(base, rungs))[:3] == [False, True, False]

    trained = _fake_speeds(monkeypatch, {0: [100.0], 2: [150.0]})
    ladder = [wu.Rung("baseline", {}, ""), wu.Rung("tuned DataLoader", same_loader, ""),
              wu.Rung("channels_last", {"channels_last": True}, "")]
    table = wu.climb_ladder(base, tiny_data, ladder).set_index("rung")
    assert trained == ["ladder-0-baseline", "ladder-2-channels_last"]
    unchanged = table.loc["tuned DataLoader"]
    assert unchanged["note"] == "same settings as the rung before it"
    assert unchanged[["samples_per_s", "vs_previous", "vs_baseline"]].isna().all()
    assert wu.speedup_text(unchanged) == "same settings as the rung before it"
    assert table.loc["channels_last", "vs_previous"] == pytest.approx(1.5)  # against the baseline, the rung that ran
    assert not table.loc["tuned DataLoader", "compiled"]


def test_a_speed_up_inside_its_run_to_run_spread_reads_no_measurable_change(tiny_data, monkeypatch):
    # three round-robin passes: channels_last is faster in every one, the device loader only in some
    _fake_speeds(monkeypatch, {0: [100.0, 110.0, 90.0], 1: [150.0, 160.0, 140.0], 2: [145.0, 170.0, 135.0]})
    rungs = [wu.Rung("baseline", {}, ""), wu.Rung("channels_last", {"channels_last": True}, ""),
             wu.Rung("device-resident loader", {"loader": "device"}, "")]
    table = wu.climb_ladder(_config(), tiny_data, rungs, repeats=3).set_index("rung")

    gain = table.loc["channels_last"]  # per pass 1.50, 1.45, 1.56: outside the spread, so it keeps its ratio
    assert gain["vs_previous"] == pytest.approx(150 / 100)
    assert (gain["vs_previous_min"], gain["vs_previous_max"]) == pytest.approx((160 / 110, 140 / 90))
    assert gain["note"] == ""
    assert wu.speedup_text(gain, "vs_previous") == "1.50x (per pass 1.45–1.56x)"

    noise = table.loc["device-resident loader"]  # per pass 0.97, 1.06, 0.96 against channels_last
    assert pd.isna(noise["vs_previous"])
    assert (noise["vs_previous_min"], noise["vs_previous_max"]) == pytest.approx((135 / 140, 170 / 160))
    assert noise["note"].startswith("no measurable change against the rung below (per-pass ratios 0.96–1.06x)")
    assert wu.speedup_text(noise, "vs_previous") == "no measurable change (per pass 0.96–1.06x)"
    # against the baseline the same rung gained in every pass: that ratio stands
    assert noise["vs_baseline"] == pytest.approx(145 / 100) and noise["vs_baseline_min"] > 1
    assert table.loc["baseline", "vs_baseline"] == 1.0 and pd.isna(table.loc["baseline", "vs_baseline_min"])


def test_one_pass_has_no_spread_and_keeps_its_ratios(tiny_data, monkeypatch):
    _fake_speeds(monkeypatch, {0: [100.0], 1: [98.0]})
    rungs = [wu.Rung("baseline", {}, ""), wu.Rung("channels_last", {"channels_last": True}, "")]
    row = wu.climb_ladder(_config(), tiny_data, rungs).iloc[1]
    assert row["vs_previous"] == pytest.approx(0.98) and pd.isna(row["vs_previous_max"]) and row["note"] == ""
    assert wu.speedup_text(row) == "0.98x"


@pytest.mark.slow
def test_optimizer_kernel_switch_changes_how_the_update_runs_not_what_it_computes(tiny_data):
    base = _config(max_steps=3, warmup_steps=1, loader="device")
    runs = {k: wu.train(base.replace(optimizer_kernels=k), tiny_data) for k in ("default", "foreach", "fused")}
    # foreach is what PyTorch picks by default where it can: the same arithmetic, bit for bit
    assert runs["foreach"].metrics["param_checksum"] == runs["default"].metrics["param_checksum"]
    losses = [r.metrics["final_train_loss"] for r in runs.values()]
    assert max(losses) - min(losses) < 1e-3  # fused reorders the arithmetic, not the result
    # the untimed first steps (compilation, autotuning) are reported on their own, never in the throughput
    assert all(r.metrics["warmup_s"] > 0 and r.metrics["timed_steps"] == 2 for r in runs.values())


def test_the_gpt_ladder_starts_unfused_and_its_last_rung_keeps_the_tokens_per_step():
    base = wu.TrainConfig(model="gpt", batch_size=16, sequence_length=64, attention="math", loader="torch",
                          optimizer="adamw", lr=3e-3)
    rungs = wu.gpt_ladder_rungs(base, compile=False, device="cpu")
    configs = wu.rung_configs(base, rungs)
    by_label = {rung.label: config for rung, config in zip(rungs, configs)}
    assert by_label["baseline"].attention == "math" and by_label["fused attention"].attention == "fused"
    assert by_label["torch.compile"] is None  # switched off: listed with its reason, not inherited
    last = configs[-1]
    assert (last.batch_size, last.accumulation_steps) == (8, 2)  # 8 sequences x 2 passes = the baseline's 16
    assert (last.attention, last.loader, last.optimizer_kernels, last.compile) == ("fused", "device", "fused", False)
    assert all(c.name.startswith("gpt-ladder-") for c in configs if c is not None)  # beside SimpleCNN's ladder-*
    odd = wu.gpt_ladder_rungs(base.replace(batch_size=15), compile=False, device="cpu")
    assert "does not split into 2 micro-batches" in odd[-1].not_here
