"""GPU failures a CPU can catch: device tensors handed to numpy, CUDA memory probes as a process's
first CUDA call, checkpoints moved between nodes with different GPU counts, GPU names in the
peak table, and the host syncs the training loop must not make."""

import os
import sys

import pandas as pd
import pytest
import torch

import workshop_utils as wu
from workshop_utils.spine import checkpoint
from workshop_utils.system import hardware
from workshop_utils.lessons import numerics
from workshop_utils.spine import timing
from workshop_utils.spine import trainer
from workshop_utils.system.errors import WorkshopError


class OnDevice(torch.Tensor):
    """A CPU tensor that refuses numpy hand-offs the way a CUDA tensor does, until it is moved with ``.cpu()``."""

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        if func in (torch.Tensor.numpy, torch.Tensor.__array__):
            raise TypeError("can't convert cuda:0 device type tensor to numpy. Use Tensor.cpu() first.")
        out = super().__torch_function__(func, types, args, kwargs or {})
        if func is torch.Tensor.cpu and isinstance(out, OnDevice):
            return out.as_subclass(torch.Tensor)
        return out


def on_device(tensor: torch.Tensor) -> OnDevice:
    return tensor.as_subclass(OnDevice)


def test_the_stand_in_refuses_numpy_like_a_cuda_tensor():
    with pytest.raises(TypeError, match="cuda"):
        (on_device(torch.ones(3)) * 2).numpy()
    assert (on_device(torch.ones(3)) * 2).cpu().numpy().tolist() == [2.0, 2.0, 2.0]


def test_gradient_plots_and_tables_take_device_tensors(tiny_data):
    model = wu.build_model("simplecnn")
    images = torch.randn(8, 3, 32, 32)
    labels = torch.arange(8) % 10
    grads = {kind: on_device(values) for kind, values in wu.capture_gradients(model, images, labels).items()}
    figure = wu.plot_gradient_magnitudes(grads)
    assert len(figure.axes[0].patches) > 0  # the histograms were drawn
    table = wu.underflow_table(grads)
    assert set(table["gradients"]) == {"parameters", "activations"}


class FakeCuda:
    """torch.cuda as a process sees it before its first CUDA call: the allocator's statistics need init()."""

    def __init__(self):
        self.initialised = False

    def init(self):
        self.initialised = True

    def _need_init(self):
        if not self.initialised:
            raise RuntimeError("Invalid device argument : did you call init?")

    def reset_peak_memory_stats(self, device=None):
        self._need_init()

    def max_memory_allocated(self, device=None):
        self._need_init()
        return 3 * 2**20

    def memory_allocated(self, device=None):
        self._need_init()
        return 2**20


@pytest.mark.parametrize("probe", ["reset", "peak", "in_use"])
def test_every_cuda_memory_probe_works_as_the_first_cuda_call(monkeypatch, probe):
    fake = FakeCuda()
    for name in ("init", "reset_peak_memory_stats", "max_memory_allocated", "memory_allocated"):
        monkeypatch.setattr(torch.cuda, name, getattr(fake, name))
    gpu = torch.device("cuda", 0)
    if probe == "reset":
        timing.reset_peak_memory(gpu)
    elif probe == "peak":
        assert timing.peak_memory_mib(gpu)[0] == 3.0
    else:
        assert timing.memory_in_use_mib(gpu) == 1.0
    assert fake.initialised


def _fake_gpus(monkeypatch, count: int, current: int = 0):
    """torch.cuda with ``count`` GPUs whose RNG states are tensors holding their index."""
    states = {i: torch.tensor([i], dtype=torch.uint8) for i in range(count)}
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: count)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: current)
    monkeypatch.setattr(torch.cuda, "get_rng_state", lambda device=0: states[int(device)].clone())
    monkeypatch.setattr(torch.cuda, "get_rng_state_all", lambda: [states[i].clone() for i in range(count)])

    def set_state(state, device=0):
        if int(device) >= count:
            raise IndexError("list index out of range")
        states[int(device)] = state.clone()

    monkeypatch.setattr(torch.cuda, "set_rng_state", set_state)
    return states


