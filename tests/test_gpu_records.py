"""The kit's GPU records read by one reader: the figures the GPU check's own lines hold, GPT-2 small's MFU runs,
the GPU run's training records; every sentence names its GPU and date, or says nothing was measured."""

import json
from types import SimpleNamespace

import torch

import workshop_utils as wu
from workshop_utils.gpu_check import Context, check_loaders, check_precisions
from workshop_utils.system import gpu_records
from workshop_utils.system.gpu_records import GPU_RECORDS, best, check_figures, gpt_throughput_figures


def _check_record(folder, verdicts, device="NVIDIA H100 80GB HBM3", date="2027-02-03"):
    record = {"kind": "gpu_check", "paths": [{"name": n, "status": "ok", "detail": d} for n, d in verdicts.items()],
              "environment": {"device_name": device, "date": f"{date}T10:00:00+00:00"}}
    (folder / f"gpu_check-{date}.json").write_text(json.dumps(record))


def test_the_reader_reads_the_numbers_the_check_s_own_lines_hold(tmp_path, monkeypatch):
    """The check's lines are the record: the reader must read what the paths write, in their words."""
    speeds = iter([1234.0, 2345.0, 3456.0, 4567.0, 5678.0, 6789.0])

    def trained(self, **changes):
        metrics = {"final_train_loss": 2.0, "samples_per_s": next(speeds), "mfu": None, "data_wait_fraction": 0.1,
                   "tokens_per_s": 9.0}
        return SimpleNamespace(metrics=metrics)

    monkeypatch.setattr(Context, "train", trained)
    ctx = Context(torch.device("cpu"), tmp_path)
    _check_record(tmp_path, {"precision-modes": check_precisions(ctx), "device-loaders": check_loaders(ctx)})
    found = {(f.config["precision"], f.config["loader"], f.config["num_workers"]): f for f in check_figures(tmp_path)}
    # On a CPU the check leaves fp16 out (emulated): fp32, tf32, bf16, then the two loaders.
    assert {k: f.value for k, f in found.items()} == {("fp32", "torch", 0): 1234.0, ("tf32", "torch", 0): 2345.0,
                                                      ("bf16", "torch", 0): 3456.0, ("fp32", "device", 0): 4567.0,
                                                      ("fp32", "torch", 2): 5678.0}
    assert all(f.config["batch_size"] == ctx.config().batch_size and f.where == "on one H100 80GB HBM3, 2027-02-03"
               for f in found.values())


def test_the_kits_gpt_mfu_sentence_is_the_folders_best_run_with_its_gpu_and_date():
    runs = [json.loads(p.read_text()) for p in GPU_RECORDS.rglob("gpt_throughput*.json")]
    assert runs, "the kit keeps GPT-2 small's runs on a GPU"
    top = max(r["summary"]["bf16_mfu"] for r in runs)
    sentence = gpu_records.gpt_mfu_sentence()
    assert f"reached {top:.1%} MFU at best" in sentence and f"in {len(runs)} runs" in sentence
    assert sentence.startswith(f"on one {runs[0]['environment']['device_name'].removeprefix('NVIDIA ')}, "
                               f"{runs[0]['environment']['date'][:10]}")
    assert len(gpt_throughput_figures()) == len(runs)


def test_a_low_run_slowed_by_what_ran_before_it_is_named_as_such(tmp_path):
    """The GPU check's GPT run came after its profiler sessions: the sentence must not show 20 % bare beside 42 %."""
    record = json.loads((GPU_RECORDS / "gpt_throughput-nvidia-h100-80gb-hbm3-2026-11-26.json").read_text())
    fast = dict(record, summary=dict(record["summary"], bf16_mfu=0.4, bf16_tokens_per_s=480_000.0))
    slow = dict(record, measured_after="after something else in the same process")
    (tmp_path / "fast.json").write_text(json.dumps({k: v for k, v in fast.items() if k != "measured_after"}))
    (tmp_path / "slow.json").write_text(json.dumps(slow))
    low = f"{record['summary']['bf16_mfu']:.1%}"
    assert f"; the {low} was measured after something else in the same process" in gpu_records.gpt_mfu_sentence(tmp_path)
    (tmp_path / "slow.json").write_text(json.dumps({k: v for k, v in slow.items() if k != "measured_after"}))
    assert "was measured" not in gpu_records.gpt_mfu_sentence(tmp_path)


def test_without_records_every_sentence_says_nothing_was_measured(tmp_path):
    assert "has not been measured on a GPU" in gpu_records.gpt_mfu_sentence(tmp_path)
    assert gpu_records.precision_sentence("simplecnn", "bf16", tmp_path).startswith("no GPU run of simplecnn in bf16")
    assert check_figures(tmp_path) == [] and gpu_records.gpu_training_record("ddp-weak-1", tmp_path) is None


