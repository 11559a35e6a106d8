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
    return "\n".join(lines)


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
    facts = {"run": run.name, "commit": commit, "commit_time": _commit_time(commit),
             "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
             "profile": log[0].get("profile"), "environment": environment,
             "notebooks": [{k: e.get(k) for k in ("notebook", "seconds", "budget_s")} for e in log]}
    write_json(facts, target / "reference.json")
    (target / "RUN.md").write_text(run_page(facts))
    return target


def build_parser() -> OneLineParser:
    parser = OneLineParser(prog="python -m workshop_utils.reference", description=__doc__,
                           formatter_class=argparse.RawDescriptionHelpFormatter,
                           fix="see `python -m workshop_utils.reference --help`.")
    parser.add_argument("run_dir", help="a complete main-job run folder (runs/<stamp>)")
    parser.add_argument("--into", metavar="DIR", help="the reference folder (default: results/reference/)")
    return parser


@exit_on_workshop_error
def main(argv=None) -> None:
    args = build_parser().parse_args(argv)
    target = keep_as_reference(args.run_dir, args.into)
    print(f"Reference results replaced from {args.run_dir}: {target} (see {target / 'RUN.md'})")


if __name__ == "__main__":
    main()
