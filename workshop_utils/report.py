"""The main job's report: every notebook's results in one readable Markdown file.

Notebooks add what they want reported with ``add_report_section`` (a title, a
short text, a table, figures); ``write_report`` gathers the sections of a run
folder, in notebook order, under the environment they were measured on. It is
also a command: ``python -m workshop_utils.report runs/<folder>``.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import pandas as pd

from .errors import WorkshopError, exit_on_workshop_error
from .hardware import environment
from .results import read_records, save_record


def add_report_section(run_dir, key: str, title: str, order: float, text: str = "",
                       table: pd.DataFrame | list[dict] | None = None, figures=()) -> Path:
    """Record a report section (saved as ``results/section-<key>.json`` in the run folder)."""
    rows = table.to_dict("records") if isinstance(table, pd.DataFrame) else list(table or [])
    run_dir = Path(run_dir)
    figure_paths = [os.path.relpath(Path(f).resolve(), run_dir.resolve()) for f in figures]
    return save_record({"kind": "section", "title": title, "order": order, "text": text, "table": rows,
                        "figures": figure_paths, "environment": environment()}, run_dir, f"section-{key}")


def _markdown_table(rows: list[dict]) -> str:
    frame = pd.DataFrame(rows)
    return frame.to_markdown(index=False, floatfmt=",.4g") if not frame.empty else "(no rows)"


def _environment_lines(env: dict) -> list[str]:
    gpus = "; ".join(f"{g['name']} ({g['memory_gib']} GiB)" for g in env.get("gpus", [])) or "none"
    return [
        f"- Device: **{env['device_name']}** ({env['device_type']}); GPUs: {gpus}",
        f"- PyTorch {env['torch']}, CUDA {env['cuda']}, cuDNN {env['cudnn']}, NCCL {env['nccl']}, "
        f"Python {env['python']}",
        f"- CPU cores available: {env['cpu_cores']}; host {env['hostname']}; measured {env['date']}",
        f"- Slurm: {', '.join(f'{k}={v}' for k, v in env['slurm'].items()) or 'not in a Slurm job'}",
    ]


def write_report(run_dir) -> Path:
    """Write ``<run_dir>/report.md`` from the run folder's sections and notebook log."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise WorkshopError(f"Run folder {run_dir} does not exist.", "run the main job first (see README).")
    records = read_records(run_dir)
    sections = sorted((r for r in records if r.get("kind") == "section"), key=lambda r: (r["order"], r["name"]))
    lines = [f"# Workshop run report: {run_dir.name}", ""]
    env = next((r["environment"] for r in records if "environment" in r), None)
    lines += ["## Environment", "", *(_environment_lines(env) if env else ["(no results recorded)"]), ""]
    if any(r.get("environment", {}).get("device_type") == "cpu" for r in records):
        lines += ["> Measured on a CPU: speed figures show the method, not GPU performance.", ""]
    if any(r.get("metrics", {}).get("data_source") == "synthetic" for r in records):
        lines += ["> **Synthetic data**: no CIFAR-10 was found, so accuracies are on the synthetic stand-in.", ""]
    log = run_dir / "notebooks.json"
    if log.exists():
        runs = json.loads(log.read_text())
        lines += ["## Notebooks executed", "", _markdown_table(runs), ""]
    if not sections:
        lines += ["No notebook recorded a report section in this folder.", ""]
    for section in sections:
        lines += [f"## {section['title']}", ""]
        if section["text"]:
            lines += [section["text"], ""]
        if section["table"]:
            lines += [_markdown_table(section["table"]), ""]
        for figure in section["figures"]:
            lines += [f"![{Path(figure).stem}]({figure})", ""]
    path = run_dir / "report.md"
    path.write_text("\n".join(lines))
    return path


@exit_on_workshop_error
def main(argv=None) -> None:
    parser = argparse.ArgumentParser(prog="python -m workshop_utils.report",
                                     description="Write report.md for a run folder from its recorded results.")
    parser.add_argument("run_dir", help="a folder under runs/ written by the main job or a notebook")
    print(f"Report written to {write_report(parser.parse_args(argv).run_dir)}")


if __name__ == "__main__":
    main()
