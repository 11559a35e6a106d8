"""One look for every chart of the kit: sizes, fonts, and a fixed colour per precision and per ladder rung.

Every plotting function of the package draws inside ``style()``, so a chart reads the same in a notebook,
in report.md and on a slide, and bf16 has the same colour in notebook 03's bars as in notebook 04's ladder.
It sits in the lowest layer because plotting functions of every layer above use it.
"""

from __future__ import annotations

import contextlib

import re

# Okabe-Ito: eight colours that stay distinct for the common kinds of colour blindness and in greyscale print.
PALETTE = ("#0072B2", "#E69F00", "#009E73", "#D55E00", "#CC79A7", "#56B4E9", "#000000", "#999999")

PRECISION_COLORS = {"fp32": "#0072B2", "tf32": "#56B4E9", "fp16": "#D55E00", "bf16": "#009E73", "fp8": "#CC79A7"}

# The rungs of notebook 04's ladder, by label; a rung that switches precision takes that precision's colour.
RUNG_COLORS = {
    "baseline": "#999999",
    "tuned dataloader": "#E69F00",
    "bf16 autocast": PRECISION_COLORS["bf16"],
    "channels_last": "#56B4E9",
    "device-resident loader": "#CC79A7",
    "fused optimizer": "#D55E00",
    "large batch": "#F0E442",  # labelled "<factor>x batch"
    "torch.compile": "#0072B2",
    "cuda graphs": "#000000",
}

STYLE = {
    "figure.dpi": 100,
    "savefig.dpi": 120,
    "font.family": "DejaVu Sans",
    "font.size": 11,
    "axes.titlesize": 12,
    "axes.labelsize": 11,
    "figure.titlesize": 13,
    "legend.fontsize": 9,
    "legend.framealpha": 0.85,
    "xtick.labelsize": 10,
    "ytick.labelsize": 10,
    "axes.grid": True,
    "grid.alpha": 0.3,
    "axes.spines.top": False,
    "axes.spines.right": False,
    "lines.linewidth": 1.8,
    "lines.markersize": 6,
}


@contextlib.contextmanager
def style():
    """A context in which figures take the kit's look: ``with style(): fig, ax = plt.subplots()``.

    Only the look is undone at the end. The first figure of a Jupyter kernel picks pyplot's backend inside
    the block, and the inline backend switches interactive mode on as it loads; restoring that switch with the
    look would keep every later figure of the notebook from being shown.
    """
    import matplotlib as mpl
    from cycler import cycler

    with mpl.rc_context({**STYLE, "axes.prop_cycle": cycler(color=list(PALETTE))}):
        try:
            yield
        finally:
            interactive = mpl.rcParams["interactive"]
    mpl.interactive(interactive)


def precision_color(name: str) -> str | None:
    """The colour of a precision mode ("fp32", "bf16", ...), also inside a longer label ("bf16, channels_last")."""
    text = str(name).lower()
    for precision, color in PRECISION_COLORS.items():
        if re.search(rf"\b{precision}\b", text):
            return color
    return None


def rung_color(label: str) -> str | None:
    """The colour of a rung of the optimization ladder, by its label; None for a label that is no rung."""
    key = str(label).strip().lower()
    return RUNG_COLORS.get("large batch" if re.fullmatch(r"\d+x batch", key) else key)


def category_colors(labels) -> list[str]:
    """One colour per label: the rung's or the precision's own where it has one, else the palette in order.

    All labels must be known rungs or precisions for their fixed colours to be used, so that a chart never
    mixes fixed and positional colours.
    """
    labels = [str(label) for label in labels]
    for lookup in (rung_color, precision_color):
        colors = [lookup(label) for label in labels]
        if labels and all(colors):
            return colors
    return [PALETTE[0]] * len(labels)