def test_checkpoint_written_on_eight_gpus_resumes_where_one_is_visible(monkeypatch, tmp_path):
    model = wu.build_model("simplecnn")
    _fake_gpus(monkeypatch, 8, current=5)
    path = wu.save_checkpoint(tmp_path / "step.pt", model=model, step=3, model_name="simplecnn")
    saved = torch.load(path, weights_only=True)["rng"]
    assert saved["cuda_device"].tolist() == [5]  # the rank's own GPU, not all eight
    states = _fake_gpus(monkeypatch, 1, current=0)
    state = wu.load_checkpoint(path, model=model, model_name="simplecnn")
    assert state["step"] == 3 and states[0].tolist() == [5]


def test_older_checkpoints_with_every_gpus_rng_state_still_resume_on_fewer_gpus(monkeypatch):
    states = _fake_gpus(monkeypatch, 2, current=1)
    legacy = checkpoint.rng_state()
    legacy.pop("cuda_device")
    legacy["cuda"] = [torch.tensor([i + 10], dtype=torch.uint8) for i in range(8)]
    checkpoint.set_rng_state(legacy)
    assert states[1].tolist() == [11]


def test_environment_describes_the_device_the_run_used(monkeypatch):
    monkeypatch.setattr(hardware, "pick_device", lambda prefer=None: torch.device("cuda", 0))
    env = wu.environment(torch.device("cpu"))
    assert env["device_type"] == "cpu" and env["device_name"] == hardware.device_name("cpu")


def test_training_records_the_device_it_ran_on(tiny_data, monkeypatch):
    # On a GPU node a CPU fall-back run must not be labelled with the GPU.
    monkeypatch.setattr(hardware, "pick_device", lambda prefer=None: torch.device("cuda", 0))
    result = wu.train(wu.TrainConfig(device="cpu", batch_size=64, max_steps=2, warmup_steps=0, progress=False,
                                     test_size=64), tiny_data)
    assert result.record["environment"]["device_type"] == "cpu"


@pytest.mark.slow
def test_log_lines_name_the_step_they_report(tiny_data, capsys):
    # Logged losses are read one interval late (no host sync): every logged step still gets its line.
    wu.train(wu.TrainConfig(batch_size=32, max_steps=6, log_every=2, warmup_steps=0, progress=False, test_size=64),
             tiny_data)
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("step ")]
    assert [line.split()[1] for line in lines] == ["2/6", "4/6", "6/6"]
    assert all(float(line.split()[3]) > 0 for line in lines)


def test_ranks_stop_together_one_poll_after_the_signal(monkeypatch):
    import torch.distributed as dist

    store = dist.HashStore()
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    try:
        poll = trainer._StopPoll(torch.device("cpu"), distributed=True)
        monkeypatch.setattr(trainer, "stop_requested", lambda: False)
        assert not poll.should_stop()
        monkeypatch.setattr(trainer, "stop_requested", lambda: True)
        assert not poll.should_stop()  # this poll's agreement is still in flight
        assert poll.should_stop()  # read at the next poll, the same step on every rank
    finally:
        dist.destroy_process_group()


def test_ranks_refuse_to_train_on_different_data(tiny_data, monkeypatch):
    import torch.distributed as dist

    other = wu.make_synthetic_cifar(128, 64, seed=1)
    monkeypatch.setattr(dist, "get_world_size", lambda: 2)

    def gather(out, mine):
        out[0] = mine
        out[1] = (other.fingerprint(), "cifar10", "node-b", "/shared/data")

    monkeypatch.setattr(dist, "all_gather_object", gather)
    with pytest.raises(WorkshopError, match="different data.*cifar10 from /shared/data"):
        trainer.check_same_data(tiny_data)
    monkeypatch.setattr(dist, "all_gather_object", lambda out, mine: out.__setitem__(slice(None), [mine, mine]))
    trainer.check_same_data(tiny_data)  # the same data everywhere: no complaint


def test_evaluation_never_calls_the_compiled_model(tiny_data, monkeypatch):
    calls = []

    class Compiled(torch.nn.Module):
        def __init__(self, module):
            super().__init__()
            self.module = module

        def forward(self, x):
            calls.append(self.module.training)
            return self.module(x)

    monkeypatch.setattr(torch, "compile", lambda module, **kw: Compiled(module))
    wu.train(wu.TrainConfig(compile=True, batch_size=32, max_steps=3, warmup_steps=0, progress=False, test_size=100),
             tiny_data)
    assert calls and all(calls), "the compiled model ran in eval mode (a recompile on a GPU)"


