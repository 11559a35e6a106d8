"""The DDP lab's files, the two nodes its ranks run as, their time limits and progress: what ``ddp_lab``,
``ddp_lab_launch`` and ``ddp_lab_judging`` read."""

from __future__ import annotations

import json
import logging
import math
import os
import re
import sys
import threading
import time
from pathlib import Path

from ..parallel.failures import LOST_PEER, root_cause
from ..parallel.launch import cpu_threads_per_process, free_port, job_env, stream, visible_gpu_ids
from ..system.errors import WorkshopError
from ..system.results import repo_root, write_json
from .exercise_cells import NotYet, attendee_source

LAB_EXERCISE, GRADIENTS_EXERCISE, EFFICIENCY_EXERCISE = "Exercise 2.2", "Exercise 2.1", "Exercise 2.3"
PROBE_MODULE = "workshop_utils.exercises.ddp_lab"
TORCHRUN_LOGS = "torchrun"  # the check folder's subfolder where torchrun has the ranks write their error files
SOLUTION_FILE = "train_ddp.py"
THROUGHPUT = re.compile(r"(\d[\d,]*(?:\.\d+)?(?:[eE][+-]?\d+)?)\s*(?:samples|images|imgs?|examples)\s*"
                        r"(?:/\s*s(?:ec(?:ond)?)?\b|per\s+s(?:ec(?:ond)?)?\b)", re.IGNORECASE)
LOSS_LINE = re.compile(r"\bloss\b", re.IGNORECASE)
STARTED = "WORKSHOP_CHECK_STARTED"  # when the check started the ranks (time.time()), in every rank's environment
IDLE_LIMIT = "WORKSHOP_CHECK_IDLE_LIMIT"  # seconds a rank may make no progress, where the caller gives them
AGENT_QUIET = "WORKSHOP_CHECK_AGENT_QUIET"  # the agents' C++ log level was set for them alone
# A rank that makes no progress for LIMIT_FACTOR times what this machine took to start it, and at least
# LIMIT_FLOOR_S, is stopped: a busy machine gets more time, and a pause for an evaluation is no hang.
LIMIT_FACTOR, LIMIT_FLOOR_S = 5.0, 30.0
STALLED_EXIT = 124  # a rank the time limit stopped (as `timeout` exits)


def lab_folder(folder=None) -> Path:
    """The folder holding the lab's scripts."""
    candidates = [Path(folder)] if folder is not None else [
        *([repo_root() / "notebooks" / "labs" / "ddp_lab"] if repo_root() else []),
        Path.cwd() / "labs" / "ddp_lab", Path.cwd() / "notebooks" / "labs" / "ddp_lab"]
    found = next((path for path in candidates if (path / SOLUTION_FILE).exists()), None)
    if found is None:
        raise WorkshopError(f"Cannot find the DDP lab's {SOLUTION_FILE} (looked in "
                            f"{', '.join(map(str, candidates))}).", "run from a checkout of the workshop, or pass the "
                            "folder that holds notebooks/labs/ddp_lab.")
    return found


def solution_text(source: str) -> str:
    """A marked source with the answers kept and the marker and placeholder lines dropped."""
    attendee_source(source, "the solution")  # a malformed block fails here, with its line
    markers = ("### BEGIN SOLUTION", "### END SOLUTION", "### PLACEHOLDER")
    return "\n".join(line for line in source.splitlines() if not line.strip().startswith(markers)) + "\n"


def attendee_script(src, dst) -> Path:
    """Write the attendee's copy of a marked .py file: the notebooks' marker rule, applied to a script."""
    src, dst = Path(src), Path(dst)
    if src.resolve() == dst.resolve():
        raise WorkshopError(f"Would overwrite {src} with its attendee copy.", "write the copy to another path.")
    dst.parent.mkdir(parents=True, exist_ok=True)
    dst.write_text(attendee_source(src.read_text(), src.name) + "\n")
    return dst


