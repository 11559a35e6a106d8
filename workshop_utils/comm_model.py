"""``python -m workshop_utils.comm_model``: measure all-reduce over message sizes and fit the link model.

Run it under torchrun (NCCL on GPUs, gloo on CPUs). The model and its plots live in
``parallel/comm_model.py``, the timed collectives in ``parallel/collectives.py``.
"""

from __future__ import annotations

import argparse
import math
from dataclasses import asdict

from .parallel.collectives import measure_all_reduce
from .parallel.comm_model import fit_link, message_sizes
from .parallel.failures import record_failures
from .spine.distributed import setup_distributed, teardown_distributed
from .system.errors import OneLineParser, WorkshopError, exit_on_workshop_error
from .system.results import write_json


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(
        prog="python -m workshop_utils.comm_model",
        description="Measure all-reduce time over message sizes on every process of a torchrun job "
                    "(NCCL on GPUs, gloo on CPUs) and fit the latency and bandwidth of the ring model.")
    parser.add_argument("--min-kib", type=int, default=4, help="smallest message, KiB (default: %(default)s)")
    parser.add_argument("--max-mib", type=int, default=64, help="largest message, MiB (default: %(default)s)")
    parser.add_argument("--repeats", type=int, default=10, help="timed all-reduces per size (default: %(default)s)")
    parser.add_argument("--device", choices=("auto", "cuda", "cpu"), default="auto",
                        help="auto: NCCL on GPUs when there are any, else gloo on CPUs (default: %(default)s)")
    parser.add_argument("--out", default=None, help="JSON file for the measurements (written by rank 0)")
    return parser


@exit_on_workshop_error
@record_failures  # each rank's fatal exception, time-stamped, for launch_torchrun to name the first
def main(argv=None) -> None:
    args = build_parser().parse_args(argv)
    if args.min_kib <= 0 or args.max_mib * 1024 < args.min_kib or args.repeats <= 0:
        raise WorkshopError("Sizes and repeats must be positive and --max-mib at least --min-kib.",
                            "try --min-kib 4 --max-mib 64 --repeats 10.")
    info, device = setup_distributed(None if args.device == "auto" else args.device)
    if not info.distributed:
        raise WorkshopError("One process has nobody to all-reduce with.",
                            "start it with `torchrun --nproc-per-node=2 -m workshop_utils.comm_model`.")
    try:
        rows = measure_all_reduce(message_sizes(args.min_kib, args.max_mib), args.repeats, device)
    finally:
        teardown_distributed()
    if info.is_main:
        link = fit_link([r["size_bytes"] for r in rows], [r["seconds"] for r in rows], info.world_size,
                        f"{info.backend} on {device.type}")
        for r in rows:
            print(f"{r['size_bytes'] / 2**20:9.3f} MiB  {1e3 * r['seconds']:8.3f} ms  "
                  f"bus bandwidth {r['bus_bandwidth_gbps']:7.2f} GB/s", flush=True)
        fit = asdict(link)
        if math.isinf(link.bandwidth_gbps):
            # Times that do not grow with size (a busy machine, messages too small) fix no bandwidth.
            fit["bandwidth_gbps"] = None
            fit["note"] = (f"the times do not grow with message size up to {args.max_mib} MiB, "
                           "so they fix no bandwidth: measure larger messages (--max-mib) or more --repeats")
            print(f"fit: latency {link.latency_us:.1f} us per ring step; bandwidth not measurable: {fit['note']}.",
                  flush=True)
        else:
            print(f"fit: latency {link.latency_us:.1f} us per ring step, bandwidth {link.bandwidth_gbps:.2f} GB/s",
                  flush=True)
        if args.out:
            write_json({"kind": "all_reduce", "backend": info.backend, "device": device.type,
                        "world_size": info.world_size, "rows": rows, "link": fit}, args.out)


if __name__ == "__main__":
    main()
