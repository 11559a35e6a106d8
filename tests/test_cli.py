"""``python -m workshop_utils.train``: what torchrun, Slurm scripts and the notebooks start."""

from __future__ import annotations

import dataclasses
import importlib
import json
import os
import signal
import socket
import subprocess
import sys

import pytest
import torch

import workshop_utils as wu
from workshop_utils import WorkshopError
from workshop_utils.parallel.launch import check_process_count, launch_training

pytestmark = pytest.mark.slow  # every test here starts the training CLI in a subprocess
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
                 "linear scaling rule", "SIGUSR1", "--max-steps N, --steps N", "--resume [PATH]",
                 "--progress, --no-progress", "--keep-checkpoints N|all", "checkpoints and failures"):
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


# ---------------------------------------------------------------- one config: every TrainConfig field is a flag

import contextlib  # noqa: E402  (imports of this part, kept next to it)
import dataclasses  # noqa: E402
import errno  # noqa: E402
import io  # noqa: E402
import tempfile  # noqa: E402
from pathlib import Path  # noqa: E402
from types import SimpleNamespace  # noqa: E402

from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

entry = importlib.import_module("workshop_utils.train")  # the command; wu.train stays the function
from workshop_utils.parallel import launch  # noqa: E402
from workshop_utils.spine.config import setting_of  # noqa: E402
from workshop_utils.spine.trainer import TrainConfig  # noqa: E402

ENTRY_ONLY = {"global_batch_size", "out"}  # the command's own flags, no field
FIELDS = dataclasses.fields(TrainConfig)


def flag_actions():
    """The parser's flags (argparse lists them nowhere public), the first one for each destination."""
    actions = {}
    for action in entry.build_parser()._actions:
        if action.dest != "help":
            actions.setdefault(action.dest, action)  # --no-resume, a second flag of resume, comes later
    return actions


def parse(*argv, world_size=1) -> TrainConfig:
    return entry.config_from_args(entry.build_parser().parse_args(list(argv)), world_size)


def test_every_field_is_a_flag_and_only_the_commands_own_flags_are_extra():
    assert set(flag_actions()) == {f.name for f in FIELDS} | ENTRY_ONLY


def test_defaults_and_help_come_from_the_fields():
    assert parse() == TrainConfig(name="train")  # the command's one default of its own: --name train
    actions = flag_actions()
    for f in FIELDS:
        assert setting_of(f).help in actions[f.name].help, f.name
        assert actions[f.name].option_strings[0] == "--" + f.name.replace("_", "-")


@pytest.mark.parametrize("argv, expected", [
    (["--steps", "7"], dict(max_steps=7)),
    (["--max-steps", "7"], dict(max_steps=7)),
    (["--lr", "0.1", "--momentum", "0.8"], dict(lr=0.1, momentum=0.8)),
    (["--batch-size", "8", "--no-progress"], dict(batch_size=8, progress=False)),
    (["--deterministic", "--pin-memory"], dict(deterministic=True, pin_memory=True)),
    (["--checkpoint-dir", "ck", "--resume"], dict(checkpoint_dir="ck", resume=True)),
    (["--resume", "ck/step_00000004.pt", "--checkpoint-dir", "ck"],
     dict(checkpoint_dir="ck", resume="ck/step_00000004.pt")),
    (["--resume", "--no-resume"], dict(resume=False)),
    (["--synthetic"], dict(synthetic=True)),
    (["--synthetic", "no"], dict(synthetic=False)),
    (["--no-synthetic"], dict(synthetic=False)),
    (["--device", "auto"], dict(device=None)),
    (["--device", "cpu"], dict(device="cpu")),
    (["--keep-checkpoints", "all"], dict(keep_checkpoints=None)),
    (["--keep-checkpoints", "5"], dict(keep_checkpoints=5)),
    (["--prefetch-factor", "4", "--stop-after-step", "3"], dict(prefetch_factor=4, stop_after_step=3)),
])
def test_flags_parse_to_the_fields_types(argv, expected):
    assert parse(*argv) == TrainConfig(name="train", **expected)


def test_global_batch_size_is_shared_out_over_the_processes():
    assert parse("--global-batch-size", "64", world_size=4).batch_size == 16


def test_the_slurm_scripts_flags_still_parse():
    argv = ["--name", "job", "--no-progress", "--log-every", "50", "--checkpoint-dir", "ck", "--resume",
            "--out", "run/result.json", "--steps", "10", "--device", "auto", "--precision", "bf16"]
    args = entry.build_parser().parse_args(argv)
    assert args.out == "run/result.json"
    assert entry.config_from_args(args, 1) == TrainConfig(name="job", progress=False, log_every=50,
                                                          checkpoint_dir="ck", resume=True, max_steps=10,
                                                          precision="bf16")


def test_launch_training_options_become_flags_the_command_reads_back(monkeypatch):
    seen = {}
    monkeypatch.setattr(launch, "launch_torchrun", lambda module, args, *a, **k: seen.setdefault("args", args))
    launch.launch_training(2, batch_size=32, steps=20, checkpoint_dir="ck", resume=True, synthetic=False,
                           compile=False, device="cpu", keep_checkpoints=3, data_root=None, no_progress=False)
    args = entry.build_parser().parse_args(seen["args"])
    assert args.out is not None
    assert entry.config_from_args(args, 2) == TrainConfig(name="train", batch_size=32, max_steps=20,
                                                          checkpoint_dir="ck", resume=True, synthetic=False,
                                                          device="cpu", keep_checkpoints=3, progress=True)


# ---------------------------------------------------------------- output paths first; the result never lost

DIST_VARIABLES = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "SLURM_NTASKS", "SLURM_PROCID")


