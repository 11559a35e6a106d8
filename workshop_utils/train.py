"""``python -m workshop_utils.train``: the training loop as a command, for torchrun, srun and notebooks.

It only turns flags into a ``TrainConfig`` and calls ``train``: the loop is the
same one the notebooks call in-process. Started by torchrun (or srun), each
process learns its rank from the environment; rank 0 alone writes ``--out``.

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

from .spine.data import LOADERS
from .spine.distributed import read_dist_env, teardown_distributed
from .system.errors import WorkshopError, exit_on_workshop_error
from .system.hardware import PRECISIONS
from .spine.models import MODELS
from .system.results import git_commit, write_json
from .spine.preemption import stop_on_signals
from .spine.trainer import InjectedFailure, TrainConfig, train

EPILOG = """\
examples:
  one process:       python -m workshop_utils.train --steps 50 --out run.json
  4 GPUs, one node:  torchrun --nproc-per-node=4 -m workshop_utils.train --batch-size 128 --steps 500
  crash and resume:  torchrun --nproc-per-node=2 --max-restarts=1 -m workshop_utils.train \\
                         --steps 20 --checkpoint-dir ckpt --checkpoint-every 5 --resume --fail-at-step 12

batch sizes: --batch-size is per process; the optimizer sees batch-size x world-size samples per
step (the global batch). Give --global-batch-size instead to keep the global batch fixed while the
number of processes changes (strong scaling). When the global batch grows, scale --lr with it (the
linear scaling rule) and warm it up with --lr-warmup-steps.

