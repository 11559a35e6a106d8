"""Distributed and asynchronous checkpoints with ``torch.distributed.checkpoint`` (DCP).

``checkpoint.py`` has rank 0 write one file: fine for DDP, where every rank holds the same
model. Once the model is sharded (FSDP, tensor or pipeline parallel) no rank holds all of
it, and gathering it onto one rank costs time and memory. With DCP every rank writes its own
shards in parallel (``__<rank>_0.distcp``) and rank 0 adds a small ``.metadata`` file that
maps every tensor to where its pieces are; on loading, each rank reads just the pieces it
needs, so a checkpoint saved by 2 ranks loads on 1, 4 or 8 (resharding).

``dcp.save`` blocks training until the bytes are written. ``dcp.async_save`` blocks while it
copies the state into new host buffers ("staging"; its first call in a process also starts its
writer), returns a future and writes in a background thread, so training continues during the
write (PyTorch's asynchronous-checkpoint recipe: the copy is its main cost; the writer thread
shares the process with training). It gains where the write takes longer than the copy: large
states, shared file systems. ``checkpoint_stall`` measures both, save by save, and
``stall_summary`` says in one sentence what a measurement shows.

Reading is safe: DCP itself unpickles ``.metadata`` with plain ``pickle`` and the non-tensor
values (the optimizer's hyperparameters) with ``torch.load(weights_only=False)``, either of
which runs whatever code a crafted file names. Every read here goes through ``_dcp_load``:
``.metadata`` is unpickled with only DCP's own metadata classes allowed, and each value with
``weights_only=True``; anything else is one ``WorkshopError`` and nothing is run.
"""

from __future__ import annotations

import builtins
import collections
import functools
import io
import pathlib
import threading
import time
import warnings
from pathlib import Path

import torch
import torch.distributed as dist

from ..system.errors import WorkshopError
from ..system.safe_pickle import RefusedPickle, describe_pickle_failure, restricted_loads


def _state(model, optimizer) -> dict:
    from torch.distributed.checkpoint.state_dict import get_state_dict

    model_state, optimizer_state = get_state_dict(model, optimizer)
    return {"model": model_state, "optimizer": optimizer_state}


