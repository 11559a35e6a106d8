"""Which rank failed first, and with what: the root cause of a failed multi-process run.

When one rank of a gloo or NCCL job fails, the others fail a moment later in their next
collective ("Connection closed by peer", NCCL's "remote process exited"), or torchrun stops
them with SIGTERM. Every rank then leaves an error, and the lowest rank's is rarely the cause.

torchrun's own remedy is an error file per worker: an entry point decorated with ``record``
writes its uncaught exception, with a time stamp, to the file torchrun names in
TORCHELASTIC_ERROR_FILE, and torchrun reports the earliest as the "root cause". Two things
make that pick unreliable: the stamp is in whole seconds, and a survivor's secondary error
usually lands in the same second as the failure it reacts to. So the kit's entries record
with ``record_failures`` (the same file, plus the time to the microsecond, the rank and a
WorkshopError's fix), and ``root_cause`` sets the secondary errors aside before it orders the
rest by time. A rank killed by a signal writes no file; torchrun's report gives its signal.
"""

from __future__ import annotations

import faulthandler
import json
import os
import re
import signal
import time
import traceback
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

import torch
from torch.distributed.elastic.multiprocessing.errors import ErrorHandler, record

from ..system.errors import WorkshopError
from ..system.results import write_json

ERROR_FILE_VARIABLE = "TORCHELASTIC_ERROR_FILE"  # torchrun sets it in each worker
LAST_LINES = 6

# What a rank says when another rank's failure stopped it: gloo's closed sockets, the TCPStore
# losing its host, NCCL's remote errors and aborted communicators.
LOST_PEER = re.compile(r"Connection (closed|reset) by peer|Broken pipe|failed to recv, got 0 bytes|"
                       r"remote process exit|ncclRemoteError|NCCL communicator was aborted", re.IGNORECASE)
TIMED_OUT = re.compile(r"Watchdog caught collective operation timeout|collective operation timeout|"
                       r"Timed out waiting|\bWork\w* timed out", re.IGNORECASE)
OUT_OF_MEMORY = re.compile(r"out of memory|OutOfMemoryError|can't allocate memory|not enough memory|"
                           r"CUBLAS_STATUS_ALLOC_FAILED|std::bad_alloc|^MemoryError", re.IGNORECASE)
# The collective a rank waited in: its frame in torch.distributed, or NCCL's name for the operation.
COLLECTIVE_FRAME = re.compile(r"distributed_c10d\.py\", line \d+, in (\w+)")
NCCL_OPERATION = re.compile(r"OpType=(\w+)")
NOT_COLLECTIVES = {"wrapper", "_get_default_group", "get_rank", "get_world_size", "destroy_process_group"}
# Where a C++ error was thrown, and gloo's advice after it: noise in a one-line message.
SOURCE_LOCATION = re.compile(r"\[[^\]\s]*\.(?:cc|cpp|h|hpp|cu):\d+\]\s*")
ENFORCE_AT = re.compile(r"\[enforce fail at [^\]]*\]\s*")
GLOO_ADVICE = re.compile(r"\.?\s*This is typically caused by .*$")
TORCH_FRAMES = f'File "{Path(torch.__file__).parent}{os.sep}'
# What native code prints as it aborts: the C++ exception's what(), a failed check, Python's fatal error.
NATIVE_REASON = re.compile(
    r"^\s*what\(\):\s*(\S.*)|^(terminate called \S.*)|(?:^|\] )(Check failed: .*)|^(Fatal Python error: .*)|"
    r"^((?:free|malloc|realloc|munmap_chunk)\(\): .*|double free or corruption.*|corrupted size vs\. prev_size.*|"
    r"\*\*\* stack smashing detected \*\*\*.*|.*: Assertion `.*' failed\.)")
WEAK_REASONS = ("terminate called", "Fatal Python error")  # they come before, or instead of, the line saying why
RESTARTED = "will restart worker group"  # torchrun's agent: what came before belongs to an earlier attempt
ESCAPES = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")

MISMATCHED_COLLECTIVE_FIX = ("run every collective (an all-reduce, a barrier, the DDP model's forward and backward) "
                             "on every rank, in the same order: look for one that only some ranks run, e.g. inside "
                             "`if rank == 0:`.")
