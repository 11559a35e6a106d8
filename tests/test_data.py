import subprocess
import sys

import numpy as np
import pytest
import torch

import workshop_utils as wu
from helpers import write_fake_cifar
from workshop_utils.spine.data import FOLDER, TorchLoader, DeviceLoader


def test_synthetic_is_deterministic_and_cifar_shaped():
    a, b = wu.make_synthetic_cifar(1500, 300, seed=3), wu.make_synthetic_cifar(1500, 300, seed=3)
    assert a.train_images.shape == (1500, 32, 32, 3) and a.train_images.dtype == np.uint8
    assert a.test_images.shape == (300, 32, 32, 3) and a.train_labels.dtype == np.int64
    assert np.array_equal(a.train_images, b.train_images) and np.array_equal(a.test_labels, b.test_labels)
    assert set(np.unique(a.train_labels)) == set(range(10))
    assert not np.array_equal(a.train_images, wu.make_synthetic_cifar(1500, 300, seed=4).train_images)
    # a smaller set is a prefix of a larger one, so CPU and GPU profiles see the same first images
    small = wu.make_synthetic_cifar(700, 10, seed=3)
    assert np.array_equal(small.train_images, a.train_images[:700])


@pytest.mark.slow
def test_synthetic_is_learnable_well_above_chance():
    data = wu.make_synthetic_cifar(1024, 512, seed=0)
    result = wu.train(wu.TrainConfig(epochs=3, batch_size=64, loader="device", progress=False, warmup_steps=1), data)
    assert 0.5 < result.metrics["final_test_acc"] < 0.9  # chance is 0.1; a fifth of the labels are random


def test_a_fifth_of_the_synthetic_labels_are_random_and_the_images_do_not_change():
    from workshop_utils.spine import data as data_module

    noisy = wu.make_synthetic_cifar(3000, 10, seed=5)
    original = data_module.LABEL_NOISE
    try:
        data_module.LABEL_NOISE = 0.0
        clean = wu.make_synthetic_cifar(3000, 10, seed=5)
    finally:
        data_module.LABEL_NOISE = original
    assert np.array_equal(noisy.train_images, clean.train_images)
    changed = np.mean(noisy.train_labels != clean.train_labels)
    assert changed == pytest.approx(0.2 * 0.9, abs=0.03)  # a random label is the right one a tenth of the time


def test_reads_torchvision_format_exactly(tmp_path):
    checksums = write_fake_cifar(tmp_path, per_file=20)
    data = wu.load_data(tmp_path, checksums=checksums, quiet=True)
    assert data.source == "cifar10" and not data.is_synthetic
    assert data.train_images.shape == (100, 32, 32, 3) and data.test_images.shape == (20, 32, 32, 3)
    import pickle

    with open(tmp_path / FOLDER / "data_batch_2", "rb") as f:
        raw = pickle.load(f, encoding="latin1")
    # CIFAR rows are 1024 red, then 1024 green, then 1024 blue values, row-major
    image, flat = data.train_images[20 + 7], raw["data"][7]
    assert image[5, 9, 0] == flat[5 * 32 + 9] and image[5, 9, 2] == flat[2048 + 5 * 32 + 9]
    assert data.train_labels[20 + 7] == raw["labels"][7]


def test_data_dir_from_environment_variable(tmp_path, monkeypatch):
    checksums = write_fake_cifar(tmp_path)
    monkeypatch.setenv("WORKSHOP_DATA", str(tmp_path))
    assert wu.load_data(checksums=checksums, quiet=True).location == str(tmp_path / FOLDER)


def test_checksum_mismatch_is_a_clear_error(tmp_path):
    write_fake_cifar(tmp_path)  # not the real CIFAR-10: torchvision's MD5s cannot match
    with pytest.raises(wu.WorkshopError, match="data_batch_1 is corrupt or incomplete.*Fix: delete"):
        wu.load_data(tmp_path, quiet=True)


def test_corrupted_file_is_named(tmp_path):
    checksums = write_fake_cifar(tmp_path)
    path = tmp_path / FOLDER / "data_batch_3"
    blob = bytearray(path.read_bytes())
    blob[200] ^= 0xFF
    path.write_bytes(bytes(blob))
    with pytest.raises(wu.WorkshopError, match="data_batch_3 is corrupt"):
        wu.load_data(tmp_path, checksums=checksums, quiet=True)


def test_missing_file_is_named(tmp_path):
    checksums = write_fake_cifar(tmp_path)
    (tmp_path / FOLDER / "test_batch").unlink()
    with pytest.raises(wu.WorkshopError, match="'test_batch' is missing"):
        wu.load_data(tmp_path, checksums=checksums, quiet=True)


def test_truncated_pickle_is_a_clear_error(tmp_path):
    checksums = write_fake_cifar(tmp_path)
    path = tmp_path / FOLDER / "data_batch_1"
    path.write_bytes(path.read_bytes()[:100])
    checksums["data_batch_1"] = wu.spine.data.md5sum(path)  # checksum passes, content is still broken
    with pytest.raises(wu.WorkshopError, match="Cannot read CIFAR-10 file .*data_batch_1"):
        wu.load_data(tmp_path, checksums=checksums, quiet=True)


