"""What the kit measured on GPUs, read from ``results/reference/gpu/``: the one reader the notebooks, the cluster
prediction, the slides and the instructor guide use, so that each shows a GPU figure with the GPU and the date it
was measured on ("on one H100 80GB HBM3, 2026-11-26: ..."), or says that nothing was measured.

Three kinds of record live there, each with its environment (GPU, driver, CUDA, PyTorch, date):

* the GPU check's (``gpu_check-*.json``): a verdict line per path with the few numbers it measured. SimpleCNN's
  samples/s per precision (``precision-modes``) and per loader (``device-loaders``) are read from those lines, in
  the check's own words (tests/test_gpu_records.py runs the paths and reads their lines back);
* benchmark files (``gpt_throughput-*.json``, ``gpt_mfu/``): GPT-2 small's tokens/s and MFU, one run each;
* the GPU run's folders (``gpu_run-*/``): the training records each notebook wrote at its gpu profile
  (``results/<name>.json``) and each notebook's seconds.

Nothing here is typed by hand: a figure is what a file holds, and its sentence names the file's GPU and date.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path

GPU_RECORDS = Path(__file__).resolve().parents[2] / "results" / "reference" / "gpu"
# The GPU check's SimpleCNN runs before its precision-modes line said their batch (gpu_check.context.Context.config).
CHECK_BATCH = 128
_PRECISION = re.compile(r"\b(fp32|tf32|fp16|bf16) loss [-\d.naif]+, ([\d,]+) samples/s")
_LOADER = re.compile(r"\b(device|torch)(?: \(2 workers, pinned\))? ([\d,]+) samples/s")
_STEPS = re.compile(r"(\d+) steps each")
_BATCH = re.compile(r"batch (\d+)")


@dataclass(frozen=True)
class GpuFigure:
    """One number measured on a GPU, with what ran, where and when."""

    value: float
    unit: str  # "samples/s", "tokens/s", "MFU" (a fraction), "s"
    what: str  # what ran, in words
    device_name: str
    date: str  # YYYY-MM-DD
    source: str  # the file, relative to the repository
    config: dict = field(default_factory=dict, compare=False)  # model, precision, batch_size, loader, ... where known

    @property
    def where(self) -> str:
        return f"on one {short_gpu_name(self.device_name)}, {self.date}"


def short_gpu_name(name: str) -> str:
    """``NVIDIA H100 80GB HBM3`` -> ``H100 80GB HBM3``: the GPU as a sentence names it."""
    return re.sub(r"^NVIDIA\s+", "", str(name or "GPU")).strip() or "GPU"


def _relative(path: Path, folder: Path) -> str:
    try:
        return str(path.relative_to(folder.parents[2]))
    except ValueError:
        return str(path)


def _records(folder: Path | None):
    folder = Path(folder) if folder is not None else GPU_RECORDS
    for path in sorted(folder.rglob("*.json")) if folder.is_dir() else []:
        try:
            record = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if isinstance(record, dict) and isinstance(record.get("environment"), dict):
            yield path, record, folder


def _date(record: dict) -> str:
    env = record["environment"]
    return str(env.get("date") or record.get("created") or "")[:10]


def check_figures(folder: Path | None = None) -> list[GpuFigure]:
    """SimpleCNN's samples/s per precision and per loader, from every GPU check's verdict lines."""
    found = []
    for path, record, root in _records(folder):
        if record.get("kind") not in ("gpu_check", "gpu_run"):
            continue
        env, source = record["environment"], _relative(path, root)
        for verdict in record.get("paths", []):
            detail = str(verdict.get("detail", ""))
            if verdict.get("status") != "ok":
                continue
            batch = int((_BATCH.search(detail) or [None, CHECK_BATCH])[1])
            if verdict.get("name") == "precision-modes":
                steps = int((_STEPS.search(detail) or [None, 0])[1]) or None
                for precision, rate in _PRECISION.findall(detail):
                    config = {"model": "simplecnn", "precision": precision, "batch_size": batch, "loader": "torch",
                              "num_workers": 0, "steps": steps}
                    found.append(GpuFigure(float(rate.replace(",", "")), "samples/s",
                                           f"SimpleCNN, {precision}, batch {batch}, the DataLoader without workers, "
                                           f"{steps} steps (the GPU check)", env["device_name"], _date(record), source,
                                           config))
            elif verdict.get("name") == "device-loaders":
                for loader, rate in _LOADER.findall(detail):
                    workers = 2 if loader == "torch" else 0
                    config = {"model": "simplecnn", "precision": "fp32", "batch_size": batch, "loader": loader,
                              "num_workers": workers}
                    words = "the data on the GPU" if loader == "device" else "the DataLoader, 2 workers, pinned"
                    found.append(GpuFigure(float(rate.replace(",", "")), "samples/s",
                                           f"SimpleCNN, fp32, batch {batch}, {words} (the GPU check)",
                                           env["device_name"], _date(record), source, config))
    return found


def gpt_throughput_figures(folder: Path | None = None) -> list[GpuFigure]:
    """GPT-2 small's MFU in every run of benchmarks/gpt_throughput.py kept there (tokens/s in its config)."""
    found = []
    for path, record, root in _records(folder):
        if record.get("benchmark") != "gpt_throughput" or record.get("profile") != "gpu":
            continue
        summary, settings = record.get("summary", {}), record.get("settings", {})
        for mode in settings.get("modes", []):
            mfu, rate = summary.get(f"{mode}_mfu"), summary.get(f"{mode}_tokens_per_s")
            if mfu is None or rate is None:
                continue
            config = {"model": "gpt", "gpt_size": settings.get("gpt_size"), "precision": mode,
                      "batch_size": settings.get("batch_sequences"), "sequence_length": settings.get("sequence_tokens"),
                      "compile": settings.get("compile"), "tokens_per_s": rate,
                      "measured_after": record.get("measured_after")}
            found.append(GpuFigure(float(mfu), "MFU", f"GPT-2 small, {mode}, {settings.get('batch_sequences')} x "
                                   f"{settings.get('sequence_tokens')} tokens a step"
                                   + (", compiled" if settings.get("compile") else ""),
                                   record["environment"]["device_name"], _date(record), _relative(path, root), config))
    return found


