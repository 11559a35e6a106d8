"""torch.profiler around the training loop: traces on disk, a top-operator table, memory per step."""

import json
from pathlib import Path

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


def test_profile_writes_one_chrome_trace_and_nothing_for_the_deprecated_tensorboard_plugin(profiled):
    assert profiled.chrome_trace.name == "cpu-profile.json" and profiled.chrome_trace.parent.name == "traces"
    events = json.loads(profiled.chrome_trace.read_text())["traceEvents"]
    assert any("convolution" in e.get("name", "") for e in events)
    assert [p.name for p in profiled.chrome_trace.parent.iterdir()] == ["cpu-profile.json"]


def test_top_ops_ranks_real_operators_by_self_time(profiled):
    table = profiled.top_ops(5)
    assert len(table) == 5 and table["self_cpu_ms"].is_monotonic_decreasing
    assert not table["operator"].str.startswith("ProfilerStep").any()
    assert table["operator"].str.contains("conv").any()  # convolutions are where a CNN's time goes
    assert (table["self_share"] > 0).all() and table["self_share"].sum() <= 1


def test_profile_run_trains_exactly_the_scheduled_steps_and_measures_each(profiled):
    assert profiled.result.metrics["steps"] == 4
    # the kept steps (after 1 skipped and 1 warm-up), each with the tensors' peak the profiler counted: a step
    # frees what it allocates, so the peaks are equal (the process's resident size grows under the profiler)
    assert profiled.step_memory["step"].tolist() == [3, 4]
    peaks = profiled.step_memory["tensor_peak_mib"]
    assert (peaks > 0).all() and peaks.max() - peaks.min() < 0.01 * peaks.max()


def test_profile_rejects_an_empty_schedule(tiny_data, tmp_path):
    with pytest.raises(wu.WorkshopError, match="schedule"):
        wu.profile_training(wu.TrainConfig(device="cpu"), tiny_data, tmp_path, active=0)


def test_step_breakdown_splits_each_step_into_the_named_phases(profiled):
    row = wu.step_breakdown(profiled)
    phases = [row[f"{name}_ms"] for name in ("data", "forward", "backward", "optimizer")]
    assert all(ms > 0 for ms in phases)
    assert sum(phases) + row["other_ms"] == pytest.approx(row["step_ms"], rel=0.02)
    assert row["forward_ms"] + row["backward_ms"] > row["data_ms"]  # a CNN step is mostly its passes
    assert row["operators_per_step"] > 10 and row["kernels_per_step"] is None  # no kernels on a CPU
    assert row["host_syncs_per_step"] == 0  # the loop reads no value back while it trains


def _fake_run(step_body, steps=3):
    """A profile of ``steps`` hand-made steps, shaped like profile_training's, for step_breakdown."""
    import torch
    from torch.profiler import profile, record_function, schedule

    with profile(activities=[torch.profiler.ProfilerActivity.CPU],
                 schedule=schedule(wait=0, warmup=1, active=steps, repeat=1)) as prof:
        for _ in range(steps + 1):
            step_body(record_function)
            prof.step()
    return wu.ProfileRun(prof, None, None, None, torch.device("cpu"))


def test_host_syncs_are_counted_in_the_training_phases_and_not_in_the_loader():
    import torch

    x = torch.ones(8)

    def step(phase):
        with phase("data"):
            x.sum().item()  # a loader reading its own CPU tensor: waits for no device
        with phase("forward"):
            x.sum().item(), x.max().item()  # the lines that would stall a GPU loop
        with phase("backward"):
            x.mul(2)
        with phase("optimizer"):
            x.add_(0)

    row = wu.step_breakdown(_fake_run(step))
    assert row["host_syncs_per_step"] == 2


