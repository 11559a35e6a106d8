"""Code on the slides: excerpts of the package, the notebooks and the repository's files, read at build time.

``CodeDirectives`` holds the directives ``{{code module:qualname}}``, ``{{cell NN contains="..."}}`` and
``{{file path}}`` of the deck renderer (``deck_render.Renderer``); an excerpt is always whole: Python that parses,
shell that ``bash -n`` accepts, cut at a statement boundary when it is too long for a slide.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import json
import re
import subprocess
from pathlib import Path

from deck_results import REPO


def whole_code(code: str, lang: str) -> bool:
    """Whether ``code`` is a whole excerpt: Python that parses, shell that ``bash -n`` accepts and that ends no line
    in a continuation; other languages are taken as they are."""
    if lang == "python":
        try:
            ast.parse(code)
        except SyntaxError:
            return False
        return True
    if lang == "bash":
        if code.rstrip().endswith("\\"):
            return False
        return subprocess.run(["bash", "-n"], input=code, text=True, capture_output=True).returncode == 0
    return True


def _dedent(lines: list[str]) -> str:
    indent = min((len(line) - len(line.lstrip()) for line in lines if line.strip()), default=0)
    return "\n".join(line[indent:] for line in lines)


def _html(text) -> str:
    return str(text).replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;").replace('"', "&quot;")


def _yes(value) -> bool:
    return str(value).lower() in ("yes", "true", "1")


class CodeDirectives:
    """The code directives of the renderer; they rely on its ``notice``, ``not_yet`` and ``sources``."""

    @staticmethod
    def fence(code: str, lang: str, caption: str) -> str:
        return f"```{lang}\n{code.rstrip()}\n```\n<p class=\"source\">{_html(caption)}</p>"

    @staticmethod
    def excerpt(text: str, start: str | None, until: str | None, max_lines: int, lang: str = "",
                shows: str | None = None) -> str:
        """The lines from the first containing ``start`` to the first containing ``until``, dedented; for Python and
        shell, an excerpt that ``until`` would end inside a statement runs on to the statement's end, and one longer
        than ``max_lines`` is cut at the last whole statement that fits.

        ``shows``: the call the slide is about. The excerpt then ends with the whole statement holding the first line
        that contains it (what follows is left to the source), and a statement that does not fit in ``max_lines``
        is a LookupError, never an excerpt that stops before its point.
        """
        lines = text.splitlines()
        if start:
            hits = [i for i, line in enumerate(lines) if start in line]
            if not hits:
                raise LookupError(f"no line containing {start!r}")
            lines = lines[hits[0]:]
        end = len(lines)
        if until:
            hits = [i for i, line in enumerate(lines) if until in line]
            if not hits:
                raise LookupError(f"no line containing {until!r}")
            end = hits[0] + 1
            while end < min(len(lines), hits[0] + 16) and not whole_code(_dedent(lines[:end]), lang):
                end += 1
            if not whole_code(_dedent(lines[:end]), lang):
                end = hits[0] + 1
        lines = _dedent(lines[:end]).splitlines()
        if shows:
            hits = [i for i, line in enumerate(lines) if shows in line]
            if not hits:
                raise LookupError(f"no line containing {shows!r}, the call the slide is about")
            stop = hits[0] + 1
            while stop < len(lines) and not whole_code("\n".join(lines[:stop]), lang):
                stop += 1
            if stop > max_lines:
                raise LookupError(f"{shows!r} ends on line {stop} of the excerpt, after max_lines={max_lines}: "
                                  "start the excerpt later (start=...) or allow more lines")
            if stop < len(lines):
                return "\n".join(lines[:stop] + ["# ... (continues in the source)"])
            return "\n".join(lines)
        if len(lines) > max_lines:
            # Cut at the last whole statement that fits, never inside a call or after a line continuation.
            keep = next((k for k in range(max_lines, 0, -1) if whole_code("\n".join(lines[:k]), lang)), max_lines)
            lines = lines[:keep] + ["# ... (continues in the source)"]
        return "\n".join(lines)

    # code --------------------------------------------------------------------------------------------

    def d_code(self, target: str, start=None, until=None, max_lines="14", drop_docstring="yes", shows=None) -> str:
        """Source of a function or class of the package: ``module:qualname``."""
        module_name, _, qualname = target.partition(":")
        try:
            obj = importlib.import_module(module_name)
            for part in qualname.split("."):
                obj = getattr(obj, part)
            source = inspect.getsource(obj)
        except (ImportError, AttributeError, OSError, TypeError) as err:
            return self.notice(f"code {target} ({err})", "the package changed: fix the directive in the deck")
        if drop_docstring == "yes":
            source = re.sub(r'(\n\s+)("""|\'\'\')(?:.|\n)*?\2[ \t]*\n', r"\n", source, count=1)
        try:
            code = self.excerpt(source, start, until, int(max_lines), "python", shows)
        except LookupError as err:
            return self.notice(f"code {target}: {err}", "the package changed: fix the directive in the deck")
        path = Path(inspect.getsourcefile(obj)).resolve().relative_to(REPO)
        self.sources.append(f"{path}:{qualname}")
        return self.fence(code, "python", f"{path} · {qualname}")

    def d_file(self, path: str, start=None, until=None, max_lines="14", lang="", shows=None) -> str:
        """Lines of a file of the repository (a job script, a config)."""
        full = REPO / path
        if not full.is_file():
            return self.notice(f"file {path} not found", "it belongs to the repository: check the checkout")
        lang = lang or {"sbatch": "bash", "sh": "bash", "py": "python"}.get(full.suffix[1:], "")
        try:
            code = self.excerpt(full.read_text(), start, until, int(max_lines), lang, shows)
        except LookupError as err:
            return self.notice(f"file {path}: {err}", "the file changed: fix the directive in the deck")
        self.sources.append(path)
        return self.fence(code, lang, path)

    def d_cell(self, notebook: str, contains: str, start=None, until=None, max_lines="14", optional="no",
               shows=None) -> str:
        """The first code cell of notebook ``NN_*.ipynb`` whose source contains ``contains``."""
        matches = sorted((REPO / "notebooks").glob(f"{notebook}_*.ipynb"))
        if not matches:
            if _yes(optional):
                return self.not_yet(f"notebook {notebook} is not in this checkout", "The cell appears once it is.")
            return self.notice(f"notebook {notebook}_*.ipynb not found", "the notebook is not in this checkout yet")
        cells = json.loads(matches[0].read_text())["cells"]
        for index, cell in enumerate(cells):
            source = "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]
            if cell["cell_type"] == "code" and contains in source:
                try:
                    code = self.excerpt(source, start, until, int(max_lines), "python", shows)
                except LookupError as err:
                    return self.notice(f"cell of {matches[0].name} containing {contains!r}: {err}",
                                       "the notebook changed: fix the directive in the deck")
                name = f"notebooks/{matches[0].name}"
                self.sources.append(f"{name} cell {index}")
                return self.fence(code, "python", f"{name} · cell {index}")
        return self.notice(f"no code cell containing {contains!r} in {matches[0].name}",
                           "the notebook changed: fix the directive in the deck")
