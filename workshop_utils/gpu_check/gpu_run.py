"""The GPU run (``python -m workshop_utils.gpu_check --notebooks``, ``make gpu-run``): in one command of at most
8 minutes on one GPU, the GPU check's paths, the multi-GPU code in process groups of one, and every session
notebook at its gpu profile, end to end, with one record of it all.

The notebooks come last and take what the paths leave of the budget: the paths get the budget less the
notebooks' estimates, each notebook at most its 300 s budget and what is left, and a notebook with less than
half its estimate left is not started. The GPU-check paths that a notebook's full run makes redundant (its
own few-step path, torch.compile and CUDA graphs, which notebook 04's ladder runs, fp8 in notebook 03) are left
out, and so is GPT-2 small's throughput, which the variants command measures at length.

Records: ``<run>/gpu_run.json`` (every verdict, each notebook's seconds, estimate and headline numbers, the
environment) with ``<run>/notebooks/`` (the executed copies); ``--reference`` also keeps
``results/reference/gpu/gpu_run-<gpu>-<date>/`` (that record, one file per notebook with its executed copy's
outputs as text, and the training records the notebooks wrote).
"""

from __future__ import annotations

import shutil
import time
from datetime import datetime, timezone
from pathlib import Path

from ..system.results import git_commit, repo_root, write_json
from ..system.profiles import TIME_BUDGET_S
from . import one_rank
from .context import REFERENCE_FOLDER, Context, slug
from .notebooks import LEFT_OUT, NOTEBOOK_RUNS, pick_executor, run_notebook, verdict_line
from .runner import Verdict, run_paths, summary_line


def plan(paths, runs=NOTEBOOK_RUNS) -> tuple[list, dict]:
    """The paths the GPU run keeps (the one-rank parts first: the newest evidence), and why each other is left out."""
    replaced = {name: f"notebook {run.prefix}'s full run covers it" for run in runs for name in run.replaces}
    left_out = {**replaced, **LEFT_OUT}
    kept = [p for p in paths if p.name not in left_out]
    kept.sort(key=lambda p: p.name not in one_rank.BY_NAME)
    return kept, {p.name: left_out[p.name] for p in paths if p.name in left_out}


def notebook_summary(entries: list[dict], budget_s: float) -> str:
    ok = [e for e in entries if e["status"] == "ok" and not e.get("over_budget")]
    ran = [e for e in entries if e["status"] != "not reached"]
    text = f"notebooks: {len(ok)} of {len(entries)} ran end to end within their {budget_s:.0f} s budget"
    for what, chosen in (("failed", [e for e in ran if e["status"] != "ok"]),
                         ("over budget", [e for e in ran if e["status"] == "ok" and e.get("over_budget")]),
                         ("not reached", [e for e in entries if e["status"] == "not reached"])):
        if chosen:
            text += f", {len(chosen)} {what} ({', '.join(e['notebook'] for e in chosen)})"
    seconds = sum(e["seconds"] or 0 for e in ran)
    estimated = sum(e.get("estimate_s") or 0 for e in ran)
    return text + f"; {seconds:.0f} s in all" + (f" (estimated {estimated} s)" if estimated else "")


def run_gpu_run(paths, ctx: Context, budget_s: float, executor: str, env: dict, notebooks_folder: Path,
                say=print, reference: bool = False, runs=NOTEBOOK_RUNS) -> tuple[dict, list[Path]]:
    """The GPU check's kept paths, then every notebook; the record and the files written."""
    profile = "gpu" if ctx.on_gpu else "cpu"  # a CPU rehearsal runs the notebooks at their cpu size
    executor = pick_executor(executor)
    kept, left_out = plan(paths, runs)
    estimates = sum(run.estimate_s for run in runs) if ctx.on_gpu else 0
    paths_budget = max(budget_s - estimates, 1)
    say(f"GPU run: {len(kept)} paths within {paths_budget:.0f} s, then {len(runs)} notebooks ({profile} "
        f"profile, {executor}" + (f", estimated {estimates} s on one H100" if estimates else "") + f"); "
        f"{budget_s:.0f} s in all")
    for name, why in left_out.items():
        say(f"– {name}: left out: {why}")
    started = time.monotonic()
    grouped = [p for p in kept if p.name in one_rank.BY_NAME]  # one process for them all: one start-up, not seven
    verdicts = one_rank.run_group(grouped, ctx, paths_budget, say=say)
    verdicts += run_paths([p for p in kept if p not in grouped], ctx, paths_budget - (time.monotonic() - started),
                          say=say)
    entries = []
    for run in runs:
        left = budget_s - (time.monotonic() - started)
        need = run.estimate_s / 2 if ctx.on_gpu else 1
        if left < need:
            entry = {"notebook": run.prefix, "status": "not reached", "seconds": None, "estimate_s": run.estimate_s,
                     "error": f"{left:.0f} s of the {budget_s:.0f} s budget left"}
            say(f"… notebook {run.prefix}: not reached: {entry['error']}")
        else:
            entry = run_notebook(run, notebooks_folder, ctx.folder, profile, min(TIME_BUDGET_S[profile], left),
                                 executor)
            say(verdict_line(entry))
        entries.append(entry)
    seconds = time.monotonic() - started
    lines = [summary_line(verdicts, seconds, budget_s).replace("GPU check:", "GPU run: paths:"),
             notebook_summary(entries, TIME_BUDGET_S[profile])]
    record = {"kind": "gpu_run", "summary": " ".join(lines), "budget_s": budget_s, "seconds": seconds,
              "executor": executor, "profile": profile, "paths": [vars(v) for v in verdicts],
              "left_out": left_out, "notebooks": [{k: v for k, v in e.items() if k != "outputs"} for e in entries],
              "environment": env, "git_commit": git_commit(),
              "created": datetime.now(timezone.utc).isoformat(timespec="seconds")}
    written = [write_json(record, ctx.folder / "gpu_run.json")]
    if reference:
        written.append(keep_as_reference(record, entries, ctx.folder))
    for line in lines:
        say(line)
    return record, written


def keep_as_reference(record: dict, entries: list[dict], run_dir: Path, root: Path | None = None) -> Path:
    """``results/reference/gpu/gpu_run-<gpu>-<date>/``: the record, each notebook's outputs, its training records."""
    root = root or repo_root() or Path.cwd()
    folder = root / REFERENCE_FOLDER / f"gpu_run-{slug(record['environment']['device_name'])}-{record['created'][:10]}"
    write_json(record, folder / "gpu_run.json")
    for entry in entries:
        if entry["status"] != "not reached":
            write_json({**entry, "environment": record["environment"], "git_commit": record["git_commit"]},
                       folder / f"notebook-{entry['notebook'][:2]}.json")
        for name in entry.get("records", []):
            (folder / "results").mkdir(parents=True, exist_ok=True)
            shutil.copy2(run_dir / "results" / name, folder / "results" / name)
    return folder