SIGNAL_FIXES = {
    "SIGKILL": "a SIGKILL leaves no traceback: it is what the kernel's out-of-memory killer sends (check `dmesg`, or "
               "sacct's MaxRSS on Slurm, and use a smaller batch or fewer DataLoader workers), or a scheduler or a "
               "user stopping the process at once.",
    "SIGSEGV": "native code crashed (a C++ or CUDA extension, a library, the driver): the rank's last lines show "
               "where; run that step in one process to reproduce it.",
    "SIGABRT": "native code aborted (a failed C++ check, NCCL's watchdog): the rank's last lines say why.",
    "SIGTERM": "something outside the run stopped it: a scheduler's time limit or pre-emption, or a user.",
}
NATIVE_CRASHES = ("SIGABRT", "SIGSEGV", "SIGBUS", "SIGILL", "SIGFPE")
SIGNAL_FIXES["SIGBUS"] = SIGNAL_FIXES["SIGILL"] = SIGNAL_FIXES["SIGFPE"] = SIGNAL_FIXES["SIGSEGV"]
SIGNAL_FIXES["SIGINT"] = SIGNAL_FIXES["SIGHUP"] = SIGNAL_FIXES["SIGTERM"]


# ---------------------------------------------------------------- in every rank: writing the error file


def record_failure(err: BaseException, path: str | os.PathLike | None = None) -> None:
    """Write ``err`` to this rank's error file (torchrun's format, plus the exact time, rank and fix).

    Nothing happens outside a launch (no TORCHELASTIC_ERROR_FILE). Call it where an entry turns an
    exception into an exit status itself; ``record_failures`` does it for the exceptions it sees.
    """
    path = path or os.environ.get(ERROR_FILE_VARIABLE)
    if not path:
        return
    now = time.time()
    fixable = isinstance(err, WorkshopError)
    data = {"message": {"message": f"{type(err).__name__}: {err.problem if fixable else err}",
                        "extraInfo": {"py_callstack": "".join(traceback.format_exception(err)),
                                      "timestamp": str(int(now)),  # what torchrun reads: whole seconds
                                      "time": now, "rank": _rank_from_env(), "fix": err.fix if fixable else None}}}
    # Whole or not at all: torchrun stops the other ranks with SIGTERM while they write, and its agent reads an
    # empty error file as a crash of its own (JSONDecodeError), which ends the run instead of restarting it.
    write_json(data, path)


def _rank_from_env() -> int | None:
    text = os.environ.get("RANK", os.environ.get("SLURM_PROCID", ""))
    return int(text) if text.strip().isdigit() else None


class RankErrorHandler(ErrorHandler):
    """torchrun's error handler, writing what ``record_failure`` writes."""

    def initialize(self) -> None:
        # A launched rank dumps a native crash's Python stack into its output; a fault handler already set
        # (pytest's, a user's) stays as it is.
        if self._get_error_file_path() and not faulthandler.is_enabled():
            super().initialize()

    def record_exception(self, e: BaseException) -> None:
        record_failure(e)


def record_failures(main):
    """Decorate an entry's ``main``: an exception that ends a rank lands in its error file (torchrun's ``record``).

    Put it inside ``exit_on_workshop_error``, so that a WorkshopError is recorded before it becomes one line.
    """
    return record(main, error_handler=RankErrorHandler())


# ---------------------------------------------------------------- after the run: reading what the ranks left


@dataclass
class RankFailure:
    """One rank that ended badly, from torchrun's report and the rank's error file."""

    rank: int
    exitcode: int | None = None  # None: torchrun's report did not say (no report, or no entry for this rank)
    error: str | None = None  # "RuntimeError: ..." from its error file; None when it left none
    traceback: str = ""
    time: float | None = None
    fix: str | None = None  # a WorkshopError's own fix

    @property
    def signal(self) -> str | None:
        if self.exitcode is None or self.exitcode >= 0:
            return None
        try:
            return signal.Signals(-self.exitcode).name
        except ValueError:
            return f"signal {-self.exitcode}"

    @property
    def consequence(self) -> tuple[str, str] | None:
        """How another rank's failure stopped this one, said of one rank and of several; None: a failure of its own."""
        if self.error is not None:
            if LOST_PEER.search(self.error):
                return "lost its connection to it", "lost their connection to it"
            if TIMED_OUT.search(self.error):
                return "timed out waiting for it", "timed out waiting for it"
            return None
        if self.signal == "SIGTERM":
            return "was stopped by torchrun with SIGTERM", "were stopped by torchrun with SIGTERM"
        return None

    @property
    def collective(self) -> str | None:
        """The collective this rank was in when it failed, as ``barrier()``; None when none shows."""
        frames = [name for name in COLLECTIVE_FRAME.findall(self.traceback) if name not in NOT_COLLECTIVES]
        if frames:
            return f"{frames[-1]}()"
        operation = NCCL_OPERATION.search(self.error or "")
        return operation.group(1).lower() if operation else None

    def last_lines(self, count: int = LAST_LINES) -> list[str]:
        """The end of its traceback, without ^^^ markers, and without PyTorch's own frames when the caller's show."""
        shown = [line for line in self.traceback.splitlines() if line.strip() and not set(line.strip()) <= set("^~")]
        own, inside_torch = [], False
        for line in shown:
            if line.startswith("  File "):
                inside_torch = line.lstrip().startswith(TORCH_FRAMES)
            elif not line.startswith("    "):  # the exception's own line
                inside_torch = False
            if not inside_torch:
                own.append(line)
        return (own if any(line.startswith("  File ") for line in own) else shown)[-count:]


