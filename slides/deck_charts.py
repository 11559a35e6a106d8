"""Charts drawn for the projector: at the size they take on a 1280x720 slide, from the recorded numbers.

The notebooks' PNGs are made for a notebook page; shrunk onto a slide their ticks and legends came out at 6 to
9 px. The decks draw their own charts instead, from the same result records the tables read, at exactly the
pixel size of their place on the slide, so that nothing is scaled: a figure is ``width / 72`` by ``height / 72``
inches and every font size in points is the size in CSS pixels at 1280x720 (``font_px``). The smallest text is
``MIN_FONT_PX``; legends sit outside the axes, never on the data; labels are words with units (``deck_labels``).

Each chart is a function registered under a figure name with ``@chart(name, *records)``: it gets the records it
names (``ChartData``) and returns the figure and what its numbers are (``Drawn.what``: measured where, predicted
from what, or estimated), which the slide shows under it. Charts are written as SVG (text as paths, no date,
fixed ids): the same records give the same bytes. A figure name with no chart here, or whose records are
missing, is still shown as the run's PNG (``deck_render``).
"""

from __future__ import annotations

import hashlib
import io
import json
from dataclasses import dataclass, field
from typing import Callable

import matplotlib
from matplotlib.figure import Figure
from matplotlib.ticker import FixedLocator, FuncFormatter, MaxNLocator

from deck_labels import device_words, fmt_bytes, fmt_sig, table_rows

SLIDE = (1280, 720)  # Marp's slide, in CSS pixels
CONTENT_WIDTH = 1152  # the slide less the theme's 64 px padding on either side
SIDE_WIDTH = 590  # layout="side": the figure column is (1152 - 20) * 1.15 / 2.15 = 605 px wide; a margin kept
MIN_FONT_PX = 18  # the smallest text of a chart on the slide, for a projector at the back of a room
POINTS_PER_INCH = 72  # figures are laid out at 72 dpi, so one point of font size is one pixel on the slide

# Okabe-Ito colours (workshop_utils.system.plotstyle.PALETTE): distinct for colour-blind readers and in greyscale.
PALETTE = ("#0072B2", "#E69F00", "#009E73", "#D55E00", "#CC79A7", "#56B4E9", "#000000", "#999999")

STYLE = {
    "font.family": "DejaVu Sans",
    "font.size": MIN_FONT_PX,
    "axes.labelsize": MIN_FONT_PX,
    "axes.titlesize": MIN_FONT_PX,
    "xtick.labelsize": MIN_FONT_PX,
    "ytick.labelsize": MIN_FONT_PX,
    "legend.fontsize": MIN_FONT_PX,
    "legend.title_fontsize": MIN_FONT_PX,
    "figure.titlesize": MIN_FONT_PX,
    "legend.frameon": False,
    "legend.handlelength": 1.6,
    "legend.columnspacing": 1.2,
    "legend.borderaxespad": 0.2,
    "axes.grid": True,
    "grid.alpha": 0.3,
    "axes.spines.top": False,
    "axes.spines.right": False,
    "axes.labelpad": 4,
    "axes.formatter.useoffset": False,
    "axes.formatter.limits": (-9, 9),  # never "1e6" or "0.0e+00" on an axis
    "axes.prop_cycle": matplotlib.cycler(color=list(PALETTE)),
    "lines.linewidth": 2.5,
    "lines.markersize": 9,
    "xtick.major.size": 5,
    "ytick.major.size": 5,
    "figure.dpi": POINTS_PER_INCH,
    "figure.constrained_layout.h_pad": 0.06,
    "figure.constrained_layout.w_pad": 0.06,
    "svg.fonttype": "path",  # text drawn as outlines: the slide needs no font, and looks the same everywhere
    "svg.hashsalt": "workshop-slides",  # fixed ids inside the SVG: the same numbers give the same bytes
}


@dataclass
class ChartData:
    """What a chart function gets: the records it named, where they were measured, and its size on the slide."""

    records: dict[str, dict]
    width: int
    height: int
    environments: dict[str, dict] = field(default_factory=dict)  # per record: its own, else its folder's

    def environment(self, name: str | None = None) -> dict:
        name = name or next(iter(self.records), None)
        record = self.records.get(name) or {}
        return record.get("environment") or self.environments.get(name) or {}

    def device(self, name: str | None = None) -> str:
        """The device a record was measured on, in words: "x86_64 (cpu, 2 cores)"."""
        return device_words(self.environment(name))

    def figure(self, ncols: int = 1, nrows: int = 1, **kwargs) -> tuple[Figure, object]:
        """A figure of exactly the chart's size on the slide, laid out so that nothing overlaps."""
        fig = Figure(figsize=(self.width / POINTS_PER_INCH, self.height / POINTS_PER_INCH), dpi=POINTS_PER_INCH,
                     layout="constrained")
        axes = fig.subplots(nrows, ncols, squeeze=True, **kwargs)
        return fig, axes