def _restore(model, optimizer, folder) -> None:
    from torch.distributed.checkpoint.state_dict import set_state_dict

    state = _state(model, optimizer)  # the shapes and shards to read into
    _dcp_load(state, folder)
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

    Per mode: the loop's wall time and the time the loop was blocked inside checkpoint calls (for async:
    staging, plus waiting for the previous save to finish before starting the next), per save and for the
    first save apart from the later ones (the first ``async_save`` of a process also sets up its writer);
    for async, how long each background write took after its call returned (``background_write_ms``);
    and the state's size per rank (what each save copies or writes).
    """
    import torch.distributed.checkpoint as dcp

    if every <= 0 or steps < every:
        raise WorkshopError(f"Checkpoint every {every} steps of {steps}?", "use 0 < every <= steps.")
    device = _device(device)
    # The background save runs collectives while training runs its own: on the same group their order
    # would interleave and hang both. So it gets a group of its own, gloo, which also serves NCCL jobs.
    group = dist.new_group(backend="gloo")
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    rows, state_mib = [], 0.0
    for mode in ("none", "sync", "async"):
        run = _ShardedRun(model_name, seed, device, batch_size, data_root)
        run.step(0)  # warm-up, not timed
        pending, blocked, saves, per_save, writes = None, 0.0, 0, [], []
        dist.barrier()
        started = time.perf_counter()
        for step in range(1, steps + 1):
            run.step(step)
            if mode != "none" and step % every == 0:
                sync()
                began = time.perf_counter()
                target = str(Path(folder) / f"{mode}-step{step}")
                state = _state(run.model, run.optimizer)
                state_mib = _local_mib(state)
                if mode == "sync":
                    dcp.save(state, checkpoint_id=target)
                else:
                    if pending is not None:
                        pending.result()  # one save in flight at a time: host memory for one copy
                    pending = dcp.async_save(state, checkpoint_id=target, process_group=group)
                    writes.append(_finish_time(pending))
                returned = time.perf_counter()
                if writes:
                    writes[-1]["returned"] = returned
                per_save.append(returned - began)
                blocked += returned - began
                saves += 1
        sync()
        loop_s = time.perf_counter() - started
        if pending is not None:
            began = time.perf_counter()
            pending.result()
            tail_s = time.perf_counter() - began  # the last write, finishing after training
        else:
            tail_s = 0.0
        for write in writes:
            write["finished"].wait(timeout=60)
        # each background write's time after its call returned
        written = [max(0.0, write["done"] - write["returned"]) for write in writes if write["done"] is not None]
        timing = torch.tensor([loop_s, blocked, tail_s, *per_save, *written], dtype=torch.float64, device=device)
        dist.all_reduce(timing, op=dist.ReduceOp.MAX)  # the job goes at the pace of its slowest rank
        per_save_ms = [1e3 * t for t in timing[3:3 + len(per_save)].tolist()]
        written_ms = [1e3 * t for t in timing[3 + len(per_save):].tolist()]
        rows.append({"mode": mode, "saves": saves, "loop_s": timing[0].item(), "blocked_s": timing[1].item(),
                     "blocked_ms_per_save": 1e3 * timing[1].item() / saves if saves else 0.0,
                     "first_save_blocked_ms": per_save_ms[0] if per_save_ms else None,
                     "later_saves_blocked_ms": (sum(per_save_ms[1:]) / len(per_save_ms[1:])
                                                if len(per_save_ms) > 1 else None),
                     "background_write_ms": sum(written_ms) / len(written_ms) if written_ms else None,
                     "write_after_loop_s": timing[2].item()})
    baseline = rows[0]["loop_s"]
    for row in rows:
        row["slowdown_s"] = row["loop_s"] - baseline
    return {"kind": "checkpoint_stall", "model": model_name, "world_size": dist.get_world_size(), "steps": steps,
            "every": every, "state_mib_per_rank": state_mib, "rows": rows}


def _local_mib(state) -> float:
    """The bytes of this rank's tensors in a (possibly sharded) state dict, in MiB: what one save copies or writes."""
    total = 0
    stack = [state]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            stack.extend(item.values())
        elif isinstance(item, (list, tuple)):
            stack.extend(item)
        elif isinstance(item, torch.Tensor):
            local = item.to_local() if hasattr(item, "to_local") else item
            total += local.numel() * local.element_size()
    return total / 2**20


def _finish_time(future) -> dict:
    """A dict that gets ``done``, the time ``future`` finished, set by the thread that finishes it; ``finished`` is
    set then (a future's waiters can wake before its callbacks have run)."""
    stamp = {"done": None, "finished": threading.Event()}

    def finished(_):
        stamp["done"] = time.perf_counter()
        stamp["finished"].set()

    future.add_done_callback(finished)
    return stamp


def stall_summary(record: dict) -> str:
    """What a ``checkpoint_stall`` measurement shows, in two or three sentences, from its numbers alone."""
    rows = {row["mode"]: row for row in record.get("rows", [])}
    sync, async_ = rows.get("sync"), rows.get("async")
    if not sync or not async_ or not sync.get("saves") or not async_.get("saves"):
        return "No save was timed in both modes: nothing to compare."

    def later(row):  # a save after the first: both modes' first calls pay one-off set-up
        value = row.get("later_saves_blocked_ms")
        return value if value is not None else row["blocked_ms_per_save"]

    copy, write = later(async_), later(sync)
    split = async_.get("later_saves_blocked_ms") is not None
    when = "After the first save, " if split else "Per save, "
    size = record.get("state_mib_per_rank")
    state = f"this state ({size:,.1f} MiB per rank)" if size else "this state"
    blocked_for = "" if split else " (its copy of the state, and on its first call the set-up of its writer)"
    written = async_.get("background_write_ms")
    behind = (f" Its write then ran {written:,.0f} ms a save in a background thread while training went on."
              if written else "")
    if copy < write:
        said = (f"{when}dcp.async_save blocked training {copy:,.0f} ms a save, the copy of {state} into host "
                f"memory, where dcp.save blocked {write:,.0f} ms for the whole write.")
    else:
        said = (f"{when}dcp.async_save blocked training {copy:,.0f} ms a save{blocked_for}, no less than "
                f"dcp.save's {write:,.0f} ms: writing {state} here cost no more than copying it into host memory, "
                "so there was no write to hide. Asynchronous saving gains where the write takes longer than the "
                "copy: large states, shared file systems.")
    first = async_.get("first_save_blocked_ms")
    setup = (f" Its first call blocked {first:,.0f} ms: it also starts the writer, once per process."
             if first is not None and async_.get("later_saves_blocked_ms") is not None else "")
    return said + behind + setup


