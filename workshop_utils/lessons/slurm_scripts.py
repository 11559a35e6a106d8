"""The kit's job scripts (``slurm/``) as templates: where they are, their lines, the training flags after the
script's name (``config_flags``, from a ``TrainConfig``, so no flag is typed twice), and env_check's sbatch
options sized to the cluster's nodes.
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

from ..system.errors import WorkshopError
from ..system.results import repo_root
from .slurm_text import gpus_in_gres

# Fields of TrainConfig that the job scripts set themselves (from the job's name and run folder).
SCRIPT_FIELDS = ("name", "checkpoint_dir", "resume", "progress")


def slurm_folder() -> Path:
    root = repo_root()
    folder = (root / "slurm") if root is not None else Path.cwd() / "slurm"
    if not folder.is_dir():
        raise WorkshopError("The kit's job scripts (slurm/) are not here.",
                            "run this notebook from a checkout of the workshop.")
    return folder


def template(name: str) -> Path:
    """One of the kit's job scripts, by file name."""
    path = slurm_folder() / name
    if not path.is_file():
        known = ", ".join(p.name for p in sorted(slurm_folder().glob("*.sbatch")))
        raise WorkshopError(f"No job script {name!r} in {slurm_folder()}.", f"use one of: {known}.")
    return path


def script_lines(name: str, *patterns: str) -> str:
    """The lines of a job script that match any of ``patterns`` (all of it when none), numbered."""
    lines = template(name).read_text().splitlines()
    keep = [(i, line) for i, line in enumerate(lines, 1)
            if not patterns or any(re.search(p, line) for p in patterns)]
    return "\n".join(f"{i:3d}  {line}" for i, line in keep)


def config_flags(config, base=None, skip: tuple[str, ...] = SCRIPT_FIELDS, only: tuple[str, ...] | None = None
                 ) -> list[str]:
    """The flags of ``python -m workshop_utils.train`` that turn ``base`` (default: TrainConfig()) into ``config``.

    Generated from the config's fields, so a job script receives exactly what the notebook built. The
    fields in ``skip`` are the ones the job scripts set themselves, and are left out; ``only`` names the
    fields to give, whether or not they differ from ``base``. Each value is spelt by ``train_flags``
    (workshop_utils.parallel.launch), the one spelling that ``launch_training`` uses too.
    """
    from ..parallel.launch import train_flags
    from ..spine.config import TrainConfig, setting_of, validate_config

    # Checked as the command will see it: the skipped fields are the script's to set.
    validate_config(config.replace(**{name: getattr(TrainConfig(), name) for name in skip}))
    base = TrainConfig() if base is None else base
    chosen = {}
    for f in dataclasses.fields(TrainConfig):
        value, default = getattr(config, f.name), getattr(base, f.name)
        if f.name in skip or (only is not None and f.name not in only):
            continue
        if only is None and value == default and type(value) is type(default):
            continue
        if value is None and None not in setting_of(f).words.values():  # no word says None on the command line
            if only is not None and getattr(TrainConfig(), f.name) is None:
                continue  # the command's own default is None too
            raise WorkshopError(f"{f.name}=None has no flag: the command's default is {default!r}.",
                                f"leave {f.name} at its default in the config.")
        chosen[f.name] = value
    return train_flags(chosen)


def varying_fields(configs) -> tuple[str, ...]:
    """The TrainConfig fields whose values differ between ``configs`` (what a sweep sweeps)."""
    names = [f.name for f in dataclasses.fields(configs[0])]
    return tuple(n for n in names if len({repr(getattr(c, n)) for c in configs}) > 1)


def env_check_request(nodes, tasks: int, gpus_per_task: int) -> tuple[list[str], str]:
    """sbatch options for env_check's tasks, sized to the nodes ``node_table`` lists, and one line saying why.

    Tasks with GPUs go to as few nodes as hold them; a cluster with fewer GPUs than asked for gets
    fewer tasks, not a request sbatch refuses ("Requested node configuration is not available").
    """
    if not gpus_per_task:
        return [f"--ntasks={tasks}"], f"env_check: {tasks} task(s), no GPU."
    per_node = sorted((gpus_in_gres(g) // gpus_per_task for g in nodes["gres"]), reverse=True) if len(nodes) else []
    per_node = [n for n in per_node if n > 0]
    if not per_node:
        raise WorkshopError(f"No node lists a GPU in its GRES, so {tasks} task(s) with {gpus_per_task} GPU(s) each "
                            "cannot be placed.", "run the cpu profile (profile='cpu') or ask your admins which "
                            "partition has GPUs (sinfo -o '%P %G').")
    fit, used = 0, 0
    for capacity in per_node:  # the nodes with most GPUs first: as few nodes as possible
        if fit >= tasks:
            break
        fit, used = fit + min(capacity, tasks - fit), used + 1
    options = [f"--nodes={used}", f"--ntasks={fit}", f"--gpus-per-task={gpus_per_task}"]
    said = (f"env_check: {fit} task(s) with {gpus_per_task} GPU(s) each on {used} node(s)"
            + ("." if fit == tasks else f" ({tasks} asked for; this cluster's nodes hold {sum(per_node)} such "
                                        f"task(s) at most)."))
    return options, said