@dataclass
class RootCause:
    """The rank that failed first and why, in one line with its fix; the other failures as consequences."""

    rank: int
    kind: str  # "exception", "out of memory", "signal", "exit status" or "mismatched collective"
    line: str
    fix: str
    last_lines: list[str] = field(default_factory=list)
    first: RankFailure | None = field(default=None, repr=False)
    others: list[RankFailure] = field(default_factory=list, repr=False)

    def message(self) -> str:
        """The one line and its fix, as a WorkshopError shows them."""
        return f"{self.line}. Fix: {self.fix}"

    def last_lines_text(self) -> str:
        """The first failing rank's own last lines, under a heading (empty when it left none)."""
        if not self.last_lines:
            return ""
        role = "left waiting" if self.kind == "mismatched collective" else "the first to fail"
        return "\n".join([f"--- the last lines of rank {self.rank}, {role}:", *self.last_lines])


class RankFailed(WorkshopError):
    """A launch failed; ``cause`` is its RootCause."""

    def __init__(self, problem: str, cause: RootCause):
        super().__init__(problem, cause.fix)
        self.cause = cause


# torchrun's report ("Root Cause (first observed failure)"): one block of fields per failed rank,
# each line possibly behind a label the launcher added ("[agent 1] ").
REPORT_FIELD = re.compile(r"^(?P<label>.*?)\s+(?P<key>time|rank|exitcode|error_file)\s*:\s(?P<value>.*)$")
REPORT_KEYS = re.compile(r"(?:time|rank|exitcode|error_file)\s*:")
REPORT_RANK = re.compile(r"^(\d+) \(local_rank: \d+\)")
REPORT_EXITCODE = re.compile(r"^(-?\d+) \(pid: \d+\)")
# A line a rank printed behind a prefix that names it: PyTorch's "[rank1]: " on an uncaught exception,
# the job scripts' "[host rank 1] ".
RANK_PREFIX = re.compile(r"\[rank(\d+)\]:\s?(.*)$|\[[^\s\[\]]+ rank (\d+)\] (.*)$")  # no \S+: linear on "[[[["


def torchrun_report(lines: list[str]) -> dict[int, RankFailure]:
    """The failed ranks in torchrun's report(s) of a run's output: exit code, time, error file read."""
    failures: dict[int, RankFailure] = {}
    blocks: dict[str, dict] = {}
    for line in lines:
        found = REPORT_FIELD.match(line) if REPORT_KEYS.search(line) else None  # the match is slow on long lines
        if not found:
            continue
        label, key, value = found.group("label", "key", "value")
        if key == "time":
            blocks[label] = {"time": value.strip()}
            continue
        block = blocks.get(label)
        if block is None:
            continue
        block[key] = value.strip()
        if key != "error_file":
            continue
        del blocks[label]
        rank, code = REPORT_RANK.match(block.get("rank", "")), REPORT_EXITCODE.match(block.get("exitcode", ""))
        if not (rank and code):
            continue
        failure = RankFailure(int(rank.group(1)), int(code.group(1)), time=_report_time(block["time"]))
        _read_error_file(failure, block["error_file"])
        failures[failure.rank] = failure
    return failures


def _report_time(text: str) -> float | None:
    try:
        return datetime.strptime(text, "%Y-%m-%d_%H:%M:%S").timestamp()
    except ValueError:
        return None


def _read_error_file(failure: RankFailure, path) -> dict | None:
    """Fill ``failure`` from an error file (the kit's or plain torchrun's); its extra fields, None without one."""
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None
    message = data.get("message")
    extra = message.get("extraInfo", {}) if isinstance(message, dict) else {}
    text = message.get("message") if isinstance(message, dict) else message
    if not isinstance(text, str):
        return None
    stamp = extra.get("time", extra.get("timestamp", data.get("timestamp")))
    failure.error = " ".join(text.split())
    failure.traceback = str(extra.get("py_callstack") or "")
    failure.time = float(stamp) if stamp is not None else failure.time
    failure.fix = extra.get("fix")
    return extra


