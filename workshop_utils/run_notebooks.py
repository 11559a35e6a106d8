"""The main job: execute every notebook into one new run folder, then write the report.

    python -m workshop_utils.run_notebooks                          # what `make run` does
    python -m workshop_utils.run_notebooks --only 01 --profile cpu
    python -m workshop_utils.run_notebooks --check --profile gpu    # the pre-flight before a workshop

Each notebook runs headless with papermill, receives the run folder and the
profile as parameters, and its executed copy is kept in ``<run>/notebooks/``. A
notebook that fails does not stop the others, and the report is written anyway
with the failure listed (the cell it stopped in and its first error line): no
result is lost. Every notebook has a time budget, its profile's (300 s for gpu):
the console and the report flag one that runs over it.

--check is the pre-flight: the same run, sized as the attendees will run it, with the
budget as a hard limit on each notebook, so a notebook that hangs or runs too long is
stopped, reported as failed, and the check still ends within notebooks x budget.

Each notebook's kernel talks to this process over Unix-domain (IPC) sockets in a fresh private
folder (mode 0700), not over TCP ports that every user of a shared node could reach.

Exit code: 1 if any notebook failed (with --check also if one ran over its budget),
2 for a mistake in the arguments, 130/143 when stopped by Ctrl-C/SIGTERM (the report of
the notebooks that finished is written first).
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import re
import signal
import sys
import tempfile
import time
from pathlib import Path

from .system.results import repo_root, write_json
from .system.errors import OneLineParser, WorkshopError, exit_on_workshop_error
from .system.hardware import wait_passively
from .system.server import PeakMemory
from .system.profiles import PROFILE_NAMES, TIME_BUDGET_S, profile_choice
from .report import write_report
from .system.results import resolve_run_dir

_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


def notebooks_folder(folder=None) -> Path:
    """The notebooks to run: ``folder`` if given, else the checkout's notebooks/, else ./notebooks."""
    if folder is not None:
        path = Path(folder)
        if not path.is_dir():
            raise WorkshopError(f"Notebook folder {path} does not exist.", "pass a folder that holds .ipynb files.")
        return path
    # A kit installed from a wheel (the offline install) has no checkout of its own: use the one we are in.
    for root in (repo_root(), Path.cwd()):
        if root is not None and (root / "notebooks").is_dir():
            return root / "notebooks"
    raise WorkshopError("Cannot find the notebooks/ folder.", "run this from the root of a checkout of the workshop.")


def select_notebooks(folder: Path, only: list[str] | None = None) -> list[Path]:
    selected = sorted(p for p in folder.glob("*.ipynb") if not only or any(p.name.startswith(o) for o in only))
    if not selected:
        raise WorkshopError(f"No notebook in {folder} matches {only or '*.ipynb'}.", "use a prefix such as --only 01.")
    return selected


def _first_line(text, limit: int = 300) -> str:
    lines = [line.strip() for line in _ANSI.sub("", str(text or "")).splitlines() if line.strip()]
    return lines[0][:limit] if lines else ""


def _code_cells(executed: Path) -> list:
    import nbformat

    try:
        nb = nbformat.read(executed, as_version=4)
    except Exception:  # no executed copy (papermill stopped before writing one): the exception must do
        return []
    return [c for c in nb.cells if c.cell_type == "code"]


def _failed_cell(cells: list):
    """The cell a failed run stopped in: the one papermill marked, else the last one that started."""
    marked = [c for c in cells if c.get("metadata", {}).get("papermill", {}).get("exception") is True]
    if marked:
        return marked[0]
    started = [c for c in cells if c.get("metadata", {}).get("papermill", {}).get("start_time")]
    return started[-1] if started else None


def _error_line(cell) -> str:
    """The first line of the error a failed cell showed, read from its saved outputs."""
    outputs = cell.get("outputs", []) if cell is not None else []
    for output in outputs:
        if output.get("output_type") == "error":
            message = _first_line(output.get("evalue"))
            return f"{output.get('ename')}: {message}" if message else str(output.get("ename"))
    # A handler that prints its one line instead of raising an error output (the notebooks' WorkshopError
    # handler does so): that line is the last thing the cell wrote to stderr.
    stderr = [o.get("text", "") for o in outputs if o.get("output_type") == "stream" and o.get("name") == "stderr"]
    lines = [line.strip() for line in _ANSI.sub("", "".join(stderr)).splitlines() if line.strip()]
    return lines[-1][:300] if lines else ""