def load_into_one_process(folder, model) -> torch.nn.Module:
    """Load the model part of a DCP checkpoint, saved by any number of ranks, into a plain model here.

    Without a process group DCP reads every shard itself: this is resharding from p ranks to one.
    """
    folder = Path(folder)
    read_dcp_metadata(folder)  # not a checkpoint, or one that would run code: one line, before DCP starts
    state = {"model": model.state_dict()}
    with warnings.catch_warnings():  # DCP warns that it loads in one process: here that is the point
        warnings.filterwarnings("ignore", message=".*single process")
        _dcp_load(state, folder)
    model.load_state_dict(state["model"])
    return model


# ---------------------------------------------------------------- reading without running code

_METADATA_CLASSES = {  # what torch.distributed.checkpoint.save writes into .metadata (torch 2.3 to 2.14)
    "torch.distributed.checkpoint.metadata": {
        "Metadata", "MetadataIndex", "ChunkStorageMetadata", "TensorStorageMetadata", "BytesStorageMetadata",
        "TensorProperties", "StorageMeta", "_MEM_FORMAT_ENCODING"},
    "torch.distributed.checkpoint.filesystem": {"_StorageInfo"},
}
_PATHS = {"Path", "PosixPath", "WindowsPath", "PurePath", "PurePosixPath", "PureWindowsPath"}


def _metadata_globals(module: str, name: str):
    """The names a DCP ``.metadata`` may hold: DCP's dataclasses, torch's dtypes and sizes, paths; None: refused."""
    if name in _METADATA_CLASSES.get(module, ()):
        import importlib

        return getattr(importlib.import_module(module), name, None)
    if module == "torch":
        found = getattr(torch, name, None)
        kinds = (torch.dtype, torch.layout, torch.memory_format)
        return found if found is torch.Size or isinstance(found, kinds) else None
    if (module, name) == ("torch.serialization", "_get_layout"):  # "torch.strided" -> torch.strided
        return getattr(torch.serialization, "_get_layout", None)
    if module in ("pathlib", "pathlib._local") and name in _PATHS:  # the checkpoint id, as a path
        return getattr(pathlib, name)
    if (module, name) == ("collections", "OrderedDict"):
        return collections.OrderedDict
    if module == "builtins" and name in ("set", "frozenset", "slice", "complex"):
        return getattr(builtins, name)
    return None


def _parse_metadata(data: bytes, path: Path):
    from torch.distributed.checkpoint.metadata import Metadata

    again = "write the checkpoint again with dcp.save (only load distributed checkpoints you wrote)."
    if not data:
        raise WorkshopError(f"{path} is empty: the save that wrote this distributed checkpoint was cut short.",
                            again)
    try:
        metadata = restricted_loads(data, _metadata_globals)
    except RefusedPickle as err:
        raise WorkshopError(f"{path} is not a distributed checkpoint's metadata: {describe_pickle_failure(err)}.",
                            again) from None
    except Exception as err:  # truncated or foreign bytes fail in many ways inside pickle
        raise WorkshopError(f"{path} cannot be read as a distributed checkpoint's metadata: "
                            f"{describe_pickle_failure(err)}.", again) from None
    if not isinstance(metadata, Metadata):
        raise WorkshopError(f"{path} holds a {type(metadata).__name__}, not a distributed checkpoint's metadata.",
                            again)
    storage = getattr(metadata, "storage_data", None)
    if not isinstance(storage, dict) or not isinstance(getattr(metadata, "state_dict_metadata", None), dict):
        raise WorkshopError(f"{path} is damaged: it does not say where the tensors are.", again)
    for info in storage.values():
        name = getattr(info, "relative_path", None)
        if not isinstance(name, str) or name in ("", ".", "..") or "/" in name or "\\" in name:
            raise WorkshopError(f"{path} names the data file {name!r}, outside its own folder: refused.", again)
    return metadata


