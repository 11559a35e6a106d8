"""CIFAR-10 (or a synthetic stand-in) and the two ways of feeding it to a GPU.

Where the data come from, in order: the ``root`` argument, the ``WORKSHOP_DATA``
variable, ``<repo>/data``, ``./data``. Each may hold torchvision's on-disk format
(``cifar-10-batches-py/``), whose files are checked against torchvision's MD5s
before they are unpickled. Compute nodes often have no internet, so nothing is
downloaded unless asked, on a login node::

    python -m workshop_utils.data download --root /path/to/data

With no data anywhere, a deterministic, learnable synthetic set of the same shape
is generated, and a banner says so: its numbers are not CIFAR-10 numbers.

The two loader paths share one interface, ``loader.epoch(epoch, start_batch)``
yielding ``(images, labels)`` on the device:

* ``TorchLoader``: the textbook path, a torchvision/PIL pipeline in a DataLoader
  (workers, pinned memory, prefetching). Flexible, and CPU-bound on fast GPUs.
* ``DeviceLoader``: the whole uint8 data set lives on the device; crop and flip
  happen there, a batch at a time. No workers, no host-to-device copies.

Both shuffle from ``(seed, epoch)`` and augment from ``(seed, epoch, sample)``,
so a run resumed mid-epoch sees exactly the batches it would have seen.
"""

from __future__ import annotations

import hashlib
import itertools
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset
from torch.utils.data.distributed import DistributedSampler

from ..system.errors import WorkshopError, choose
from ..system.results import repo_root
from ..system.safe_pickle import RefusedPickle, describe_pickle_failure, latin1_encode, restricted_load

CLASSES = ("airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck")
MEAN = (0.4914, 0.4822, 0.4465)  # per-channel statistics of the CIFAR-10 training set
STD = (0.2470, 0.2435, 0.2616)
# The data set's own layout (its authors' "python version"), as torchvision unpacks it. Written out rather than read
# from torchvision's CIFAR10 class: importing torchvision takes about 2 s, paid by every process that merely looks
# for data (each rank of every launch); tests/test_data.py holds these names to torchvision's.
FOLDER = "cifar-10-batches-py"
TRAIN_FILES = tuple(f"data_batch_{i}" for i in range(1, 6))
TEST_FILES = ("test_batch",)
META_FILE = "batches.meta"
LOADERS = ("torch", "device")


def cifar10_md5() -> dict[str, str]:
    """File name -> MD5, straight from torchvision so there is one source of truth (imported when a file is checked)."""
    from torchvision.datasets import CIFAR10

    return dict(CIFAR10.train_list + CIFAR10.test_list + [[CIFAR10.meta["filename"], CIFAR10.meta["md5"]]])


@dataclass
class CifarData:
    """Images as uint8 NHWC arrays, labels as int64 arrays, and where they came from."""

    train_images: np.ndarray
    train_labels: np.ndarray
    test_images: np.ndarray
    test_labels: np.ndarray
    source: str  # "cifar10" or "synthetic"
    location: str

    @property
    def is_synthetic(self) -> bool:
        return self.source == "synthetic"

    def fingerprint(self) -> str:
        """A short digest of what the data are: equal on every rank that reads the same data set."""
        import hashlib

        digest = hashlib.sha256(self.source.encode())
        for array in (self.train_images, self.train_labels, self.test_images, self.test_labels):
            # Sizes plus the first and last items: cheap, and enough to tell CIFAR-10 from the stand-in or a subset.
            digest.update(str(array.shape).encode())
            digest.update(np.ascontiguousarray(array[:8]).tobytes())
            digest.update(np.ascontiguousarray(array[-8:]).tobytes())
        return digest.hexdigest()[:16]

    def first(self, train_size: int | None, test_size: int | None) -> "CifarData":
        """The first ``train_size`` training and ``test_size`` test images (None: all), as views, not copies."""
        return CifarData(self.train_images[:train_size], self.train_labels[:train_size],
                         self.test_images[:test_size], self.test_labels[:test_size], self.source, self.location)

    def describe(self) -> str:
        return (
            f"{self.source} from {self.location}: {len(self.train_labels):,} training and "
            f"{len(self.test_labels):,} test images of shape {tuple(self.train_images.shape[1:])}"
        )


# ---------------------------------------------------------------- finding and reading


