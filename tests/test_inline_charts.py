"""Charts appear inline in a Jupyter kernel as JupyterLab runs it (no MPLBACKEND), however many a notebook draws."""

import os

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")


@pytest.mark.slow
def test_every_chart_drawn_in_the_kits_style_is_shown_inline(monkeypatch):
    monkeypatch.delenv("MPLBACKEND", raising=False)  # what a JupyterLab kernel has: pyplot picks the inline backend
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell("import matplotlib.pyplot as plt\nfrom workshop_utils.system.plotstyle import style"),
                nbformat.v4.new_code_cell("with style():\n    fig, ax = plt.subplots()\n    ax.plot([1, 2])"),
                nbformat.v4.new_code_cell("with style():\n    fig, ax = plt.subplots()\n    ax.plot([2, 1])"),
                nbformat.v4.new_code_cell("fig, ax = plt.subplots()\nax.plot([3, 1]);")]
    nbclient.NotebookClient(nb, kernel_name="python3", timeout=120).execute()
    shown = [sum("image/png" in output.get("data", {}) for output in cell.outputs) for cell in nb.cells]
    assert shown == [0, 1, 1, 1]
