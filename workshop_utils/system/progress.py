"""One kind of progress bar for every long loop of the kit: tqdm, gone when done inside a notebook.

In a terminal the bar goes to stderr and a finished bar stays as the loop's last line. In a Jupyter
kernel it is one line of output that the bar rewrites in place (an IPython display, updated), and that
is emptied when the bar closes: a notebook that trains forty runs would otherwise keep forty finished
bars in every saved or shared copy. The bar does not go to stderr there: JupyterLab applies the bar's
carriage returns to a stderr stream and keeps the emptied line as a blank stderr strip under the cell.
"""

from __future__ import annotations

import sys

from .errors import ipython_shell


def in_notebook() -> bool:
    """Whether this process is a Jupyter kernel (a notebook, papermill's run of one, nbval's)."""
    return "ipykernel" in sys.modules


def in_kernel() -> bool:
    """Whether code runs in a live Jupyter kernel that can show a display (not a process that merely imported
    ipykernel, such as a test run)."""
    if not in_notebook():
        return False
    return getattr(ipython_shell(), "kernel", None) is not None


class NotebookLine:
    """A file for tqdm in a Jupyter kernel: each write shows the bar's latest state in one output, updated in
    place; once the bar clears itself the output is empty (nothing on stderr, no blank strip)."""

    def __init__(self):
        self.handle = None
        self.shown = ""
        self.pending = ""

    def write(self, text: str) -> int:
        self.pending += text
        return len(text)

    def flush(self) -> None:
        latest = self.pending.replace("\r\n", "\n").rsplit("\r", 1)[-1].rsplit("\n", 1)[-1] if self.pending else ""
        if "\r" not in self.pending and "\n" not in self.pending:
            latest = self.shown + self.pending  # a write that continues the current line
        self.pending = ""
        latest = latest.rstrip()
        if latest == self.shown:
            return
        from IPython.display import display

        self.shown = latest
        if self.handle is None:
            if latest:
                self.handle = display({"text/plain": latest}, raw=True, display_id=True)
        else:
            self.handle.update({"text/plain": latest}, raw=True)


def progress_bar(iterable=None, **options):
    """``tqdm`` that refreshes at most every 2 s headless; ``options`` as tqdm takes them (``file`` stderr, or the
    notebook's own output line in a Jupyter kernel)."""
    from tqdm import tqdm

    options.setdefault("leave", not in_notebook())
    if in_kernel() and options.get("file", sys.stderr) in (sys.stderr, None):
        options["file"] = NotebookLine()
        options.setdefault("ncols", 100)  # a display has no terminal width to ask
        options.setdefault("mininterval", 1.0)  # each refresh is a message to the front end: one a second is enough
    else:
        options.setdefault("file", sys.stderr)
        options.setdefault("dynamic_ncols", True)
    return tqdm(iterable, **options)
