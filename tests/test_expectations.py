"""The 'what you should see' lines, a speed-up read per device, and accuracy compared with its noise."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pandas as pd
import pytest
from helpers import ACCURACY_FLOOR_PCT, ACCURACY_MARGIN_POINTS

import workshop_utils as wu


@pytest.mark.parametrize("name", sorted(wu.EXPECTED))
def test_every_expectation_says_in_range_or_where_to_look(name, capsys):
    expected = wu.EXPECTED[name]
    for profile, (low, high) in expected.ranges.items():
        assert low < high
        assert wu.what_you_should_see(name, (low + high) / 2, profile) is True
        assert wu.what_you_should_see(name, high + abs(high) + 1, profile) is False
    lines = capsys.readouterr().out.splitlines()
    assert all(line.startswith("✓") for line in lines[::2]) and all(line.startswith("⚠") for line in lines[1::2])
    assert all(expected.look_at in line for line in lines[1::2])
    assert len(lines) == 2 * len(expected.ranges)


def test_a_range_no_run_has_measured_says_it_is_an_estimate(capsys):
    wu.what_you_should_see("gpt ladder speed-up", 5.0, "gpu")
    wu.what_you_should_see("gpt ladder speed-up", 1.2, "cpu")
    gpu, cpu = capsys.readouterr().out.splitlines()
    assert "on the gpu profile, an estimate: no run of the kit has measured it yet" in gpu
    assert "estimate" not in cpu
    assert all(profile in expected.ranges for expected in wu.EXPECTED.values() for profile in expected.estimated)


def test_an_unmeasured_value_is_said_not_judged(capsys):
    assert wu.what_you_should_see("bf16 speed-up", None, "cpu") is False
    assert wu.what_you_should_see("bf16 speed-up", float("nan"), "cpu") is False
    assert capsys.readouterr().out.count("not measured in this run") == 2


def test_an_unknown_expectation_or_profile_is_one_clear_error():
    with pytest.raises(wu.WorkshopError, match="No expectation named"):
        wu.what_you_should_see("speed of light", 1.0, "cpu")
    with pytest.raises(wu.WorkshopError, match="No 'tpu' range"):
        wu.what_you_should_see("baseline accuracy", 50.0, "tpu")


def test_the_baseline_check_holds_accuracy_to_the_profile_range():
    record = {"metrics": {"parameters": 2_474_506, "final_test_acc": 0.30, "step_ms_median": None,
                          "data_wait_fraction": None, "mfu": None, "data_source": "cifar10"},
              "step_loss": [2.3] * 10 + [1.5] * 10}
    low = wu.EXPECTED["baseline accuracy"].ranges["cpu"][0]
    checks = wu.check_baseline(record, profile="cpu")
    assert checks.loc["accuracy in range", "result"] == ("ok" if 30 >= low else "LOOK")
    assert "cpu profile" in checks.loc["accuracy in range", "detail"]
    assert wu.check_baseline(record).loc["accuracy above chance", "result"] == "ok"  # without a profile: above 30%


def _record(model, precision, steps, accuracy, seed=0):
    return {"config": {"model": model, "precision": precision, "channels_last": False, "seed": seed},
            "metrics": {"steps": steps, "samples_per_s": 100.0, "step_ms_median": 10.0, "peak_memory_mib": 1.0,
                        "final_train_loss": 2.0, "final_test_acc": accuracy}}


def test_a_short_speed_probe_is_not_compared_on_accuracy():
    table = wu.mode_table([_record("simplecnn", "fp32", 30, 0.36), _record("simplecnn", "fp16", 2, 0.05),
                           _record("simplecnn", "bf16", 30, 0.30)]).set_index("precision")
    assert pd.isna(table.loc["fp16", "test acc %"]) and pd.isna(table.loc["fp16", "acc vs fp32 (points)"])
    assert "speed probe: 2 of 30 steps" in table.loc["fp16", "note"]
    assert table.loc["bf16", "acc vs fp32 (points)"] == pytest.approx(-6.0)


def test_accuracy_parity_takes_the_seed_spread_off_each_gap():
    table = wu.mode_table([_record("simplecnn", "fp32", 30, 0.36), _record("simplecnn", "bf16", 30, 0.30),
                           _record("simplecnn", "tf32", 30, 0.37)])
    parity = wu.accuracy_parity(table, [_record("simplecnn", "fp32", 30, 0.32, seed=1)]).set_index("precision")
    assert parity.loc["fp32", "fp32 seed spread (points)"] == pytest.approx(4.0)
    assert parity.loc["bf16", "beyond spread (points)"] == pytest.approx(2.0)  # a 6-point gap, 4 of them noise
    assert parity.loc["tf32", "beyond spread (points)"] == pytest.approx(0.0)
    assert pd.isna(parity.loc["fp32", "beyond spread (points)"])



def test_a_recorded_spread_stands_for_a_second_seed_and_is_the_widest_recorded():
    """Notebooks 02 and 03 read fp32's seed spread from the records in the cpu profile instead of training again."""
    ranges = [row["max_pct"] - row["min_pct"] for path in SPREADS
              for row in json.loads(path.read_text())["tables"]["spread"] if row["case"] == "03 resnet18-fp32"]
    assert len(ranges) >= 2 and wu.recorded_spread_points("resnet18-fp32", "cpu") == max(ranges)
    assert wu.recorded_spread_points("resnet18-fp32", "gpu") is None  # none recorded: the notebook trains again
    assert wu.recorded_spread_points("resnet18-fp16", "cpu") is None
    table = wu.mode_table([_record("simplecnn", "fp32", 30, 0.36), _record("simplecnn", "bf16", 30, 0.30)])
    parity = wu.accuracy_parity(table, [], {("simplecnn", False): 4.0}).set_index("precision")
    assert parity.loc["bf16", "beyond spread (points)"] == pytest.approx(2.0)
    # a second seed trained as well: the wider of the two spreads counts
    wider = wu.accuracy_parity(table, [_record("simplecnn", "fp32", 30, 0.31, seed=1)], {("simplecnn", False): 4.0})
    assert wider.set_index("precision").loc["bf16", "beyond spread (points)"] == pytest.approx(1.0)


