"""Text for the GPT, offline on every machine, and its two loaders.

The default corpus is the source of the Python standard library: a fixed, sorted
list of modules under ``sysconfig.get_paths()["stdlib"]``. Every machine that runs
the kit has it, so nothing is downloaded, on a login node or at run time. It is
tokenized as bytes (vocabulary 256): no tokenizer to install or version, the same
ids on every machine, and bits per byte fall straight out of the loss. A run
records what it read (``TokenData.corpus``: sha256 of the bytes, Python version,
files), since another Python version ships other source.

Users with a corpus of their own point ``data_root`` at token shards in nanoGPT's
layout: ``train.bin`` and ``val.bin``, flat uint16 token ids, read with
``numpy.memmap`` so that a file larger than memory is paged in as batches need it.

A sample is a window of ``sequence_length + 1`` tokens: the first ``sequence_length``
are the input, the last ``sequence_length`` the next-token targets. Windows do not
overlap, and the two loaders give the image loaders' interface,
``loader.epoch(epoch, start_batch)`` yielding ``(inputs, targets)`` on the device,
shuffled from ``(seed, epoch)`` by the same ``ResumableSampler``: a resumed run
sees exactly the batches it would have seen.
"""

from __future__ import annotations

import hashlib
import math
import os
import platform
import sys
import sysconfig
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import Dataset

from ..system.errors import WorkshopError, choose
from .data import LOADERS, ResumableSampler, build_dataloader, host_batches

# Modules (a file, or a package's every .py) present from Python 3.9 to 3.14 and in the usual distribution
# packages: several megabytes of varied, real code. Sorted; never edit the list without knowing that every
# recorded corpus fingerprint changes with it.
STDLIB_MODULES = (
    "_pydecimal", "argparse", "ast", "asyncio", "calendar", "collections", "concurrent", "configparser",
    "contextlib", "csv", "dataclasses", "difflib", "email", "enum", "fractions", "functools", "http", "importlib",
    "inspect", "json", "logging", "multiprocessing", "os", "pathlib", "pickle", "random", "re", "shutil", "socket",
    "statistics", "string", "subprocess", "tarfile", "textwrap", "threading", "tokenize", "typing", "unittest",
    "urllib", "uuid", "xml", "zipfile",
)
_TEST_FOLDERS = {"test", "tests", "idle_test"}  # some versions ship a package's tests inside it: not our corpus
VAL_FRACTION = 0.1  # the corpus's last tenth is the validation set
SHARDS = ("train.bin", "val.bin")
_WHOLE_HASH_BYTES = 1 << 30  # shards up to 1 GiB are hashed whole; larger ones by size, head and tail
_EDGE_BYTES = 64 << 20
_VOCAB_CHECK_TOKENS = 64 << 20  # token ids checked against the model's vocabulary: all of val, this much of train


@dataclass
class TokenData:
    """Flat uint16 token ids for training and validation, and where they came from."""

    train_tokens: np.ndarray
    val_tokens: np.ndarray
    source: str  # "python-stdlib" or "token-shards"
    location: str
    corpus: dict = field(default_factory=dict)  # what the run trained on: sha256, sizes, Python version
    bytes_per_token: float | None = None  # 1.0 for byte tokens; None when unknown (BPE shards)

    def fingerprint(self) -> str:
        """A short digest of the corpus: equal on every rank that reads the same text, wherever it is mounted."""
        what = sorted((key, value) for key, value in self.corpus.items() if key != "location")
        return hashlib.sha256(repr(what).encode()).hexdigest()[:16]

    def describe(self) -> str:
        return (f"{self.source} from {self.location}: {len(self.train_tokens):,} training and "
                f"{len(self.val_tokens):,} validation tokens")

    def max_token(self) -> int:
        """The largest token id in the validation set and the start of the training set."""
        return int(max(np.max(self.val_tokens), np.max(self.train_tokens[:_VOCAB_CHECK_TOKENS])))

    def check_vocabulary(self, vocab: int) -> None:
        largest = self.max_token()
        if largest >= vocab:
            raise WorkshopError(f"The data's token ids reach {largest}, but the model's vocabulary has {vocab} "
                                "entries.", "pick a GPT size whose vocabulary covers the tokenizer (gpt2-small: "
                                            "50,304, for GPT-2 BPE), or tokens written with the model's.")


# ---------------------------------------------------------------- the corpora


def stdlib_files(root: str | os.PathLike | None = None) -> list[Path]:
    """The corpus's files, in corpus order: each module of ``STDLIB_MODULES`` found under ``root``."""
    root = Path(root or sysconfig.get_paths()["stdlib"])
    files = []
    for name in STDLIB_MODULES:
        single, package = root / f"{name}.py", root / name
        if single.is_file():
            files.append(single)
        elif package.is_dir():
            inside = [p for p in package.rglob("*.py") if not _TEST_FOLDERS & set(p.relative_to(root).parts[:-1])]
            files += sorted(inside, key=lambda p: p.relative_to(root).as_posix())  # the same on every file system
    return files


