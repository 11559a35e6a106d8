"""A failed multi-process run names the rank that failed first, with its own error (parallel/failures.py).

The unit tests build what a failed torchrun job leaves behind: the ranks' error files (written by
``record_failure``, as the kit's entries write them) and torchrun's report, formatted by torchrun's
own ``ChildFailedError``. The launch tests (slow) run ``tests/failing_ranks.py`` and the training
command on 2 or 3 gloo ranks and check the one line each failure gets.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest
import torch
from torch.distributed.elastic.multiprocessing.errors import ChildFailedError, ProcessFailure

import workshop_utils as wu
from workshop_utils import postmortem
from workshop_utils.parallel.failures import RankFailed, record_failure, root_cause
from workshop_utils.parallel.launch import launch_nodes, launch_torchrun, launch_training

TESTS = Path(__file__).resolve().parent
GLOO_LOST = ("[/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:561] Connection closed by peer "
             "[127.0.0.1]:7080. This is typically caused by a remote worker crashing. Check the logs of the remote "
             "worker before reporting an error.")


BARRIER_TRACEBACK = f"""Traceback (most recent call last):
  File "/work/my_train_ddp.py", line 97, in main
    dist.barrier()
  File "{Path(torch.__file__).parent}/distributed/c10d_logger.py", line 83, in wrapper
    return func(*args, **kwargs)
           ^^^^^^^^^^^^^^^^^^^^^
  File "{Path(torch.__file__).parent}/distributed/distributed_c10d.py", line 6371, in barrier
    work.wait()
RuntimeError: {GLOO_LOST}
"""


def fail(path: Path, err: Exception) -> Path:
    """``err`` raised and recorded in the error file at ``path``, with its traceback, as a rank records it."""
    try:
        raise err
    except Exception as raised:  # noqa: BLE001 - any exception a rank can end with
        record_failure(raised, path)
    return path


def report(failures: dict[int, tuple[int, Path | None]], label: str = "") -> list[str]:
    """torchrun's report of failed ranks ``{rank: (exit code, error file or None)}``, as torchrun formats it."""
    processes = {rank: ProcessFailure(rank, 1000 + rank, code, str(path or "/nonexistent"))
                 for rank, (code, path) in failures.items()}
    text = ChildFailedError("train.py", processes).format_msg()
    return [f"{label}{line}" for line in ["torch.distributed.elastic.multiprocessing.errors.ChildFailedError: ",
                                          *text.splitlines()]]


# ---------------------------------------------------------------- the error file


def test_the_error_file_is_torchruns_own_format_with_the_exact_time_and_rank(tmp_path, monkeypatch):
    monkeypatch.setenv("RANK", "3")
    path = fail(tmp_path / "error.json", RuntimeError("rank 3 fell over"))
    failure = ProcessFailure(3, 1234, 1, str(path))  # what torchrun itself reads from it
    assert failure.message["message"] == "RuntimeError: rank 3 fell over"
    assert isinstance(failure.timestamp, int) and "rank 3 fell over" in failure.message["extraInfo"]["py_callstack"]
    extra = json.loads(path.read_text())["message"]["extraInfo"]
    assert extra["rank"] == 3 and 0 <= extra["time"] - failure.timestamp < 1


def test_a_rank_stopped_while_it_writes_its_error_file_leaves_none_torchrun_cannot_read(tmp_path, monkeypatch):
    """torchrun stops the survivors with SIGTERM while they record their own error: an empty error.json made its
    agent crash on reading it (JSONDecodeError) instead of restarting the ranks. A rank stopped mid-write (here,
    between writing and moving the file into place) leaves no error file, which torchrun reads as "no reply"."""
    def stopped(*args):
        raise SystemExit("SIGTERM")

    monkeypatch.setattr(os, "replace", stopped)
    with pytest.raises(SystemExit):
        fail(tmp_path / "error.json", RuntimeError("gloo lost its peer"))
    assert not (tmp_path / "error.json").exists()
    assert ProcessFailure(0, 1234, -15, str(tmp_path / "error.json")).message  # torchrun's own reading: no raise


