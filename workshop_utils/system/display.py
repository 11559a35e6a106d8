"""What a notebook shows besides charts: every table, and the one-line verdicts of the checks.

**Tables.** ``show_table(frame)`` is the one way a notebook displays a table. It keeps the data and changes
only how they read:

* numbers rounded to what they mean: whole numbers as integers with thousands separators (``1,459``, not
  ``1459.0``); others to three significant figures (``155``, ``12.3``, ``0.0412``), with separators from 1,000
  up; scientific notation only below 0.001 or from 10¹² up (``5.96e-08``, ``3.40e+38``);
* headers in words with their units (``samples_per_s`` → "samples/s", ``step_ms_median`` → "step (ms,
  median)", ``peak_memory_mib`` → "peak memory (MiB)"), or as given in ``headers``;
* no index column: a meaningful index (``summary_table``'s metric names) becomes the first column;
* no column that says nothing: one empty in every row is dropped, and so is one with the same value in
  every row of a table of several rows (say it in ``caption`` instead), unless named in ``keep``;
* text never cut (pandas' ``max_colwidth`` does not apply).

In a notebook it renders as HTML through pandas' Styler; as text (a terminal, ``print``) it is the same
cells, aligned. ``Table.frame`` holds the shown columns with their values unrounded.

**Verdicts.** ``show_verdict(line)`` prints a check's ✓/✗/⚠/? line. Inside a notebook kernel it is the
most visible output of its cell, bold and coloured (green ✓, red ✗, amber ⚠, grey ? and …); the plain
text is kept beside it (``text/plain``), so a headless run, a test or ``nbval`` still reads the line.
"""

from __future__ import annotations

import html
import math
import numbers

import pandas as pd

from .errors import ipython_shell

__all__ = ["Table", "format_number", "readable_header", "show_environment", "show_table", "show_verdict"]

# Whole headers that read better spelled out than built by the rules below.
_HEADERS = {
    "samples_per_s": "samples/s",
    "tokens_per_s": "tokens/s",
    "gb_per_s": "GB/s",
    "data_wait_fraction": "waiting for data (share of step)",
    "test_acc_pct": "test accuracy (%)",
    "mfu": "MFU",
    "mfu_bf16_peak": "MFU (of the BF16 peak)",
    "mfu_own_precision_peak": "MFU (of its precision's peak)",
    "vs_previous": "× the rung below",
    "vs_baseline": "× the baseline",
    "vs_pil": "× the PIL DataLoader",
    "tflops_per_device": "TFLOP/s per device",
    "size_bytes": "size (bytes)",
    "num_workers": "workers",
    "pin_memory": "pinned memory",
    "world_size": "ranks",
    "warmup_s": "compile and warm-up (s)",
}
# Unit suffixes: `_<unit>` at the end of a name, or `_<unit>_<statistic>` (step_ms_median).
_UNITS = {"ms": "ms", "s": "s", "us": "µs", "mib": "MiB", "gib": "GiB", "mb": "MB", "gb": "GB", "pct": "%",
          "bytes": "bytes", "tflops": "TFLOP/s", "gbps": "GB/s"}
_STATISTICS = {"median", "mean", "p10", "p25", "p50", "p75", "p90", "p99", "min", "max", "std"}

# Styles of the verdict lines, by their first character.
_VERDICTS = {"✓": "#1a7f37", "✗": "#cf222e", "⚠": "#9a6700", "?": "#57606a", "…": "#57606a"}


def readable_header(name) -> str:
    """A column name in words, its unit in brackets: ``step_ms_median`` → "step (ms, median)"."""
    text = str(name)
    if text in _HEADERS:
        return _HEADERS[text]
    if " " in text or "/" in text or "_" not in text:  # already written for a reader
        return text
    words = text.split("_")
    if words[-1] == "per" or (len(words) >= 3 and words[-2] == "per" and words[-1] == "s"):
        return " ".join(words[:-2]) + "/s"
    for i, word in enumerate(words[1:-2], start=1):  # blocked_ms_per_save -> "blocked (ms per save)"
        if word in _UNITS and words[i + 1] == "per":
            return " ".join(words[:i]) + f" ({_UNITS[word]} per {' '.join(words[i + 2:])})"
    statistic = words.pop() if len(words) >= 3 and words[-1] in _STATISTICS and words[-2] in _UNITS else None
    unit = _UNITS[words.pop()] if len(words) >= 2 and words[-1] in _UNITS else None
    brackets = ", ".join(part for part in (unit, statistic) if part)
    return " ".join(words) + (f" ({brackets})" if brackets else "")


def _is_missing(value) -> bool:
    if value is None:
        return True
    if isinstance(value, float) and math.isnan(value):
        return True
    try:
        return bool(pd.isna(value)) if not isinstance(value, (list, tuple, dict)) else False
    except (TypeError, ValueError):
        return False


def format_number(value, whole: bool = False) -> str:
    """One number as a reader wants it: integers with separators, others to three significant figures."""
    if isinstance(value, bool):
        return "yes" if value else "no"
    if _is_missing(value):
        return "—"
    number = float(value)
    if math.isinf(number):
        return "∞" if number > 0 else "−∞"
    if whole or (number == int(number) and abs(number) < 1e12):
        return f"{number:,.0f}"
    size = abs(number)
    if size >= 1e12 or size < 1e-3:
        return f"{number:.2e}"
    if size >= 100:
        return f"{number:,.0f}"
    decimals = 2 - math.floor(math.log10(size))  # three significant figures
    text = f"{number:.{decimals}f}"
    return text.rstrip("0").rstrip(".") if "." in text else text


