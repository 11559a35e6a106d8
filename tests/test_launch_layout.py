"""Where each rank runs, decided without a GPU: simulated nodes, Slurm tasks, collectives' buffers."""

from __future__ import annotations

import sys

import pytest
import torch
import torch.distributed as dist

from workshop_utils.parallel import comm_model
from workshop_utils.spine import distributed
from workshop_utils.spine.distributed import gpu_for_local_rank, rank_device
from workshop_utils.system.errors import WorkshopError
from workshop_utils.system.results import fresh_folder
from workshop_utils.parallel.launch import (node_layout, resume_verdict, visible_gpu_ids,
                                   world_sizes_for_this_machine)


def _gpus_of(layout) -> list[list[str]]:
    return [[g for g in visible.split(",") if g] for visible in layout.visible_devices]


@pytest.mark.parametrize("gpus", [0, 1, 2, 4, 8])
@pytest.mark.parametrize("nnodes,nproc", [(2, 1), (2, 2), (2, 4), (4, 2)])
def test_two_agents_never_share_a_gpu(gpus, nnodes, nproc):
    layout = node_layout(gpus, nnodes, nproc)
    assert len(layout.visible_devices) == nnodes
    owned = _gpus_of(layout)
    everyone = [g for agent in owned for g in agent]
    assert len(everyone) == len(set(everyone)), f"two agents share a GPU: {layout.visible_devices}"
    if gpus >= nnodes * nproc:
        assert (layout.backend, layout.device) == ("nccl", "cuda")
        # Each agent numbers its processes from local rank 0 and sees exactly that many GPUs.
        assert all(len(agent) == nproc for agent in owned)
        assert set(everyone) <= {str(i) for i in range(gpus)}
    else:
        assert (layout.backend, layout.device) == ("gloo", "cpu")
        assert layout.visible_devices == ("",) * nnodes, "CPU agents must not touch any GPU"
    assert "\n" not in layout.reason and layout.reason


def test_two_single_process_nodes_on_each_gpu_count():
    expected = {0: ("gloo", ("", "")), 1: ("gloo", ("", "")), 2: ("nccl", ("0", "1")), 4: ("nccl", ("0", "1")),
                8: ("nccl", ("0", "1"))}
    for gpus, (backend, visible) in expected.items():
        layout = node_layout(gpus, 2, 1)
        assert (layout.backend, layout.visible_devices) == (backend, visible), gpus
    assert "1 GPU" not in node_layout(0, 2, 1).reason and "no GPU" in node_layout(0, 2, 1).reason
    assert "this machine has 1" in node_layout(1, 2, 1).reason  # the fall-back says why


def test_agents_keep_the_gpus_this_process_was_given():
    # A job given GPUs 4-7 must hand those on: "0" in a child would name a GPU it was not given.
    layout = node_layout(4, 2, 2, visible=["4", "5", "6", "7"])
    assert layout.visible_devices == ("4,5", "6,7")
    assert visible_gpu_ids({"CUDA_VISIBLE_DEVICES": "GPU-a, GPU-b"}) == ["GPU-a", "GPU-b"]
    assert visible_gpu_ids({}) is None


def test_cpu_asked_for_or_too_few_gpus_for_cuda():
    assert node_layout(8, 2, 1, device="cpu").backend == "gloo"
    with pytest.raises(WorkshopError, match="Duplicate GPU"):
        node_layout(1, 2, 1, device="cuda")
    with pytest.raises(WorkshopError, match="not a job"):
        node_layout(2, 0, 1)
    with pytest.raises(WorkshopError, match="Unknown device"):
        node_layout(2, 2, 1, device="gpu")


@pytest.mark.parametrize("gpus,expected", [(1, [1]), (2, [1, 2]), (4, [1, 2, 4]), (8, [1, 2, 8])])
def test_world_sizes_keep_the_smallest_and_the_largest(monkeypatch, gpus, expected):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: gpus)
    assert world_sizes_for_this_machine(at_most=3) == expected
    assert world_sizes_for_this_machine()[-1] == min(gpus, 8)


def test_fresh_folders_are_new_and_empty(tmp_path):
    first = fresh_folder(tmp_path / "checkpoints", "crash")
    (first / "step_00000120.pt").write_bytes(b"an earlier run's checkpoint")
    second = fresh_folder(tmp_path / "checkpoints", "crash")
    assert second != first and not any(second.iterdir())


