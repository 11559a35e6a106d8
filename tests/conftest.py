import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))  # tests/helpers.py

# The suite never submits to a real cluster: run on a login node, the main job's notebook 06 would
# otherwise send jobs to the site's Slurm. The one test that wants Slurm starts its own and says so.
os.environ.setdefault("WORKSHOP_SLURM", "off")


@pytest.fixture
def tiny_data():
    from workshop_utils import make_synthetic_cifar

    return make_synthetic_cifar(256, 128, seed=0)


# What PyTorch reports on the kinds of CPU the kit meets, for ``fake_cpu``: (machine, vector capability,
# oneDNN native bf16, AVX-512 BF16 instructions, AMX tiles).
CPU_KINDS = {
    "avx2": ("x86_64", "AVX2", False, False, False),  # AMD EPYC Zen 2/3, most laptops
    "avx512-bf16": ("x86_64", "AVX512", True, True, True),  # Intel Xeon Sapphire Rapids and newer
    "avx512-no-bf16": ("x86_64", "AVX512", True, False, False),  # Intel Xeon Skylake/Cascade Lake
    "arm-bf16": ("aarch64", "SVE256", True, False, False),  # Arm Neoverse V1 (Graviton3)
}


@pytest.fixture
def fake_cpu(monkeypatch):
    """``fake_cpu(kind)``: PyTorch's capability functions report a CPU of that kind (see CPU_KINDS).

    Only what the CPU and PyTorch report is faked; no clock is, since no decision reads one.
    """
    import platform

    import torch

    def fake(kind: str) -> None:
        machine, capability, onednn_bf16, avx512_bf16, amx = CPU_KINDS[kind]
        monkeypatch.setattr(platform, "machine", lambda: machine)
        monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: capability)
        monkeypatch.setattr(torch.ops.mkldnn, "_is_mkldnn_bf16_supported", lambda: onednn_bf16)
        monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: avx512_bf16)
        monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: amx)

    return fake


@pytest.fixture(scope="session")
def corpus():
    """The GPT's text: the standard library's source, read once for the session."""
    import workshop_utils as wu

    return wu.load_text(quiet=True)


@pytest.fixture(scope="session")
def two_rank_run(tmp_path_factory):
    """helpers.TWO_RANK_RUN launched once on 2 gloo ranks, uninterrupted: (the launch, its checkpoint folder).

    test_ddp compares it with one process and resumes from its checkpoints; test_faults compares its SIGKILLed
    runs with it. Its checkpoints go where the notebook's crash-and-resume demo puts its own (a run folder's
    ``checkpoints/``), so test_ddp's demo meets an earlier run's final checkpoint there.
    """
    from helpers import TWO_RANK_RUN

    from workshop_utils.parallel.launch import launch_training
    from workshop_utils.system.results import fresh_folder

    checkpoints = fresh_folder(tmp_path_factory.mktemp("ddp") / "checkpoints", "ddp_crash_resume")
    launched = launch_training(2, checkpoint_dir=str(checkpoints), echo=False, timeout_s=300, threads=1,
                               **TWO_RANK_RUN)
    return launched, checkpoints


@pytest.fixture
def one_thread():
    """Training runs in one thread: on a busy 2-core runner two threads wait on each other.

    Measured with the suite running beside it, the tiny GPT at 16 sequences of 32 tokens: 83 ms a
    step in one thread, 2,721 ms in two.
    """
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


ATTENDEE_TESTS = "test_attendee_notebooks.py"


def pytest_collection_modifyitems(config, items):
    """The attendee copies' tests run last: their notebooks run in the background meanwhile (attendee_run.py)."""
    items.sort(key=lambda item: Path(str(item.fspath)).name == ATTENDEE_TESTS)


def pytest_collection_finish(session):
    if session.config.option.collectonly or not any(Path(str(i.fspath)).name == ATTENDEE_TESTS for i in session.items):
        return
    import attendee_run
    from test_attendee_notebooks import LIMIT_S

    attendee_run.start(LIMIT_S, 6 * LIMIT_S + 120)


def pytest_sessionfinish(session, exitstatus):
    import attendee_run

    attendee_run.clean_up()  # a session cut short stops the run and every kernel it started