def candidate_roots(root: str | os.PathLike | None = None) -> list[Path]:
    if root is not None:
        return [Path(root)]
    found = []
    if os.environ.get("WORKSHOP_DATA"):
        found.append(Path(os.environ["WORKSHOP_DATA"]))
    if repo_root() is not None:
        found.append(repo_root() / "data")
    found.append(Path("data"))
    return found


def cifar_folder(root: Path) -> Path | None:
    """``root`` itself or ``root/cifar-10-batches-py``, whichever holds CIFAR files."""
    for folder in (root / FOLDER, root):
        if folder.is_dir() and any((folder / name).exists() for name in TRAIN_FILES + TEST_FILES + (META_FILE,)):
            return folder
    return None


def md5sum(path: Path) -> str:
    digest = hashlib.md5()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _fix_for(folder: Path) -> str:
    return (
        f"delete {folder} and fetch the data again on a machine with internet "
        f"(`python -m workshop_utils.data download --root {folder.parent}`), or copy a good copy there."
    )


def verify_cifar10(folder: Path, checksums: dict[str, str] | None = None) -> None:
    """Raise a WorkshopError naming the first missing or corrupt file."""
    checksums = cifar10_md5() if checksums is None else checksums
    for name in TRAIN_FILES + TEST_FILES:
        if not (folder / name).is_file():
            raise WorkshopError(f"CIFAR-10 file {name!r} is missing from {folder}.", _fix_for(folder))
    for name, expected in checksums.items():
        path = folder / name
        if path.is_file() and md5sum(path) != expected:
            raise WorkshopError(
                f"CIFAR-10 file {path} is corrupt or incomplete (its MD5 does not match).", _fix_for(folder)
            )


def _cifar_globals(module: str, name: str):
    """The only names a CIFAR-10 batch file holds: NumPy's array and dtype (and bytes, as Python 3 pickles them)."""
    reconstruct = np.ndarray(0).__reduce__()[0]  # numpy.core.multiarray._reconstruct, numpy._core's in NumPy 2
    allowed = {
        ("numpy.core.multiarray", "_reconstruct"): reconstruct,  # the original files (Python 2, NumPy 1)
        ("numpy._core.multiarray", "_reconstruct"): reconstruct,  # the same files written by NumPy 2
        ("numpy", "ndarray"): np.ndarray,
        ("numpy", "dtype"): np.dtype,
        ("_codecs", "encode"): latin1_encode,  # bytes in a protocol-2 pickle written by Python 3
    }
    return allowed.get((module, name))


def _read_batch(path: Path) -> tuple[np.ndarray, np.ndarray]:
    """One batch file, unpickled without running code: a file naming anything but arrays is refused."""
    try:
        with open(path, "rb") as f:
            entry = restricted_load(f, _cifar_globals, encoding="latin1")
    except RefusedPickle as err:
        raise WorkshopError(f"CIFAR-10 file {path} is not a CIFAR-10 batch: {describe_pickle_failure(err)}.",
                            _fix_for(path.parent)) from None
    except Exception as err:  # a truncated or foreign file can fail in many ways inside pickle
        raise WorkshopError(f"Cannot read CIFAR-10 file {path}: {describe_pickle_failure(err)}.",
                            _fix_for(path.parent)) from None
    try:
        data = entry.get("data") if isinstance(entry, dict) else None
        if not isinstance(data, np.ndarray) or data.dtype == object:
            what = "a dict" if isinstance(entry, dict) else f"a {type(entry).__name__}"
            raise TypeError(f"it holds {what} without the 'data' array of pixels a batch has")
        images = np.asarray(entry["data"], dtype=np.uint8).reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1)
        labels = np.asarray(entry.get("labels", entry.get("fine_labels")), dtype=np.int64).reshape(-1)
    except Exception as err:
        first = (str(err).strip().splitlines() or [type(err).__name__])[0][:160]
        raise WorkshopError(f"Cannot read CIFAR-10 file {path}: {first}.", _fix_for(path.parent)) from None
    if len(images) != len(labels):
        raise WorkshopError(f"CIFAR-10 file {path} has {len(images)} images but {len(labels)} labels.",
                            _fix_for(path.parent))
    return np.ascontiguousarray(images), labels


def read_cifar10(folder: Path, checksums: dict[str, str] | None = None) -> CifarData:
    """Read torchvision's on-disk CIFAR-10 after verifying it."""
    verify_cifar10(folder, checksums)
    train = [_read_batch(folder / name) for name in TRAIN_FILES]
    test_images, test_labels = _read_batch(folder / TEST_FILES[0])
    return CifarData(
        np.concatenate([im for im, _ in train]),
        np.concatenate([lb for _, lb in train]),
        test_images,
        test_labels,
        "cifar10",
        str(folder),
    )