def start_ddp_lab(run_dir, lab=None) -> Path:
    """The attendee's DDP script in ``run_dir/ddp_lab/``: written once, kept as edited when run again."""
    path = Path(run_dir) / "ddp_lab" / "my_train_ddp.py"
    if path.exists():
        print(f"Your script (kept as you left it): {path}")
        return path
    attendee_script(lab_folder(lab) / SOLUTION_FILE, path)
    gaps = sum(line.strip() == "# YOUR CODE HERE" for line in path.read_text().splitlines())
    print(f"Your script: {path}\n{gaps} places in it say '# YOUR CODE HERE'.")
    return path


def solve_ddp_lab(path, lab=None) -> Path:
    """Put the finished DDP script at ``path`` (what the committed notebook runs in place of an attendee's)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(solution_text((lab_folder(lab) / SOLUTION_FILE).read_text()))
    return path


def reported_throughput(lines) -> float | None:
    """The last samples/s figure in ``lines`` ("throughput: 1234 samples/s"), or None."""
    found = [m.group(1) for line in lines for m in THROUGHPUT.finditer(line)]
    return float(found[-1].replace(",", "")) if found else None


def read_output(path: Path) -> str:
    return path.read_text(errors="replace") if path.exists() else ""


def run_nodes(module_args: list[str], per_node: tuple[int, ...], folder: Path, device: str, timeout_s: float,
              echo: bool, exercise: str, assigned: dict | None = None,
              idle_limit_s: float | None = None) -> tuple[list[int], list[str]]:
    """``python -m PROBE_MODULE module_args`` as the ranks of one torchrun agent per node on this machine (as ``srun
    torchrun`` on a cluster); once one agent has ended, the other is stopped 5 s later, as a cluster ends the job."""
    port, ranks = free_port(), sum(per_node)
    env = {**job_env(cpu_threads_per_process(ranks), hide_gpus=device == "cpu"), STARTED: repr(time.time()),
           **(assigned or {})}
    if "TORCH_CPP_LOG_LEVEL" not in env:  # read once, as the agent starts; torchrun_agent keeps it from the ranks
        env.update({"TORCH_CPP_LOG_LEVEL": "ERROR", AGENT_QUIET: "1"})
    if idle_limit_s is not None:
        env[IDLE_LIMIT] = repr(float(idle_limit_s))
    ids = visible_gpu_ids() or [str(i) for i in range(ranks)]
    entry = ["-m", PROBE_MODULE]  # on GPUs, each rank a Python of its own: CUDA is no state to fork
    if device == "cpu":  # the ranks forked from their agent, which has imported torch: seconds less per launch
        (launcher := folder / "rank.py").write_text(f"from {PROBE_MODULE} import main\n\nmain()\n")
        entry = ["--run-path", "--start-method=fork", str(launcher)]
    commands, envs = {}, {}
    for node, n in enumerate(per_node):
        label, first = f"[node {node}] ", sum(per_node[:node])
        commands[label] = [sys.executable, "-m", PROBE_MODULE, "--agent", f"--nnodes={len(per_node)}",
                           f"--node-rank={node}", f"--nproc-per-node={n}", "--master-addr=127.0.0.1",
                           f"--master-port={port}", "--max-restarts=0", f"--log-dir={folder / TORCHRUN_LOGS}",
                           *entry, *module_args]
        # the check chooses each node's GPUs, or none for CPU ranks, whatever the line set: CPU ranks shown a GPU
        # (CUDA_VISIBLE_DEVICES=0 torchrun ...) would reach for it, the blame then falling on a right script
        envs[label] = {**env, "CUDA_VISIBLE_DEVICES": "" if device == "cpu" else ",".join(ids[first:first + n])}
    try:
        return stream(commands, None, timeout_s, echo, envs, linger_s=5)
    except WorkshopError as err:
        if "longer than" not in str(err):
            raise
        notes = _progress(folder, ranks, time.time()).values()
        stopped = f"✗ {exercise}: the run reached the check's limit of {timeout_s:.0f} s and was stopped"
        if all(note and note["what"].startswith("starting") for note in notes):  # the idle limit starts at a batch
            raise NotYet(f"{stopped} with no rank past its start: {what_ran(folder, ranks)}.",
                         "the ranks most likely never joined one process group: torchrun gives each rank "
                         "MASTER_ADDR, MASTER_PORT, RANK and WORLD_SIZE for init_process_group(); a script that sets "
                         "them itself (MASTER_ADDR = 'localhost', a port of its own) sends the ranks where torchrun's "
                         "store does not listen, or each node to its own.") from None
        steps = ", or run fewer steps" * any("batch" in (note or {}).get("what", "") for note in notes)
        raise NotYet(f"{stopped}: {what_ran(folder, ranks)}.", "it was still going (a rank that makes no progress is "
                     f"stopped sooner): pass a larger timeout_s{steps}.") from None


def torchrun_agent(argv: list[str]) -> None:
    """torchrun itself, its report of a failure kept for ``root_cause`` and said in one line, without its box."""
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import parse_args, run

    for name in list(logging.root.manager.loggerDict):  # torchrun's logs of the failure said below, and once
        if name.startswith(("torch.distributed.elastic", "torch.multiprocessing")):
            logging.getLogger(name).setLevel(logging.CRITICAL)
    if os.environ.pop(AGENT_QUIET, None):  # the agent's own C++ warnings off (its store losing node 0), not the ranks'
        os.environ.pop("TORCH_CPP_LOG_LEVEL", None)
    args = parse_args(argv)
    try:
        run(args)
    except ChildFailedError as failed:
        report = Path(args.log_dir) / f"node{args.node_rank}.report"
        report.parent.mkdir(parents=True, exist_ok=True)
        report.write_text(str(failed))
        # torchrun's first failure compares whole seconds; the ranks' error files hold the exact time
        rank, failure = min(failed.failures.items(), key=lambda item: _exact_time(item[1]))
        how = ("stopped at the check's time limit" if failure.exitcode == STALLED_EXIT else
               f"killed by {failure.signal_name()}" if failure.exitcode < 0 else f"exit status {failure.exitcode}")
        message = failure.message.get("message", "") if isinstance(failure.message, dict) else failure.message
        said = [line for line in str(message).splitlines() if line.strip()]
        cause = ("" if not said or failure.exitcode <= 0 or "To enable traceback" in said[-1] else
                 ", having lost its connection to a rank that failed" if LOST_PEER.search(said[-1]) else
                 f": {' '.join(said[-1].split())[:160]}")
        sys.stderr.write(f"torchrun: rank {rank} ended ({how}){cause}\n")  # one write, as the ranks' lines
        sys.stderr.flush()
        raise SystemExit(1) from None


def _exact_time(failure) -> float:
    """When a rank failed, from the time its error file holds (the kit writes it exactly), else torchrun's."""
    message = failure.error_file_data.get("message") if isinstance(failure.error_file_data, dict) else None
    extra = message.get("extraInfo") if isinstance(message, dict) else None
    return float(extra.get("time", failure.timestamp)) if isinstance(extra, dict) else float(failure.timestamp)


