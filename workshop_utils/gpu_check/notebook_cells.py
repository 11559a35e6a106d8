"""A notebook run without Jupyter: its code cells in order, in one namespace, the way a kernel runs them.

A GPU node image often holds PyTorch and no Jupyter (no papermill, nbclient or ipykernel), and a short GPU slot
has no time to install them. The GPU run then runs each notebook here, in a process of its own, and writes the
executed copy as papermill would: the parameters injected after the cell tagged ``parameters``; each cell's
printed text, its last expression's value (text, and HTML where the object has it), every figure it left open
(as a PNG, then closed, as the inline backend does) and, for the cell that failed, its error; the notebook stops
at the first error. The copy is written after every cell, so a run stopped from outside still shows where.

    python -m workshop_utils.gpu_check.notebook_cells NOTEBOOK EXECUTED --parameters '{"profile": "gpu"}'

Exit status 0 when every cell ran, 1 when one failed.
"""

from __future__ import annotations

import argparse
import ast
import base64
import contextlib
import io
import json
import linecache
import os
import sys
import time
import traceback
from pathlib import Path


def _text(source) -> str:
    return "".join(source) if isinstance(source, list) else source


class _Tee(io.TextIOBase):
    """A stream that keeps what the cell writes as notebook outputs and passes it on to the console."""

    def __init__(self, name: str, outputs: list, through):
        self.name, self.outputs, self.through = name, outputs, through

    def write(self, text: str) -> int:
        if text:
            last = self.outputs[-1] if self.outputs else None
            if last and last.get("output_type") == "stream" and last.get("name") == self.name:
                last["text"] += text
            else:
                self.outputs.append({"output_type": "stream", "name": self.name, "text": text})
            self.through.write(text)
        return len(text)

    def flush(self) -> None:
        self.through.flush()

    def isatty(self) -> bool:
        return False


def _bundle(value) -> dict:
    """What Jupyter shows for ``value``: its text, and its HTML when it has one that renders."""
    data = {"text/plain": str(value) if hasattr(value, "_repr_html_") else repr(value)}
    html = getattr(value, "_repr_html_", None)
    if callable(html):
        try:
            rendered = html()
            if rendered:
                data["text/html"] = rendered
        except Exception:  # e.g. pandas' Styler without jinja2 on a bare image: the text stands
            pass
    return data


def _figures(outputs: list) -> None:
    """Every figure the cell left open, as the inline backend shows it, then closed."""
    if "matplotlib.pyplot" not in sys.modules:
        return
    import matplotlib.pyplot as plt

    for number in plt.get_fignums():
        buffer = io.BytesIO()
        plt.figure(number).savefig(buffer, format="png", bbox_inches="tight")
        outputs.append({"output_type": "display_data", "metadata": {},
                        "data": {"image/png": base64.b64encode(buffer.getvalue()).decode(), "text/plain": "<Figure>"}})
    plt.close("all")


def _run_cell(source: str, namespace: dict, number: int, outputs: list) -> None:
    """``source`` as a kernel runs it: every statement, then the value of a last bare expression (not after ``;``).

    Its text goes into ``linecache`` under the cell's name, as IPython does, so that ``inspect.getsource`` reads a
    function the cell defines (a check that sends an attendee's function to other processes needs its source).
    """
    name = f"<cell {number}>"
    linecache.cache[name] = (len(source), None, source.splitlines(keepends=True), name)
    tree = ast.parse(source, name)
    last = tree.body[-1] if tree.body and isinstance(tree.body[-1], ast.Expr) else None
    shown = last is not None and not source.rstrip().endswith(";")
    if shown:
        tree.body.pop()
    exec(compile(tree, name, "exec"), namespace)
    if shown:
        value = eval(compile(ast.Expression(last.value), name, "eval"), namespace)
        if value is not None:
            outputs.append({"output_type": "execute_result", "execution_count": number, "metadata": {},
                            "data": _bundle(value)})


def parameters_cell(parameters: dict) -> dict:
    source = "# Parameters\n" + "".join(f"{name} = {value!r}\n" for name, value in parameters.items())
    return {"cell_type": "code", "execution_count": None, "metadata": {"tags": ["injected-parameters"]},
            "outputs": [], "source": source}


def execute(notebook: Path, executed: Path, parameters: dict) -> dict:
    """Run ``notebook``'s code cells in order into ``executed``; return {cells, seconds, failed cell, error}."""
    nb = json.loads(Path(notebook).read_text())
    cells = nb["cells"]
    tagged = next((i for i, c in enumerate(cells) if "parameters" in c.get("metadata", {}).get("tags", [])), -1)
    cells.insert(tagged + 1, parameters_cell(parameters))
    namespace = {"__name__": "__main__"}
    number, started, outcome = 0, time.perf_counter(), {"failed_cell": None, "error": ""}
    executed.parent.mkdir(parents=True, exist_ok=True)
    os.environ["MPLBACKEND"] = "Agg"  # no display (an image may name a Jupyter one): figures are saved from each cell
    from ..run_notebooks import settle_text  # after the backend is set: it imports what may import matplotlib

    for cell in cells:
        if cell["cell_type"] != "code" or not _text(cell["source"]).strip():
            continue
        number += 1
        outputs: list = []
        cell["outputs"], cell["execution_count"] = outputs, number
        namespace["display"] = lambda *values, **_: outputs.extend(
            {"output_type": "display_data", "metadata": {}, "data": _bundle(v)} for v in values)
        began = time.perf_counter()
        try:
            with contextlib.redirect_stdout(_Tee("stdout", outputs, sys.stdout)), \
                    contextlib.redirect_stderr(_Tee("stderr", outputs, sys.stderr)):
                _run_cell(_text(cell["source"]), namespace, number, outputs)
        except BaseException as err:  # the cell's error is its output, and the run stops there, as papermill's does
            lines = traceback.format_exception(type(err), err, err.__traceback__)
            outputs.append({"output_type": "error", "ename": type(err).__name__, "evalue": str(err),
                            "traceback": [line.rstrip("\n") for line in lines]})
            outcome = {"failed_cell": number, "error": f"{type(err).__name__}: {str(err).strip().splitlines()[0] if str(err).strip() else ''}"[:300],
                       "cell_source": next((line for line in _text(cell["source"]).splitlines() if line.strip()), "")[:120]}
            if isinstance(err, KeyboardInterrupt):
                raise
        finally:
            _figures(outputs)
            for output in outputs:  # a progress bar's refreshes end as its last state, as a notebook shows them
                if output["output_type"] == "stream":
                    output["text"] = settle_text(output["text"])
            cell.setdefault("metadata", {})["execution"] = {"seconds": round(time.perf_counter() - began, 2)}
            executed.write_text(json.dumps(nb, indent=1))
        if outcome["failed_cell"]:
            break
    return {"cells": number, "seconds": time.perf_counter() - started, **outcome}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m workshop_utils.gpu_check.notebook_cells", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("notebook")
    parser.add_argument("executed")
    parser.add_argument("--parameters", default="{}", help="JSON object: the values papermill would inject")
    args = parser.parse_args(argv)
    notebook = Path(args.notebook).resolve()
    os.chdir(notebook.parent)  # as papermill runs it: relative paths are the notebook's
    outcome = execute(notebook, Path(args.executed).resolve(), json.loads(args.parameters))
    return 1 if outcome["failed_cell"] else 0


if __name__ == "__main__":
    sys.exit(main())
