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
Each file is checked whole before training starts, streaming, a memory-mapped chunk
at a time: readable, a whole number of 2-byte tokens, not another layout (llm.c's
header, a NumPy file, text, wider ids), and its largest id, which ``check_vocabulary``
holds against the model's vocabulary; ``check_windows`` asks for one whole window
in each split. Every problem is one line naming the file.

A sample is a window of ``sequence_length + 1`` tokens: the first ``sequence_length``
are the input, the last ``sequence_length`` the next-token targets. Windows do not
overlap, and the two loaders give the image loaders' interface,
``loader.epoch(epoch, start_batch)`` yielding ``(inputs, targets)`` on the device,
shuffled from ``(seed, epoch)`` by the same ``ResumableSampler``: a resumed run
sees exactly the batches it would have seen.
"""

from __future__ import annotations

import filecmp
import hashlib
import math
import numbers
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
SPLITS = ("train", "val")  # TokenData's two parts, in the order of SHARDS
_SCAN_TOKENS = 32 << 20  # tokens per memory-mapped chunk when a file is checked: 64 MiB, unmapped after use
_HEAD_BYTES = 4096  # what is read of each file to recognize a layout that is not flat uint16 ids
LLMC_MAGIC, LLMC_HEADER_INTS = 20240520, 256  # llm.c's token files: a 256-int32 header, this magic number first


@dataclass(frozen=True)
class TokenScan:
    """What checking one split found: where it is (a file, or None), its tokens, its largest id and where that is."""

    path: str | None
    tokens: int
    max_id: int  # -1: no tokens
    max_at: int  # the index of the first token holding max_id


@dataclass
class TokenData:
    """Flat uint16 token ids for training and validation, and where they came from."""

    train_tokens: np.ndarray
    val_tokens: np.ndarray
    source: str  # "python-stdlib" or "token-shards"
    location: str
    corpus: dict = field(default_factory=dict)  # what the run trained on: sha256, sizes, Python version
    bytes_per_token: float | None = None  # 1.0 for byte tokens; None when unknown (BPE shards)
    scans: dict = field(default_factory=dict, repr=False)  # split -> TokenScan; read_token_shards fills it

    def fingerprint(self) -> str:
        """A short digest of the corpus: equal on every rank that reads the same text, wherever it is mounted."""
        what = sorted((key, value) for key, value in self.corpus.items() if key != "location")
        return hashlib.sha256(repr(what).encode()).hexdigest()[:16]

    def describe(self) -> str:
        return (f"{self.source} from {self.location}: {len(self.train_tokens):,} training and "
                f"{len(self.val_tokens):,} validation tokens")

    def tokens_of(self, split: str) -> np.ndarray:
        return self.train_tokens if choose(split, SPLITS, "split") == "train" else self.val_tokens

    def scan(self, split: str) -> TokenScan:
        """The split's largest id and where it is: from reading its file, else (tokens in memory) counted now."""
        if split not in self.scans:
            tokens = self.tokens_of(split)
            self.scans[split] = TokenScan(None, len(tokens), *_largest_id(tokens))
        return self.scans[split]

    def where(self, split: str) -> str:
        """The split's file, or what the tokens are, for a message."""
        path = self.scan(split).path
        return path if path else f"the {'training' if split == 'train' else 'validation'} tokens of {self.location}"

    def max_token(self) -> int:
        """The largest token id of both splits, every token of each counted."""
        return max(self.scan(split).max_id for split in SPLITS)

    def check_vocabulary(self, vocab: int) -> None:
        """One line naming the file and the id when a token id is not in the model's vocabulary (0 to vocab - 1)."""
        if isinstance(vocab, bool) or not isinstance(vocab, numbers.Integral) or vocab < 1:
            raise WorkshopError(f"vocab={vocab!r} is not a vocabulary size.",
                                "pass the model's, e.g. model.size.vocab.")
        vocab = int(vocab)
        scans = {split: self.scan(split) for split in SPLITS}
        for split, scan in scans.items():
            if scan.max_id < vocab:
                continue
            other = "val" if split == "train" else "train"
            problem = (f"The token ids in {self.where(split)} reach {scan.max_id:,}, but the model's vocabulary has "
                       f"{vocab:,} entries (ids 0 to {vocab - 1:,}); the first {scan.max_id:,} is token "
                       f"{scan.max_at:,} of {scan.tokens:,}.")
            if scans[other].max_id < vocab:
                raise WorkshopError(problem, f"{self.where(other)} fits the vocabulary (its largest id: "
                                             f"{scans[other].max_id:,}), so this file was written with another "
                                             "tokenizer, or is damaged: write it again with the tokenizer of the "
                                             "other.")
            raise WorkshopError(problem, _vocabulary_fix(max(s.max_id for s in scans.values())))

    def check_windows(self, sequence_length: int) -> None:
        """One line naming the file when a split holds less than one window (``sequence_length + 1`` tokens).

        Training and validation both read windows: a validation split without one would record a test
        loss of 0.0 from nothing.
        """
        if isinstance(sequence_length, bool) or not isinstance(sequence_length, numbers.Integral) \
                or sequence_length < 1:
            raise WorkshopError(f"sequence_length={sequence_length!r}: a window needs 1 token or more.",
                                "use e.g. sequence_length=128.")
        need = int(sequence_length) + 1
        for split in SPLITS:
            have = len(self.tokens_of(split))
            if have >= need:
                continue
            shorter = f"a sequence_length of {have - 1} or less, or " if have >= 2 else ""
            more = ("a validation split of at least that many tokens (nanoGPT's prepare.py keeps a tenth of the "
                    "text for val.bin)" if split == "val" else "more training text")
            raise WorkshopError(f"{self.where(split)} holds {have:,} token(s): less than one window of {need:,} "
                                f"(sequence_length {int(sequence_length):,}, plus the last target).",
                                f"use {shorter}{more}.")