def failed_run(exercise: str, code: int, lines: list[str], nproc: int, folder: Path, rank_output=None,
               where: str = "") -> NotYet:
    """A failed run's one line: the rank that failed first (the others' lost connections are consequences), its
    own last lines shown; else the output's last line."""
    said = f"✗ {exercise}: the run failed{where} (exit status {code})"
    reports = [f"[node {path.stem.removeprefix('node')}] {line}" for path in sorted((folder / TORCHRUN_LOGS).glob(
        "node*.report")) for line in path.read_text().splitlines()]  # each line behind its node's label, as streamed
    cause = root_cause([*lines, *reports], nproc, folder / TORCHRUN_LOGS, rank_output=rank_output)
    if cause is not None:
        if cause.last_lines:
            print(cause.last_lines_text())
        return NotYet(f"{said}; {cause.line}.", cause.fix)
    tail = [line for line in ((rank_output or {}).get(0) or "\n".join(lines)).splitlines() if line.strip()][-6:]
    print("--- the last lines of the output:", *tail, sep="\n")
    return NotYet(f"{said}; the last line: {' '.join((tail or ['(no output)'])[-1].split())}",
                  "the output above names the line; fix it and run this cell again.")


def _scaled(startup_s: float) -> float:
    return max(LIMIT_FLOOR_S, LIMIT_FACTOR * startup_s)


