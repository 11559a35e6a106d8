"""``python -m workshop_utils.parallel_demos PART``: notebooks 02 and 05's multi-process experiments, one entry point.

Each part runs on every rank of a torchrun job (NCCL on GPUs, gloo on CPUs) and rank 0
writes the result as JSON, which ``launch_demo`` reads back into the notebook::

    torchrun --nproc-per-node=2 -m workshop_utils.parallel_demos tensor-parallel --out tp.json
    torchrun --nproc-per-node=2 -m workshop_utils.parallel_demos collectives-time --options '{"max_mib": 64}'

``--options`` is a JSON object of keyword arguments for the part's function.
"""

from __future__ import annotations

import argparse
import inspect
import json
import numbers
import os
import tempfile
from pathlib import Path

from .parallel.collectives import show_collectives, time_collectives
from .parallel.comm_model import message_sizes
from .parallel.dist_checkpoint import checkpoint_stall, sharded_round_trip
from .parallel.failures import RankFailed, record_failures
from .parallel.gpt_parallel import compare_gpt_parallel
from .parallel.overlap import measure_overlap
from .system.errors import OneLineParser, WorkshopError, choose, exit_on_workshop_error
from .parallel.pipeline import measure_bubble
from .parallel.sharding import compare_ddp_fsdp
from .parallel.tensor_parallel import check_tensor_parallel


def _collectives_show(device):
    return {"kind": "collectives_show", "rows": show_collectives(device)}


def _collectives_time(device, min_kib: int = 4, max_mib: int = 16, repeats: int = 10):
    sizes = message_sizes(min_kib, max_mib)
    if not sizes or repeats <= 0:
        raise WorkshopError("No message size between min_kib and max_mib, or repeats < 1.",
                            "use e.g. min_kib=4, max_mib=16, repeats=10.")
    return {"kind": "collectives_time", "rows": time_collectives(sizes, repeats=repeats, device=device)}


def _checkpoint(device, folder: str, model_name: str = "simplecnn", batch_size: int = 32, round_trip_steps: int = 3,
                stall_steps: int = 12, every: int = 4, seed: int = 0, data_root=None):
    common = dict(model_name=model_name, batch_size=batch_size, seed=seed, device=device, data_root=data_root)
    return {"kind": "dcp", "round_trip": sharded_round_trip(Path(folder) / "sharded", steps=round_trip_steps, **common),
            "stall": checkpoint_stall(Path(folder) / "stall", steps=stall_steps, every=every, **common)}


PARTS = {
    "collectives-show": _collectives_show,
    "collectives-time": _collectives_time,
    "fsdp": compare_ddp_fsdp,
    "tensor-parallel": check_tensor_parallel,
    "gpt-parallel": compare_gpt_parallel,
    "ddp-overlap": measure_overlap,
    "pipeline": measure_bubble,
    "checkpoint": _checkpoint,
}


def check_options(part: str, options: dict) -> None:
    """Refuse unknown or missing options before any process starts waiting for the others."""
    choose(part, tuple(PARTS), "part")
    try:
        inspect.signature(PARTS[part]).bind(device=None, **options)
    except TypeError as err:
        known = [name for name in inspect.signature(PARTS[part]).parameters if name != "device"]
        raise WorkshopError(f"'{part}' cannot take these options: {err}.", f"use some of {known}.") from None


