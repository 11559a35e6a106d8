"""``python -m failing_ranks HOW [RANK]``: a few all-reduces on every rank, and one way to fail (tests only).

torchrun runs it in place of a kit entry (``tests/test_root_cause.py`` starts it with
``PYTHONPATH=tests``); its ``main`` records failures as the kit's entries do. HOW is one of:

    clean       every rank runs every collective and ends
    crash       RANK raises RuntimeError in its third step, the others are in an all-reduce
    oom         RANK asks for more memory than any machine has (a real allocation failure)
    kill        RANK sends itself SIGKILL in its third step, as the out-of-memory killer would
    barrier     after the steps, rank 0 alone calls dist.barrier(); the others finish and leave
    all_reduce  the same with dist.all_reduce
"""

from __future__ import annotations

import os
import signal
import sys

import torch
import torch.distributed as dist

from workshop_utils.parallel.failures import record_failures

STEPS = 5


@record_failures
def main(how: str, failing: int) -> None:
    dist.init_process_group("gloo")
    rank, values = dist.get_rank(), torch.ones(4)
    try:
        for step in range(STEPS):
            if rank == failing and step == 2:
                if how == "crash":
                    raise RuntimeError(f"rank {rank} fell over in step {step}")
                if how == "oom":
                    torch.empty(2 ** 62, dtype=torch.uint8)
                if how == "kill":
                    os.kill(os.getpid(), signal.SIGKILL)
            dist.all_reduce(values)
        if how in ("barrier", "all_reduce") and rank == 0:
            dist.barrier() if how == "barrier" else dist.all_reduce(values)
        print(f"rank {rank}: done", flush=True)
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else -1)
