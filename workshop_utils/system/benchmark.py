"""One shape for every benchmark script: the same flags, one JSON layout, one reader.

Every script under ``benchmarks/`` is called the same way::

    python benchmarks/<name>.py [--profile {auto,cpu,gpu}] [--run-dir DIR] [--repeats N] [its own options]

and writes one file, ``<run-dir>/benchmarks/<name>.json`` (``--run-dir`` defaults to a new
``runs/<time>-bench-<name>/``), in one layout::

    {"benchmark": name, "profile": "cpu" | "gpu", "environment": {...},
     "settings": {...}, "rows": [{...}, ...], "summary": {...},
     "git_commit": "abc1234", "created": "2026-01-01T12:00:00+00:00"}

``settings`` are the sizes the run used, with their units in their names (``train_images``,
``batch_samples``, ``timed_batches``, ``repeats``); ``rows`` is the benchmark's table, one
dict per row; ``summary`` holds the few numbers its goals are judged by. A benchmark with a
second table (a sweep beside its main comparison) adds ``"tables": {name: [{...}, ...]}`` after
these keys; a file without it is in the layout all the same. ``read_benchmarks``
reads every such file of a run folder back, and the run report shows one table per benchmark.
A mistake on the command line is one line, ``error: ... Fix: ...``, and exit status 2.
"""

from __future__ import annotations

import argparse
import json
import os
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

import torch

from .errors import OneLineParser, WorkshopError, positive_int
from .hardware import device_name, environment, pick_device
from .profiles import PROFILE_NAMES, pick_settings, profile_choice
from .results import git_commit, new_run_dir, resolve_run_dir, write_json
from .progress import progress_bar

BENCHMARK_FOLDER = "benchmarks"
LAYOUT_KEYS = ("benchmark", "profile", "environment", "settings", "rows", "summary", "git_commit", "created")
SHARED_FLAGS = ("--profile", "--run-dir", "--repeats")


def benchmark_parser(name: str, description: str | None = None, repeats: int = 3,
                     repeats_help: str = "measurements of each case (the median is reported)") -> OneLineParser:
    """The parser every benchmark starts from: ``--profile``, ``--run-dir`` and ``--repeats``; add its own options."""
    prog = f"python benchmarks/{name}.py"
    parser = OneLineParser(prog=prog, description=description, formatter_class=argparse.RawDescriptionHelpFormatter,
                           fix=f"see `{prog} --help`; every benchmark takes --profile "
                               f"{{{','.join(PROFILE_NAMES)}}}, --run-dir DIR and --repeats N.")
    parser.add_argument("--profile", default="auto", choices=PROFILE_NAMES,
                        help="sizes and device: 'cpu' (small, on the CPU), 'gpu' (full size, on the GPU), "
                             "'auto' ($WORKSHOP_PROFILE, else gpu when a CUDA GPU is visible, else cpu)")
    parser.add_argument("--run-dir", metavar="DIR",
                        help=f"run folder; the result goes to DIR/{BENCHMARK_FOLDER}/{name}.json "
                             f"(default: a new runs/<time>-bench-{name}/)")
    parser.add_argument("--repeats", type=positive_int, default=repeats, metavar="N",
                        help=f"{repeats_help} (default {repeats})")
    parser.set_defaults(benchmark=name)
    return parser


@dataclass
class BenchmarkRun:
    """A benchmark about to run: its parsed options, its profile and device, and where its result goes."""

    name: str
    args: argparse.Namespace
    profile: str  # "cpu" or "gpu", never "auto"
    device: torch.device
    repeats: int
    _run_dir: Path | None = field(default=None, repr=False)

    def folder(self) -> Path:
        """The run folder (created on first use, so a run refused early leaves nothing behind)."""
        if self._run_dir is None:
            given = self.args.run_dir
            self._run_dir = resolve_run_dir(given) if given else new_run_dir(f"bench-{self.name}")
        return self._run_dir

    def settings(self, profiles: dict[str, dict], **overrides) -> dict:
        """The profile's sizes (``pick_settings``), overrides that are not None on top."""
        chosen = pick_settings(profiles, self.profile, **overrides)
        chosen.pop("profile")
        return chosen

    def write(self, settings: dict, rows, summary: dict | None = None, tables: dict | None = None) -> Path:
        return write_benchmark(self.name, self.profile, self.device, settings, rows, self.folder(),
                               summary, repeats=self.repeats, tables=tables)

    def progress(self, total: int, desc: str, unit: str = "run"):
        """A progress bar on stderr for the benchmark's long loop (use ``.write`` to print beside it)."""
        return progress_bar(total=total, desc=desc, unit=unit)


