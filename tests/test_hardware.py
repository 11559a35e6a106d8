import pytest
import torch

import workshop_utils as wu
from workshop_utils.system.hardware import check_precision


@pytest.mark.parametrize("name, precision, peak", [
    ("NVIDIA H100 80GB HBM3", "bf16", 989.4),
    ("NVIDIA H100 PCIe", "bf16", 756.0),
    ("NVIDIA H100 NVL", "tf32", 417.5),
    ("NVIDIA H200", "fp32", 67.0),
    ("NVIDIA A100-SXM4-80GB", "tf32", 156.0),
    ("Tesla V100-SXM2-32GB", "fp16", 125.0),
    ("Tesla V100-SXM2-32GB", "bf16", None),  # no bf16 on Volta
    ("NVIDIA L40S", "fp16", 362.1),
    ("Some Future GPU", "bf16", None),  # unknown: never guessed
    ("NVIDIA L4", "fp16", 121.0),
    ("NVIDIA L40", "fp16", None),  # whole model names only: not an L4, not an L40S
    ("NVIDIA A10", "fp32", 31.2),
    ("NVIDIA A10G", "fp32", None),  # not an A10
    ("NVIDIA GH200 480GB", "bf16", 989.4),
])
def test_peak_table_lookup(name, precision, peak):
    assert wu.peak_tflops(name, precision) == peak


def test_mfu_is_unknown_off_the_table():
    assert wu.mfu(100.0, "x86_64", "fp32") is None
    assert wu.mfu(98.94, "NVIDIA H100 80GB HBM3", "bf16") == pytest.approx(0.1)


def test_environment_records_versions_and_slurm(monkeypatch):
    monkeypatch.setenv("SLURM_JOB_ID", "4242")
    monkeypatch.setenv("SLURM_NTASKS", "8")
    env = wu.environment()
    assert env["torch"] == torch.__version__
    assert env["cpu_cores"] >= 1
    # a CPU speed means little without the CPU: AVX2-only ones emulate bf16 at a tenth of the speed
    assert env["cpu_capability"] == torch.backends.cpu.get_cpu_capability()
    assert isinstance(env["cpu_model"], str) and env["cpu_model"].strip()
    assert env["slurm"] == {"SLURM_JOB_ID": "4242", "SLURM_NTASKS": "8"}
    assert "slurm" in wu.environment_table(env).index


def test_bf16_on_a_gpu_without_it_is_one_clear_error(monkeypatch):
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (7, 0))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "Tesla V100-SXM2-32GB")
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda including_emulation=True: False)
    with pytest.raises(wu.WorkshopError, match="no bfloat16 support.*Fix: use precision='fp16'"):
        check_precision("bf16", torch.device("cuda", 0))


def test_fp16_on_a_pre_pascal_gpu_is_refused(monkeypatch):
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (5, 2))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "Tesla M60")
    with pytest.raises(wu.WorkshopError, match="too old for fast float16"):
        check_precision("fp16", torch.device("cuda", 0))


def test_unknown_precision_is_refused():
    with pytest.raises(wu.WorkshopError, match="Unknown precision 'fp8'"):
        check_precision("fp8", torch.device("cpu"))


def test_cpu_modes_warn_but_run():
    assert any("plain FP32" in n for n in check_precision("tf32", torch.device("cpu")))
    assert check_precision("bf16", torch.device("cpu")) == []


@pytest.mark.parametrize("device, words", [("tpu9", "is not a device"), (None, "is not a device"),
                                           (3.5, "is not a device")])
def test_a_device_that_is_not_one_is_one_line(device, words):
    with pytest.raises(wu.WorkshopError, match=words):
        check_precision("bf16", device)


def test_a_device_named_as_text_is_read_like_a_torch_device():
    assert check_precision("bf16", "cpu") == [] and check_precision("tf32", "cpu")


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without a GPU")
def test_cuda_asked_for_where_there_is_none_is_one_line():
    with pytest.raises(wu.WorkshopError, match="cannot be used here"):
        check_precision("bf16", "cuda")
