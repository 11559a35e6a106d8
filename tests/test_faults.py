"""The fault and abuse suite: wrong files, killed writes, full disks, pickles that would run code, SIGKILL.

Every failure a user can meet must end in one ``WorkshopError`` line that says what happened
and how to fix it, never a traceback; nothing already saved may be lost; no file read by the
kit may run code. The torchrun test at the end kills a rank with a real SIGKILL (``kill_worker.py``).
"""

from __future__ import annotations

import errno
import io
import json
import os
import pickle
import re
import shutil
import signal
import subprocess
import sys
import time
import warnings
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers import TWO_RANK_RUN, write_fake_cifar
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import workshop_utils as wu
from workshop_utils.parallel.dist_checkpoint import load_into_one_process, read_dcp_metadata
from workshop_utils.parallel.launch import launch_torchrun, resume_verdict
from workshop_utils.spine import checkpoint as ckpt
from workshop_utils.spine.data import FOLDER

TESTS = Path(__file__).resolve().parent
FUZZ = settings(max_examples=40, deadline=None, derandomize=True, database=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture])


def one_line(err: pytest.ExceptionInfo) -> str:
    text = str(err.value)
    assert isinstance(err.value, wu.WorkshopError) and "\n" not in text and " Fix: " in text, text
    return text


def small_model(seed: int = 0):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))


def small_state(seed: int = 0):
    model = small_model(seed)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model(torch.randn(2, 16)).sum().backward()
    optimizer.step()
    return model, optimizer


@pytest.fixture(scope="module")
def good_checkpoint(tmp_path_factory) -> bytes:
    model, optimizer = small_state()
    path = wu.save_checkpoint(tmp_path_factory.mktemp("good") / "c.pt", model=model, optimizer=optimizer, step=3)
    return path.read_bytes()


class Payload:
    """A pickle that, when unpickled, opens (creates) ``marker``: stands in for any code."""

    def __init__(self, marker: Path, how: str = "open"):
        self.marker, self.how = str(marker), how

    def __reduce__(self):
        if self.how == "system":
            return os.system, (f"touch {self.marker}",)
        return open, (self.marker, "w")


def inst_opcode_pickle(marker: Path) -> bytes:
    """Protocol 0, INST opcode: ``os.system`` named without GLOBAL, a path a restricted loader must cover too."""
    return f"(S'touch {marker}'\nios\nsystem\n.".encode()


# ---------------------------------------------------------------- 1. files that are not checkpoints

def _bare_state_dict(path):
    torch.save(wu.build_model("simplecnn").state_dict(), path)
    return "a bare state_dict with 25 tensors"


def _json(path):
    path.write_text(json.dumps({"model": "simplecnn", "step": 5}))
    return "a JSON file"


def _random_bytes(path):
    path.write_bytes(np.random.default_rng(0).integers(0, 256, 5000, dtype=np.uint8).tobytes())
    return "not a PyTorch file"


def _empty(path):
    path.write_bytes(b"")
    return "an empty file"


def _truncated(path):
    model, optimizer = small_state()
    wu.save_checkpoint(path, model=model, optimizer=optimizer, step=3)
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    return "a truncated or damaged PyTorch file"


def _truncated_old_format(path):
    torch.save({"model": small_model().state_dict()}, path, _use_new_zipfile_serialization=False)
    path.write_bytes(path.read_bytes()[:-40])
    return "truncated or damaged PyTorch file in the old format"


def _text(path):
    path.write_text("step 5 loss 0.31\n")
    return "a text file starting with 'step 5 loss 0.31'"


def _plain_pickle(path):
    path.write_bytes(pickle.dumps({"model": {}, "step": 1}))
    return "a plain Python pickle"


def _zip_archive(path):
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("notes.txt", "hello")
    return "a zip archive of 1 file(s)"


def _npy(path):
    with open(path, "wb") as f:
        np.save(f, np.zeros(3))
    return "a NumPy .npy file"


def _single_tensor(path):
    torch.save(torch.zeros(2, 3), path)
    return "a single tensor of shape [2, 3]"


