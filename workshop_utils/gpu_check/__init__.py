"""``python -m workshop_utils.gpu_check``: every GPU-only code path of the kit once, small, in minutes.

    python -m workshop_utils.gpu_check                      # on a GPU node: one verdict line per path
    python -m workshop_utils.gpu_check --reference          # also keep the record in results/reference/gpu/
    python -m workshop_utils.gpu_check --device cpu         # a rehearsal on a CPU: GPU-only paths say so
    python -m workshop_utils.gpu_check --notebooks          # the GPU run (make gpu-run): also every notebook 01-05
                                                            # at its gpu profile, end to end, within 8 minutes

The pre-flight runs every notebook at full size (up to half an hour). This answers the shorter
question an instructor has on the morning of a workshop, and a developer has with a few minutes
of GPU time: does every path that only runs on a GPU work on this node? Each path below runs
the same package code the notebooks and the training command run, at a few steps, and gets one
line: ✓ with what it measured, ✗ with the error's first line, or why it was not checked here.

The check keeps its own clock: a path that would start too close to the budget (300 s) is not
started, one still running at the budget is stopped, and both are listed as not reached. What
needs two or more GPUs (NCCL, FSDP2, tensor parallelism, the overlap measurement) runs only
where there are two; on one GPU it is listed as not checked. The record, with the environment
(GPU, driver, CUDA, PyTorch), goes to ``<run>/gpu_check.json``. Exit status: 0 when every path
that could run passed, 1 otherwise, 2 for a mistake in the arguments.

On one GPU the two-GPU paths' code still runs, each part in a process group of one over NCCL
(``one_rank``): every call they make, not what only two GPUs show (scaling, a link's cost, overlap),
which each verdict says. ``--notebooks`` is the GPU run (``gpu_run``): those paths, then every
session notebook at its gpu profile, end to end, in at most 8 minutes on one H100, with its record.
"""

# The docstring above is the command's --help. The parts: context (what a path is and is given), checks
# (paths through the package's pieces), workloads (paths through notebooks, a benchmark and two GPUs), paths
# (the list, with the CUDA branches each covers), runner (the clock and the verdicts); here, the command.

from __future__ import annotations

import argparse
import time
from datetime import datetime, timezone
from pathlib import Path

import torch

from ..system.errors import OneLineParser, WorkshopError, exit_on_workshop_error, positive_int
from ..system.hardware import environment, pick_device, wait_passively
from ..system.results import git_commit, repo_root, resolve_run_dir, write_json
from .checks import (check_attention_kernel, check_checkpoint_resume, check_compile, check_cuda_events,
                     check_cuda_graphs, check_evaluation_memory, check_fp8_matmul, check_fused_adamw, check_grad_scaler,
                     check_loaders, check_nvml_monitor, check_peak_memory, check_precisions, check_profiler,
                     check_tensorboard)
from .context import REFERENCE_FOLDER, Context, Failed, GpuPath, Skip, slug
from .paths import ELSEWHERE, PATHS
from .notebooks import EXECUTORS, GPU_RUN_BUDGET_S
from .runner import BUDGET_S, OutOfTime, Verdict, run_paths, summary_line
from .workloads import (check_ddp_lab, check_ddp_nccl, check_gpt_throughput, check_gpu_topology, check_notebook_01,
                        check_notebook_03, check_notebook_04, check_notebook_05)

# What was defined here before the check was split into a package; importers keep this one path.
__all__ = [
    "BUDGET_S", "ELSEWHERE", "PATHS", "REFERENCE_FOLDER", "Context", "Failed", "GpuPath", "OutOfTime", "Skip",
    "Verdict", "build_parser", "check_attention_kernel", "check_checkpoint_resume", "check_compile", "check_cuda_events",
    "check_cuda_graphs", "check_ddp_lab", "check_ddp_nccl", "check_evaluation_memory", "check_fp8_matmul",
    "check_fused_adamw",
    "check_gpt_throughput", "check_gpu_topology", "check_grad_scaler", "check_loaders", "check_notebook_01",
    "check_notebook_03", "check_notebook_04", "check_notebook_05", "check_nvml_monitor", "check_peak_memory",
    "check_precisions", "check_profiler", "check_tensorboard", "main", "run_paths", "summary_line",
]