def test_nothing_is_written_outside_a_launch(tmp_path, monkeypatch):
    monkeypatch.delenv("TORCHELASTIC_ERROR_FILE", raising=False)
    monkeypatch.chdir(tmp_path)
    record_failure(RuntimeError("not a rank"))
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("entry, argv, error", [
    ("train", ["--global-batch-size", "3"], "WorkshopError: Global batch 3 does not divide into 2 processes."),
    ("parallel_demos", ["fsdp", "--options", "[1]"], "WorkshopError: --options must be a JSON object."),
    ("comm_model", ["--repeats", "0"], "WorkshopError: Sizes and repeats must be positive"),
])
def test_every_entry_torchrun_starts_records_the_error_that_ends_a_rank(tmp_path, monkeypatch, entry, argv, error):
    import importlib

    path = tmp_path / "error.json"
    for name, value in {"TORCHELASTIC_ERROR_FILE": str(path), "RANK": "1", "WORLD_SIZE": "2"}.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(SystemExit) as stop:
        importlib.import_module(f"workshop_utils.{entry}").main(argv)
    assert stop.value.code == 2, "still one line and exit status 2"
    message = json.loads(path.read_text())["message"]
    assert message["message"].startswith(error) and message["extraInfo"]["rank"] == 1
    assert message["extraInfo"]["fix"], "a WorkshopError's fix is kept for the one line"


# ---------------------------------------------------------------- the root cause, from what a run left


def test_a_survivors_lost_connection_is_a_consequence_even_when_recorded_first(tmp_path):
    survivor = fail(tmp_path / "0.json", RuntimeError(GLOO_LOST))  # recorded first: it closed faster
    culprit = fail(tmp_path / "1.json", ValueError("bad label 11 in batch 7"))
    cause = root_cause(report({0: (1, survivor), 1: (1, culprit)}), world_size=2)
    assert (cause.rank, cause.kind) == (1, "exception")
    assert cause.line == ("rank 1 failed first: ValueError: bad label 11 in batch 7 "
                          "(then rank 0 lost its connection to it)")
    assert cause.last_lines[-1] == "ValueError: bad label 11 in batch 7"
    assert any("raise err" in line for line in cause.last_lines), "the rank's own traceback"


@pytest.mark.parametrize("message", [
    "DistBackendError: NCCL error in: ProcessGroupNCCL.cpp:1970, remote process exited or there was a network "
    "error, NCCL version 2.21.5",
    "ncclRemoteError: A call failed possibly due to a network error or a remote process exiting prematurely.",
    "NCCL communicator was aborted on rank 0.",
    "[/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:545] Read error [127.0.0.1]:4006: Connection reset by peer",
    "[/pytorch/torch/csrc/distributed/c10d/TCPStore.cpp:122] failed to recv, got 0 bytes",
])
def test_nccl_gloo_and_store_errors_of_a_lost_peer_are_consequences(tmp_path, message):
    survivor = fail(tmp_path / "0.json", RuntimeError(message))
    culprit = fail(tmp_path / "2.json", KeyError("label"))
    cause = root_cause(report({0: (1, survivor), 2: (1, culprit)}), world_size=3)
    assert cause.rank == 2 and cause.line.startswith("rank 2 failed first: KeyError: 'label' (then rank 0 ")


def test_the_earliest_of_two_failures_of_their_own_wins(tmp_path):
    first = fail(tmp_path / "2.json", RuntimeError("disk full"))
    later = fail(tmp_path / "0.json", RuntimeError("shape mismatch"))
    cause = root_cause(report({0: (1, later), 2: (1, first)}), world_size=4)
    assert cause.rank == 2 and cause.line == ("rank 2 failed first: RuntimeError: disk full "
                                              "(then rank 0 failed too: RuntimeError: shape mismatch)")


def test_the_same_error_on_every_rank_is_said_once(tmp_path):
    files = {rank: fail(tmp_path / f"{rank}.json", wu.WorkshopError("Global batch 3 does not divide into 2.",
                                                                    "use a multiple of 2."))
             for rank in (0, 1)}
    cause = root_cause(report({rank: (1, path) for rank, path in files.items()}), world_size=2)
    assert cause.line == "every rank failed with the same error: WorkshopError: Global batch 3 does not divide into 2"
    assert cause.fix == "use a multiple of 2.", "a WorkshopError's own fix"