def _where(cell, cells: list) -> dict:
    """A cell as the log names it: its number in the executed copy (In [N]) and its first line."""
    if cell is None:
        return {"cell": None, "cell_source": ""}
    number = cell.get("execution_count")
    if number is None:
        # Saved before the kernel numbered it (a run stopped mid-cell). One fresh kernel runs every
        # non-empty cell once, in order, so its number is its place among them.
        ran = [c for c in cells if str(c.get("source", "")).strip()]
        number = next((i for i, c in enumerate(ran, 1) if c is cell), None)
    return {"cell": number, "cell_source": _first_line(cell.get("source"), 120)}


def failure_of(executed: Path, err: BaseException, limit_s: float | None = None) -> dict:
    """What went wrong in a notebook run: the cell it stopped in and the first line of the error."""
    from nbclient.exceptions import CellTimeoutError
    from papermill.exceptions import PapermillExecutionError

    cells = _code_cells(executed)
    cell = _failed_cell(cells)
    found = {**_where(cell, cells), "timed_out": False}
    if isinstance(err, CellTimeoutError):
        found.update(timed_out=True, error=f"stopped at its time limit of {limit_s:g} s while running this cell "
                                           "(a hang, or sizes too large for this machine)")
    elif isinstance(err, PapermillExecutionError):  # the cell raised: its own output says why
        found["error"] = _error_line(cell) or "the cell failed without an error message"
    else:  # the kernel died, or never started: the cell under way is where, the exception is why
        message = _first_line(err)
        found["error"] = f"{type(err).__name__}: {message}" if message else type(err).__name__
    return found


def _entry(notebook: Path, profile: str, limit_s: float | None, check: bool) -> dict:
    """A notebook's line in notebooks.json, before it has run."""
    return {"notebook": notebook.name, "status": "running", "seconds": None, "profile": profile,
            "budget_s": TIME_BUDGET_S[profile], "limit_s": limit_s, "over_budget": False, "check": check,
            "cell": None, "cell_source": "", "timed_out": False, "error": "", "peak_memory_mib": None}


# A Unix-domain socket path may hold at most 104 bytes (macOS; Linux allows 108). The kernel's five
# sockets are <folder>/kernel-1 ... <folder>/kernel-5.
_SOCKET_PATH_MAX = 100


@contextlib.contextmanager
def private_kernel_config():
    """Configuration that puts a notebook's kernel on Unix-domain (IPC) sockets, in a folder only we can enter.

    Over TCP (jupyter's default) every user of a shared node can connect to the kernel's ports, and the
    kernel warns that its messages travel unencrypted. IPC sockets are files: they and the connection
    file (with the key that signs every message) live in a fresh folder of mode 0700, removed at the end.
    The configuration goes to nbclient, which creates, owns and shuts down the kernel manager.
    """
    from traitlets.config import Config

    base = None  # tempfile's choice: $TMPDIR, else /tmp
    longest = os.path.join(tempfile.gettempdir(), "workshop-kernel-xxxxxxxx", "kernel-5")
    if len(os.fsencode(longest)) > _SOCKET_PATH_MAX:
        if not os.path.isdir("/tmp"):
            raise WorkshopError(f"The temporary folder {tempfile.gettempdir()} is too long a path for the "
                                "kernel's sockets.", "set TMPDIR to a short folder of your own, e.g. /tmp.")
        base = "/tmp"  # a job's $TMPDIR can be too long a path for a socket
    with tempfile.TemporaryDirectory(prefix="workshop-kernel-", dir=base) as folder:
        os.chmod(folder, 0o700)  # mkdtemp's mode already; explicit, as the key and the sockets rely on it
        yield Config({"KernelManager": {"transport": "ipc", "ip": os.path.join(folder, "kernel"),
                                        "connection_file": os.path.join(folder, "kernel.json")}})


def run_one(notebook: Path, run_dir: Path, profile: str, limit_s: float | None = None, check: bool = False) -> dict:
    """Execute one notebook into ``run_dir/notebooks/``; return its log entry (never raises for its failure)."""
    import papermill

    executed = run_dir / "notebooks" / notebook.name
    executed.unlink(missing_ok=True)  # an older run's copy must not be read as this run's failure
    entry = {**_entry(notebook, profile, limit_s, check), "status": "ok"}
    extra = {}
    if limit_s:
        # One deadline for the whole notebook: each cell may use what the cells before it left.
        deadline = time.monotonic() + limit_s
        extra["timeout_func"] = lambda cell: max(1, math.ceil(deadline - time.monotonic()))
    started = time.perf_counter()
    peak = PeakMemory()  # of the kernel and all it starts: what a portal's memory limit per attendee must allow
    try:
        with private_kernel_config() as config, peak:  # IPC sockets, not TCP ports: see private_kernel_config
            papermill.execute_notebook(
                str(notebook), str(executed), parameters={"profile": profile, "run_dir": str(run_dir)},
                cwd=str(notebook.parent), kernel_name="python3", progress_bar=True, log_output=False,
                config=config, **extra)
    except Exception as err:  # a failed notebook is reported, and the others still run
        entry.update(status="FAILED", **failure_of(executed, err, limit_s))
    entry["seconds"] = round(time.perf_counter() - started, 1)
    entry["peak_memory_mib"] = round(peak.mib)
    if executed.exists():
        settle_streams(executed)
    entry["over_budget"] = entry["seconds"] > entry["budget_s"]
    return entry


