"""``python -m workshop_utils.reference RUN_DIR``: keep a main-job run as the reference results.

The slides fall back on ``results/reference/`` for every section no newer run folder holds, and the
its RUN.md is the measurements page. Copied by hand, the reference fell 65 commits behind the
notebooks; this command re-records it from one complete run of the main job (``make run``):

    python -m workshop_utils.reference runs/<stamp>

It refuses a run in which a notebook failed or did not run, replaces the reference's results, figures,
report and notebook log (other references kept beside them, ``gpu/`` and ``slurm/``, stay), and writes
``reference.json`` (the commit, the machine, each notebook's seconds) and ``RUN.md``, the page of those
facts, generated, never typed. ``tests/test_reference.py`` fails when a notebook changed after the commit
the reference was recorded at.

``make test`` records its own time (``runs/test-suite-<stamp>.json``: seconds, outcomes, slowest tests,
machine); ``--tests`` keeps such a record beside the notebooks' on the same page, with or without a run:

    python -m workshop_utils.reference --tests runs/test-suite-<stamp>.json
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
from datetime import datetime, timezone
from pathlib import Path

from .system.errors import OneLineParser, WorkshopError, exit_on_workshop_error
from .system.results import git_commit, read_records, repo_root, write_json

REPLACED = ("results", "figures", "report.md", "notebooks.json")  # what one main-job run writes and the slides read


def default_reference() -> Path:
    return (repo_root() or Path.cwd()) / "results" / "reference"


def _notebook_log(run: Path) -> list[dict]:
    path = run / "notebooks.json"
    try:
        log = json.loads(path.read_text())
    except (OSError, ValueError) as err:
        raise WorkshopError(f"{run} has no readable notebooks.json ({type(err).__name__}): it is not a main-job run.",
                            "pass a folder written by `make run` (runs/<stamp>).") from None
    if not isinstance(log, list) or not log or not all(isinstance(e, dict) for e in log):
        raise WorkshopError(f"{path} lists no notebook.", "pass a folder written by `make run`.")
    failed = [e.get("notebook", "?") for e in log if e.get("status") != "ok"]
    if failed:
        raise WorkshopError(f"In {run} these notebooks did not finish: {', '.join(failed)}.",
                            "keep only a run in which every notebook passed as the reference.")
    return log


def _commit_time(commit: str | None) -> str | None:
    root = repo_root()
    if not commit or root is None:
        return None
    out = subprocess.run(["git", "-C", str(root), "show", "-s", "--format=%cI", commit], capture_output=True,
                         text=True)
    return out.stdout.strip() or None


def _git(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["git", "-C", str(repo_root() or Path.cwd()), *args], capture_output=True, text=True)


def _one_commit(run: Path, commits: set[str]) -> str:
    """The commit a run's results stand for: its only one, or, when commits landed while it ran, the newest,
    provided no notebook changed between them; else a WorkshopError."""
    if len(commits) == 1:
        return next(iter(commits))
    listed = ", ".join(sorted(commits))
    refuse = WorkshopError(f"{run}'s results come from {len(commits)} commits ({listed}), with the notebooks changed "
                           "between them (or no git history to tell).",
                           "keep a run of one main job, at one commit, as the reference.")
    dated = []
    for commit in commits:
        when = _git("show", "-s", "--format=%ct", commit)
        if when.returncode != 0 or not when.stdout.strip().isdigit():
            raise refuse
        dated.append((int(when.stdout.strip()), commit))
    dated.sort()
    oldest, newest = dated[0][1], dated[-1][1]
    if _git("diff", "--quiet", oldest, newest, "--", "notebooks/").returncode != 0:
        raise refuse
    return newest


def run_page(facts: dict) -> str:
    """RUN.md: what the reference run was, from ``reference.json``'s facts."""
    env = facts["environment"]
    lines = ["# The reference run", "",
             f"Recorded by `python -m workshop_utils.reference` from the main job's run `{facts['run']}` at commit "
             f"{facts['commit'] or 'unknown'}, on {env.get('cpu_model') or env.get('device_name')} "
             f"({env.get('cpu_cores')} cores, {env.get('device_type')}), PyTorch {env.get('torch')}, "
             f"profile {facts['profile']}, {facts['created'][:10]}. Generated: do not edit.", "",
             "| notebook | seconds | budget (s) |", "| --- | ---: | ---: |"]
    for entry in facts["notebooks"]:
        lines.append(f"| {entry['notebook']} | {entry['seconds']:.1f} | {entry['budget_s']} |")
    lines += [f"| **all** | **{sum(e['seconds'] for e in facts['notebooks']):.1f}** | |", ""]
    suite = facts.get("test_suite")
    if suite:
        lines += _suite_lines(suite)
    return "\n".join(lines)


def _suite_lines(suite: dict) -> list[str]:
    env, counts = suite.get("environment") or {}, suite.get("counts") or {}
    outcome = ", ".join(f"{n:,} {key}" for key, n in counts.items() if n)
    lines = ["## The test suite (`make test`)", "",
             f"{suite['seconds'] / 60:.1f} minutes ({suite['seconds']:,.0f} s) at commit "
             f"{suite.get('git_commit') or 'unknown'} on {env.get('cpu_model') or 'an unknown CPU'} "
             f"({env.get('cpu_cores')} cores), {suite.get('created', '')[:10]}: {outcome or 'no test ran'}. "
             "The slowest tests:", "", "| test | seconds |", "| --- | ---: |"]
    lines += [f"| `{row['test']}` | {row['seconds']:.1f} |" for row in suite.get("slowest", [])]
    if suite.get("files"):  # records before per-file totals have none
        lines += ["", "The files that take the most time (setup, test and teardown summed):", "",
                  "| file | tests | seconds |", "| --- | ---: | ---: |"]
        lines += [f"| `{row['file']}` | {row['tests']} | {row['seconds']:.1f} |" for row in suite["files"][:12]]
    return lines + [""]