def test_a_rank_killed_by_a_signal_is_named_with_its_signal(tmp_path):
    survivor = fail(tmp_path / "0.json", RuntimeError(GLOO_LOST))
    cause = root_cause(report({0: (-15, survivor), 1: (-9, None), 2: (-15, None)}), world_size=3)
    assert (cause.rank, cause.kind) == (1, "signal")
    assert cause.line == ("rank 1 failed first: killed by SIGKILL, with no Python error (then rank 0 lost its "
                          "connection to it, rank 2 was stopped by torchrun with SIGTERM)")
    assert "out-of-memory killer" in cause.fix


GLOO_ABORT = ["terminate called after throwing an instance of 'gloo::EnforceNotMet'",
              "  what():  [enforce fail at /pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:446] "
              "op.preamble.length <= op.nbytes. 128 vs 8"]


def test_an_abort_is_named_with_what_native_code_printed_as_it_gave_up():
    lines = ["[rank0]: step 1 of 2", *GLOO_ABORT, *report({1: (-6, None), 0: (-15, None)})]
    cause = root_cause(lines, world_size=2)
    assert cause.line == ("rank 1 failed first: killed by SIGABRT, with no Python error; it printed: failed check: "
                          "op.preamble.length <= op.nbytes. 128 vs 8 (then rank 0 was stopped by torchrun with "
                          "SIGTERM)")


def test_an_abort_reads_the_ranks_own_output_where_it_was_kept_apart():
    own = {0: "step 1\nterminate called after throwing an instance of 'std::runtime_error'\n  what():  rank 0's "
              "own reason\n", 1: "  what():  another rank's reason"}
    cause = root_cause(report({0: (-6, None), 1: (-15, None)}), world_size=2, rank_output=own)
    assert "; it printed: rank 0's own reason (then" in cause.line


def test_an_abort_is_not_given_an_unlabelled_line_another_crashed_rank_may_have_printed():
    cause = root_cause([*GLOO_ABORT, *report({1: (-6, None), 0: (-11, None)})], world_size=2)
    assert cause.rank == 0 and "; it printed" not in cause.line


@pytest.mark.parametrize("printed, says", [
    (["  what():  boom\r 45%|####", "x"], "boom"),  # a progress bar's carriage return is not kept
    (["\x1b[31m  what():  boom\x1b[0m"], "boom"),
    (["  what():  boom\u2028second line"], "boom"),
    (["free(): invalid pointer"], "free(): invalid pointer"),
    (["double free or corruption (!prev)"], "double free or corruption (!prev)"),
    (["*** stack smashing detected ***: terminated"], "*** stack smashing detected ***: terminated"),
    (["python: ext.c:12: step: Assertion `n > 0' failed."], "python: ext.c:12: step: Assertion `n > 0' failed"),
    (["F1130 07:05:48.1 55 file.cc:762] Check failed: a == b"], "Check failed: a == b"),
    (["terminate called without an active exception"], "terminate called without an active exception"),
])
def test_what_a_crashed_rank_printed_is_one_clean_line(printed, says):
    cause = root_cause([*printed, *report({1: (-6, None), 0: (-15, None)})], world_size=2)
    assert f"; it printed: {says} (then" in cause.line and "\n" not in cause.message()


@pytest.mark.parametrize("lines, failures", [
    (["tip: call e.what(): to see the message"], {1: (-6, None), 0: (-15, None)}),  # a print, not native code
    (["print('Check failed: 3 of 4')"], {1: (-6, None), 0: (-15, None)}),
    (GLOO_ABORT, {1: (-9, None), 0: (-15, None)}),  # SIGKILL and SIGTERM leave no chance to print
    (GLOO_ABORT, {0: (-15, None), 1: (-15, None)}),
    ([*GLOO_ABORT, "[W] Worker group FAILED. 3/3 attempts left; will restart worker group"],
     {1: (-6, None), 0: (-15, None)}),  # printed by an earlier attempt
    (["Fatal Python error: Segmentation fault"], {1: (-6, None), 2: (1, None)}),  # rank 2 failed by itself
])
def test_a_line_the_crashed_rank_may_not_have_printed_is_not_given_to_it(lines, failures):
    cause = root_cause([*lines, *report(failures)], world_size=3)
    assert "; it printed" not in cause.line


def test_torchruns_own_report_is_not_read_as_what_a_rank_printed(tmp_path):
    other = fail(tmp_path / "2.json", RuntimeError("INTERNAL: Check failed: a == b in my_ext"))
    cause = root_cause(report({1: (-11, None), 2: (1, other)}), world_size=3)
    assert "; it printed" not in cause.line


