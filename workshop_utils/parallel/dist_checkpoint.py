"""Distributed and asynchronous checkpoints with ``torch.distributed.checkpoint`` (DCP).

``checkpoint.py`` has rank 0 write one file: fine for DDP, where every rank holds the same
model. Once the model is sharded (FSDP, tensor or pipeline parallel) no rank holds all of
it, and gathering it onto one rank costs time and memory. With DCP every rank writes its own
shards in parallel (``__<rank>_0.distcp``) and rank 0 adds a small ``.metadata`` file that
maps every tensor to where its pieces are; on loading, each rank reads just the pieces it
needs, so a checkpoint saved by 2 ranks loads on 1, 4 or 8 (resharding).

``dcp.save`` blocks training until the bytes are written. ``dcp.async_save`` only copies
the state to host memory ("staging"), returns a future and writes in a background thread,
so training continues during the write. ``checkpoint_stall`` measures the difference.
"""

from __future__ import annotations

import functools
import time
import warnings
from pathlib import Path

import torch
import torch.distributed as dist

from ..system.errors import WorkshopError


def _state(model, optimizer) -> dict:
    from torch.distributed.checkpoint.state_dict import get_state_dict

    model_state, optimizer_state = get_state_dict(model, optimizer)
    return {"model": model_state, "optimizer": optimizer_state}


def _restore(model, optimizer, folder) -> None:
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import set_state_dict

    state = _state(model, optimizer)  # the shapes and shards to read into
    dcp.load(state, checkpoint_id=str(folder))
    set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optimizer"])


def full_parameter_checksum(model) -> str | None:
    """The checksum of the whole (unsharded) parameters, as ``parameter_checksum`` computes it (rank 0 only).

    Parameters only: buffers such as BatchNorm's running statistics are not sharded by FSDP and
    not kept in step across ranks either, so each rank has its own and the checkpoint keeps one.
    """
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    from ..spine.models import state_checksum

    full = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    names = {name for name, _ in model.named_parameters()}
    return state_checksum({k: v for k, v in full.items() if k in names}) if full else None


@functools.lru_cache(maxsize=4)
def _data(data_root, train_size: int, seed: int):
    """The data set, read once per process.

    One demo builds five sharded runs on every rank, and with CIFAR-10 on disk each read
    verifies 170 MB of checksums: five times over, on every rank at once, for the same data.
    """
    from ..spine.data import load_data

    return load_data(data_root, train_size=train_size, test_size=64, seed=seed, quiet=True)


def _device(device) -> torch.device:
    """``device`` None: where the process group's collectives run (this rank's GPU under NCCL)."""
    from ..spine.distributed import collective_device

    return torch.device(device) if device is not None else collective_device()


class _ShardedRun:
    """An FSDP model with Adam on this rank's batches: what the checkpoints save and restore."""

    def __init__(self, model_name: str, seed: int, device, batch_size: int, data_root=None):
        from torch.distributed.device_mesh import init_device_mesh

        from ..spine.data import make_loader
        from ..spine.models import build_model
        from .sharding import shard_model

        self.rank, world = dist.get_rank(), dist.get_world_size()
        self.seed = seed
        torch.manual_seed(seed)
        self.model = shard_model(build_model(model_name).to(device), init_device_mesh(device.type, (world,)))
        self.optimizer = torch.optim.Adam(self.model.parameters(), lr=1e-3)
        data = _data(None if data_root is None else str(data_root), max(256, 4 * batch_size * world), seed)
        self.loader = make_loader("device", data.train_images, data.train_labels, batch_size, device, train=True,
                                  seed=seed, rank=self.rank, world_size=world)
        self.batches = list(self.loader.epoch(0))

    def step(self, step: int) -> float:
        from .sharding import train_step

        images, labels = self.batches[step % len(self.batches)]
        return train_step(self.model, self.optimizer, images, labels, self.seed, self.rank, step).item()


