"""Where the decks' numbers come from: run folders and the reference results, looked up per item.

A ``Source`` is one folder of result records (``results/*.json``); ``Results`` is the list of them, newest run
first and ``results/reference/`` last, and answers "the newest record called X (holding a value at path P)".
``_lookup`` reads a value at a dotted path of a record, including a table row chosen by its contents
(``table[mode=weak,max:world_size].speedup``).
"""

from __future__ import annotations

import json
import math
import os
import re
import sys
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
RUN_FIRST = "make run"


class BuildError(Exception):
    """A problem the user can fix; printed as one message with what to do, exit status 2."""


def _load_records(folder: Path) -> dict[str, dict]:
    records = {}
    for path in sorted((folder / "results").glob("*.json")):
        try:
            record = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError) as err:
            print(f"warning: skipping unreadable record {path}: {err}", file=sys.stderr)
            continue
        if isinstance(record, dict):
            records[record.get("name", path.stem)] = record
    return records


def _environment(records) -> dict:
    """The environment of the measurements (a section only says where its notebook ran)."""
    envs = [r["environment"] for r in records if isinstance(r.get("environment"), dict)]
    measured = [r["environment"] for r in records
                if r.get("kind") != "section" and isinstance(r.get("environment"), dict)]
    return next(iter(measured or envs), {})


def _device(env: dict) -> str:
    if not env:
        return "an unrecorded device"
    return f"{env.get('device_name', '?')} ({env.get('device_type', '?')})"


def _date(env: dict) -> str:
    return str(env.get("date", "?"))[:10]


@dataclass
class Source:
    """One folder of results: a run folder or the reference results."""

    folder: Path
    kind: str  # "given run folder", "run folder" or "reference results"
    records: dict[str, dict] = field(default_factory=dict)

    @property
    def label(self) -> str:
        try:
            return str(self.folder.resolve().relative_to(REPO))
        except ValueError:
            return str(self.folder)

    @property
    def environment(self) -> dict:
        return _environment(self.records.values())

    @property
    def commit(self) -> str | None:
        """The commit the folder's records were measured at (the one most of them name), short; None if unrecorded."""
        commits = [str(r["git_commit"])[:7] for r in self.records.values()
                   if isinstance(r.get("git_commit"), str) and re.fullmatch(r"[0-9a-f]{7,40}", r["git_commit"])]
        return max(sorted(set(commits)), key=commits.count) if commits else None

    def profile(self, notebook: str = "") -> str | None:
        """The profile (cpu, gpu) the folder's notebook ``NN`` ran at, as the runner recorded it (notebooks.json,
        else reference.json); None where the folder does not say."""
        for name in ("notebooks.json", "reference.json"):
            try:
                recorded = json.loads((self.folder / name).read_text())
            except (OSError, ValueError):
                continue
            entries = recorded if isinstance(recorded, list) else [recorded]
            for entry in entries:
                if (isinstance(entry, dict) and entry.get("profile")
                        and str(entry.get("notebook", notebook)).startswith(notebook)):
                    return str(entry["profile"])
        return None

    def describe(self, env: dict | None = None) -> str:
        env = env or self.environment
        at = f" at commit {self.commit}" if self.commit else ""
        if self.kind == "reference results":
            return f"the reference run of {_date(env)}{at}, {_device(env)}"
        return f"run {self.folder.name} of {_date(env)}{at}, {_device(env)}"

    def figure(self, name: str) -> Path | None:
        path = self.folder / "figures" / f"{name}.png"
        return path if path.is_file() else None


@dataclass
class Results:
    """Where results are looked up, in order: the newest run folder first, the reference results last."""

    sources: list[Source]

    @property
    def primary(self) -> Source:
        return self.sources[0]

    @property
    def label(self) -> str:
        return self.primary.label

    @property
    def environment(self) -> dict:
        return self.primary.environment

    def record(self, name: str, path: str = "") -> tuple[dict | None, Source | None]:
        """The newest record called ``name`` (holding a value at dotted ``path`` when given)."""
        for source in self.sources:
            record = source.records.get(name)
            if record is not None and (not path or _lookup(record, path) is not None):
                return record, source
        return None, None

    def figure(self, name: str) -> tuple[Path | None, Source | None]:
        for source in self.sources:
            path = source.figure(name)
            if path:
                return path, source
        return None, None

    def sections(self, low: float, high: float) -> list[tuple[dict, Source]]:
        """Every report section with ``low <= order < high``, each from the newest folder holding it."""
        found: dict[str, tuple[dict, Source]] = {}
        for source in self.sources:
            for name, record in source.records.items():
                if record.get("kind") == "section" and low <= float(record.get("order", -1)) < high:
                    found.setdefault(name, (record, source))
        return sorted(found.values(), key=lambda item: (item[0]["order"], item[0]["name"]))


PATH_PART = re.compile(r"\[[^\]]*\]|[^.\[\]]+")  # a dotted path's parts: keys, list indices, [row selectors]