def _event(name, start, end, device=None, annotation=False, kernels=(), id=0):
    from types import SimpleNamespace

    from torch.autograd import DeviceType
    return SimpleNamespace(name=name, time_range=SimpleNamespace(start=start, end=end),
                           device_type=device or DeviceType.CPU, is_async=False, is_user_annotation=annotation,
                           cpu_parent=None, kernels=[SimpleNamespace(duration=d) for d in kernels], id=id)


def _gpu_profile(steps=2, graphs=False):
    """A GPU profile's events as the profiler reports them, built by hand (no GPU here): every named range twice,
    on the host and again on the GPU timeline; each kernel on the GPU timeline, later than the runtime call that
    launched it and sharing its correlation id; and one ``.item()``: the read-back operator and the runtime call
    in which the host waits. With ``graphs`` the forward and backward are each one replayed CUDA graph, whose
    kernels link to no operator (the replay runs inside a named range), as under torch.compile's reduce-overhead."""
    from types import SimpleNamespace

    import torch
    from torch.autograd import DeviceType

    cuda = DeviceType.CUDA
    events = []
    for k in range(steps):
        t, ids = 1000 * k, iter(range(100 * k + 1, 100 * k + 100))
        for name, start, end in ((f"ProfilerStep#{k}", 0, 1000), ("data", 0, 100), ("forward", 100, 400),
                                 ("backward", 400, 800), ("optimizer", 800, 950)):
            # the host's range (a GPU copy is linked to it like a kernel) and the copy, later on the GPU timeline
            events.append(_event(name, t + start, t + end, annotation=True, kernels=[end - start]))
            events.append(_event(name, t + start + 300, t + end + 300, cuda, annotation=True))

        def launch(at, durations, call="cudaLaunchKernel"):
            i = next(ids)
            events.append(_event(call, t + at, t + at + 2, id=i))
            events.extend(_event(f"kernel_{i}_{j}", t + at + 300, t + at + 300 + d, cuda, id=i)
                          for j, d in enumerate(durations))
            return list(durations)

        if graphs:
            events.append(_event("## Call CompiledFxGraph ##", t + 140, t + 390, annotation=True,
                                 kernels=launch(150, [120, 80], "cudaGraphLaunch")))
            events.append(_event("## Call CompiledFxGraph ##", t + 440, t + 790, annotation=True,
                                 kernels=launch(450, [200, 50, 50], "cudaGraphLaunch")))
        else:
            events.append(_event("aten::convolution", t + 150, t + 160, kernels=launch(152, [200])))
            events.append(_event("aten::convolution_backward", t + 450, t + 470,
                                 kernels=launch(452, [250]) + launch(460, [50])))
        events += [_event("aten::_local_scalar_dense", t + 200, t + 210),  # loss.item() in the forward phase
                   _event("cudaStreamSynchronize", t + 205, t + 209),
                   _event("aten::_fused_sgd_", t + 850, t + 860, kernels=launch(852, [40])),
                   _event("Memcpy DtoH (Device -> Pageable)", t + 520, t + 521, cuda, id=0)]
    profiler = SimpleNamespace(events=lambda: events)
    return wu.ProfileRun(profiler, None, None, None, torch.device("cuda"))


def test_step_breakdown_on_a_gpu_counts_each_step_once_and_each_kernel_in_its_phase():
    row = wu.step_breakdown(_gpu_profile(steps=2))
    assert row["step_ms"] == pytest.approx(1.0)  # not halved by the ranges' GPU copies
    assert (row["data_ms"], row["forward_ms"], row["backward_ms"], row["optimizer_ms"]) == pytest.approx(
        (0.0, 0.2, 0.3, 0.04))  # kernel time by launching phase; a range's own span is not a kernel
    assert row["idle_ms"] == pytest.approx(1.0 - 0.54)
    assert row["kernels_per_step"] == 4 and row["launches_per_step"] == 4 and row["graph_launches_per_step"] == 0
    assert row["operators_per_step"] == 4
    assert row["host_syncs_per_step"] == 1  # one .item(): one wait, not two