def hide_gpus() -> None:
    """Make this process see no GPU; call it before anything asks CUDA.

    A CPU rank on a GPU node otherwise finds CUDA "available", and library code that checks no
    more than that reaches for the GPU: Adam's step asks for the current CUDA stream (to refuse
    graph capture), DCP's checkpoint writer opens a stream, ``environment()`` reads the GPU's
    properties. Each creates a CUDA context on GPU 0 in a rank that computes on the CPU: start-up
    time and GPU memory for every rank, and an error where GPUs are in exclusive-process mode.
    """
    import torch

    if torch.cuda.is_initialized():
        raise WorkshopError("CUDA was already initialised in this process: it can no longer hide the GPUs.",
                            "call hide_gpus() first thing in the process.")
    os.environ["CUDA_VISIBLE_DEVICES"] = ""


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(prog="python -m workshop_utils.parallel_demos", description=__doc__,
                           formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("part", choices=PARTS, help="which experiment to run on every rank")
    parser.add_argument("--device", choices=("auto", "cuda", "cpu"), default="auto",
                        help="auto: NCCL on GPUs when there are any, else gloo on CPUs (default: %(default)s)")
    parser.add_argument("--options", default="{}", help="JSON object of keyword arguments for the part")
    parser.add_argument("--out", help="JSON file for the result (written by rank 0)")
    return parser


@exit_on_workshop_error
@record_failures  # each rank's fatal exception, time-stamped, for launch_torchrun to name the first
def main(argv=None) -> None:
    from .spine.distributed import setup_distributed, teardown_distributed
    from .system.hardware import environment
    from .system.results import write_json

    args = build_parser().parse_args(argv)
    try:
        options = json.loads(args.options)
    except json.JSONDecodeError as err:
        raise WorkshopError(f"--options is not valid JSON ({err.msg}).", """pass e.g. --options '{"steps": 8}'.""")
    if not isinstance(options, dict):
        raise WorkshopError("--options must be a JSON object.", """pass e.g. --options '{"steps": 8}'.""")
    check_options(args.part, options)
    if args.device == "cpu":
        hide_gpus()
    info, device = setup_distributed(None if args.device == "auto" else args.device)
    if not info.distributed:
        raise WorkshopError(f"'{args.part}' needs two or more processes.",
                            f"start it with `torchrun --nproc-per-node=2 -m workshop_utils.parallel_demos {args.part}`.")
    try:
        result = PARTS[args.part](device=device, **options)
    finally:
        teardown_distributed()
    if info.is_main:
        # The device the ranks used: CPU ranks on a GPU node must not be labelled with the GPU.
        result.update(backend=info.backend, device=device.type, world_size=info.world_size,
                      environment=environment(device))
        if args.out:
            write_json(result, args.out)
        print(f"{args.part}: done on {info.world_size} {info.backend} ranks", flush=True)


def demo_world(nproc: int | None = None) -> tuple[int, str]:
    """How many processes, on what: one per GPU with two or more GPUs (NCCL), else CPU processes (gloo)."""
    import torch

    if nproc is not None and (isinstance(nproc, bool) or not isinstance(nproc, numbers.Integral) or nproc < 2):
        raise WorkshopError(f"nproc={nproc}: these experiments need two or more ranks.", "use nproc=2 or more.")
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if gpus >= 2:
        return min(nproc or gpus, gpus), "cuda"
    return nproc or 2, "cpu"


def launch_demo(part: str, nproc: int = 2, device: str = "cpu", timeout_s: float = 300, echo: bool = True,
                **options) -> dict:
    """Run ``part`` under torchrun on ``nproc`` processes; return the record rank 0 wrote.

    ``timeout_s`` bounds the whole launch: a rank that hangs (a collective some rank never
    joins) stops the job and becomes a one-line error naming the part, not a silent cell.
    """
    from .parallel.launch import launch_torchrun

    check_options(part, options)
    choose(device, ("cpu", "cuda"), "device")
    if not timeout_s or timeout_s <= 0:
        raise WorkshopError(f"timeout_s={timeout_s!r}: every part needs a time limit.", "use e.g. timeout_s=120.")
    with tempfile.TemporaryDirectory(prefix="workshop-demo-") as folder:
        out = Path(folder) / "result.json"
        args = [part, "--device", device, "--options", json.dumps(options), "--out", str(out)]
        try:
            launched = launch_torchrun("workshop_utils.parallel_demos", args, nproc, device=device, out=out,
                                       timeout_s=timeout_s, echo=echo)
        except RankFailed as err:  # the first failing rank, found, travels on with the message
            raise RankFailed(f"'{part}' on {nproc} {device} ranks: {err.problem}", err.cause) from None
        except WorkshopError as err:
            raise WorkshopError(f"'{part}' on {nproc} {device} ranks: {err.problem}", err.fix) from None
        if launched.record is None:
            raise WorkshopError(f"'{part}' on {nproc} {device} ranks wrote no result.",
                                "read the streamed output above for the rank that failed.")
        return launched.record


if __name__ == "__main__":
    main()