def test_every_compiled_run_starts_from_fresh_compiler_caches(tiny_data, monkeypatch):
    """A second compiled run in one process (the next rung, a sweep point) would otherwise recompile with a
    dynamic batch dimension, and after 8 recompiles fall back to eager without a word."""
    resets = []
    monkeypatch.setattr(torch._dynamo, "reset", lambda: resets.append(True))
    monkeypatch.setattr(torch, "compile", lambda module, **kw: module)
    config = wu.TrainConfig(batch_size=32, max_steps=2, warmup_steps=0, progress=False, test_size=64)
    wu.train(config.replace(compile=True), tiny_data)
    wu.train(config.replace(compile=True, batch_size=64), tiny_data)
    assert len(resets) == 2
    wu.train(config, tiny_data)
    assert len(resets) == 2, "an eager run leaves the compiler alone"


def test_a_hook_that_resets_the_memory_peak_does_not_hide_the_runs_peak(tiny_data, monkeypatch):
    """A per-step memory probe resets the allocator's peak after every step; the record keeps the run's peak."""
    peaks = {"now": 0.0}
    monkeypatch.setattr(trainer, "memory_in_use_mib", lambda device: 0.0)
    monkeypatch.setattr(trainer, "reset_peak_memory", lambda device, release=True: peaks.update(now=0.0))
    monkeypatch.setattr(trainer, "peak_memory_mib", lambda device: (peaks["now"], "test peak"))

    def probe(step):  # reads its own per-step peak, then resets it, as StepMemory does
        peaks["now"] = 0.0

    def step_peaks(step):  # training step N peaks at 100 x N MiB
        peaks["now"] = 100.0 * step

    # every step starts by seeding its dropout: the place to make that step's memory peak
    monkeypatch.setattr(trainer, "seed_dropout", lambda seed, rank, step: step_peaks(step + 1))
    config = wu.TrainConfig(batch_size=32, max_steps=3, warmup_steps=0, progress=False, test_size=64)
    result = wu.train(config, tiny_data, on_step=probe)
    assert result.metrics["peak_memory_mib"] == 300.0


def test_the_cuda_graph_rung_is_profiled_after_its_graph_is_recorded(tiny_data, tmp_path, monkeypatch):
    """CUDA graph trees run a step eagerly, record on the next, replay from the third: profiled before that,
    the rung would show the recording, not the replay it is there to show."""
    from workshop_utils.lessons import profiling

    warmups = {}

    def fake_profile(config, data, run_dir, name, wait, warmup, active, detail):
        warmups[config.compile_mode] = warmup
        raise StopIteration  # enough: the schedule is what is checked

    monkeypatch.setattr(profiling, "profile_training", fake_profile)
    for mode in ("default", "reduce-overhead"):
        rung = wu.Rung(mode, {"compile": True, "compile_mode": mode}, "-")
        with pytest.raises(StopIteration):
            wu.profile_rungs(wu.TrainConfig(device="cpu"), tiny_data, [rung], tmp_path, warmup=1, progress=False)
    assert warmups == {"default": 1, "reduce-overhead": 2}


def test_the_single_process_lab_run_uses_the_device_of_the_ddp_ranks(monkeypatch, tmp_path):
    """On a node with one or two GPUs the lab's three ranks run on the CPU: the single process beside them must too."""
    from workshop_utils.exercises import ddp_lab

    seen = {}

    def fake_stream(commands, env, timeout_s, echo):
        seen["visible"] = env.get("CUDA_VISIBLE_DEVICES")
        return [0], ["throughput: 1,000 samples/s"]

    monkeypatch.setattr(ddp_lab, "stream", fake_stream)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    for gpus, visible in ((1, ""), (2, ""), (3, None)):
        monkeypatch.setattr(torch.cuda, "device_count", lambda gpus=gpus: gpus)
        assert wu.run_single("train_single.py", tmp_path, echo=False) == 1000
        assert seen["visible"] == visible, f"{gpus} GPU(s)"


@pytest.mark.slow
def test_deterministic_runs_restore_the_global_settings(tiny_data):
    before = (torch.are_deterministic_algorithms_enabled(), torch.backends.cudnn.benchmark)
    config = wu.TrainConfig(batch_size=32, max_steps=3, warmup_steps=0, progress=False, test_size=64)
    plain = wu.train(config, tiny_data)
    exact = wu.train(config.replace(deterministic=True), tiny_data)
    assert (torch.are_deterministic_algorithms_enabled(), torch.backends.cudnn.benchmark) == before
    assert exact.metrics["param_checksum"] == plain.metrics["param_checksum"]  # CPU kernels are deterministic


