"""The DDP lab's files and settings: where its scripts are, the attendee's copy, the finished script,
the environment the ranks start in, and the throughput line a run prints.

Both the checks that launch ranks (``ddp_lab``) and the judging of what the ranks did
(``ddp_lab_judging``) read these, so they sit below both.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from ..system.errors import WorkshopError
from ..system.results import repo_root
from .exercises import attendee_source

LAB_EXERCISE = "Exercise 2.2"
GRADIENTS_EXERCISE = "Exercise 2.1"
EFFICIENCY_EXERCISE = "Exercise 2.3"
PROBE_MODULE = "workshop_utils.lessons.ddp_lab"
TORCHRUN_LOGS = "torchrun"  # the check folder's subfolder where torchrun has the ranks write their error files
SOLUTION_FILE = "train_ddp.py"
STARTER_NAME = "my_train_ddp.py"
# Variables a kernel started inside a job would otherwise hand on to the ranks it launches.
DIST_VARIABLES = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
                  "GROUP_RANK", "TORCHELASTIC_RUN_ID")
THROUGHPUT = re.compile(r"(\d[\d,]*(?:\.\d+)?(?:[eE][+-]?\d+)?)\s*(?:samples|images|imgs?|examples)\s*"
                        r"(?:/\s*s(?:ec(?:ond)?)?\b|per\s+s(?:ec(?:ond)?)?\b)", re.IGNORECASE)
LOSS_LINE = re.compile(r"\bloss\b", re.IGNORECASE)


# ---------------------------------------------------------------- the lab's files


def lab_folder(folder=None) -> Path:
    """The folder holding the lab's scripts: ``folder``, else the checkout's, else ./labs/ddp_lab."""
    candidates = [Path(folder)] if folder is not None else [
        *([repo_root() / "notebooks" / "labs" / "ddp_lab"] if repo_root() else []),
        Path.cwd() / "labs" / "ddp_lab", Path.cwd() / "notebooks" / "labs" / "ddp_lab"]
    for path in candidates:
        if (path / SOLUTION_FILE).exists():
            return path
    raise WorkshopError(f"Cannot find the DDP lab's {SOLUTION_FILE} (looked in {', '.join(map(str, candidates))}).",
                        "run from a checkout of the workshop, or pass the folder that holds notebooks/labs/ddp_lab.")


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
    text = attendee_source(src.read_text(), src.name)
    dst.parent.mkdir(parents=True, exist_ok=True)
    dst.write_text(text + "\n")
    return dst


def start_ddp_lab(run_dir, lab=None) -> Path:
    """The attendee's DDP script in ``run_dir/ddp_lab/``: written once, kept as edited when run again."""
    path = Path(run_dir) / "ddp_lab" / STARTER_NAME
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


def clean_env(threads: int | None = None, hide_gpus: bool = False) -> dict:
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    for name in DIST_VARIABLES:
        env.pop(name, None)
    if threads:
        env["OMP_NUM_THREADS"] = str(threads)
    if hide_gpus:
        env["CUDA_VISIBLE_DEVICES"] = ""  # CPU ranks on a GPU node must not reach for GPU 0
    return env


def reported_throughput(lines) -> float | None:
    """The last samples/s figure in ``lines`` ("throughput: 1234 samples/s"), or None."""
    found = [m.group(1) for line in lines for m in THROUGHPUT.finditer(line)]
    return float(found[-1].replace(",", "")) if found else None


def read_output(path: Path) -> str:
    """A file a rank writes (its output, its record), or "" when the rank never got to write it."""
    return path.read_text(errors="replace") if path.exists() else ""
