"""Stop requests from the batch system, kept free of heavy imports.

Slurm warns a job before killing it (SIGTERM on pre-emption; ``--signal=USR1@120``
asks for SIGUSR1 two minutes before the time limit). The command-line entry
installs ``stop_on_signals`` before it even imports torch, so a warning that
arrives during start-up is not lost; the training loop then finishes its step,
writes a checkpoint and returns. Repeated signals change nothing: on pre-emption
Slurm signals every process of the job while the batch script forwards its own
warning, so one process may well receive two.
"""

from __future__ import annotations

import os
import signal
import threading

_requested = threading.Event()
_installed = False


def stop_on_signals(signals=None) -> None:
    """On any of ``signals``, ask the training loop to checkpoint and stop.

    By default SIGUSR1 and SIGTERM, but SIGUSR1 alone in a torchrun worker: torchrun stops
    the survivors of a failed rank with SIGTERM, and a rank blocked in a collective waiting
    for the dead peer never gets to run a Python handler, so torchrun would wait out its grace
    period and kill it anyway, on every restart. Slurm's warning arrives as SIGUSR1 there
    (the batch script forwards it).
    """
    global _installed
    if signals is None:
        under_torchrun = "TORCHELASTIC_RUN_ID" in os.environ
        signals = (signal.SIGUSR1,) if under_torchrun else (signal.SIGTERM, signal.SIGUSR1)
    for sig in signals:
        signal.signal(sig, lambda signum, frame: _requested.set())
    _installed = True


def stop_requested() -> bool:
    return _requested.is_set()


def handling_signals() -> bool:
    """True once ``stop_on_signals`` was installed in this process (the loop then polls for stops)."""
    return _installed