def _lookup(record: dict, path: str):
    """The value at a dotted ``path`` of a record, or None: ``metrics.samples_per_s``, ``rows.0.step_ms``, and a
    row of a table chosen by its contents, ``table[mode=weak,max:world_size].speedup`` (see ``_pick_row``)."""
    value = record
    for key in PATH_PART.findall(path):
        if key.startswith("["):
            value = _pick_row(value, key[1:-1], path)
            if value is None:
                return None
        elif isinstance(value, dict) and key in value:
            value = value[key]
        elif isinstance(value, list) and key.isdigit() and int(key) < len(value):
            value = value[int(key)]
        else:
            return None
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def _same(value, text: str) -> bool:
    """Whether a table cell equals the text of a row selector (``world_size=2`` matches 2 and 2.0)."""
    if isinstance(value, bool):
        return text.lower() in (("true", "yes", "1") if value else ("false", "no", "0"))
    if isinstance(value, (int, float)):
        try:
            return float(text) == value
        except ValueError:
            return False
    return str(value) == text


# How a row selector's ``how:key`` term picks one of the rows that have a number in ``key``.
PICKS = {"max": lambda rows, key: max(rows, key=lambda r: r[key]),
         "min": lambda rows, key: min(rows, key=lambda r: r[key]),
         "first": lambda rows, key: rows[0],
         "last": lambda rows, key: rows[-1]}


def _pick_row(rows, selector: str, path: str = ""):
    """One row of a list of rows (a report section's ``table``, a record's ``rows``), chosen by its contents.

    ``selector`` is what stands between the brackets, terms separated by commas: ``key=value`` keeps the rows whose
    ``key`` equals ``value`` (every such term must hold); then, of the kept rows that have a number in ``key``,
    ``max:key`` or ``min:key`` takes the one with the largest or smallest, ``first:key`` or ``last:key`` the first
    or last in the table's order; without one of these the first kept row is taken.
    ``[mode=weak,max:world_size]`` is the weak-scaling row of the most processes, ``[max:vs_baseline]`` the
    fastest rung of the ladder, ``[last:vs_baseline]`` its top rung that was measured. None when no row is left,
    so that the value is looked up in an older folder, as a missing key is.
    """
    if not isinstance(rows, list):
        return None
    pick = None
    for term in (t.strip() for t in selector.split(",")):
        how, colon, key = term.partition(":")
        if colon and how in PICKS and key:
            pick = (PICKS[how], key.strip())
            continue
        key, eq, wanted = term.partition("=")
        if not eq or not key.strip():
            raise BuildError(f"row selector [{selector}] in {path!r}: {term!r} is neither key=value nor "
                             "max:key, min:key, first:key or last:key",
                             "see the {{value}} row of the directive table in slides/README.md")
        rows = [r for r in rows if isinstance(r, dict) and _same(r.get(key.strip()), wanted.strip())]
    if pick:
        best, key = pick
        numbers = [r for r in rows if isinstance(r, dict) and isinstance(r.get(key), (int, float))
                   and not isinstance(r.get(key), bool) and math.isfinite(r[key])]
        return best(numbers, key) if numbers else None
    return rows[0] if rows else None



def runs_root() -> Path:
    try:
        sys.path.insert(0, str(REPO))
        from workshop_utils.system.results import runs_root as package_runs_root
        return package_runs_root()
    except ImportError:  # the package is not installed: use the same rule by hand
        return Path(os.environ.get("WORKSHOP_RUNS") or REPO / "runs")
    finally:
        sys.path.remove(str(REPO))


def _started(folder: Path) -> datetime:
    """When a run folder was made: the timestamp its name starts with, else its modification time."""
    match = re.match(r"(\d{8}-\d{6})", folder.name)
    if match:
        try:
            return datetime.strptime(match.group(1), "%Y%m%d-%H%M%S")
        except ValueError:
            pass
    return datetime.fromtimestamp(folder.stat().st_mtime)


def find_results(run_dir: str | None, reference: Path) -> Results:
    """The folders to take results from: the given run folder or every run folder with records, newest first,
    then results/reference/."""
    sources: list[Source] = []
    if run_dir:
        folder = Path(run_dir)
        if not folder.is_dir():
            raise BuildError(f"Run folder {folder} does not exist.",
                             f"run `{RUN_FIRST}` first, or pass --run-dir with a folder under runs/.")
        records = _load_records(folder)
        if not records:
            raise BuildError(f"Run folder {folder} holds no result records (results/*.json).",
                             f"run `{RUN_FIRST}` first; it writes results/ and figures/ into a new run folder.")
        sources.append(Source(folder, "given run folder", records))
    else:
        root = runs_root()
        folders = [p for p in root.glob("*") if p.is_dir()] if root.is_dir() else []
        for folder in sorted(folders, key=lambda p: (_started(p), p.name), reverse=True):
            records = _load_records(folder)
            if records:  # a run that recorded nothing yet is passed over
                sources.append(Source(folder, "run folder", records))
    records = _load_records(reference) if reference.is_dir() else {}
    if records:
        sources.append(Source(reference, "reference results", records))
    if not sources:
        raise BuildError(f"No results to build the slides from: no run folder with records under {runs_root()}, "
                         f"and none in {reference}.",
                         f"run `{RUN_FIRST}` first (it executes the notebooks into runs/<timestamp>/), "
                         "or pass --run-dir.")
    return Results(sources)
