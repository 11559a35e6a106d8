"""Figures on the slides: charts drawn at the slide's size from the records, else the run's own PNG.

``FigureDirectives`` is the part of the deck renderer (``deck_render.Renderer``) that places a figure: a name
with a chart in ``deck_charts`` is drawn from the records it reads, as SVG at exactly its size on the slide, and
captioned with what its numbers are (measured where, predicted from what, estimated); any other name is the
PNG of the newest folder holding ``figures/<name>.png``, as the notebook drew it. It also keeps the throughputs
a deck shows per training configuration (``deck_quotes``) and the reason a number differs from the
configuration's reference, which the slide prints beside it.
"""

from __future__ import annotations

import base64
from dataclasses import dataclass

import deck_charts
from deck_code import _html, _yes
from deck_quotes import Configurations, Quote
from deck_results import RUN_FIRST, Source

# What a figure of the run shows: the notebook's PNGs are measurements unless a directive says otherwise.
PNG_KIND = "measured"


@dataclass
class ChartUse:
    """A chart a deck shows: its figure, its size on the slide (CSS pixels at 1280x720) and what it shows."""

    deck: str
    name: str
    width: int
    height: int
    figure: object  # matplotlib.figure.Figure
    what: str
    caption: str


class FigureDirectives:
    """Figures and throughput quotes; rely on the renderer's ``results``, ``deck``, ``provenance``, ``notice``."""

    def _init_figures(self) -> None:
        self.charts: list[ChartUse] = []  # every chart this deck drew
        self.pngs: list[str] = []  # figures shown as the run's PNG (no chart draws them from the records)
        self.problems: list[str] = []  # charts that could not be drawn from their records (the PNG shown instead)
        self.quotes: list[Quote] = []  # every throughput of a training configuration this deck shows
        self._configurations: Configurations | None = None

    # throughput per configuration --------------------------------------------------------------------

    @property
    def configurations(self) -> Configurations:
        if self._configurations is None:
            self._configurations = Configurations(self.results)
        return self._configurations

    def quote_record(self, name: str, source: Source | None = None) -> str | None:
        """Note that this deck shows record ``name``'s throughput (as ``source`` holds it); the reason it differs,
        if it must say one."""
        quote = self.configurations.quote(self.deck, name, source)
        if quote is None:
            return None
        self.quotes.append(quote)
        return quote.reason

    def quote_rows(self, rows: list[dict], source: Source) -> list[str]:
        """Note the throughputs of a table's rows; the reasons the slide must print, each once."""
        reasons = []
        for row in rows:
            name = self.configurations.match(row, source)
            reason = self.quote_record(name, source) if name else None
            if reason and reason not in reasons:
                reasons.append(reason)
        return reasons

    @staticmethod
    def why_html(reasons: list[str]) -> str:
        return "".join(f'<p class="why">{_html(reason)}</p>' for reason in reasons)

    # charts ------------------------------------------------------------------------------------------

    @staticmethod
    def slot_width(layout: str, width: str = "") -> int:
        """A figure's width on the slide: the figure column of layout="side", else the slide's content width."""
        if width:
            return int(width)
        return deck_charts.SIDE_WIDTH if layout == "side" else deck_charts.CONTENT_WIDTH

    def chart_html(self, name: str, width: int, height: int, caption: str, prefer: Source | None = None):
        """The chart ``name`` drawn from its records (those of ``prefer``, the section's folder, first), as HTML,
        and the records it read by name; (None, {}) when no chart draws it or its records are missing."""
        chart = deck_charts.CHARTS.get(name)
        if chart is None:
            return None, {}
        records, environments, sources = {}, {}, {}
        for record_name in (*chart.needs, *chart.optional):
            if prefer is not None and record_name in prefer.records:
                record, source = prefer.records[record_name], prefer
            else:
                record, source = self.results.record(record_name)
            if record is None:
                if record_name in chart.needs:
                    return None, {}
                continue
            records[record_name], sources[record_name] = record, source
            environments[record_name] = record.get("environment") or source.environment
        try:
            drawn = deck_charts.draw(name, records, width, height, environments)
        except (KeyError, TypeError, ValueError, IndexError, ZeroDivisionError, AttributeError) as err:
            self.problems.append(f"{self.deck}: chart {name} could not be drawn from its records ({err!r}); "
                                 "the run's PNG is shown instead")
            return None, {}
        if drawn is None:  # the records lack what the chart needs (an older run): the PNG instead
            return None, {}
        self.charts.append(ChartUse(self.deck, name, width, height, drawn.figure, drawn.what, caption))
        data = base64.b64encode(deck_charts.to_svg(drawn.figure)).decode()
        fine = [self.provenance(f"chart {name}: {record_name}", source, environments[record_name])
                for record_name, source in sources.items() if source is not prefer]
        html = (f'<figure class="chart"><img src="data:image/svg+xml;base64,{data}" width="{width}" '
                f'height="{height}" style="width:{width}px;height:{height}px" data-chart="{_html(name)}" '
                f'alt="{_html(caption or name)}"><figcaption>{_html(caption or name)}'
                f'<span class="what"> · {_html(drawn.what)}</span></figcaption></figure>'
                + "".join(f'<p class="fineprint">{_html(line)}</p>' for line in dict.fromkeys(fine)))
        return html, {n: (records[n], sources[n]) for n in records}

    def png_html(self, path, name: str, height: str, caption: str, where: str, kind: str = PNG_KIND,
                 env: dict | None = None) -> str:
        """The run's own PNG, inlined, its caption saying what it shows and that it is the notebook's chart."""
        from deck_labels import device_words

        self.pngs.append(name)
        data = base64.b64encode(path.read_bytes()).decode()
        what = f"{kind} on {device_words(env or {})}; the notebook's own chart (its data is not in the records)"
        return (f'<figure><img src="data:image/png;base64,{data}" style="max-height:{int(height)}px" '
                f'alt="{_html(caption or name)}"><figcaption>{_html(caption or name)}'
                f'<span class="what"> · {_html(what)}</span></figcaption></figure>'
                + (f'<p class="fineprint">{_html(where)}</p>' if where else ""))

    def figure_for(self, name: str, layout: str, width: str, height: str, caption: str, prefer: Source | None,
                   kind: str = PNG_KIND):
        """A section's or a slide's figure: the chart drawn from the records, else the PNG of ``prefer`` (the
        section's folder) or of the newest folder holding it. Returns (html, the chart's records or {})."""
        html, used = self.chart_html(name, self.slot_width(layout, width), int(height), caption, prefer)
        if html:
            return html, used
        path, source = (prefer.figure(name), prefer) if prefer is not None else self.results.figure(name)
        if path is None:
            return None, {}
        where = "" if prefer is not None else self.provenance(f"figure {name}", source)
        return self.png_html(path, name, height, caption, where, kind, source.environment), {}

    def d_figure(self, name: str, height="470", caption="", optional="no", width="", kind=PNG_KIND) -> str:
        """A chart drawn from the records it reads, or the PNG of the newest folder holding ``figures/<name>.png``,
        inlined, with a one-line caption that says what it shows."""
        html, used = self.figure_for(name, "stack", width, height, caption, None, kind)
        if html is None:
            if _yes(optional):
                return self.not_yet(f"figure {name}.png", f"It appears after `{RUN_FIRST}`.")
            return self.notice(f"figure figures/{name}.png is in no run folder and not in the reference results",
                               f"run `{RUN_FIRST}` first (the notebook that draws it writes it into the run folder)")
        return html
