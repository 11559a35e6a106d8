import pytest
import torch
from torch import nn

import workshop_utils as wu
from workshop_utils.spine import timing


def test_flop_counter_counts_forward_and_backward():
    # Linear 10->5 without bias: forward 2*10*5 = 100 FLOPs per sample; backward computes the
    # weight gradient (100) and, as the layer is not the first to need it, no input gradient.
    assert wu.training_flops_per_sample(nn.Linear(10, 5, bias=False), input_shape=(10,)) == 200
    two_layers = nn.Sequential(nn.Linear(10, 5, bias=False), nn.Linear(5, 4, bias=False))
    # layer 2: forward 40, weight grad 40, input grad 40; layer 1: forward 100, weight grad 100
    assert wu.training_flops_per_sample(two_layers, input_shape=(10,)) == 320


def test_simplecnn_flops_match_the_layer_arithmetic():
    convs = [(3, 64, 32), (64, 128, 16), (128, 256, 8)]  # in channels, out channels, image size
    conv_fwd = [2 * cin * 9 * cout * size * size for cin, cout, size in convs]
    linear_fwd = [2 * 4096 * 512, 2 * 512 * 10]
    forward = sum(conv_fwd) + sum(linear_fwd)
    # Backward is twice the forward, minus the input gradient the first layer never computes.
    expected = 3 * forward - conv_fwd[0]
    assert wu.training_flops_per_sample(wu.build_model("simplecnn")) == expected


def test_warmup_steps_are_excluded_from_timing(monkeypatch):
    clock = {"t": 0.0}
    monkeypatch.setattr(timing.time, "perf_counter", lambda: clock["t"])
    timer = wu.StepTimer(torch.device("cpu"), warmup_steps=3)
    timer.begin()
    for step in range(10):
        clock["t"] += 1.0 if step < 3 else 0.010  # slow warm-up, then 10 ms steps
        timer.step_done(step)
    summary = timer.summary(samples_per_step=100)
    assert summary["timed_steps"] == 7
    assert summary["step_ms_median"] == pytest.approx(10.0)
    assert summary["samples_per_s"] == pytest.approx(10_000)


def test_time_between_segments_is_not_counted(monkeypatch):
    clock = {"t": 0.0}
    monkeypatch.setattr(timing.time, "perf_counter", lambda: clock["t"])
    timer = wu.StepTimer(torch.device("cpu"))
    for segment in range(2):
        timer.begin()
        for step in range(3):
            clock["t"] += 0.1
            timer.step_done(3 * segment + step)
        clock["t"] += 50.0  # evaluation between epochs
    assert timer.summary(1)["timed_s"] == pytest.approx(0.6)


def test_summary_with_no_timed_steps_is_explicit():
    timer = wu.StepTimer(torch.device("cpu"), warmup_steps=5)
    timer.begin()
    timer.step_done(0)
    summary = timer.summary(10)
    assert summary["timed_steps"] == 0 and summary["samples_per_s"] is None
