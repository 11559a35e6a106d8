"""Run folders and result records.

Every measurement is saved with what produced it: a JSON record holding the
configuration, the metrics, the environment, the git commit and the time. The
main job gives every notebook the same run folder (``runs/<timestamp>/``); a
notebook opened by hand gets a fresh one. ``load_results`` turns a folder of
records into one pandas table.
"""

from __future__ import annotations

import errno
import json
import math
import os
import subprocess
import tempfile
import threading
from datetime import datetime
from pathlib import Path

from .errors import WorkshopError


RUNS_VARIABLE = "WORKSHOP_RUNS"


def _own_folder(path: Path | None) -> bool:
    """Whether ``path`` is a folder this user owns and may write into (not a shared install, not another's)."""
    try:
        return path is not None and path.is_dir() and path.stat().st_uid == os.geteuid() \
            and os.access(path, os.W_OK | os.X_OK)
    except OSError:
        return False


def _working_folder() -> Path | None:
    try:
        return Path.cwd()
    except OSError:  # the folder this process was started in has been removed
        return None


def runs_root_and_why() -> tuple[Path, str]:
    """Where run folders go, and why there (for a message): see ``runs_root``."""
    given = os.environ.get(RUNS_VARIABLE, "").strip()
    if given:
        try:
            return Path(given).expanduser().absolute(), f"${RUNS_VARIABLE}"
        except RuntimeError:  # ~user of no such user
            raise WorkshopError(f"{RUNS_VARIABLE}={given!r} names the home of a user this machine does not know.",
                                f"set {RUNS_VARIABLE} to a folder you can write, e.g. ~/workshop-runs.") from None
    checkout, here = repo_root(), _working_folder()
    if here is not None and checkout is not None and here.is_relative_to(checkout) and _own_folder(checkout):
        return checkout / "runs", "your checkout of the kit"
    if _own_folder(here):
        return here / "runs", "your working folder"
    why = ("no working folder" if here is None else
           f"the working folder {path_for_message(here)} is not yours to write")
    return Path.home() / "workshop-runs", f"your home: {why}"


def runs_root() -> Path:
    """Where run folders go: this user's own space, never a shared install of the kit.

    $WORKSHOP_RUNS when set (a portal's spawner sets it per attendee); else, inside a checkout of the kit that is
    this user's own (a developer's or instructor's clone: make run, make slides), its runs/; else runs/ in the
    working folder when that is this user's own (an attendee's copy of the notebooks: a kernel works in the
    notebook's folder); else ~/workshop-runs. On a portal thirty attendees import one install: writing into it
    would mix their results, or fail for all but its owner.
    """
    return runs_root_and_why()[0]


def _run_name(tag: str | None) -> str:
    stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
    if tag is None:
        return stamp
    if not isinstance(tag, str) or not tag or tag in (".", "..") or any(c in tag for c in "/\\\0") \
            or not tag.isprintable():
        raise WorkshopError(f"Run folder tag {tag!r} is not a plain name.",
                            "give a name without slashes, such as 'baseline', or None.")
    return f"{stamp}-{tag}"


def new_run_dir(tag: str | None = None) -> Path:
    """A fresh, uniquely named folder under ``runs_root()``; a place that cannot be written is one line."""
    name = _run_name(tag)
    root, why = runs_root_and_why()
    try:
        return fresh_folder(root, name)
    except OSError as err:
        raise WorkshopError(f"Cannot create a run folder in {path_for_message(root)} ({why}): {err.strerror or err}.",
                            f"set {RUNS_VARIABLE} to a folder you can write (e.g. export {RUNS_VARIABLE}=$SCRATCH/"
                            "workshop-runs), or pass run_dir= a folder of your own.") from None


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
    if run_dir is not None and not isinstance(run_dir, (str, os.PathLike)):
        raise WorkshopError(f"run_dir={run_dir!r} is not a folder path.",
                            "pass a folder such as run_dir='runs/mine', or None for a new folder under runs/.")
    if run_dir:
        path = Path(run_dir)
        try:
            path = path.expanduser()  # "~/runs/mine" is the home's, never a folder named ~ here
            path.mkdir(parents=True, exist_ok=True)
        except (OSError, ValueError, RuntimeError) as err:  # RuntimeError: ~user of no such user
            raise WorkshopError(f"Cannot create the run folder {path_for_message(path)}: "
                                f"{getattr(err, 'strerror', None) or err}.",
                                "pass a folder you can write to, or None for a new one under runs/.") from None
        return path
    return new_run_dir(tag)


def repo_root() -> Path | None:
    """The checkout this package lives in (None when installed elsewhere)."""
    here = Path(__file__).resolve().parents[2]
    return here if (here / "pyproject.toml").exists() else None


def git_commit() -> str | None:
    """The checkout's commit; in a copy without git history (a node's scratch copy), $WORKSHOP_GIT_COMMIT."""
    root, given = repo_root(), os.environ.get("WORKSHOP_GIT_COMMIT") or None
    if root is None:
        return given
    try:
        out = subprocess.run(["git", "-C", str(root), "rev-parse", "--short", "HEAD"],
                             capture_output=True, text=True, timeout=10)
        return out.stdout.strip() or given
    except (OSError, subprocess.SubprocessError):
        return given


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


