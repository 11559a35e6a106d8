"""What the kit's jobs wrote, read back: a job's run folder, a sweep's tasks as one table, and whether a
preempted and requeued run ended with the uninterrupted run's parameters.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from ..system.errors import WorkshopError
from ..system.results import write_atomically
from .slurm_scripts import SCRIPT_FIELDS


def run_folder(runs: str | os.PathLike, job_id: str) -> Path:
    """The run folder a kit job script made for ``job_id`` (``<runs>/<job name>-<job id>``)."""
    found = sorted(Path(runs).glob(f"*-{job_id}"))
    if not found:
        raise WorkshopError(f"Job {job_id} left no run folder in {runs}.", "read its output file: it failed early.")
    return found[0]


SWEEP_METRICS = ("steps", "final_train_loss", "final_test_loss", "final_test_acc", "samples_per_s", "wall_s")


def gather_array(folder: str | os.PathLike, out: str | os.PathLike | None = None):
    """One row per task of a ``train_array.sbatch`` sweep (``<folder>/task-<i>/result.json``), the settings
    that differ between tasks first, then what each task measured; written to ``out`` (CSV) when given."""
    import pandas as pd

    folder = Path(folder)
    records = {}
    for path in sorted(folder.glob("task-*/result.json")):
        records[int(path.parent.name.removeprefix("task-"))] = json.loads(path.read_text())
    if not records:
        raise WorkshopError(f"No task of the sweep wrote a result under {folder}.",
                            "read the tasks' output files (%x-%A_%a.out): they failed.")
    configs = pd.DataFrame([r["config"] for r in records.values()], index=list(records))
    varying = [c for c in configs.columns if configs[c].astype(str).nunique() > 1 and c not in SCRIPT_FIELDS]
    rows = []
    for task, record in sorted(records.items()):
        rows.append({"task": task, **{c: record["config"][c] for c in varying},
                     **{m: record["metrics"].get(m) for m in SWEEP_METRICS}})
    frame = pd.DataFrame(rows)
    if out is not None:
        write_atomically(out, lambda tmp: frame.to_csv(tmp, index=False), "Sweep table")
    return frame


def compare_final_parameters(reference_run: Path, resumed_run: Path) -> dict:
    """Did the interrupted and resumed run end with the uninterrupted run's parameters? Both runs' records and
    their last checkpoints, loaded and compared tensor by tensor."""
    from ..spine.checkpoint import latest_checkpoint, load_checkpoint
    from ..spine.models import build_model, max_parameter_difference, parameter_checksum

    records, models = {}, {}
    for label, run in (("uninterrupted", reference_run), ("preempted", resumed_run)):
        records[label] = json.loads((Path(run) / "result.json").read_text())
        last = latest_checkpoint(Path(run) / "checkpoints")
        if last is None:
            raise WorkshopError(f"The {label} run left no checkpoint in {run}/checkpoints.",
                                "train with checkpoint_every set.")
        models[label] = build_model(records[label]["config"]["model"])
        load_checkpoint(last, model=models[label], restore_rng=False)
    difference = max_parameter_difference(models["uninterrupted"], models["preempted"])
    rows = [{"run": label, "steps": r["metrics"]["steps"], "resumed_from_step": r["metrics"]["resumed_from_step"],
             "final_train_loss": r["metrics"]["final_train_loss"], "param_checksum": r["metrics"]["param_checksum"],
             "checkpoint_checksum": parameter_checksum(models[label])} for label, r in records.items()]
    same = (difference == 0.0 and rows[0]["param_checksum"] == rows[1]["param_checksum"]
            and rows[0]["steps"] == rows[1]["steps"])
    return {"rows": rows, "max_abs_difference": difference, "identical": same}


def preemption_verdict(result: dict) -> str:
    """One line on ``compare_final_parameters``: was the run really interrupted, and did it end where the
    uninterrupted run ended?"""
    table = result["table"] if "table" in result else None
    rows = {r["run"]: r for r in (table.to_dict("records") if table is not None else result["rows"])}
    hit, reference = rows["preempted"], rows["uninterrupted"]
    resumed = hit["resumed_from_step"]
    if resumed is None or resumed != resumed:  # None, or NaN once it passed through a table
        return "Not a preemption test: the run never resumed from a checkpoint, so its parameters prove nothing."
    head = (f"Checkpointed at step {int(resumed)} on the signal, requeued, resumed there and ran to step "
            f"{int(hit['steps'])}: ")
    if hit["steps"] != reference["steps"]:
        return head + f"not comparable with the uninterrupted run's {int(reference['steps'])} steps."
    if result["identical"]:
        return head + ("final parameters identical to the uninterrupted run, bit for bit (largest difference "
                       f"{result['max_abs_difference']:g}, checksums {hit['param_checksum']}).")
    return head + (f"final parameters differ from the uninterrupted run by up to {result['max_abs_difference']:.3g}: "
                   "something the checkpoint should hold was not restored.")