def scaled_limit(startup_s: float) -> float:
    """How long a rank may make no progress: what the caller gave, else scaled to what this machine took."""
    return float(os.environ.get(IDLE_LIMIT) or _scaled(startup_s))


def limit_words(limit_s: float, startup_s: float) -> str:
    """The limit and where it came from: "38 s (5x the 7.5 s this machine took to start the rank, ...)"."""
    if not math.isclose(limit_s, _scaled(startup_s), rel_tol=1e-6):
        return f"{limit_s:.0f} s (the limit the check was given)"
    return (f"{limit_s:.0f} s ({LIMIT_FACTOR:g}x the {startup_s:.1f} s this machine took to start the rank, and at "
            f"least {LIMIT_FLOOR_S:.0f} s)")


def note_progress(folder: Path, rank: int, what: str, **more) -> None:
    """What this rank is doing now, for the check to say where each rank was if a limit is reached."""
    write_json({"what": what, "time": time.time(), **more}, folder / f"rank{rank}.progress")


def _progress(folder: Path, ranks: int, at: float) -> dict[int, dict | None]:
    """Each rank's last note as of ``at``: one that failed after ``at`` (as one waiting in a collective does when the
    others stop) is shown where it was."""
    notes = {rank: json.loads(path.read_text()) if (path := folder / f"rank{rank}.progress").exists() else None
             for rank in range(ranks)}
    return {rank: note.get("was", note) if note and note["what"] == "failed" and note["time"] > at else note
            for rank, note in notes.items()}


def first_to_stall(folder: Path, ranks: int, at: float) -> tuple[int, float] | None:
    """(the rank, when) that stopped making progress first of those not finished, or None."""
    return min(((rank, note["time"]) for rank, note in _progress(folder, ranks, at).items()
                if note and note["what"] != "finished"), key=lambda item: (item[1], item[0]), default=None)


def what_ran(folder: Path, ranks: int, at: float | None = None) -> str:
    """Where each rank was at ``at``: "rank 0: finished; rank 1: called torch.save, 41 s before"."""
    at = at or time.time()
    return "; ".join(f"rank {rank}: " + ("not started (no output from it yet)" if note is None else note["what"]
                                         if note["what"] == "finished" else
                                         f"{note['what']}, {at - note['time']:.0f} s before")
                     for rank, note in _progress(folder, ranks, at).items())


def watch_progress(folder: Path, rank: int, record: dict, lock: threading.Lock) -> None:
    """This rank's progress, for the check; past ``scaled_limit`` without any, the rank stops itself."""
    launched, said = float(os.environ.get(STARTED) or time.time()), None
    while True:
        time.sleep(0.25)
        with lock:
            if record["end"] is not None:
                return
            progress = dict(record["progress"])
            if progress != said:
                note_progress(folder, rank, **progress)
                said = progress
        if record["first_draw"] is None:
            continue
        startup = record["first_draw"] - launched
        idle, limit = time.time() - progress["time"], scaled_limit(startup)
        if idle > limit:
            write_json({"rank": rank, "what": progress["what"], "idle_s": idle, "startup_s": startup,
                        "limit_s": limit, "time": time.time()}, folder / f"rank{rank}.stalled")
            sys.stdout.flush()
            os._exit(STALLED_EXIT)