def read_suite_record(path) -> dict:
    """A ``make test`` record (conftest.py's ``--suite-record``), refused in one line unless it is a whole run."""
    path = Path(path)
    try:
        suite = json.loads(path.read_text())
    except (OSError, ValueError) as err:
        raise WorkshopError(f"{path} is not a readable test-suite record ({type(err).__name__}).",
                            "pass the runs/test-suite-<stamp>.json that `make test` wrote.") from None
    if not isinstance(suite, dict) or suite.get("kind") != "test_suite" or not isinstance(suite.get("seconds"), (int, float)):
        raise WorkshopError(f"{path} is not a test-suite record.", "pass the runs/test-suite-<stamp>.json `make test` wrote.")
    if suite.get("marker_expression"):
        raise WorkshopError(f"{path} timed only the tests marked `{suite['marker_expression']}`.",
                            "keep the record of a whole `make test`.")
    if suite.get("exit_status") != 0 or (suite.get("counts") or {}).get("failed"):
        raise WorkshopError(f"{path} is the record of a test run that failed.", "keep the record of a passing `make test`.")
    suite.setdefault("created", (suite.get("environment") or {}).get("date") or "")
    return suite


def keep_suite_record(path, reference=None) -> Path:
    """Put a ``make test`` record on the measurements page; the notebooks' facts stay as they are."""
    target = Path(reference) if reference is not None else default_reference()
    try:
        facts = json.loads((target / "reference.json").read_text())
    except (OSError, ValueError):
        raise WorkshopError(f"{target} holds no reference.json to add the test suite's time to.",
                            "record a main-job run first: python -m workshop_utils.reference runs/<stamp>.") from None
    facts["test_suite"] = read_suite_record(path)
    write_json(facts, target / "reference.json")
    (target / "RUN.md").write_text(run_page(facts))
    return target


def keep_as_reference(run_dir, reference=None) -> Path:
    """Replace the reference results with the run folder's; return the reference folder."""
    run = Path(run_dir)
    if not run.is_dir():
        raise WorkshopError(f"Run folder {run} does not exist.", "pass a folder written by `make run` (runs/<stamp>).")
    log = _notebook_log(run)
    records = read_records(run)
    if not records:
        raise WorkshopError(f"{run} holds no results/*.json.", "pass a folder written by `make run`.")
    target = Path(reference) if reference is not None else default_reference()
    target.mkdir(parents=True, exist_ok=True)
    for name in REPLACED:
        old = target / name
        if old.is_dir():
            shutil.rmtree(old)
        elif old.exists():
            old.unlink()
        if (run / name).is_dir():
            shutil.copytree(run / name, old)
        elif (run / name).exists():
            shutil.copy2(run / name, old)
    environment = next((r["environment"] for r in records if isinstance(r.get("environment"), dict)), {})
    commits = {r.get("git_commit") for r in records if r.get("git_commit")}
    commit = _one_commit(run, commits) if commits else git_commit()  # what the run ran at, not what is checked out
    previous = target / "reference.json"
    try:  # the test suite's time was measured apart from the run: it stays until a newer one is kept
        suite = json.loads(previous.read_text()).get("test_suite") if previous.exists() else None
    except (OSError, ValueError, AttributeError):
        suite = None
    facts = {"run": run.name, "commit": commit, "commit_time": _commit_time(commit),
             "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
             "profile": log[0].get("profile"), "environment": environment,
             "notebooks": [{k: e.get(k) for k in ("notebook", "seconds", "budget_s")} for e in log]}
    if suite:
        facts["test_suite"] = suite
    write_json(facts, target / "reference.json")
    (target / "RUN.md").write_text(run_page(facts))
    return target


def build_parser() -> OneLineParser:
    parser = OneLineParser(prog="python -m workshop_utils.reference", description=__doc__,
                           formatter_class=argparse.RawDescriptionHelpFormatter,
                           fix="see `python -m workshop_utils.reference --help`.")
    parser.add_argument("run_dir", nargs="?", help="a complete main-job run folder (runs/<stamp>)")
    parser.add_argument("--tests", metavar="JSON", help="a passing `make test`'s record (runs/test-suite-<stamp>.json)")
    parser.add_argument("--into", metavar="DIR", help="the reference folder (default: results/reference/)")
    return parser


@exit_on_workshop_error
def main(argv=None) -> None:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.run_dir is None and args.tests is None:
        parser.error("give a main-job run folder, a test-suite record (--tests), or both.")
    if args.tests is not None:
        read_suite_record(args.tests)  # refused before a run replaces anything
    if args.run_dir is not None:
        target = keep_as_reference(args.run_dir, args.into)
        print(f"Reference results replaced from {args.run_dir}: {target} (see {target / 'RUN.md'})")
    if args.tests is not None:
        target = keep_suite_record(args.tests, args.into)
        print(f"The test suite's time kept from {args.tests}: {target / 'RUN.md'}")


if __name__ == "__main__":
    main()