def test_step_breakdown_counts_the_kernels_a_cuda_graph_replays_and_its_single_launch():
    # The "CUDA graphs" rung's claim, as its table row must show it: forward and backward each replayed from one
    # launch, every kernel inside still counted and timed in its phase; the optimizer still launches its own.
    row = wu.step_breakdown(_gpu_profile(steps=2, graphs=True))
    assert (row["forward_ms"], row["backward_ms"], row["optimizer_ms"]) == pytest.approx((0.2, 0.3, 0.04))
    assert row["kernels_per_step"] == 6
    assert row["launches_per_step"] == 3 and row["graph_launches_per_step"] == 2


def test_top_ops_on_a_gpu_lists_operators_not_ranges_or_kernels():
    """The rows a GPU profile adds (kernels, the ranges' GPU copies) never reach the operator table."""
    from types import SimpleNamespace

    import torch
    from torch.autograd import DeviceType

    def row(key, gpu_ms, device=DeviceType.CPU, annotation=False):
        return SimpleNamespace(key=key, count=2, self_cpu_time_total=100, cpu_time_total=200, device_type=device,
                               is_user_annotation=annotation, self_device_time_total=gpu_ms * 1e3)

    rows = [row("aten::convolution", 3.0), row("aten::add_", 1.0), row("forward", 9.0, annotation=True),
            row("forward", 9.0, DeviceType.CUDA, annotation=True), row("ProfilerStep#3", 20.0, annotation=True),
            row("void cudnn_conv_kernel", 3.0, DeviceType.CUDA)]
    profiler = SimpleNamespace(key_averages=lambda: rows)
    table = wu.top_ops(profiler, n=10, device=torch.device("cuda"))
    assert table["operator"].tolist() == ["aten::convolution", "aten::add_"]
    assert table["self_gpu_ms"].tolist() == [3.0, 1.0] and table["self_share"].tolist() == [0.75, 0.25]


def test_step_breakdown_needs_named_phases():
    run = _fake_run(lambda phase: None)
    with pytest.raises(wu.WorkshopError, match="named"):
        wu.step_breakdown(run)


def test_phases_cost_nothing_when_annotation_is_off():
    import torch
    from torch.profiler import profile

    from workshop_utils.spine.timing import phase_ranges

    off = phase_ranges(False, torch.device("cpu"))
    assert off("data") is off("forward")  # one shared do-nothing context, no object per call
    with profile() as prof:
        with off("forward"):
            torch.ones(2).sum()
        with phase_ranges(True, torch.device("cpu"))("backward"):
            torch.ones(2).sum()
    names = {e.name for e in prof.events()}
    assert "backward" in names and "forward" not in names


def test_profile_rungs_profiles_every_rung_that_applies_and_changes_something(tiny_data, tmp_path):
    rungs = [wu.Rung("baseline", {}, "-"), wu.Rung("not here", {"precision": "bf16"}, "-", "for the test"),
             wu.Rung("same settings", {"num_workers": 0}, "-"),
             wu.Rung("fused optimizer", {"optimizer_kernels": "fused"}, "-")]
    table = wu.profile_rungs(wu.TrainConfig(batch_size=32, device="cpu"), tiny_data, rungs, tmp_path, active=2,
                             progress=False)
    assert table["rung"].tolist() == ["baseline", "fused optimizer"]
    assert (table["optimizer_ms"] > 0).all()
    # The fused update is one operator for all tensors instead of a few per tensor.
    assert table["operators_per_step"].iloc[1] < table["operators_per_step"].iloc[0]
    figure = wu.plot_step_breakdown(table)
    ax = figure.axes[0]
    assert "milliseconds" in ax.get_xlabel() and len(ax.get_legend().get_texts()) == 5


