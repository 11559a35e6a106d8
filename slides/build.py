"""Build the workshop's slide decks: Markdown templates + real results -> self-contained HTML and PDF.

    .venv/bin/python slides/build.py                 # latest run folder under runs/, else results/reference/
    .venv/bin/python slides/build.py --run-dir runs/20260101-120000
    .venv/bin/python slides/build.py --html-only     # skip the PDFs (no Chromium needed)

Every deck in ``slides/decks/*.md`` is a Markdown template. Lines such as ``{{code workshop_utils.spine.precision:autocast}}``
are filled in at build time (the directives are listed in slides/README.md): code comes from the package, the
notebooks or the repository's files, numbers and tables from the result records of one run folder, figures from its
``figures/`` folder (inlined as data: URIs, so the HTML needs no other file). Marp CLI (pinned in package-lock.json)
then turns each rendered deck into ``slides/build/<deck>.html`` and ``slides/build/<deck>.pdf``; the PDF goes through
Chromium (``CHROME_PATH``, default /usr/bin/chromium). ``slides/build/manifest.json`` records which results were used,
the slide count of every deck, what was missing, and the build time.

A missing figure or record does not break a slide: it becomes a visible notice on the slide that names what to run
(``make run``) and is listed as a warning at the end (``--strict`` turns warnings into a failed build). No run folder
at all stops the build with the same advice.
"""

from __future__ import annotations

import argparse
import base64
import importlib
import inspect
import json
import math
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

SLIDES = Path(__file__).resolve().parent
REPO = SLIDES.parent
DECKS = SLIDES / "decks"
THEME = SLIDES / "theme" / "workshop.css"
MARP = SLIDES / "node_modules" / ".bin" / "marp"
DIRECTIVE = re.compile(r"\{\{(\w+)((?:[^{}]|\{[^{}]*\})*)\}\}")
RUN_FIRST = "make run"


class BuildError(Exception):
    """A problem the user can fix; printed as one message with what to do, exit status 2."""


# --------------------------------------------------------------------------------------------- results


@dataclass
class Results:
    """The run folder (or reference folder) the numbers and figures come from."""

    folder: Path
    origin: str  # "run folder", "given run folder" or "reference results"
    records: dict[str, dict] = field(default_factory=dict)

    @property
    def label(self) -> str:
        try:
            return str(self.folder.resolve().relative_to(REPO))
        except ValueError:
            return str(self.folder)

    @property
    def environment(self) -> dict:
        return next((r["environment"] for r in self.records.values() if r.get("environment")), {})


def _load_records(folder: Path) -> dict[str, dict]:
    records = {}
    for path in sorted((folder / "results").glob("*.json")):
        try:
            record = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError) as err:
            print(f"warning: skipping unreadable record {path}: {err}", file=sys.stderr)
            continue
        records[record.get("name", path.stem)] = record
    return records


def runs_root() -> Path:
    try:
        sys.path.insert(0, str(REPO))
        from workshop_utils.system.results import runs_root as package_runs_root
        return package_runs_root()
    except ImportError:  # the package is not installed: use the same rule by hand
        return Path(os.environ.get("WORKSHOP_RUNS") or REPO / "runs")
    finally:
        sys.path.remove(str(REPO))


def find_results(run_dir: str | None, reference: Path) -> Results:
    """The given run folder; else the newest run folder holding records; else results/reference/."""
    if run_dir:
        folder = Path(run_dir)
        if not folder.is_dir():
            raise BuildError(f"Run folder {folder} does not exist.",
                             f"run `{RUN_FIRST}` first, or pass --run-dir with a folder under runs/.")
        records = _load_records(folder)
        if not records:
            raise BuildError(f"Run folder {folder} holds no result records (results/*.json).",
                             f"run `{RUN_FIRST}` first; it writes results/ and figures/ into a new run folder.")
        return Results(folder, "given run folder", records)
    root = runs_root()
    candidates = sorted((p for p in root.glob("*") if p.is_dir()), key=lambda p: p.name, reverse=True) \
        if root.is_dir() else []
    for folder in candidates:
        records = _load_records(folder)
        if records:
            return Results(folder, "latest run folder", records)
    records = _load_records(reference) if reference.is_dir() else {}
    if records:
        return Results(reference, "reference results", records)
    raise BuildError(f"No results to build the slides from: no run folder with records under {root}, "
                     f"and none in {reference}.",
                     f"run `{RUN_FIRST}` first (it executes the notebooks into runs/<timestamp>/), "
                     "or pass --run-dir.")


