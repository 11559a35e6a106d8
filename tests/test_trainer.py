import json
import math

import pytest
import torch

import workshop_utils as wu

SMALL = dict(epochs=2, batch_size=32, warmup_steps=2, progress=False)


@pytest.mark.slow
@pytest.mark.parametrize("loader", ["torch", "device"])
def test_interrupted_and_resumed_run_ends_bit_identical(tmp_path, tiny_data, loader):
    config = wu.TrainConfig(loader=loader, checkpoint_dir=str(tmp_path / "ck"), **SMALL)
    whole = wu.train(config.replace(checkpoint_dir=str(tmp_path / "whole")), tiny_data)
    first = wu.train(config.replace(stop_after_step=5), tiny_data)  # stops mid-epoch 1
    assert first.metrics["interrupted"] and first.metrics["steps"] == 5
    second = wu.train(config.replace(resume=True), tiny_data)
    assert second.metrics["resumed_from_step"] == 5 and second.metrics["steps"] == whole.metrics["steps"] == 16
    assert second.metrics["param_checksum"] == whole.metrics["param_checksum"]


def test_record_holds_config_metrics_environment_and_saves_as_json(tmp_path, tiny_data):
    result = wu.train(wu.TrainConfig(name="r1", max_steps=6, **SMALL), tiny_data)
    m = result.metrics
    assert m["steps"] == 6 and m["timed_steps"] == 4  # 2 warm-up steps not timed
    assert m["samples_per_s"] > 0 and m["flops_per_sample"] > 0 and m["tflops_per_device"] > 0
    assert m["mfu"] is None  # a CPU is not in the peak table: unknown, not guessed
    assert m["parameters"] == 2_474_506 and m["data_source"] == "synthetic"
    assert len(result.record["step_loss"]) == 6 and len(result.record["step_ms"]) == 4
    path = result.save(tmp_path)
    saved = json.loads(path.read_text())
    assert saved["config"]["max_steps"] == 6 and saved["environment"]["torch"]
    frame = wu.load_results(tmp_path, kind="train")
    assert frame.loc[0, "name"] == "r1" and frame.loc[0, "steps"] == 6


def test_step_budget_overrides_epochs(tiny_data):
    result = wu.train(wu.TrainConfig(epochs=5, max_steps=3, batch_size=64, warmup_steps=0, progress=False),
                      tiny_data)
    assert result.metrics["steps"] == 3 and result.metrics["epochs_done"] == 1


def _initial_model(seed: int = 0):
    """The weights ``train`` starts from: it seeds torch with the config's seed, then builds the model."""
    torch.manual_seed(seed)
    return wu.build_model("simplecnn")


def test_a_step_moves_the_weights_and_a_seed_fixes_them(tiny_data):
    config = wu.TrainConfig(max_steps=1, batch_size=16, warmup_steps=0, progress=False)
    first, again, other = (wu.train(config.replace(seed=seed), tiny_data) for seed in (0, 0, 1))
    assert wu.max_parameter_difference(_initial_model(0), first.model) > 1e-4, "an SGD step changed nothing"
    assert first.metrics["param_checksum"] == again.metrics["param_checksum"] == wu.parameter_checksum(first.model)
    assert first.record["step_loss"] == again.record["step_loss"]
    assert other.metrics["param_checksum"] != first.metrics["param_checksum"]


@pytest.mark.slow
@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_training_learns_the_synthetic_set(precision, tiny_data):
    """40 steps on 256 learnable images: the loss falls well below chance's ln(10) and accuracy rises above 10%.

    A fifth of the synthetic labels are random, so the loss cannot fall as fast as on clean labels.
    """
    result = wu.train(wu.TrainConfig(precision=precision, epochs=10, max_steps=40, batch_size=32, lr=0.01,
                                     warmup_steps=0, progress=False), tiny_data)
    losses = result.record["step_loss"]
    assert len(losses) == 40
    assert losses[0] == pytest.approx(math.log(10), abs=0.3), "an untrained 10-way classifier starts near ln(10)"
    assert sum(losses[-4:]) / 4 < 0.8 * math.log(10), losses
    assert result.metrics["final_test_acc"] > 0.3, "chance is 0.1"


@pytest.mark.slow
def test_fp16_on_cpu_computes_the_same_loss_and_still_updates_the_weights(tiny_data, recwarn):
    """fp16 autocast plus GradScaler (emulated, slow on a CPU): same first loss as fp32, and steps not all skipped;
    the step GradScaler skips prints no warning of a scheduler called out of order."""
    config = wu.TrainConfig(max_steps=3, batch_size=4, warmup_steps=0, progress=False)  # a second a sample
    half = wu.train(config.replace(precision="fp16"), tiny_data)
    full = wu.train(config.replace(max_steps=1), tiny_data)
    losses = half.record["step_loss"]
    assert len(losses) == 3 and all(math.isfinite(x) for x in losses)
    assert losses[0] == pytest.approx(full.record["step_loss"][0], abs=2e-2), "first batch, same initial weights"
    assert wu.max_parameter_difference(_initial_model(0), half.model) > 1e-4, "every fp16 step was skipped"
    assert not [w for w in recwarn if "lr_scheduler.step()" in str(w.message)], [str(w.message) for w in recwarn]