def test_profiler_noise_from_native_code_is_kept_out_of_the_cell(capfd):
    from workshop_utils.spine.timing import native_noise_filtered

    with native_noise_filtered():
        os.write(2, b"ERROR: 1 (pid) gpuGetDeviceCount failed with code 35\n")
        os.write(2, b"[W1123 10:52:34.899 CPUAllocator.cpp:245] Memory block of unknown size was allocated\n")
        os.write(2, b"USDT:2026-11-23 10:52:34 7007:7007 SyncActivityProfilerHandler.cpp:39] profiler_start\n")
        os.write(2, b"a real problem worth reading\n")
    err = capfd.readouterr().err
    assert err.strip() == "a real problem worth reading"


def test_monitor_says_when_the_gpu_reports_no_utilisation():
    frame = pd.DataFrame({"t_s": [0.2, 0.4], "utilization_pct": [None, None], "memory_used_mib": [1.0, 1.0],
                          "power_w": [None, None], "temperature_c": [None, None]})
    assert "does not report its utilisation" in wu.monitor_verdict(frame)
    assert "No samples" in wu.monitor_verdict(frame.iloc[:0])


def test_torchrun_workers_leave_sigterm_to_torchrun(monkeypatch):
    import signal

    from workshop_utils.spine import preemption

    saved = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGUSR1)}
    try:
        monkeypatch.setenv("TORCHELASTIC_RUN_ID", "job")
        preemption.stop_on_signals()
        assert signal.getsignal(signal.SIGTERM) is saved[signal.SIGTERM]
        assert signal.getsignal(signal.SIGUSR1) is not saved[signal.SIGUSR1]
        monkeypatch.delenv("TORCHELASTIC_RUN_ID")
        preemption.stop_on_signals()  # srun or a plain process: pre-emption arrives as SIGTERM
        assert signal.getsignal(signal.SIGTERM) is not saved[signal.SIGTERM]
    finally:
        for sig, handler in saved.items():
            signal.signal(sig, handler)
        monkeypatch.setattr(preemption, "_installed", False)


def test_large_synthetic_sets_are_generated_once_then_read_back(tmp_path, monkeypatch):
    from workshop_utils.spine import data

    monkeypatch.setenv("WORKSHOP_CACHE", str(tmp_path))
    monkeypatch.setattr(data, "_CACHE_FROM_IMAGES", 100)
    first = data.make_synthetic_cifar(96, 32, seed=3)
    assert len(list(tmp_path.glob("synthetic-*.npz"))) == 1
    monkeypatch.setattr(data, "_generate_synthetic", lambda *a: pytest.fail("generated again instead of read"))
    again = data.make_synthetic_cifar(96, 32, seed=3)
    assert again.fingerprint() == first.fingerprint() and "cached" in again.location


@pytest.mark.parametrize("device", [None, "cpu", "cuda", "cuda:0", "cuda:1", "cuda:12"])
def test_the_device_field_takes_what_torch_device_prints(device):
    assert wu.validate_config(wu.TrainConfig(device=device)).device == device


@pytest.mark.parametrize("device", ["gpu", "cuda:", "cuda:-1", "cuda:01", "CUDA", "cpu:0", "mps", ""])
def test_a_device_the_field_cannot_mean_is_one_line(device):
    with pytest.raises(WorkshopError, match="device must be 'cpu', 'cuda', 'cuda:N'"):
        wu.validate_config(wu.TrainConfig(device=device))


def test_the_command_line_takes_a_gpu_index():
    import importlib
    train = importlib.import_module("workshop_utils.train")  # the module: wu.train is the function
    assert train.config_from_args(train.build_parser().parse_args(["--device", "cuda:1"]), 1).device == "cuda:1"


# ---------------------------------------------------------------- MIG slices


@pytest.mark.parametrize("name, whole_gpu, slices", [("NVIDIA H100 80GB HBM3 MIG 1g.10gb", "NVIDIA H100 80GB HBM3", (1, 7)),
                                                      ("NVIDIA A100-SXM4-40GB MIG 3g.20gb", "NVIDIA A100-SXM4-40GB", (3, 7))])