def gpu_run_records(folder: Path | None = None) -> list[tuple[Path, dict]]:
    """Every GPU run kept (``gpu_run-*/gpu_run.json``), oldest first."""
    return sorted(((path, record) for path, record, _ in _records(folder) if record.get("kind") == "gpu_run"
                   and path.name == "gpu_run.json"), key=lambda item: str(item[1].get("created", "")))


def gpu_training_record(name: str, folder: Path | None = None) -> dict | None:
    """The newest GPU run's training record ``name`` (a notebook's ``results/<name>.json`` at its gpu profile)."""
    for path, record in reversed(gpu_run_records(folder)):
        if record.get("profile") != "gpu":
            continue
        candidate = path.parent / "results" / f"{name}.json"
        try:
            found = json.loads(candidate.read_text())
        except (OSError, ValueError):
            continue
        if isinstance(found, dict) and "environment" in found:
            return found
    return None


def notebook_seconds(folder: Path | None = None) -> dict[str, GpuFigure]:
    """Each notebook's measured seconds at its gpu profile, from the newest GPU run that ran it end to end."""
    found = {}
    for path, record in gpu_run_records(folder):
        if record.get("profile") != "gpu":
            continue
        for entry in record.get("notebooks", []):
            if entry.get("status") == "ok" and entry.get("seconds"):
                found[str(entry["notebook"])[:2]] = GpuFigure(
                    float(entry["seconds"]), "s", f"notebook {entry['notebook']}, gpu profile, end to end",
                    record["environment"]["device_name"], _date(record), _relative(path, (folder or GPU_RECORDS)))
    return found


def best(figures: list[GpuFigure], **config) -> GpuFigure | None:
    """The newest of ``figures`` whose config holds every ``config`` item."""
    chosen = [f for f in figures if all(f.config.get(k) == v for k, v in config.items())]
    return max(chosen, key=lambda f: f.date) if chosen else None