def _record(resumed, checksum="abc", steps=60, loss=1.0):
    return {"metrics": {"resumed_from_step": resumed, "param_checksum": checksum, "steps": steps,
                        "final_train_loss": loss}}


def test_resume_verdict_needs_a_real_crash_and_resume():
    reference = _record(None)
    ok, line = resume_verdict(_record(30), reference, 33, "cpu")
    assert ok and "resumed from step 30" in line and "identical" in line
    ok, line = resume_verdict(_record(60), reference, 33, "cpu")  # the stale-folder case
    assert not ok and "Not a resume test" in line and "step 60" in line
    ok, line = resume_verdict(_record(None), reference, 33, "cpu")
    assert not ok and "never loaded a checkpoint" in line
    ok, line = resume_verdict(_record(30, checksum="def", loss=1.1), reference, 33, "cuda")
    assert not ok and "differ" in line and "not bitwise deterministic" in line and "1.1000" in line


# ---------------------------------------------------------------- one GPU per rank, under torchrun or srun


def _pretend_gpus(monkeypatch, count):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: count > 0)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: count)


def test_torchrun_rank_takes_its_local_rank(monkeypatch):
    _pretend_gpus(monkeypatch, 4)
    env = {"LOCAL_RANK": "3", "LOCAL_WORLD_SIZE": "4"}
    assert rank_device(3, env=env) == torch.device("cuda", 3)
    with pytest.raises(WorkshopError, match="8 processes per node"):
        rank_device(3, env={"LOCAL_RANK": "3", "LOCAL_WORLD_SIZE": "8"})


@pytest.mark.parametrize("local_rank", [0, 1, 2, 3])
def test_srun_gpus_per_task_each_task_uses_its_own_gpu(monkeypatch, local_rank):
    # srun --ntasks-per-node=4 --gpus-per-task=1: every task sees one GPU, its own; SLURM_LOCALID is 0-3.
    _pretend_gpus(monkeypatch, 1)
    env = {"SLURM_LOCALID": str(local_rank), "SLURM_GPUS_PER_TASK": "1"}
    assert rank_device(local_rank, env=env) == torch.device("cuda", 0)
    assert gpu_for_local_rank(local_rank, 2, {"SLURM_GPUS_PER_TASK": "h100:2"}) == 0


def test_srun_tasks_sharing_too_few_gpus_get_a_clear_error(monkeypatch):
    _pretend_gpus(monkeypatch, 1)
    with pytest.raises(WorkshopError, match="Local rank 1 has no GPU"):
        rank_device(1, env={"SLURM_LOCALID": "1"})  # 4 tasks, one GPU for all of them
    # --gpus-per-task=1 but every task sees all 4 of the node's GPUs (no per-task binding): the local rank picks.
    assert gpu_for_local_rank(2, 4, {"SLURM_LOCALID": "2", "SLURM_GPUS_PER_TASK": "1"}) == 2
    with pytest.raises(WorkshopError, match="Local rank 5 has no GPU"):
        gpu_for_local_rank(5, 4, {"SLURM_GPUS_PER_TASK": "1"})


def test_no_gpu_means_cpu_unless_cuda_is_asked_for(monkeypatch):
    _pretend_gpus(monkeypatch, 0)
    assert rank_device(0, env={}) == torch.device("cpu")
    with pytest.raises(WorkshopError, match="no CUDA GPU"):
        rank_device(0, "cuda", env={})
    _pretend_gpus(monkeypatch, 2)
    assert rank_device(1, "cpu", env={"LOCAL_RANK": "1"}) == torch.device("cpu")


# ---------------------------------------------------------------- collectives' buffers under NCCL


def _pretend_nccl(monkeypatch, gpu=3):
    monkeypatch.setattr(dist, "is_initialized", lambda: True)
    monkeypatch.setattr(dist, "get_backend", lambda group=None: "nccl")
    monkeypatch.setattr(torch.cuda, "current_device", lambda: gpu)


def test_collectives_under_nccl_use_the_ranks_gpu(monkeypatch):
    assert distributed.collective_device() == torch.device("cpu")  # no process group here
    _pretend_nccl(monkeypatch)
    assert distributed.collective_device() == torch.device("cuda", 3)


