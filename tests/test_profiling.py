"""torch.profiler around the training loop: traces on disk, a top-operator table, memory per step."""

import json

import pytest

import workshop_utils as wu


@pytest.fixture(scope="module")
def profiled(tmp_path_factory):
    config = wu.TrainConfig(batch_size=32, progress=False, device="cpu")
    data = wu.make_synthetic_cifar(256, 128, seed=0)
    return wu.profile_training(config, data, tmp_path_factory.mktemp("profile"), name="cpu-profile",
                               wait=1, warmup=1, active=2)


def test_train_calls_on_step_after_every_optimizer_step(tiny_data):
    seen = []
    wu.train(wu.TrainConfig(batch_size=32, max_steps=4, progress=False, device="cpu"), tiny_data,
             on_step=seen.append)
    assert seen == [1, 2, 3, 4]


def test_profile_writes_a_chrome_trace_and_a_tensorboard_trace(profiled):
    assert profiled.chrome_trace.name == "cpu-profile.json" and profiled.chrome_trace.parent.name == "traces"
    events = json.loads(profiled.chrome_trace.read_text())["traceEvents"]
    assert any("convolution" in e.get("name", "") for e in events)
    tensorboard = list(profiled.tensorboard_dir.glob("*.pt.trace.json"))  # the plugin's file pattern
    assert len(tensorboard) == 1 and tensorboard[0].stat().st_size == profiled.chrome_trace.stat().st_size


def test_top_ops_ranks_real_operators_by_self_time(profiled):
    table = profiled.top_ops(5)
    assert len(table) == 5 and table["self_cpu_ms"].is_monotonic_decreasing
    assert not table["operator"].str.startswith("ProfilerStep").any()
    assert table["operator"].str.contains("conv").any()  # convolutions are where a CNN's time goes
    assert (table["self_share"] > 0).all() and table["self_share"].sum() <= 1


def test_profile_run_trains_exactly_the_scheduled_steps_and_measures_each(profiled):
    assert profiled.result.metrics["steps"] == 4
    assert profiled.step_memory["step"].tolist() == [1, 2, 3, 4]


def test_profile_rejects_an_empty_schedule(tiny_data, tmp_path):
    with pytest.raises(wu.WorkshopError, match="schedule"):
        wu.profile_training(wu.TrainConfig(device="cpu"), tiny_data, tmp_path, active=0)
