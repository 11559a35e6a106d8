"""One kind of progress bar for every long loop of the kit: tqdm on stderr, gone when done inside a notebook.

In a terminal a finished bar stays as the loop's last line. In a Jupyter kernel it is cleared when it
closes: a notebook that trains forty runs would otherwise keep forty finished bars in every saved or
shared copy, between the results they hide.
"""

from __future__ import annotations

import sys


def in_notebook() -> bool:
    """Whether this process is a Jupyter kernel (a notebook, papermill's run of one, nbval's)."""
    return "ipykernel" in sys.modules


def progress_bar(iterable=None, **options):
    """``tqdm`` on stderr that refreshes at most every 2 s headless; ``options`` as tqdm takes them."""
    from tqdm import tqdm

    options.setdefault("file", sys.stderr)
    options.setdefault("leave", not in_notebook())
    options.setdefault("dynamic_ncols", True)
    return tqdm(iterable, **options)
