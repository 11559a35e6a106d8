"""Checkpoints that survive a killed job and resume exactly.

A checkpoint holds the whole training state: model, optimizer, loss scaler, LR
scheduler, step and epoch, and every random-number generator, so a resumed run
continues as if never stopped. It is written to a temporary file and renamed into
place: a job killed mid-write leaves the previous checkpoint intact, never a
half-written one. It is loaded with ``weights_only=True``, which refuses pickled
code. The model's state is saved without DDP's ``module.`` prefix, so single-GPU
and multi-GPU checkpoints are interchangeable.
"""

from __future__ import annotations

import os
import random
import re
from pathlib import Path

import numpy as np
import torch

from ..system.errors import WorkshopError
from .models import unwrap

_NAME = re.compile(r"^step_(\d+)\.pt$")


def rng_state() -> dict:
    state = {
        "torch": torch.get_rng_state(),
        "numpy": np.random.get_state(legacy=True),
        "python": random.getstate(),
    }
    if torch.cuda.is_available():
        # This rank's own GPU only: a checkpoint written where 8 GPUs are visible must resume where 1 is.
        state["cuda_device"] = torch.cuda.get_rng_state(torch.cuda.current_device())
    return state


def set_rng_state(state: dict) -> None:
    torch.set_rng_state(state["torch"])
    np.random.set_state(state["numpy"])
    random.setstate(state["python"])
    if not torch.cuda.is_available():
        return
    device = torch.cuda.current_device()
    if "cuda_device" in state:
        torch.cuda.set_rng_state(state["cuda_device"], device)
    elif state.get("cuda"):  # older checkpoints kept every visible GPU's state
        torch.cuda.set_rng_state(state["cuda"][min(device, len(state["cuda"]) - 1)], device)


def _numpy_state_to_plain(state: tuple) -> list:
    # weights_only loading accepts tensors and plain containers, not numpy arrays.
    return [state[0], torch.from_numpy(state[1].astype(np.int64)), *state[2:]]


def _plain_to_numpy_state(state: list) -> tuple:
    return (state[0], state[1].numpy().astype(np.uint32), *state[2:])


def _python_state_to_plain(state: tuple) -> list:
    return [state[0], list(state[1]), state[2]]


def save_checkpoint(path: str | os.PathLike, *, model, optimizer=None, scaler=None, scheduler=None,
                    step: int = 0, epoch: int = 0, model_name: str = "", extra: dict | None = None) -> Path:
    """Atomically write the training state to ``path``."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    rng = rng_state()
    rng["numpy"] = _numpy_state_to_plain(rng["numpy"])
    rng["python"] = _python_state_to_plain(rng["python"])
    state = {
        "model_name": model_name,
        "model": unwrap(model).state_dict(),
        "optimizer": optimizer.state_dict() if optimizer is not None else None,
        "scaler": scaler.state_dict() if scaler is not None else None,
        "scheduler": scheduler.state_dict() if scheduler is not None else None,
        "step": step,
        "epoch": epoch,
        "rng": rng,
        "extra": extra or {},
    }
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        torch.save(state, tmp)
        os.replace(tmp, path)  # atomic on POSIX: readers see the old file or the new one
    finally:
        tmp.unlink(missing_ok=True)  # a failed write leaves no debris; the previous checkpoint is untouched
    return path


def load_checkpoint(path: str | os.PathLike, *, model, optimizer=None, scaler=None, scheduler=None,
                    model_name: str | None = None, restore_rng: bool = True, map_location="cpu") -> dict:
    """Restore the training state saved by ``save_checkpoint``; returns the raw state (step, epoch, extra)."""
    path = Path(path)
    if not path.is_file():
        raise WorkshopError(f"No checkpoint at {path}.", "check the path, or start without resuming.")
    try:
        state = torch.load(path, map_location=map_location, weights_only=True)
    except Exception as err:
        raise WorkshopError(f"Checkpoint {path} cannot be read ({type(err).__name__}).",
                            "it may be truncated: delete it and resume from an earlier one.") from None
    saved = state.get("model_name", "")
    if model_name and saved and saved != model_name:
        raise WorkshopError(
            f"Checkpoint {path} is from model {saved!r}, not {model_name!r}.",
            f"resume with model={saved!r}, or use another checkpoint directory.",
        )
    try:
        unwrap(model).load_state_dict(state["model"])
    except RuntimeError as err:
        first = str(err).strip().splitlines()[0]
        raise WorkshopError(f"Checkpoint {path} does not fit this model: {first}",
                            "resume with the model that wrote it, or use another checkpoint directory.") from None
    for obj, key in ((optimizer, "optimizer"), (scaler, "scaler"), (scheduler, "scheduler")):
        if obj is not None and state.get(key) is not None:
            obj.load_state_dict(state[key])
    if restore_rng:
        rng = dict(state["rng"])
        rng["numpy"] = _plain_to_numpy_state(rng["numpy"])
        rng["python"] = (rng["python"][0], tuple(rng["python"][1]), rng["python"][2])
        set_rng_state(rng)
    return state


def checkpoint_path(directory: str | os.PathLike, step: int) -> Path:
    return Path(directory) / f"step_{step:08d}.pt"


def list_checkpoints(directory: str | os.PathLike) -> list[Path]:
    """Checkpoints in ``directory``, oldest first."""
    directory = Path(directory)
    if not directory.is_dir():
        return []
    return sorted(p for p in directory.iterdir() if _NAME.match(p.name))


def latest_checkpoint(directory: str | os.PathLike) -> Path | None:
    found = list_checkpoints(directory)
    return found[-1] if found else None


def prune_checkpoints(directory: str | os.PathLike, keep: int | None) -> None:
    """Delete all but the newest ``keep`` checkpoints (None keeps everything)."""
    if keep is None:
        return
    for old in list_checkpoints(directory)[:-keep] if keep > 0 else []:
        old.unlink(missing_ok=True)