def error_files(log_dir) -> dict[int, RankFailure]:
    """The failures in a torchrun ``--log-dir`` (every agent's newest attempt), for when its report is missing.

    torchrun lays it out as ``<run id>_<random>/attempt_<n>/<local rank>/error.json``, one run folder per agent.
    """
    failures: dict[int, RankFailure] = {}
    for agent in Path(log_dir).iterdir() if Path(log_dir).is_dir() else ():
        attempts = sorted(agent.glob("attempt_*"), key=lambda p: int(p.name.split("_")[-1]))
        for path in sorted(attempts[-1].glob("*/error.json")) if attempts else ():
            failure = RankFailure(int(path.parent.name))
            extra = _read_error_file(failure, path)
            if extra is not None:  # the kit's files name the global rank; torchrun's own only the local one
                failure.rank = int(extra["rank"]) if extra.get("rank") is not None else failure.rank
                failures[failure.rank] = failure
    return failures


def rank_lines(lines: list[str], rank: int) -> list[str]:
    """What ``rank`` printed, where its lines carry a prefix naming it."""
    own = []
    for line in lines:
        found = RANK_PREFIX.search(line)
        if found and int(found.group(1) or found.group(3)) == rank:
            own.append(found.group(2) if found.group(1) is not None else found.group(4))
    return own


def root_cause(lines: list[str], world_size: int | None = None, log_dir=None,
               rank_output: dict[int, str] | None = None) -> RootCause | None:
    """The rank whose failure came first, and how it failed, from a failed launch; None when nothing says.

    ``lines``: the run's output (torchrun's report at its end). ``log_dir``: torchrun's --log-dir, read
    when the report is missing. ``rank_output``: each rank's own output, where the launcher kept it
    apart. Errors that another rank's failure caused (a lost connection, torchrun's SIGTERM) are
    consequences; among the rest the earliest wins. With only consequences, and ranks that had
    already left, the rank was waiting in a collective the others never ran.
    """
    failures = torchrun_report(lines)
    if log_dir is not None:
        for rank, failure in error_files(log_dir).items():
            failures.setdefault(rank, failure)
    if not failures:
        return None
    own = [f for f in failures.values() if f.consequence is None]
    if own:
        first = min(own, key=_order)
        return _failed_first(first, [f for f in failures.values() if f is not first], lines, rank_output)
    return _left_waiting(failures, world_size, lines, rank_output)


def _order(failure: RankFailure):
    return (failure.time if failure.time is not None else float("inf"), failure.rank)


def _own_lines(failure: RankFailure, lines, rank_output) -> list[str]:
    if failure.traceback:
        return failure.last_lines()
    text = (rank_output or {}).get(failure.rank)
    printed = text.splitlines() if text else rank_lines(lines, failure.rank)
    return [line for line in printed if line.strip()][-LAST_LINES:]


def _native_reason(failure: RankFailure, others: list[RankFailure], lines, rank_output) -> str | None:
    """What a rank that native code crashed said last as it gave up (gloo's failed check, say), shortened."""
    if failure.signal not in NATIVE_CRASHES:  # SIGKILL, SIGTERM: the process had no chance to print
        return None
    lines = [line for line in lines if isinstance(line, str)]
    restarts = [i for i, line in enumerate(lines) if RESTARTED in line]
    lines = lines[restarts[-1] + 1 if restarts else 0:]
    if rank_output is not None:
        text = rank_output.get(failure.rank)
        printed = text.splitlines() if isinstance(text, str) else []
    else:
        printed = rank_lines(lines, failure.rank)
        # Native code writes no "[rankN]:" in front: the unlabelled lines before torchrun's report are this
        # rank's only if every other failure was a consequence of it.
        if not any(map(NATIVE_REASON.search, printed)) and all(other.consequence for other in others):
            report = next((i for i, line in enumerate(lines) if "ChildFailedError" in line), len(lines))
            printed = [line for line in lines[:report] if not RANK_PREFIX.search(line)]
    printed = [ESCAPES.sub("", line) for line in printed]
    reasons = [next(g for g in found.groups() if g) for found in map(NATIVE_REASON.search, printed) if found]
    best = [r for r in reasons if not r.startswith(WEAK_REASONS)] or reasons
    if not best:
        return None
    said = (ESCAPES.sub("", best[-1]).splitlines() or [""])[0]  # a progress bar's \r, a colour, a line break
    return _short(ENFORCE_AT.sub("failed check: ", said), 160) or None