def test_a_mig_slice_is_measured_against_its_share_of_the_peak(name, whole_gpu, slices):
    # Against the whole H100's peak, a 1g slice's MFU would read 7x too low.
    assert wu.mig_share(name) == slices and wu.mig_share(whole_gpu) is None
    assert wu.peak_tflops(name, "bf16") == pytest.approx(wu.peak_tflops(whole_gpu, "bf16") * slices[0] / slices[1])
    assert wu.peak_note(name).startswith(f"MIG slice {name.split()[-1]}: peak taken as {slices[0]}/{slices[1]}")
    assert wu.peak_note(whole_gpu) is None


def test_an_a30_has_four_compute_slices():
    assert wu.mig_share("NVIDIA A30 MIG 2g.12gb") == (2, 4)


def test_a_mig_slice_of_an_unknown_gpu_has_no_peak_and_says_so():
    assert wu.peak_tflops("NVIDIA Z9000 MIG 1g.5gb", "bf16") is None
    assert "no peak" in wu.peak_note("NVIDIA Z9000 MIG 1g.5gb")


class FakeNvml:
    """pynvml's lookup calls, recording which one the monitor used."""

    class NVMLError(Exception):
        pass

    def __init__(self):
        self.calls = []

    def nvmlInit(self):
        pass

    def nvmlDeviceGetHandleByUUID(self, uuid):
        self.calls.append(("uuid", uuid))
        return uuid

    def nvmlDeviceGetHandleByIndex(self, index):
        self.calls.append(("index", index))
        return index


def test_the_monitor_reads_a_mig_slice_by_its_uuid_not_the_physical_gpu_0(monkeypatch):
    from workshop_utils.lessons import monitor
    nvml = FakeNvml()
    monkeypatch.setitem(sys.modules, "pynvml", nvml)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "MIG-5c89d7a4-1c0e-5a6b-9d41-3a1b2c3d4e5f")
    handle, why_not = monitor._nvml_handle(torch.device("cuda", 0))
    assert why_not is None and nvml.calls == [("uuid", "MIG-5c89d7a4-1c0e-5a6b-9d41-3a1b2c3d4e5f")]


def test_the_monitor_refuses_to_guess_a_gpu_it_cannot_identify(monkeypatch):
    from workshop_utils.lessons import monitor
    nvml = FakeNvml()
    monkeypatch.setitem(sys.modules, "pynvml", nvml)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)

    def unknown(device):
        raise RuntimeError("Invalid device index")

    monkeypatch.setattr(torch.cuda, "_get_nvml_device_index", unknown)
    handle, why_not = monitor._nvml_handle(torch.device("cuda", 1))
    assert handle is None and "cannot tell which GPU" in why_not and nvml.calls == []


# ---------------------------------------------------------------- notebook 06's GPU request, sized to the cluster


def _nodes(*gres):
    return pd.DataFrame({"node": [f"n{i}" for i in range(len(gres))], "gres": list(gres)})


@pytest.mark.parametrize("gres, tasks, options, said", [
    # one node with one GPU: two tasks with a GPU each cannot fit; sbatch would refuse the request outright
    (["gpu:1"], 2, ["--nodes=1", "--ntasks=1", "--gpus-per-task=1"], "1 task(s) with 1 GPU(s) each on 1 node(s) (2"),
    (["gpu:h100:4(S:0-1)"], 2, ["--nodes=1", "--ntasks=2", "--gpus-per-task=1"], "on 1 node(s)."),
    (["gpu:1", "gpu:a100:1,shard:8"], 2, ["--nodes=2", "--ntasks=2", "--gpus-per-task=1"], "on 2 node(s)."),
    (["(null)", "gpu:2"], 2, ["--nodes=1", "--ntasks=2", "--gpus-per-task=1"], "on 1 node(s)."),
])
def test_env_check_asks_for_what_the_cluster_has(gres, tasks, options, said):
    request, why = wu.env_check_request(_nodes(*gres), tasks, 1)
    assert request == options and said in why and why.count("\n") == 0


def test_env_check_without_gpus_asks_for_tasks_only_and_a_gpu_profile_without_gpu_nodes_is_one_line():
    assert wu.env_check_request(_nodes("(null)"), 2, 0) == (["--ntasks=2"], "env_check: 2 task(s), no GPU.")
    with pytest.raises(WorkshopError, match="No node lists a GPU"):
        wu.env_check_request(_nodes("(null)", None), 2, 1)
