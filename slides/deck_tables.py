"""Tables made for reading on a slide: chosen columns, human headers with units, numbers rounded to what matters.

A report section records every column a notebook computed, under the names the code uses
(``samples_per_s``, ``mfu``). A slide shows a few of them: ``TABLES`` names, per section, which columns in
which order, their headers and how to round them. A section that is not listed still reads well: its
headers are spelled out by ``human_header`` and its numbers rounded to three significant digits. A ratio
whose column names its spread (the ladder's, over several passes) is followed by its per-pass range,
"1.52 (1.48–1.57)". A column that is empty in every row (MFU on a CPU) is left out, and so is its note.
No table is ever split: it shows at most ``MAX_COLUMNS`` columns and ``MAX_ROWS`` rows, and says what it
left out.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Callable

from deck_labels import human, memory_stop_label

MAX_COLUMNS = 6
MAX_ROWS = 8


@dataclass(frozen=True)
class Column:
    """One column of a slide table; ``key`` may list alternatives, the first one the record has is shown."""

    key: str | tuple[str, ...]
    header: str
    fmt: str = "auto"  # see format_cell; "footnote": shown as small print under the table, not as a column
    note: str = ""  # small print under the table, shown only with the column
    spread: tuple[str, str] | None = None  # the keys of the value's run-to-run low and high, shown after it

    @property
    def keys(self) -> tuple[str, ...]:
        return (self.key,) if isinstance(self.key, str) else self.key


@dataclass(frozen=True)
class Table:
    columns: tuple[Column, ...]
    keep: Callable[[dict], bool] | None = None  # rows worth a slide; the rest stay in report.md
    note: str = ""
    max_rows: int = MAX_ROWS
    derive: Callable[[list[dict]], list[dict]] | None = None  # rows rewritten for the slide (new columns)


THROUGHPUT = Column("samples_per_s", "Throughput (samples/s)", "0")
STEP_MS = Column("step_ms_median", "Step time, median (ms)", "3g")
DATA_WAIT = Column("data_wait_fraction", "Waiting for data (%)", "pct1")
MFU = Column("mfu", "MFU (%)", "pct1", "MFU: achieved FLOP/s as a share of the device's published peak for the "
                                      "precision in use.")
PEAK_MEMORY = Column("peak_memory_mib", "Peak memory (MiB)", "0",
                     "Peak memory: what a run's training steps added above the memory in use before it started: the "
                     "allocator's peak on a GPU; on a CPU the process's resident memory, which also moves with what "
                     "ran before in the process.")
# the batch sweep counts one step's tensors on a CPU: resident memory there did not grow with the batch run to run
BATCH_MEMORY = Column("peak_memory_mib", "Peak memory (MiB)", "0",
                      "Peak memory: on a GPU what a run's training steps added above the memory in use before it "
                      "started (the allocator's peak); on a CPU one step's tensor memory above the model, its "
                      "optimizer state and the batch (the profiler's allocation records).")
STEP_MEMORY_NOTE = ("Step memory: the tensor memory one training step adds at its peak, above the model, its optimizer "
                    "state and the batch; the allocator's count on a GPU, the profiler's allocation records on a CPU: "
                    "the same measure for every row.")

def _one_baseline_per_column(rows: list[dict]) -> list[dict]:
    """The I/O section holds two experiments, each with its own baseline in one ratio column: the storage layouts
    (against small files) and the loader paths (against the PIL DataLoader, the rows without a file count). On a
    slide each baseline gets its own column."""
    out = []
    for row in rows:
        row = dict(row)
        # What the in-memory layouts hold (on a CPU the "device" is the CPU: tensors in host memory too).
        row["layout"] = {"memory": "arrays", "device": "tensors"}.get(row.get("layout"), row.get("layout"))
        if _is_empty(row.get("files")):
            row["vs_loader"], row["vs_small_files"] = row.get("vs_small_files"), None
        out.append(row)
    return out


BASELINE_METRICS = ("throughput", "step time median / p90", "waiting for data", "peak memory", "achieved", "MFU",
                    "final test accuracy", "processes x batch")

TABLES: dict[str, Table] = {
    "baseline": Table((Column("metric", "Measure", "text"), Column("value", "Value", "text"),
                       Column("unit", "Unit", "unit")),
                      keep=lambda row: row.get("metric") in BASELINE_METRICS),
    "ddp-scaling": Table((Column("mode", "Scaling", "text"), Column("world_size", "Processes", "int"),
                          Column("global_batch", "Global batch", "int"), THROUGHPUT,
                          Column("speedup", "Speed-up (×)", "2"), Column("efficiency", "Efficiency (%)", "pct0"))),
    "ddp-comm-model": Table((Column("model", "Link", "text"), Column("world_size", "Processes", "int"),
                             Column("all_reduce_ms", "All-reduce per step (ms)", "3g"),
                             Column("exposed_ms", "Left after backward (ms)", "3g"),
                             Column("efficiency_no_overlap", "Efficiency, no overlap (%)", "pct1"),
                             Column("efficiency_overlap", "Efficiency, overlapped (%)", "pct1"))),
    # Throughput stays in report.md: the speed-up says the same, and the accuracy gap needs its spread beside it.
    "precision-modes": Table((Column("model", "Model", "text"), Column("precision", "Precision", "text"),
                              Column("speed-up vs fp32", "Speed-up vs. fp32 (×)", "2"),
                              Column("step memory MiB", "Step memory (MiB)", "0", STEP_MEMORY_NOTE),
                              Column("acc vs fp32 (points)", "Accuracy vs. fp32 (points)", "1"),
                              Column("fp32 seed spread (points)", "fp32's own seed spread (points)", "1",
                                     "A gap no larger than fp32's seed spread (recorded over five seeds on two kinds "
                                     "of CPU; on a GPU, fp32 trained again with another seed) is noise, not an effect "
                                     "of the precision."),
                              Column("note", "Note", "footnote")),
                             derive=lambda rows: [{**row, "note": f"{row['precision']}, {row['note']}"}
                                                  if row.get("note") else row for row in rows]),
    "precision-numerics": Table((Column("gradients", "Gradients", "text"), Column("loss scale", "Loss scale", "text"),
                                 Column("flushed to zero %", "Become zero (%)", "3g"),
                                 Column("subnormal (imprecise) %", "Subnormal, imprecise (%)", "3g"),
                                 Column("overflowed to inf %", "Overflow to inf (%)", "3g"))),
    "profile": Table((Column("operator", "Operator", "short"), Column("calls", "Calls", "int"),
                      Column("self_gpu_ms", "Self GPU time (ms)", "3g"),
                      Column("self_cpu_ms", "Self CPU time (ms)", "3g"),
                      Column("self_share", "Share of self time (%)", "pct1"))),
    "dataloader": Table((Column("num_workers", "Workers", "int"), Column("pin_memory", "Pinned memory", "yesno"),
                         THROUGHPUT, DATA_WAIT, MFU,
                         Column("amdahl_max_speedup", "Most a faster loader can gain (×)", "2"))),
    "io": Table((Column("layout", "Layout", "text"), Column("files", "Files opened", "int"),
                 Column("mib_on_disk", "On disk (MiB)", "1"), Column("samples_per_s", "Images/s", "0"),
                 Column("vs_small_files", "vs. small files (×)", "2"),
                 Column("vs_loader", "vs. PIL loader (×)", "2")),
                derive=_one_baseline_per_column,
                note="Two experiments: the same images read from each storage layout, and two loader paths "
                     "feeding training; each ratio column has one baseline."),
    "batch_size": Table((Column("batch_size", "Batch size", "int"), Column("status", "Result", "status"),
                         THROUGHPUT, STEP_MS, BATCH_MEMORY, MFU)),
    "ladder": Table((Column("rung", "Rung", "text"), THROUGHPUT,
                     Column("vs_previous", "This rung's gain (×)", "2",
                            spread=("vs_previous_min", "vs_previous_max")),
                     Column("vs_baseline", "Against the baseline (×)", "2",
                            spread=("vs_baseline_min", "vs_baseline_max")),
                     Column("mfu_bf16_peak", "MFU vs. BF16 peak (%)", "pct1",
                            "MFU on every rung against one peak, the device's dense BF16 one, so switching "
                            "precision does not move the yardstick."),
                     Column("mfu", "MFU (%)", "pct1",
                            "MFU against the peak of each rung's own precision: the fp32 peak up to the BF16 rung, "
                            "the far higher bf16 peak from it on; the column changes yardstick at that rung."),
                     Column("note", "Note", "footnote"))),
    "gpt-ladder": Table((Column("rung", "Rung", "text"), Column("tokens_per_s", "Throughput (tokens/s)", "0"),
                         Column("vs_previous", "This rung's gain (×)", "2",
                                spread=("vs_previous_min", "vs_previous_max")),
                         Column("vs_baseline", "Against the baseline (×)", "2",
                                spread=("vs_baseline_min", "vs_baseline_max")),
                         PEAK_MEMORY, Column("note", "Note", "footnote"))),
    "ddp-gpt": Table((Column("run", "Run", "text"), Column("all_reduces_per_step", "All-reduces a step", "int"),
                      Column("step_ms_median", "Step time, median (ms)", "3g"),
                      Column("tokens_per_s", "Throughput (tokens/s)", "0"))),
    "ddp-overlap": Table((Column("bucket_cap_mb", "Bucket size (MiB)", "3g"), Column("buckets", "Buckets", "int"),
                          Column("communication_ms", "All-reduce alone (ms)", "3g"),
                          Column("exposed_ms", "Not hidden by backward (ms)", "3g",
                                 spread=("exposed_p25_ms", "exposed_p75_ms")),
                          Column("hidden_share", "Hidden (%)", "pct0"))),
    "precision-gpt": Table((Column("precision", "Precision", "text"), Column("tokens/s", "Throughput (tokens/s)", "0"),
                            Column("speed-up vs fp32", "Speed-up vs. fp32 (×)", "2"),
                            Column("step memory MiB", "Step memory (MiB)", "0", STEP_MEMORY_NOTE),
                            Column("test loss (nats/token)", "Test loss (nats/token)", "3g"))),
    "gpt-ladder-breakdown": Table((Column("rung", "Rung", "text"), Column("step_ms", "Step (ms)", "3g"),
                                   Column("data_ms", "Data (ms)", "3g"), Column("forward_ms", "Forward (ms)", "3g"),
                                   Column("backward_ms", "Backward (ms)", "3g"),
                                   Column("optimizer_ms", "Optimizer (ms)", "3g"))),
    "beyond-gpt-parallel": Table((Column("strategy", "Strategy", "text"),
                                  Column("total_mib", "Held per rank (MiB)", "2"),
                                  Column("of_unsharded", "Of the unsharded (×)", "2"),
                                  Column("largest_loss_gap", "Largest loss gap", "sci"),
                                  Column("weight_gap", "Weight gap", "sci"))),
    "slurm": Table((Column("job", "Job", "text"), Column("name", "Name", "text"), Column("state", "State", "text"),
                    Column("exit_code", "Exit code", "text"), Column("elapsed", "Elapsed (h:m:s)", "text"),
                    Column("restarts", "Requeues", "int"))),
    "ladder-breakdown": Table((Column("rung", "Rung", "text"), Column("step_ms", "Step (ms)", "3g"),
                               Column("data_ms", "Data (ms)", "3g"), Column("forward_ms", "Forward (ms)", "3g"),
                               Column("backward_ms", "Backward (ms)", "3g"),
                               Column("optimizer_ms", "Optimizer (ms)", "3g"))),
    "beyond-collectives": Table((Column("collective", "Collective", "text"),
                                 Column("size_bytes", "Size (MiB)", "mib_from_bytes"),
                                 Column("ms", "Measured (ms)", "3g"), Column("model_ms", "Ring model (ms)", "3g"),
                                 Column("measured_over_model", "Measured ÷ model", "2"),
                                 Column("gb_per_s", "Bandwidth (GB/s)", "2"))),
    "beyond-fsdp": Table((Column("strategy", "Strategy", "text"), Column("rank", "Rank", "int"),
                          Column("parameters_mib", "Parameters (MiB)", "1"),
                          Column("gradients_mib", "Gradients (MiB)", "1"),
                          Column("optimizer_mib", "Optimizer state (MiB)", "1"),
                          Column("total_mib", "Total (MiB)", "1"))),
    "beyond-tensor-parallel": Table((Column("split", "Split", "text"), Column("world_size", "Ranks", "int"),
                                     Column("max_abs_difference", "Largest difference", "sci"),
                                     Column("max_grad_difference", "Largest gradient difference", "sci"),
                                     Column("communicated_mib", "Communicated (MiB)", "3g"),
                                     Column("weights_per_rank", "Weights per rank", "text"))),
    "beyond-pipeline": Table((Column("microbatches", "Micro-batches", "int"),
                              Column("microbatch_size", "Micro-batch size", "int"),
                              Column("step_ms", "Step (ms)", "3g"),
                              Column("bubble_measured", "Idle share, measured (%)", "pct0"),
                              Column("bubble_formula", "Idle share, (p−1)/(m+p−1) (%)", "pct0"))),
    "beyond-recompute": Table((Column("model", "Model", "text"),
                               Column("activation_checkpointing", "Activation checkpointing", "yesno"),
                               Column("peak_memory_mib", "Step memory (MiB)", "0", STEP_MEMORY_NOTE),
                               Column("step_ms", "Step time (ms)", "3g"))),
    # the count of saves is left to the notebook: six columns do not fit beside the chart
    "beyond-checkpoint": Table((Column("mode", "Checkpoint", "text"),
                                Column("blocked_ms_per_save", "Blocked per save (ms)", "3g"),
                                Column("later_saves_blocked_ms", "Blocked, later saves (ms)", "3g"),
                                Column("background_write_ms", "Background write (ms)", "3g"),
                                Column("slowdown_s", "Slowdown (s)", "3g"))),
}

# Headers for columns of sections not listed above; the rest are spelled out by rule.
WORDS = {"samples_per_s": "Throughput (samples/s)", "mfu": "MFU (%)", "world_size": "Processes",
         "num_workers": "Workers", "pin_memory": "Pinned memory", "lr": "Learning rate",
         "step_ms_median": "Step time, median (ms)", "step_ms_p90": "Step time, 90th percentile (ms)",
         "tflops_per_device": "Achieved TFLOP/s per device", "gb_per_s": "Bandwidth (GB/s)"}
UNITS = {"ms": "ms", "s": "s", "us": "µs", "mib": "MiB", "gib": "GiB", "bytes": "bytes", "pct": "%",
         "fraction": "%", "gbps": "GB/s", "tflops": "TFLOP/s"}
ACRONYMS = {"cpu": "CPU", "gpu": "GPU", "mfu": "MFU", "ddp": "DDP", "fsdp": "FSDP", "lr": "learning rate",
            "io": "I/O", "vs": "vs."}


def human_header(key: str) -> str:
    """``self_cpu_ms`` -> "Self CPU (ms)", ``data_wait_fraction`` -> "Data wait (%)", "samples/s" unchanged."""
    if key in WORDS:
        return WORDS[key]
    words = [w for w in re.split(r"[_\s]+", str(key)) if w]
    if not words:
        return str(key)
    per_second = len(words) > 2 and words[-2:] == ["per", "s"]
    if per_second:
        words = words[:-2]
    unit = UNITS[words.pop().lower()] if len(words) > 1 and words[-1].lower() in UNITS else ""
    text = " ".join(ACRONYMS.get(w.lower(), w) for w in words)
    text = text[:1].upper() + text[1:] + ("/s" if per_second else "")
    return f"{text} ({unit})" if unit else text


def _is_empty(value) -> bool:
    return value is None or value == "" or (isinstance(value, float) and not math.isfinite(value))


def format_cell(value, fmt: str = "auto") -> str:
    """Text of one cell, rounded to what a reader compares: "–" for nothing measured."""
    if _is_empty(value):
        return "–"
    if fmt == "yesno" or isinstance(value, bool):
        return "yes" if value else "no"
    if fmt == "unit":
        return re.split(r",\s|\s\(", str(value))[0]
    if fmt == "status":
        return memory_stop_label(value) or str(value)
    if fmt == "short":  # a long operator name loses its leading namespaces ("autograd::engine::"), never its end
        text = str(value)
        while len(text) > 42 and re.search(r"::|: ", text):
            text = re.split(r"::|: ", text, maxsplit=1)[1]
        return text
    if isinstance(value, (list, tuple)):
        return " × ".join(str(v) for v in value)
    if not isinstance(value, (int, float)) or fmt == "text":
        return human(value)  # "all_reduce" -> "all-reduce", "2^8" -> "256": no code names on a slide
    number = float(value)
    if fmt == "int":
        return f"{number:,.0f}"
    if fmt == "mib_from_bytes":
        return f"{number / 2**20:,.3g}"
    if fmt.startswith("pct"):
        return f"{100 * number:,.{int(fmt[3:] or 1)}f}"
    if fmt.isdigit():
        return f"{number:,.{int(fmt)}f}"
    if fmt == "sci":
        return f"{number:.1e}"
    if fmt in ("3g", "auto"):
        if isinstance(value, int) or abs(number) >= 999.5:
            return f"{number:,.0f}"
        return f"{number:.3g}"
    return format(number, fmt)


def _cell(row: dict, column: Column, key: str) -> str:
    text = format_cell(row.get(key), column.fmt)
    if not column.spread or _is_empty(row.get(key)):
        return text
    low, high = (row.get(k) for k in column.spread)
    if _is_empty(low) or _is_empty(high):
        return text
    return f"{text} ({format_cell(low, column.fmt)}–{format_cell(high, column.fmt)})"


@dataclass
class Rendered:
    headers: list[str]
    rows: list[list[str]]
    numeric: list[bool]
    notes: list[str] = field(default_factory=list)
    left_out: str = ""
    shown_rows: list[dict] = field(default_factory=list)  # the records' rows the table shows, in its order


def curate(section: str, rows: list[dict], max_rows: int | None = None) -> Rendered:
    """The slide version of a section's table: its columns, headers, rounding and notes."""
    spec = TABLES.get(section)
    if spec is not None and spec.derive is not None:
        rows = spec.derive(rows)
    present = list(dict.fromkeys(k for row in rows for k in row))
    if spec is None:
        spec = Table(tuple(Column(k, human_header(k), "pct1" if k.endswith("_fraction") else "auto")
                           for k in present))
    chosen: list[tuple[Column, str]] = []
    for column in spec.columns:
        key = next((k for k in column.keys if k in present), None)
        if key is not None and not all(_is_empty(row.get(key)) for row in rows):
            chosen.append((column, key))
    kept = [row for row in rows if spec.keep is None or spec.keep(row)]
    limit = max_rows or spec.max_rows
    shown = kept[:limit]
    # A column of remarks on a few rows (why a rung did not run) reads better as small print than as a column.
    footnotes = [f"{format_cell(row.get(chosen[0][1]), chosen[0][0].fmt)}: {row[key]}"
                 for column, key in chosen if column.fmt == "footnote" for row in shown if not _is_empty(row.get(key))]
    chosen = [(column, key) for column, key in chosen if column.fmt != "footnote"]
    extra = len(chosen) - MAX_COLUMNS
    chosen = chosen[:MAX_COLUMNS]
    numeric = [all(isinstance(row.get(key), (int, float)) and not isinstance(row.get(key), bool)
                   for row in shown if not _is_empty(row.get(key))) and column.fmt not in ("text", "short", "status")
               for column, key in chosen]
    notes = [column.note for column, _ in chosen if column.note] + footnotes
    if spec.note:
        notes.append(spec.note)
    left = []
    if len(kept) > len(shown):
        left.append(f"first {len(shown)} of {len(kept)} rows")
    elif len(rows) > len(kept):
        left.append(f"{len(kept)} of {len(rows)} rows")
    if extra > 0:
        left.append(f"{extra} more column(s)")
    return Rendered([column.header for column, _ in chosen],
                    [[_cell(row, column, key) for column, key in chosen] for row in shown],
                    numeric, notes, "; ".join(left) + (": all of them in the run's report.md" if left else ""),
                    shown)
