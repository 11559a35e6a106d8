"""What Slurm's clients print, read as values: ``scontrol -o`` lines as dicts, durations as seconds,
sacct's memory as MiB, GPUs in a GRES or TRES list, and rows as a table.

Nothing here runs a client, so each reading can be tested on text alone; pandas is imported only
when a table is asked for, so a job that only reads a line starts quickly.
"""

from __future__ import annotations

import re

_KEY = re.compile(r"^[A-Za-z][\w/:.]*$")


def parse_scontrol(line: str) -> dict[str, str]:
    """One line of ``scontrol -o show ...`` as a dict; values with spaces (``OS=Linux 6.1 #1 SMP``) stay whole."""
    fields: dict[str, str] = {}
    key = None
    for token in line.split():
        name, eq, value = token.partition("=")
        if eq and _KEY.match(name):
            key, fields[name] = name, value
        elif key is not None:
            fields[key] += " " + token
    return fields


def seconds_of(duration: str | None) -> int | None:
    """Slurm's ``[D-]HH:MM:SS`` (or ``MM:SS``) as seconds; None for what is not a duration."""
    if not duration or not re.fullmatch(r"(\d+-)?(\d+:){1,2}\d+", duration):
        return None
    days, _, clock = duration.rpartition("-")
    parts = [int(p) for p in clock.split(":")]
    while len(parts) < 3:
        parts.insert(0, 0)
    return int(days or 0) * 86400 + parts[0] * 3600 + parts[1] * 60 + parts[2]


def duration_s(text: str | None) -> float | None:
    """sacct's ``[D-][HH:]MM:SS[.mmm]`` (TotalCPU has milliseconds) as seconds; None for what is not one."""
    if not text:
        return None
    whole, _, fraction = text.partition(".")
    seconds = seconds_of(whole)
    return None if seconds is None else seconds + (float(f"0.{fraction}") if fraction.isdigit() else 0.0)


def memory_mib(text: str | None) -> float | None:
    """sacct's memory (``123456K``, ``1.5G``; a bare number is bytes) in MiB; None for what is not one."""
    found = re.fullmatch(r"([\d.]+)([KMGT]?)", (text or "").strip())
    if not found:
        return None
    return float(found.group(1)) * {"": 2**-20, "K": 2**-10, "M": 1, "G": 2**10, "T": 2**20}[found.group(2)]


def tres_gpus(tres: str | None) -> int:
    """GPUs in a TRES list (``cpu=8,mem=64G,node=1,gres/gpu=4``, or ``gres/gpu:h100=4``)."""
    return sum(int(n) for n in re.findall(r"gres/gpu(?::[\w-]+)?=(\d+)", tres or ""))


def gpus_in_gres(gres) -> int:
    """GPUs a node's GRES string offers: "gpu:4", "gpu:h100:4(S:0-1)", "gpu:a100:2,shard:8"; 0 for "(null)"."""
    return sum(int(count) for count in re.findall(r"(?:^|,)gpu(?::[^:,(]+)?:(\d+)", str(gres or "")))


def frame_of(rows: list[dict], columns: list[str]):
    import pandas as pd

    return pd.DataFrame(rows, columns=columns)