def _list(path):
    torch.save([torch.zeros(1)] * 3, path)
    return "a pickled list of 3 items"


def _other_trainer(path):
    model, optimizer = small_state()
    torch.save({"epoch": 3, "model_state_dict": model.state_dict(), "optimizer_state_dict": optimizer.state_dict()},
               path)
    return "a dict with keys 'epoch', 'model_state_dict', 'optimizer_state_dict' (no 'model', 'step', 'rng')"


def _step_not_a_number(path):
    model, _ = small_state()
    wu.save_checkpoint(path, model=model, step=3)
    state = torch.load(path, weights_only=True)
    torch.save({**state, "step": "three"}, path)
    return "'step' is 'three'"


def _damaged_rng(path):
    model, _ = small_state()
    wu.save_checkpoint(path, model=model, step=3)
    state = torch.load(path, weights_only=True)
    torch.save({**state, "rng": {**state["rng"], "torch": torch.zeros(3)}}, path)
    return "damaged random-number state"


def _optimizer_of_another_model(path):
    model, _ = small_state()
    other = torch.optim.SGD(torch.nn.Linear(2, 2).parameters(), lr=0.1)
    wu.save_checkpoint(path, model=model, optimizer=other, step=3)
    return "does not fit this optimizer"


NOT_CHECKPOINTS = [_bare_state_dict, _json, _random_bytes, _empty, _truncated, _truncated_old_format, _text,
                   _plain_pickle, _zip_archive, _npy, _single_tensor, _list, _other_trainer, _step_not_a_number,
                   _damaged_rng, _optimizer_of_another_model]


@pytest.mark.parametrize("make", NOT_CHECKPOINTS, ids=lambda f: f.__name__.strip("_"))
def test_a_file_that_is_not_a_checkpoint_says_what_it_is(tmp_path, make):
    path = tmp_path / "step_00000005.pt"
    expected = make(path)
    model, optimizer = small_state(1)
    if make is _bare_state_dict:
        model, optimizer = wu.build_model("simplecnn"), None
    before = wu.parameter_checksum(model)
    with pytest.raises(wu.WorkshopError) as err:
        wu.load_checkpoint(path, model=model, optimizer=optimizer)
    text = one_line(err)
    assert expected in text and str(path) in text
    if make not in (_optimizer_of_another_model, _damaged_rng):  # refused before anything was loaded
        assert wu.parameter_checksum(model) == before


def test_the_message_says_what_was_expected_and_how_to_go_on(tmp_path):
    path = tmp_path / "weights.pt"
    _bare_state_dict(path)
    with pytest.raises(wu.WorkshopError) as err:
        wu.load_checkpoint(path, model=wu.build_model("simplecnn"))
    text = one_line(err)
    assert "expected a checkpoint written by train() or save_checkpoint" in text
    assert "model.load_state_dict(torch.load(path, weights_only=True))" in text


def test_resuming_training_from_a_bare_state_dict_is_one_line(tmp_path, tiny_data):
    path = tmp_path / "weights.pt"
    _bare_state_dict(path)
    config = wu.TrainConfig(max_steps=2, batch_size=32, progress=False, checkpoint_dir=str(tmp_path / "ck"),
                            resume=str(path))
    with pytest.raises(wu.WorkshopError, match="bare state_dict with 25 tensors") as err:
        wu.train(config, tiny_data)
    one_line(err)


@pytest.mark.slow
def test_resume_on_the_command_line_prints_one_line_and_exits_2(tmp_path):
    folder = tmp_path / "ck"
    folder.mkdir()
    (folder / "step_00000005.pt").write_text(json.dumps({"step": 5}))  # the newest "checkpoint" is JSON
    proc = subprocess.run([sys.executable, "-m", "workshop_utils.train", "--steps", "2", "--batch-size", "16",
                           "--train-size", "64", "--test-size", "16", "--device", "cpu", "--no-progress",
                           "--checkpoint-dir", str(folder), "--resume"],
                          capture_output=True, text=True, timeout=300, env={**os.environ, "CUDA_VISIBLE_DEVICES": ""})
    assert proc.returncode == 2, proc.stderr[-2000:]
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "a JSON file" in errors[0] and "Traceback" not in proc.stderr, proc.stderr[-2000:]


