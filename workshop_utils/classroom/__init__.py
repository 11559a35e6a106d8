"""``python -m workshop_utils.classroom``: a class on a real JupyterHub, every attendee at once (make classroom N=4).

A workshop's users are a room: thirty attendees on one portal run the same notebook in the same minute, each
in a server limited to a few cores and GiB. This starts a JupyterHub with the kit's portal recipe
(portal/jupyterhub_config.py and portal/class_config.py) and N attendees, each a Unix user of their own where
this machine allows it, each server in a cgroup of its own with a CPU quota and a memory limit (where cgroups
can be written: root, cgroup v1 or v2; elsewhere it says so and runs without limits). Every attendee hands
themselves the notebooks (python -m workshop_utils.handout --solutions), then all at the same moment run notebook
01 and the DDP lab's launch (notebook 02, Exercise 2.2) through real kernels, as JupyterLab runs them.

    python -m workshop_utils.classroom --attendees 4 --record results/reference/classroom

The class passes when every attendee finishes with every check showing ✓, none was killed for memory, each
one's results are in that attendee's own folder, and nothing was written into the kit's install. It records N,
the wall time against one attendee alone, each attendee's peak memory and what failed, as JSON. With
--short-of-memory, one more attendee gets a server below what notebook 01 needs: they must be told so in one
line at the notebook's start, not killed mid-run.

Exit status: 0 passed, 1 failed, 2 bad arguments or a machine that cannot host a hub.
"""

from __future__ import annotations

import argparse
import math
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from datetime import date
from pathlib import Path

from ..portal_check import KERNEL_NAME, kernel_socket
from ..portal_check.kernel import run_cell
from ..run_notebooks import notebooks_folder
from ..system.errors import OneLineParser, WorkshopError, exit_on_workshop_error
from ..system.hardware import environment
from ..system.results import check_output_path, git_commit, repo_root, write_json_or_fallback
from ..system.server import affinity_cores
from .attendee import (Attendee, exercise_section, in_a_kernel, make_attendees, remove_attendees, run_folders,
                       run_notebook, separate_users_possible, whole_notebook)
from .cgroups import Cgroups
from .hub import Hub, missing_pieces, register_kernel

NOTEBOOK = "01_single_gpu_baseline.ipynb"
LAB_NOTEBOOK, LAB_MARKER = "02_multi_gpu_ddp.ipynb", "lab_command"
HANDOUT = "workshop"  # each attendee's copy: ~/workshop


def _handout(server: str, token: str, timeout_s: float) -> str:
    """The attendee's one line in a terminal, run in a kernel of their server: their copy of the solved notebooks."""
    cells = []

    def attempt(ws) -> bool:  # whether the kernel answered
        cells.append(run_cell(ws, f"!{sys.executable} -m workshop_utils.handout ~/{HANDOUT} --solutions", 1,
                              KERNEL_NAME, timeout_s))
        return cells[-1].status != "died"

    in_a_kernel(lambda: kernel_socket(server, token, KERNEL_NAME, timeout_s=timeout_s), attempt)
    cell = cells[-1]
    if cell.status != "ok" or "written to" not in cell.text:
        raise WorkshopError(f"The handout failed in {server}: {cell.error or cell.text.strip()[-300:]}",
                            "run python -m workshop_utils.handout in that server's terminal to see why.")
    return cell.text.strip()


def _work(attendee: Attendee, server: str, token: str, parameters: dict, cell_timeout_s: float) -> dict:
    """What one attendee does in the class: notebook 01 from top to bottom, then Exercise 2.2's section."""
    notebooks = notebooks_folder()
    runs = []
    for notebook, cells in ((NOTEBOOK, whole_notebook(notebooks / NOTEBOOK)),
                            (LAB_NOTEBOOK, exercise_section(notebooks / LAB_NOTEBOOK, LAB_MARKER))):
        runs.append(run_notebook(server, token, KERNEL_NAME, f"{HANDOUT}/{notebook}", cells, parameters,
                                 cell_timeout_s))
        if not runs[-1].ok:
            break
    return {"runs": runs, "seconds": round(sum(r.seconds for r in runs), 1)}