def test_explicit_root_without_data_never_falls_back(tmp_path):
    with pytest.raises(wu.WorkshopError, match="No CIFAR-10 found"):
        wu.load_data(tmp_path / "empty", quiet=True)


def test_no_data_anywhere_falls_back_loudly(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(wu.spine.data, "repo_root", lambda: None)
    data = wu.load_data(train_size=64, test_size=32)
    assert data.is_synthetic and len(data.train_labels) == 64
    assert "SYNTHETIC" in capsys.readouterr().err


@pytest.mark.slow
def test_verify_command_fails_with_one_line(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "workshop_utils.data", "verify", "--root", str(tmp_path)],
                          capture_output=True, text=True)
    assert proc.returncode == 2
    assert proc.stderr.strip().count("\n") == 0 and proc.stderr.startswith("error: No CIFAR-10 files")


@pytest.mark.parametrize("kind", ["torch", "device"])
def test_loaders_yield_normalised_batches(kind, tiny_data):
    loader = wu.make_loader(kind, tiny_data.train_images, tiny_data.train_labels, 32, torch.device("cpu"),
                            train=True)
    batches = list(loader.epoch(0))
    assert len(batches) == len(loader) == 8
    images, labels = batches[0]
    assert images.shape == (32, 3, 32, 32) and images.dtype == torch.float32 and labels.dtype == torch.int64
    assert -3 < images.mean() < 3 and images.std() > 0.3


@pytest.mark.parametrize("kind", ["torch", "device"])
def test_resuming_mid_epoch_gives_the_same_batches(kind, tiny_data):
    def loader():
        return wu.make_loader(kind, tiny_data.train_images, tiny_data.train_labels, 32, torch.device("cpu"),
                              train=True, seed=7)

    full = list(loader().epoch(2))
    tail = list(loader().epoch(2, start_batch=5))
    assert len(tail) == 3
    for (a, la), (b, lb) in zip(full[5:], tail):
        assert torch.equal(a, b) and torch.equal(la, lb)
    assert not torch.equal(full[0][0], list(loader().epoch(3))[0][0])  # new epoch, new order


def test_evaluation_loader_keeps_order_and_every_sample(tiny_data):
    loader = wu.make_loader("device", tiny_data.test_images, tiny_data.test_labels, 50, torch.device("cpu"),
                            train=False)
    labels = torch.cat([y for _, y in loader.epoch(0)])
    assert torch.equal(labels, torch.from_numpy(tiny_data.test_labels))


def test_dataloader_workers_do_not_change_augmentation(tiny_data):
    args = (tiny_data.train_images, tiny_data.train_labels, 32, torch.device("cpu"), True)
    in_process = list(TorchLoader(*args, seed=1).epoch(0))
    workers = list(TorchLoader(*args, seed=1, num_workers=2).epoch(0))
    assert all(torch.equal(a, b) for (a, _), (b, _) in zip(in_process, workers))


@pytest.mark.parametrize("bad", [0, -4])
def test_bad_batch_size_is_refused(bad, tiny_data):
    with pytest.raises(wu.WorkshopError, match="Batch size must be positive"):
        wu.make_loader("torch", tiny_data.train_images, tiny_data.train_labels, bad, torch.device("cpu"), True)


def test_unknown_loader_is_refused(tiny_data):
    with pytest.raises(wu.WorkshopError, match="Unknown loader 'dali'"):
        wu.make_loader("dali", tiny_data.train_images, tiny_data.train_labels, 8, torch.device("cpu"), True)


def test_device_loader_crops_stay_inside_padding(tiny_data):
    loader = DeviceLoader(tiny_data.train_images, tiny_data.train_labels, 64, torch.device("cpu"), True)
    raw = loader.images[:64]
    out = loader._augment(raw, epoch=0, batch=0)
    assert out.shape == raw.shape and out.dtype == torch.uint8


def test_the_written_out_layout_is_torchvisions():
    from torchvision.datasets import CIFAR10

    from workshop_utils.spine import data as data_module

    assert data_module.FOLDER == CIFAR10.base_folder
    assert data_module.TRAIN_FILES == tuple(name for name, _ in CIFAR10.train_list)
    assert data_module.TEST_FILES == tuple(name for name, _ in CIFAR10.test_list)
    assert data_module.META_FILE == CIFAR10.meta["filename"]
    assert set(data_module.cifar10_md5()) == {*data_module.TRAIN_FILES, *data_module.TEST_FILES, data_module.META_FILE}


def test_a_rank_that_trains_without_torchvision_never_imports_it():
    """torchvision takes about 2 s to import: each rank of each launch pays it only when it needs it (the PIL
    loader, ResNet-18, the download command), not for looking for data or training the GPT."""
    probe = ("import sys, workshop_utils as wu\n"
             "wu.train(wu.TrainConfig(model='simplecnn', loader='device', max_steps=1, train_size=64, test_size=16, "
             "batch_size=16, progress=False))\n"
             "print('torchvision' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout
    assert out.strip().splitlines()[-1] == "False", out

