"""Build the workshop's slide decks: Markdown templates + real results -> self-contained HTML and PDF.

    .venv/bin/python slides/build.py                 # newest results per section: runs/, then results/reference/
    .venv/bin/python slides/build.py --run-dir runs/20260101-120000
    .venv/bin/python slides/build.py --html-only     # skip the PDFs (no Chromium needed)

Every deck in ``slides/decks/*.md`` is a Markdown template. Lines such as ``{{code workshop_utils.spine.precision:autocast}}``
are filled in at build time (the directives are listed in slides/README.md): code comes from the package, the
notebooks or the repository's files, numbers, tables and figures from result records. Marp CLI (pinned in
package-lock.json) then turns each rendered deck into ``slides/build/<deck>.html`` and ``slides/build/<deck>.pdf``;
the PDF goes through Chromium (``CHROME_PATH``, default /usr/bin/chromium).

Results are looked up per item, not per build: each section, figure or number comes from the newest run folder
under runs/ that holds it, else from results/reference/. Running one notebook on its own writes a run folder with
that notebook's results only; the other sessions' slides still come from the older, complete run. A slide whose
results are not from the newest run says where they are from in small print, and the build lists every such
fallback. With ``--run-dir`` the given folder comes first, then the reference results.

What no folder holds becomes a visible notice on its slide that names what to run (``make run``), and a warning
at the end (``--strict`` turns warnings into a failed build); a section marked optional (a notebook not written
or not run yet) says so in small print instead. ``slides/build/manifest.json`` records where every deck's
results came from, its slide count against the slide budget of its session, and the build time.
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
from datetime import datetime
from pathlib import Path

SLIDES = Path(__file__).resolve().parent
REPO = SLIDES.parent
DECKS = SLIDES / "decks"
THEME = SLIDES / "theme" / "workshop.css"
MARP = SLIDES / "node_modules" / ".bin" / "marp"
DIRECTIVE = re.compile(r"\{\{(\w+)((?:[^{}]|\{[^{}]*\})*)\}\}")
RUN_FIRST = "make run"
RESULTS_MARK = "\x00results\x00"  # {{results}} is filled in last, once the deck's fallbacks are known

sys.path.insert(0, str(SLIDES))
from deck_tables import curate  # noqa: E402  (a sibling file, found through the line above)

sys.path.remove(str(SLIDES))


class BuildError(Exception):
    """A problem the user can fix; printed as one message with what to do, exit status 2."""


# --------------------------------------------------------------------------------------------- the day


@dataclass(frozen=True)
class Session:
    """One slot of the workshop day; its talk time sets how many slides its deck may have."""

    start: str
    end: str
    title: str
    deck: str | None = None  # None: a break
    talk: int = 0  # minutes of slides
    demo: int = 0  # minutes of live notebooks
    exercise: int = 0  # minutes attendees work on their own
    questions: int = 0
    demo_what: str = ""

    @property
    def minutes(self) -> int:
        if not self.start:
            return self.talk + self.demo + self.exercise + self.questions
        (h0, m0), (h1, m1) = (map(int, t.split(":")) for t in (self.start, self.end))
        return (h1 * 60 + m1) - (h0 * 60 + m0)

    @property
    def budget(self) -> tuple[int, int]:
        """About one slide per 2 to 3 minutes of talk: the fewest and the most slides the deck should have."""
        return math.ceil(self.talk / 3), self.talk // 2

    @property
    def when(self) -> str:
        return f"{self.start}–{self.end}" if self.start else f"optional, {self.minutes} min"


SESSIONS = (
    Session("10:00", "10:15", "Welcome: the day at a glance", "00_overview", talk=15),
    Session("10:15", "11:30", "Session 1 · HPC fundamentals and an introduction to DDP", "01_fundamentals",
            talk=45, demo=20, exercise=10, demo_what="notebook 01: the single-GPU baseline"),
    Session("11:30", "11:45", "Break"),
    Session("11:45", "13:00", "Session 2 · Hands-on DDP", "02_ddp", talk=35, demo=20, exercise=20,
            demo_what="notebook 02: DDP scaling, all-reduce, crash and resume"),
    Session("13:00", "14:00", "Lunch"),
    Session("14:00", "15:00", "Session 3 · Advanced optimization", "03_optimization", talk=30, demo=24, questions=6,
            demo_what="notebooks 03 and 04: mixed precision; profiling and the ladder"),
    Session("15:00", "15:15", "Break"),
    Session("15:15", "16:00", "Session 4 · Slurm and deployment", "04_slurm", talk=24, demo=15, questions=6,
            demo_what="notebook 06 and the job scripts in slurm/"),
    Session("", "", "Bonus · Beyond data parallelism", "05_beyond_data_parallel", talk=30, demo=15,
            demo_what="notebook 05: collectives, FSDP, tensor and pipeline parallelism"),
)


def session_of(deck: str) -> Session | None:
    return next((s for s in SESSIONS if s.deck == deck), None)


# --------------------------------------------------------------------------------------------- results


def _load_records(folder: Path) -> dict[str, dict]:
    records = {}
    for path in sorted((folder / "results").glob("*.json")):
        try:
            record = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError) as err:
            print(f"warning: skipping unreadable record {path}: {err}", file=sys.stderr)
            continue
        if isinstance(record, dict):
            records[record.get("name", path.stem)] = record
    return records


def _environment(records) -> dict:
    """The environment of the measurements (a section only says where its notebook ran)."""
    envs = [r["environment"] for r in records if isinstance(r.get("environment"), dict)]
    measured = [r["environment"] for r in records
                if r.get("kind") != "section" and isinstance(r.get("environment"), dict)]
    return next(iter(measured or envs), {})


def _device(env: dict) -> str:
    if not env:
        return "an unrecorded device"
    return f"{env.get('device_name', '?')} ({env.get('device_type', '?')})"


def _date(env: dict) -> str:
    return str(env.get("date", "?"))[:10]


@dataclass
class Source:
    """One folder of results: a run folder or the reference results."""

    folder: Path
    kind: str  # "given run folder", "run folder" or "reference results"
    records: dict[str, dict] = field(default_factory=dict)

    @property
    def label(self) -> str:
        try:
            return str(self.folder.resolve().relative_to(REPO))
        except ValueError:
            return str(self.folder)

    @property
    def environment(self) -> dict:
        return _environment(self.records.values())

    def describe(self, env: dict | None = None) -> str:
        env = env or self.environment
        if self.kind == "reference results":
            return f"the reference run of {_date(env)}, {_device(env)}"
        return f"run {self.folder.name} of {_date(env)}, {_device(env)}"

    def figure(self, name: str) -> Path | None:
        path = self.folder / "figures" / f"{name}.png"
        return path if path.is_file() else None


@dataclass
class Results:
    """Where results are looked up, in order: the newest run folder first, the reference results last."""

    sources: list[Source]

    @property
    def primary(self) -> Source:
        return self.sources[0]

    @property
    def label(self) -> str:
        return self.primary.label

    @property
    def environment(self) -> dict:
        return self.primary.environment

    def record(self, name: str, path: str = "") -> tuple[dict | None, Source | None]:
        """The newest record called ``name`` (holding a value at dotted ``path`` when given)."""
        for source in self.sources:
            record = source.records.get(name)
            if record is not None and (not path or _lookup(record, path) is not None):
                return record, source
        return None, None

    def figure(self, name: str) -> tuple[Path | None, Source | None]:
        for source in self.sources:
            path = source.figure(name)
            if path:
                return path, source
        return None, None

    def sections(self, low: float, high: float) -> list[tuple[dict, Source]]:
        """Every report section with ``low <= order < high``, each from the newest folder holding it."""
        found: dict[str, tuple[dict, Source]] = {}
        for source in self.sources:
            for name, record in source.records.items():
                if record.get("kind") == "section" and low <= float(record.get("order", -1)) < high:
                    found.setdefault(name, (record, source))
        return sorted(found.values(), key=lambda item: (item[0]["order"], item[0]["name"]))


def _lookup(record: dict, path: str):
    value = record
    for key in path.split("."):
        if isinstance(value, dict) and key in value:
            value = value[key]
        elif isinstance(value, list) and key.isdigit() and int(key) < len(value):
            value = value[int(key)]
        else:
            return None
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def runs_root() -> Path:
    try:
        sys.path.insert(0, str(REPO))
        from workshop_utils.system.results import runs_root as package_runs_root
        return package_runs_root()
    except ImportError:  # the package is not installed: use the same rule by hand
        return Path(os.environ.get("WORKSHOP_RUNS") or REPO / "runs")
    finally:
        sys.path.remove(str(REPO))


def _started(folder: Path) -> datetime:
    """When a run folder was made: the timestamp its name starts with, else its modification time."""
    match = re.match(r"(\d{8}-\d{6})", folder.name)
    if match:
        try:
            return datetime.strptime(match.group(1), "%Y%m%d-%H%M%S")
        except ValueError:
            pass
    return datetime.fromtimestamp(folder.stat().st_mtime)


def find_results(run_dir: str | None, reference: Path) -> Results:
    """The folders to take results from: the given run folder or every run folder with records, newest first,
    then results/reference/."""
    sources: list[Source] = []
    if run_dir:
        folder = Path(run_dir)
        if not folder.is_dir():
            raise BuildError(f"Run folder {folder} does not exist.",
                             f"run `{RUN_FIRST}` first, or pass --run-dir with a folder under runs/.")
        records = _load_records(folder)
        if not records:
            raise BuildError(f"Run folder {folder} holds no result records (results/*.json).",
                             f"run `{RUN_FIRST}` first; it writes results/ and figures/ into a new run folder.")
        sources.append(Source(folder, "given run folder", records))
    else:
        root = runs_root()
        folders = [p for p in root.glob("*") if p.is_dir()] if root.is_dir() else []
        for folder in sorted(folders, key=lambda p: (_started(p), p.name), reverse=True):
            records = _load_records(folder)
            if records:  # a run that recorded nothing yet is passed over
                sources.append(Source(folder, "run folder", records))
    records = _load_records(reference) if reference.is_dir() else {}
    if records:
        sources.append(Source(reference, "reference results", records))
    if not sources:
        raise BuildError(f"No results to build the slides from: no run folder with records under {runs_root()}, "
                         f"and none in {reference}.",
                         f"run `{RUN_FIRST}` first (it executes the notebooks into runs/<timestamp>/), "
                         "or pass --run-dir.")
    return Results(sources)


# --------------------------------------------------------------------------------------------- rendering


def _html(text) -> str:
    return str(text).replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;").replace('"', "&quot;")


def _yes(value) -> bool:
    return str(value).lower() in ("yes", "true", "1")


def html_table(rendered) -> str:
    head = "".join(f"<th>{_html(h)}</th>" for h in rendered.headers)
    body = "".join("<tr>" + "".join(f'<td class="num">{_html(c)}</td>' if num else f"<td>{_html(c)}</td>"
                                    for c, num in zip(row, rendered.numeric)) + "</tr>"
                   for row in rendered.rows)
    return f'<div class="table"><table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table></div>'


class Renderer:
    def __init__(self, results: Results, deck: str):
        self.results = results
        self.deck = deck
        self.missing: list[str] = []  # notices on slides: what to run
        self.fallbacks: list[str] = []  # results taken from an older run or the reference run
        self.not_run: list[str] = []  # optional sections nothing has recorded yet
        self.sources: list[str] = []  # code and data the deck was built from

    # helpers ---------------------------------------------------------------------------------------

    def notice(self, what: str, fix: str) -> str:
        """A visible, styled box in place of missing content, plus a build warning."""
        self.missing.append(f"{self.deck}: {what} ({fix})")
        return (f'<div class="missing"><strong>Not built: {_html(what)}.</strong><br>'
                f"{_html(fix)}</div>")

    def not_yet(self, what: str, how: str) -> str:
        """Small print for an optional section nothing has recorded yet: the slide still reads."""
        self.not_run.append(f"{self.deck}: {what}")
        return f'<p class="fineprint notrun">Not run yet: {_html(what)}. {_html(how)}</p>'

    def provenance(self, what: str, source: Source, env: dict | None = None) -> str:
        """Where a slide's results come from, in small print; anything not from the newest folder is a fallback."""
        env = env or source.environment
        self.sources.append(f"{source.label}: {what}")
        if source is not self.results.primary:
            item = f"{self.deck}: {what} from {source.describe(env)}"
            if item not in self.fallbacks:
                self.fallbacks.append(item)
            why = ("not in the given run folder" if self.results.primary.kind == "given run folder"
                   else "not in the newest run")
            return f"{why}: from {source.describe(env)}"
        if source.kind == "reference results":
            return f"from {source.describe(env)}"
        return f"{source.label}, {_date(env)}, {_device(env)}"

    def record(self, name: str) -> dict | None:
        return self.results.record(name)[0]

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

    # code --------------------------------------------------------------------------------------------

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

    def d_cell(self, notebook: str, contains: str, start=None, until=None, max_lines="14", optional="no") -> str:
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
                    code = self.excerpt(source, start, until, int(max_lines))
                except LookupError:
                    break
                name = f"notebooks/{matches[0].name}"
                self.sources.append(f"{name} cell {index}")
                return self.fence(code, "python", f"{name} · cell {index}")
        return self.notice(f"no code cell containing {contains!r} in {matches[0].name}",
                           "the notebook changed: fix the directive in the deck")

    # results -----------------------------------------------------------------------------------------

    def d_value(self, name: str, path: str, fmt="", unit="") -> str:
        """One number from the newest record holding it: ``{{value baseline metrics.samples_per_s fmt=",.0f"}}``."""
        record, source = self.results.record(name, path)
        if record is None:
            self.missing.append(f"{self.deck}: value {name}.{path} (run `{RUN_FIRST}` first)")
            return f'<span class="missing-inline">[{_html(name)}.{_html(path)}: run {RUN_FIRST}]</span>'
        value = _lookup(record, path)
        text = format(value, fmt) if fmt and isinstance(value, (int, float)) else str(value)
        where = self.provenance(f"values of {name}", source, record.get("environment"))
        mark = "" if source is self.results.primary else \
            f'<sup class="from" title="{_html(where)}">{"ref" if source.kind == "reference results" else "old"}</sup>'
        return f"{_html(text)}{unit}{mark}"

    def d_has(self, name: str, path: str = "") -> str:  # used only inside {{if}}: never rendered
        return ""

    def _figure_html(self, path: Path, name: str, height: str, caption: str, where: str) -> str:
        data = base64.b64encode(path.read_bytes()).decode()
        text = f"{_html(caption)}" if caption else _html(name)
        return (f'<figure><img src="data:image/png;base64,{data}" style="max-height:{int(height)}px" '
                f'alt="{_html(caption or name)}"><figcaption>{text}</figcaption></figure>'
                + (f'<p class="fineprint">{_html(where)}</p>' if where else ""))

    def d_figure(self, name: str, height="470", caption="", optional="no") -> str:
        """A PNG of the newest folder holding ``figures/<name>.png``, inlined, with a one-line caption."""
        path, source = self.results.figure(name)
        if path is None:
            if _yes(optional):
                return self.not_yet(f"figure {name}.png", f"It appears after `{RUN_FIRST}`.")
            return self.notice(f"figure figures/{name}.png is in no run folder and not in the reference results",
                               f"run `{RUN_FIRST}` first (the notebook that draws it writes it into the run folder)")
        return self._figure_html(path, name, height, caption, self.provenance(f"figure {name}", source))

    def d_section(self, key: str, figure="auto", table="yes", text="no", rows="", height="380", layout="stack",
                  caption="", optional="no", notebook="") -> str:
        """A report section's table and figure on one slide, from the newest folder holding the section.

        ``figure``: "auto" (the section's first figure), a figure name, or "none"; ``table``: "yes"/"no";
        ``text``: "yes" shows the section's own sentence; ``layout``: "stack" or "side" (table beside the figure).
        """
        record, source = self.results.record(f"section-{key}")
        who = f"notebook {notebook}" if notebook else "its notebook"
        if record is None:
            if _yes(optional):
                return self.not_yet(f"no run has recorded the section {key!r} of {who} yet",
                                    f"Run {who}, or `{RUN_FIRST}`, then build again.")
            return self.notice(f"section {key} is in no run folder and not in the reference results",
                               f"run `{RUN_FIRST}` first (the notebook that records it writes it into the run folder)")
        fine = [self.provenance(f"section {key}", source, record.get("environment"))]
        parts = []
        if _yes(text) and record.get("text"):
            words = record["text"]
            parts.append(f'<p class="small">{_html(words if len(words) <= 320 else words[:317] + "…")}</p>')
        rows_data = record.get("table") or []
        if _yes(table) and rows_data:
            rendered = curate(key, rows_data, int(rows) if rows else None)
            parts.append(html_table(rendered))
            fine = rendered.notes + ([rendered.left_out] if rendered.left_out else []) + fine
        figure_html = ""
        names = [Path(f).stem for f in record.get("figures") or [] if str(f).endswith(".png")]
        wanted = names[0] if figure == "auto" and names else None if figure in ("auto", "none") else figure
        if wanted:
            path = source.figure(wanted)
            if path is None:
                figure_html = self.notice(f"figure {wanted}.png is not in {source.label} beside its section",
                                          f"run `{RUN_FIRST}` again: the notebook writes both")
            else:
                figure_html = self._figure_html(path, wanted, height, caption, "")
        if layout == "side" and parts and figure_html:
            body = f'<div class="columns side"><div>{"".join(parts)}</div><div>{figure_html}</div></div>'
        else:
            body = "".join(parts) + figure_html
        self.sources.append(f"{source.label}/results/section-{key}.json")
        small = "".join(f'<p class="fineprint">{_html(line)}</p>' for line in fine)
        return f"{body}{small}"

    def d_table(self, key: str, rows="", optional="no", notebook="") -> str:
        """A report section's table alone, curated for reading (``deck_tables.py``)."""
        return self.d_section(key, figure="none", rows=rows, optional=optional, notebook=notebook)

    def d_notebook(self, number: str, optional="no", limit="4") -> str:
        """One slide's worth of what notebook ``NN`` recorded: each section's title and sentence."""
        low = float(number)
        found = self.results.sections(low, low + 1)
        if not found:
            if _yes(optional):
                return self.not_yet(f"notebook {number} has recorded nothing in any run folder yet",
                                    f"Run it (or `{RUN_FIRST}`), then build again.")
            return self.notice(f"no report section of notebook {number} in any run folder",
                               f"run `{RUN_FIRST}` first")
        items = []
        for record, source in found[:int(limit)]:
            words = record.get("text", "")
            words = words if len(words) <= 200 else words[:197] + "…"
            where = self.provenance(f"section {record['name']}", source, record.get("environment"))
            items.append(f"<li><strong>{_html(record.get('title', record['name']))}</strong><br>"
                         f'<span class="small">{_html(words)}</span> <span class="fineprint">{_html(where)}</span></li>')
        more = (f'<p class="fineprint">and {len(found) - int(limit)} more section(s): see the run\'s report.md</p>'
                if len(found) > int(limit) else "")
        return f'<ul class="sections">{"".join(items)}</ul>{more}'

    def d_sections(self, low: str, high: str) -> str:
        """One slide per report section with ``low <= order < high``: its table, else its first figure."""
        found = self.results.sections(float(low), float(high))
        if not found:
            return self.notice(f"no report section with order {low}-{high} in any run folder",
                               f"run `{RUN_FIRST}` first: it executes every notebook into one run folder")
        slides = []
        for record, _ in found:
            key = record["name"].removeprefix("section-")
            body = self.d_section(key, figure="none" if record.get("table") else "auto", height="430")
            slides.append(f"<!-- _class: results -->\n\n## {record['title']}\n\n{body}")
        return "\n\n---\n\n".join(slides)

    def d_agenda(self) -> str:
        """The day's plan, from ``SESSIONS``: the same table as in slides/README.md."""
        rows = []
        for s in SESSIONS:
            if s.deck is None:
                rows.append(f'<tr class="break"><td>{s.when}</td><td colspan="4">{_html(s.title)}</td></tr>')
                continue
            demo = f"{s.demo} min: {_html(s.demo_what)}" if s.demo else "–"
            rest = ", ".join(f"{minutes} min {what}" for minutes, what in
                             ((s.exercise, "exercises"), (s.questions, "questions")) if minutes) or "–"
            rows.append(f"<tr><td>{s.when}</td><td>{_html(s.title)}</td><td class=\"num\">{s.talk} min</td>"
                        f"<td>{demo}</td><td>{rest}</td></tr>")
        head = "<tr><th>Time</th><th>Session</th><th>Talk</th><th>Live demo</th><th>Exercises, questions</th></tr>"
        return f'<div class="table agenda"><table><thead>{head}</thead><tbody>{"".join(rows)}</tbody></table></div>'

    def d_results(self) -> str:
        return RESULTS_MARK

    def results_line(self) -> str:
        """Where the numbers come from: the newest folder, and how many items fell back to older ones."""
        primary = self.results.primary
        env = primary.environment
        what = {"given run folder": "given run folder", "run folder": "newest run",
                "reference results": "reference results"}[primary.kind]
        line = (f"Results: {what} <code>{_html(primary.label)}</code>, measured on {_html(_device(env))}, "
                f"{_html(_date(env))}")
        if env.get("device_type") == "cpu":
            line += " — a CPU run: speeds show the method, not GPU performance"
        if self.fallbacks:
            line += (f". {len(self.fallbacks)} item(s) in this deck come from an older run or the reference run; "
                     "their slides say which")
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
            try:
                return handler(*args, **options)
            except TypeError as err:
                raise BuildError(f"{self.deck}: {{{{{kind}{rest}}}}}: {err}", "see slides/README.md") from None

        text = DIRECTIVE.sub(expand, text)
        return text.replace(RESULTS_MARK, self.results_line())

    def _conditionals(self, text: str) -> str:
        """``{{if RECORD}}...{{else}}...{{end}}``: keep the branch that matches the results."""
        pattern = re.compile(r"\{\{if ([\w.-]+)\}\}(.*?)(?:\{\{else\}\}(.*?))?\{\{end\}\}", re.S)
        return pattern.sub(lambda m: m.group(2) if self.record(m.group(1)) else (m.group(3) or ""), text)


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
    print(f"Slides: newest results in {results.primary.kind} {results.primary.label} "
          f"({len(results.primary.records)} records)")
    for source in results.sources[1:]:
        print(f"  falling back, per section, on {source.kind} {source.label} ({len(source.records)} records)")
    sources = sorted(DECKS.glob("*.md"))
    if decks:
        sources = [s for s in sources if s.stem in decks or s.stem.split("_")[0] in decks]
    if not sources:
        raise BuildError(f"No decks found in {DECKS}.", "check the checkout (slides/decks/*.md).")
    md_dir = out / "md"
    if md_dir.is_dir():
        for old in md_dir.glob("*.md"):  # a deck renamed or removed must not be built again from a stale copy
            old.unlink()
    md_dir.mkdir(parents=True, exist_ok=True)
    sys.path.insert(0, str(REPO))  # code directives import the package from this checkout
    rendered = []
    for source in sources:
        renderer = Renderer(results, source.stem)
        target = md_dir / source.name
        target.write_text(renderer.render(source.read_text()))
        rendered.append((source.stem, renderer))
    missing = [item for _, r in rendered for item in r.missing]
    fallbacks = [item for _, r in rendered for item in r.fallbacks]
    not_run = [item for _, r in rendered for item in r.not_run]
    env = dict(os.environ)
    env.setdefault("CHROME_NO_SANDBOX", "1") if os.geteuid() == 0 else None
    manifest = {"results": {"folder": results.label, "origin": results.primary.kind,
                            "environment": results.environment,
                            "sources": [{"folder": s.label, "origin": s.kind, "records": len(s.records)}
                                        for s in results.sources]},
                "decks": [], "missing": missing, "fallbacks": fallbacks, "not_run": not_run}
    marp(["--input-dir", str(md_dir), "--output", str(out), "--parallel", "2"], env)
    if pdf:
        browser = chromium_path()
        if browser is None:
            raise BuildError("No Chromium found for the PDFs (tried $CHROME_PATH, /usr/bin/chromium).",
                             "apt-get install chromium, set CHROME_PATH, or build with --html-only.")
        env["CHROME_PATH"] = browser
        marp(["--input-dir", str(md_dir), "--output", str(out), "--pdf", "--parallel", "2",
              "--browser", "chrome", "--browser-path", browser, "--browser-timeout", "120"], env)
    over_budget = []
    for name, renderer in rendered:
        html = out / f"{name}.html"
        slides = count_slides(html.read_text())
        session = session_of(name)
        budget = list(session.budget) if session else None
        if budget and not budget[0] <= slides <= budget[1]:
            over_budget.append(f"{name}: {slides} slides, its session's budget is {budget[0]}-{budget[1]} "
                               f"({session.talk} min of talk at 2-3 min a slide)")
        manifest["decks"].append({"deck": name, "slides": slides, "budget": budget,
                                  "session": session.title if session else None,
                                  "html": str(html.relative_to(out)), "pdf": f"{name}.pdf" if pdf else None,
                                  "fallbacks": renderer.fallbacks, "not_run": renderer.not_run,
                                  "code_and_data": renderer.sources})
    manifest["over_budget"] = over_budget
    manifest["build_seconds"] = round(time.perf_counter() - started, 1)
    (out / "manifest.json").write_text(json.dumps(manifest, indent=2))
    for entry in manifest["decks"]:
        budget = f" (budget {entry['budget'][0]}-{entry['budget'][1]})" if entry["budget"] else ""
        print(f"  {entry['deck']:<24} {entry['slides']:>3} slides{budget}  -> {out / entry['html']}"
              + (f", {out / entry['pdf']}" if entry["pdf"] else ""))
    if fallbacks:
        print(f"Fell back on older results for {len(fallbacks)} item(s) (their slides say so in small print):")
        for item in fallbacks:
            print(f"  - {item}")
    if not_run:
        print(f"Not run yet ({len(not_run)}, shown as small print):")
        for item in not_run:
            print(f"  - {item}")
    warnings = missing + over_budget
    if warnings:
        print(f"warning: {len(warnings)} problem(s):", file=sys.stderr)
        for item in missing:
            print(f"  - not filled in, a notice shows on its slide: {item}", file=sys.stderr)
        for item in over_budget:
            print(f"  - slide budget: {item}", file=sys.stderr)
        if strict:
            raise BuildError("--strict: some slides show a notice instead of results, or a deck is off its budget.",
                             f"run `{RUN_FIRST}` first, or trim the deck, then build again.")
    print(f"Slides built in {manifest['build_seconds']} s")
    return manifest


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python slides/build.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--run-dir", help="run folder to take results from first (default: per item, the newest run "
                                          "folder under runs/ that holds it, else results/reference/)")
    parser.add_argument("--out", default=str(SLIDES / "build"), help="output folder (default slides/build)")
    parser.add_argument("--reference", default=str(REPO / "results" / "reference"), help=argparse.SUPPRESS)
    parser.add_argument("--html-only", action="store_true", help="skip the PDFs (no Chromium needed)")
    parser.add_argument("--strict", action="store_true",
                        help="fail when any figure or record is missing or a deck is off its slide budget")
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