def test_where_each_ranks_output_was_kept_apart_no_other_text_is_read():
    own = {1: "step 3\n", 0: "  what():  rank 0's reason"}
    cause = root_cause(["  what():  an unlabelled line", *report({1: (-6, None), 0: (-15, None)})], world_size=2,
                       rank_output=own)
    assert "; it printed" not in cause.line


def test_a_signal_with_nothing_native_printed_says_no_more():
    cause = root_cause(["[rank0]: step 1 of 2", *report({1: (-6, None), 0: (-15, None)})], world_size=2)
    assert cause.line == ("rank 1 failed first: killed by SIGABRT, with no Python error (then rank 0 was stopped "
                          "by torchrun with SIGTERM)")


def test_an_exit_status_without_an_exception_is_named(tmp_path):
    cause = root_cause(report({1: (3, None), 0: (-15, None)}), world_size=2)
    assert cause.line == ("rank 1 failed first: it exited with status 3 without a Python error "
                          "(then rank 0 was stopped by torchrun with SIGTERM)")


def test_out_of_memory_is_named_as_such(tmp_path):
    oom = fail(tmp_path / "1.json", RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB. GPU 1 has a total "
                                                 "capacity of 79.10 GiB of which 1.02 GiB is free."))
    cause = root_cause(report({1: (1, oom), 0: (-15, None)}), world_size=2)
    assert cause.kind == "out of memory" and cause.line.startswith("rank 1 ran out of memory first: RuntimeError: "
                                                                   "CUDA out of memory. Tried to allocate 2.00 GiB")
    assert "smaller batch per rank" in cause.fix


def test_a_collective_whose_partners_left_is_named_with_the_rank_that_waited(tmp_path):
    waiting = tmp_path / "0.json"  # written by torchrun's own ``record``: no exact time, no rank
    waiting.write_text(json.dumps({"message": {"message": f"RuntimeError: {GLOO_LOST}", "extraInfo": {
        "timestamp": "1764052012", "py_callstack": BARRIER_TRACEBACK}}}))
    cause = root_cause(report({0: (1, waiting)}), world_size=3)  # ranks 1 and 2 ended with status 0
    assert cause.kind == "mismatched collective"
    assert cause.line == ("rank 0 waited in barrier() while ranks 1, 2 had already finished and left: a collective "
                          "that only some ranks run (its error: RuntimeError: Connection closed by peer "
                          "[127.0.0.1]:7080)")
    assert "on every rank, in the same order" in cause.fix
    assert cause.last_lines[-3:-1] == ['  File "/work/my_train_ddp.py", line 97, in main', "    dist.barrier()"]


def test_a_job_stopped_from_outside_is_named_by_its_signal():
    cause = root_cause(report({0: (-15, None), 1: (-15, None)}), world_size=2)
    assert (cause.rank, cause.kind) == (0, "signal") and cause.line.startswith("rank 0 failed first: killed by SIGTERM")
    assert "a scheduler's time limit or pre-emption" in cause.fix


def test_lost_connections_with_no_rank_gone_are_no_mismatched_collective(tmp_path):
    files = {rank: fail(tmp_path / f"{rank}.json", RuntimeError(GLOO_LOST)) for rank in (0, 1)}
    cause = root_cause(report({rank: (1, path) for rank, path in files.items()}), world_size=2)
    assert cause.kind == "exception" and cause.rank == 0


def test_the_reports_of_several_agents_and_an_agent_without_one_are_read(tmp_path, monkeypatch):
    logs = tmp_path / "logs"
    monkeypatch.setenv("RANK", "3")
    for attempt, error in ((0, "the first attempt's error"), (1, "rank 3 fell over")):  # the newest attempt counts
        folder = logs / "run_abc" / f"attempt_{attempt}" / "1"
        folder.mkdir(parents=True)
        fail(folder / "error.json", RuntimeError(error))
    survivor = fail(tmp_path / "0.json", RuntimeError(GLOO_LOST))
    lines = report({0: (1, survivor), 1: (-15, None)}, label="[agent 0] ")  # agent 1 was killed before it reported
    cause = root_cause(lines, world_size=4, log_dir=logs)
    assert cause.rank == 3 and cause.line.startswith("rank 3 failed first: RuntimeError: rank 3 fell over (then ")


