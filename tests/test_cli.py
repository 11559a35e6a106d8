"""``python -m workshop_utils.train``: what torchrun, Slurm scripts and the notebooks start."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys

import pytest
import torch

from workshop_utils import WorkshopError
from workshop_utils.parallel.launch import check_process_count, launch_training

SMALL = ["--batch-size", "8", "--train-size", "64", "--test-size", "16", "--no-progress"]


def run_cli(*args, env=None, timeout=120):
    dist_vars = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
    clean = {k: v for k, v in os.environ.items() if k not in dist_vars}  # only the variables a test sets
    return subprocess.run([sys.executable, "-m", "workshop_utils.train", *args], capture_output=True, text=True,
                          env={**clean, "PYTHONUNBUFFERED": "1", **(env or {})}, timeout=timeout)


def assert_one_line_error(result, *words):
    assert result.returncode == 2, result.stderr
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:") and "Fix:" in lines[0], result.stderr
    for word in words:
        assert word in lines[0]


def test_help_teaches_the_flags_and_batch_sizes():
    result = run_cli("--help")
    assert result.returncode == 0
    for text in ("--fail-at-step", "--global-batch-size", "--checkpoint-dir", "--out", "torchrun",
                 "linear scaling rule", "SIGUSR1"):
        assert text in result.stdout


def test_one_process_run_writes_its_result_json(tmp_path):
    out = tmp_path / "result.json"
    result = run_cli("--steps", "3", "--warmup-steps", "0", "--out", str(out), *SMALL)
    assert result.returncode == 0, result.stderr
    record = json.loads(out.read_text())
    assert record["metrics"]["steps"] == 3 and record["metrics"]["world_size"] == 1
    assert record["config"]["batch_size"] == 8


def test_unknown_flag_value_is_one_line():
    assert_one_line_error(run_cli("--precision", "bf61"), "bf61", "--precision")


def test_global_batch_the_world_size_does_not_divide_is_one_line():
    env = {"WORLD_SIZE": "3", "RANK": "0", "LOCAL_RANK": "0"}
    assert_one_line_error(run_cli("--global-batch-size", "64", env=env), "64", "3 processes")


def test_port_in_use_is_one_line():
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        env = {"WORLD_SIZE": "2", "RANK": "0", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1",
               "MASTER_PORT": str(port)}
        assert_one_line_error(run_cli("--steps", "1", *SMALL, env=env), str(port), "already in use")
        with pytest.raises(WorkshopError, match="already in use"):
            launch_training(2, port=port, steps=1, device="cpu", echo=False)


# The CLI runs in a child process whose torch pretends to see one GPU: no GPU needed to test the check.
PRETEND_ONE_GPU = ("import runpy, torch; torch.cuda.is_available = lambda: True; torch.cuda.device_count = lambda: 1; "
                   "runpy.run_module('workshop_utils.train', run_name='__main__')")


def test_more_processes_than_gpus_is_one_line(monkeypatch):
    env = {"WORLD_SIZE": "2", "RANK": "0", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "2"}
    clean = {k: v for k, v in os.environ.items() if k not in env}
    result = subprocess.run([sys.executable, "-c", PRETEND_ONE_GPU, "--device", "cuda", "--steps", "1"],
                            capture_output=True, text=True, env={**clean, **env}, timeout=120)
    assert_one_line_error(result, "2 processes per node", "1 GPU")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    with pytest.raises(WorkshopError, match="one GPU per process"):
        check_process_count(4, "cuda")


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message of a machine without a GPU")
def test_gpu_asked_for_without_a_gpu_is_one_line():
    assert_one_line_error(run_cli("--device", "cuda", "--steps", "1", *SMALL), "no CUDA GPU")


def test_sigusr1_checkpoints_and_exits_cleanly(tmp_path):
    """What a pre-empted Slurm job relies on: a signal, a checkpoint, status 0, and --resume continues."""
    args = ["--steps", "1000", "--epochs", "200", "--log-every", "1", "--checkpoint-dir", str(tmp_path), *SMALL]
    process = subprocess.Popen([sys.executable, "-m", "workshop_utils.train", *args], stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        for line in process.stdout:
            if line.startswith("step 2/"):
                os.kill(process.pid, signal.SIGUSR1)
                break
        output = process.stdout.read()
        assert process.wait(timeout=120) == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert "Stop signal received" in output and "rerun with --resume" in output
    checkpoints = sorted(p.name for p in tmp_path.glob("step_*.pt"))
    assert checkpoints and int(checkpoints[-1][5:13]) % 10 == 0  # ranks agree to stop every 10 steps