def os_error_under(err: BaseException | None) -> OSError | None:
    """The OSError under ``err``: torch's zip writer, closing after a failed write, raises a RuntimeError over the
    OSError, which it keeps as the context. Any other error stays itself: a bug is never called a full disk."""
    while isinstance(err, RuntimeError):
        err = err.__context__
    return err if isinstance(err, OSError) else None


def no_room(err: BaseException, path: str | os.PathLike, what: str,
            fix: str = f"free space there (delete old run folders under runs/), or give the run a folder on another "
                       f"disk (run_dir, or ${RUNS_VARIABLE}), and run the cell again.") -> WorkshopError | None:
    """A write that failed because the disk is full or the user's quota is used up, as one line; else None."""
    cause = os_error_under(err)
    if cause is None or cause.errno not in (errno.ENOSPC, errno.EDQUOT):
        return None
    why = "the disk is full" if cause.errno == errno.ENOSPC else "your disk quota is used up"
    return WorkshopError(f"{what} {path_for_message(Path(path))} not written: {why} ({cause.strerror}).", fix)


def write_atomically(path: str | os.PathLike, write, what: str | None = "File") -> Path:
    """``write(temporary_path)``, then the temporary file renamed to ``path``: a reader sees the old file or the
    new one, never half of one, and a full disk is one line naming ``what`` (with ``what=None``, the OSError)."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}-{threading.get_ident()}")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)  # a new folder needs room too (a block, an inode)
        write(tmp)
        os.replace(tmp, path)
    except BaseException as err:
        tmp.unlink(missing_ok=True)  # a disk-full write leaves no half file behind
        failure = no_room(err, path, what) if what is not None and isinstance(err, Exception) else None
        if failure is None:
            raise
        raise failure from None
    return path


def write_json(record: dict | list, path: str | os.PathLike, what: str | None = "Record") -> Path:
    """Write the record atomically: a reader never sees half a file."""
    text = json.dumps(jsonable(record), indent=2)
    return write_atomically(path, lambda tmp: tmp.write_text(text), what)


def save_record(record: dict, run_dir: str | os.PathLike, name: str) -> Path:
    """Write ``record`` as ``<run_dir>/results/<name>.json`` (atomically) and return the path."""
    return write_json({"name": name, "git_commit": git_commit(), **record}, Path(run_dir) / "results" / f"{name}.json")


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


def path_for_message(path) -> str:
    """A path as it reads in a one-line message: quoted when it holds a line break or another control."""
    text = str(path)
    return text if text.isprintable() else repr(text)


def check_output_path(path: str | os.PathLike, *, folder: bool = False, what: str = "output") -> Path:
    """``path`` as a Path when this process can write it (a file, or a folder when ``folder``); else a WorkshopError.

    For entries to call before any work starts, not after an hour of training. Nothing is
    created: a path that does not exist yet needs its nearest existing parent to be a folder
    this process may write into. ``what`` names the path in the message (a flag, a field).
    """
    path = Path(path)
    shown = f"{what} {path_for_message(path)}"
    try:
        if "\0" in str(path):  # pathlib answers "does not exist" here; every write would fail
            raise ValueError("a NUL character")
        is_dir, exists = path.is_dir(), path.exists()
        must_write = path if is_dir else path.parent
        while not must_write.exists():
            must_write = must_write.parent
    except (OSError, ValueError) as err:  # a NUL, a name too long, a folder we may not even look into
        raise WorkshopError(f"{shown} is not a usable path ({err}).", "give another path.") from None
    if is_dir and not folder:
        raise WorkshopError(f"{shown} is a folder, not a file.",
                            f"give a file name in it, e.g. {path_for_message(path / 'result.json')}.")
    if exists and folder and not is_dir:
        raise WorkshopError(f"{shown} is a file, not a folder.",
                            "give a folder (a new one is created), or move that file away.")
    if not must_write.is_dir():
        raise WorkshopError(f"{shown} cannot be created: {path_for_message(must_write)} is a file, not a folder.",
                            "give a path outside that file, or move the file away.")
    if not os.access(must_write, os.W_OK | os.X_OK):
        raise WorkshopError(f"{shown} cannot be written: {path_for_message(must_write)} is read-only for this user.",
                            "give a path in a folder you may write (your $HOME, $SCRATCH or the run folder).")
    return path


def write_json_or_fallback(record: dict, path: str | os.PathLike) -> tuple[Path, OSError | None]:
    """Write the record to ``path``; if that fails (disk full, quota, folder gone), to a new temporary file.

    A result that took hours must not be lost to its very last write. Returns where it went and
    the error that sent it elsewhere (None when ``path`` took it); raises that error only when
    the temporary folder and the current folder refuse it too.
    """
    try:
        return write_json(record, path, what=None), None  # the OSError itself: the fallback below takes over
    except OSError as err:
        failure = err
    text = json.dumps(jsonable(record), indent=2)
    for folder in (None, os.curdir):  # None: the system's temporary folder ($TMPDIR)
        name = None
        try:
            handle, name = tempfile.mkstemp(prefix=f"{Path(path).stem}-", suffix=".json", dir=folder)
            with os.fdopen(handle, "w") as file:
                file.write(text)
            return Path(os.path.abspath(name)), failure
        except OSError:
            if name is not None:
                Path(name).unlink(missing_ok=True)  # half a record is worse than none: it reads as one
    raise failure