def start_benchmark(parser: argparse.ArgumentParser, argv=None) -> BenchmarkRun:
    """Parse the command line and settle the profile and device (a GPU asked for but missing is one line)."""
    args = parser.parse_args(argv)
    profile, reason = profile_choice(args.profile)
    device = pick_device() if profile == "gpu" else torch.device("cpu")
    print(f"benchmark {args.benchmark}: profile {profile!r} ({reason}) on {device_name(device)}", flush=True)
    return BenchmarkRun(args.benchmark, args, profile, device, args.repeats)


def median_run(runs: list, speed):
    """Of repeated runs of one case, the one of median ``speed(run)`` (the only one when there is one).

    A run without a speed (``None``) counts as the slowest.
    """
    return sorted(runs, key=lambda run: speed(run) or 0.0)[len(runs) // 2]


def benchmark_path(run_dir: str | os.PathLike, name: str) -> Path:
    return Path(run_dir) / BENCHMARK_FOLDER / f"{name}.json"


def _rows(rows) -> list[dict]:
    if hasattr(rows, "to_json"):  # a DataFrame: through JSON, so NaN becomes null and numpy numbers plain ones
        return json.loads(rows.to_json(orient="records"))
    return [dict(row) for row in rows]


def write_benchmark(name: str, profile: str, device: torch.device | str, settings: dict, rows,
                    run_dir: str | os.PathLike, summary: dict | None = None, repeats: int | None = None,
                    tables: dict | None = None) -> Path:
    """Write ``<run_dir>/benchmarks/<name>.json`` in the one layout (atomically) and return its path.

    ``tables`` ({name: rows}) are further tables, stored under ``"tables"`` after the layout's keys.
    """
    if profile not in ("cpu", "gpu"):
        raise WorkshopError(f"A benchmark records the profile it ran, 'cpu' or 'gpu', not {profile!r}.",
                            "pass the resolved profile (start_benchmark gives it).")
    settings = dict(settings)
    if repeats is not None:
        settings.setdefault("repeats", repeats)
    record = {"benchmark": name, "profile": profile, "environment": environment(device), "settings": settings,
              "rows": _rows(rows), "summary": dict(summary or {}), "git_commit": git_commit(),
              "created": datetime.now(timezone.utc).isoformat(timespec="seconds")}
    if tables:
        record["tables"] = {key: _rows(value) for key, value in tables.items()}
    return write_json(record, benchmark_path(run_dir, name))


def read_benchmark(path: str | os.PathLike) -> dict:
    """One benchmark file; a WorkshopError naming it when it is not in the layout."""
    path = Path(path)
    try:
        record = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, ValueError) as err:
        raise WorkshopError(f"{path} is not a readable benchmark result ({type(err).__name__}: {err}).",
                            "move it out of the benchmarks/ folder, or rerun the benchmark.") from None
    missing = [key for key in LAYOUT_KEYS if key not in record] if isinstance(record, dict) else list(LAYOUT_KEYS)
    if missing or not isinstance(record["rows"], list) or not isinstance(record["settings"], dict):
        raise WorkshopError(f"{path} is not in the benchmark layout (missing or malformed: "
                            f"{', '.join(missing) or 'rows/settings'}).",
                            "rerun the benchmark with this version of benchmarks/.")
    return record


def read_benchmarks(run_dir: str | os.PathLike, problems: list[str] | None = None) -> list[dict]:
    """Every benchmark result of a run folder, by name. An unreadable file raises a WorkshopError naming
    it, or, when ``problems`` is a list, is skipped and named there."""
    folder = Path(run_dir) / BENCHMARK_FOLDER
    records = []
    for path in sorted(folder.glob("*.json")) if folder.is_dir() else []:
        try:
            records.append(read_benchmark(path))
        except WorkshopError as err:
            if problems is None:
                raise
            problems.append(err.problem)
    return records


def benchmark_frame(record: dict):
    """A benchmark's rows as a DataFrame, columns in the order the benchmark wrote them."""
    import pandas as pd

    return pd.DataFrame(record["rows"])