def _largest_id(tokens) -> tuple[int, int]:
    """(the largest token id, the index of its first token), a chunk at a time; (-1, 0) for no tokens."""
    best, at = -1, 0
    for start in range(0, len(tokens), _SCAN_TOKENS):
        chunk = np.asarray(tokens[start:start + _SCAN_TOKENS])
        top = int(chunk.max())
        if top > best:
            best, at = top, start + int(np.argmax(chunk))  # argmax: the first index holding the maximum
    return best, at


def _vocabulary_fix(largest: int) -> str:
    from .gpt import GPT_SIZES  # the sizes the kit builds, each with its vocabulary

    fits = [f"gpt_size={name!r} ({size.vocab:,} entries)" for name, size in GPT_SIZES.items() if size.vocab > largest]
    if fits:
        return (f"pick a GPT size whose vocabulary covers the tokenizer: {', or '.join(fits)}; or write the tokens "
                "with the model's tokenizer.")
    return (f"no GPT size here has {largest + 1:,} entries or more: write the tokens with GPT-2's tokenizer "
            "(50,257 ids; gpt_size='gpt2-small'), as nanoGPT's prepare.py does; ids this large may also mean a "
            "damaged file.")


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


SHARDS_FIX = ("put train.bin and val.bin (flat uint16 token ids, as nanoGPT's prepare.py writes them) in {root}, "
              "or leave data_root unset to train on the Python standard library's source.")


def read_token_shards(root: str | os.PathLike) -> TokenData:
    """nanoGPT's layout: ``root/train.bin`` and ``root/val.bin``, flat uint16 token ids, memory-mapped.

    Each file is checked whole first, streaming (``check_token_file``); a problem is one line naming it.
    """
    root = Path(root)
    fix = SHARDS_FIX.format(root=root)
    try:
        is_folder, exists = root.is_dir(), root.exists()
    except OSError as err:
        raise WorkshopError(f"data_root {root} cannot be read ({_os_reason(err)}).", fix) from None
    if exists and not is_folder:
        raise WorkshopError(f"data_root {root} is a file, not a folder of token shards.", fix)
    if not exists:
        raise WorkshopError(f"No token shard {root / SHARDS[0]}: the folder {root} does not exist.", fix)
    paths = [root / name for name in SHARDS]
    scans = {split: check_token_file(path, fix) for split, path in zip(SPLITS, paths)}
    if os.path.samefile(paths[0], paths[1]) or (scans[SPLITS[0]].tokens == scans[SPLITS[1]].tokens
                                                and filecmp.cmp(paths[0], paths[1], shallow=False)):
        raise WorkshopError(f"{paths[1]} holds the same tokens as {paths[0]}: the test loss would be measured on the "
                            "training data.", "write the validation split from text the model does not train on.")
    try:
        train, val = (np.memmap(path, dtype=np.uint16, mode="r", shape=(scans[split].tokens,))
                      for split, path in zip(SPLITS, paths))
        sha, hashed = _shard_hash(paths)
    except (OSError, ValueError) as err:  # changed or removed since it was checked
        raise WorkshopError(f"The token shards in {root} cannot be read ({_os_reason(err)}).",
                            "check that nothing else writes them while training starts, then start again.") from None
    corpus = {"source": "token-shards", "location": str(root.resolve()), "train_tokens": len(train),
              "val_tokens": len(val), "sha256": sha, "sha256_of": hashed, "tokenizer": "as written (uint16 ids)"}
    return TokenData(train, val, "token-shards", str(root), corpus, scans=scans)


