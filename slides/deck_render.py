"""The deck renderer: a Markdown template with ``{{directives}}`` in, Markdown for Marp with everything filled in out.

``Renderer.render`` expands each directive (listed in slides/README.md) with the ``d_<name>`` method of the same
name: numbers, tables and sections here, figures and charts in ``deck_figures``, code in ``deck_code``, the day's
plan from ``deck_day``. Whatever it could not fill in becomes a visible notice on its slide (``missing``); what
came from an older run or the reference run is listed (``fallbacks``) and said in small print on its slide.
"""

from __future__ import annotations

import functools
import json
import re
import shlex
import subprocess
from pathlib import Path

import deck_charts
from deck_code import CodeDirectives, _html, _yes
from deck_day import SESSIONS, session_notebooks, session_of
from deck_figures import FigureDirectives
from deck_notes import NOTES, gpt_time_estimate
from deck_quotes import THROUGHPUT
from deck_results import PATH_PART, REPO, RUN_FIRST, BuildError, Results, Source, _date, _device, _lookup
from deck_labels import config_words, table_rows
from deck_tables import curate

DIRECTIVE = re.compile(r"\{\{(\w+)((?:[^{}]|\{[^{}]*\})*)\}\}")
RESULTS_MARK = "\x00results\x00"  # {{results}} is filled in last, once the deck's fallbacks are known


