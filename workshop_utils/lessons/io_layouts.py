"""How data are stored decides how fast they can be read: four layouts of the same images.

* ``small files``: one file per image in one folder per class (ImageFolder style).
  Every image costs an open, a read and a close; on a parallel file system such as
  Lustre or GPFS each open is a request to a shared metadata server.
* ``shards``: the same bytes packed into a few large tar files in the WebDataset
  convention (``<key>.rgb`` + ``<key>.cls``), read front to back: few metadata
  requests, long sequential reads, the pattern parallel file systems are built for.
* ``memory``: one array in host RAM (what staging to node-local disk or RAM buys).
* ``device``: one tensor already on the GPU (the device-resident loader).

Every path hands the same thing to the model: a shuffled-or-streamed batch of
normalised float images on the training device. Files are raw bytes, not PNG or
JPEG, so decoding cost does not hide the layout cost; ``loader_throughput`` times
the real loaders (PIL pipeline versus device-resident) including augmentation.
"""

from __future__ import annotations

import io
import sys
import tarfile
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from ..spine.data import make_loader
from ..spine.timing import RegionTimer
from ..system.errors import WorkshopError, choose
from ..system.hardware import pick_device

LAYOUTS = ("small files", "shards", "memory", "device")
IMAGE_SHAPE = (32, 32, 3)


def write_small_files(images: np.ndarray, labels: np.ndarray, folder) -> Path:
    """One raw ``.rgb`` file per image under ``folder/<label>/``."""
    folder = Path(folder)
    for label in np.unique(labels):
        (folder / str(label)).mkdir(parents=True, exist_ok=True)
    for index, (image, label) in enumerate(zip(images, labels)):
        (folder / str(label) / f"{index:07d}.rgb").write_bytes(image.tobytes())
    return folder


def write_shards(images: np.ndarray, labels: np.ndarray, folder, samples_per_shard: int = 1000) -> list[Path]:
    """Tar shards in the WebDataset convention; returns the shard paths in order."""
    if samples_per_shard <= 0:
        raise WorkshopError(f"samples_per_shard must be positive, got {samples_per_shard}.", "try 1000.")
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for first in range(0, len(labels), samples_per_shard):
        path = folder / f"shard-{first // samples_per_shard:05d}.tar"
        with tarfile.open(path, "w") as tar:
            for index in range(first, min(first + samples_per_shard, len(labels))):
                for ext, payload in (("rgb", images[index].tobytes()), ("cls", str(int(labels[index])).encode())):
                    info = tarfile.TarInfo(f"{index:07d}.{ext}")
                    info.size = len(payload)
                    tar.addfile(info, io.BytesIO(payload))
        paths.append(path)
    return paths


def _batches(pairs, batch_size: int):
    images, labels = [], []
    for image, label in pairs:
        images.append(image)
        labels.append(label)
        if len(labels) == batch_size:
            yield np.stack(images), np.asarray(labels)
            images, labels = [], []
    if labels:
        yield np.stack(images), np.asarray(labels)


def _decode(raw: bytes) -> np.ndarray:
    return np.frombuffer(raw, dtype=np.uint8).reshape(IMAGE_SHAPE)


def read_small_files(folder, batch_size: int, seed: int = 0):
    """Batches from one-file-per-image storage, in a shuffled order as training reads them."""
    files = [(path, int(path.parent.name)) for path in Path(folder).glob("*/*.rgb")]
    if not files:
        raise WorkshopError(f"No .rgb files under {folder}.", "write them with write_small_files first.")
    order = np.random.default_rng(seed).permutation(len(files))
    return _batches(((_decode(files[i][0].read_bytes()), files[i][1]) for i in order), batch_size)


def _tar_samples(paths):
    for path in paths:
        with tarfile.open(path, "r") as tar:
            sample = {}
            for member in tar:
                key, ext = member.name.rsplit(".", 1)
                sample[ext] = tar.extractfile(member).read()
                if len(sample) == 2:
                    yield {"__key__": key, **sample}
                    sample = {}


def read_shards(folder, batch_size: int):
    """Batches streamed front to back through the shards (with webdataset when it is installed)."""
    paths = sorted(Path(folder).glob("shard-*.tar"))
    if not paths:
        raise WorkshopError(f"No shard-*.tar files in {folder}.", "write them with write_shards first.")
    try:
        import webdataset

        samples = webdataset.WebDataset([str(p) for p in paths], shardshuffle=False, empty_check=False)
    except ImportError:
        print("note: webdataset is not installed; reading the shards with tarfile (pip install webdataset).",
              file=sys.stderr)
        samples = _tar_samples(paths)
    return _batches(((_decode(s["rgb"]), int(s["cls"])) for s in samples), batch_size)


