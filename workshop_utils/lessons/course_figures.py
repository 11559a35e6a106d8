"""Notebook 02's weak-scaling speed-up per device, and why it falls short of linear.

``beside_the_course`` keeps the name that notebook 02's scaling cell calls. It no longer sets the
measured figure beside figures quoted from outside the kit: attendees have no source for those, so it
says only what this run measured.
"""

from __future__ import annotations

import pandas as pd

from ..system.errors import WorkshopError

SCALING = "8-GPU speed-up"  # the name notebook 02 passes for its weak-scaling speed-up, on however many devices


def beside_the_course(name: str, measured: float | None, **facts) -> pd.DataFrame:
    """Print what a speed-up on ``world_size`` devices gives per device and why it is below 100%; return a row.

    ``facts``: ``world_size``, ``device_type`` and ``device_name``.
    """
    if name != SCALING:
        raise WorkshopError(f"No figure named {name!r}.", f"use {SCALING!r}, notebook 02's weak-scaling speed-up.")
    world = facts.get("world_size") or 1
    device = facts.get("device_name") or facts.get("device_type") or "this machine"
    if facts.get("device_type") == "cpu":
        where = f"{world} CPU processes that share one memory bus and a few cores"
    else:
        where = f"{world} x {device}"
    efficiency = measured / world if measured else None
    why = "Efficiency falls as the all-reduce takes a larger share of each step (the cost model in section 7)."
    if efficiency is None:
        print(f"speed-up on {where}: not measured in this run")
    else:
        print(f"speed-up on {where}: {measured:.2f}x one process's throughput, {efficiency:.0%} per device. {why}")
    return pd.DataFrame([{"figure": name, "measured here": measured, "world_size": world, "device": device,
                          "per-device efficiency": efficiency, "why": why}])