def sharded_round_trip(folder, model_name: str = "simplecnn", steps: int = 3, batch_size: int = 32, seed: int = 0,
                       device=None, data_root=None) -> dict:
    """Train a sharded model, save it with DCP, load it into a fresh sharded model, and compare.

    Equal parameters, and an equal loss on the next step (the optimizer state came back too).
    """
    import torch.distributed.checkpoint as dcp

    device = _device(device)
    folder = Path(folder)
    trained = _ShardedRun(model_name, seed, device, batch_size, data_root)
    for step in range(steps):
        trained.step(step)
    started = time.perf_counter()
    dcp.save(_state(trained.model, trained.optimizer), checkpoint_id=str(folder))
    save_s = time.perf_counter() - started

    restored = _ShardedRun(model_name, seed + 1, device, batch_size, data_root)  # other weights on purpose
    restored.seed, restored.batches = trained.seed, trained.batches
    started = time.perf_counter()
    _restore(restored.model, restored.optimizer, folder)
    load_s = time.perf_counter() - started
    same = all(torch.equal(a.full_tensor(), b.full_tensor())
               for a, b in zip(trained.model.parameters(), restored.model.parameters()))
    checksum = full_parameter_checksum(trained.model)
    next_losses = (trained.step(steps), restored.step(steps))
    files = sorted((p.name, p.stat().st_size) for p in folder.iterdir()) if dist.get_rank() == 0 else []
    return {"kind": "dcp_round_trip", "model": model_name, "world_size": dist.get_world_size(), "folder": str(folder),
            "files": [{"file": name, "bytes": size} for name, size in files], "save_s": save_s, "load_s": load_s,
            "parameters_equal": same, "next_step_loss": {"saved": next_losses[0], "restored": next_losses[1]},
            "parameter_checksum": checksum}


def checkpoint_stall(folder, model_name: str = "simplecnn", steps: int = 12, every: int = 4, batch_size: int = 32,
                     seed: int = 0, device=None, data_root=None) -> dict:
    """The same training run three times: no checkpoints, ``dcp.save`` every ``every`` steps, ``dcp.async_save``.

    Per mode: the loop's wall time and the time the loop was blocked inside checkpoint calls
    (for async: staging, plus waiting for the previous save to finish before starting the next).
    """
    import torch.distributed.checkpoint as dcp

    if every <= 0 or steps < every:
        raise WorkshopError(f"Checkpoint every {every} steps of {steps}?", "use 0 < every <= steps.")
    device = _device(device)
    # The background save runs collectives while training runs its own: on the same group their order
    # would interleave and hang both. So it gets a group of its own, gloo, which also serves NCCL jobs.
    group = dist.new_group(backend="gloo")
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    rows = []
    for mode in ("none", "sync", "async"):
        run = _ShardedRun(model_name, seed, device, batch_size, data_root)
        run.step(0)  # warm-up, not timed
        pending, blocked, saves = None, 0.0, 0
        dist.barrier()
        started = time.perf_counter()
        for step in range(1, steps + 1):
            run.step(step)
            if mode != "none" and step % every == 0:
                sync()
                began = time.perf_counter()
                target = str(Path(folder) / f"{mode}-step{step}")
                if mode == "sync":
                    dcp.save(_state(run.model, run.optimizer), checkpoint_id=target)
                else:
                    if pending is not None:
                        pending.result()  # one save in flight at a time: host memory for one copy
                    pending = dcp.async_save(_state(run.model, run.optimizer), checkpoint_id=target,
                                             process_group=group)
                blocked += time.perf_counter() - began
                saves += 1
        sync()
        loop_s = time.perf_counter() - started
        if pending is not None:
            began = time.perf_counter()
            pending.result()
            tail_s = time.perf_counter() - began  # the last write, finishing after training
        else:
            tail_s = 0.0
        timing = torch.tensor([loop_s, blocked, tail_s], dtype=torch.float64, device=device)
        dist.all_reduce(timing, op=dist.ReduceOp.MAX)  # the job goes at the pace of its slowest rank
        rows.append({"mode": mode, "saves": saves, "loop_s": timing[0].item(), "blocked_s": timing[1].item(),
                     "blocked_ms_per_save": 1e3 * timing[1].item() / saves if saves else 0.0,
                     "write_after_loop_s": timing[2].item()})
    baseline = rows[0]["loop_s"]
    for row in rows:
        row["slowdown_s"] = row["loop_s"] - baseline
    return {"kind": "checkpoint_stall", "model": model_name, "world_size": dist.get_world_size(), "steps": steps,
            "every": every, "rows": rows}


def load_into_one_process(folder, model) -> torch.nn.Module:
    """Load the model part of a DCP checkpoint, saved by any number of ranks, into a plain model here.

    Without a process group DCP reads every shard itself: this is resharding from p ranks to one.
    """
    import torch.distributed.checkpoint as dcp

    folder = Path(folder)
    if not (folder / ".metadata").exists():
        raise WorkshopError(f"{folder} is not a distributed checkpoint (no .metadata file).",
                            "pass the folder that dcp.save wrote.")
    state = {"model": model.state_dict()}
    with warnings.catch_warnings():  # DCP warns that it loads in one process: here that is the point
        warnings.filterwarnings("ignore", message=".*single process")
        dcp.load(state, checkpoint_id=str(folder))
    model.load_state_dict(state["model"])
    return model