def stdlib_corpus(root: str | os.PathLike | None = None) -> TokenData:
    """The standard library's source as byte tokens: the last ``VAL_FRACTION`` of it for validation."""
    where = Path(root or sysconfig.get_paths()["stdlib"])
    files = stdlib_files(where)
    if not files:
        raise WorkshopError(f"No Python source found in {where}: this Python ships its standard library "
                            "compiled only.", "point data_root at a folder of train.bin/val.bin token shards.")
    text = b"".join(p.read_bytes() for p in files)
    tokens = np.frombuffer(text, dtype=np.uint8).astype(np.uint16)
    split = len(tokens) - int(len(tokens) * VAL_FRACTION)
    corpus = {"source": "python-stdlib", "python": platform.python_version(),
              "implementation": sys.implementation.name, "modules": len(STDLIB_MODULES), "files": len(files),
              "bytes": len(text), "sha256": hashlib.sha256(text).hexdigest(), "tokenizer": "bytes (vocabulary 256)"}
    return TokenData(tokens[:split], tokens[split:], "python-stdlib", str(where), corpus, bytes_per_token=1.0)


def _shard_hash(paths: list[Path]) -> tuple[str, str]:
    digest, total = hashlib.sha256(), sum(p.stat().st_size for p in paths)
    whole = total <= _WHOLE_HASH_BYTES
    for path in paths:
        size = path.stat().st_size
        digest.update(f"{path.name}:{size}".encode())
        with open(path, "rb") as f:
            if whole:
                for block in iter(lambda: f.read(1 << 20), b""):
                    digest.update(block)
            else:  # hashing tens of GB would take minutes at every start
                digest.update(f.read(_EDGE_BYTES))
                f.seek(max(0, size - _EDGE_BYTES))
                digest.update(f.read())
    return digest.hexdigest(), "whole files" if whole else f"names, sizes, first and last {_EDGE_BYTES >> 20} MiB"


def read_token_shards(root: str | os.PathLike) -> TokenData:
    """nanoGPT's layout: ``root/train.bin`` and ``root/val.bin``, flat uint16 token ids, memory-mapped."""
    root = Path(root)
    fix = (f"put train.bin and val.bin (flat uint16 token ids, as nanoGPT's prepare.py writes them) in {root}, "
           "or leave data_root unset to train on the Python standard library's source.")
    paths = [root / name for name in SHARDS]
    for path in paths:
        if not path.is_file():
            raise WorkshopError(f"No token shard {path}.", fix)
        size = path.stat().st_size
        if size < 4 or size % 2:
            raise WorkshopError(f"{path} holds {size} bytes: not a run of uint16 token ids.", fix)
    train, val = (np.memmap(path, dtype=np.uint16, mode="r") for path in paths)
    sha, hashed = _shard_hash(paths)
    corpus = {"source": "token-shards", "location": str(root.resolve()), "train_tokens": len(train),
              "val_tokens": len(val), "sha256": sha, "sha256_of": hashed, "tokenizer": "as written (uint16 ids)"}
    return TokenData(train, val, "token-shards", str(root), corpus)


def write_token_shard(path: str | os.PathLike, tokens) -> Path:
    """Token ids as a flat uint16 file, the layout ``read_token_shards`` reads."""
    tokens = np.asarray(tokens)
    if tokens.size and (tokens.min() < 0 or tokens.max() > np.iinfo(np.uint16).max):
        raise WorkshopError("Token ids must lie in 0..65535 to be stored as uint16.",
                            "use a tokenizer with at most 65,536 tokens.")
    path = Path(path)
    tokens.astype(np.uint16).tofile(path)
    return path


def load_text(root: str | os.PathLike | None = None, quiet: bool = False) -> TokenData:
    """Token shards from ``root``, or, with no ``root``, the standard library's source as bytes."""
    data = stdlib_corpus() if root is None else read_token_shards(root)
    if not quiet:
        print(f"Data: {data.describe()}")
    return data


def unigram_entropy(tokens) -> float:
    """Entropy of the token frequencies, in nats: the loss of the best model that ignores context."""
    counts = np.bincount(np.asarray(tokens, dtype=np.int64))
    p = counts[counts > 0] / counts.sum()
    return float(-(p * np.log(p)).sum())


def bits_per_byte(nats_per_token: float, bytes_per_token: float | None) -> float | None:
    """Loss in bits per byte of text: comparable across tokenizers; None when the bytes are unknown."""
    if bytes_per_token is None or nats_per_token is None:
        return None
    return nats_per_token / math.log(2) / bytes_per_token


# ---------------------------------------------------------------- loaders