def _for_each(people: list[Attendee], do) -> dict:
    """``do(person)`` for every attendee at once, as a room's servers start, hand out and stop together (one after
    the other, a class of N waits N times for what takes one wait); {name: what it returned}, or its first error."""
    with ThreadPoolExecutor(max_workers=len(people)) as pool:
        return dict(zip((p.name for p in people), pool.map(do, people)))


def _records_in_the_install(since_marker: Path) -> list[str]:
    """Result records written into the kit's install during the class (where its defaults would put them: runs/,
    and beside the notebooks): none, when every attendee's results go to their own folder."""
    root = repo_root()
    folders = [str(root / name) for name in ("runs", "notebooks") if root is not None and (root / name).is_dir()]
    if not folders:
        return []
    found = subprocess.run(["find", *folders, "-path", "*/results/*.json", "-newer", str(since_marker), "-print"],
                           capture_output=True, text=True)
    return found.stdout.split()


def check_class(attendees: int, cpus: float, memory_gib: float, short_of_memory_gib: float | None) -> None:
    """The class's sizes, before anything starts: each a finite number a cgroup can hold, in one line when not."""
    if not 1 <= attendees <= 200:
        raise WorkshopError(f"--attendees {attendees}: a class has 1 to 200 attendees.", "pass e.g. --attendees 4.")
    if not (math.isfinite(cpus) and 0.01 <= cpus <= affinity_cores()):
        raise WorkshopError(f"--cpus {cpus}: each server's CPU quota must be from 0.01 core (the kernel's least) to "
                            f"the {affinity_cores()} cores here.", "pass e.g. --cpus 1.")
    for value, name in ((memory_gib, "--memory"), (short_of_memory_gib, "--short-of-memory")):
        if value is not None and not (math.isfinite(value) and 0.125 <= value <= 1024):
            raise WorkshopError(f"{name} {value}: a server's memory limit must be from 0.125 to 1024 GiB.",
                                f"pass e.g. {name} 3.")
    if short_of_memory_gib is not None and short_of_memory_gib >= memory_gib:
        raise WorkshopError(f"--short-of-memory {short_of_memory_gib} is not short of the class's --memory "
                            f"{memory_gib}.", "give the extra attendee less memory than the others, e.g. 1.")