# --------------------------------------------------------------------------------------------- rendering


class Renderer:
    def __init__(self, results: Results, deck: str):
        self.results = results
        self.deck = deck
        self.missing: list[str] = []
        self.sources: list[str] = []

    # helpers ---------------------------------------------------------------------------------------

    def notice(self, what: str, fix: str) -> str:
        """A visible, styled box in place of missing content, plus a build warning."""
        self.missing.append(f"{self.deck}: {what} ({fix})")
        return (f'<div class="missing"><strong>Not built: {_html(what)}.</strong><br>'
                f"{_html(fix)}</div>")

    def record(self, name: str) -> dict | None:
        return self.results.records.get(name)

    @staticmethod
    def fence(code: str, lang: str, caption: str) -> str:
        return f"```{lang}\n{code.rstrip()}\n```\n<p class=\"source\">{_html(caption)}</p>"

    @staticmethod
    def excerpt(text: str, start: str | None, until: str | None, max_lines: int) -> str:
        lines = text.splitlines()
        if start:
            hits = [i for i, line in enumerate(lines) if start in line]
            if not hits:
                raise LookupError(f"no line containing {start!r}")
            lines = lines[hits[0]:]
        if until:
            hits = [i for i, line in enumerate(lines) if until in line]
            if not hits:
                raise LookupError(f"no line containing {until!r}")
            lines = lines[:hits[0] + 1]
        indent = min((len(l) - len(l.lstrip()) for l in lines if l.strip()), default=0)
        lines = [l[indent:] for l in lines]
        if len(lines) > max_lines:
            lines = lines[:max_lines] + ["# ... (continues in the source)"]
        return "\n".join(lines)

    # directives --------------------------------------------------------------------------------------

    def d_code(self, target: str, start=None, until=None, max_lines="14", drop_docstring="yes") -> str:
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
            code = self.excerpt(source, start, until, int(max_lines))
        except LookupError as err:
            return self.notice(f"code {target}: {err}", "the package changed: fix the directive in the deck")
        path = Path(inspect.getsourcefile(obj)).resolve().relative_to(REPO)
        self.sources.append(f"{path}:{qualname}")
        return self.fence(code, "python", f"{path} · {qualname}")

    def d_file(self, path: str, start=None, until=None, max_lines="14", lang="") -> str:
        """Lines of a file of the repository (a job script, a config)."""
        full = REPO / path
        if not full.is_file():
            return self.notice(f"file {path} not found", "it belongs to the repository: check the checkout")
        try:
            code = self.excerpt(full.read_text(), start, until, int(max_lines))
        except LookupError as err:
            return self.notice(f"file {path}: {err}", "the file changed: fix the directive in the deck")
        self.sources.append(path)
        return self.fence(code, lang or {"sbatch": "bash", "sh": "bash", "py": "python"}.get(full.suffix[1:], ""),
                          path)

    def d_cell(self, notebook: str, contains: str, start=None, until=None, max_lines="14") -> str:
        """The first code cell of notebook ``NN_*.ipynb`` whose source contains ``contains``."""
        matches = sorted((REPO / "notebooks").glob(f"{notebook}_*.ipynb"))
        if not matches:
            return self.notice(f"notebook {notebook}_*.ipynb not found",
                               "the notebook is not in this checkout yet")
        cells = json.loads(matches[0].read_text())["cells"]
        for index, cell in enumerate(cells):
            source = "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]
            if cell["cell_type"] == "code" and contains in source:
                try:
                    code = self.excerpt(source, start, until, int(max_lines))
                except LookupError as err:
                    break
                name = f"notebooks/{matches[0].name}"
                self.sources.append(f"{name} cell {index}")
                return self.fence(code, "python", f"{name} · cell {index}")
        return self.notice(f"no code cell containing {contains!r} in {matches[0].name}",
                           "the notebook changed: fix the directive in the deck")

    def _value(self, name: str, path: str):
        record = self.record(name)
        if record is None:
            return None
        value = record
        for key in path.split("."):
            if isinstance(value, dict) and key in value:
                value = value[key]
            elif isinstance(value, list) and key.isdigit() and int(key) < len(value):
                value = value[int(key)]
            else:
                return None
        return value

    def d_value(self, name: str, path: str, fmt="", unit="") -> str:
        """One number from a record: ``{{value baseline metrics.samples_per_s fmt=",.0f"}}``."""
        value = self._value(name, path)
        if value is None or (isinstance(value, float) and not math.isfinite(value)):
            self.missing.append(f"{self.deck}: value {name}.{path} (run `{RUN_FIRST}` first)")
            return f'<span class="missing-inline">[{_html(name)}.{_html(path)}: run {RUN_FIRST}]</span>'
        text = format(value, fmt) if fmt and isinstance(value, (int, float)) else str(value)
        return f"{text}{unit}"

    def d_has(self, name: str, path: str = "") -> str:  # used only inside {{if}}: never rendered
        return ""

    def d_figure(self, name: str, height="470", caption="") -> str:
        """A PNG of the run folder's figures/, inlined as a data: URI."""
        path = self.results.folder / "figures" / f"{name}.png"
        if not path.is_file():
            return self.notice(f"figure figures/{name}.png is not in {self.results.label}",
                               f"run `{RUN_FIRST}` first (the notebook that draws it writes it into the run folder)")
        data = base64.b64encode(path.read_bytes()).decode()
        self.sources.append(f"{self.results.label}/figures/{name}.png")
        text = caption or f"{name}.png"
        return (f'<figure><img src="data:image/png;base64,{data}" style="max-height:{int(height)}px" '
                f'alt="{_html(name)}"><figcaption>{_html(text)} · {_html(self.results.label)}</figcaption></figure>')

    def d_table(self, section: str, columns="", rows="8", title="") -> str:
        """The table of a report section record (``results/section-<key>.json``)."""
        record = self.record(f"section-{section}")
        if record is None:
            return self.notice(f"section {section} is not in {self.results.label}",
                               f"run `{RUN_FIRST}` first (the notebook that records it writes it into the run folder)")
        table = record.get("table") or []
        wanted = [c.strip() for c in columns.split(",") if c.strip()] or None
        self.sources.append(f"{self.results.label}/results/section-{section}.json")
        return _markdown_table(table, wanted, int(rows))

    def d_sections(self, low: str, high: str) -> str:
        """One or more slides per report section whose ``order`` is in [low, high): title, text, table, figures."""
        sections = sorted((r for r in self.results.records.values() if r.get("kind") == "section"
                           and float(low) <= float(r.get("order", -1)) < float(high)),
                          key=lambda r: (r["order"], r["name"]))
        if not sections:
            return self.notice(f"no report section with order {low}-{high} in {self.results.label}",
                               f"run `{RUN_FIRST}` first: it executes every notebook into one run folder")
        slides = []
        for section in sections:
            self.sources.append(f"{self.results.label}/results/{section['name']}.json")
            head = f"<!-- _class: results -->\n\n## {section['title']}\n\n"
            text = f'<p class="small">{_html(section.get("text", ""))}</p>\n\n' if section.get("text") else ""
            table = section.get("table") or []
            for chunk_rows, chunk_cols in _table_chunks(table):
                slides.append(head + text + _markdown_table(chunk_rows, chunk_cols, len(chunk_rows)))
                text = ""
            for figure in section.get("figures") or []:
                path = self.results.folder / figure
                if path.suffix == ".png":
                    slides.append(head + self.d_figure(path.stem, height="500"))
            if not table and not section.get("figures"):
                slides.append(head + text)
        return "\n\n---\n\n".join(slides)

    def d_results(self) -> str:
        """Where the numbers come from: the folder and the environment they were measured in."""
        env = self.results.environment
        device = f"{env.get('device_name', '?')} ({env.get('device_type', '?')})" if env else "unknown device"
        line = (f"Results: <code>{_html(self.results.label)}</code> ({self.results.origin}), "
                f"measured on {_html(device)}, {_html(str(env.get('date', '?')))}")
        if env.get("device_type") == "cpu":
            line += " — a CPU run: speeds show the method, not GPU performance"
        return f'<p class="provenance">{line}</p>'

    # template ----------------------------------------------------------------------------------------

    def render(self, text: str) -> str:
        text = self._conditionals(text)

        def expand(match: re.Match) -> str:
            kind, rest = match.group(1), match.group(2)
            handler = getattr(self, f"d_{kind}", None)
            if handler is None:
                raise BuildError(f"{self.deck}: unknown directive {{{{{kind}}}}}", "see slides/README.md")
            args, options = [], {}
            for token in shlex.split(rest):
                key, eq, value = token.partition("=")
                if eq and re.fullmatch(r"\w+", key):
                    options[key] = value
                else:
                    args.append(token)
            return handler(*args, **options)

        return DIRECTIVE.sub(expand, text)

    def _conditionals(self, text: str) -> str:
        """``{{if RECORD}}...{{else}}...{{end}}``: keep the branch that matches the results."""
        pattern = re.compile(r"\{\{if ([\w.-]+)\}\}(.*?)(?:\{\{else\}\}(.*?))?\{\{end\}\}", re.S)
        return pattern.sub(lambda m: m.group(2) if self.record(m.group(1)) else (m.group(3) or ""), text)