@dataclass
class Drawn:
    """A chart and what its numbers are: "measured on ...", "predicted from ...", "estimated from ..."."""

    figure: Figure
    what: str


@dataclass(frozen=True)
class Chart:
    name: str
    needs: tuple[str, ...]  # the records it draws, by name; the first is the one it is about
    draw: Callable[[ChartData], Drawn | None]  # None: the records lack what it draws; the run's PNG is shown
    optional: tuple[str, ...] = ()  # records it adds when a folder holds them
    throughput: bool = False  # it shows the samples/s (or tokens/s) of its section's rows, one bar or point each


CHARTS: dict[str, Chart] = {}


def chart(name: str, *needs: str, optional: tuple[str, ...] = (), throughput: bool = False):
    """Register a chart function under a figure name, with the records it reads."""
    def register(function: Callable[[ChartData], Drawn]):
        CHARTS[name] = Chart(name, needs, function, optional, throughput)
        return function
    return register


_DRAWN: dict[str, Drawn] = {}  # charts drawn in this process, by what they were drawn from (a build draws each once)


def draw(name: str, records: dict[str, dict], width: int, height: int,
         environments: dict[str, dict] | None = None) -> Drawn | None:
    """The chart ``name`` drawn from ``records`` at ``width`` x ``height`` CSS pixels, in the slides' style;
    ``environments`` gives, per record, where it was measured when the record itself does not say. The same
    records at the same size give the same chart, drawn once per process."""
    key = json.dumps([name, width, height, records, environments or {}], sort_keys=True, default=str)
    digest = hashlib.sha256(key.encode()).hexdigest()
    if digest not in _DRAWN:
        with matplotlib.rc_context(STYLE):
            drawn = CHARTS[name].draw(ChartData(records, width, height, environments or {}))
        if drawn is None:
            return None
        _DRAWN[digest] = drawn
        while len(_DRAWN) > 64:
            _DRAWN.pop(next(iter(_DRAWN)))
    return _DRAWN[digest]


def to_svg(fig: Figure) -> bytes:
    """The chart as SVG bytes: text as outlines, no timestamp, fixed ids."""
    cached = getattr(fig, "_slide_svg", None)
    if cached is None:
        buffer = io.BytesIO()
        with matplotlib.rc_context(STYLE):
            fig.savefig(buffer, format="svg", metadata={"Date": None, "Creator": None})
        cached = fig._slide_svg = buffer.getvalue()
    return cached


# ----------------------------------------------------------------------------------------------- helpers


def legend_above(fig: Figure, ax=None, ncols: int | None = None, handles=None, labels=None) -> None:
    """One legend for the figure, above its axes (outside them): it never covers data."""
    if handles is None:
        handles, labels = (ax or fig.axes[0]).get_legend_handles_labels()
    if handles:
        fig.legend(handles, labels, loc="outside upper center", ncols=ncols or len(handles))


def legend_over(ax, ncols: int | None = None) -> None:
    """A legend for one of several axes, just above it (outside it): it names that panel's lines only."""
    handles, labels = ax.get_legend_handles_labels()
    if handles:
        ax.legend(handles, labels, loc="lower left", bbox_to_anchor=(0, 1.02), ncols=ncols or len(handles),
                  borderaxespad=0)


def legend_right(fig: Figure, ax=None, handles=None, labels=None) -> None:
    """One legend for the figure, to the right of its axes (outside them), one entry a line."""
    if handles is None:
        handles, labels = (ax or fig.axes[0]).get_legend_handles_labels()
    if handles:
        fig.legend(handles, labels, loc="outside right upper")


def thousands(axis) -> None:
    """Tick labels with thousands separators and at most five ticks: "12,000"."""
    axis.set_major_locator(MaxNLocator(nbins=4, min_n_ticks=3))
    axis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:,.0f}" if abs(v) >= 10 or v == int(v) else f"{v:g}"))


def plain_log(axis, values, unit: str = "") -> None:
    """A log axis with ticks at 1-3-10 steps written as plain numbers ("0.3", "10"), never as powers of ten."""
    low, high = min(values), max(values)
    ticks = [m * 10.0 ** e for e in range(-4, 8) for m in (1, 3) if low / 3 <= m * 10.0 ** e <= high * 3]
    axis.set_major_locator(FixedLocator(ticks))
    axis.set_minor_locator(FixedLocator([]))
    axis.set_major_formatter(FuncFormatter(lambda v, _: f"{fmt_sig(v, 2)}{unit}"))


def bytes_axis(axis, sizes) -> None:
    """A log axis of message sizes in bytes, ticked at every other measured size: "4 KiB", "64 KiB", "1 MiB"."""
    sizes = sorted(set(sizes))
    axis.set_major_locator(FixedLocator(sizes[::2] if len(sizes) > 4 else sizes))
    axis.set_minor_locator(FixedLocator([]))
    axis.set_major_formatter(FuncFormatter(lambda v, _: fmt_bytes(v)))