def test_a_folder_and_a_temporary_file_are_not_checkpoints(tmp_path):
    with pytest.raises(wu.WorkshopError, match="is a folder, not a checkpoint file") as err:
        wu.load_checkpoint(tmp_path, model=small_model())
    one_line(err)
    tmp = tmp_path / ".step_00000003.pt.tmp-123-elsewhere"
    model, _ = small_state()
    wu.save_checkpoint(tmp_path / "c.pt", model=model)
    shutil.copy(tmp_path / "c.pt", tmp)  # even a complete one: it was never renamed into place
    with pytest.raises(wu.WorkshopError, match="unfinished temporary file") as err:
        wu.load_checkpoint(tmp, model=small_model())
    one_line(err)


@FUZZ
@given(data=st.binary(min_size=0, max_size=3000))
def test_random_bytes_are_never_a_traceback(tmp_path_factory, data):
    path = tmp_path_factory.mktemp("fuzz") / "step_00000001.pt"
    path.write_bytes(data)
    with pytest.raises(wu.WorkshopError) as err:
        wu.load_checkpoint(path, model=small_model())
    one_line(err)


@FUZZ
@given(cut=st.floats(min_value=0.0, max_value=0.9999))
def test_every_truncation_of_a_checkpoint_is_one_line(tmp_path_factory, good_checkpoint, cut):
    path = tmp_path_factory.mktemp("cut") / "step_00000003.pt"
    path.write_bytes(good_checkpoint[: int(cut * len(good_checkpoint))])
    with pytest.raises(wu.WorkshopError) as err:
        wu.load_checkpoint(path, model=small_model())
    text = one_line(err)
    assert "empty file" in text or "truncated" in text


@FUZZ
@given(where=st.floats(min_value=0.0, max_value=0.9999), flip=st.integers(min_value=1, max_value=255))
def test_a_flipped_byte_loads_or_is_one_line(tmp_path_factory, good_checkpoint, where, flip):
    blob = bytearray(good_checkpoint)
    blob[int(where * len(blob))] ^= flip
    path = tmp_path_factory.mktemp("flip") / "step_00000003.pt"
    path.write_bytes(bytes(blob))
    model, optimizer = small_state(1)
    try:
        wu.load_checkpoint(path, model=model, optimizer=optimizer)  # a flip inside tensor data goes unnoticed
    except wu.WorkshopError as err:
        assert "\n" not in str(err) and " Fix: " in str(err)


# ---------------------------------------------------------------- 2. killed writes leave no lasting debris

def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_a_killed_writers_temporary_file_is_removed_by_the_next_save(tmp_path):
    model, _ = small_state()
    machine = ckpt.this_machine()
    dead = tmp_path / f".step_00000004.pt.tmp-{_dead_pid()}-{machine}"
    live = tmp_path / f".step_00000004.pt.tmp-{os.getpid()}-{machine}"  # this process: alive, maybe writing
    fresh_elsewhere = tmp_path / ".step_00000004.pt.tmp-4242-othernode.1"
    old_elsewhere = tmp_path / ".step_00000002.pt.tmp-4242-othernode.1"
    old_format = tmp_path / ".step_00000001.pt.tmp-4242"
    for tmp in (dead, live, fresh_elsewhere, old_elsewhere, old_format):
        tmp.write_bytes(b"half a checkpoint")
    an_hour_ago = time.time() - 3600
    os.utime(old_elsewhere, (an_hour_ago, an_hour_ago))
    os.utime(old_format, (an_hour_ago, an_hour_ago))

    assert ckpt.list_checkpoints(tmp_path) == []  # never listed as checkpoints
    assert set(ckpt.stale_temporaries(tmp_path)) == {dead, old_elsewhere, old_format}
    wu.save_checkpoint(ckpt.checkpoint_path(tmp_path, 8), model=model, step=8)
    left = sorted(p.name for p in tmp_path.iterdir())
    assert left == sorted([live.name, fresh_elsewhere.name, "step_00000008.pt"])


