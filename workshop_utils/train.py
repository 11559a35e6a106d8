"""``python -m workshop_utils.train``: the training loop as a command, for torchrun, srun and notebooks.

It only turns flags into a ``TrainConfig`` and calls ``train``: the loop is the
same one the notebooks call in-process. The flags are generated from the
config's fields (their help, units, allowed values and --help group live next
to each field in ``spine/config.py``), so every field is a flag and none is
typed twice. Started by torchrun (or srun), each process learns its rank from
the environment; rank 0 alone writes ``--out``.

    torchrun --nproc-per-node=4 -m workshop_utils.train --model resnet18 --precision bf16 \\
        --batch-size 256 --steps 500 --checkpoint-dir ckpt --resume --out result.json
"""

from __future__ import annotations

if __name__ == "__main__":
    # Catch a pre-emption warning that arrives while torch is still importing (seconds on a busy node).
    from workshop_utils.spine.preemption import stop_on_signals

    stop_on_signals()

import argparse
import json
import os
import socket
import sys
from pathlib import Path

from .parallel.failures import LOST_PEER, record_failure, record_failures
from .spine.config import HOW_MUCH, OUTPUT, TrainConfig, validate_config
from .spine.config_flags import COMMAND_DEFAULTS, add_config_flags
from .spine.distributed import read_dist_env, teardown_distributed
from .spine.preemption import stop_on_signals
from .spine.trainer import InjectedFailure, train
from .system.errors import OneLineParser, WorkshopError, exit_on_workshop_error, positive_int
from .system.results import check_output_path, git_commit, jsonable, path_for_message, write_json_or_fallback

EPILOG = """\
examples:
  one process:       python -m workshop_utils.train --steps 50 --out run.json
  4 GPUs, one node:  torchrun --nproc-per-node=4 -m workshop_utils.train --batch-size 128 --steps 500
  crash and resume:  torchrun --nproc-per-node=2 --max-restarts=1 -m workshop_utils.train \\
                         --steps 20 --checkpoint-dir ckpt --checkpoint-every 5 --resume --fail-at-step 12
  one checkpoint:    python -m workshop_utils.train --checkpoint-dir ckpt --resume ckpt/step_00000010.pt

Every field of TrainConfig is a flag (max_steps is --max-steps, or --steps); on/off settings also
take a --no- form (--no-progress, --no-resume).

batch sizes: --batch-size is per process; the optimizer sees batch-size x world-size samples per
step (the global batch). Give --global-batch-size instead to keep the global batch fixed while the
number of processes changes (strong scaling). When the global batch grows, scale --lr with it (the
linear scaling rule) and warm it up with --lr-warmup-steps.

pre-emption: SIGUSR1 (and SIGTERM, except under torchrun, which stops its workers with it) makes
every rank finish its step, checkpoint and exit with status 0 (within 20 steps); with --resume the
requeued job continues where it stopped.

bad input, including an --out or --checkpoint-dir that cannot be written, prints one line and exits
with status 2 before any work starts; an injected failure exits with status 1, and so does a result
that could not be written to --out (it is saved to a temporary file, named on that line, instead).
"""

