"""Run folders and result records.

Every measurement is saved with what produced it: a JSON record holding the
configuration, the metrics, the environment, the git commit and the time. The
main job gives every notebook the same run folder (``runs/<timestamp>/``); a
notebook opened by hand gets a fresh one. ``load_results`` turns a folder of
records into one pandas table.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
from datetime import datetime
from pathlib import Path

from .errors import WorkshopError


def runs_root() -> Path:
    """Where run folders go: $WORKSHOP_RUNS, else <repo>/runs, else ./runs."""
    if os.environ.get("WORKSHOP_RUNS"):
        return Path(os.environ["WORKSHOP_RUNS"])
    return (repo_root() or Path.cwd()) / "runs"


def new_run_dir(tag: str | None = None) -> Path:
    """A fresh, uniquely named folder under ``runs_root()``."""
    stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
    return fresh_folder(runs_root(), f"{stamp}-{tag}" if tag else stamp)


def fresh_folder(parent: str | os.PathLike, name: str) -> Path:
    """A new, empty folder ``parent/name`` (``name-2``, ``name-3``, ... when taken), never an existing one.

    A demo that resumes from "the newest checkpoint in its folder" must not find an earlier
    run's: it would skip the very work it claims to redo.
    """
    parent = Path(parent)
    parent.mkdir(parents=True, exist_ok=True)
    n = 1
    while True:
        path = parent / (name if n == 1 else f"{name}-{n}")
        try:
            path.mkdir()  # atomic: two runs racing for one name get different folders
            return path
        except FileExistsError:
            n += 1


def resolve_run_dir(run_dir: str | os.PathLike | None, tag: str | None = None) -> Path:
    """The run folder a notebook writes into: the one given (papermill, main job) or a new one."""
    if run_dir:
        path = Path(run_dir)
        path.mkdir(parents=True, exist_ok=True)
        return path
    return new_run_dir(tag)


def repo_root() -> Path | None:
    """The checkout this package lives in (None when installed elsewhere)."""
    here = Path(__file__).resolve().parents[2]
    return here if (here / "pyproject.toml").exists() else None


def git_commit() -> str | None:
    root = repo_root()
    if root is None:
        return None
    try:
        out = subprocess.run(["git", "-C", str(root), "rev-parse", "--short", "HEAD"],
                             capture_output=True, text=True, timeout=10)
        return out.stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


def jsonable(value):
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return None  # JSON has no NaN; a missing value is the honest encoding
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    if hasattr(value, "item"):  # numpy or torch scalar
        return jsonable(value.item())
    return str(value)


def write_json(record: dict, path: str | os.PathLike) -> Path:
    """Write the record atomically: a reader never sees half a file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    tmp.write_text(json.dumps(jsonable(record), indent=2))
    os.replace(tmp, path)
    return path


def save_record(record: dict, run_dir: str | os.PathLike, name: str) -> Path:
    """Write ``record`` as ``<run_dir>/results/<name>.json`` (atomically) and return the path."""
    folder = Path(run_dir) / "results"
    folder.mkdir(parents=True, exist_ok=True)
    record = {"name": name, "git_commit": git_commit(), **record}
    path = folder / f"{name}.json"
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(jsonable(record), indent=2))
    os.replace(tmp, path)
    return path


def read_records(run_dir: str | os.PathLike, problems: list[str] | None = None) -> list[dict]:
    """Every record of a run folder. A file that is not a readable record (a write cut short by a killed
    process, an edit gone wrong) raises a WorkshopError naming it, or, when ``problems`` is a list, is
    skipped and named there, so one bad file cannot cost the report of all the others."""
    folder = Path(run_dir) / "results"
    records = []
    for path in sorted(folder.glob("*.json")) if folder.is_dir() else []:
        try:
            record = json.loads(path.read_text())
            if not isinstance(record, dict):
                raise ValueError("not a JSON object")
        except (OSError, UnicodeDecodeError, ValueError) as err:
            problem = f"{path} is not a readable result record ({type(err).__name__}: {err})."
            if problems is None:
                raise WorkshopError(problem, "move it out of the results/ folder, or rerun what wrote it.") from None
            problems.append(problem)
            continue
        records.append(record)
    return records


def load_results(run_dir: str | os.PathLike, kind: str | None = None):
    """Training records of a run folder as a DataFrame: one row each, config and metrics as columns."""
    import pandas as pd

    rows = []
    for record in read_records(run_dir):
        if kind is not None and record.get("kind") != kind:
            continue
        row = {"name": record["name"], "kind": record.get("kind")}
        row.update(record.get("config", {}))
        row.update(record.get("metrics", {}))
        rows.append(row)
    return pd.DataFrame(rows)
