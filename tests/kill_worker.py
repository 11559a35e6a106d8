"""``python -m workshop_utils.train``, with one rank killed by a real SIGKILL on the first attempt (tests only).

torchrun runs this file in place of the training module (``tests/test_faults.py`` starts it
with ``PYTHONPATH=tests`` and ``-m kill_worker``). It reads what to break from the environment:

    WORKSHOP_TEST_KILL_AT_STEP=5            the step during which the rank dies (1-based, as --fail-at-step)
    WORKSHOP_TEST_KILL_RANK=1               which rank dies (default: the last one)
    WORKSHOP_TEST_KILL_DURING=backward      "backward": inside step N's backward pass, while DDP's
                                            all-reduces are under way; "checkpoint": halfway through
                                            writing step N's checkpoint (give it rank 0, the writer)

Only on the first attempt (TORCHELASTIC_RESTART_COUNT=0): the restarted job runs untouched.
Unlike ``--fail-at-step`` (a Python exception, with ``finally`` blocks and a clean exit),
SIGKILL gives the process no chance to do anything: what a pre-empted node or the OOM killer does.
"""

from __future__ import annotations

import importlib
import io
import os
import signal
import sys

import torch

import workshop_utils.spine.trainer as trainer


def _die(what: str) -> None:
    print(f"kill_worker: rank {os.environ.get('RANK')} (pid {os.getpid()}) sends itself SIGKILL {what}", flush=True)
    os.kill(os.getpid(), signal.SIGKILL)


def _arm_backward_kill(kill_at: int) -> None:
    """SIGKILL from inside the backward pass of step ``kill_at``, once autograd reaches the first layer's output."""
    if kill_at < 2:
        raise SystemExit("kill_worker: WORKSHOP_TEST_KILL_AT_STEP must be 2 or more with KILL_DURING=backward")
    armed = {"now": False}

    def after_step(step: int) -> None:  # after `step` optimizer steps: the next training forward is step + 1's
        armed["now"] = step == kill_at - 1

    def forward_hook(module, inputs, output):
        if armed["now"] and module.training and torch.is_tensor(output) and output.requires_grad:
            armed["now"] = False  # the first module to finish its forward: its gradient comes last in backward
            output.register_hook(lambda grad: _die(f"in the backward pass of step {kill_at}"))

    torch.nn.modules.module.register_module_forward_hook(forward_hook)
    real_train = trainer.train

    def train(config, data=None, on_step=None):  # the entry calls train(config): add our hook to its on_step
        def both(step):
            if on_step is not None:
                on_step(step)
            after_step(step)

        return real_train(config, data, both)

    trainer.train = train  # before the entry imports it


def _arm_checkpoint_kill(kill_at: int) -> None:
    """SIGKILL after half of step ``kill_at``'s checkpoint is on the disk, in its temporary file."""
    real_save = torch.save
    target = f"step_{kill_at:08d}.pt"

    def save(obj, f, *args, **kwargs):
        if target not in str(getattr(f, "name", f)):
            return real_save(obj, f, *args, **kwargs)
        whole = io.BytesIO()
        real_save(obj, whole, *args, **kwargs)
        f.write(whole.getvalue()[: len(whole.getvalue()) // 2])
        f.flush()
        os.fsync(f.fileno())
        _die(f"halfway through writing {target} ({f.name})")

    torch.save = save


def main() -> None:
    kill_at = int(os.environ["WORKSHOP_TEST_KILL_AT_STEP"])
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    doomed = int(os.environ.get("WORKSHOP_TEST_KILL_RANK", world - 1))
    during = os.environ.get("WORKSHOP_TEST_KILL_DURING", "backward")
    first_attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT") or 0) == 0
    if rank == doomed and first_attempt:
        if during == "backward":
            _arm_backward_kill(kill_at)
        elif during == "checkpoint":
            _arm_checkpoint_kill(kill_at)
        else:
            raise SystemExit(f"kill_worker: unknown WORKSHOP_TEST_KILL_DURING={during!r}")
    entry = importlib.import_module("workshop_utils.train")  # imported now: it takes the patched train
    entry.main(sys.argv[1:])


if __name__ == "__main__":
    main()