SPREADS = sorted((Path(__file__).resolve().parents[1] / "results" / "reference" / "benchmarks")
                 .glob("accuracy_spread*.json"))


def _spread_cases():
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    try:
        import accuracy_spread
    finally:
        sys.path.pop(0)
    return accuracy_spread.cases("cpu", "cpu")


def test_every_accuracy_threshold_sits_below_all_recorded_seeds_on_both_kinds_of_cpu():
    """The thresholds come from measured spread: five seeds of every compared run, with AVX-512 and AVX2 kernels.

    A notebook whose cpu-profile sizes change without the spread measured again fails here, naming the run.
    """
    records = [json.loads(path.read_text()) for path in SPREADS]
    assert {r["environment"]["cpu_capability"] for r in records} >= {"AVX512", "AVX2"}
    floors = {"01": wu.EXPECTED["baseline accuracy"].ranges["cpu"][0], "02": wu.EXPECTED["ddp accuracy"].ranges["cpu"][0]}
    for record in records:
        assert record["settings"]["seeds"] >= 5
        recorded = {(row["case"], row["steps"], row["batch_size"]) for row in record["rows"]}
        for case, config, _ in _spread_cases():
            if config.precision == "bf16" and not record["environment"]["cpu_native_bf16"]:
                continue  # not run full length on a CPU without bf16 instructions, so not compared there
            steps = config.max_steps  # the baseline trains whole epochs: its recorded steps stand for them
            assert any(c == case and (steps is None or s == steps) and b == config.batch_size
                       for c, s, b in recorded), f"{case}: no recorded spread for its current sizes"
        for row in record["rows"]:
            floor = max(ACCURACY_FLOOR_PCT, floors.get(row["case"][:2], 0))
            assert row["test_acc_pct"] >= floor + ACCURACY_MARGIN_POINTS, \
                (record["environment"]["cpu_capability"], row)


def test_an_accuracy_gap_is_shown_with_the_seed_spread_recorded_for_its_run(monkeypatch, tmp_path):
    # The real records: notebook 04's larger-batch rung, on both kinds of CPU.
    line = wu.seed_spread("ladder-6-2x-batch", "cpu")
    assert "AVX512" in line and "AVX2" in line and "over 5 seeds" in line
    # A record of one run, read back as its range; another profile or run has none, and the line says so.
    record = {"profile": "cpu", "settings": {"seeds": 3}, "environment": {"cpu_capability": "AVX2"},
              "tables": {"spread": [{"case": "04 ladder-1-x", "min_pct": 30.4, "max_pct": 41.6}]}}
    (tmp_path / "accuracy_spread.json").write_text(json.dumps(record))
    monkeypatch.setattr(wu.lessons.checks, "SPREAD_RECORDS", tmp_path)
    assert wu.seed_spread("ladder-1-x", "cpu").endswith(": 30% to 42% over 3 seeds (AVX2)")
    assert wu.seed_spread("ladder-1-x", "gpu").startswith("no seed spread recorded for ladder-1-x in the gpu profile")
    assert wu.seed_spread("ladder-2-y", "cpu").startswith("no seed spread recorded")


def test_the_gpt_rows_of_the_mode_table_add_tokens_and_blank_a_speed_probes_loss():
    def gpt(precision, steps):
        record = _record("gpt", precision, steps, 0.4)
        record["metrics"].update(tokens_per_s=12_800.0, final_test_loss=2.5, final_test_bits_per_byte=3.6)
        return record

    table = wu.mode_table([gpt("fp32", 40), gpt("bf16", 2)]).set_index("precision")
    assert table.loc["fp32", "tokens/s"] == 12_800.0 and table.loc["fp32", "test loss (nats/token)"] == 2.5
    assert pd.isna(table.loc["bf16", "test loss (nats/token)"]) and pd.isna(table.loc["bf16", "test bits/byte"])
    assert "tokens/s" not in wu.mode_table([_record("simplecnn", "fp32", 30, 0.36)])  # CNN tables stay as they were