# ---------------------------------------------------------------- synthetic stand-in

_CHUNK = 1000  # samples are generated in fixed chunks so a smaller set is a prefix of a larger one


_SYNTHETIC_VERSION = 2  # bump when the generator below changes: cached copies of the old one are then ignored
_CACHE_FROM_IMAGES = 20_000  # smaller sets take a second or two to generate: not worth a file


def _synthetic_cache_path(n_train: int, n_test: int, seed: int) -> Path:
    root = Path(os.environ.get("WORKSHOP_CACHE") or Path.home() / ".cache" / "workshop-utils")
    return root / f"synthetic-v{_SYNTHETIC_VERSION}-{n_train}-{n_test}-{seed}.npz"


def make_synthetic_cifar(n_train: int = 50_000, n_test: int = 10_000, seed: int = 0) -> CifarData:
    """The synthetic set of ``_generate_synthetic``, cached on disk when it is large.

    Generating the full-size set takes 10-20 s of one core, and every rank of every torchrun
    launch needs it: the first process writes it (atomically), later ones read it in a second.
    The cache is only a copy; it is never required (a read-only home just regenerates).
    """
    if n_train + n_test < _CACHE_FROM_IMAGES:
        return _generate_synthetic(n_train, n_test, seed)
    path = _synthetic_cache_path(n_train, n_test, seed)
    try:
        with np.load(path, allow_pickle=False) as saved:
            arrays = [saved[key] for key in ("train_images", "train_labels", "test_images", "test_labels")]
        return CifarData(*arrays, "synthetic", f"generator (seed {seed}), cached in {path}")
    except (OSError, KeyError, ValueError):  # not cached yet, or a damaged copy: generate afresh
        pass
    data = _generate_synthetic(n_train, n_test, seed)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}.npz")
        np.savez(tmp, train_images=data.train_images, train_labels=data.train_labels,
                 test_images=data.test_images, test_labels=data.test_labels)
        os.replace(tmp, path)  # concurrent ranks each write their own file; the last rename wins, all equal
    except OSError:
        pass
    return data


LABEL_NOISE = 0.2  # the share of synthetic labels drawn at random: the accuracy ceiling is 82%