def _short(error: str, limit: int = 240) -> str:
    """An error on part of one line: no C++ source location, no gloo advice, at most ``limit`` characters."""
    error = GLOO_ADVICE.sub("", SOURCE_LOCATION.sub("", error)).strip().rstrip(".")
    return error if len(error) <= limit else error[:limit - 1].rstrip() + "…"


def _after(first: RankFailure, others: list[RankFailure]) -> str:
    """The other failures, as consequences of the first: " (then rank 0 lost its connection to it)"."""
    grouped: dict[tuple[str, str], list[int]] = {}
    for failure in sorted(others, key=lambda f: f.rank):
        if failure.consequence:
            said = failure.consequence
        elif failure.error is not None and failure.error == first.error:  # every rank met the same bug
            said = ("failed with the same error", "failed with the same error")
        else:
            said = (f"failed too: {_short(failure.error or _ended(failure), 80)}",) * 2
        grouped.setdefault(said, []).append(failure.rank)
    parts = [f"rank {ranks[0]} {one}" if len(ranks) == 1 else f"ranks {', '.join(map(str, ranks))} {several}"
             for (one, several), ranks in grouped.items()]
    return f" (then {', '.join(parts)})" if parts else ""


def _ended(failure: RankFailure) -> str:
    if failure.signal:
        return f"killed by {failure.signal}"
    return f"exit status {failure.exitcode}" if failure.exitcode is not None else "no error recorded"


def _failed_first(first: RankFailure, others: list[RankFailure], lines, rank_output) -> RootCause:
    after = _after(first, others)
    last = _own_lines(first, lines, rank_output)
    if first.error is not None:
        if OUT_OF_MEMORY.search(first.error):
            return RootCause(first.rank, "out of memory", f"rank {first.rank} ran out of memory first: "
                             f"{_short(first.error)}{after}",
                             "make each rank's share smaller: a smaller batch per rank, bf16, or activation "
                             "recompute; a GPU shared with another job has less free than its size.",
                             last, first, others)
        if others and all(not o.consequence and o.error == first.error for o in others):  # no rank's fault more
            return RootCause(first.rank, "exception", f"every rank failed with the same error: "  # than another's
                             f"{_short(first.error)}", first.fix or f"read rank {first.rank}'s traceback (its last "
                             "lines are shown): every rank met it, so it is in what they all run.", last, first, others)
        return RootCause(first.rank, "exception", f"rank {first.rank} failed first: {_short(first.error)}{after}",
                         first.fix or f"read rank {first.rank}'s own traceback (its last lines are shown): the other "
                                      "ranks' errors are consequences of it.", last, first, others)
    if first.signal:
        said = _native_reason(first, others, lines, rank_output)
        return RootCause(first.rank, "signal", f"rank {first.rank} failed first: killed by {first.signal}, with no "
                         f"Python error{f'; it printed: {said}' if said else ''}{after}",
                         SIGNAL_FIXES.get(first.signal, "a signal stopped it: find out who sent it."),
                         last, first, others)
    return RootCause(first.rank, "exit status", f"rank {first.rank} failed first: it exited with status "
                     f"{first.exitcode} without a Python error{after}",
                     "look for sys.exit() or os._exit() on that rank, or an error printed without being raised.",
                     last, first, others)


def _left_waiting(failures: dict[int, RankFailure], world_size, lines, rank_output) -> RootCause:
    """Only consequences: a rank lost its partners in a collective. If some had left, it ran one they never ran."""
    waiting = sorted((f for f in failures.values() if f.error is not None), key=_order)
    first = waiting[0] if waiting else min(failures.values(), key=_order)
    others = [f for f in failures.values() if f is not first]
    # A rank missing from torchrun's report ended with status 0; one it stopped with no error of its own was leaving.
    gone = [r for r in range(world_size or 0) if r not in failures] or [f.rank for f in others if f.error is None]
    if not waiting or not gone:  # nobody left early (every rank lost its connection), or nobody was waiting
        return _failed_first(first, others, lines, rank_output)
    who = f"rank {gone[0]} had" if len(gone) == 1 else f"ranks {', '.join(map(str, gone))} had"
    line = (f"rank {first.rank} waited in {first.collective or 'a collective'} while {who} already finished and left: "
            f"a collective that only some ranks run (its error: {_short(first.error, 120)})")
    return RootCause(first.rank, "mismatched collective", line, MISMATCHED_COLLECTIVE_FIX,
                     _own_lines(first, lines, rank_output), first, others)
