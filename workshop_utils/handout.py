"""``python -m workshop_utils.handout``: copy the workshop's notebooks into an attendee's own folder.

On a portal every attendee imports one shared install of the kit and works in a copy of the notebooks
of their own (results go beside it, in runs/). One line in a terminal of their server, or in the
spawner's start-up for everyone::

    python -m workshop_utils.handout                 # ~/workshop: the attendees' copies, exercises to fill in
    python -m workshop_utils.handout ~/solutions --solutions   # the solved notebooks, when the instructor hands them out

A notebook already in the folder is kept (an attendee's work is never overwritten); the command says
which it kept. The DDP lab's scripts are copied beside the notebooks, as notebook 02 expects.
"""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path

from .lessons.exercises import attendee_notebook
from .run_notebooks import notebooks_folder
from .system.errors import OneLineParser, WorkshopError, exit_on_workshop_error
from .system.results import check_output_path


def hand_out(folder, solutions: bool = False, source=None, quiet: bool = False) -> list[Path]:
    """Write the notebooks (attendee copies, or the solved ones) and the lab into ``folder``; return what was written."""
    target = check_output_path(Path(folder).expanduser(), folder=True, what="handout folder")
    notebooks = notebooks_folder(source)
    sources = sorted(notebooks.glob("*.ipynb"))
    if not sources:
        raise WorkshopError(f"No notebook in {notebooks}.", "pass the kit's notebooks/ folder with --from.")
    target.mkdir(parents=True, exist_ok=True)
    written, kept = [], []
    for notebook in sources:
        copy = target / notebook.name
        if copy.exists():
            kept.append(copy.name)
            continue
        if solutions:
            shutil.copyfile(notebook, copy)
        else:
            attendee_notebook(notebook, copy)
        written.append(copy)
    lab = notebooks / "labs"
    if lab.is_dir() and not (target / "labs").exists():
        shutil.copytree(lab, target / "labs", ignore=shutil.ignore_patterns("__pycache__"))
        written.append(target / "labs")
    if not quiet:
        print(f"{len(written)} written to {target}" + (f"; kept your own {', '.join(kept)}" if kept else "")
              + ". Open them in JupyterLab's file browser; results go to runs/ beside them.")
    return written


def build_parser() -> OneLineParser:
    parser = OneLineParser(prog="python -m workshop_utils.handout", description=__doc__,
                           formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("folder", nargs="?", default="~/workshop", help="where the copies go (default: ~/workshop)")
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
