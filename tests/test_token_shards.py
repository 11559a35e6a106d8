"""The GPT's own corpus: nanoGPT token shards (``data_root`` with ``train.bin`` and ``val.bin``, flat uint16 ids).

Every fault of those files is one line naming the file, the problem and the fix, found before training
starts: a missing, unreadable or empty file, a size that is no whole number of 2-byte tokens, another
layout (llm.c's header, a NumPy file, text, 4- or 8-byte ids), a token id beyond the model's vocabulary
anywhere in a file (each file is checked whole, a memory-mapped chunk at a time), and a split shorter than
one window. A property-based test gives the reader arbitrary bytes.
"""

from __future__ import annotations

import inspect
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import workshop_utils as wu
from workshop_utils.spine import text as text_module
from workshop_utils.spine import trainer

LLMC_HEADER = np.zeros(256, "<i4")
LLMC_HEADER[:3] = (20240520, 1, 500)
TINY_RUN = dict(model="gpt", optimizer="adamw", lr=3e-3, weight_decay=0.0, batch_size=4, sequence_length=32,
                eval_batch_size=16, test_size=16, warmup_steps=1, progress=False)


def one_line(err: pytest.ExceptionInfo, *words) -> str:
    text = str(err.value)
    assert isinstance(err.value, wu.WorkshopError) and "\n" not in text and " Fix: " in text, text
    for word in words:
        assert word in text, (word, text)
    return text


def good_shards(folder: Path, train=None, val=None) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    wu.write_token_shard(folder / "train.bin", np.arange(4000) % 250 if train is None else train)
    wu.write_token_shard(folder / "val.bin", np.arange(400) % 250 if val is None else val)
    return folder


# Each row: what is done to a folder of good shards, and the words the one line must hold ({root}: the folder).
def _unlink(name):
    return lambda root: (root / name).unlink()


def _write(name, data):
    return lambda root: (root / name).write_bytes(data() if callable(data) else data)


def _replace_with(name, make):
    def damage(root):
        (root / name).unlink()
        make(root / name)
    return damage


FILE_ROWS = {
    "no folder": (lambda root: shutil.rmtree(root),
                  ["No token shard {root}/train.bin", "does not exist", "put train.bin and val.bin"]),
    "a file as data_root": (lambda root: None, ["is a file, not a folder"]),  # the test passes train.bin itself
    "no train.bin": (_unlink("train.bin"), ["No token shard {root}/train.bin.", "Fix: put train.bin and val.bin"]),
    "no val.bin": (_unlink("val.bin"), ["No token shard {root}/val.bin."]),
    "a broken link": (_replace_with("val.bin", lambda p: p.symlink_to(p.parent / "gone.bin")),
                      ["{root}/val.bin: it is a link to", "gone.bin, which does not exist"]),
    "a folder in place of a file": (_replace_with("train.bin", lambda p: p.mkdir()),
                                    ["{root}/train.bin is a folder, not a file of token ids"]),
    "a pipe in place of a file": (_replace_with("val.bin", lambda p: os.mkfifo(p)),
                                  ["{root}/val.bin is not a regular file"]),
    "an empty file": (_write("val.bin", b""), ["{root}/val.bin is empty (0 bytes)", "write it again"]),
    "an odd size": (_write("train.bin", np.arange(1000, dtype=np.uint16).tobytes() + b"\x01"),
                    ["{root}/train.bin holds 2,001 bytes: not a run of uint16 token ids", "cut short"]),
    "one token": (_write("val.bin", b"\x01\x00"), ["{root}/val.bin holds 2 bytes", "2 tokens at least"]),
    "llm.c's header": (_write("train.bin", LLMC_HEADER.tobytes() + np.arange(500, dtype=np.uint16).tobytes()),
                       ["{root}/train.bin is an llm.c token file", "magic number 20240520", "version 1, 500 tokens",
                        "offset=1024"]),
    "llm.c's 4-byte ids": (_write("val.bin", np.r_[20240520, 2, 500, np.zeros(253, int), np.arange(500)]
                                  .astype("<i4").tobytes()),
                           ["{root}/val.bin is an llm.c token file", "version 2", "GPT-2's tokenizer"]),
    "a NumPy file": (_replace_with("train.bin", lambda p: np.save(open(p, "wb"), np.arange(1000, dtype=np.uint16))),
                     ["{root}/train.bin is a NumPy .npy file", "numpy.load"]),
    "text": (_write("train.bin", ("def f(x):\n    return x + 1  # é\n" * 100).encode()),
             ["{root}/train.bin holds text, not token ids", "tokenize it first"]),
    "4-byte ids": (_write("val.bin", (np.arange(1000) % 250 + 1).astype("<i4").tobytes()),
                   ["{root}/val.bin looks like 4-byte token ids", "numpy.int32"]),
    "8-byte ids": (_write("train.bin", (np.arange(1000) % 250 + 1).astype("<i8").tobytes()),
                   ["{root}/train.bin looks like 8-byte token ids", "numpy.int64"]),
}