def test_a_cpu_run_of_notebook_02_predicts_the_cluster_from_the_gpu_checks_step_of_the_same_model():
    record = {"config": {"name": "weak-1", "model": "simplecnn", "precision": "fp32", "batch_size": 64,
                         "loader": "torch", "num_workers": 0},
              "metrics": {"step_ms_median": 230.0, "parameters": 2_474_506, "flops_per_sample": 246_183_936},
              "environment": {"device_type": "cpu", "device_name": "x86_64", "date": "2026-11-29"}}
    same = best(check_figures(), model="simplecnn", precision="fp32", loader="torch", num_workers=0)
    step = wu.cluster_step(record)
    assert step.step_s == same.config["batch_size"] / same.value
    assert step.source.startswith(f"GPU step measured {same.where}, by the GPU check (simplecnn, fp32, batch "
                                  f"{same.config['batch_size']} where this run has 64")


def test_the_newest_gpu_run_keeps_each_notebooks_seconds(tmp_path):
    env = {"device_name": "NVIDIA H200", "date": "2027-03-04T00:00:00+00:00"}
    for day, seconds in (("2027-03-01", 90.0), ("2027-03-04", 80.0)):
        run = tmp_path / f"gpu_run-nvidia-h200-{day}"
        run.mkdir()
        (run / "gpu_run.json").write_text(json.dumps({
            "kind": "gpu_run", "profile": "gpu", "created": day, "environment": {**env, "date": day},
            "notebooks": [{"notebook": "01_single_gpu_baseline.ipynb", "status": "ok", "seconds": seconds},
                          {"notebook": "04_profiling_optimization.ipynb", "status": "FAILED", "seconds": 12.0}]}))
    seconds = gpu_records.notebook_seconds(tmp_path)
    assert list(seconds) == ["01"] and seconds["01"].value == 80.0 and seconds["01"].where == "on one H200, 2027-03-04"


def test_the_decks_show_what_the_gpu_records_hold_named_with_gpu_and_date(tmp_path, monkeypatch):
    import pytest
    from helpers import load_slides_build

    build = load_slides_build()
    monkeypatch.setenv("WORKSHOP_RUNS", str(tmp_path / "runs"))
    results = build.find_results(None, GPU_RECORDS.parent)
    rendered = {}
    for deck in ("00_overview", "01_fundamentals", "02_ddp", "03_optimization"):
        template = (GPU_RECORDS.parents[2] / "slides" / "decks" / f"{deck}.md").read_text()
        assert "{{gpu " in template, f"{deck} shows no GPU figure"
        rendered[deck] = build.Renderer(results, deck).render(template)
    assert f"On a GPU, {gpt_throughput_figures()[0].where}: GPT-2 small" in rendered["01_fundamentals"]
    plain = best(check_figures(), model="simplecnn", precision="fp32", loader="torch", num_workers=0)
    assert f"{plain.where}, the GPU check's SimpleCNN" in rendered["00_overview"]
    assert f"{plain.value:,.0f} samples/s with the DataLoader and no workers" in rendered["00_overview"]
    every = "\n".join(rendered.values())
    assert "the one H100" not in every and "at an MFU of 20%" not in every
    with pytest.raises(build.BuildError, match="no such GPU figure"):
        build.Renderer(results, "00_overview").render("{{gpu nothing}}")


def test_the_guide_and_the_preflight_page_give_each_notebooks_gpu_time_as_the_kit_knows_it():
    """Measured by a GPU run when one is kept (then named so), else the GPU run's estimate, said to be one."""
    from workshop_utils.gpu_check.notebooks import NOTEBOOK_RUNS

    root = GPU_RECORDS.parents[2]
    guide, preflight = (root / "slides" / "INSTRUCTOR.md").read_text(), (root / "docs" / "preflight.md").read_text()
    measured = gpu_records.notebook_seconds()
    for run in NOTEBOOK_RUNS:
        row = next(line for line in guide.splitlines() if line.startswith("| ") and f"`{run.prefix}_" in line)
        gpu_column = row.rstrip(" |").split("|")[-1]
        if run.prefix in measured:
            assert f"{measured[run.prefix].value:.0f} s" in gpu_column and measured[run.prefix].date in guide
        else:
            assert gpu_column.strip() == f"≈ {run.estimate_s} s (estimate; budget 300 s)", row
            assert f"{run.prefix} ≈ {run.estimate_s} s" in preflight
    assert "estimates, not yet measured" in guide or measured


def test_the_guide_shows_the_gpu_figures_beside_the_cpu_ones_as_the_records_hold_them():
    root = GPU_RECORDS.parents[2]
    guide = " ".join((root / "slides" / "INSTRUCTOR.md").read_text().split())  # its lines joined
    cpu = {name: json.loads((root / "results" / "reference" / "results" / f"{name}.json").read_text())["metrics"]
           for name in ("baseline", "gpt")}
    assert f"trained at {cpu['baseline']['samples_per_s']:,.0f} samples/s" in guide
    assert f"tiny GPT at {cpu['gpt']['tokens_per_s']:,.0f} tokens/s" in guide
    assert gpu_records.simplecnn_sentence() in guide and gpu_records.gpt_mfu_sentence() in guide