def build_parser() -> OneLineParser:
    parser = OneLineParser(prog="python -m workshop_utils.gpu_check", description=__doc__,
                           formatter_class=argparse.RawDescriptionHelpFormatter,
                           fix="see `python -m workshop_utils.gpu_check --help`.")
    parser.add_argument("--run-dir", metavar="DIR", help="run folder for the record and the paths' files "
                                                         "(default: a new runs/<time>-gpu-check/)")
    parser.add_argument("--budget", type=positive_int, default=None, metavar="SECONDS",
                        help=f"time for the whole check; paths that do not fit are listed as not reached "
                             f"(default {BUDGET_S}, with --notebooks {GPU_RUN_BUDGET_S})")
    parser.add_argument("--only", nargs="+", metavar="PATH", choices=[p.name for p in PATHS],
                        help="run these paths only (default: all)")
    parser.add_argument("--device", choices=("auto", "cuda", "cpu"), default="auto",
                        help="auto: the GPU, or an error without one; cpu: a rehearsal of the paths a CPU can run")
    parser.add_argument("--notebooks", action="store_true",
                        help="the GPU run: the paths, then notebooks 01-05 end to end at their gpu profile (their cpu "
                             "profile with --device cpu), each in its own process")
    parser.add_argument("--executor", choices=EXECUTORS, default="auto",
                        help="how --notebooks runs a notebook: papermill (as make run does), cells (no Jupyter "
                             "needed), or auto: papermill where it and ipykernel are installed (default)")
    parser.add_argument("--reference", action="store_true",
                        help=f"also write the record into {REFERENCE_FOLDER}/ (GPU, driver, PyTorch and date in "
                             f"its name)")
    return parser


@exit_on_workshop_error
def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    if args.device == "cpu":
        device = torch.device("cpu")
    elif not torch.cuda.is_available():
        raise WorkshopError("PyTorch sees no CUDA GPU, so there is no GPU path to check.",
                            "run this on a GPU node (srun --gpus=1 ...), or pass --device cpu for a rehearsal.")
    else:
        device = pick_device("cuda")
    wait_passively()
    budget = args.budget or (GPU_RUN_BUDGET_S if args.notebooks else BUDGET_S)
    folder = resolve_run_dir(args.run_dir, "gpu-run" if args.notebooks else "gpu-check")
    paths = [p for p in PATHS if not args.only or p.name in args.only]
    env = environment(device)
    print(f"GPU check on {env['device_name']} (driver {env['driver']}, CUDA {env['cuda']}, PyTorch {env['torch']}), "
          f"{len(paths)} paths within {budget} s; files in {folder}", flush=True)
    if args.notebooks:
        from ..run_notebooks import notebooks_folder
        from .gpu_run import run_gpu_run

        record, written = run_gpu_run(paths, Context(device, folder), budget, args.executor, env, notebooks_folder(),
                                      say=lambda line: print(line, flush=True), reference=args.reference)
        print("Record: " + ", ".join(map(str, written)))
        failed = any(p["status"] in ("failed", "not reached") for p in record["paths"]) or any(
            n["status"] != "ok" or n.get("over_budget") for n in record["notebooks"])
        return 1 if failed else 0
    started = time.monotonic()
    verdicts = run_paths(paths, Context(device, folder), budget, say=lambda line: print(line, flush=True))
    seconds = time.monotonic() - started
    line = summary_line(verdicts, seconds, budget)
    record = {"kind": "gpu_check", "summary": line, "budget_s": budget, "seconds": seconds,
              "paths": [vars(v) for v in verdicts], "environment": env, "git_commit": git_commit(),
              "created": datetime.now(timezone.utc).isoformat(timespec="seconds")}
    written = [write_json(record, folder / "gpu_check.json")]
    if args.reference:
        root = repo_root() or Path.cwd()
        name = f"gpu_check-{slug(env['device_name'])}-{record['created'][:10]}.json"
        written.append(write_json(record, root / REFERENCE_FOLDER / name))
    print(line)
    print("Record: " + ", ".join(map(str, written)))
    failed = any(v.status in ("failed", "not reached") for v in verdicts)
    return 1 if failed else 0