@pytest.mark.parametrize("damage, words", FILE_ROWS.values(), ids=FILE_ROWS.keys())
def test_a_faulty_shard_is_one_line_naming_the_file(damage, words, tmp_path):
    root = good_shards(tmp_path / "shards")
    damage(root)
    where = root / "train.bin" if words[0] == "is a file, not a folder" else root
    with pytest.raises(wu.WorkshopError) as err:
        wu.read_token_shards(where)
    one_line(err, *(word.format(root=root) for word in words))


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads a file without read permission anyway")
def test_an_unreadable_shard_is_one_line(tmp_path):
    root = good_shards(tmp_path)
    (root / "val.bin").chmod(0)
    with pytest.raises(wu.WorkshopError) as err:
        wu.read_token_shards(root)
    one_line(err, f"{root}/val.bin cannot be read", "chmod")


# ---------------------------------------------------------------- the vocabulary, every token of every file


def test_a_bad_id_after_the_first_64_mi_tokens_is_found_before_training(tmp_path):
    """The issue's case: only the first 64 Mi tokens of train.bin used to be checked. A sparse file: no disk used."""
    tokens = (64 << 20) + 1000
    with open(tmp_path / "train.bin", "wb") as f:
        f.truncate(2 * tokens)
        f.seek(2 * (tokens - 10))
        f.write(np.array([300], np.uint16).tobytes())
    wu.write_token_shard(tmp_path / "val.bin", np.arange(400) % 250)
    data = wu.read_token_shards(tmp_path)
    assert data.scan("train") == text_module.TokenScan(str(tmp_path / "train.bin"), tokens, 300, tokens - 10)
    with pytest.raises(wu.WorkshopError) as err:
        data.check_vocabulary(256)
    one_line(err, f"The token ids in {tmp_path}/train.bin reach 300, but the model's vocabulary has 256 entries",
             f"the first 300 is token {tokens - 10:,} of {tokens:,}", "val.bin fits the vocabulary")
    data.check_vocabulary(50304)  # gpt2-small's vocabulary holds them


def test_a_bad_id_only_in_val_bin_names_val_bin_and_points_at_the_file_not_the_model(tmp_path):
    good_shards(tmp_path, val=np.r_[np.arange(399) % 250, 49_000])
    with pytest.raises(wu.WorkshopError) as err:
        wu.read_token_shards(tmp_path).check_vocabulary(256)
    line = one_line(err, f"{tmp_path}/val.bin reach 49,000", "token 399 of 400", f"{tmp_path}/train.bin fits the "
                    "vocabulary (its largest id: 249)", "written with another tokenizer", "write it again")
    assert "GPT size" not in line


def test_ids_beyond_the_vocabulary_in_both_files_point_at_the_model_size(tmp_path):
    good_shards(tmp_path, train=np.arange(4000) * 10, val=np.arange(400) * 10)
    with pytest.raises(wu.WorkshopError) as err:
        wu.read_token_shards(tmp_path).check_vocabulary(256)
    one_line(err, f"{tmp_path}/train.bin reach 39,990", "gpt_size='gpt2-small' (50,304 entries)")
    good_shards(tmp_path, train=np.resize([65535, 1], 100), val=np.resize([60000, 1], 100))
    with pytest.raises(wu.WorkshopError) as err:
        wu.read_token_shards(tmp_path).check_vocabulary(50304)
    one_line(err, "reach 65,535", "no GPT size here has 65,536 entries or more", "damaged")


def test_the_scan_is_chunked_and_finds_the_first_largest_id(tmp_path, monkeypatch):
    monkeypatch.setattr(text_module, "_SCAN_TOKENS", 7)  # many chunks, the largest id straddling them
    rng = np.random.default_rng(0)
    train, val = rng.integers(0, 1000, 1003), rng.integers(0, 500, 99)
    train[[500, 800]] = 4000  # the first of two equal maxima is the one named
    good_shards(tmp_path, train=train, val=val)
    data = wu.read_token_shards(tmp_path)
    assert (data.scan("train").max_id, data.scan("train").max_at) == (4000, 500)
    assert (data.scan("val").max_id, data.scan("val").max_at) == (int(val.max()), int(np.argmax(val)))
    assert data.max_token() == 4000