def test_listing_at_start_and_pruning_clean_up_too(tmp_path):
    model, _ = small_state()
    for step in (3, 6):
        wu.save_checkpoint(ckpt.checkpoint_path(tmp_path, step), model=model, step=step)
    dead = tmp_path / f".step_00000009.pt.tmp-{_dead_pid()}-{ckpt.this_machine()}"
    dead.write_bytes(b"x")
    assert wu.latest_checkpoint(tmp_path).name == "step_00000006.pt" and not dead.exists()
    dead.write_bytes(b"x")
    ckpt.prune_checkpoints(tmp_path, keep=1)
    assert [p.name for p in tmp_path.iterdir()] == ["step_00000006.pt"]


@pytest.mark.slow
def test_a_process_killed_mid_write_leaves_the_previous_checkpoint_and_no_lasting_debris(tmp_path):
    model, _ = small_state()
    first = wu.save_checkpoint(ckpt.checkpoint_path(tmp_path, 3), model=model, step=3)
    expected = wu.parameter_checksum(model)
    script = f"""
import os, signal, torch
import workshop_utils as wu
real = torch.save
def half_then_die(obj, f, *a, **k):
    real(obj, f, *a, **k)
    f.flush(); f.truncate(f.tell() // 2); os.fsync(f.fileno())
    os.kill(os.getpid(), signal.SIGKILL)
torch.save = half_then_die
torch.manual_seed(1)
model = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
wu.save_checkpoint({str(ckpt.checkpoint_path(tmp_path, 6))!r}, model=model, step=6)
"""
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-2000:]
    debris = [p for p in tmp_path.iterdir() if ".tmp-" in p.name]
    assert len(debris) == 1 and debris[0].stat().st_size > 0  # the killed write's half file
    assert wu.list_checkpoints(tmp_path) == [first]  # never listed
    restored = small_model(2)
    assert wu.load_checkpoint(wu.latest_checkpoint(tmp_path), model=restored)["step"] == 3
    assert wu.parameter_checksum(restored) == expected
    assert not debris[0].exists()  # resuming (latest_checkpoint) removed it


# ---------------------------------------------------------------- 3. a full disk

@pytest.mark.parametrize("code, words", [(errno.ENOSPC, "the disk is full"),
                                         (errno.EDQUOT, "your disk quota is used up")])