def test_a_run_that_left_no_failure_has_no_root_cause(tmp_path):
    assert root_cause(["torchrun: error: unrecognized arguments: --bogus"], world_size=2, log_dir=tmp_path) is None


def test_a_signals_last_lines_come_from_the_ranks_own_output():
    printed = ["[rank1]: step 4 of 10", "[rank0]: step 4 of 10", "[host7 rank 1] loading shard 12"]
    lines = [*printed, *report({1: (-11, None)})]
    cause = root_cause(lines, world_size=2)
    assert cause.line.startswith("rank 1 failed first: killed by SIGSEGV")
    assert cause.last_lines == ["step 4 of 10", "loading shard 12"]


def test_postmortem_prints_the_line_and_the_last_lines_from_a_log_dir(tmp_path, capsys, monkeypatch):
    attempt = tmp_path / "logs" / "123_x" / "attempt_0"
    files = {}
    for rank, err in ((1, ValueError("bad label 11")), (0, RuntimeError(GLOO_LOST))):
        monkeypatch.setenv("RANK", str(rank))
        (attempt / str(rank)).mkdir(parents=True)
        files[rank] = fail(attempt / str(rank) / "error.json", err)
    output = tmp_path / "torchrun.out"
    output.write_text("\n".join(report({rank: (1, path) for rank, path in files.items()})))
    postmortem.main([str(tmp_path / "logs"), "--output", str(output), "--world-size", "2"])
    printed = capsys.readouterr().out.splitlines()
    assert printed[0] == ("error: rank 1 failed first: ValueError: bad label 11 (then rank 0 lost its connection to "
                          "it). Fix: read rank 1's own traceback (its last lines are shown): the other ranks' errors "
                          "are consequences of it.")
    assert printed[1] == "--- the last lines of rank 1, the first to fail:"
    assert printed[-1] == "ValueError: bad label 11"
    with pytest.raises(SystemExit) as stop:
        postmortem.main([str(tmp_path / "empty")])
    assert stop.value.code == 1 and "no rank left an error file" in capsys.readouterr().out


# ---------------------------------------------------------------- real launches (gloo, CPU)


@pytest.fixture
def failing_ranks(monkeypatch):
    """Launch ``tests/failing_ranks.py HOW RANK`` on ``nproc`` gloo ranks; the WorkshopError it fails with."""
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(TESTS), os.environ.get("PYTHONPATH")])))

    def launch(how: str, rank: int, nproc: int = 2):
        return launch_torchrun("failing_ranks", [how, str(rank)], nproc, device="cpu", echo=False, timeout_s=120,
                               threads=1)

    return launch


def one_line(err: pytest.ExceptionInfo) -> str:
    text = str(err.value)
    assert isinstance(err.value, RankFailed) and "\n" not in text and " Fix: " in text, text
    return text


@pytest.mark.slow
@pytest.mark.parametrize("rank, nproc", [(1, 2), (2, 3)], ids=["rank-1-of-2", "last-rank-of-3"])
def test_a_crash_is_named_with_the_crashed_ranks_own_error(failing_ranks, rank, nproc):
    with pytest.raises(RankFailed) as err:
        failing_ranks("crash", rank, nproc)
    others = ", ".join(str(r) for r in range(nproc) if r != rank)
    lost = f"rank {others} lost its" if nproc == 2 else f"ranks {others} lost their"
    assert one_line(err).startswith(f"torchrun exited with status 1; rank {rank} failed first: RuntimeError: rank "
                                    f"{rank} fell over in step 2 (then {lost} connection to it). Fix: ")
    assert err.value.cause.last_lines[-1] == f"RuntimeError: rank {rank} fell over in step 2"


@pytest.mark.slow
@pytest.mark.parametrize("collective", ["barrier", "all_reduce"])
def test_a_collective_on_rank_0_only_is_named_as_mismatched(failing_ranks, collective):
    with pytest.raises(RankFailed) as err:
        failing_ranks(collective, 0)
    assert f"; rank 0 waited in {collective}() while rank 1 had already finished and left: a collective that only " \
           "some ranks run (its error: RuntimeError: " in one_line(err)
    assert err.value.cause.kind == "mismatched collective"