def window_count(tokens: np.ndarray, sequence_length: int, limit: int | None = None) -> int:
    """Non-overlapping windows of ``sequence_length + 1`` tokens (the last token of one starts the next)."""
    count = max(0, (len(tokens) - 1) // sequence_length)
    return count if limit is None else min(count, limit)


def first_windows(tokens: np.ndarray, sequence_length: int, count: int, device=None) -> tuple[torch.Tensor, torch.Tensor]:
    """The first ``count`` windows as one batch: inputs and targets of shape (count, sequence_length), the
    same on every rank that reads the same tokens (TokenWindows' windows 0 to count-1)."""
    if window_count(tokens, sequence_length, count) < count:
        raise WorkshopError(f"The tokens hold fewer than {count} windows of {sequence_length}.",
                            "use fewer or shorter sequences.")
    window = torch.from_numpy(np.asarray(tokens[:count * sequence_length + 1]).astype(np.int64)).to(device)
    return window[:-1].view(count, sequence_length), window[1:].view(count, sequence_length)


class TokenWindows(Dataset):
    """Window ``i``: inputs ``tokens[i*T : i*T+T]``, targets one token later."""

    def __init__(self, tokens: np.ndarray, sequence_length: int, count: int):
        self.tokens, self.length, self.count = tokens, sequence_length, count

    def __len__(self) -> int:
        return self.count

    def __getitem__(self, key):
        _, index = key if isinstance(key, tuple) else (0, key)
        start = index * self.length
        window = torch.from_numpy(self.tokens[start:start + self.length + 1].astype(np.int64))
        return window[:-1], window[1:]


class TokenTorchLoader:
    """Windows read from the (memory-mapped) array by a DataLoader: workers, pinned memory, prefetching."""

    def __init__(self, tokens, sequence_length: int, batch_size: int, device: torch.device, train: bool,
                 seed: int = 0, rank: int = 0, world_size: int = 1, limit: int | None = None, **dataloader_options):
        self.batch_size, self.device = batch_size, device
        self.windows = window_count(tokens, sequence_length, limit)
        self.sampler = ResumableSampler(self.windows, rank, world_size, shuffle=train, seed=seed, drop_last=train)
        self.loader = build_dataloader(TokenWindows(tokens, sequence_length, self.windows), self.sampler, batch_size,
                                       device, train, seed, **dataloader_options)

    def __len__(self) -> int:
        self.sampler.start = 0
        return len(self.loader)

    def epoch(self, epoch: int, start_batch: int = 0):
        self.sampler.set_epoch(epoch, start_batch * self.batch_size)
        for inputs, targets in host_batches(self, self.loader):
            yield inputs.to(self.device, non_blocking=True), targets.to(self.device, non_blocking=True)


class TokenDeviceLoader:
    """The token array resident on the device, two bytes a token; a batch is one gather there."""

    def __init__(self, tokens, sequence_length: int, batch_size: int, device: torch.device, train: bool,
                 seed: int = 0, rank: int = 0, world_size: int = 1, limit: int | None = None):
        self.batch_size, self.device, self.train, self.length = batch_size, device, train, sequence_length
        self.windows = window_count(tokens, sequence_length, limit)
        used = np.array(tokens[:self.windows * sequence_length + 1])  # a copy: a memory map is read-only
        # Kept as int16 (the same bits as uint16, which few kernels take): half the memory of int32.
        self.tokens = torch.from_numpy(used.view(np.int16)).to(device)
        self.offsets = torch.arange(sequence_length + 1, device=device)
        self.sampler = ResumableSampler(self.windows, rank, world_size, shuffle=train, seed=seed, drop_last=train)

    def __len__(self) -> int:
        self.sampler.start = 0
        n = len(self.sampler)
        return n // self.batch_size if self.train else -(-n // self.batch_size)

    def epoch(self, epoch: int, start_batch: int = 0):
        self.sampler.set_epoch(epoch)
        order = torch.tensor([i for _, i in self.sampler], device=self.device, dtype=torch.long)
        for batch in range(start_batch, len(self)):
            starts = order[batch * self.batch_size:(batch + 1) * self.batch_size] * self.length
            window = (self.tokens[starts[:, None] + self.offsets].int() & 0xFFFF).long()  # back to unsigned ids
            yield window[:, :-1], window[:, 1:]


def make_token_loader(kind: str, tokens, sequence_length: int, batch_size: int, device: torch.device, train: bool,
                      limit: int | None = None, **options):
    """A TokenTorchLoader or TokenDeviceLoader over ``limit`` windows at most; DataLoader options go to the first."""
    choose(kind, LOADERS, "loader")
    if batch_size <= 0:
        raise WorkshopError(f"Batch size must be positive, got {batch_size}.", "pass a batch size of 1 or more.")
    options.pop("channels_last", None)  # an image layout: tokens have none
    if kind == "device":
        for key in ("num_workers", "pin_memory", "persistent_workers", "prefetch_factor"):
            options.pop(key, None)
        return TokenDeviceLoader(tokens, sequence_length, batch_size, device, train, limit=limit, **options)
    return TokenTorchLoader(tokens, sequence_length, batch_size, device, train, limit=limit, **options)