@pytest.fixture
def fake_training(monkeypatch):
    """``main(argv)`` in-process, fast: training cannot really start, and no signal handler lands in pytest."""
    calls = []

    def train(config, data=None, on_step=None):
        calls.append(config)
        metrics = {"interrupted": False, "samples_per_s": None, "steps": 0, "world_size": 1, "param_checksum": "0"}
        return SimpleNamespace(metrics=metrics, record={"kind": "train", "config": dataclasses.asdict(config),
                                                        "metrics": metrics})

    monkeypatch.setattr(entry, "train", train)
    monkeypatch.setattr(entry, "stop_on_signals", lambda: None)
    monkeypatch.setattr(entry, "git_commit", lambda: None)
    for name in DIST_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    return calls


def one_error_line(capsys) -> str:
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:"), lines
    return lines[0]


@pytest.mark.parametrize("case", ["out under a file", "out is a folder", "checkpoint dir under a file",
                                  "checkpoint dir is a file", "out in a read-only folder"])
def test_an_unwritable_output_path_stops_before_any_work(case, tmp_path, fake_training, capsys):
    a_file, folder, read_only = tmp_path / "a_file", tmp_path / "folder", tmp_path / "read_only"
    a_file.write_text("not a folder")
    folder.mkdir()
    read_only.mkdir(mode=0o500)
    argv, named = {
        "out under a file": (["--out", str(a_file / "result.json")], a_file),
        "out is a folder": (["--out", str(folder)], folder),
        "checkpoint dir under a file": (["--checkpoint-dir", str(a_file / "ck")], a_file),
        "checkpoint dir is a file": (["--checkpoint-dir", str(a_file)], a_file),
        "out in a read-only folder": (["--out", str(read_only / "result.json")], read_only),
    }[case]
    if case == "out in a read-only folder" and os.geteuid() == 0:
        pytest.skip("root writes into a read-only folder anyway: the path-under-a-file cases cover root")
    with pytest.raises(SystemExit) as stop:
        entry.main(argv)
    assert stop.value.code == 2
    line = one_error_line(capsys)
    assert str(named) in line and "Fix:" in line
    assert fake_training == []  # no work started


def test_the_result_survives_a_failing_final_write(tmp_path, fake_training, capsys, monkeypatch):
    def disk_full(*args, **kwargs):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(Path, "write_text", disk_full)  # where the record's bytes go: a full disk says no there
    (tmp_path / "tmp").mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    out = tmp_path / "run" / "result.json"
    with pytest.raises(SystemExit) as stop:
        entry.main(["--name", "kept", "--out", str(out)])
    assert stop.value.code == 1
    line = one_error_line(capsys)
    [saved] = (tmp_path / "tmp").glob("*.json")
    assert str(out) in line and str(saved) in line and os.strerror(errno.ENOSPC) in line and "Fix:" in line
    assert json.loads(saved.read_text())["name"] == "kept" and not out.exists()

    # With no temporary file either, the job's log keeps it: one line of JSON on stdout.
    monkeypatch.setattr(tempfile, "mkstemp", lambda **kwargs: disk_full(None, None))
    with pytest.raises(SystemExit):
        entry.main(["--name", "printed", "--out", str(out)])
    captured = capsys.readouterr()
    assert json.loads(captured.out.splitlines()[-1])["name"] == "printed"
    assert len(captured.err.splitlines()) == 1 and captured.err.startswith("error:")


# Garbage for any flag, and near misses. No "/" in drawn text: a drawn --out stays in the test's folder
# (tests run as root here, where an absolute path could land anywhere).
GARBAGE = st.one_of(
    st.sampled_from(["0", "-1", "2.5", "1e-3", "nan", "inf", "-inf", "", " ", "abc", "gpu", "fp8", "9" * 25, "-",
                     "--", "\x00", "a\nb", "\u2028", "é", ".", ".."]),
    st.text(alphabet=st.characters(blacklist_characters="/"), max_size=6))
PARSER = entry.build_parser()
FLAGS = sorted(flag for action in PARSER._actions for flag in action.option_strings if flag not in ("-h", "--help"))


def parses(argv) -> bool:
    with contextlib.redirect_stderr(io.StringIO()):
        try:
            PARSER.parse_args(argv)
            return True
        except SystemExit:
            return False


# What each flag accepts (as the parser says), so that most draws get past the parser to the checks behind it.
CANDIDATES = ["1", "2", "7", "0.5", "0.01", "auto", "all", "yes", "no", "cpu", "cuda", "bf16", "resnet18",
              "device", "result.json", "sub/result.json", "ck",
              *sorted({str(c) for f in dataclasses.fields(wu.TrainConfig)  # every allowed value of every field
                       for c in (f.metadata["setting"].choices or ())})]
GOOD = {flag: [None] * parses([flag]) + [value for value in CANDIDATES if parses([flag, value])] for flag in FLAGS}
DRAW = st.sampled_from(FLAGS).flatmap(  # mostly values the parser accepts; garbage and nothing too
    lambda flag: st.tuples(st.just(flag), st.one_of(st.sampled_from(GOOD[flag]), st.sampled_from(GOOD[flag]),
                                                    GARBAGE, st.none())))


@settings(max_examples=300, deadline=None, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])  # the fixtures hold for every draw
@given(draws=st.lists(DRAW, max_size=4))
def test_any_flags_run_or_end_in_one_error_line(draws, fake_training, capsys, monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    argv = [text for flag, value in draws for text in ([flag] if value is None else [flag, value])]
    capsys.readouterr()
    try:
        entry.main(argv)
    except SystemExit as stop:
        err = capsys.readouterr().err
        assert stop.code == 2, (argv, err)
        lines = err.splitlines()
        assert len(lines) == 1 and lines[0].startswith("error:"), (argv, err)