@pytest.mark.slow
def test_a_rank_killed_by_a_signal_is_named_with_the_signal(failing_ranks):
    with pytest.raises(RankFailed) as err:
        failing_ranks("kill", 1)
    assert "; rank 1 failed first: killed by SIGKILL, with no Python error (then rank 0 " in one_line(err)


@pytest.mark.slow
def test_an_out_of_memory_on_one_rank_is_named_as_such(failing_ranks):
    with pytest.raises(RankFailed) as err:
        failing_ranks("oom", 1)
    assert re.search(r"; rank 1 ran out of memory first: RuntimeError: .*DefaultCPUAllocator: can't allocate memory",
                     one_line(err))


@pytest.mark.slow
def test_a_clean_run_still_passes(failing_ranks):
    launched = failing_ranks("clean", -1)
    assert launched.returncode == 0 and launched.cause is None
    # Two ranks print into one pipe, so their lines may run together: look for each rank's words, not whole lines.
    assert sorted(re.findall(r"rank \d: done", "\n".join(launched.lines))) == ["rank 0: done", "rank 1: done"]


TINY = dict(model="simplecnn", batch_size=8, steps=4, train_size=32, test_size=16, warmup_steps=0, device="cpu")
# What rank 0 meets after rank 1 fails is a race: its next all-reduce finds the peer gone, or torchrun stops it
# first. Either is a consequence, and the line names rank 1 as the cause in both.
INJECTED = (r"rank 1 failed first: InjectedFailure: injected failure on rank 1 at step 2 \(--fail-at-step\) "
            r"\(then rank 0 (lost its connection to it|was stopped by torchrun with SIGTERM)\)\. "
            r"Fix: read rank 1's own traceback")


@pytest.mark.slow
def test_the_training_command_names_the_rank_that_failed(capsys):
    with pytest.raises(RankFailed) as err:
        launch_training(2, fail_at_step=2, timeout_s=200, threads=1, **TINY)
    assert re.search(f"torchrun exited with status 1; {INJECTED}", one_line(err)), one_line(err)
    shown = capsys.readouterr().out  # streamed, then the failing rank's own last lines
    assert "--- the last lines of rank 1, the first to fail:\n" in shown
    assert shown.rstrip().endswith("InjectedFailure: injected failure on rank 1 at step 2 (--fail-at-step)")


@pytest.mark.slow
def test_agents_of_several_nodes_name_the_rank_that_failed():
    with pytest.raises(RankFailed) as err:
        launch_nodes(2, 1, fail_at_step=2, timeout_s=200, threads=1, echo=False, **TINY)
    assert re.search(INJECTED, one_line(err)), one_line(err)


# Loaded by every Python process of the job through PYTHONPATH: rank 1's all-reduces fail.
RANK_1_ALL_REDUCE_FAILS = """
import os

if os.environ.get("RANK") == "1":
    import torch.distributed as dist

    def _failing(*args, **kwargs):
        raise RuntimeError("rank 1's all-reduce fell over")

    dist.all_reduce = _failing
"""


@pytest.mark.slow
def test_notebook_05s_demos_name_the_rank_that_failed(tmp_path, monkeypatch):
    (tmp_path / "sitecustomize.py").write_text(RANK_1_ALL_REDUCE_FAILS)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(tmp_path), os.environ.get("PYTHONPATH")])))
    with pytest.raises(RankFailed) as err:
        wu.launch_demo("collectives-time", 2, "cpu", timeout_s=120, echo=False, max_mib=1, repeats=2)
    assert one_line(err).startswith("'collectives-time' on 2 cpu ranks: torchrun exited with status 1; rank 1 failed "
                                    "first: RuntimeError: rank 1's all-reduce fell over (then rank 0 ")


def test_the_same_error_on_every_rank_blames_no_rank_first(tmp_path):
    """An import every rank fails on is no rank's fault more than another's: no "first", no "consequences"."""
    files = {rank: fail(tmp_path / f"{rank}.json", ModuleNotFoundError("No module named 'wandb'")) for rank in (0, 1, 2)}
    cause = root_cause(report({rank: (1, path) for rank, path in files.items()}), world_size=3)
    assert cause.line == "every rank failed with the same error: ModuleNotFoundError: No module named 'wandb'"
    assert "consequences" not in cause.fix and "every rank met it" in cause.fix