def _html(text: str) -> str:
    return str(text).replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;").replace('"', "&quot;")


def _cell(value) -> str:
    if isinstance(value, float):
        if not math.isfinite(value):
            return "–"
        text = f"{value:,.4g}" if abs(value) < 1e6 else f"{value:,.0f}"
    elif value is None:
        text = "–"
    else:
        text = str(value)
    return text.replace("|", "\\|").replace("\n", " ")


def _table_chunks(rows: list[dict], max_rows: int = 8, max_cols: int = 6):
    """Split a wide or long table into slide-sized pieces; the first column repeats in every piece."""
    if not rows:
        return
    columns = list(dict.fromkeys(k for row in rows for k in row))
    first, rest = columns[:1], columns[1:]
    groups = [first + rest[i:i + max_cols - 1] for i in range(0, max(len(rest), 1), max_cols - 1)]
    for start in range(0, len(rows), max_rows):
        for group in groups:
            yield rows[start:start + max_rows], group


def _markdown_table(rows: list[dict], columns: list[str] | None, max_rows: int) -> str:
    if not rows:
        return "*(the record holds no rows)*"
    columns = columns or list(dict.fromkeys(k for row in rows for k in row))
    lines = ["| " + " | ".join(_cell(c) for c in columns) + " |", "|" + "---|" * len(columns)]
    for row in rows[:max_rows]:
        lines.append("| " + " | ".join(_cell(row.get(c)) for c in columns) + " |")
    if len(rows) > max_rows:
        lines.append(f'\n<p class="source">first {max_rows} of {len(rows)} rows</p>')
    return '<div class="table">\n\n' + "\n".join(lines) + "\n\n</div>"