def test_nsys_command_records_the_timed_steps_of_exactly_this_config(monkeypatch):
    from workshop_utils.train import build_parser, config_from_args

    config = wu.TrainConfig(max_steps=40, loader="device", precision="bf16", batch_size=256)
    command = wu.nsys_command(config, "traces/nsys")
    assert command[:2] == ["nsys", "profile"] and "--capture-range=cudaProfilerApi" in command
    train_args = command[command.index("workshop_utils.train") + 1:]
    assert config_from_args(build_parser().parse_args(train_args), 1) == config.replace(annotate=True)
    monkeypatch.setattr("shutil.which", lambda name: None)
    assert "no nsys" in wu.nsys_missing()
    with pytest.raises(wu.WorkshopError, match="cannot run here"):
        wu.nsys_profile(config, "unused")


def test_the_profiler_names_the_kernel_scaled_dot_product_attention_chose():
    import torch

    torch.manual_seed(0)
    model = wu.build_model("gpt")
    tokens = torch.randint(0, 256, (2, 32))
    fused = wu.attention_kernels(model.use_attention("fused"), tokens)
    assert "aten::scaled_dot_product_attention" in fused
    assert any("flash" in name or "math" in name or "efficient" in name for name in fused), fused  # which one ran
    unfused = wu.attention_kernels(model.use_attention("math"), tokens)
    assert "aten::softmax" in unfused and not any("scaled_dot_product" in name for name in unfused)


@pytest.mark.parametrize("kernels", ["default", "fused"])
def test_adamw_reading_its_host_held_step_counters_is_no_host_sync_of_the_loop(tmp_path, corpus, kernels):
    """AdamW reads each parameter's step counter back from the host on a CPU (68 of them for the tiny GPT);
    on a GPU that read waits for nothing, so the breakdown must not count it as a sync of the training loop."""
    config = wu.TrainConfig(model="gpt", optimizer="adamw", lr=1e-3, batch_size=4, sequence_length=32, test_size=8,
                            optimizer_kernels=kernels, progress=False, device="cpu")
    run = wu.profile_training(config, corpus, tmp_path, name="gpt-profile", wait=0, warmup=1, active=2, detail=False)
    assert wu.step_breakdown(run)["host_syncs_per_step"] == 0


# ---------------------------------------------------------------- timings no profiler slows (CUPTI torn down)


def test_importing_the_kit_asks_kineto_to_tear_cupti_down_unless_the_user_said_otherwise():
    """A profiler session left CUPTI attached, and GPT-2 small timed after three of them ran 1.66x slower (H100):
    the variable must be set before the kit's first session, i.e. on import, before any notebook cell profiles."""
    import os
    import subprocess
    import sys

    code = "import os, workshop_utils; print(os.environ.get('TEARDOWN_CUPTI'))"
    clean = {k: v for k, v in os.environ.items() if k != "TEARDOWN_CUPTI"}
    said = [subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
            .stdout.strip() for env in (clean, {**clean, "TEARDOWN_CUPTI": "0"})]
    assert said == ["1", "0"]


def test_every_profiler_session_of_the_kit_starts_with_the_teardown_set(monkeypatch):
    import ast
    import os

    import torch

    package = Path(wu.__file__).parent
    # No module but spine/timing.py builds a torch.profiler session itself: every other one goes through it.
    builders = []
    for path in package.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and (getattr(node.func, "id", None) == "profile"
                                               or getattr(node.func, "attr", None) == "profile"):
                builders.append(str(path.relative_to(package)))
    assert set(builders) <= {"spine/timing.py"}, builders
    seen, real = [], torch.profiler.profile

    def spy(*args, **kwargs):
        seen.append(os.environ.get("TEARDOWN_CUPTI"))
        return real(*args, **kwargs)

    monkeypatch.delenv("TEARDOWN_CUPTI", raising=False)  # as if a user had removed it after the import
    monkeypatch.setattr(torch.profiler, "profile", spy)
    wu.attention_kernels(wu.build_gpt("tiny").eval(), torch.zeros(1, 8, dtype=torch.long))
    assert seen == ["1"]
