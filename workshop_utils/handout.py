"""``python -m workshop_utils.handout``: copy the workshop's notebooks into an attendee's own folder.

On a portal every attendee imports one shared install of the kit and works in a copy of the notebooks
of their own (results go beside it, in runs/). One line in a terminal of their server, or in the
spawner's start-up for everyone::

    python -m workshop_utils.handout                 # ~/workshop: the attendees' copies, exercises to fill in
    python -m workshop_utils.handout --solutions     # ~/workshop-solutions: the solved notebooks, when handed out

A notebook already in the folder is kept (an attendee's work is never overwritten); the command says
which it kept. A file there that is no notebook (a copy cut short by a full disk) is set aside and
written again. Notebook 02's lab reads its scripts from the kit and writes the attendee's copy into their
own run folder, so the lab needs nothing handed out.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
from datetime import datetime
from pathlib import Path

from .system.errors import OneLineParser, WorkshopError, exit_on_workshop_error
from .exercises.exercise_cells import BEGIN_SOLUTION, attendee_source
from .system.results import check_output_path, path_for_message, repo_root

DEFAULT, SOLUTIONS_DEFAULT = "~/workshop", "~/workshop-solutions"
EXERCISE_TAG = "exercise"
CHECK_TAG = "check"
NBVAL_CHECKED_TAG = "nbval-check-output"  # nbval compares the cell's output with tests/nbval/<notebook>.json


def _path(text, what: str) -> Path:
    if not str(text).strip():
        raise WorkshopError(f"{what} is empty.", f"give a folder, e.g. {DEFAULT}, or leave it out for the default.")
    try:
        return Path(str(text)).expanduser()
    except RuntimeError:  # ~user of a user this machine does not know
        raise WorkshopError(f"{what} {text!r}: no such user's home.", f"give a folder such as {DEFAULT}.") from None


def _notebooks(source) -> Path:
    folder = _path(source, "--from") if source is not None else (repo_root() or Path.cwd()) / "notebooks"
    if not folder.is_dir():
        raise WorkshopError(f"{path_for_message(folder)} is not a folder of notebooks.",
                            "pass the kit's notebooks/ folder with --from.")
    return folder


def _is_notebook(path: Path) -> bool:
    try:
        return path.is_file() and isinstance(json.loads(path.read_text()).get("cells"), list)
    except (OSError, ValueError, AttributeError):
        return False


def _write_atomically(path: Path, write) -> None:
    """``write(temporary path)``, then the rename: a copy cut short (a full disk) never stands as a notebook."""
    handle, temporary = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    os.close(handle)
    try:
        write(Path(temporary))
        os.chmod(temporary, 0o644)
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


def attendee_notebook(source_path, out_path) -> int:
    """Write the attendee's copy of one notebook, outputs cleared; return its number of exercises. The tag
    ``exercise`` and a solution block go together: no solution reaches an attendee untagged."""
    import nbformat

    source_path, out_path = Path(source_path), Path(out_path)
    if source_path.resolve() == out_path.resolve():
        raise WorkshopError(f"Would overwrite the source notebook {source_path}.", "write the copy to another folder.")
    notebook, exercises = nbformat.read(source_path, as_version=4), 0
    for index, cell in enumerate(notebook.cells):
        if cell.cell_type != "code":
            continue
        where = f"{source_path.name}, cell {index} (id {cell.get('id', '?')})"
        attendee = attendee_source(cell.source, where)  # a malformed block stops here, naming its line
        tags = list(cell.get("metadata", {}).get("tags", []))
        tagged, blocked = EXERCISE_TAG in tags, any(line.strip() == BEGIN_SOLUTION for line in cell.source.splitlines())
        if tagged != blocked:
            raise WorkshopError(f"{where}: " + ("tagged 'exercise' but holds no solution block." if tagged else
                                                "holds a solution block but is not tagged 'exercise'."),
                                "an exercise cell holds its solution between the markers and carries the tag "
                                "'exercise'.")
        if CHECK_TAG in tags:  # the solved check's expected output is its ✓ line, the copy's "not yet solved"
            cell.metadata["tags"] = [tag for tag in tags if tag != NBVAL_CHECKED_TAG]
        cell.source, cell.outputs, cell.execution_count = attendee, [], None
        cell.metadata.pop("execution", None)  # papermill's timings of the solved run
        exercises += tagged
    out_path.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(notebook, out_path)
    return exercises


def write_attendee_notebooks(folder_in="notebooks", folder_out="notebooks/attendee") -> list[Path]:
    sources = sorted(Path(folder_in).glob("*.ipynb"))
    if not sources:
        raise WorkshopError(f"No notebook in {folder_in}.", "pass the folder that holds the committed notebooks.")
    written = [Path(folder_out) / source.name for source in sources]
    for source, target in zip(sources, written):
        count = attendee_notebook(source, target)
        print(f"{target}: {count} exercise{'s' * (count != 1)}")
    return written


def hand_out(folder=None, solutions: bool = False, source=None, quiet: bool = False) -> list[Path]:
    """Write the notebooks (attendee copies, or the solved ones) into ``folder``; return what was written."""
    target = check_output_path(_path(folder if folder is not None else SOLUTIONS_DEFAULT if solutions else DEFAULT,
                                     "The handout folder"), folder=True, what="handout folder")
    notebooks = _notebooks(source)
    sources = sorted(notebooks.glob("*.ipynb"))
    if not sources:
        raise WorkshopError(f"No notebook in {path_for_message(notebooks)}.", "pass the kit's notebooks/ folder with --from.")
    written, kept, redone = [], [], []
    try:
        target.mkdir(parents=True, exist_ok=True)
        for notebook in sources:
            copy = target / notebook.name
            if _is_notebook(copy):
                kept.append(copy.name)
                continue
            if copy.exists() or copy.is_symlink():  # not a notebook: set aside, never deleted
                copy.rename(copy.with_name(f"{copy.name}.not-a-notebook-{datetime.now():%Y%m%d-%H%M%S}"))
                redone.append(copy.name)
            _write_atomically(copy, (lambda temporary, notebook=notebook: shutil.copyfile(notebook, temporary))
                              if solutions else
                              (lambda temporary, notebook=notebook: attendee_notebook(notebook, temporary)))
            written.append(copy)
    except OSError as err:
        raise WorkshopError(f"The handout could not write into {path_for_message(target)}: {err.strerror or err}"
                            + (f" ({path_for_message(err.filename)})" if err.filename else "") + ".",
                            "free some space or give a folder you can write; what was written so far is whole.") \
            from None
    except (ValueError, TypeError, KeyError) as err:  # a notebook in --from that nbformat cannot read
        raise WorkshopError(f"A notebook in {path_for_message(notebooks)} cannot be read ({type(err).__name__}).",
                            "pass the kit's own notebooks/ folder with --from.") from None
    if not quiet:
        print(f"{len(written)} written to {path_for_message(target)}"
              + (f"; kept your own {', '.join(kept)}" if kept else "")
              + (f"; set aside what was no notebook: {', '.join(redone)}" if redone else "")
              + ". Open them in JupyterLab's file browser; results go to runs/ beside them.")
    return written


def build_parser() -> OneLineParser:
    parser = OneLineParser(prog="python -m workshop_utils.handout", description=__doc__,
                           formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("folder", nargs="?", help=f"where the copies go (default: {DEFAULT}, with --solutions "
                                                  f"{SOLUTIONS_DEFAULT})")
    parser.add_argument("--solutions", action="store_true", help="the solved notebooks instead of the exercises")
    parser.add_argument("--from", dest="source", metavar="DIR", help="the kit's notebooks/ folder (default: the "
                                                                     "installed checkout's)")
    return parser


@exit_on_workshop_error
def main(argv=None) -> None:
    args = build_parser().parse_args(argv)
    hand_out(args.folder, args.solutions, args.source)


if __name__ == "__main__":
    main()
