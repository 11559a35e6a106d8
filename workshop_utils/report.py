"""The main job's report: every notebook's results in one readable Markdown file.

Notebooks add what they want reported with ``add_report_section`` (a title, a
short text, a table, figures); ``write_report`` gathers the sections of a run
folder, in notebook order, under the environment they were measured on, then one
table per benchmark result the folder holds (``benchmarks/<name>.json``, written by
the scripts under ``benchmarks/`` in their one layout). It is also a command:
``python -m workshop_utils.report runs/<folder>``.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import pandas as pd

from .system.benchmark import benchmark_frame, read_benchmarks
from .system.errors import OneLineParser, WorkshopError, exit_on_workshop_error
from .system.hardware import environment
from .system.results import read_records, save_record, write_atomically


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
    driver = f", driver {env['driver']}" if env.get("driver") else ""
    return [
        f"- Device: **{env['device_name']}** ({env['device_type']}); GPUs: {gpus}{driver}",
        f"- PyTorch {env['torch']}, CUDA {env['cuda']}, cuDNN {env['cudnn']}, NCCL {env['nccl']}, "
        f"Python {env['python']}",
        f"- CPU: {env.get('cpu_model', 'model not recorded')}"
        + (f" ({env['cpu_capability']})" if env.get("cpu_capability") else "")
        + f", {env['cpu_cores']} cores available; host {env['hostname']}; measured {env['date']}",
        f"- Slurm: {', '.join(f'{k}={v}' for k, v in env['slurm'].items()) or 'not in a Slurm job'}",
    ]


def _device_banner(records: list[dict]) -> list[str]:
    """The CPU warning, decided by the devices the records say they ran on.

    Never by the machine writing the report (a login node, a laptop), and per record: on a GPU
    node a run that fell back to the CPU (gloo ranks, a CPU comparison) is named, since its speed
    figures sit next to the GPU's. Measurements count first; report sections only say where the
    notebook ran, so they decide only when there is nothing else.
    """
    measured = [r for r in records if r.get("kind") != "section" and isinstance(r.get("environment"), dict)]
    judged = measured or [r for r in records if isinstance(r.get("environment"), dict)]
    on_cpu = [r for r in judged if r["environment"].get("device_type") == "cpu"]
    if not on_cpu:
        return []
    if len(on_cpu) == len(judged):
        return ["> Measured on a CPU: speed figures show the method, not GPU performance.", ""]
    names = ", ".join(f"`{r.get('name', '?')}`" for r in on_cpu)
    return [f"> Measured on the CPU, not on a GPU: {names}. Their speed figures show the method, "
            "not GPU performance.", ""]


def _report_environment(records: list[dict]) -> dict | None:
    """The environment the report's header describes: a GPU run's when there is one (its GPUs, driver)."""
    envs = [r["environment"] for r in records if isinstance(r.get("environment"), dict)]
    return next((e for e in envs if e.get("device_type") != "cpu"), envs[0] if envs else None)


def _cell(value) -> str:
    """Text safe inside a Markdown table cell: error messages carry pipes and line breaks."""
    return " ".join(str(value).split()).replace("|", "\\|") if value not in (None, "") else ""


def _notebook_lines(runs: list[dict]) -> list[str]:
    """Per notebook: pass/fail, wall time against its budget, and where and why it failed."""
    lines = ["## Notebooks executed", ""]
    profiles = sorted({r["profile"] for r in runs if r.get("profile")})
    budgets = sorted({r["budget_s"] for r in runs if r.get("budget_s")})
    limits = sorted({r["limit_s"] for r in runs if r.get("limit_s")})
    if profiles or budgets:
        lines += [f"Profile {', '.join(profiles) or 'unknown'}; time budget "
                  f"{', '.join(f'{b:g} s' for b in budgets) or 'none'} per notebook"
                  + (f", each stopped at {', '.join(f'{x:g} s' for x in limits)}" if limits else "") + ".", ""]
    failed = [r for r in runs if r.get("status") != "ok"]
    slow = [r for r in runs if r.get("status") == "ok" and r.get("over_budget")]
    if any(r.get("check") for r in runs):
        verdict = ("**Pre-flight: ready.** Every notebook passed within its time budget."
                   if not failed and not slow else
                   f"**Pre-flight: NOT ready.** {len(failed)} failed, {len(slow)} passed over their time budget.")
        lines += [verdict, ""]
    lines += ["| notebook | result | wall time (s) | budget (s) | first error, and the cell it happened in |",
              "|:--|:--|--:|--:|:--|"]
    for r in runs:
        status = r.get("status", "?")
        result = {"ok": "ok", "running": "no result (stopped)"}.get(status, f"**{status}**")
        if status == "ok" and r.get("over_budget"):
            result = "ok, **over budget**"
        seconds = f"{r['seconds']:.1f}" if isinstance(r.get("seconds"), (int, float)) else ""
        budget = f"{r['budget_s']:g}" if r.get("budget_s") else ""
        where = f"In [{r['cell']}] `{r.get('cell_source', '')}`: " if r.get("cell") else ""
        error = f"{where}{r.get('error', '')}" if status != "ok" else ""
        lines.append(f"| {_cell(r.get('notebook', '?'))} | {result} | {seconds} | {budget} | {_cell(error)} |")
    lines.append("")
    if failed:
        lines += ["The executed copy of each notebook, with its outputs up to the failure, is in `notebooks/`.", ""]
    if slow:
        lines += [f"Over budget: {', '.join(r['notebook'] for r in slow)}. A notebook must finish within its "
                  "budget to be run live in a session.", ""]
    return lines


def _value(value) -> str:
    if isinstance(value, float):
        return f"{value:,.4g}"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {_value(v)}" for k, v in value.items()) + "}"
    if isinstance(value, list):
        return "[" + ", ".join(_value(v) for v in value) + "]"
    return str(value)


def _benchmark_lines(benchmarks: list[dict]) -> list[str]:
    """One subsection per benchmark result: where and when it ran, its settings, its table, its summary."""
    lines = ["## Benchmarks", ""]
    for record in benchmarks:
        env = record.get("environment") if isinstance(record.get("environment"), dict) else {}
        lines += [f"### {record['benchmark']}", ""]
        device = f"{env.get('device_name', '?')} ({env.get('device_type', '?')})"
        commit = f", commit {record['git_commit']}" if record.get("git_commit") else ""
        lines += [f"Profile {record.get('profile', '?')} on {device}; written {record.get('created', '?')}{commit}.", ""]
        if record["settings"]:
            lines += ["Settings: " + ", ".join(f"{k}={_value(v)}" for k, v in record["settings"].items()) + ".", ""]
        frame = benchmark_frame(record)
        lines += [frame.to_markdown(index=False, floatfmt=",.4g") if not frame.empty else "(no rows)", ""]
        tables = record.get("tables") if isinstance(record.get("tables"), dict) else {}
        for name, rows in tables.items():  # a sweep or breakdown beside the main table
            extra = pd.DataFrame(rows) if isinstance(rows, list) else pd.DataFrame()
            lines += [f"{name.replace('_', ' ').capitalize()}:", "",
                      extra.to_markdown(index=False, floatfmt=",.4g") if not extra.empty else "(no rows)", ""]
        if isinstance(record.get("summary"), dict) and record["summary"]:
            lines += ["Summary: " + "; ".join(f"{k} = {_value(v)}" for k, v in record["summary"].items()) + ".", ""]
    return lines


def write_report(run_dir) -> Path:
    """Write ``<run_dir>/report.md`` from the run folder's sections and notebook log."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise WorkshopError(f"Run folder {run_dir} does not exist.", "run the main job first (see README).")
    problems: list[str] = []
    records = read_records(run_dir, problems)
    benchmarks = read_benchmarks(run_dir, problems)
    # Benchmarks are measurements too: they count for the header's environment and the CPU banner.
    measured = records + [{"kind": "benchmark", "name": f"benchmarks/{b['benchmark']}",
                           "environment": b.get("environment")} for b in benchmarks]
    sections = sorted((r for r in records if r.get("kind") == "section"),
                      key=lambda r: (r.get("order", 0), r.get("name", "")))
    lines = [f"# Workshop run report: {run_dir.name}", ""]
    env = _report_environment(measured)
    lines += ["## Environment", "", *(_environment_lines(env) if env else ["(no results recorded)"]), ""]
    lines += _device_banner(measured)
    if any((r.get("metrics") or {}).get("data_source") == "synthetic" for r in records):
        lines += ["> **Synthetic data**: no CIFAR-10 was found, so accuracies are on the synthetic stand-in.", ""]
    if problems:
        lines += ["> **Unreadable results, left out of this report:**", *(f"> - {p}" for p in problems), ""]
    log = run_dir / "notebooks.json"
    if log.exists():
        try:
            runs = json.loads(log.read_text())
            if not isinstance(runs, list) or not all(isinstance(r, dict) for r in runs):
                raise ValueError("not a list of notebook entries")
        except (OSError, UnicodeDecodeError, ValueError) as err:
            runs = []
            lines += [f"> **{log.name} is unreadable** ({err}): the notebooks' outcomes are not listed.", ""]
        if runs:
            lines += _notebook_lines(runs)
    if not sections and not benchmarks:
        lines += ["No notebook recorded a report section in this folder.", ""]
    for section in sections:
        lines += [f"## {section['title']}", ""]
        if section.get("text"):
            lines += [section["text"], ""]
        if section.get("table"):
            lines += [_markdown_table(section["table"]), ""]
        for figure in section.get("figures", []):
            lines += [f"![{Path(figure).stem}]({figure})", ""]
    if benchmarks:
        lines += _benchmark_lines(benchmarks)
    return write_atomically(run_dir / "report.md", lambda tmp: tmp.write_text("\n".join(lines)), "Report")


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(prog="python -m workshop_utils.report",
                           description="Write report.md for a run folder from its recorded results.")
    parser.add_argument("run_dir", help="a folder under runs/ written by the main job or a notebook")
    return parser


@exit_on_workshop_error
def main(argv=None) -> None:
    print(f"Report written to {write_report(build_parser().parse_args(argv).run_dir)}")


if __name__ == "__main__":
    main()