pre-emption: SIGUSR1 (and SIGTERM, except under torchrun, which stops its workers with it) makes
every rank finish its step, checkpoint and exit with status 0 (within 20 steps); with --resume the
requeued job continues where it stopped.
bad input prints one line and exits with status 2; an injected failure exits with status 1.
"""


class OneLineParser(argparse.ArgumentParser):
    """argparse, but a bad flag is one line naming the problem and the fix (exit status 2)."""

    def error(self, message: str):
        print(f"error: {message}. Fix: see `{self.prog} --help`.", file=sys.stderr, flush=True)
        raise SystemExit(2)


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{text!r} must be 1 or more")
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(
        prog="python -m workshop_utils.train",
        description="Train a CIFAR-10 model with the workshop's one training loop. Run it directly for one "
                    "process, or under torchrun/srun for data-parallel training (NCCL on GPUs, gloo on CPUs).",
        epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    what = parser.add_argument_group("what to train")
    what.add_argument("--model", choices=MODELS, default="simplecnn", help="network (default: %(default)s)")
    what.add_argument("--precision", choices=PRECISIONS, default="fp32",
                      help="fp32 (TF32 off), tf32, fp16 (+ loss scaling) or bf16 (default: %(default)s)")
    what.add_argument("--name", default="train", help="label of the result record (default: %(default)s)")
    how_long = parser.add_argument_group("how much")
    batch = how_long.add_mutually_exclusive_group()
    batch.add_argument("--batch-size", type=positive_int, default=None,
                       help="samples per process per step (default: 128)")
    batch.add_argument("--global-batch-size", type=positive_int, default=None,
                       help="samples per step over all processes; must divide by the number of processes")
    how_long.add_argument("--steps", type=positive_int, default=None, help="optimizer steps in total (caps --epochs)")
    how_long.add_argument("--epochs", type=positive_int, default=1, help="passes over the data (default: %(default)s)")
    how_long.add_argument("--lr", type=float, default=0.05, help="peak learning rate (default: %(default)s)")
    how_long.add_argument("--lr-warmup-steps", type=int, default=0,
                          help="steps of linear learning-rate warm-up (default: %(default)s)")
    how_long.add_argument("--seed", type=int, default=0, help="same seed, same run (default: %(default)s)")
    data = parser.add_argument_group("data")
    data.add_argument("--data-root", default=None, help="folder holding CIFAR-10 (default: $WORKSHOP_DATA, ./data)")
    data.add_argument("--train-size", type=positive_int, default=None, help="use the first N training images")
    data.add_argument("--test-size", type=positive_int, default=None, help="use the first N test images")
    data.add_argument("--loader", choices=LOADERS, default="torch",
                      help="torch DataLoader, or the data set resident on the device (default: %(default)s)")
    data.add_argument("--num-workers", type=int, default=0, help="DataLoader worker processes (default: 0)")
    speed = parser.add_argument_group("speed")
    speed.add_argument("--channels-last", action="store_true", help="NHWC memory layout")
    speed.add_argument("--compile", action="store_true", help="torch.compile the model")
    speed.add_argument("--device", choices=("auto", "cuda", "cpu"), default="auto",
                       help="auto: one GPU per local rank when there are GPUs (default: %(default)s)")
    speed.add_argument("--warmup-steps", type=int, default=5, help="first steps left out of timing (default: 5)")
    state = parser.add_argument_group("checkpoints and failures")
    state.add_argument("--checkpoint-dir", default=None, help="where rank 0 writes checkpoints")
    state.add_argument("--checkpoint-every", type=positive_int, default=None,
                       help="steps between checkpoints (default: at each epoch's end)")
    state.add_argument("--resume", action="store_true", help="start from the newest checkpoint in --checkpoint-dir")
    state.add_argument("--fail-at-step", type=positive_int, default=None,
                       help="the last rank crashes at step N on the first attempt (fault-tolerance demo)")
    output = parser.add_argument_group("output")
    output.add_argument("--out", default=None, help="JSON file for the result record (written by rank 0)")
    output.add_argument("--log-every", type=positive_int, default=None, help="rank 0 prints a line every N steps")
    output.add_argument("--no-progress", action="store_true", help="no progress bar (for logs and notebooks)")
    return parser


def per_process_batch(args, world_size: int) -> int:
    if args.global_batch_size is None:
        return args.batch_size or 128
    if args.global_batch_size % world_size:
        raise WorkshopError(
            f"Global batch {args.global_batch_size} does not divide into {world_size} processes.",
            f"use a multiple of {world_size} (e.g. {args.global_batch_size // world_size * world_size or world_size}) "
            f"or --batch-size per process.")
    return args.global_batch_size // world_size


def config_from_args(args, world_size: int) -> TrainConfig:
    return TrainConfig(
        name=args.name, model=args.model, precision=args.precision,
        batch_size=per_process_batch(args, world_size), epochs=args.epochs, max_steps=args.steps,
        lr=args.lr, lr_warmup_steps=args.lr_warmup_steps, seed=args.seed,
        data_root=args.data_root, train_size=args.train_size, test_size=args.test_size,
        loader=args.loader, num_workers=args.num_workers, channels_last=args.channels_last, compile=args.compile,
        device=None if args.device == "auto" else args.device, warmup_steps=args.warmup_steps,
        checkpoint_dir=args.checkpoint_dir, checkpoint_every=args.checkpoint_every, resume=args.resume,
        fail_at_step=args.fail_at_step, log_every=args.log_every, progress=not args.no_progress,
    )


@exit_on_workshop_error
def main(argv=None) -> None:
    args = build_parser().parse_args(argv)
    info = read_dist_env()
    config = config_from_args(args, info.world_size)  # bad input fails here, before any rank waits for another
    node = os.environ.get("GROUP_RANK", os.environ.get("SLURM_NODEID", "0"))
    print(f"rank {info.rank} of {info.world_size} (local rank {info.local_rank}, node {node}) "
          f"on {socket.gethostname()}, pid {os.getpid()}", flush=True)
    stop_on_signals()
    try:
        result = train(config)
    except InjectedFailure as err:
        print(f"error: {err}", file=sys.stderr, flush=True)
        raise SystemExit(1) from None
    except RuntimeError as err:
        if info.world_size == 1 or "peer" not in str(err).lower():
            raise
        # The survivors of a crashed rank fail in their next collective: one line, not a traceback each.
        print(f"error: rank {info.rank} lost a peer rank (its own error is above); torchrun stops or restarts "
              f"the job. [{str(err).splitlines()[0][:160]}]", file=sys.stderr, flush=True)
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
        if args.out:
            print(f"Result written to {write_json({'name': args.name, 'git_commit': git_commit(), **result.record}, args.out)}",
                  flush=True)


if __name__ == "__main__":
    main()