def test_tokens_in_memory_are_scanned_when_asked(corpus):
    assert corpus.max_token() == int(max(corpus.train_tokens.max(), corpus.val_tokens.max()))
    assert corpus.scan("val").path is None and corpus.where("val").startswith("the validation tokens of ")
    corpus.check_vocabulary(256)
    with pytest.raises(wu.WorkshopError) as err:
        corpus.check_vocabulary(100)
    one_line(err, "The token ids in the training tokens of", "pick a GPT size")


def test_the_fingerprint_is_the_files_as_before(tmp_path):
    good_shards(tmp_path)
    data = wu.read_token_shards(tmp_path)
    assert set(data.corpus) == {"source", "location", "train_tokens", "val_tokens", "sha256", "sha256_of",
                                "tokenizer"}
    assert data.corpus["sha256_of"] == "whole files" and len(data.fingerprint()) == 16
    (tmp_path / "other").mkdir()
    good_shards(tmp_path / "other", val=np.arange(400) % 249)
    assert wu.read_token_shards(tmp_path / "other").fingerprint() != data.fingerprint()


# ---------------------------------------------------------------- one window in every split


@pytest.mark.parametrize("split, tokens", [("val", 32), ("train", 20), ("val", 1)])
def test_a_split_shorter_than_one_window_is_one_line_naming_its_file(tmp_path, split, tokens):
    short = np.arange(max(tokens, 2)) % 250 if tokens > 1 else np.array([1])
    good_shards(tmp_path, **{split: short}) if tokens > 1 else good_shards(tmp_path)
    if tokens == 1:  # a file of one token: the reader refuses it before any window is counted
        (tmp_path / f"{split}.bin").write_bytes(b"\x01\x00")
        with pytest.raises(wu.WorkshopError) as err:
            wu.read_token_shards(tmp_path)
        one_line(err, f"{tmp_path}/{split}.bin holds 2 bytes")
        return
    data = wu.read_token_shards(tmp_path)
    with pytest.raises(wu.WorkshopError) as err:
        data.check_windows(32)
    line = one_line(err, f"{tmp_path}/{split}.bin holds {tokens} token(s): less than one window of 33",
                    f"a sequence_length of {tokens - 1} or less")
    assert ("validation split of at least" in line) == (split == "val")
    data.check_windows(tokens - 1)  # exactly one window: enough


def test_check_windows_refuses_a_sequence_length_that_is_not_one(corpus):
    for bad in (0, -3, 2.5, True, "32", None):
        with pytest.raises(wu.WorkshopError) as err:
            corpus.check_windows(bad)
        one_line(err, "sequence_length=")
    corpus.check_windows(1024)


@pytest.mark.skipif("check_windows" not in inspect.getsource(trainer), reason="the trainer does not yet call "
                    "TokenData.check_windows(config.tokens_per_sequence) before it builds the loaders")
def test_training_on_a_validation_split_without_a_window_stops_before_the_first_step(tmp_path):
    good_shards(tmp_path, val=np.arange(20) % 250)
    with pytest.raises(wu.WorkshopError) as err:
        wu.train(wu.TrainConfig(data_root=str(tmp_path), max_steps=1, **TINY_RUN))
    one_line(err, f"{tmp_path}/val.bin holds 20 token(s): less than one window of 33")


def test_training_on_a_bad_id_in_the_last_token_stops_before_the_first_step(tmp_path):
    good_shards(tmp_path, train=np.r_[np.arange(3999) % 250, 256])
    with pytest.raises(wu.WorkshopError) as err:
        wu.train(wu.TrainConfig(data_root=str(tmp_path), max_steps=1, **TINY_RUN))
    one_line(err, f"{tmp_path}/train.bin reach 256, but the model's vocabulary has 256 entries", "token 3,999")


# ---------------------------------------------------------------- writing shards


@pytest.mark.parametrize("tokens, words", [
    ([-1, 2], ["0..65535"]), ([70000], ["0..65535"]), ([1.5, 2], ["fractions"]), ([float("nan")], ["NaN"]),
    ([], ["No token ids"]), (["a", "b"], ["whole numbers"]), ([True, False], ["whole numbers"]),
    ([[1, 2], [3]], ["not an array"]),
])
def test_writing_ids_no_shard_can_hold_is_one_line(tmp_path, tokens, words):
    with pytest.raises(wu.WorkshopError) as err:
        wu.write_token_shard(tmp_path / "train.bin", tokens)
    one_line(err, *words)
    assert not (tmp_path / "train.bin").exists()


def test_writing_into_a_missing_folder_is_one_line(tmp_path):
    with pytest.raises(wu.WorkshopError) as err:
        wu.write_token_shard(tmp_path / "missing" / "train.bin", [1, 2, 3])
    one_line(err, "missing/train.bin cannot be written")
    assert wu.write_token_shard(tmp_path / "ok.bin", np.array([[1.0, 2.0], [3.0, 65535.0]])).read_bytes() == \
        np.array([1, 2, 3, 65535], np.uint16).tobytes()