def check_token_file(path: str | os.PathLike, fix: str | None = None) -> TokenScan:
    """Check one file of flat uint16 token ids whole, a memory-mapped chunk at a time; what it found.

    One line naming the file when it is missing, unreadable, empty, not a whole number of 2-byte tokens, or
    another layout (llm.c's header, a NumPy file, text, 4- or 8-byte ids). Tens of GiB take seconds (the
    disk's speed): nothing is loaded whole.
    """
    path = Path(path)
    fix = fix or SHARDS_FIX.format(root=path.parent)
    again = "write it again (nanoGPT's prepare.py: numpy.array(ids, dtype=numpy.uint16).tofile(path))."
    try:
        if not path.exists():
            if path.is_symlink():
                raise WorkshopError(f"No token shard {path}: it is a link to {os.readlink(path)}, which does not "
                                    "exist.", fix)
            raise WorkshopError(f"No token shard {path}.", fix)
        if path.is_dir():
            raise WorkshopError(f"Token shard {path} is a folder, not a file of token ids.", fix)
        if not path.is_file():
            raise WorkshopError(f"Token shard {path} is not a regular file (a pipe, socket or device).", fix)
        size = path.stat().st_size
        with open(path, "rb") as f:
            head = f.read(_HEAD_BYTES)
    except OSError as err:
        raise WorkshopError(f"Token shard {path} cannot be read ({_os_reason(err)}).",
                            "check its permissions (ls -l; chmod a+r) and the file system it is on.") from None
    if size == 0:
        raise WorkshopError(f"Token shard {path} is empty (0 bytes).", again)
    _refuse_other_layouts(path, head, size)
    if size % 2:
        raise WorkshopError(f"{path} holds {size:,} bytes: not a run of uint16 token ids (2 bytes each; an odd size "
                            "means a file cut short or another layout).", again)
    if size < 4:
        raise WorkshopError(f"{path} holds {size} bytes: not a run of uint16 token ids long enough for one window "
                            "(2 tokens at least).", again)
    tokens = size // 2
    best, at, lowest = -1, 0, None
    try:
        for start in range(0, tokens, _SCAN_TOKENS):
            count = min(_SCAN_TOKENS, tokens - start)
            chunk = np.memmap(path, dtype=np.uint16, mode="r", offset=2 * start, shape=(count,))
            top, low = int(chunk.max()), int(chunk.min())
            lowest = low if lowest is None else min(lowest, low)
            if top > best:
                best, at = top, start + int(np.argmax(chunk))  # argmax: the first index holding the maximum
            del chunk  # unmapped: the check never holds more than one chunk
    except (OSError, ValueError) as err:  # an I/O error, or a file cut short while it was read
        raise WorkshopError(f"Token shard {path} cannot be read to its end ({_os_reason(err)}).",
                            "check the file system it is on, and that nothing writes the file now; or " + again) \
            from None
    if lowest == best:
        raise WorkshopError(f"{path} holds {tokens:,} tokens, every one the id {best}: no text (a file set aside and "
                            "never written, or filled with one value), and a model trained on it learns nothing.",
                            again)
    return TokenScan(str(path), tokens, best, at)


def _os_reason(err: Exception) -> str:
    return getattr(err, "strerror", None) or str(err) or type(err).__name__