@pytest.mark.parametrize("change, message", [
    (dict(model="vgg"), "Unknown model 'vgg'"),
    (dict(precision="fp8"), "Unknown precision 'fp8'"),
    (dict(loader="dali"), "Unknown loader 'dali'"),
    (dict(batch_size=0), "batch_size must be a positive whole number"),
    (dict(batch_size=-8), "batch_size must be a positive whole number"),
    (dict(epochs=0), "epochs must be a positive"),
    (dict(lr=-1.0), "lr must be a positive number"),
    (dict(resume=True), "need somewhere to keep checkpoints"),
    (dict(batch_size=4096), "not one full step fits"),
])
def test_bad_config_is_one_clear_error(change, message, tiny_data):
    with pytest.raises(wu.WorkshopError, match=message) as info:
        wu.train(wu.TrainConfig(progress=False, **change), tiny_data)
    assert "Fix:" in str(info.value)


def test_resume_into_another_model_leaves_the_checkpoint(tmp_path, tiny_data):
    config = wu.TrainConfig(max_steps=2, checkpoint_dir=str(tmp_path), **SMALL)
    wu.train(config, tiny_data)
    saved = wu.list_checkpoints(tmp_path)
    with pytest.raises(wu.WorkshopError, match="from model 'simplecnn', not 'resnet18'"):
        wu.train(config.replace(model="resnet18", resume=True), tiny_data)
    assert wu.list_checkpoints(tmp_path) == saved


@pytest.mark.slow
def test_baseline_checks_read_a_real_record(tiny_data):
    result = wu.train(wu.TrainConfig(**SMALL), tiny_data)
    checks = wu.check_baseline(result.record)
    assert checks.loc["parameter count", "result"] == "ok"
    assert checks.loc["real data", "result"] == "LOOK"  # synthetic data is always flagged
    assert "throughput" in wu.summary_table(result.record).index


def test_tensorboard_scalars_hold_the_runs_own_numbers(tiny_data, tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    config = wu.TrainConfig(name="tb", batch_size=32, epochs=2, warmup_steps=1, progress=False, device="cpu",
                            tensorboard_dir=str(tmp_path / "tensorboard"))
    result = wu.train(config, tiny_data)
    events = EventAccumulator(str(tmp_path / "tensorboard" / "tb"))
    events.Reload()
    losses = events.Scalars("train/loss_per_step")
    steps = result.metrics["steps"]
    assert [e.step for e in losses] == list(range(1, steps + 1))
    assert [e.value for e in losses] == pytest.approx(result.record["step_loss"], rel=1e-6)
    assert [e.value for e in events.Scalars("epoch/test_acc")] == pytest.approx(
        [row["test_acc"] for row in result.record["history"]])
    assert len(events.Scalars("speed/step_ms")) == steps and all(e.value > 0 for e in events.Scalars("speed/step_ms"))
    assert events.Scalars("train/learning_rate")[0].value == pytest.approx(config.lr)


def test_only_rank_0_writes_tensorboard_scalars_and_a_bad_folder_fails_first(tmp_path):
    from workshop_utils.spine.scalar_log import ScalarLog

    ScalarLog(str(tmp_path / "other-rank"), is_main=False, run_name="run").close()
    assert not (tmp_path / "other-rank").exists()
    (tmp_path / "a-file").write_text("")
    with pytest.raises(wu.WorkshopError, match="tensorboard_dir"):
        wu.train(wu.TrainConfig(tensorboard_dir=str(tmp_path / "a-file"), device="cpu", progress=False))


def test_gpu_utilisation_is_read_as_training_ends_not_after_evaluation(tiny_data, tmp_path, monkeypatch):
    # NVML's utilisation covers its last 1/6-1 s: read after evaluate() it described evaluation. The loop
    # runs here on the CPU with a pretend GPU reading: 97% while training, 5% once evaluation began.
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from workshop_utils.spine import scalar_log, trainer
    phase = {"now": "training"}
    real_evaluate = trainer.evaluate

    def evaluate(*args, **kwargs):
        phase["now"] = "evaluation"
        return real_evaluate(*args, **kwargs)

    def training_steps_done(self, device):
        self.utilisation = 97 if phase["now"] == "training" else 5

    monkeypatch.setattr(trainer, "evaluate", evaluate)
    monkeypatch.setattr(scalar_log.ScalarLog, "training_steps_done", training_steps_done)
    config = wu.TrainConfig(name="util", batch_size=32, epochs=1, warmup_steps=1, progress=False, device="cpu",
                            tensorboard_dir=str(tmp_path / "tensorboard"))
    wu.train(config, tiny_data)
    events = EventAccumulator(str(tmp_path / "tensorboard" / "util"))
    events.Reload()
    assert [e.value for e in events.Scalars(scalar_log.ScalarLog.UTILISATION)] == [97]
    assert "last_training" in scalar_log.ScalarLog.UTILISATION  # the name says what window it covers


def test_the_configs_sizes_hold_for_images_passed_in(one_thread):
    """TrainConfig(train_size=N) trains on the first N images whether train() loads them or is handed a set."""
    data = wu.make_synthetic_cifar(256, 64, seed=0)
    config = wu.TrainConfig(batch_size=32, epochs=1, train_size=128, test_size=32, warmup_steps=0, progress=False)
    assert wu.train(config, data).metrics["steps"] == 128 // 32
    assert wu.train(config.replace(train_size=None), data).metrics["steps"] == 256 // 32
    assert len(data.train_labels) == 256 and len(data.test_labels) == 64  # the caller's set is left whole
