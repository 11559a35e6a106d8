"""The I/O layouts hold the same samples, and the throughput comparison reads every one of them."""

import sys
import time

import numpy as np
import pytest

import workshop_utils as wu
from workshop_utils.lessons import io_layouts


def _samples(batches):
    return sorted((image.tobytes(), int(label)) for images, labels in batches for image, label in zip(images, labels))


def _expected(data, n):
    return sorted((image.tobytes(), int(label)) for image, label in zip(data.train_images[:n], data.train_labels[:n]))


def test_small_files_hold_every_sample(tiny_data, tmp_path):
    wu.write_small_files(tiny_data.train_images[:50], tiny_data.train_labels[:50], tmp_path)
    assert len(list(tmp_path.glob("*/*.rgb"))) == 50
    assert _samples(wu.read_small_files(tmp_path, batch_size=16)) == _expected(tiny_data, 50)


def test_shards_stream_the_samples_in_order(tiny_data, tmp_path):
    paths = wu.write_shards(tiny_data.train_images[:50], tiny_data.train_labels[:50], tmp_path, samples_per_shard=20)
    assert [p.name for p in paths] == ["shard-00000.tar", "shard-00001.tar", "shard-00002.tar"]
    images, labels = zip(*wu.read_shards(tmp_path, batch_size=16))
    assert np.array_equal(np.concatenate(images), tiny_data.train_images[:50])
    assert np.array_equal(np.concatenate(labels), tiny_data.train_labels[:50])


def test_shards_are_readable_without_webdataset(tiny_data, tmp_path, monkeypatch, capsys):
    wu.write_shards(tiny_data.train_images[:30], tiny_data.train_labels[:30], tmp_path, samples_per_shard=8)
    monkeypatch.setitem(sys.modules, "webdataset", None)  # makes `import webdataset` fail
    assert _samples(wu.read_shards(tmp_path, batch_size=7)) == _expected(tiny_data, 30)
    assert "pip install webdataset" in capsys.readouterr().err


def test_readers_name_the_missing_data(tmp_path):
    with pytest.raises(wu.WorkshopError, match="write_shards"):
        wu.read_shards(tmp_path, 8)
    with pytest.raises(wu.WorkshopError, match="write_small_files"):
        wu.read_small_files(tmp_path, 8)
    with pytest.raises(wu.WorkshopError, match="samples_per_shard"):
        wu.write_shards(np.zeros((2, 32, 32, 3), np.uint8), np.zeros(2, np.int64), tmp_path, samples_per_shard=0)


def test_compare_layouts_reads_all_four_layouts(tiny_data, tmp_path):
    table = wu.compare_layouts(tiny_data.train_images, tiny_data.train_labels, tmp_path, device="cpu",
                               batch_size=64, samples_per_shard=100)
    assert table["layout"].tolist() == ["small files", "shards", "memory", "device"]
    assert table["files"].tolist() == [256, 3, 0, 0]  # one open per image versus one per shard
    assert (table["samples_per_s"] > 0).all() and table["vs_small_files"][0] == 1.0
    with pytest.raises(wu.WorkshopError, match="layout"):
        wu.compare_layouts(tiny_data.train_images, tiny_data.train_labels, tmp_path, layouts=("floppy",))


@pytest.mark.parametrize("kind", ["torch", "device"])
def test_loader_throughput_times_each_loader_path(tiny_data, kind):
    assert wu.loader_throughput(kind, tiny_data.train_images, tiny_data.train_labels, 32, device="cpu") > 0
    with pytest.raises(wu.WorkshopError, match="Too few batches"):
        wu.loader_throughput(kind, tiny_data.train_images, tiny_data.train_labels, 128, device="cpu")


class SlowStartLoader:
    """Two slow batches (worker start-up, first allocations), then fast ones: 10 samples each."""

    def __init__(self, slow_s=0.3, fast_s=0.01, batches=7):
        self.slow_s, self.fast_s, self.batches = slow_s, fast_s, batches

    def epoch(self, epoch):
        for index in range(self.batches):
            time.sleep(self.slow_s if index < 2 else self.fast_s)
            yield np.zeros((10, 3, 32, 32)), np.zeros(10)


def test_loader_throughput_starts_its_clock_after_the_warmup_batches(tiny_data, monkeypatch):
    monkeypatch.setattr(io_layouts, "make_loader", lambda *args, **kwargs: SlowStartLoader())
    rate = wu.loader_throughput("torch", tiny_data.train_images, tiny_data.train_labels, 10, device="cpu")
    # timed: the 4 batches after the third (40 samples in about 0.04 s); with the warm-up it would be < 70/s
    assert 300 < rate <= 40 / 0.04
