"""The GPU run's notebooks: every session notebook that runs on one GPU (01-05), at its gpu profile, end to end.

Each runs in a process of its own into the GPU run's folder: with papermill and an IPython kernel where they
are installed (exactly as ``make run`` runs it), else with ``notebook_cells`` (the cells in order, without
Jupyter: a node image with PyTorch rarely has Jupyter). Its verdict says how long it took against its estimate
and its 300 s budget, and the records it wrote; its record keeps the seconds, the headline numbers of every
training record it wrote, and the executed copy's outputs as text (figures named, not kept).

Each notebook's time on one H100 is an estimate from the rates the GPU check measured there (2026-11-26) until a
GPU run measures it: ``NotebookRun.estimate_s``, and the notebooks' own PROFILES comments say how they were sized.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from ..system.profiles import TIME_BUDGET_S

# The GPU run's whole budget: the GPU check's paths, the one-rank parts and the five notebooks on one H100.
GPU_RUN_BUDGET_S = 480
EXECUTORS = ("auto", "papermill", "cells")
_METRICS = ("samples_per_s", "tokens_per_s", "mfu", "step_ms_median", "peak_memory_mib", "final_test_acc",
            "final_test_loss")


@dataclass(frozen=True)
class NotebookRun:
    prefix: str  # the notebook's file name starts with it
    estimate_s: int  # on one H100, from the 2026-11-26 record's rates: an estimate until a GPU run measures it
    covers: tuple[str, ...] = ()  # CUDA branches its full run reaches that no GPU-check path does
    replaces: tuple[str, ...] = ()  # GPU-check paths the full run makes redundant in the GPU run


NOTEBOOK_RUNS: tuple[NotebookRun, ...] = (
    # Every notebook sizes itself to its server (pick_settings), the GPUs' free memory included. 01 trains, checkpoints
    # and resumes (deterministically too), with TensorBoard's scalars.
    NotebookRun("01", 55, covers=("system.server:_gpus",),
                replaces=("notebook-01", "checkpoint-resume", "tensorboard-gpu-scalar")),
    # On one GPU its launches run CPU ranks beside the GPU (hide_gpus), its cluster prediction starts from this GPU's step.
    NotebookRun("02", 90, covers=("lessons.cluster_step:cluster_step", "parallel.launch:launch_nodes",
                                  "parallel.launch:node_layout", "parallel.launch:resume_verdict",
                                  "parallel.launch:world_sizes_for_this_machine", "parallel_demos:demo_world",
                                  "parallel_demos:hide_gpus")),
    NotebookRun("03", 75, covers=("lessons.numerics:precision_configs",),
                replaces=("notebook-03", "fp8-matmul", "precision-modes", "grad-scaler")),
    NotebookRun("04", 165, covers=("lessons.profiling:profile_rungs", "lessons.sweeps:ladder_rungs"),
                replaces=("notebook-04", "torch-compile", "cuda-graphs", "attention-kernel", "fused-optimizers",
                          "device-loaders", "nvml-monitor", "profiler-cuda-nvtx")),
    NotebookRun("05", 55, replaces=("notebook-05",)),
)
# Left out of the GPU run for a reason other than a notebook: said in its record.
LEFT_OUT = {"gpt-throughput": "GPT-2 small's throughput is measured at length by the variants command "
                              "(make gpu-variants), and notebooks 01, 03 and 04 train it"}


def pick_executor(asked: str = "auto") -> str:
    """papermill where it and an IPython kernel are installed (``make run``'s way), else the cells one by one."""
    if asked != "auto":
        return asked
    have = all(importlib.util.find_spec(name) is not None for name in ("papermill", "ipykernel", "nbformat"))
    return "papermill" if have else "cells"


def find_notebook(folder: Path, prefix: str) -> Path | None:
    found = sorted(folder.glob(f"{prefix}_*.ipynb"))
    return found[0] if found else None


def _records(run_dir: Path) -> dict[str, float]:
    folder = run_dir / "results"
    return {p.name: p.stat().st_mtime for p in folder.glob("*.json")} if folder.is_dir() else {}


def headlines(run_dir: Path, names) -> dict[str, dict]:
    """The headline numbers of each training record among ``names``: throughput, MFU, step, memory, accuracy."""
    found = {}
    for name in sorted(names):
        try:
            record = json.loads((run_dir / "results" / name).read_text())
        except (OSError, ValueError):
            continue
        metrics = record.get("metrics") if isinstance(record, dict) else None
        if isinstance(metrics, dict):
            found[name[:-5]] = {k: metrics[k] for k in _METRICS if metrics.get(k) is not None}
    return found


def outputs_text(executed: Path, limit: int = 2000) -> list[dict]:
    """The executed copy's outputs, cell by cell, as text: what each cell printed and showed, figures named."""
    try:
        cells = json.loads(executed.read_text())["cells"]
    except (OSError, ValueError, KeyError):
        return []
    rows = []
    for cell in cells:
        if cell.get("cell_type") != "code" or cell.get("execution_count") is None:
            continue
        parts = []
        for output in cell.get("outputs", []):
            kind = output.get("output_type")
            if kind == "stream":
                parts.append("".join(output.get("text", "")))
            elif kind == "error":
                parts.append(f"{output.get('ename')}: {output.get('evalue')}")
            elif "image/png" in output.get("data", {}):
                parts.append("[figure]\n")
            else:
                parts.append("".join(output.get("data", {}).get("text/plain", "")) + "\n")
        text = "".join(parts)
        source = "".join(cell.get("source", ""))
        rows.append({"cell": cell["execution_count"], "first_line": next((line for line in source.splitlines()
                                                                          if line.strip()), "")[:100],
                     "seconds": cell.get("metadata", {}).get("execution", {}).get("seconds")
                     or _papermill_seconds(cell),
                     "outputs": text if len(text) <= limit else text[:limit] + f"... ({len(text) - limit} more)"})
    return rows


def _papermill_seconds(cell) -> float | None:
    duration = cell.get("metadata", {}).get("papermill", {}).get("duration")
    return round(duration, 2) if isinstance(duration, (int, float)) else None


def _with_cells(notebook: Path, run_dir: Path, profile: str, limit_s: float) -> dict:
    executed = run_dir / "notebooks" / notebook.name
    executed.unlink(missing_ok=True)
    command = [sys.executable, "-m", "workshop_utils.gpu_check.notebook_cells", str(notebook), str(executed),
               "--parameters", json.dumps({"profile": profile, "run_dir": str(run_dir)})]
    started = time.perf_counter()
    entry = {"status": "ok", "error": "", "cell": None, "cell_source": "", "timed_out": False}
    try:
        done = subprocess.run(command, stdout=sys.stderr, timeout=limit_s)  # its prints go to the console
        if done.returncode:
            entry.update(status="FAILED", **_failure(executed, f"exit status {done.returncode}"))
    except subprocess.TimeoutExpired:
        entry.update(status="FAILED", timed_out=True, **_failure(executed, f"stopped at its time limit of "
                                                                            f"{limit_s:.0f} s"))
    entry["seconds"] = round(time.perf_counter() - started, 1)
    return entry


def _failure(executed: Path, otherwise: str) -> dict:
    """The cell a cells run stopped in, and its error, from the executed copy (written after every cell)."""
    try:
        cells = [c for c in json.loads(executed.read_text())["cells"]
                 if c.get("cell_type") == "code" and c.get("execution_count")]
    except (OSError, ValueError, KeyError):
        cells = []
    first = lambda cell: next((line for line in "".join(cell.get("source", "")).splitlines() if line.strip()), "")[:120]
    for cell in cells:
        errors = [o for o in cell.get("outputs", []) if o.get("output_type") == "error"]
        if errors:
            text = str(errors[0].get("evalue", "")).strip().splitlines()
            return {"cell": cell["execution_count"], "cell_source": first(cell),
                    "error": f"{errors[0].get('ename')}: {text[0] if text else ''}"[:300]}
    if not cells:
        return {"cell": 1, "cell_source": "", "error": f"{otherwise}, before its first cell ended"}
    return {"cell": cells[-1]["execution_count"] + 1, "cell_source": "",
            "error": f"{otherwise}, in the cell after cell {cells[-1]['execution_count']} (`{first(cells[-1])}`)"}


def run_notebook(run: NotebookRun, folder: Path, run_dir: Path, profile: str, limit_s: float,
                 executor: str) -> dict:
    """One notebook of the GPU run: its outcome, seconds, estimate, the records it wrote and their headlines."""
    notebook = find_notebook(folder, run.prefix)
    if notebook is None:
        return {"notebook": run.prefix, "status": "FAILED", "error": f"no notebook {run.prefix}_*.ipynb in {folder}",
                "seconds": 0.0}
    before = _records(run_dir)
    (run_dir / "notebooks").mkdir(parents=True, exist_ok=True)  # papermill writes the executed copy there, unasked
    if executor == "papermill":
        from ..run_notebooks import run_one

        entry = run_one(notebook, run_dir, profile, limit_s)
    else:
        entry = _with_cells(notebook, run_dir, profile, limit_s)
    after = _records(run_dir)
    written = [name for name, when in after.items() if before.get(name) != when]
    executed = run_dir / "notebooks" / notebook.name
    return {"notebook": notebook.name, "executor": executor, "profile": profile, "status": entry["status"],
            "seconds": entry["seconds"], "estimate_s": run.estimate_s if profile == "gpu" else None,
            "budget_s": TIME_BUDGET_S[profile], "limit_s": round(limit_s), "over_budget":
                entry["seconds"] > TIME_BUDGET_S[profile], "cell": entry.get("cell"),
            "cell_source": entry.get("cell_source", ""), "error": entry.get("error", ""),
            "records": sorted(written), "headlines": headlines(run_dir, written),
            "executed": str(executed), "outputs": outputs_text(executed)}


def verdict_line(entry: dict) -> str:
    """One line for a notebook of the GPU run, as the GPU check writes its paths'."""
    took = f"{entry['seconds']:.0f} s"
    if entry.get("estimate_s"):
        took += f" (estimated {entry['estimate_s']} s)"
    if entry["status"] != "ok":
        where = f" in cell {entry['cell']} `{entry['cell_source']}`" if entry.get("cell") and entry.get("cell_source") \
            else ""
        return f"✗ notebook {entry['notebook']} after {took}: failed{where}: {entry['error']}"
    budget = f"over its {entry['budget_s']} s budget" if entry["over_budget"] else f"within its {entry['budget_s']} s budget"
    shown = []
    for name, numbers in list(entry["headlines"].items())[:4]:
        parts = [f"{numbers['samples_per_s']:,.0f} samples/s" if "samples_per_s" in numbers and "tokens_per_s" not in numbers
                 else f"{numbers['tokens_per_s']:,.0f} tokens/s" if "tokens_per_s" in numbers else ""]
        if numbers.get("mfu") is not None:
            parts.append(f"MFU {numbers['mfu']:.1%}")
        shown.append(f"{name} " + ", ".join(p for p in parts if p))
    more = len(entry["headlines"]) - len(shown)
    return (f"{'✓' if not entry['over_budget'] else '⚠'} notebook {entry['notebook']} ({took}, {budget}): "
            f"{len(entry['records'])} records" + (f"; {'; '.join(shown)}" if shown else "")
            + (f"; {more} more in its record" if more > 0 else ""))