def test_measuring_all_reduce_under_nccl_does_not_default_to_the_cpu(monkeypatch):
    import workshop_utils.parallel.collectives as collectives

    _pretend_nccl(monkeypatch, gpu=1)
    seen = {}

    def fake_time_collectives(sizes, names, repeats, device):
        seen["device"] = device
        return []

    monkeypatch.setattr(collectives, "time_collectives", fake_time_collectives)
    collectives.measure_all_reduce([4096], repeats=1)
    assert seen["device"] == torch.device("cuda", 1)


def test_all_reduce_sum_of_a_cpu_tensor_under_nccl_goes_through_the_gpu(monkeypatch):
    _pretend_nccl(monkeypatch, gpu=0)
    moved, reduced = [], []
    monkeypatch.setattr(torch.Tensor, "to", lambda self, *a, **k: moved.append(a) or self.clone())
    monkeypatch.setattr(dist, "all_reduce", lambda tensor, op=None: reduced.append(tensor) or tensor.mul_(2))
    values = torch.tensor([1.0, 2.0])
    assert distributed.all_reduce_sum(values) is values
    assert moved == [(torch.device("cuda", 0),)] and reduced[0] is not values
    assert values.tolist() == [2.0, 4.0]  # the sum is written back into the caller's tensor


def test_a_job_that_keeps_printing_still_times_out():
    from workshop_utils.system.errors import WorkshopError
    from workshop_utils.parallel.launch import stream

    chatty = [sys.executable, "-c", "import time\nwhile True:\n    print('tick', flush=True)\n    time.sleep(0.02)"]
    with pytest.raises(WorkshopError, match="longer than 1 s"):
        stream({"": chatty}, timeout_s=1, echo=False)


def test_cpu_ranks_are_launched_without_gpus(monkeypatch):
    from workshop_utils.parallel import launch

    seen = {}

    def fake_stream(commands, env=None, timeout_s=600, echo=True, envs=None):
        seen.update(env)
        return [0], []

    monkeypatch.setattr(launch, "stream", fake_stream)
    launch.launch_torchrun("workshop_utils.train", [], 2, device="cpu", echo=False)
    assert seen["CUDA_VISIBLE_DEVICES"] == ""


def test_a_device_index_is_what_one_process_may_name_and_several_may_not(monkeypatch):
    # str(torch.device) on a GPU is "cuda:0": every entry that passes a device on must be able to say it.
    _pretend_gpus(monkeypatch, 2)
    assert rank_device(0, "cuda:1", env={}) == torch.device("cuda", 1)
    with pytest.raises(WorkshopError, match="sees 2 GPU"):
        rank_device(0, "cuda:2", env={})
    with pytest.raises(WorkshopError, match="same GPU"):
        rank_device(1, "cuda:0", env={"LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2"}, world_size=2)
    assert rank_device(1, "cuda", env={"LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2"}, world_size=2) == \
        torch.device("cuda", 1)


@pytest.mark.parametrize("device, backend, device_id", [("cuda", "nccl", torch.device("cuda", 1)),
                                                         ("cpu", "gloo", None)])
def test_nccl_process_group_is_bound_to_the_rank_gpu(monkeypatch, device, backend, device_id):
    # Without device_id every NCCL barrier() warns "using the device under current context".
    from torch import distributed as dist

    from workshop_utils.spine import distributed
    _pretend_gpus(monkeypatch, 2)
    for name, value in {"RANK": "1", "LOCAL_RANK": "1", "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2",
                        "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"}.items():
        monkeypatch.setenv(name, value)
    seen = {}
    monkeypatch.setattr(torch.cuda, "set_device", lambda d: seen.setdefault("set_device", d))
    monkeypatch.setattr(dist, "is_initialized", lambda: False)
    monkeypatch.setattr(dist, "rendezvous", lambda *a, **k: iter([(dist.HashStore(), 1, 2)]))
    monkeypatch.setattr(dist, "init_process_group", lambda backend, **k: seen.update(backend=backend, **k))
    info, chosen = distributed.setup_distributed(device)
    assert seen["backend"] == backend == info.backend
    assert seen["device_id"] == device_id
    assert chosen == (device_id or torch.device("cpu"))
