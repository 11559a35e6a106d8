import time

import numpy as np
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


# ---------------------------------------------------------------------- the one timer for everything else


def slow_then_fast(slow_calls: int, slow_s: float = 0.25, fast_s: float = 0.002):
    """A function whose first calls are slow (compilation, connections, allocation) and the rest fast."""
    calls = {"n": 0}

    def fn():
        calls["n"] += 1
        time.sleep(slow_s if calls["n"] <= slow_calls else fast_s)

    return fn, calls


def test_time_repeats_on_cpu_reads_perf_counter_and_leaves_out_the_warmup(monkeypatch):
    fn, calls = slow_then_fast(slow_calls=2)
    readings = {"n": 0}
    real = time.perf_counter

    def counted():
        readings["n"] += 1
        return real()

    monkeypatch.setattr(timing.time, "perf_counter", counted)
    times = wu.time_repeats(fn, repeats=5, warmup=2, device="cpu")
    assert calls["n"] == 7 and len(times) == 5
    assert readings["n"] == 10  # two readings per timed call, none for the warm-up
    assert (times.seconds >= 0.002).all() and (times.seconds < 0.2).all(), times.seconds  # no slow call counted
    assert times.median == pytest.approx(float(np.median(times.seconds)))
    assert times.mean == pytest.approx(times.total / 5)


def test_time_repeats_runs_the_setup_untimed_before_every_call():
    order = []
    times = wu.time_repeats(lambda: order.append("call"), repeats=2, warmup=1,
                            before=lambda: (order.append("setup"), time.sleep(0.3)))
    assert order == ["setup", "call"] * 3
    assert (times.seconds < 0.2).all(), "the setup's sleep must not be timed"


def test_region_timer_times_each_region_and_leaves_out_the_warmup():
    timer = wu.RegionTimer("cpu", warmup=1)
    for seconds in (0.3, 0.01, 0.02):
        with timer:
            time.sleep(seconds)
    times = timer.times()
    assert len(times) == 2 and 0.01 <= times.seconds[0] < 0.2 and times.seconds[1] >= 0.02
    timer.start()
    time.sleep(0.01)
    timer.stop()
    assert len(timer.times()) == 3


@pytest.mark.parametrize("repeats, warmup", [(0, 1), (2, -1), (1.5, 0)])
def test_time_repeats_refuses_impossible_counts(repeats, warmup):
    with pytest.raises(wu.WorkshopError, match="whole number"):
        wu.time_repeats(lambda: None, repeats=repeats, warmup=warmup)


def test_all_warmup_means_nothing_to_report():
    timer = wu.RegionTimer("cpu", warmup=1)
    with timer:
        pass
    with pytest.raises(wu.WorkshopError, match="Nothing was timed"):
        timer.times().median


class FakeGpu:
    """torch.cuda's timing API on a simulated GPU: a stream that runs queued work back to back.

    ``launch(seconds)`` queues work, which starts when the host launches it or when the stream is
    free, whichever is later. An event records when the stream reaches it; as on a real GPU its
    time can be read only after a synchronize.
    """

    def __init__(self):
        self.host = 0.0  # the host's clock: launching costs it nothing
        self.stream_free = 0.0  # when the stream finishes the work queued so far
        self.syncs, self.streams, self.events = 0, [], []

    def launch(self, seconds: float) -> None:
        self.stream_free = max(self.stream_free, self.host) + seconds

    def synchronize(self, device=None):
        self.syncs += 1
        self.host = max(self.host, self.stream_free)
        for event in self.events:
            event.done = True

    def current_stream(self, device=None):
        self.streams.append(device)
        return "stream"

    def Event(self, enable_timing=False):  # noqa: N802 (torch's name)
        gpu = self
        assert enable_timing

        class Event:
            def __init__(self):
                self.t, self.done = None, False
                gpu.events.append(self)

            def record(self, stream=None):
                self.t = max(gpu.host, gpu.stream_free)

            def elapsed_time(self, end):
                if not (self.done and end.done):
                    raise RuntimeError("Both events must be completed before calculating elapsed time.")
                return 1e3 * (end.t - self.t)

        return Event()


@pytest.fixture
def fake_gpu(monkeypatch):
    gpu = FakeGpu()
    for name in ("Event", "synchronize", "current_stream"):
        monkeypatch.setattr(torch.cuda, name, getattr(gpu, name))
    monkeypatch.setattr(timing.time, "perf_counter", lambda: pytest.fail("a GPU is timed with events, not the host"))
    return gpu


def test_time_repeats_on_a_gpu_times_the_device_with_events_and_no_sync_per_call(fake_gpu):
    durations = iter([1.0, 1.0, 0.01, 0.02, 0.03, 0.04])  # two slow warm-up calls, then fast ones
    times = wu.time_repeats(lambda: fake_gpu.launch(next(durations)), repeats=4, warmup=2,
                            device=torch.device("cuda", 1))
    assert times.seconds == pytest.approx([0.01, 0.02, 0.03, 0.04])  # the device's time, the warm-up left out
    assert fake_gpu.syncs == 2  # after the warm-up and before reading: none between the calls
    assert set(fake_gpu.streams) == {torch.device("cuda", 1)}  # events on the measured device's stream


def test_region_timer_on_a_gpu_waits_for_queued_work_and_counts_until_the_work_is_done(fake_gpu):
    fake_gpu.launch(5.0)  # queued before the region: not its work
    timer = wu.RegionTimer(torch.device("cuda", 0))
    with timer:
        fake_gpu.host += 0.5  # host work in the region (reading files)
        fake_gpu.launch(0.25)  # device work, still running when the region's code ends
    assert timer.times().seconds == pytest.approx([0.75])


def test_step_timer_on_a_gpu_reads_its_events_after_one_sync(fake_gpu):
    timer = wu.StepTimer(torch.device("cuda", 0), warmup_steps=1)
    timer.begin()
    for step, seconds in enumerate([2.0, 0.1, 0.1]):
        fake_gpu.launch(seconds)
        timer.step_done(step)
    assert fake_gpu.syncs == 0  # the loop itself never waits for the GPU
    assert timer.step_times() == pytest.approx([0.1, 0.1]) and fake_gpu.syncs == 1
