"""The main job: execute every notebook into one new run folder, then write the report.

    python -m workshop_utils.run_notebooks            # what `make run` does
    python -m workshop_utils.run_notebooks --only 01 --profile cpu

Each notebook runs headless with papermill, receives the run folder and the
profile as parameters, and its executed copy is kept in ``<run>/notebooks/``. A
notebook that fails does not stop the others, and the report is written anyway
with the failure listed: no result is lost. The exit code is 1 if any failed.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from .data import repo_root
from .errors import WorkshopError, exit_on_workshop_error
from .profiles import PROFILE_NAMES
from .report import write_report
from .results import resolve_run_dir


def notebooks_folder() -> Path:
    root = repo_root()
    if root is None or not (root / "notebooks").is_dir():
        raise WorkshopError("Cannot find the notebooks/ folder.", "run this from a checkout of the workshop.")
    return root / "notebooks"


def run_notebooks(run_dir=None, profile: str = "auto", only: list[str] | None = None) -> tuple[Path, list[dict]]:
    import papermill

    folder = notebooks_folder()
    selected = sorted(p for p in folder.glob("*.ipynb") if not only or any(p.name.startswith(o) for o in only))
    if not selected:
        raise WorkshopError(f"No notebook in {folder} matches {only}.", "use a prefix such as --only 01.")
    run_dir = resolve_run_dir(run_dir).resolve()
    (run_dir / "notebooks").mkdir(exist_ok=True)
    print(f"Run folder: {run_dir}", flush=True)
    log = []
    for notebook in selected:
        print(f"\n=== {notebook.name} (profile {profile})", flush=True)
        started = time.perf_counter()
        entry = {"notebook": notebook.name, "status": "ok", "seconds": None, "error": ""}
        try:
            papermill.execute_notebook(
                str(notebook), str(run_dir / "notebooks" / notebook.name),
                parameters={"profile": profile, "run_dir": str(run_dir)},
                cwd=str(folder), kernel_name="python3", progress_bar=True, log_output=False,
            )
        except Exception as err:  # a failed notebook is reported, and the others still run
            entry["status"] = "FAILED"
            entry["error"] = str(err).strip().splitlines()[-1][:300] if str(err).strip() else type(err).__name__
            print(f"!!! {notebook.name} failed: {entry['error']}", file=sys.stderr, flush=True)
        entry["seconds"] = round(time.perf_counter() - started, 1)
        log.append(entry)
        (run_dir / "notebooks.json").write_text(json.dumps(log, indent=2))
    report = write_report(run_dir)
    print(f"\nReport: {report}")
    return run_dir, log


@exit_on_workshop_error
def main(argv=None) -> None:
    parser = argparse.ArgumentParser(prog="python -m workshop_utils.run_notebooks", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--profile", default="auto", choices=PROFILE_NAMES,
                        help="size of every notebook: auto picks gpu when a GPU is visible, else cpu")
    parser.add_argument("--only", nargs="*", help="notebook name prefixes to run, e.g. 01 03")
    parser.add_argument("--run-dir", help="folder to write into (default: a new runs/<timestamp>/)")
    args = parser.parse_args(argv)
    _, log = run_notebooks(args.run_dir, args.profile, args.only)
    failed = [e["notebook"] for e in log if e["status"] != "ok"]
    if failed:
        print(f"error: {len(failed)} notebook(s) failed: {', '.join(failed)} (see the report)", file=sys.stderr)
        raise SystemExit(1)


if __name__ == "__main__":
    main()