def run_class(attendees: int = 2, cpus: float = 1.0, memory_gib: float = 3.0, short_of_memory_gib: float | None = None,
              parameters: dict | None = None, solo: bool = True, cell_timeout_s: float = 900,
              say=print) -> dict:
    """Run a class; return its record (see the module's help). Everything it started is stopped at the end."""
    check_class(attendees, cpus, memory_gib, short_of_memory_gib)
    problem = missing_pieces()
    if problem:
        raise WorkshopError(f"Cannot start a hub: {problem}.", "make install, then npm ci --prefix portal.")
    parameters = {"profile": "cpu", **(parameters or {})}
    no_cgroups, no_users = Cgroups.unavailable(), separate_users_possible()
    for line in (no_cgroups, no_users):
        if line:
            say(f"note: {line}")
    folder = Path(tempfile.mkdtemp(prefix="workshop-classroom-", dir="/tmp"))
    token = uuid.uuid4().hex
    marker = folder / "started"
    marker.touch()
    people = make_attendees(attendees + (short_of_memory_gib is not None), folder, separate_users=no_users is None)
    short = people[-1] if short_of_memory_gib is not None else None
    cgroups = None if no_cgroups else Cgroups()
    hub = None
    try:
        for person in people if cgroups is not None else ():
            try:
                cgroups.make(person.name, cpus, int((short_of_memory_gib if person is short else memory_gib) * 2**30))
            except OSError as err:
                raise WorkshopError(f"The kernel refused the class's limits for {person.name} ({err.strerror or err}).",
                                    "try other --cpus and --memory values, or run as root.") from None
        jupyter_path = register_kernel(folder / "env")
        one_user = no_users is not None
        runs_per_home = f"{folder}/home/{{}}/{HANDOUT}/runs"
        hub = Hub(folder, [p.name for p in people], token, server_env={"JUPYTER_PATH": str(jupyter_path)}, settings=f"""
c.JupyterHub.spawner_class = "workshop_utils.classroom.spawner.CgroupSpawner"
c.CgroupSpawner.cgroup_parents = {[str(p) for p in cgroups.parents.values()] if cgroups else []!r}
c.CgroupSpawner.one_user = {one_user!r}
c.CgroupSpawner.home_dir_template = "{folder}/home/{{username}}"
c.Spawner.cpu_limit = {float(cpus)!r}
c.Spawner.mem_limit = {int(memory_gib * 2**30)!r}
if {one_user!r}:  # one Unix user for all: the spawner gives each attendee's runs a folder of their own
    c.Spawner.args = [*c.Spawner.args, "--allow-root"]
    c.Spawner.environment.update({{"WORKSHOP_RUNS": lambda spawner: {runs_per_home!r}.format(spawner.user.name)}})
""")
        started = time.perf_counter()

        def start(person: Attendee) -> str:
            hub.start_server(person.name)
            return hub.server_url(person.name)

        servers = _for_each(people, start)
        say(f"{len(people)} servers ready in {time.perf_counter() - started:.0f} s")
        _for_each(people, lambda person: _handout(servers[person.name], token, cell_timeout_s))
        solo_seconds = None
        if solo:
            alone = _work(people[0], servers[people[0].name], token, parameters, cell_timeout_s)
            solo_seconds = alone["seconds"]
            say(f"one attendee alone: {solo_seconds:.0f} s ({'ok' if all(r.ok for r in alone['runs']) else 'FAILED'})")
        results, gate = {}, threading.Barrier(len(people))
        clock = time.time()

        def attend(person: Attendee) -> None:
            gate.wait()
            results[person.name] = _work(person, servers[person.name], token, parameters, cell_timeout_s)

        threads = [threading.Thread(target=attend, args=(p,), name=p.name, daemon=True) for p in people]
        began = time.perf_counter()
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        wall = round(time.perf_counter() - began, 1)
        _for_each(people, lambda person: hub.stop_server(person.name))
        record = _record(people, short, results, cgroups, clock, marker, wall, solo_seconds, cpus, memory_gib,
                         short_of_memory_gib, parameters, no_cgroups, no_users)
    finally:
        if hub is not None:
            hub.stop()
        if cgroups is not None:
            cgroups.remove()
        remove_attendees(people)
        shutil.rmtree(folder, ignore_errors=True)
        for person in people:  # PyTorch's compile cache, one per user name: the attendees' are the class's to remove
            shutil.rmtree(Path(tempfile.gettempdir()) / f"torchinductor_{person.name}", ignore_errors=True)
    return record


def _record(people, short, results, cgroups, clock, marker, wall, solo_seconds, cpus, memory_gib, short_gib,
            parameters, no_cgroups, no_users) -> dict:
    changed = _records_in_the_install(marker)
    rows, failures = [], []
    for person in people:
        work = results.get(person.name, {"runs": [], "seconds": None})
        usage = cgroups.usage(person.name) if cgroups else {"peak_memory_mib": None, "oom_kills": None}
        folders = run_folders(person, clock)
        own = bool(folders) and all(Path(f).is_relative_to(person.home) for f in folders)
        runs = work["runs"]
        ok = bool(runs) and all(r.ok for r in runs) and len(runs) == 2
        row = {"attendee": person.name, "memory_limit_gib": short_gib if person is short else memory_gib,
               "seconds": work["seconds"], **usage, "run_folders": [str(Path(f).relative_to(person.home))
                                                                    for f in folders], "own_folder": own,
               "runs": [r.summary() for r in runs], "passed": ok and own and not usage["oom_kills"]}
        if person is short:  # expected: refused at the notebook's start, in one line, not killed
            first = runs[0] if runs else None
            row["refused_in_one_line"] = bool(first and not first.ok and first.failed_cell is not None
                                              and "needs about" in first.error and "memory" in first.error)
            row["passed"] = row["refused_in_one_line"] and not usage["oom_kills"]
        rows.append(row)
        if not row["passed"]:
            failures.append(f"{person.name}: " + (next((f"{r.notebook} cell {r.failed_cell}: {r.error}" for r in runs
                                                        if not r.ok), "") or ("killed for memory" if usage["oom_kills"]
                                                                             else "results outside its own folder")))
    if changed:
        failures.append(f"results written into the kit's install: {', '.join(changed[:5])}")
    class_rows = [r for r in rows if r["attendee"] != (short.name if short else None)]
    return {
        "kind": "classroom", "date": date.today().isoformat(), "git_commit": git_commit(),
        "attendees": len(class_rows), "passed": not failures, "failures": failures,
        "wall_s": wall, "solo_wall_s": solo_seconds, "load_average_after": [round(x, 1) for x in os.getloadavg()],
        "slowdown_vs_alone": round(wall / solo_seconds, 2) if solo_seconds else None,
        "per_attendee_limits": {"cpus": cpus, "memory_gib": memory_gib},
        "cgroups": "none: " + no_cgroups if no_cgroups else "a cgroup per server (CPU quota and memory limit)",
        "users": "one Unix user, a home each: " + no_users if no_users else "a Unix user per attendee",
        "work": f"{NOTEBOOK} whole, then {LAB_NOTEBOOK}'s Exercise 2.2 section, at once through real kernels",
        "parameters": parameters, "peak_memory_mib_max": max((r["peak_memory_mib"] or 0 for r in class_rows),
                                                              default=None) or None,
        "rows": rows, "records_in_the_install": changed, "environment": environment("cpu"),
    }