_OVERWRITTEN = re.compile(r"[^\n]*\r(?=[^\n])")  # a line's text that a carriage return went back over
_ERASED = re.compile(r"[^\n]\x08")


def settle_text(text: str) -> str:
    """Stream text as a terminal leaves it: what ``\r`` and backspace overwrote is gone."""
    previous = None
    while previous != text:
        previous, text = text, _ERASED.sub("", text)
    return _OVERWRITTEN.sub("", text.replace("\r\n", "\n"))


def _blank(output) -> bool:
    """A stream left empty, or a display with nothing but empty text (a progress bar's line once it closed)."""
    if output.get("output_type") == "stream":
        return not output["text"].strip()
    data = output.get("data") or {}
    return output.get("output_type") == "display_data" and set(data) <= {"text/plain"} and \
        not str(data.get("text/plain", "")).strip()


def settle_streams(path: Path) -> None:
    """Keep in an executed copy what a notebook front end shows: a progress bar's refreshes end as its last state.

    papermill saves each refresh of a bar as an output of its own, so a saved or shared copy (GitHub,
    nbviewer, runs/.../notebooks/) would show every one as a line. Adjacent outputs of one stream are joined
    (order against tables and charts kept), the text settled, and what is left blank dropped, with the empty
    line a closed progress bar leaves in a kernel (``system.progress``).
    """
    import nbformat

    notebook = nbformat.read(path, as_version=4)
    for cell in notebook.cells:
        outputs = []
        for output in cell.get("outputs", []):
            if output.get("output_type") != "stream":
                outputs.append(output)
            elif outputs and outputs[-1].get("output_type") == "stream" and outputs[-1].get("name") == output.get("name"):
                outputs[-1]["text"] += output["text"]
            else:
                outputs.append(output)
        for output in outputs:
            if output.get("output_type") == "stream":
                output["text"] = settle_text(output["text"])
        if "outputs" in cell:
            cell["outputs"] = [o for o in outputs if not _blank(o)]
    nbformat.write(notebook, path)


def describe(entry: dict) -> str:
    """One console line for a notebook's log entry."""
    name, seconds = entry["notebook"], entry.get("seconds")
    took = f"{seconds:.1f} s" if seconds is not None else "no time"
    budget = entry.get("budget_s")
    if entry["status"] == "running":
        return f"RUNNING {name}: no result (the main job ended while it ran)"
    if entry["status"] != "ok":
        cell = f" in In [{entry['cell']}] `{entry['cell_source']}`" if entry.get("cell") else ""
        return f"FAILED  {name} after {took}{cell}: {entry['error']}"
    if entry.get("over_budget"):
        return f"SLOW    {name} {took}: over its {budget} s budget"
    return f"ok      {name} {took}" + (f" (budget {budget} s)" if budget else "")


def _save_log(run_dir: Path, log: list[dict]) -> None:
    write_json(log, run_dir / "notebooks.json")