def _whole_column(values: pd.Series) -> bool:
    present = [v for v in values if not _is_missing(v)]
    return bool(present) and all(isinstance(v, numbers.Number) and not isinstance(v, bool)
                                 and math.isfinite(float(v)) and abs(float(v)) < 1e12
                                 and float(v) == int(float(v)) for v in present)


def _cell_text(value, whole: bool, style: str | None) -> str:
    if style is not None and not _is_missing(value):
        return style.format(value)
    if isinstance(value, numbers.Number):
        return format_number(value, whole)
    if _is_missing(value):
        return "—"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_cell_text(v, False, None) for v in value) + "]"
    return str(value)


def _says_nothing(values: pd.Series) -> bool:
    return all(_is_missing(v) or (isinstance(v, str) and not v.strip()) for v in values)


def _constant(values: pd.Series) -> bool:
    shown = {repr(v) if not _is_missing(v) else "—" for v in values}
    return len(values) > 1 and len(shown) == 1


class Table:
    """A table as a reader sees it: HTML in a notebook (pandas' Styler), aligned text elsewhere."""

    def __init__(self, frame: pd.DataFrame, text: pd.DataFrame, caption: str | None = None):
        self.frame = frame  # the shown columns, readable headers, unrounded values
        self.text = text  # the same cells as the strings shown
        self.caption = caption
        self.numeric = [c for c in frame.columns
                        if all(_is_missing(v) or isinstance(v, numbers.Number) for v in frame[c])]

    @property
    def columns(self) -> list[str]:
        return list(self.text.columns)

    def styler(self):
        styler = self.text.style.hide(axis="index").set_uuid("wu").set_table_styles(
            [{"selector": "td", "props": "text-align: left; white-space: normal;"},
             {"selector": "th", "props": "text-align: left;"}])
        if self.numeric:  # numbers right-aligned, so that their digits line up
            styler = styler.set_properties(subset=self.numeric, **{"text-align": "right"})
        if self.caption:
            styler = styler.set_caption(self.caption)
        return styler

    def _repr_html_(self) -> str:
        return self.styler().to_html()

    def __str__(self) -> str:
        with pd.option_context("display.max_colwidth", None, "display.width", 10_000,
                               "display.max_columns", None, "display.max_rows", None):
            body = self.text.to_string(index=False)
        return (self.caption + "\n" + body) if self.caption else body

    __repr__ = __str__

    def __len__(self) -> int:
        return len(self.text)


def show_table(frame, *, headers: dict | None = None, columns=None, keep=(), formats: dict | None = None,
               caption: str | None = None) -> Table:
    """``frame`` as a table people can read (see the module's docstring); the last expression of a cell.

    ``columns`` picks and orders the columns shown (by their names in ``frame``); ``headers`` names some
    columns yourself; ``formats`` gives a column a format string (``"{:.1%}"``); ``keep`` names columns kept
    even when empty or constant; ``caption`` is a line above the table (say there what a dropped constant was).
    """
    if isinstance(frame, pd.Series):
        frame = frame.to_frame()
    if not isinstance(frame, pd.DataFrame):
        frame = pd.DataFrame(frame)
    data = frame.copy()
    if not isinstance(data.index, pd.RangeIndex) or data.index.name is not None:
        names = [n if n is not None else ("" if data.index.nlevels == 1 else f"level {i}")
                 for i, n in enumerate(data.index.names)]
        data.index = data.index.set_names(names)
        data = data.reset_index()
    data = data.reset_index(drop=True)
    if columns is not None:
        data = data[list(columns)]
    keep = set(keep)
    dropped = [c for c in data.columns if c not in keep and (_says_nothing(data[c]) or _constant(data[c]))]
    data = data.drop(columns=dropped)
    formats = dict(formats or {})
    text = pd.DataFrame({
        column: [_cell_text(v, _whole_column(data[column]), formats.get(column)) for v in data[column]]
        for column in data.columns
    }, index=data.index)
    names = {c: (headers or {}).get(c, readable_header(c)) for c in data.columns}
    return Table(data.rename(columns=names), text.rename(columns=names), caption)


# The rows of wu.environment_table that name GPU libraries: what PyTorch was built against, meaningless (and
# misleading beside "device: cpu") on a machine without a GPU.
_GPU_ONLY_ROWS = ("cuda", "cudnn", "nccl", "driver", "gpu_count")


def show_environment(env: dict | None = None) -> Table:
    """``environment_table(env)`` through ``show_table``: without the GPU libraries' rows where there is no GPU."""
    from .hardware import environment, environment_table

    env = env or environment()
    frame = environment_table(env)
    if not env.get("gpus"):
        frame = frame.drop(index=[row for row in _GPU_ONLY_ROWS if row in frame.index])
    frame = frame.rename_axis("").reset_index().rename(columns={"": "item"})
    return show_table(frame, keep=("item", "value"))


def _in_notebook_kernel() -> bool:
    return getattr(ipython_shell(), "kernel", None) is not None


class _Verdict:
    def __init__(self, line: str):
        self.line = line

    def _repr_html_(self) -> str:
        colour = _VERDICTS.get(self.line[:1], "inherit")
        return (f'<p style="font-weight: bold; font-size: 1.1em; color: {colour}; margin: 0.3em 0;">'
                f"{html.escape(self.line)}</p>")

    def __repr__(self) -> str:
        return self.line


def show_verdict(line: str) -> None:
    """A check's one line (✓, ✗, ⚠, ?, …): bold and coloured in a notebook, plain text anywhere else."""
    if _in_notebook_kernel():
        from IPython.display import display

        display(_Verdict(line))
    else:
        print(line, flush=True)


def verdict_html(line: str) -> str:
    """The HTML a notebook shows for ``line`` (for tests)."""
    return _Verdict(line)._repr_html_()