def read_dcp_metadata(folder):
    """The ``.metadata`` of a distributed checkpoint, unpickled with only DCP's own classes allowed.

    A missing, empty, truncated or foreign file, or one that names anything else (code that
    would run while unpickling), is one WorkshopError; nothing it names is called.
    """
    folder = Path(folder)
    path = folder / ".metadata"
    if not path.is_file():
        raise WorkshopError(f"{folder} is not a distributed checkpoint (no .metadata file).",
                            "pass the folder that dcp.save wrote.")
    return _parse_metadata(path.read_bytes(), path)


@functools.lru_cache(maxsize=1)
def _safe_reading_classes():
    """DCP's file reader and load planner, with their two unpickling steps made safe (built on first use)."""
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner

    class SafeReader(FileSystemReader):
        def read_metadata(self, *args, **kwargs):
            rank = kwargs.get("rank")
            path = Path(str(self.path)) / (".metadata" if rank is None else f"__{rank}.metadata")
            if not path.is_file():
                raise WorkshopError(f"{path.parent} is not a distributed checkpoint (no {path.name} file).",
                                    "pass the folder that dcp.save wrote.")
            metadata = _parse_metadata(path.read_bytes(), path)
            try:
                from torch.distributed.checkpoint.metadata import StorageMeta
            except ImportError:  # torch before 2.4 keeps no storage_meta
                return metadata
            if getattr(metadata, "storage_meta", None) is None:
                metadata.storage_meta = StorageMeta()
            if hasattr(self, "load_id"):
                metadata.storage_meta.load_id = self.load_id
            return metadata

    class SafePlanner(DefaultLoadPlanner):
        def __init__(self, folder, **options):
            super().__init__(**options)
            self.folder = folder

        def load_bytes(self, read_item, value):
            # DefaultLoadPlanner unpickles these with weights_only=False. Read them with weights_only=True,
            # and hand DCP a fresh pickle of what came out: it never unpickles a byte of the file itself.
            name = getattr(getattr(read_item, "dest_index", None), "fqn", "?")
            try:
                loaded = torch.load(value, weights_only=True)
            except Exception as err:
                first = (str(err).strip().splitlines() or [type(err).__name__])[0][:120]
                refused = WorkshopError(f"The value {name!r} in distributed checkpoint {self.folder} is not plain "
                                        f"data (refused by weights_only loading, nothing was run: {first}).",
                                        "only load distributed checkpoints you wrote; write it again with dcp.save.")
                raise refused from None
            clean = io.BytesIO()
            torch.save(loaded, clean)
            clean.seek(0)
            super().load_bytes(read_item, clean)

    return SafeReader, SafePlanner


def _dcp_load(state: dict, folder) -> None:
    """``dcp.load(state, checkpoint_id=folder)`` that runs no code from the files; their problems are one line."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.api import CheckpointException

    reader, planner = _safe_reading_classes()
    try:
        dcp.load(state, checkpoint_id=str(folder), storage_reader=reader(str(folder)),
                 planner=planner(folder))
    except CheckpointException as err:  # DCP wraps each rank's exception: ours come back out, others as one line
        causes = [(rank, failure[0] if isinstance(failure, tuple) else failure)
                  for rank, failure in sorted(err.failures.items())]
        for _, cause in causes:
            if isinstance(cause, WorkshopError):
                raise cause from None
        rank, cause = causes[0] if causes else ("?", err)
        first = (str(cause).strip().splitlines() or [""])[0][:200]
        raise WorkshopError(f"Distributed checkpoint {folder} cannot be loaded into this model (rank {rank}: "
                            f"{type(cause).__name__}: {first}).",
                            "load it into the model (and optimizer) that saved it; if a file in it is damaged, "
                            "write the checkpoint again.") from None