def run_notebooks(run_dir=None, profile: str = "auto", only: list[str] | None = None, *, folder=None,
                  timeout_s: float | None = None, check: bool = False) -> tuple[Path, list[dict]]:
    """Run the selected notebooks into one run folder, then write its report; return (folder, log).

    ``profile`` "auto" is resolved here, once, and every notebook receives the concrete name: a
    notebook never re-decides it in its own kernel. ``timeout_s`` limits each notebook's wall
    time; ``check`` (the pre-flight) sets it to the profile's budget unless given.
    """
    if timeout_s is not None and not (math.isfinite(timeout_s) and timeout_s > 0):
        raise WorkshopError(f"Time limit {timeout_s} s is not a positive number of seconds.",
                            "pass e.g. --timeout 300.")
    folder = notebooks_folder(folder)
    selected = select_notebooks(folder, only)
    name, reason = profile_choice(profile)
    limit = timeout_s or (TIME_BUDGET_S[name] if check else None)
    run_dir = resolve_run_dir(run_dir, "preflight" if check else None).resolve()
    (run_dir / "notebooks").mkdir(exist_ok=True)
    wait_passively()  # the kernels and the ranks they start share the cores with each other and the machine
    # The kernels draw as JupyterLab's do, with the inline backend, so the executed copies carry their charts;
    # a backend named in the environment (the test suite's Agg) would leave every copy without a figure.
    os.environ.pop("MPLBACKEND", None)
    print(f"Run folder: {run_dir}", flush=True)
    print(f"Profile {name} ({reason}); {len(selected)} notebook(s); time budget {TIME_BUDGET_S[name]} s each"
          + (f", stopped after {limit:g} s" if limit else ""), flush=True)
    log: list[dict] = []
    current, started = None, 0.0
    try:
        for i, notebook in enumerate(selected, 1):
            print(f"\n=== [{i}/{len(selected)}] {notebook.name} (profile {name})", flush=True)
            current, started = notebook, time.perf_counter()
            # Written before it starts: a job killed outright still says which notebook was under way.
            _save_log(run_dir, [*log, _entry(notebook, name, limit, check)])
            entry = run_one(notebook, run_dir, name, limit, check)
            current = None
            log.append(entry)
            _save_log(run_dir, log)
            print(describe(entry), file=sys.stderr if entry["status"] != "ok" else sys.stdout, flush=True)
    except KeyboardInterrupt as stop:  # Ctrl-C, or SIGTERM (Slurm's time limit) turned into one by main()
        what = str(stop) or "Ctrl-C"
        if current is not None:
            seconds = round(time.perf_counter() - started, 1)
            cells = _code_cells(run_dir / "notebooks" / current.name)
            log.append({**_entry(current, name, limit, check), "status": "FAILED", "seconds": seconds,
                        "over_budget": seconds > TIME_BUDGET_S[name], **_where(_failed_cell(cells), cells),
                        "error": f"the main job was stopped ({what}) while this notebook ran"})
            _save_log(run_dir, log)
        print(f"\nStopped ({what}): the report covers the notebooks that finished.", file=sys.stderr, flush=True)
        print(f"Report: {write_report(run_dir)}", flush=True)
        raise
    report = write_report(run_dir)
    print("\n=== Summary" + (" (pre-flight)" if check else ""))
    for entry in log:
        print(describe(entry))
    print(f"\nReport: {report}", flush=True)
    return run_dir, log


def _stop_on_sigterm(signum, frame):
    raise KeyboardInterrupt("SIGTERM")


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(prog="python -m workshop_utils.run_notebooks", description=__doc__,
                           formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--profile", default="auto", choices=PROFILE_NAMES,
                        help="size of every notebook: auto is $WORKSHOP_PROFILE if set, else gpu when a GPU is "
                             "visible, else cpu")
    parser.add_argument("--only", nargs="*", help="notebook name prefixes to run, e.g. 01 03")
    parser.add_argument("--run-dir", help="folder to write into (default: a new runs/<timestamp>/, with --check runs/<timestamp>-preflight/)")
    parser.add_argument("--check", action="store_true",
                        help="the pre-flight: stop each notebook at its time budget, fail on any over it")
    parser.add_argument("--timeout", type=float, metavar="SECONDS",
                        help="stop a notebook after this many seconds and report it failed "
                             "(default: none; with --check the budget)")
    parser.add_argument("--notebooks", metavar="DIR", help="folder of notebooks to run (default: notebooks/)")
    return parser


@exit_on_workshop_error
def main(argv=None) -> None:
    args = build_parser().parse_args(argv)
    # A batch system's stop (time limit, scancel) still leaves the report of what finished.
    previous = signal.signal(signal.SIGTERM, _stop_on_sigterm)
    try:
        _, log = run_notebooks(args.run_dir, args.profile, args.only, folder=args.notebooks,
                               timeout_s=args.timeout, check=args.check)
    except KeyboardInterrupt as stop:
        raise SystemExit(143 if str(stop) == "SIGTERM" else 130) from None
    finally:
        signal.signal(signal.SIGTERM, previous)
    failed = [e["notebook"] for e in log if e["status"] != "ok"]
    slow = [e["notebook"] for e in log if e["status"] == "ok" and e.get("over_budget")]
    if args.check:
        verdict = "ready" if not failed and not slow else "NOT ready"
        print(f"Pre-flight: {verdict}: {len(log) - len(failed) - len(slow)} of {len(log)} notebook(s) pass within "
              f"their budget" + (f"; failed: {', '.join(failed)}" if failed else "")
              + (f"; over budget: {', '.join(slow)}" if slow else ""), flush=True)
        if failed or slow:
            raise SystemExit(1)
    if failed:
        print(f"error: {len(failed)} notebook(s) failed: {', '.join(failed)} (see the report)", file=sys.stderr)
        raise SystemExit(1)


if __name__ == "__main__":
    main()