def integer_ticks(axis, values) -> None:
    axis.set_major_locator(FixedLocator(sorted(set(values))))
    axis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:,.0f}"))


def label_bars(ax, bars, texts, horizontal: bool = False) -> None:
    """A value written at the end of each bar (outside it), in the chart's smallest readable size."""
    for bar, text in zip(bars, texts):
        if text is None:
            continue
        if horizontal:
            x, y = bar.get_x() + bar.get_width(), bar.get_y() + bar.get_height() / 2
            ax.annotate(text, (x, y), xytext=(6, 0), textcoords="offset points", va="center", ha="left")
        else:
            x, y = bar.get_x() + bar.get_width() / 2, bar.get_y() + bar.get_height()
            ax.annotate(text, (x, y), xytext=(0, 4), textcoords="offset points", ha="center", va="bottom")


def headroom(ax, factor: float = 1.25, horizontal: bool = False) -> None:
    """Room beyond the longest bar for the label written at its end."""
    if horizontal:
        low, high = ax.get_xlim()
        ax.set_xlim(low, high * factor)
    else:
        low, high = ax.get_ylim()
        ax.set_ylim(low, high * factor)


def rows_of(record: dict) -> list[dict]:
    return table_rows(record)


def number(value) -> float | None:
    """A finite number, or None (a missing or empty cell)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    value = float(value)
    return value if value == value and abs(value) != float("inf") else None


# ----------------------------------------------------------------------------------------------- checks


@dataclass
class TextOnSlide:
    text: str
    font_px: float  # its size on the slide at 1280x720
    box: tuple[float, float, float, float]  # x0, y0, x1, y1 in the figure's pixels
    role: str  # "tick", "label", "legend", "annotation", "title"


@dataclass
class Inspection:
    """What a chart shows on the slide: every text with its size, the legends' and the axes' boxes."""

    texts: list[TextOnSlide] = field(default_factory=list)
    legends: list[tuple[float, float, float, float]] = field(default_factory=list)
    axes: list[tuple[float, float, float, float]] = field(default_factory=list)
    size: tuple[float, float] = (0, 0)

    @property
    def min_font_px(self) -> float:
        return min((t.font_px for t in self.texts), default=float("inf"))


def _box(extent) -> tuple[float, float, float, float]:
    return (extent.x0, extent.y0, extent.x1, extent.y1)


def _ticks_in_view(axis):
    low, high = sorted(axis.get_view_interval())
    span = (high - low) * 1e-9
    for tick in [*axis.get_major_ticks(), *axis.get_minor_ticks()]:
        if low - span <= tick.get_loc() <= high + span:
            for label in (tick.label1, tick.label2):
                if label.get_visible() and label.get_text():
                    yield label


def inspect(fig: Figure, placed_width_px: float) -> Inspection:
    """Every text the chart draws, sized as it appears on the slide when the figure is ``placed_width_px`` wide.

    A font of ``s`` points in a figure ``w`` inches wide, shown ``placed_width_px`` pixels wide, is
    ``s * placed_width_px / (w * 72)`` pixels tall on the slide (at 1280x720, one CSS pixel per pixel).
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    with matplotlib.rc_context(STYLE):
        canvas = FigureCanvasAgg(fig)
        canvas.draw()
        renderer = canvas.get_renderer()
        scale = placed_width_px / (fig.get_figwidth() * POINTS_PER_INCH)
        found = Inspection(size=(fig.bbox.width, fig.bbox.height))

        def add(text, role):
            if text is not None and text.get_visible() and text.get_text().strip():
                found.texts.append(TextOnSlide(text.get_text(), text.get_fontsize() * scale,
                                               _box(text.get_window_extent(renderer)), role))

        for ax in fig.axes:
            found.axes.append(_box(ax.get_window_extent(renderer)))
            for axis in (ax.xaxis, ax.yaxis):
                for label in _ticks_in_view(axis):
                    add(label, "tick")
                add(axis.label, "label")
                add(axis.get_offset_text(), "tick")  # "1e6" beside an axis: must be empty
            for title in (ax.title, getattr(ax, "_left_title", None), getattr(ax, "_right_title", None)):
                add(title, "title")
            for text in ax.texts:
                add(text, "annotation")
        for legend in [ax.get_legend() for ax in fig.axes if ax.get_legend() is not None] + list(fig.legends):
            found.legends.append(_box(legend.get_window_extent(renderer)))
            for text in [*legend.get_texts(), legend.get_title()]:
                add(text, "legend")
        for text in fig.texts:
            add(text, "annotation")
        add(getattr(fig, "_suptitle", None), "title")
    return found


# The charts themselves: importing them registers them in CHARTS.
import deck_charts_parallel  # noqa: E402,F401
import deck_charts_training  # noqa: E402,F401
