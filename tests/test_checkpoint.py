import os
from pathlib import Path

import pytest
import torch

import workshop_utils as wu
from workshop_utils.spine import checkpoint as ckpt


def _state(seed=0):
    torch.manual_seed(seed)
    model = wu.build_model("simplecnn")
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model(torch.randn(4, 3, 32, 32)).sum().backward()
    optimizer.step()  # momentum buffers now hold state worth saving
    return model, optimizer


def test_round_trip_restores_model_optimizer_and_rng(tmp_path):
    model, optimizer = _state(0)
    torch.manual_seed(123)
    path = wu.save_checkpoint(tmp_path / "c.pt", model=model, optimizer=optimizer, step=7, epoch=1,
                              model_name="simplecnn")
    expected_draw = torch.rand(3)
    fresh, fresh_opt = _state(1)
    state = wu.load_checkpoint(path, model=fresh, optimizer=fresh_opt, model_name="simplecnn")
    assert state["step"] == 7 and state["epoch"] == 1
    assert wu.parameter_checksum(fresh) == wu.parameter_checksum(model)
    momentum = [s["momentum_buffer"] for s in fresh_opt.state_dict()["state"].values()]
    original = [s["momentum_buffer"] for s in optimizer.state_dict()["state"].values()]
    assert all(torch.equal(a, b) for a, b in zip(momentum, original))
    assert torch.equal(torch.rand(3), expected_draw)  # the RNG continues where it was saved


def test_saved_weights_have_no_ddp_prefix(tmp_path):
    model, _ = _state()
    path = wu.save_checkpoint(tmp_path / "c.pt", model=torch.nn.DataParallel(model))
    keys = torch.load(path, weights_only=True)["model"].keys()
    assert not any(k.startswith("module.") for k in keys)


def test_failed_write_keeps_the_previous_checkpoint(tmp_path, monkeypatch):
    model, _ = _state()
    path = wu.save_checkpoint(tmp_path / "c.pt", model=model, step=1)
    before = path.read_bytes()

    def crash(obj, f, *args, **kwargs):
        f.write(b"half a checkpoint")  # save_checkpoint hands torch.save an open temporary file
        raise OSError("disk full")  # no errno: not a failure the user can fix, so it stays an OSError

    monkeypatch.setattr(ckpt.torch, "save", crash)
    with pytest.raises(OSError):
        wu.save_checkpoint(path, model=model, step=2)
    assert path.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == ["c.pt"]  # no temporary debris


def test_checkpoint_from_another_model_is_refused(tmp_path):
    model, _ = _state()
    path = wu.save_checkpoint(tmp_path / "c.pt", model=model, model_name="simplecnn")
    with pytest.raises(wu.WorkshopError, match="from model 'simplecnn', not 'resnet18'.*Fix: resume with"):
        wu.load_checkpoint(path, model=wu.build_model("resnet18"), model_name="resnet18")
    with pytest.raises(wu.WorkshopError, match="does not fit this model"):
        wu.load_checkpoint(path, model=wu.build_model("resnet18"))
    assert path.exists()  # nothing already written is lost


def test_pickled_code_is_refused(tmp_path):
    path = tmp_path / "evil.pt"
    torch.save({"model": {}, "payload": _state}, path)  # a function: allowed by pickle, not by weights_only
    with pytest.raises(wu.WorkshopError, match="cannot be read"):
        wu.load_checkpoint(path, model=wu.build_model("simplecnn"))


def test_pruning_keeps_the_newest(tmp_path):
    model, _ = _state()
    for step in (10, 20, 30):
        wu.save_checkpoint(ckpt.checkpoint_path(tmp_path, step), model=model, step=step)
    ckpt.prune_checkpoints(tmp_path, keep=2)
    assert [p.name for p in wu.list_checkpoints(tmp_path)] == ["step_00000020.pt", "step_00000030.pt"]
    assert wu.latest_checkpoint(tmp_path).name == "step_00000030.pt"


def test_loading_always_asks_torch_for_weights_only(tmp_path, monkeypatch):
    model, optimizer = _state()
    path = wu.save_checkpoint(tmp_path / "c.pt", model=model, optimizer=optimizer, step=1)
    seen, real_load = [], torch.load

    def spy(*args, **kwargs):
        seen.append(kwargs.get("weights_only"))
        return real_load(*args, **kwargs)

    monkeypatch.setattr(ckpt.torch, "load", spy)
    wu.load_checkpoint(path, model=wu.build_model("simplecnn"))
    assert seen == [True]


def test_the_temporary_file_is_named_after_its_writer_and_never_listed(tmp_path, monkeypatch):
    model, _ = _state()
    names = []
    real_save = torch.save

    def record(obj, f, *args, **kwargs):
        names.append(Path(f.name).name)
        assert not wu.list_checkpoints(tmp_path)  # mid-write: nothing to resume from yet
        return real_save(obj, f, *args, **kwargs)

    monkeypatch.setattr(ckpt.torch, "save", record)
    wu.save_checkpoint(ckpt.checkpoint_path(tmp_path, 4), model=model, step=4)
    assert names == [f".step_00000004.pt.tmp-{os.getpid()}-{ckpt.this_machine()}"]
    assert [p.name for p in tmp_path.iterdir()] == ["step_00000004.pt"]
