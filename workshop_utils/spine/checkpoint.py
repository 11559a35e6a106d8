"""Checkpoints that survive a killed job and resume exactly.

A checkpoint holds the whole training state: model, optimizer, loss scaler, LR
scheduler, step and epoch, and every random-number generator, so a resumed run
continues as if never stopped. It is written to a temporary file and renamed into
place: a job killed mid-write leaves the previous checkpoint intact, never a
half-written one. The temporary file's name carries the writer's process id and
machine, so the next save (or resume, or prune) deletes those of dead writers and
never a live writer's. A full disk or quota is one line that names the folder.
It is loaded with ``weights_only=True``, which refuses pickled code; a file that is
not a checkpoint (a bare ``state_dict``, JSON, a truncated copy) is one line that
says what it is. The model's state is saved without DDP's ``module.`` prefix, so
single-GPU and multi-GPU checkpoints are interchangeable.
"""

from __future__ import annotations

import errno
import json
import os
import random
import re
import shutil
import socket
import time
import warnings
import zipfile
from pathlib import Path

import numpy as np
import torch

from ..system.errors import WorkshopError
from ..system.results import os_error_under
from .models import unwrap

_NAME = re.compile(r"^step_(\d+)\.pt$")
# ".step_00000040.pt.tmp-<pid>-<machine>": a write in progress, or the debris of a killed one
# (without "-<machine>" from before machines were named: judged by age alone).
_TEMPORARY = re.compile(r"^\.(?P<target>.+\.pth?)\.tmp-(?P<pid>\d+)(?:-(?P<machine>[A-Za-z0-9._-]+))?$")
STALE_AFTER_S = 15 * 60  # a temporary file from another machine, untouched this long: its writer is gone
PID_REUSED_AFTER_S = 24 * 3600  # ours, its pid alive but the file a day old: the pid belongs to someone else now
EXPECTED = "a checkpoint written by train() or save_checkpoint (a dict with 'model', 'step' and 'rng')"


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


def this_machine() -> str:
    """Host name and process-id namespace: where a process id in a temporary file's name means something."""
    host = re.sub(r"[^A-Za-z0-9._-]", "_", socket.gethostname()) or "host"
    try:  # "pid:[4026531836]": a container has its own, and its pids say nothing about ours
        namespace = re.sub(r"\D", "", os.readlink("/proc/self/ns/pid"))
    except OSError:
        namespace = ""
    return f"{host}.{namespace}" if namespace else host


def _temporary_path(path: Path) -> Path:
    return path.with_name(f".{path.name}.tmp-{os.getpid()}-{this_machine()}")


def _process_alive(pid: int) -> bool:
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # PermissionError: alive, someone else's
        return True
    try:  # a killed process not yet reaped by its parent is a zombie: it writes nothing any more
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return True


def stale_temporaries(directory: str | os.PathLike, now: float | None = None) -> list[Path]:
    """The temporary files in ``directory`` left by checkpoint writes whose process is gone.

    On this machine a writer is gone when its process id is dead (or a zombie); a file written
    on another machine (a shared file system) is stale when nobody has written to it for
    ``STALE_AFTER_S``. A live writer's file is never among them.
    """
    directory = Path(directory)
    if not directory.is_dir():
        return []
    now = time.time() if now is None else now
    here, found = this_machine(), []
    for entry in directory.iterdir():
        match = _TEMPORARY.match(entry.name)
        if not match:
            continue
        try:
            age = now - entry.stat().st_mtime
        except OSError:  # finished (renamed) or removed meanwhile
            continue
        if match["machine"] == here:
            stale = not _process_alive(int(match["pid"])) or age > PID_REUSED_AFTER_S
        else:
            stale = age > STALE_AFTER_S
        if stale:
            found.append(entry)
    return sorted(found)


def remove_stale_temporaries(directory: str | os.PathLike) -> list[Path]:
    """Delete the debris of killed checkpoint writes (``stale_temporaries``); returns what was deleted."""
    removed = []
    for entry in stale_temporaries(directory):
        try:
            entry.unlink()
            removed.append(entry)
        except OSError:  # gone already, or a read-only folder: nothing to clean here
            pass
    return removed