@functools.lru_cache(maxsize=1)
def checkout_commit() -> str | None:
    """The commit of the checkout the code excerpts are read from, short; None outside a git checkout."""
    try:
        done = subprocess.run(["git", "rev-parse", "--short=7", "HEAD"], cwd=REPO, capture_output=True, text=True,
                              timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    if done.returncode != 0:
        return None
    return done.stdout.strip() or None


_NOT_PROSE = re.compile(r"\s*(?:$|#|\||<|```|---|[-*+] |\d+[.)] |\{\{)")  # blank, heading, table, HTML, fence, rule,
# a list item's start, a directive: lines that never continue the sentence above them


def join_soft_breaks(markdown: str) -> str:
    """Markdown whose paragraphs and list items are each one line: Marp renders every line break of a paragraph
    as a hard break, so a sentence wrapped in a deck's source would break mid-sentence on the slide. Code fences,
    HTML, tables and speaker notes (HTML comments) keep their lines."""
    lines = markdown.split("\n")
    head = 0
    if lines and lines[0].strip() == "---":  # the front matter (Marp's settings, one a line) stays as it is
        head = next((i for i in range(1, len(lines)) if lines[i].strip() == "---"), 0) + 1
    out: list[str] = lines[:head]
    fenced = comment = False
    prose = False  # whether the line above is prose that the next line may continue
    for line in lines[head:]:
        stripped = line.strip()
        if comment:
            out.append(line)
            comment = "-->" not in line
            continue
        if stripped.startswith("```"):
            fenced = not fenced
            out.append(line)
            prose = False
            continue
        if fenced:
            out.append(line)
            continue
        if stripped.startswith("<!--"):
            out.append(line)
            comment = "-->" not in stripped
            prose = False
            continue
        if prose and not _NOT_PROSE.match(line):
            out[-1] = f"{out[-1].rstrip()} {stripped}"
            continue
        out.append(line)
        prose = bool(stripped) and not _NOT_PROSE.match(line) or bool(re.match(r"\s*(?:[-*+] |\d+[.)] )", line))
    return "\n".join(out)


SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[A-Z0-9(])")


def whole_sentences(text: str, limit: int) -> str:
    """The leading sentences of ``text`` that fit in ``limit`` characters, at least the first one: a slide never shows
    a sentence cut off with "…", and the report keeps the rest."""
    text = text.strip().rstrip(";,").strip()
    kept = ""
    for sentence in SENTENCE_END.split(text):
        if kept and len(kept) + 1 + len(sentence) > limit:
            break
        kept = f"{kept} {sentence}" if kept else sentence
    return kept


def html_table(rendered) -> str:
    head = "".join(f"<th>{_html(h)}</th>" for h in rendered.headers)
    body = "".join("<tr>" + "".join(f'<td class="num">{_html(c)}</td>' if num else f"<td>{_html(c)}</td>"
                                    for c, num in zip(row, rendered.numeric)) + "</tr>"
                   for row in rendered.rows)
    return f'<div class="table"><table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table></div>'


class Renderer(CodeDirectives, FigureDirectives):
    def __init__(self, results: Results, deck: str):
        self.results = results
        self.deck = deck
        self.missing: list[str] = []  # notices on slides: what to run
        self.fallbacks: list[str] = []  # results taken from an older run or the reference run
        self.not_run: list[str] = []  # optional sections nothing has recorded yet
        self.sources: list[str] = []  # code and data the deck was built from
        self._init_figures()

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
        reason = self._value_quote(record, source, name, path)
        why = f' <span class="why">({_html(reason)})</span>' if reason else ""
        return f"{_html(text)}{unit}{mark}{why}"

    def _value_quote(self, record: dict, source: Source, name: str, path: str) -> str | None:
        """A value that is a training configuration's throughput is a quote too (``deck_quotes``)."""
        parts = PATH_PART.findall(path)
        if not parts or parts[-1] not in THROUGHPUT:
            return None
        if record.get("kind") == "train":
            return self.quote_record(name, source)
        row = _lookup(record, ".".join(parts[:-1])) if len(parts) > 1 else None
        reasons = self.quote_rows([row], source) if isinstance(row, dict) else []
        return reasons[0] if reasons else None

    def d_gpu(self, what: str, *args: str, **options: str) -> str:
        """What the kit measured on a GPU, with the GPU and the date, or that nothing was (``system.gpu_records``):
        ``{{gpu mfu}}`` (GPT-2 small), ``{{gpu simplecnn}}`` (per loader), ``{{gpu precision MODEL MODE}}``, and
        ``{{gpu gpt_time tokens=N batch=B gpus=G steps=S}}``: a job's time estimated from the measured rates."""
        from workshop_utils.system import gpu_records

        sentences = {"mfu": gpu_records.gpt_mfu_sentence, "simplecnn": gpu_records.simplecnn_sentence,
                     "precision": gpu_records.precision_sentence}
        sentences["gpt_time"] = gpt_time_estimate
        if what not in sentences:
            raise BuildError(f"{self.deck}: {{{{gpu {what}}}}}: no such GPU figure", f"use one of {sorted(sentences)}")
        self.sources.append("results/reference/gpu/: GPU records")
        try:
            return _html(sentences[what](*args, **options))
        except TypeError as err:
            raise BuildError(f"{self.deck}: {{{{gpu {what}}}}}: {err}", "see slides/README.md") from None

    def d_measured(self, name: str, notebook: str = "") -> str:
        """Small print under numbers quoted one by one from a training record (``{{value}}``): what ran, in the
        record's own settings, at which profile, in which run, at which commit, and the file:
        ``{{measured gpt notebook="01"}}``."""
        record, source = self.results.record(name)
        if record is None:
            return self.notice(f"record {name} is in no run folder and not in the reference results",
                               f"run `{RUN_FIRST}` first")
        env = record.get("environment") or source.environment
        self.provenance(f"values of {name}", source, env)  # a fallback is listed like every other
        profile = source.profile(notebook)
        run = "the reference run" if source.kind == "reference results" else f"run {source.folder.name}"
        commit = str(record.get("git_commit") or source.commit or "")[:7]
        line = (f"Measured by {f'notebook {notebook}' if notebook else 'its notebook'}"
                + (f" at its {profile} profile" if profile else "")
                + (f" ({config_words(record)})" if config_words(record) else "") + ": "
                f"{run} of {_date(env)}" + (f" at commit {commit}" if commit else "") + f", {_device(env)}; "
                f"{source.label}/results/{name}.json")
        self.sources.append(f"{source.label}/results/{name}.json")
        return f'<p class="fineprint">{_html(line)}</p>'

    def d_has(self, name: str, path: str = "") -> str:  # used only inside {{if}}: never rendered
        return ""

    def d_section(self, key: str, figure="auto", table="yes", text="no", rows="", height="380", layout="stack",
                  caption="", optional="no", notebook="", width="", explain="no") -> str:
        """A report section's table and figure on one slide, from the newest folder holding the section.

        ``figure``: "auto" (the section's first figure), a figure name, or "none"; ``table``: "yes"/"no";
        ``text``: "yes" shows the section's own sentence; ``layout``: "stack" or "side" (table beside the figure);
        ``explain``: "yes" adds what the measured numbers mean (``deck_notes``), under the table and figure.
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
        notes = []  # what a column means: read with the numbers, so larger than the small print
        parts, quoted = [], []  # quoted: the rows whose throughput the slide shows (deck_quotes)
        if _yes(text) and record.get("text"):
            parts.append(f'<p class="small">{_html(whole_sentences(record["text"], 420))}</p>')
        rows_data = table_rows(record)
        if _yes(table) and rows_data:
            rendered = curate(key, rows_data, int(rows) if rows else None)
            parts.append(html_table(rendered))
            notes = list(rendered.notes)
            fine = ([rendered.left_out] if rendered.left_out else []) + fine
            if any(h.startswith("Throughput") for h in rendered.headers):
                quoted += rendered.shown_rows
        figure_html = ""
        names = [Path(f).stem for f in record.get("figures") or [] if str(f).endswith(".png")]
        wanted = names[0] if figure == "auto" and names else None if figure in ("auto", "none") else figure
        if wanted:
            figure_html, used = self.figure_for(wanted, layout if parts else "stack", width, height, caption, source)
            if figure_html is None:
                figure_html = self.notice(f"figure {wanted}.png is not in {source.label} beside its section",
                                          f"run `{RUN_FIRST}` again: the notebook writes both")
            elif wanted in deck_charts.CHARTS and deck_charts.CHARTS[wanted].throughput and used:
                shown = {json.dumps(row, sort_keys=True, default=str) for row in quoted}
                quoted += [row for row in rows_data if json.dumps(row, sort_keys=True, default=str) not in shown]
        if layout == "side" and parts and figure_html:
            body = f'<div class="columns side"><div>{"".join(parts)}</div><div>{figure_html}</div></div>'
        else:
            body = "".join(parts) + figure_html
        if _yes(explain) and key in NOTES:  # under the table and the figure, the slide's full width
            body += "".join(f'<p class="explain">{paragraph}</p>'
                            for paragraph in NOTES[key](record, source.records.get))
        self.sources.append(f"{source.label}/results/section-{key}.json")
        small = "".join(f'<p class="note">{_html(line)}</p>' for line in notes) + \
            "".join(f'<p class="fineprint">{_html(line)}</p>' for line in fine)
        return f"{body}{self.why_html(self.quote_rows(quoted, source))}{small}"

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
            words = whole_sentences(record.get("text", ""), 220)
            where = self.provenance(f"section {record['name']}", source, record.get("environment"))
            items.append(f"<li><strong>{_html(record.get('title', record['name']))}</strong><br>"
                         f'<span class="small">{_html(words)}</span> '
                         f'<span class="fineprint">{_html(where)}</span></li>')
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

    def d_session(self, deck: str) -> str:
        """A session's heading, from ``SESSIONS`` (the handout's pages): its title, its time and parts, and the
        notebook files its live demo runs. ``deck`` is the session's deck, by name or number (``02``)."""
        session = session_of(deck) or next((s for s in SESSIONS if s.deck and s.deck.split("_")[0] == deck), None)
        if session is None:
            raise BuildError(f"{self.deck}: {{{{session {deck}}}}}: no session of the day has the deck {deck!r}",
                             "the sessions and their decks are SESSIONS in slides/deck_day.py")
        parts = [f"{minutes} min {what}" for minutes, what in
                 ((session.talk, "talk"), (session.demo, "live demo"), (session.exercise, "exercises"),
                  (session.questions, "questions")) if minutes]
        notebooks = []
        for number in session_notebooks(session):
            found = sorted((REPO / "notebooks").glob(f"{number}_*.ipynb"))
            notebooks.append(f"<code>notebooks/{_html(found[0].name)}</code>" if found
                             else f"notebook {number} (not in this checkout)")
            if found:
                self.sources.append(f"notebooks/{found[0].name}")
        runs = (f'<p class="notebooks">Runs {", ".join(notebooks)} — {_html(session.demo_what)}</p>'
                if notebooks else "")
        return (f"## {_html(session.title)}\n\n"
                f'<p class="when"><strong>{_html(session.when)}</strong> · {" · ".join(parts)}</p>\n{runs}')

    def d_agenda(self) -> str:
        """The day's plan, from ``SESSIONS``: the same table as in slides/INSTRUCTOR.md."""
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
        if primary.commit:
            line += f", at commit <code>{_html(primary.commit)}</code>"
        checkout = checkout_commit()
        if checkout and checkout != primary.commit:
            line += f"; code read from this checkout, commit <code>{_html(checkout)}</code>"
        if env.get("device_type") == "cpu":
            line += " — a CPU run: speeds show the method, not GPU performance"
        if self.fallbacks and self.deck == "handout":
            line += (f". {len(self.fallbacks)} item(s) on this handout come from an older run (marked old) or the "
                     "reference run (marked ref)")
        elif self.fallbacks:
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
        return join_soft_breaks(text.replace(RESULTS_MARK, self.results_line()))

    def _conditionals(self, text: str) -> str:
        """``{{if RECORD}}...{{else}}...{{end}}``: keep the branch that matches the results."""
        pattern = re.compile(r"\{\{if ([\w.-]+)\}\}(.*?)(?:\{\{else\}\}(.*?))?\{\{end\}\}", re.S)
        return pattern.sub(lambda m: m.group(2) if self.record(m.group(1)) else (m.group(3) or ""), text)

