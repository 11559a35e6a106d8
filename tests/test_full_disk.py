"""A disk that fills while a notebook writes: one line naming what was not written, never half a file kept as a
whole one, and a training run that goes on where only its TensorBoard scalars could not be written.

An attendee's home on a portal has a quota; the kit's other writes (checkpoints, the handout, the command line's
result) have their own tests. The real cases run on a small tmpfs (root only, as in CI); a used-up quota (EDQUOT)
is the same write failing with another errno.
"""

from __future__ import annotations

import errno
import os
import shutil
import subprocess
from pathlib import Path

import matplotlib
import pytest
import torch

import workshop_utils as wu

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

MIB = 2**20


@pytest.fixture
def small_disk(tmp_path):
    """A 2 MiB tmpfs, and ``fill(leave)``: a file that takes all but ``leave`` bytes of it."""
    disk = tmp_path / "disk"
    disk.mkdir()
    mounted = os.geteuid() == 0 and shutil.which("mount") and subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={2 * MIB}", "tmpfs", str(disk)], capture_output=True).returncode == 0
    if not mounted:
        pytest.skip("mounting a small tmpfs needs root")

    def fill(leave: int = 0) -> None:
        with open(disk / "filler", "ab") as f:
            try:
                f.write(b"\0" * max(0, shutil.disk_usage(disk).free - leave))
            except OSError:
                pass  # full: what the test wants

    try:
        yield disk, fill
    finally:  # lazily: the profiler keeps its failed trace file open until the process ends
        subprocess.run(["umount", "--lazy", str(disk)], check=True)


def _figure(points: int):
    fig, ax = plt.subplots()
    ax.plot(range(points), [i % 7 for i in range(points)])
    return fig


def _files(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir())


def test_a_figure_saved_again_on_a_full_disk_keeps_the_earlier_one_whole_and_says_why(small_disk):
    disk, fill = small_disk
    run = disk / "run"
    first = wu.save_figure(_figure(10), run, "curve")
    before = first.read_bytes()
    fill(leave=4096)
    with pytest.raises(wu.WorkshopError, match=r"Figure .*curve\.png not written: the disk is full") as err:
        wu.save_figure(_figure(5000), run, "curve")
    assert "\n" not in str(err.value) and "Fix: free space there" in str(err.value)
    assert first.read_bytes() == before and _files(run / "figures") == ["curve.png"]  # no half PNG, no temporary


def test_a_record_and_a_report_on_a_full_disk_are_one_line_each_and_leave_no_half_file(small_disk):
    disk, fill = small_disk
    run = disk / "run"
    wu.add_report_section(run, "k", "Title", 1, text="first")
    report = wu.write_report(run).read_text()
    wu.add_report_section(run, "big", "Long", 2, text="y" * 60_000)  # written while there is room
    fill(leave=0)
    with pytest.raises(wu.WorkshopError, match=r"Report .*report\.md not written: the disk is full") as err:
        wu.write_report(run)
    assert "\n" not in str(err.value)
    with pytest.raises(wu.WorkshopError, match=r"Record .*section-more\.json not written: the disk is full"):
        wu.add_report_section(run, "more", "Another", 3, text="z" * 60_000)
    assert (run / "report.md").read_text() == report  # the earlier report, whole
    assert not [p for p in run.rglob("*") if ".tmp-" in p.name]


def test_a_sweep_table_on_a_full_disk_is_one_line_and_the_earlier_table_stays_whole(small_disk):
    import json

    disk, fill = small_disk
    for task in range(40):
        folder = disk / "sweep" / f"task-{task}"
        folder.mkdir(parents=True)
        (folder / "result.json").write_text(json.dumps({"config": {"lr": 0.01 * (task + 1), "seed": 0},
                                                        "metrics": {"steps": 30, "final_train_loss": 2.0}}))
    wu.gather_array(disk / "sweep", disk / "sweep.csv")
    before = (disk / "sweep.csv").read_text()
    fill(leave=0)
    with pytest.raises(wu.WorkshopError, match=r"Sweep table .*sweep\.csv not written: the disk is full") as err:
        wu.gather_array(disk / "sweep", disk / "sweep.csv")
    assert "\n" not in str(err.value)
    assert (disk / "sweep.csv").read_text() == before and not [p for p in disk.iterdir() if ".tmp-" in p.name]


def test_a_used_up_quota_is_named_as_such(tmp_path, monkeypatch):
    def over_quota(self, *args, **kwargs):
        raise OSError(errno.EDQUOT, os.strerror(errno.EDQUOT))

    monkeypatch.setattr(Path, "write_text", over_quota)
    with pytest.raises(wu.WorkshopError, match="not written: your disk quota is used up") as err:
        wu.save_record({"metrics": {}}, tmp_path, "baseline")
    assert "\n" not in str(err.value)
    monkeypatch.undo()
    assert not list((tmp_path / "results").iterdir())