def _tensor_bytes(obj) -> int:
    if isinstance(obj, torch.Tensor):
        return obj.numel() * obj.element_size()
    if isinstance(obj, dict):
        return sum(_tensor_bytes(v) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return sum(_tensor_bytes(v) for v in obj)
    return 0


def _size(n: float) -> str:
    return f"{n / 2**20:,.1f} MiB" if n >= 2**20 else f"{max(n, 1) / 2**10:,.0f} KiB"


def _write_failure(err: OSError, path: Path, need: int) -> WorkshopError | None:
    """A checkpoint write that failed for a reason the user can fix, as one line; None for others."""
    folder = path.parent
    previous = [path] if path.is_file() else list_checkpoints(folder)
    kept = (f"the previous checkpoint {previous[-1].name} is intact" if previous
            else "no earlier checkpoint exists there")
    if err.errno in (errno.ENOSPC, errno.EDQUOT):
        if err.errno == errno.ENOSPC:
            what = "the disk is full"
            try:
                free = f"{_size(shutil.disk_usage(folder).free)} free, "
            except OSError:
                free = ""
        else:  # the file system may have room; the user's share of it does not
            what, free = "your disk quota is used up", ""
        return WorkshopError(
            f"Checkpoint {path.name} not written: {what} where {folder} lives ({err.strerror}; {free}the checkpoint "
            f"needs about {_size(need)}); {kept}.",
            "free space there (delete old runs, or keep fewer checkpoints with keep_checkpoints) or point "
            "checkpoint_dir elsewhere (e.g. a scratch file system).")
    if err.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
        return WorkshopError(f"Checkpoint {path.name} not written: {folder} is not writable ({err.strerror}); {kept}.",
                             "point checkpoint_dir at a folder you can write to.")
    return None


def save_checkpoint(path: str | os.PathLike, *, model, optimizer=None, scaler=None, scheduler=None,
                    step: int = 0, epoch: int = 0, model_name: str = "", extra: dict | None = None) -> Path:
    """Atomically write the training state to ``path``.

    The bytes go to a temporary file (named after this process and machine), are flushed to
    the disk, and only then renamed to ``path``: readers see the old file or the new one. A
    failed write removes its temporary file; one killed mid-write is removed by the next save.
    """
    path = Path(path)
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
    tmp = _temporary_path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        remove_stale_temporaries(path.parent)
        with open(tmp, "wb") as f:  # a Python file: a full disk is OSError(ENOSPC), not only a riddle from C++
            torch.save(state, f)
            f.flush()
            os.fsync(f.fileno())  # on the disk before the rename, so a crashed node cannot keep an empty file
        os.replace(tmp, path)  # atomic on POSIX: readers see the old file or the new one
        _sync_folder(path.parent)
    except (OSError, RuntimeError) as err:
        tmp.unlink(missing_ok=True)  # first, so that the free space reported counts its bytes as free
        cause = os_error_under(err)  # torch's zip writer raises a RuntimeError over it
        failure = None if cause is None else _write_failure(cause, path, _tensor_bytes(state))
        if failure is None:
            raise
        raise failure from None
    finally:
        tmp.unlink(missing_ok=True)  # a failed write leaves no debris; the previous checkpoint is untouched
    return path


def _sync_folder(folder: Path) -> None:
    """Make the rename itself durable (best effort: not every file system lets a folder be opened)."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


# ---------------------------------------------------------------- loading, and saying what a file is

_LEGACY_MAGIC = b"\x80\x02\x8a\nl\xfc\x9cF\xf9 j\xa8P\x19"  # torch.save's pre-1.6 format starts so
_MAGIC = (
    (b"\x1f\x8b", "a gzip-compressed file"),
    (b"\x93NUMPY", "a NumPy .npy file"),
    (b"\x89HDF\r\n\x1a\n", "an HDF5 file (Keras/h5py?)"),
    (b"\x7fELF", "a program (ELF binary)"),
)


def _describe_bytes(path: Path, size: int) -> tuple[str, bool]:
    """What a file that ``torch.load`` cannot read looks like: (description, whether it looks cut short)."""
    if size == 0:
        return "an empty file (0 bytes)", True
    with open(path, "rb") as f:
        head = f.read(4096)
    if head.startswith(b"PK"):
        if not _is_zip(path):
            return f"a truncated or damaged PyTorch file ({size:,} bytes, its end is missing)", True
        names = _zip_names(path)
        if names is None or any(name.endswith("data.pkl") for name in names):
            return f"a damaged PyTorch file ({size:,} bytes)", True
        return f"a zip archive of {len(names)} file(s), not a PyTorch file", False
    if head.startswith(_LEGACY_MAGIC):
        return f"a truncated or damaged PyTorch file in the old format ({size:,} bytes)", True
    for magic, what in _MAGIC:
        if head.startswith(magic):
            return f"{what}, not a PyTorch file", False
    if len(head) >= 10 and head[8:9] == b"{" and int.from_bytes(head[:8], "little") < size:
        return "a safetensors file, not a PyTorch checkpoint", False
    if head[:1] == b"\x80" and head[1:2] in (b"\x02", b"\x03", b"\x04", b"\x05"):
        return "a plain Python pickle, not a PyTorch file (it was not unpickled)", False
    try:
        text = head.decode("utf-8")
    except UnicodeDecodeError:
        text = None
        if len(head) == 4096:  # a multi-byte character cut by the 4 KiB window
            try:
                text = head[:-4].decode("utf-8")
            except UnicodeDecodeError:
                pass
    if text is not None and all(c.isprintable() or c in "\t\r\n" for c in text):
        stripped = text.lstrip()
        if stripped[:1] in ("{", "[") and size <= 16 * 2**20:
            try:
                json.loads(path.read_text(encoding="utf-8"))
                return f"a JSON file ({size:,} bytes), not a PyTorch file", False
            except (ValueError, UnicodeDecodeError):
                pass
        first = stripped.splitlines()[0][:40] if stripped else ""
        return f"a text file starting with {first!r}, not a PyTorch file", False
    return f"not a PyTorch file ({size:,} bytes of unrecognised binary data, starting {head[:8].hex(' ')})", False


def _is_zip(path: Path) -> bool:
    try:
        return zipfile.is_zipfile(path)
    except Exception:  # a damaged end record can trip zipfile in many ways: it is not a readable zip
        return False


def _zip_names(path: Path) -> list[str] | None:
    """The file names inside a zip archive; None when its directory is damaged."""
    try:
        with zipfile.ZipFile(path) as archive:
            return archive.namelist()
    except Exception:  # BadZipFile, NotImplementedError (odd versions), UnicodeDecodeError in names...
        return None


def _is_pytorch_file(path: Path) -> bool:
    with open(path, "rb") as f:
        head = f.read(len(_LEGACY_MAGIC))
    if head.startswith(_LEGACY_MAGIC):
        return True
    names = _zip_names(path) if _is_zip(path) else None
    return names is not None and any(name.endswith("data.pkl") for name in names)


def _unreadable(path: Path, err: Exception) -> WorkshopError:
    refused = "weights only load failed" in str(err).lower()
    if refused and _is_pytorch_file(path):
        return WorkshopError(
            f"Checkpoint {path} cannot be read: it is a PyTorch file holding pickled code or other objects a "
            "checkpoint never holds, or a damaged one (weights_only loading refused it; nothing was run).",
            "only resume from checkpoints this kit wrote; if you trust the file, load it yourself and re-save "
            "its tensors.")
    what, cut_short = _describe_bytes(path, path.stat().st_size)
    fix = ("a copy or a write was cut short: delete it and resume from an earlier checkpoint."
           if cut_short else "pass a step_*.pt file from a checkpoint_dir that train() wrote.")
    return WorkshopError(f"Checkpoint {path} cannot be read: it is {what}; expected {EXPECTED}.", fix)


def _keys(state: dict) -> str:
    keys = [repr(k) for k in list(state)[:5]]
    more = f" and {len(state) - 5} more" if len(state) > 5 else ""
    return ", ".join(keys) + more


def _what_instead(state, restore_rng: bool) -> tuple[str, str] | None:
    """(what the loaded object is, the fix) when it is not a workshop checkpoint; None when it is one."""
    other = "pass a step_*.pt file from a checkpoint_dir that train() wrote."
    if not isinstance(state, dict):
        if isinstance(state, torch.Tensor):
            return f"a single tensor of shape {list(state.shape)}", other
        size = f" of {len(state)} items" if isinstance(state, (list, tuple)) else ""
        return f"a pickled {type(state).__name__}{size}", other
    if not state:
        return "an empty dict", other
    if all(isinstance(v, torch.Tensor) for v in state.values()):
        return (f"a bare state_dict with {len(state)} tensors (weights only, as torch.save(model.state_dict()) "
                "writes it: no optimizer, step or random state to resume from)",
                "to start from these weights, load them into the model yourself "
                "(model.load_state_dict(torch.load(path, weights_only=True))) and train without resume.")
    needed = ["model", "step"] + (["rng"] if restore_rng else [])
    missing = [k for k in needed if k not in state]
    if missing:
        return (f"a dict with keys {_keys(state)} (no {', '.join(repr(k) for k in missing)}), from other code",
                other)
    model = state["model"]
    if not isinstance(model, dict) or not all(isinstance(v, torch.Tensor) for v in model.values()):
        return f"a dict whose 'model' is a {type(model).__name__}, not a state_dict of tensors", other
    if not isinstance(state["step"], int) or isinstance(state["step"], bool) or state["step"] < 0:
        return f"a dict whose 'step' is {state['step']!r}, not a step number", other
    rng = state.get("rng")
    if restore_rng and not (isinstance(rng, dict) and {"torch", "numpy", "python"} <= rng.keys()):
        return "a checkpoint with a damaged random-number state", "resume from an earlier checkpoint."
    for key in ("optimizer", "scaler", "scheduler"):
        if state.get(key) is not None and not isinstance(state[key], dict):
            return f"a checkpoint whose {key!r} is a {type(state[key]).__name__}, not a state_dict", other
    return None


def _first_line(err: BaseException) -> str:
    """The first line of an error's message, ending in a full stop."""
    first = (str(err).strip().splitlines() or [type(err).__name__])[0][:200].rstrip()
    return first if first.endswith((".", "!", "?")) else first + "."


def load_checkpoint(path: str | os.PathLike, *, model, optimizer=None, scaler=None, scheduler=None,
                    model_name: str | None = None, restore_rng: bool = True, map_location="cpu") -> dict:
    """Restore the training state saved by ``save_checkpoint``; returns the raw state (step, epoch, extra).

    Anything else (a bare state_dict, JSON, a truncated copy, pickled code) is one WorkshopError
    that says what the file is; pickled code is refused without running it.
    """
    path = Path(path)
    if path.is_dir():
        raise WorkshopError(f"{path} is a folder, not a checkpoint file.",
                            "pass a step_*.pt file inside it, or resume=True with checkpoint_dir set to it.")
    if not path.is_file():
        raise WorkshopError(f"No checkpoint at {path}.", "check the path, or start without resuming.")
    if _TEMPORARY.match(path.name):
        raise WorkshopError(f"{path} is the unfinished temporary file of a checkpoint write, not a checkpoint.",
                            "resume from a step_*.pt file next to it; the next save deletes the temporary file.")
    try:
        with warnings.catch_warnings():  # odd files make torch.load warn about pickle protocols: the error says it
            warnings.simplefilter("ignore")
            state = torch.load(path, map_location=map_location, weights_only=True)
    except Exception as err:
        raise _unreadable(path, err) from None
    instead = _what_instead(state, restore_rng)
    if instead is not None:
        raise WorkshopError(f"Checkpoint {path} cannot be used: it is {instead[0]}; expected {EXPECTED}.",
                            instead[1])
    saved = state.get("model_name", "")
    if model_name and saved and saved != model_name:
        raise WorkshopError(
            f"Checkpoint {path} is from model {saved!r}, not {model_name!r}.",
            f"resume with model={saved!r}, or use another checkpoint directory.",
        )
    try:
        unwrap(model).load_state_dict(state["model"])
    except RuntimeError as err:
        raise WorkshopError(f"Checkpoint {path} does not fit this model: {_first_line(err)}",
                            "resume with the model that wrote it, or use another checkpoint directory.") from None
    for obj, key in ((optimizer, "optimizer"), (scaler, "scaler"), (scheduler, "scheduler")):
        if obj is not None and state.get(key) is not None:
            try:
                obj.load_state_dict(state[key])
            except Exception as err:
                raise WorkshopError(f"Checkpoint {path} does not fit this {key}: {_first_line(err)}",
                                    f"resume with the {key} settings that wrote it, or use another checkpoint "
                                    "directory.") from None
    if restore_rng:
        try:
            rng = dict(state["rng"])
            rng["numpy"] = _plain_to_numpy_state(rng["numpy"])
            rng["python"] = (rng["python"][0], tuple(rng["python"][1]), rng["python"][2])
            set_rng_state(rng)
        except Exception as err:
            raise WorkshopError(f"Checkpoint {path} holds a damaged random-number state: {_first_line(err)}",
                                "resume from an earlier checkpoint.") from None
    return state


def checkpoint_path(directory: str | os.PathLike, step: int) -> Path:
    return Path(directory) / f"step_{step:08d}.pt"


def list_checkpoints(directory: str | os.PathLike) -> list[Path]:
    """Checkpoints in ``directory``, oldest first (never a write's temporary file)."""
    directory = Path(directory)
    if not directory.is_dir():
        return []
    return sorted(p for p in directory.iterdir() if _NAME.match(p.name))


def latest_checkpoint(directory: str | os.PathLike) -> Path | None:
    """The newest checkpoint in ``directory`` (None: none yet); clears the debris of killed writes first."""
    remove_stale_temporaries(directory)
    found = list_checkpoints(directory)
    return found[-1] if found else None


def prune_checkpoints(directory: str | os.PathLike, keep: int | None) -> None:
    """Delete all but the newest ``keep`` checkpoints (None keeps everything), and killed writes' debris."""
    remove_stale_temporaries(directory)
    if keep is None:
        return
    for old in list_checkpoints(directory)[:-keep] if keep > 0 else []:
        old.unlink(missing_ok=True)
