"""Record what ``pytest --nbval-lax notebooks/`` expects: the outputs of the cells tagged ``nbval-check-output``.

The committed notebooks carry no outputs, so the expected ones live beside the tests, one file per notebook,
taken from the executed copies of a main-job run in the cpu profile::

    make run                                   # or: python -m workshop_utils.run_notebooks --profile cpu
    python tests/nbval_expected.py runs/<that run>

Commit tests/nbval/*.json with the notebook change that made them differ. Only tagged cells are written; a
tagged cell that did not run in that folder is an error, not an empty expectation.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

import nbformat

ROOT = Path(__file__).resolve().parents[1]
CHECKED = "nbval-check-output"


def checked_cells(notebook: Path) -> list[str]:
    """The ids of a committed notebook's cells that nbval compares."""
    cells = nbformat.read(notebook, as_version=4).cells
    return [c.id for c in cells if c.cell_type == "code" and CHECKED in c.metadata.get("tags", [])]


# What nbval leaves out of a comparison (its IPyNbFile.skip_compare, without --nbdime).
NOT_COMPARED = {"metadata", "traceback", "prompt_number", "output_type", "name", "execution_count",
                "application/vnd.jupyter.widget-view+json", "image/png", "image/jpeg"}


def sanitize_patterns(path: Path = ROOT / "tests" / "nbval" / "sanitize.cfg") -> list[tuple[str, str]]:
    from nbval.plugin import get_sanitize_patterns

    return get_sanitize_patterns(path.read_text())


def compared(outputs: list, patterns: list[tuple[str, str]]) -> dict[str, list]:
    """Outputs as nbval compares them: streams merged by name, keys it skips dropped, text sanitized."""
    from nbval.plugin import coalesce_streams, transform_streams_for_comparison

    def clean(value):
        if not isinstance(value, str):
            return value
        for regex, replace in patterns:
            value = re.sub(regex, replace, value)
        return value

    view: dict[str, list] = {}
    merged = transform_streams_for_comparison(coalesce_streams([nbformat.from_dict(o) for o in outputs]))
    for output in merged:
        for key, value in output.items():
            if key in NOT_COMPARED:
                continue
            items = value.items() if key == "data" else [(key, value)]
            for inner, text in items:
                if inner not in NOT_COMPARED:
                    view.setdefault(inner, []).append(clean("".join(text) if isinstance(text, list) else text))
    return view


def record(run: Path, out: Path) -> list[Path]:
    written = []
    for notebook in sorted((ROOT / "notebooks").glob("*.ipynb")):
        wanted = checked_cells(notebook)
        if not wanted:
            continue
        executed = run / "notebooks" / notebook.name
        if not executed.exists():
            raise SystemExit(f"error: {executed} does not exist: pass the folder of a main-job run (runs/<run>).")
        cells = {c.id: c for c in nbformat.read(executed, as_version=4).cells}
        missing = [i for i in wanted if i not in cells or cells[i].get("execution_count") is None]
        if missing:
            raise SystemExit(f"error: {executed.name}: tagged cell(s) {', '.join(missing)} did not run there.")
        expected = {i: [{k: v for k, v in output.items() if k != "execution_count"} for output in cells[i].outputs]
                    for i in wanted}
        path = out / f"{notebook.stem}.json"
        path.write_text(json.dumps({"from": f"{run.name}/notebooks/{notebook.name}", "cells": expected},
                                   indent=1, ensure_ascii=False) + "\n")
        written.append(path)
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run", type=Path, help="a main-job run folder (runs/<run>), cpu profile")
    parser.add_argument("--out", type=Path, default=ROOT / "tests" / "nbval", help="where the expected outputs go")
    args = parser.parse_args(argv)
    for path in record(args.run, args.out):
        print(f"wrote {path.relative_to(ROOT) if path.is_relative_to(ROOT) else path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