def test_a_full_disk_keeps_the_previous_checkpoint_and_says_so(tmp_path, monkeypatch, code, words):
    model, optimizer = small_state()
    previous = wu.save_checkpoint(ckpt.checkpoint_path(tmp_path, 3), model=model, optimizer=optimizer, step=3)
    expected = wu.parameter_checksum(model)
    real_save = torch.save

    def fill_the_disk(obj, f, *args, **kwargs):  # half the bytes reach the file, then the disk is full
        whole = io.BytesIO()
        real_save(obj, whole, *args, **kwargs)
        f.write(whole.getvalue()[: len(whole.getvalue()) // 2])
        raise OSError(code, os.strerror(code))

    monkeypatch.setattr(ckpt.torch, "save", fill_the_disk)
    with pytest.raises(wu.WorkshopError) as err:
        wu.save_checkpoint(ckpt.checkpoint_path(tmp_path, 6), model=small_model(5), optimizer=optimizer, step=6)
    text = one_line(err)
    assert words in text and str(tmp_path) in text and "step_00000006.pt not written" in text
    assert "the previous checkpoint step_00000003.pt is intact" in text
    assert "free space there" in text and "point checkpoint_dir elsewhere" in text
    monkeypatch.undo()
    assert [p.name for p in tmp_path.iterdir()] == [previous.name]  # no partial file, as a checkpoint or debris
    restored = small_model(9)
    assert wu.load_checkpoint(wu.latest_checkpoint(tmp_path), model=restored)["step"] == 3
    assert wu.parameter_checksum(restored) == expected


def test_a_disk_that_fills_inside_torch_saves_zip_writer_is_one_line_too(tmp_path, monkeypatch):
    """The write fails mid-file; torch's zip writer, closing, then raises a RuntimeError ("unexpected pos") over the
    OSError. The attendee still gets the kit's line, not the C++ riddle (a full CI disk showed the riddle)."""
    model, optimizer = small_state()
    previous = wu.save_checkpoint(ckpt.checkpoint_path(tmp_path, 3), model=model, optimizer=optimizer, step=3)

    class FillsUp(io.FileIO):
        def write(self, data):
            if self.tell() + len(data) > 4096:
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            return super().write(data)

    monkeypatch.setattr(ckpt, "open", lambda path, mode: FillsUp(path, mode), raising=False)
    with pytest.raises(wu.WorkshopError, match="step_00000006.pt not written: the disk is full") as err:
        wu.save_checkpoint(ckpt.checkpoint_path(tmp_path, 6), model=small_model(5), optimizer=optimizer, step=6)
    assert "the previous checkpoint step_00000003.pt is intact" in one_line(err)
    assert isinstance(err.value.__context__, RuntimeError)  # what torch raised: the case this test is about
    monkeypatch.undo()
    assert [p.name for p in tmp_path.iterdir()] == [previous.name]


def test_a_runtime_error_of_torch_save_without_a_disk_behind_it_is_not_called_a_full_disk(tmp_path, monkeypatch):
    def broken(obj, f, *args, **kwargs):
        raise RuntimeError("a tensor subclass torch cannot pickle")

    monkeypatch.setattr(ckpt.torch, "save", broken)
    with pytest.raises(RuntimeError, match="cannot pickle"):
        wu.save_checkpoint(tmp_path / "step_00000001.pt", model=small_model(1), step=1)
    assert list(tmp_path.iterdir()) == []


def test_a_really_full_file_system_is_one_line(tmp_path):
    """A real ENOSPC from a tiny tmpfs (root only): torch.save into a file object reports it as OSError."""
    model, _ = small_state()
    size = wu.save_checkpoint(tmp_path / "probe.pt", model=model).stat().st_size
    disk = tmp_path / "disk"
    disk.mkdir()
    room = (size * 3 // 2 // 4096 + 1) * 4096  # one checkpoint fits, a second one beside it does not
    mounted = os.geteuid() == 0 and shutil.which("mount") and subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={room}", "tmpfs", str(disk)], capture_output=True).returncode == 0
    if not mounted:
        pytest.skip("mounting a small tmpfs needs root")
    try:
        first = wu.save_checkpoint(ckpt.checkpoint_path(disk, 3), model=model, step=3)
        with pytest.raises(wu.WorkshopError, match="not written: the disk is full") as err:
            wu.save_checkpoint(ckpt.checkpoint_path(disk, 6), model=model, step=6)
        one_line(err)
        assert [p.name for p in disk.iterdir()] == [first.name]
        assert wu.load_checkpoint(first, model=small_model(3))["step"] == 3
    finally:
        subprocess.run(["umount", str(disk)], check=True)


@pytest.mark.slow
def test_training_stops_with_one_line_when_the_disk_fills(tmp_path, tiny_data, monkeypatch):
    folder = tmp_path / "ck"
    real_save, saves = torch.save, []

    def full_after_one(obj, f, *args, **kwargs):
        saves.append(1)
        if len(saves) > 1:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real_save(obj, f, *args, **kwargs)

    monkeypatch.setattr(ckpt.torch, "save", full_after_one)
    config = wu.TrainConfig(max_steps=4, batch_size=32, warmup_steps=0, progress=False, checkpoint_dir=str(folder),
                            checkpoint_every=2)
    with pytest.raises(wu.WorkshopError, match="step_00000004.pt not written: the disk is full") as err:
        wu.train(config, tiny_data)
    one_line(err)
    monkeypatch.undo()
    assert [p.name for p in folder.iterdir()] == ["step_00000002.pt"]
    assert wu.load_checkpoint(folder / "step_00000002.pt", model=wu.build_model("simplecnn"))["step"] == 2


# ---------------------------------------------------------------- 4. no pickle the kit reads may run code

def test_the_payload_is_live(tmp_path):
    """The control: plain pickle does run these payloads, so the refusals below refuse something real."""
    for name, data in (("a", pickle.dumps(Payload(tmp_path / "a"))),
                       ("b", pickle.dumps(Payload(tmp_path / "b", "system"))),
                       ("c", inst_opcode_pickle(tmp_path / "c"))):
        pickle.loads(data)
        assert (tmp_path / name).exists()


@pytest.mark.parametrize("how", ["open", "system"])
@pytest.mark.parametrize("old_format", [False, True], ids=["zip", "legacy"])
def test_a_checkpoint_with_pickled_code_is_refused_and_nothing_runs(tmp_path, how, old_format):
    marker = tmp_path / "ran"
    model, _ = small_state()
    path = tmp_path / "step_00000003.pt"
    wu.save_checkpoint(path, model=model, step=3)
    state = torch.load(path, weights_only=True)
    torch.save({**state, "extra": {"note": Payload(marker, how)}}, path,
               _use_new_zipfile_serialization=not old_format)
    with pytest.raises(wu.WorkshopError, match="holding pickled code") as err:
        wu.load_checkpoint(path, model=small_model())
    one_line(err)
    assert "nothing was run" in str(err.value)
    assert not marker.exists()


@pytest.mark.parametrize("kind", ["open", "system", "inst"])
def test_a_plain_pickle_as_a_checkpoint_is_not_unpickled(tmp_path, kind):
    marker = tmp_path / "ran"
    path = tmp_path / "step_00000003.pt"
    path.write_bytes(inst_opcode_pickle(marker) if kind == "inst" else pickle.dumps({"model": Payload(marker, kind)}))
    with pytest.raises(wu.WorkshopError) as err:
        wu.load_checkpoint(path, model=small_model())
    one_line(err)
    assert not marker.exists()


def test_real_cifar_batches_still_load_in_both_numpy_spellings(tmp_path):
    checksums = write_fake_cifar(tmp_path, per_file=10)
    first = wu.load_data(tmp_path, checksums=checksums, quiet=True)
    folder = tmp_path / FOLDER
    for name in checksums:  # the original files name numpy.core.multiarray (NumPy 1, Python 2)
        path = folder / name
        path.write_bytes(path.read_bytes().replace(b"numpy._core.multiarray", b"numpy.core.multiarray"))
        checksums[name] = wu.spine.data.md5sum(path)
    assert b"cnumpy.core.multiarray\n_reconstruct" in (folder / "data_batch_1").read_bytes()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no DeprecationWarning from numpy.core either
        again = wu.load_data(tmp_path, checksums=checksums, quiet=True)
    assert np.array_equal(first.train_images, again.train_images)
    assert np.array_equal(first.train_labels, again.train_labels)


@pytest.mark.parametrize("kind", ["open", "system", "inst", "in_labels"])
def test_a_cifar_batch_with_code_is_refused_and_nothing_runs(tmp_path, kind):
    marker = tmp_path / "ran"
    checksums = write_fake_cifar(tmp_path)
    path = tmp_path / FOLDER / "data_batch_2"
    if kind == "inst":
        path.write_bytes(inst_opcode_pickle(marker))
    else:
        with open(path, "rb") as f:
            entry = pickle.load(f, encoding="latin1")
        if kind == "in_labels":
            entry["labels"][3] = Payload(marker)  # hidden deep inside an otherwise real batch
        else:
            entry["payload"] = Payload(marker, kind)
        path.write_bytes(pickle.dumps(entry, protocol=2))
    checksums["data_batch_2"] = wu.spine.data.md5sum(path)  # the checksum passes: the file is what was shipped
    with pytest.raises(wu.WorkshopError, match="data_batch_2 is not a CIFAR-10 batch: it refers to") as err:
        wu.load_data(tmp_path, checksums=checksums, quiet=True)
    text = one_line(err)
    assert "nothing was run" in text
    assert not marker.exists()


@pytest.mark.parametrize("blob, words", [
    (b"\x80\x02\x96" + (2**62).to_bytes(8, "little") + b"x.", "ends early"),  # BYTEARRAY8 claiming 4 EiB
    (b"\x80\x05\x96" + (1).to_bytes(8, "little") + b"x.", "uses the pickle opcode BYTEARRAY8"),
    (b"\x80\x02\x82\xf0.", "uses the pickle opcode EXT1"),  # the copyreg extension registry
    (b"\x80\x02X\x01\x00\x00\x00xQ.", "uses the pickle opcode BINPERSID"),
])
def test_pickle_opcodes_no_batch_needs_are_refused_before_unpickling(tmp_path, blob, words):
    checksums = write_fake_cifar(tmp_path)
    path = tmp_path / FOLDER / "test_batch"
    path.write_bytes(blob)
    checksums["test_batch"] = wu.spine.data.md5sum(path)
    with pytest.raises(wu.WorkshopError, match=words) as err:
        wu.load_data(tmp_path, checksums=checksums, quiet=True)
    one_line(err)


@pytest.fixture
def dcp_folder(tmp_path):
    import torch.distributed.checkpoint as dcp

    folder = tmp_path / "sharded"
    with warnings.catch_warnings():  # no process group: DCP warns and saves from this one process
        warnings.simplefilter("ignore")
        dcp.save({"model": wu.build_model("simplecnn").state_dict()}, checkpoint_id=str(folder))
    return folder


def test_a_real_dcp_metadata_reads_with_the_restricted_unpickler(dcp_folder):
    metadata = read_dcp_metadata(dcp_folder)
    assert metadata.state_dict_metadata and all(k.startswith("model.") for k in metadata.state_dict_metadata)
    model = load_into_one_process(dcp_folder, wu.build_model("simplecnn"))
    assert isinstance(model, torch.nn.Module)


@pytest.mark.parametrize("kind", ["open", "system", "inst"])
def test_a_dcp_metadata_with_code_is_refused_and_nothing_runs(dcp_folder, kind):
    marker = dcp_folder.parent / "ran"
    metadata = read_dcp_metadata(dcp_folder)
    blob = inst_opcode_pickle(marker) if kind == "inst" else pickle.dumps((metadata, Payload(marker, kind)))
    (dcp_folder / ".metadata").write_bytes(blob)
    with pytest.raises(wu.WorkshopError, match=r"\.metadata is not a distributed checkpoint's metadata") as err:
        load_into_one_process(dcp_folder, wu.build_model("simplecnn"))
    assert "nothing was run" in one_line(err)
    assert not marker.exists()


@pytest.mark.parametrize("damage, words", [
    (lambda blob: blob[: len(blob) // 2], "ends early (truncated"),
    (lambda blob: b"", "is empty"),
    (lambda blob: json.dumps({"a": 1}).encode(), "not a valid pickle"),
    (lambda blob: pickle.dumps([1, 2]), "holds a list, not a distributed checkpoint's metadata"),
], ids=["truncated", "empty", "json", "a-list"])
def test_a_damaged_dcp_metadata_is_one_line(dcp_folder, damage, words):
    path = dcp_folder / ".metadata"
    path.write_bytes(damage(path.read_bytes()))
    with pytest.raises(wu.WorkshopError, match=re.escape(words)) as err:
        load_into_one_process(dcp_folder, wu.build_model("simplecnn"))
    one_line(err)


def test_a_dcp_metadata_pointing_outside_its_folder_is_refused(dcp_folder):
    metadata = read_dcp_metadata(dcp_folder)
    for info in metadata.storage_data.values():
        info.relative_path = "../../etc/passwd"
    (dcp_folder / ".metadata").write_bytes(pickle.dumps(metadata))
    with pytest.raises(wu.WorkshopError, match="outside its own folder") as err:
        load_into_one_process(dcp_folder, wu.build_model("simplecnn"))
    one_line(err)


class _WithExtraState(torch.nn.Module):
    """A layer whose state_dict holds a non-tensor: DCP stores it as pickled bytes in the .distcp file."""

    def __init__(self, extra=None):
        super().__init__()
        self.linear = torch.nn.Linear(4, 4)
        self.extra = extra if extra is not None else {"note": "plain"}

    def get_extra_state(self):
        return self.extra

    def set_extra_state(self, state):
        self.extra = state


def test_a_dcp_value_with_code_is_refused_and_nothing_runs(tmp_path):
    """DCP unpickles non-tensor values with weights_only=False: the kit's loader does not."""
    import torch.distributed.checkpoint as dcp

    marker = tmp_path / "ran"
    folder = tmp_path / "sharded"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.save({"model": _WithExtraState({"note": Payload(marker)}).state_dict()}, checkpoint_id=str(folder))
    assert not marker.exists()
    with pytest.raises(wu.WorkshopError, match="is not plain data.*nothing was run") as err:
        load_into_one_process(folder, _WithExtraState())
    one_line(err)
    assert not marker.exists()
    # and plain values still load
    good = tmp_path / "good"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.save({"model": _WithExtraState({"note": "kept", "lr": 0.1}).state_dict()}, checkpoint_id=str(good))
    assert load_into_one_process(good, _WithExtraState({"note": "?", "lr": 1.0})).extra == {"note": "kept", "lr": 0.1}


# ---------------------------------------------------------------- 5. SIGKILL under torchrun, and exact resume

RUN = {**TWO_RANK_RUN, "checkpoint_every": 3}  # 4 steps an epoch on 2 gloo ranks; checkpoints at steps 3, 6, 8


def _flags(options: dict) -> list[str]:
    args = []
    for key, value in options.items():
        args += [f"--{key.replace('_', '-')}"] + ([] if value is True else [str(value)])
    return args


@pytest.fixture(scope="module")
def uninterrupted(two_rank_run):
    """The session's uninterrupted run of the same settings (conftest): where checkpoints are written changes no
    parameter, as test_ddp's crash-and-resume also shows."""
    return two_rank_run[0].record


@pytest.mark.slow
@pytest.mark.parametrize("during, rank, step", [("backward", 1, 5), ("checkpoint", 0, 6)],
                         ids=["last-rank-mid-backward", "rank0-mid-checkpoint-write"])
def test_a_sigkilled_rank_is_restarted_and_ends_bit_identical(tmp_path, monkeypatch, uninterrupted, during, rank,
                                                              step):
    folder, out = tmp_path / "ck", tmp_path / "result.json"
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(TESTS), os.environ.get("PYTHONPATH")])))
    monkeypatch.setenv("WORKSHOP_TEST_KILL_AT_STEP", str(step))
    monkeypatch.setenv("WORKSHOP_TEST_KILL_RANK", str(rank))
    monkeypatch.setenv("WORKSHOP_TEST_KILL_DURING", during)
    launched = launch_torchrun("kill_worker", _flags({**RUN, "checkpoint_dir": folder, "resume": True,
                                                      "no_progress": True, "out": out}),
                               2, max_restarts=1, device="cpu", timeout_s=300, check=False, echo=False, out=out,
                               threads=1)
    output = "\n".join(launched.lines)
    assert launched.returncode == 0, output[-4000:]
    assert f"rank {rank} " in output and "sends itself SIGKILL" in output, output[-4000:]
    # Which rank torchrun's own log calls first is a race: it orders by whole-second time stamps, and the rank that
    # lost its connection has written one. test_root_cause checks that the kit names the SIGKILLed rank.
    assert "Resumed from" in output, output[-4000:]
    crashed = launched.record
    assert crashed["metrics"]["resumed_from_step"] == 3
    identical, line = resume_verdict(crashed, uninterrupted, step, "cpu")
    assert identical, line
    assert crashed["metrics"]["param_checksum"] == uninterrupted["metrics"]["param_checksum"]
    assert sorted(p.name for p in folder.iterdir()) == ["step_00000006.pt", "step_00000008.pt"]  # no debris left