def _refuse_other_layouts(path: Path, head: bytes, size: int) -> None:
    """One line naming the layout when the file's start shows it is not flat uint16 token ids."""
    if size >= 4 * LLMC_HEADER_INTS and len(head) >= 4 * LLMC_HEADER_INTS \
            and int(np.frombuffer(head[:4], "<i4")[0]) == LLMC_MAGIC:
        header = np.frombuffer(head[:4 * LLMC_HEADER_INTS], "<i4")
        version, count = int(header[1]), int(header[2])
        problem = (f"{path} is an llm.c token file (a header of {LLMC_HEADER_INTS} int32 starting with the magic "
                   f"number {LLMC_MAGIC}, version {version}, {count:,} tokens), a layout this reader does not read: "
                   "it reads flat uint16 ids, as nanoGPT writes them.")
        if version == 1:
            raise WorkshopError(problem, f"drop the {4 * LLMC_HEADER_INTS:,}-byte header into a new folder: python -c "
                                         f"\"import numpy; numpy.fromfile('{path}', numpy.uint16, offset="
                                         f"{4 * LLMC_HEADER_INTS}).tofile('<new folder>/{path.name}')\", and point "
                                         "data_root there.")
        raise WorkshopError(problem, "its ids are 4 bytes (llm.c's version 2, Llama 3's tokenizer), more than any GPT "
                                     "size here: tokenize the text with GPT-2's tokenizer (nanoGPT's prepare.py).")
    if head.startswith(b"\x93NUMPY"):
        raise WorkshopError(f"{path} is a NumPy .npy file (a header, then the array), not flat uint16 token ids.",
                            f"write the array alone: numpy.load('{path}').astype(numpy.uint16).tofile(<new path>), "
                            "and point data_root at the folder of the new train.bin and val.bin.")
    if len(head) >= 64 and _looks_like_text(head):
        raise WorkshopError(f"{path} holds text, not token ids.",
                            "tokenize it first (nanoGPT's data/<name>/prepare.py writes train.bin and val.bin), or "
                            "leave data_root unset to train on the Python standard library's source.")
    ids = np.frombuffer(head[:len(head) // 8 * 8], "<u2")
    if len(ids) >= 64 and ids[0::2].any() and not ids[1::2].any():
        width, dtype = (8, "int64") if not ids[2::4].any() else (4, "int32")
        raise WorkshopError(f"{path} looks like {width}-byte token ids (every second 2-byte id of its start is 0), "
                            "not 2-byte ones.",
                            f"write them as uint16: numpy.fromfile('{path}', numpy.{dtype}).astype(numpy.uint16)"
                            ".tofile(<new path>) (ids must be below 65,536).")


def _looks_like_text(head: bytes) -> bool:
    """UTF-8 text of printable characters, lines and tabs: no run of token ids (small ids hold zero bytes)."""
    try:
        text = head.decode("utf-8")
    except UnicodeDecodeError as err:
        if err.start < len(head) - 3:  # not merely a character cut at the end of the read
            return False
        text = head[:err.start].decode("utf-8")
    return all(c.isprintable() or c in "\t\n\r" for c in text)


def write_token_shard(path: str | os.PathLike, tokens) -> Path:
    """Token ids as a flat uint16 file, the layout ``read_token_shards`` reads."""
    fix = "pass whole-number token ids from 0 to 65535 (a tokenizer of at most 65,536 tokens)."
    try:
        tokens = np.asarray(tokens)
    except (TypeError, ValueError) as err:
        raise WorkshopError(f"The token ids are not an array of numbers ({err}).", fix) from None
    numeric = np.issubdtype(tokens.dtype, np.integer) or np.issubdtype(tokens.dtype, np.floating)
    if tokens.dtype == bool or not numeric:
        raise WorkshopError(f"Token ids must be whole numbers, not {tokens.dtype}.", fix)
    tokens = tokens.ravel()
    if tokens.size == 0:
        raise WorkshopError("No token ids to write: an empty shard cannot be read back.", "pass at least two tokens.")
    if np.issubdtype(tokens.dtype, np.floating) and not (np.isfinite(tokens).all()
                                                         and (tokens == np.round(tokens)).all()):
        raise WorkshopError("Token ids must be whole numbers; these hold fractions, NaN or infinity.", fix)
    if tokens.min() < 0 or tokens.max() > np.iinfo(np.uint16).max:
        raise WorkshopError("Token ids must lie in 0..65535 to be stored as uint16.",
                            "use a tokenizer with at most 65,536 tokens.")
    path = Path(path)
    try:
        tokens.astype(np.uint16).tofile(path)
    except OSError as err:
        raise WorkshopError(f"Token shard {path} cannot be written ({_os_reason(err)}).",
                            "give a path in a folder that exists and that you can write to.") from None
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