def gpt_mfu_sentence(folder: Path | None = None) -> str:
    """GPT-2 small's measured MFU across the kept runs, with the GPU and date; or that none was measured."""
    runs = gpt_throughput_figures(folder)
    if not runs:
        return "GPT-2 small's MFU has not been measured on a GPU in this kit yet (results/reference/gpu/ holds no run)"
    top = max(runs, key=lambda f: f.value)
    low = min(runs, key=lambda f: f.value)
    places = sorted({f.where for f in runs})
    spread = f", {low.value:.1%} to {top.value:.1%} in {len(runs)} runs" if len(runs) > 1 else ""
    if spread and low.config.get("measured_after"):  # a low run slowed by what ran before it says so
        spread += f"; the {low.value:.1%} was measured {low.config['measured_after']}"
    return (f"{'; '.join(places)}: GPT-2 small, compiled in bf16, reached {top.value:.1%} MFU at best "
            f"({top.config.get('batch_size')} x {top.config.get('sequence_length')} tokens a step, "
            f"{top.config['tokens_per_s']:,.0f} tokens/s){spread} (results/reference/gpu/)")


def precision_sentence(model: str, mode: str, folder: Path | None = None) -> str:
    """What a GPU measured for ``mode`` against fp32 on ``model``: the GPU run's notebook 03 records where there are
    some, else the GPU check's SimpleCNN runs, else that nothing was measured."""
    def record(precision):  # notebook 03 names its runs <model>-<mode>, with -cl for channels_last
        return next(filter(None, (gpu_training_record(f"{model}-{precision}{tail}", folder) for tail in ("-cl", ""))),
                    None)

    fast, fp32 = record(mode), record("fp32")
    if fast and fp32:
        rate = "tokens_per_s" if model == "gpt" else "samples_per_s"
        env = fast["environment"]
        ratio = fast["metrics"][rate] / fp32["metrics"][rate]
        return (f"on one {short_gpu_name(env['device_name'])}, {str(env.get('date'))[:10]}, notebook 03's gpu profile "
                f"ran {model} in {mode} at {ratio:.2f}x fp32's {rate.replace('_per_s', '')}/s (results/reference/gpu/)")
    figures = check_figures(folder)
    cnn = {p: best(figures, model="simplecnn", precision=p, loader="torch") for p in (mode, "fp32")}
    if model == "simplecnn" and cnn[mode] and cnn["fp32"]:
        on_gpu = best(figures, model="simplecnn", loader="device")
        return (f"{cnn[mode].where}, the GPU check's SimpleCNN ({cnn[mode].config['batch_size']} images a step, "
                f"{cnn[mode].config['steps']} steps) ran {mode} at {cnn[mode].value:,.0f} samples/s against fp32's "
                f"{cnn['fp32'].value:,.0f} ({cnn[mode].value / cnn['fp32'].value:.2f}x), with the DataLoader setting "
                f"the pace" + (f" (fp32 with the data on the GPU: {on_gpu.value:,.0f} samples/s)" if on_gpu else "")
                + " (results/reference/gpu/)")
    return (f"no GPU run of {model} in {mode} is recorded in this kit yet (results/reference/gpu/), so there is no "
            f"measured GPU figure for it to show here")


def simplecnn_sentence(folder: Path | None = None) -> str:
    """SimpleCNN's fp32 throughput on a GPU per loader, from the newest GPU check; or that none was measured."""
    figures = check_figures(folder)
    loaders = [(best(figures, model="simplecnn", precision="fp32", loader=loader, num_workers=workers), words)
               for loader, workers, words in (("torch", 0, "with the DataLoader and no workers"),
                                              ("torch", 2, "with 2 workers"), ("device", 0, "with the data on the GPU"))]
    found = [(figure, words) for figure, words in loaders if figure is not None]
    if not found:
        return "SimpleCNN has not been measured on a GPU in this kit yet (results/reference/gpu/ holds no GPU check)"
    first = found[0][0]
    return (f"{first.where}, the GPU check's SimpleCNN in fp32, {first.config['batch_size']} images a step: "
            + ", ".join(f"{figure.value:,.0f} samples/s {words}" for figure, words in found)
            + " (results/reference/gpu/)")