ENTRY_ONLY = ("global_batch_size", "out")  # the command's own flags: no field of TrainConfig


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(
        prog="python -m workshop_utils.train", usage="%(prog)s [flags, see below]",
        description="Train a CIFAR-10 CNN or the byte-level GPT (--model gpt) with the workshop's one training loop. "
                    "Run it directly for one process, or under torchrun/srun for data-parallel training "
                    "(NCCL on GPUs, gloo on CPUs).",
        epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    groups = add_config_flags(parser)
    groups[HOW_MUCH].add_argument("--global-batch-size", type=positive_int, default=None, metavar="N",
                                  help="samples per step over all processes, in place of --batch-size; must "
                                       "divide by the number of processes")
    groups[OUTPUT].add_argument("--out", default=None, metavar="FILE",
                                help="JSON file for the result record (written by rank 0)")
    return parser


def per_process_batch(global_batch: int, world_size: int) -> int:
    if global_batch % world_size:
        raise WorkshopError(
            f"Global batch {global_batch} does not divide into {world_size} processes.",
            f"use a multiple of {world_size} (e.g. {global_batch // world_size * world_size or world_size}) "
            f"or --batch-size per process.")
    return global_batch // world_size


def config_from_args(args: argparse.Namespace, world_size: int) -> TrainConfig:
    """The fields' defaults (COMMAND_DEFAULTS where the command has its own), then every flag given."""
    given = {key: value for key, value in vars(args).items() if key not in ENTRY_ONLY}
    config = TrainConfig(**{**COMMAND_DEFAULTS, **given})
    if args.global_batch_size is None:
        return config
    if "batch_size" in given:
        raise WorkshopError("--batch-size (per process) and --global-batch-size (all processes) were both given.",
                            "give one of them.")
    return config.replace(batch_size=per_process_batch(args.global_batch_size, world_size))


def save_result(record: dict, out: Path) -> None:
    """Write rank 0's record to ``out``; if that fails, keep it elsewhere, say where on one line, exit 1."""
    try:
        written, failure = write_json_or_fallback(record, out)
    except OSError as err:  # not even a temporary file could take it: the job's log is the last place left
        print(json.dumps(jsonable(record)), flush=True)
        print(f"error: could not write the result to {path_for_message(out)} nor to a temporary file ({err}); "
              "it is printed above as one line of JSON. Fix: free some space and save that line.",
              file=sys.stderr, flush=True)
        raise SystemExit(1) from None
    if failure is None:
        print(f"Result written to {written}", flush=True)
        return
    print(f"error: could not write the result to {path_for_message(out)} ({failure}); it is saved in "
          f"{path_for_message(written)} instead. Fix: free some space (or give another --out), then move that "
          "file there.", file=sys.stderr, flush=True)
    raise SystemExit(1)


@exit_on_workshop_error
@record_failures  # under torchrun, the exception that ends a rank goes to its error file, time-stamped
def main(argv=None) -> None:
    args = build_parser().parse_args(argv)
    info = read_dist_env()
    # Bad input and unwritable outputs fail here, on every rank, before any rank waits for another
    # or any data loads: not after an hour of training.
    config = validate_config(config_from_args(args, info.world_size))
    out = check_output_path(args.out, what="--out") if args.out is not None else None
    node = os.environ.get("GROUP_RANK", os.environ.get("SLURM_NODEID", "0"))
    print(f"rank {info.rank} of {info.world_size} (local rank {info.local_rank}, node {node}) "
          f"on {socket.gethostname()}, pid {os.getpid()}", flush=True)
    stop_on_signals()
    try:
        result = train(config)
    except InjectedFailure as err:
        record_failure(err)
        print(f"error: {err}", file=sys.stderr, flush=True)
        raise SystemExit(1) from None
    except RuntimeError as err:
        if info.world_size == 1 or not LOST_PEER.search(str(err)):
            raise
        # The survivors of a crashed rank fail in their next collective: one line, not a traceback each,
        # and recorded, so that whoever reads the error files sees a consequence, not a cause.
        record_failure(err)
        print(f"error: rank {info.rank} lost its connection to a rank that failed first (that rank's own error is "
              f"the cause); torchrun stops or restarts the job. [{str(err).splitlines()[0][:160]}]",
              file=sys.stderr, flush=True)
        raise SystemExit(1) from None
    finally:
        teardown_distributed()
    if info.is_main:
        metrics = result.metrics
        if metrics["interrupted"]:
            print(f"Stopped at step {metrics['steps']} with a checkpoint in {config.checkpoint_dir}: "
                  "rerun with --resume to continue.", flush=True)
        speed = f"{metrics['samples_per_s']:,.0f} samples/s" if metrics["samples_per_s"] else "too few steps to time"
        print(f"Done: {metrics['steps']} steps on {metrics['world_size']} process(es), {speed}, "
              f"parameter checksum {metrics['param_checksum']}.", flush=True)
        if out is not None:
            save_result({"name": config.name, "git_commit": git_commit(), **result.record}, out)


if __name__ == "__main__":
    main()