# --------------------------------------------------------------------------------------------- Marp


def chromium_path() -> str | None:
    for candidate in (os.environ.get("CHROME_PATH"), "/usr/bin/chromium", shutil.which("chromium"),
                      shutil.which("chromium-browser"), shutil.which("google-chrome")):
        if candidate and Path(candidate).is_file() and os.access(candidate, os.X_OK):
            return candidate
    return None


def marp(args: list[str], env: dict) -> None:
    if not MARP.exists():
        raise BuildError(f"Marp CLI is not installed ({MARP} is missing).",
                         "run `npm ci --prefix slides` once (Node.js 18 or newer).")
    command = [str(MARP), "--no-config-file", "--theme-set", str(THEME), "--html",
               "--bespoke.transition=false", *args]
    done = subprocess.run(command, cwd=SLIDES, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise BuildError(f"Marp CLI failed ({' '.join(command)}):\n{done.stdout}{done.stderr}",
                         "see the message above; the rendered Markdown is in slides/build/md/.")


def count_slides(html: str) -> int:
    return len(re.findall(r"<section\b[^>]*\bid=\"\d+\"", html))


def build(run_dir: str | None, out: Path, reference: Path, pdf: bool, strict: bool, decks: list[str] | None) -> dict:
    started = time.perf_counter()
    results = find_results(run_dir, reference)
    print(f"Slides: using {results.origin} {results.label} ({len(results.records)} records)")
    sources = sorted(DECKS.glob("*.md"))
    if decks:
        sources = [s for s in sources if s.stem in decks or s.stem.split("_")[0] in decks]
    if not sources:
        raise BuildError(f"No decks found in {DECKS}.", "check the checkout (slides/decks/*.md).")
    md_dir = out / "md"
    md_dir.mkdir(parents=True, exist_ok=True)
    sys.path.insert(0, str(REPO))  # code directives import the package from this checkout
    missing, rendered = [], []
    for source in sources:
        renderer = Renderer(results, source.stem)
        text = renderer.render(source.read_text())
        target = md_dir / source.name
        target.write_text(text)
        rendered.append((source.stem, target, renderer.sources))
        missing += renderer.missing
    env = dict(os.environ)
    env.setdefault("CHROME_NO_SANDBOX", "1") if os.geteuid() == 0 else None
    manifest = {"results": {"folder": results.label, "origin": results.origin,
                            "environment": results.environment}, "decks": [], "missing": missing}
    marp(["--input-dir", str(md_dir), "--output", str(out), "--parallel", "2"], env)
    if pdf:
        browser = chromium_path()
        if browser is None:
            raise BuildError("No Chromium found for the PDFs (tried $CHROME_PATH, /usr/bin/chromium).",
                             "apt-get install chromium, set CHROME_PATH, or build with --html-only.")
        env["CHROME_PATH"] = browser
        marp(["--input-dir", str(md_dir), "--output", str(out), "--pdf", "--parallel", "2",
              "--browser", "chrome", "--browser-path", browser, "--browser-timeout", "120"], env)
    for name, target, used in rendered:
        html = out / f"{name}.html"
        slides = count_slides(html.read_text())
        entry = {"deck": name, "slides": slides, "html": str(html.relative_to(out)),
                 "pdf": f"{name}.pdf" if pdf else None, "code_and_data": used}
        manifest["decks"].append(entry)
    manifest["build_seconds"] = round(time.perf_counter() - started, 1)
    (out / "manifest.json").write_text(json.dumps(manifest, indent=2))
    for entry in manifest["decks"]:
        print(f"  {entry['deck']:<24} {entry['slides']:>3} slides  -> {out / entry['html']}"
              + (f", {out / entry['pdf']}" if entry["pdf"] else ""))
    if missing:
        print(f"warning: {len(missing)} item(s) could not be filled in and show a notice on their slide:",
              file=sys.stderr)
        for item in missing:
            print(f"  - {item}", file=sys.stderr)
        if strict:
            raise BuildError("--strict: some slides show a notice instead of results.",
                             f"run `{RUN_FIRST}` first, then build again.")
    print(f"Slides built in {manifest['build_seconds']} s from {results.origin} {results.label}")
    return manifest


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python slides/build.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--run-dir", help="run folder to take results and figures from (default: latest under runs/, "
                                          "else results/reference/)")
    parser.add_argument("--out", default=str(SLIDES / "build"), help="output folder (default slides/build)")
    parser.add_argument("--reference", default=str(REPO / "results" / "reference"), help=argparse.SUPPRESS)
    parser.add_argument("--html-only", action="store_true", help="skip the PDFs (no Chromium needed)")
    parser.add_argument("--strict", action="store_true", help="fail when any figure or record is missing")
    parser.add_argument("--deck", action="append", help="build only this deck (name or number; repeatable)")
    args = parser.parse_args(argv)
    try:
        build(args.run_dir, Path(args.out), Path(args.reference), not args.html_only, args.strict, args.deck)
    except BuildError as err:
        message, fix = err.args if len(err.args) == 2 else (str(err), "")
        print(f"slides: {message}\n  -> {fix}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
