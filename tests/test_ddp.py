"""DDP with the one training loop: two gloo ranks on the CPU, started by torchrun as a user would."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from helpers import TWO_RANK_RUN

import workshop_utils as wu
from workshop_utils.spine.data import ResumableSampler, mix_seeds
from workshop_utils.system.results import fresh_folder
from workshop_utils.parallel.launch import launch_nodes, launch_training, resume_verdict
from workshop_utils.spine.trainer import _lr_lambda

RUN = TWO_RANK_RUN  # rank 0 checkpoints at each epoch's end


@pytest.fixture(scope="module")
def ddp_run(two_rank_run):
    """The session's uninterrupted 2-rank run (conftest), whose checkpoints sit in a run folder's checkpoints/."""
    return two_rank_run


@pytest.mark.parametrize("length,world", [(64, 2), (60, 4), (61, 2)])
def test_sampler_shards_are_disjoint_and_cover_the_data(length, world):
    for epoch in (0, 1):
        shards = []
        for rank in range(world):
            sampler = ResumableSampler(length, rank, world, shuffle=True, seed=0, drop_last=True)
            sampler.set_epoch(epoch)
            shards.append([index for _, index in sampler])
        seen = [i for shard in shards for i in shard]
        assert len(seen) == len(set(seen)), "two ranks got the same sample"
        assert len({len(s) for s in shards}) == 1, "ranks must take the same number of steps"
        assert len(seen) == length - length % world  # all of it, less the remainder drop_last leaves out


def _reference_one_process(data, steps: int, per_rank_batch: int, world: int = 2):
    """One process doing, step by step, exactly what the ranks compute together.

    Each rank's micro-batch goes through the model separately (BatchNorm normalises per rank),
    with that rank's dropout seed; the gradients are averaged as DDP's all-reduce does. BatchNorm's
    running statistics are rank 0's (DDP broadcasts rank 0's buffers before every forward pass).
    """
    torch.manual_seed(0)
    model = wu.build_model("simplecnn").train()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, weight_decay=5e-4, nesterov=True)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, _lr_lambda(0, steps))
    loaders = [wu.make_loader("torch", data.train_images, data.train_labels, per_rank_batch, torch.device("cpu"),
                              train=True, seed=0, rank=r, world_size=world) for r in range(world)]
    per_epoch = len(loaders[0])
    for step in range(steps):
        optimizer.zero_grad()
        for rank in reversed(range(world)):  # rank 0 last: its running statistics are the ones kept
            buffers = {k: v.clone() for k, v in model.named_buffers()}
            images, labels = list(loaders[rank].epoch(step // per_epoch))[step % per_epoch]
            torch.manual_seed(mix_seeds(0, rank, step) & 0x7FFF_FFFF_FFFF_FFFF)
            (F.cross_entropy(model(images), labels) / world).backward()
            if rank != 0:
                model.load_state_dict({**model.state_dict(), **buffers})
        optimizer.step()
        scheduler.step()
    return model


@pytest.mark.slow
def test_two_ranks_match_one_process_on_the_same_global_batch(ddp_run):
    launched, checkpoints = ddp_run
    assert launched.record["metrics"]["world_size"] == 2
    assert launched.record["metrics"]["global_batch_size"] == 16
    ddp_model = wu.build_model("simplecnn")
    wu.load_checkpoint(wu.latest_checkpoint(checkpoints), model=ddp_model)  # strict: no "module." prefix
    data = wu.load_data(train_size=RUN["train_size"], test_size=RUN["test_size"], seed=0, quiet=True)
    # Each rank computes with one thread (two ranks on two cores). With more threads the CPU kernels sum
    # in another order; a last-bit difference can flip a max-pool choice and the gradient with it.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        reference = _reference_one_process(data, RUN["steps"], RUN["batch_size"])
    finally:
        torch.set_num_threads(threads)
    assert wu.max_parameter_difference(ddp_model, reference) < 1e-4


@pytest.mark.slow
def test_ddp_checkpoint_has_no_module_prefix_and_resumes_in_one_process(ddp_run):
    _, checkpoints = ddp_run
    path = wu.latest_checkpoint(checkpoints)
    state = torch.load(path, weights_only=True)
    assert state["step"] == RUN["steps"]
    assert not [k for k in state["model"] if k.startswith("module.")]
    config = wu.TrainConfig(batch_size=16, epochs=3, max_steps=RUN["steps"] + 2, train_size=64, test_size=16,
                            checkpoint_dir=str(checkpoints), resume=str(path), progress=False, device="cpu")
    resumed = wu.train(config)
    assert resumed.metrics["resumed_from_step"] == RUN["steps"]
    assert resumed.metrics["steps"] == RUN["steps"] + 2


@pytest.mark.slow
def test_crashed_rank_is_restarted_and_ends_with_the_same_parameters(ddp_run):
    uninterrupted, earlier = ddp_run
    stale = torch.load(wu.latest_checkpoint(earlier), weights_only=True)["step"]
    assert stale >= RUN["steps"] > 5  # an earlier run's checkpoint, from after the failure step below
    # A second run into the same run folder, as the notebook run twice with one run_dir: it must not
    # resume from the earlier run's final checkpoint (that would skip the crash and compare nothing).
    checkpoints = fresh_folder(earlier.parent, earlier.name)
    assert checkpoints != earlier and wu.latest_checkpoint(checkpoints) is None
    crashed = launch_training(2, max_restarts=1, checkpoint_dir=str(checkpoints), checkpoint_every=3,
                              resume=True, fail_at_step=5, echo=False, timeout_s=300, threads=1, **RUN)
    output = "\n".join(crashed.lines)
    assert "injected failure on rank 1 at step 5" in output
    assert "Resumed from" in output and "at step 3" in output
    assert crashed.record["metrics"]["resumed_from_step"] == 3
    identical, line = resume_verdict(crashed.record, uninterrupted.record, 5, "cpu")
    assert identical, line
    assert crashed.record["metrics"]["param_checksum"] == uninterrupted.record["metrics"]["param_checksum"]


@pytest.mark.slow
def test_two_agents_on_one_machine_form_one_job():
    launched = launch_nodes(2, 1, batch_size=8, steps=2, train_size=32, test_size=16, warmup_steps=0,
                            device="cpu", echo=False, timeout_s=300)
    output = "\n".join(launched.lines)
    assert launched.lines[0].startswith("Layout: 2 agent(s) x 1 process(es) as gloo CPU processes")
    assert launched.layout.visible_devices == ("", "")
    assert "rank 0 of 2 (local rank 0" in output and "rank 1 of 2 (local rank 0" in output
    assert {line.split("]")[0] for line in launched.lines if "rank " in line and " of 2" in line} == \
        {"[agent 0", "[agent 1"}
    assert launched.record["metrics"]["world_size"] == 2


def test_the_ranks_of_one_start_share_a_store_prefix_whatever_their_agents_counted(monkeypatch):
    """After a failure, the agent of another node may restart its ranks without counting a restart: the
    ranks of one start must still agree on their prefix in torchrun's store, or they wait for each other."""
    import torch.distributed as dist

    from workshop_utils.spine.distributed import _this_start

    store = dist.HashStore()
    monkeypatch.setenv("GROUP_WORLD_SIZE", "2")
    prefixes = []
    for counts in ((0, 0), (1, 0), (2, 1)):  # each agent's TORCHELASTIC_RESTART_COUNT, start by start
        for count in counts:
            monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", str(count))
            prefixes.append(_this_start(store, world_size=2))
    assert prefixes == ["start-0/", "start-0/", "start-1/", "start-1/", "start-2/", "start-2/"]
    monkeypatch.setenv("GROUP_WORLD_SIZE", "1")  # one agent numbers the restarts of all its ranks
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "3")
    assert _this_start(store, world_size=2) == "attempt-3/"