def build_parser() -> OneLineParser:
    parser = OneLineParser(prog="python -m workshop_utils.classroom", description=__doc__,
                           formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--attendees", type=int, default=4, help="how many attendees at once (default 4)")
    parser.add_argument("--cpus", type=float, default=1.0, help="each server's CPU quota in cores (default 1)")
    parser.add_argument("--memory", type=float, default=3.0, metavar="GIB",
                        help="each server's memory limit in GiB (default 3)")
    parser.add_argument("--short-of-memory", type=float, metavar="GIB",
                        help="one more attendee with this smaller limit, who must be told so at the start")
    parser.add_argument("--set", action="append", default=[], metavar="NAME=VALUE",
                        help="a notebook parameter, as papermill sets it (repeatable), e.g. --set epochs=1")
    parser.add_argument("--no-solo", action="store_true", help="skip the run of one attendee alone")
    parser.add_argument("--record", metavar="DIR", help="write the record as JSON into this folder")
    return parser


def _parameters(pairs: list[str]) -> dict:
    import ast

    found = {}
    for pair in pairs:
        name, _, text = pair.partition("=")
        if not name.isidentifier() or not text:
            raise WorkshopError(f"--set {pair!r} is not NAME=VALUE.", "pass e.g. --set epochs=1.")
        try:
            found[name] = ast.literal_eval(text)
        except (ValueError, SyntaxError):
            found[name] = text
    return found


def _stop_on_sigterm(signum, frame):
    raise KeyboardInterrupt("SIGTERM")


@exit_on_workshop_error
def main(argv=None) -> None:
    args = build_parser().parse_args(argv)
    check_class(args.attendees, args.cpus, args.memory, args.short_of_memory)
    if args.record:  # checked before the class, not after minutes of it
        check_output_path(args.record, folder=True, what="--record")
    previous = signal.signal(signal.SIGTERM, _stop_on_sigterm)  # a stopped class still removes what it made
    try:
        record = run_class(args.attendees, args.cpus, args.memory, args.short_of_memory, _parameters(args.set),
                           solo=not args.no_solo)
    except KeyboardInterrupt as stop:
        raise SystemExit(143 if str(stop) == "SIGTERM" else 130) from None
    finally:
        signal.signal(signal.SIGTERM, previous)
    for row in record["rows"]:
        print(f"{row['attendee']}: {'ok' if row['passed'] else 'FAILED'} in {row['seconds']} s, peak "
              f"{row['peak_memory_mib']} MiB, results in ~/{', ~/'.join(row['run_folders']) or 'nowhere'}"
              + "".join(f" ({run['notebook']}'s first kernel never answered: started again)" for run in row["runs"]
                        if run["kernel_starts"] > 1))
    print(f"{record['attendees']} attendees at once: {record['wall_s']:.0f} s"
          + (f" against {record['solo_wall_s']:.0f} s alone ({record['slowdown_vs_alone']}x)"
             if record["solo_wall_s"] else "") + (": passed" if record["passed"] else ": FAILED"))
    for line in record["failures"]:
        print(f"  {line}", file=sys.stderr)
    if args.record:
        path, failure = write_json_or_fallback(
            record, Path(args.record) / f"classroom-{record['attendees']}-{record['date']}.json")
        print(f"Record: {path}" + (f" (the folder asked for refused it: {failure.strerror})" if failure else ""))
    if not record["passed"]:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