def read_memory(images: np.ndarray | torch.Tensor, labels, batch_size: int, seed: int = 0):
    """Shuffled batches gathered from one array (host numpy array or device tensor)."""
    order = np.random.default_rng(seed).permutation(len(labels))
    if isinstance(images, torch.Tensor):
        order = torch.from_numpy(order).to(images.device)
    for first in range(0, len(labels), batch_size):
        picked = order[first:first + batch_size]
        yield images[picked], labels[picked]


def _to_device(images, labels, device: torch.device):
    images = torch.as_tensor(images).to(device, non_blocking=True)
    labels = torch.as_tensor(labels).to(device, non_blocking=True)
    # The same finishing step on every path: NHWC uint8 -> NCHW float in [0, 1]
    return images.permute(0, 3, 1, 2).float().div_(255), labels


def _timed_pass(batches, device: torch.device) -> tuple[int, float]:
    # One region: reading, decoding and the copies to the device. On a GPU its end is a CUDA event
    # read after a synchronize, so the copies and kernels are finished, not just queued.
    timer, count = RegionTimer(device), 0
    with timer:
        for images, labels in batches:
            images, labels = _to_device(images, labels, device)
            count += len(labels)
    return count, timer.times().total


def compare_layouts(images: np.ndarray, labels: np.ndarray, folder, device=None, batch_size: int = 256,
                    samples_per_shard: int = 1000, layouts=LAYOUTS) -> pd.DataFrame:
    """Write the images in each layout under ``folder``, read each once, and tabulate samples/s.

    The files are read right after being written, so they come from the page cache: on a
    parallel file system with a cold cache, small files fall much further behind.
    """
    for layout in layouts:
        choose(layout, LAYOUTS, "layout")
    device = pick_device(device) if not isinstance(device, torch.device) else device
    folder = Path(folder)
    rows = []
    for layout in layouts:
        if layout == "small files":
            where = write_small_files(images, labels, folder / "small_files")
            files = list(where.glob("*/*.rgb"))
            batches = read_small_files(where, batch_size)
        elif layout == "shards":
            files = write_shards(images, labels, folder / "shards", samples_per_shard)
            batches = read_shards(folder / "shards", batch_size)
        elif layout == "memory":
            files, batches = [], read_memory(images, labels, batch_size)
        else:
            resident = torch.from_numpy(images).to(device)
            files, batches = [], read_memory(resident, torch.from_numpy(labels).to(device), batch_size)
        count, seconds = _timed_pass(batches, device)
        rows.append({"layout": layout, "files": len(files),
                     "mib_on_disk": sum(f.stat().st_size for f in files) / 2**20,
                     "samples_per_s": count / seconds})
    table = pd.DataFrame(rows)
    table["vs_small_files"] = table["samples_per_s"] / table["samples_per_s"].iloc[0]
    return table


def loader_throughput(kind: str, images: np.ndarray, labels: np.ndarray, batch_size: int, device=None,
                      max_batches: int | None = None, warmup_batches: int = 2, **options) -> float:
    """Samples/s of a training loader alone (no model): decode, augment, normalise, copy to the device.

    ``kind`` is "torch" (PIL DataLoader; ``options`` such as num_workers go to it) or "device".
    """
    device = pick_device(device) if not isinstance(device, torch.device) else device
    loader = make_loader(kind, images, labels, batch_size, device, train=True, **options)
    batches = loader.epoch(0)
    timer, count = RegionTimer(device), 0
    for index, (x, y) in enumerate(batches):
        if index == warmup_batches:  # worker start-up and first allocations are not throughput
            timer.start()  # on a GPU: after the warm-up's work has finished
        elif index > warmup_batches:
            count += len(y)
        if max_batches is not None and index + 1 >= warmup_batches + 1 + max_batches:
            break
    batches.close()
    if count == 0:
        raise WorkshopError(f"Too few batches to time the {kind!r} loader.",
                            "use more images or a smaller batch size.")
    timer.stop()  # on a GPU a CUDA event: the last batch's copies and kernels are counted until done
    return count / timer.times().total