def test_any_other_write_error_is_left_as_it_is(tmp_path, monkeypatch):
    def refused(self, *args, **kwargs):
        raise OSError(errno.EIO, os.strerror(errno.EIO))

    monkeypatch.setattr(Path, "write_text", refused)
    with pytest.raises(OSError) as err:
        wu.save_record({"metrics": {}}, tmp_path, "baseline")
    assert not isinstance(err.value, wu.WorkshopError) and err.value.errno == errno.EIO


def test_a_folder_the_full_disk_cannot_make_is_one_line_too(tmp_path, monkeypatch):
    """A new folder needs a block (ext4) or an inode (an inode quota): the first record of a new run folder."""
    def no_room_for_a_folder(self, *args, **kwargs):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(self))

    monkeypatch.setattr(Path, "mkdir", no_room_for_a_folder)
    with pytest.raises(wu.WorkshopError, match=r"Record .*baseline\.json not written: the disk is full"):
        wu.save_record({"metrics": {}}, tmp_path / "new-run", "baseline")
    with pytest.raises(wu.WorkshopError, match=r"Figure .*curve\.png not written: the disk is full"):
        wu.save_figure(_figure(3), tmp_path / "new-run", "curve")


def test_a_bug_raised_while_a_full_disk_was_handled_is_not_called_a_full_disk(tmp_path, monkeypatch):
    def buggy_write(self, *args, **kwargs):
        try:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        except OSError:
            raise TypeError("a real bug") from None

    monkeypatch.setattr(Path, "write_text", buggy_write)
    with pytest.raises(TypeError, match="a real bug"):
        wu.save_record({"metrics": {}}, tmp_path, "baseline")


@pytest.mark.slow
def test_training_goes_on_when_its_tensorboard_scalars_fill_the_disk(small_disk, capfd):
    disk, fill = small_disk
    data = wu.make_synthetic_cifar(64, 16, seed=0)
    filled = []

    def on_step(step):
        if step == 1 and not filled:
            fill(leave=0)
            filled.append(step)

    # 40 steps of scalars outgrow the event file's first page of the tmpfs, which the full disk still lets it fill
    config = wu.TrainConfig(max_steps=40, epochs=10, batch_size=16, train_size=64, test_size=16, warmup_steps=0,
                            progress=False, tensorboard_dir=str(disk / "tb"))
    result = wu.train(config, data, on_step=on_step)
    assert result.metrics["steps"] == 40  # the run ended and its result is here
    err = capfd.readouterr().err
    warnings = [line for line in err.splitlines() if "TensorBoard logging stopped" in line]
    assert len(warnings) == 1 and "the disk is full" in warnings[0] and "its result is kept" in warnings[0], err
    assert "point tensorboard_dir at another disk" in warnings[0]
    assert "Traceback" not in err, err  # neither the loop's nor the writer thread's


@pytest.mark.slow
def test_a_profile_that_cannot_write_its_trace_never_returns_the_earlier_runs(small_disk, monkeypatch):
    disk, fill = small_disk
    data = wu.make_synthetic_cifar(64, 16, seed=0)
    config = wu.TrainConfig(batch_size=16, train_size=64, test_size=16, progress=False)
    first = wu.profile_training(config, data, disk / "run", active=1, detail=False)
    assert first.chrome_trace.exists()
    fill(leave=0)  # the earlier trace's room comes free again; the detailed trace needs more than that
    with pytest.raises(wu.WorkshopError, match=r"ran its 3 steps but could not write its trace .*profile\.json: "
                                               r"[\d.]+ MiB free there") as err:
        wu.profile_training(config, data, disk / "run", active=1, detail=True)
    assert "\n" not in str(err.value)
    assert _files(disk / "run" / "traces") == []  # neither the earlier trace nor the profiler's stub


@pytest.mark.slow
def test_a_trace_the_full_disk_cut_short_is_not_returned_as_one(tmp_path, monkeypatch):
    """torch's exporter prints "Failed to write to log file!" and raises nothing: the file it leaves ends mid-event."""
    data = wu.make_synthetic_cifar(64, 16, seed=0)
    config = wu.TrainConfig(batch_size=16, train_size=64, test_size=16, progress=False)
    whole = wu.profile_training(config, data, tmp_path, active=1, detail=False).chrome_trace.read_bytes()

    def cut_short(self, path):
        Path(path).write_bytes(whole[: len(whole) // 2])

    monkeypatch.setattr(torch.profiler.profile, "export_chrome_trace", cut_short)
    with pytest.raises(wu.WorkshopError, match="ran its 3 steps but could not write its trace"):
        wu.profile_training(config, data, tmp_path, active=1, detail=False)
    assert _files(tmp_path / "traces") == []