# ---------------------------------------------------------------- arbitrary bytes


def _bytes():
    """Any bytes, and bytes that start like a layout the reader recognizes."""
    return st.one_of(st.binary(max_size=600), st.binary(max_size=600).map(lambda b: LLMC_HEADER.tobytes() + b),
                     st.binary(max_size=200).map(lambda b: b"\x93NUMPY" + b),
                     st.lists(st.integers(0, 65535), max_size=300).map(lambda ids: np.array(ids, "<u2").tobytes()),
                     st.lists(st.integers(0, 300), max_size=100).map(lambda ids: np.array(ids, "<i4").tobytes()))


@settings(max_examples=150, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(train=_bytes(), val=st.one_of(_bytes(), st.none()), vocab=st.sampled_from([1, 256, 50304, 0, -1, True]),
       sequence=st.sampled_from([1, 8, 128, 0, 2.5]))
def test_any_bytes_are_read_or_one_line_naming_the_file(tmp_path_factory, train, val, vocab, sequence):
    root = tmp_path_factory.mktemp("fuzz")
    (root / "train.bin").write_bytes(train)
    if val is not None:
        (root / "val.bin").write_bytes(val)
    try:
        data = wu.read_token_shards(root)
    except wu.WorkshopError as err:
        text = str(err)
        assert "\n" not in text and " Fix: " in text, text
        assert str(root / "train.bin") in text or str(root / "val.bin") in text, text
        return
    assert len(data.train_tokens) == len(train) // 2 and np.array_equal(data.val_tokens, np.frombuffer(val, "<u2"))
    for check, argument in ((data.check_vocabulary, vocab), (data.check_windows, sequence)):
        try:
            check(argument)
        except wu.WorkshopError as err:
            text = str(err)
            assert "\n" not in text and " Fix: " in text, text


@settings(max_examples=60, deadline=None, derandomize=True, database=None)
@given(root=st.text(max_size=12))
def test_any_data_root_is_read_or_one_line(root):
    try:
        wu.read_token_shards(root)
    except wu.WorkshopError as err:
        assert "\n" not in str(err).replace(root, "") and " Fix: " in str(err)


# ---------------------------------------------------------------- large files: streamed, never loaded whole


@pytest.mark.slow
def test_a_file_of_gigabytes_is_checked_in_seconds_without_loading_it(tmp_path):
    """A 2 GiB sparse train.bin (1 Gi tokens) in a fresh process: its largest id found, little memory used."""
    script = f"""
import resource, sys, time
import numpy as np
from workshop_utils.spine.text import check_token_file
path = {str(tmp_path / "train.bin")!r}
tokens = 1 << 30
with open(path, "wb") as f:
    f.truncate(2 * tokens)
    f.seek(2 * (tokens - 5))
    f.write(np.array([50000], np.uint16).tobytes())
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
started = time.perf_counter()
scan = check_token_file(path)
seconds = time.perf_counter() - started
grown_mib = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024
print(scan.max_id, scan.max_at, round(seconds, 1), round(grown_mib))
assert (scan.max_id, scan.max_at) == (50000, tokens - 5)
assert grown_mib < 512, grown_mib
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    seconds = float(done.stdout.split()[2])
    assert seconds < 60, done.stdout  # the disk's speed, not Python's: a loaded 2-core runner still takes seconds


# ---------------------------------------------------------------- found by an attempt to break the reader


def test_a_shard_of_one_repeated_id_is_refused(tmp_path):
    import numpy as np

    np.zeros(5000, np.uint16).tofile(tmp_path / "train.bin")
    np.random.RandomState(0).randint(0, 256, 2000).astype(np.uint16).tofile(tmp_path / "val.bin")
    with pytest.raises(wu.WorkshopError, match="every one the id 0"):
        wu.read_token_shards(tmp_path)


@pytest.mark.parametrize("how", ["link", "copy"])
def test_a_validation_split_equal_to_the_training_split_is_refused(tmp_path, how):
    import os
    import shutil

    import numpy as np

    np.random.RandomState(0).randint(0, 256, 5000).astype(np.uint16).tofile(tmp_path / "train.bin")
    if how == "link":
        os.symlink(tmp_path / "train.bin", tmp_path / "val.bin")
    else:
        shutil.copy(tmp_path / "train.bin", tmp_path / "val.bin")
    with pytest.raises(wu.WorkshopError, match="the same tokens as"):
        wu.read_token_shards(tmp_path)