def _generate_synthetic(n_train: int, n_test: int, seed: int) -> CifarData:
    """A deterministic, learnable CIFAR-shaped data set.

    Each class is a smooth random colour pattern. An image is 60% its class's
    pattern and 40% another class's, shifted by up to 4 pixels, with strong pixel
    noise, so curves show learning rather than an instant 100%. And it can never be
    solved: ``LABEL_NOISE`` of the labels (train and test alike) name a random class
    instead of the image's, so no model can pass 0.8 + 0.2 / 10 = 82% test accuracy
    however long it trains, and comparisons (precisions, batch sizes, learning rates)
    never all tie at 100%.
    """
    coarse = torch.from_numpy(np.random.default_rng([seed, 0]).uniform(0, 255, (10, 3, 4, 4)).astype(np.float32))
    templates = F.interpolate(coarse, size=(32, 32), mode="bicubic", align_corners=False).numpy()

    def split(n: int, split_id: int) -> tuple[np.ndarray, np.ndarray]:
        images, labels = [], []
        for chunk in range(-(-n // _CHUNK)):
            rng = np.random.default_rng([seed, split_id, chunk])
            size = _CHUNK  # always a whole chunk, cut below, so the draws never depend on n
            label = rng.integers(0, 10, size)
            other = (label + rng.integers(1, 10, size)) % 10
            shift = rng.integers(-4, 5, (size, 2))
            rows = (np.arange(32)[None, :] - shift[:, :1]) % 32
            cols = (np.arange(32)[None, :] - shift[:, 1:]) % 32
            mixed = 0.6 * templates[label] + 0.4 * templates[other]
            picked = mixed[np.arange(size)[:, None, None, None], np.arange(3)[None, :, None, None],
                           rows[:, None, :, None], cols[:, None, None, :]]
            noisy = picked + rng.normal(0, 56, picked.shape)
            images.append(np.clip(noisy, 0, 255).astype(np.uint8).transpose(0, 2, 3, 1))
            # Drawn after everything above, so the images are the same as without label noise.
            relabel = rng.random(size) < LABEL_NOISE
            labels.append(np.where(relabel, rng.integers(0, 10, size), label))
        return np.ascontiguousarray(np.concatenate(images)[:n]), np.concatenate(labels)[:n].astype(np.int64)

    train_images, train_labels = split(n_train, 1)
    test_images, test_labels = split(n_test, 2)
    return CifarData(train_images, train_labels, test_images, test_labels, "synthetic", f"generator (seed {seed})")


SYNTHETIC_BANNER = """
################################################################################
#  NO CIFAR-10 FOUND: using a SYNTHETIC CIFAR-shaped data set instead.          #
#  Speed figures are still real; accuracy figures are NOT CIFAR-10 accuracies.  #
#  Looked in: {where:<66}#
#  To use the real data: set WORKSHOP_DATA=/path, or on a login node run        #
#    python -m workshop_utils.data download --root /path                        #
################################################################################
"""


# In the environment of processes the kit launches (torchrun ranks) once their launcher has shown the banner.
SYNTHETIC_SHOWN = "WORKSHOP_SYNTHETIC_SHOWN"
_banner_shown = False


SYNTHETIC_HEADLINE = "NO CIFAR-10 FOUND"  # the banner's first words, and the one-line form's


def note_synthetic_banner_shown() -> None:
    """The banner reached this process's output (a launched rank printed it, the launcher relayed it)."""
    global _banner_shown
    _banner_shown = True


def synthetic_banner_shown() -> bool:
    """Whether this process, or the one that launched it, has shown the synthetic-data banner."""
    return _banner_shown or bool(os.environ.get(SYNTHETIC_SHOWN))


def announce_synthetic(roots) -> None:
    """The banner on stderr, once: again in the same process, or in a process the kit launched from one that showed
    it (a notebook's torchrun ranks), it is one line, so that a launch's output does not repeat nine lines a run."""
    global _banner_shown
    if synthetic_banner_shown():
        print("NO CIFAR-10 FOUND: SYNTHETIC stand-in data, as the banner above says; accuracies are not CIFAR-10's.",
              file=sys.stderr, flush=True)
        return
    print(SYNTHETIC_BANNER.format(where=", ".join(map(str, roots))[:66]), file=sys.stderr, flush=True)
    _banner_shown = True


def load_data(
    root: str | os.PathLike | None = None,
    train_size: int | None = None,
    test_size: int | None = None,
    synthetic: bool | str = "auto",
    seed: int = 0,
    checksums: dict[str, str] | None = None,
    quiet: bool = False,
) -> CifarData:
    """Load CIFAR-10, or the synthetic stand-in when none is found (``synthetic="auto"``).

    ``synthetic=True`` forces the stand-in; ``False`` makes missing data an error.
    A ``root`` given explicitly must hold the data: it never falls back silently.
    ``train_size``/``test_size`` keep the first N images (small CPU profiles).
    """
    for size, what in ((train_size, "train_size"), (test_size, "test_size")):
        if size is not None and size <= 0:
            raise WorkshopError(f"{what} must be positive, got {size}.", f"pass {what}=None for all images.")
    data = None
    roots = candidate_roots(root)
    if synthetic is not True:
        for candidate in roots:
            folder = cifar_folder(candidate)
            if folder is not None:
                data = read_cifar10(folder, checksums)
                break
        else:
            if root is not None or synthetic is False:
                raise WorkshopError(
                    f"No CIFAR-10 found in {', '.join(map(str, roots))}.",
                    "point root/WORKSHOP_DATA at the folder holding cifar-10-batches-py, "
                    "or download it on a login node with `python -m workshop_utils.data download --root DIR`.",
                )
    if data is None:
        data = make_synthetic_cifar(train_size or 50_000, test_size or 10_000, seed)
        if not quiet:
            announce_synthetic(roots)
    data = data.first(train_size, test_size)
    if not quiet:
        print(f"Data: {data.describe()}")
    return data


# ---------------------------------------------------------------- sampling and augmentation


class ResumableSampler(DistributedSampler):
    """DistributedSampler that can start mid-epoch and tells the data set which epoch it is.

    It yields ``(epoch, index)`` pairs so augmentation can be a pure function of
    (seed, epoch, index): the same in any worker, after any restart.
    """

    def __init__(self, length: int, rank: int = 0, world_size: int = 1, shuffle: bool = True,
                 seed: int = 0, drop_last: bool = True):
        super().__init__(range(length), num_replicas=world_size, rank=rank, shuffle=shuffle,
                         seed=seed, drop_last=drop_last)
        self.start = 0

    def set_epoch(self, epoch: int, start: int = 0) -> None:
        super().set_epoch(epoch)
        self.start = start

    def __iter__(self):
        return ((self.epoch, i) for i in itertools.islice(super().__iter__(), self.start, None))

    def __len__(self) -> int:
        return super().__len__() - self.start


def mix_seeds(*values: int) -> int:
    """A cheap 64-bit integer hash (splitmix64 finaliser) for per-sample augmentation draws."""
    h = 0
    for v in values:
        h = (h ^ (v & 0xFFFFFFFFFFFFFFFF)) * 0x9E3779B97F4A7C15 & 0xFFFFFFFFFFFFFFFF
        h ^= h >> 31
        h = h * 0xBF58476D1CE4E5B9 & 0xFFFFFFFFFFFFFFFF
        h ^= h >> 29
    return h


class CifarDataset(Dataset):
    """torchvision/PIL pipeline: pad 4, random 32x32 crop, random horizontal flip, to tensor, normalise."""

    def __init__(self, images: np.ndarray, labels: np.ndarray, augment: bool, seed: int = 0):
        # Loaded here, in the process that builds the loader: DataLoader workers forked from it start with torchvision
        # in memory instead of each importing it (about 2 s) at the start of every epoch.
        import torchvision.transforms.functional  # noqa: F401

        self.images, self.labels, self.augment, self.seed = images, labels, augment, seed

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, key):
        import torchvision.transforms.functional as TF
        from PIL import Image

        epoch, index = key if isinstance(key, tuple) else (0, key)
        image = Image.fromarray(self.images[index])
        if self.augment:
            h = mix_seeds(self.seed, epoch, index)
            image = TF.crop(TF.pad(image, 4), h % 9, (h >> 8) % 9, 32, 32)
            if (h >> 16) & 1:
                image = TF.hflip(image)
        tensor = TF.normalize(TF.to_tensor(image), MEAN, STD)
        return tensor, int(self.labels[index])


def build_dataloader(dataset: Dataset, sampler: ResumableSampler, batch_size: int, device: torch.device,
                     train: bool, seed: int = 0, num_workers: int = 0, pin_memory: bool = False,
                     persistent_workers: bool = False, prefetch_factor: int | None = None) -> DataLoader:
    """The DataLoader of the torch loader path, for images and tokens alike."""
    workers = num_workers > 0
    return DataLoader(
        dataset,
        batch_size=batch_size,
        sampler=sampler,
        num_workers=num_workers,
        pin_memory=pin_memory and device.type == "cuda",
        persistent_workers=persistent_workers and workers,
        prefetch_factor=prefetch_factor if workers else None,
        drop_last=train,
        # Forked workers share the data set's memory. Python 3.14 starts them from a fork server on Linux,
        # which would pickle the whole set (150 MB) to every worker at every epoch's start.
        multiprocessing_context="fork" if workers and sys.platform.startswith("linux") else None,
        # An explicit generator keeps DataLoader from drawing from the global RNG (exact resume).
        generator=torch.Generator().manual_seed(seed),
    )


class TorchLoader:
    """The standard DataLoader path, wrapped to the shared ``epoch()`` interface."""

    def __init__(self, images, labels, batch_size: int, device: torch.device, train: bool, seed: int = 0,
                 rank: int = 0, world_size: int = 1, num_workers: int = 0, pin_memory: bool = False,
                 persistent_workers: bool = False, prefetch_factor: int | None = None, channels_last: bool = False):
        self.batch_size, self.device, self.channels_last = batch_size, device, channels_last
        self.sampler = ResumableSampler(len(labels), rank, world_size, shuffle=train, seed=seed, drop_last=train)
        self.loader = build_dataloader(CifarDataset(images, labels, augment=train, seed=seed), self.sampler,
                                       batch_size, device, train, seed, num_workers=num_workers,
                                       pin_memory=pin_memory, persistent_workers=persistent_workers,
                                       prefetch_factor=prefetch_factor)

    def __len__(self) -> int:
        self.sampler.start = 0
        return len(self.loader)

    def epoch(self, epoch: int, start_batch: int = 0):
        self.sampler.set_epoch(epoch, start_batch * self.batch_size)
        memory_format = torch.channels_last if self.channels_last else torch.contiguous_format
        for images, labels in host_batches(self, self.loader):
            yield (images.to(self.device, non_blocking=True, memory_format=memory_format),
                   labels.to(self.device, non_blocking=True))


def host_batches(owner, loader):
    """``loader``'s batches, with the host time spent waiting for each in ``owner.last_wait_s``.

    Only the wait for the batch in host memory is the loader's: the copy to the GPU that follows waits,
    from unpinned memory, for the GPU work queued before it, and that is the model's time, not the data's.
    Starting the epoch's worker processes is the loader's too (every epoch, unless they are persistent):
    the first batch's wait includes it.
    """
    began = time.perf_counter()
    batches = iter(loader)  # non-persistent workers start here, a fork and an import or two each
    while True:
        batch = next(batches, None)
        owner.last_wait_s = time.perf_counter() - began
        if batch is None:
            return
        yield batch
        began = time.perf_counter()


class DeviceLoader:
    """The whole data set as one uint8 tensor on the device; augmentation runs there too."""

    def __init__(self, images, labels, batch_size: int, device: torch.device, train: bool, seed: int = 0,
                 rank: int = 0, world_size: int = 1, channels_last: bool = False):
        self.batch_size, self.device, self.train, self.seed = batch_size, device, train, seed
        self.channels_last = channels_last
        self.images = torch.from_numpy(images).to(device).permute(0, 3, 1, 2).contiguous()  # N,3,32,32 uint8
        self.labels = torch.from_numpy(labels).to(device)
        self.sampler = ResumableSampler(len(labels), rank, world_size, shuffle=train, seed=seed, drop_last=train)
        self.mean = torch.tensor(MEAN, device=device).view(1, 3, 1, 1) * 255
        self.std = torch.tensor(STD, device=device).view(1, 3, 1, 1) * 255
        self.generator = torch.Generator(device=device)
        self._indices: dict[int, tuple] = {}

    def __len__(self) -> int:
        self.sampler.start = 0
        n = len(self.sampler)
        return n // self.batch_size if self.train else -(-n // self.batch_size)

    def _crop_indices(self, n: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The index tensors of a batch of ``n`` crops, built once per batch size, not once per step."""
        if n not in self._indices:
            self._indices[n] = (torch.arange(32, device=self.device),
                                torch.arange(n, device=self.device)[:, None, None, None],
                                torch.arange(3, device=self.device)[None, :, None, None])
        return self._indices[n]

    def _augment(self, x: torch.Tensor, epoch: int, batch: int) -> torch.Tensor:
        self.generator.manual_seed(mix_seeds(self.seed, epoch, batch) >> 1)
        n = x.shape[0]
        padded = F.pad(x, (4, 4, 4, 4))
        offsets = torch.randint(0, 9, (2, n), device=x.device, generator=self.generator)
        grid, images, channels = self._crop_indices(n)
        rows = (offsets[0, :, None] + grid)[:, None, :, None]
        cols = (offsets[1, :, None] + grid)[:, None, None, :]
        x = padded[images, channels, rows, cols]
        flip = torch.rand(n, device=x.device, generator=self.generator) < 0.5
        return torch.where(flip[:, None, None, None], x.flip(3), x)

    def epoch(self, epoch: int, start_batch: int = 0):
        self.sampler.set_epoch(epoch)
        order = torch.tensor([i for _, i in self.sampler], device=self.device)
        for batch in range(start_batch, len(self)):
            picked = order[batch * self.batch_size:(batch + 1) * self.batch_size]
            x = self.images[picked]
            if self.train:
                x = self._augment(x, epoch, batch)
            x = (x.float() - self.mean) / self.std
            if self.channels_last:
                x = x.contiguous(memory_format=torch.channels_last)
            yield x, self.labels[picked]


def make_loader(kind: str, images, labels, batch_size: int, device: torch.device, train: bool, **options):
    """A TorchLoader or DeviceLoader; DataLoader-only options are ignored by the device path."""
    choose(kind, LOADERS, "loader")
    if batch_size <= 0:
        raise WorkshopError(f"Batch size must be positive, got {batch_size}.", "pass a batch size of 1 or more.")
    if kind == "device":
        for key in ("num_workers", "pin_memory", "persistent_workers", "prefetch_factor"):
            options.pop(key, None)
        return DeviceLoader(images, labels, batch_size, device, train, **options)
    return TorchLoader(images, labels, batch_size, device, train, **options)
