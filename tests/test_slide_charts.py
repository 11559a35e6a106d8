"""The decks' charts are made for a projector, and each training configuration shows one throughput or says why.

Every chart a deck uses is drawn by the build from the recorded numbers (slides/deck_charts.py) at exactly its
size on a 1280x720 slide. These checks render every deck and the handout from the reference results, in Python
(no Marp, no browser), and inspect the figures the renderer kept:

* the smallest text of each chart is at least 18 px on the slide, computed from the figure's width in inches, the
  72 points an inch it is laid out at, the width it is placed at in the slide's HTML and each text's font size;
  (the browser test in test_slides.py checks that Chromium shows each chart at the width the HTML declares);
* legends sit outside the axes, never on the data, and no text leaves the figure;
* no tick, legend or label text is a code name (``simplecnn``, ``all_reduce``, ``2^8``, ``0.0e+00``, "303 us");
* every chart says what its numbers are: measured where, predicted from what, or estimated;
* each (model, configuration) whose throughput the decks quote shows one number, or its slide says why.

Deterministic: nothing here times anything or depends on the CPU; the same records give the same SVG bytes.
"""

from __future__ import annotations

import copy
import json
import os
import re
import sys
from pathlib import Path

import pytest
from helpers import load_slides_build

REPO = Path(__file__).resolve().parents[1]
SLIDES = REPO / "slides"
REFERENCE = REPO / "results" / "reference"
DECKS = sorted(p.stem for p in (SLIDES / "decks").glob("*.md"))


build = load_slides_build()
charts = sys.modules["deck_charts"]
labels = sys.modules["deck_labels"]
quotes = sys.modules["deck_quotes"]
tables = sys.modules["deck_tables"]

# Figures still shown as the notebook's PNG, and why: their data is not in the result records.
PNG_ONLY: dict[str, str] = {}

SNAKE = re.compile(r"\b[a-z0-9]+_[a-z0-9_]+\b")  # a code name such as samples_per_s
RAW = [(re.compile(r"\^"), "a power written with ^ (2^8)"),
       (re.compile(r"\d[eE][+-]?\d"), "exponent notation (0.0e+00)"),
       (re.compile(r"\d\s*us\b"), "microseconds as 'us'"),
       (re.compile(r"\$"), "TeX markup")]


@pytest.fixture(scope="module")
def rendered(tmp_path_factory):
    """Every deck and the handout rendered from the reference results alone: (name, text, renderer)."""
    saved = os.environ.get("WORKSHOP_RUNS")
    os.environ["WORKSHOP_RUNS"] = str(tmp_path_factory.mktemp("no-runs"))
    try:
        results = build.find_results(None, REFERENCE)
        out = []
        for deck in [*DECKS, "handout"]:
            path = SLIDES / "decks" / f"{deck}.md" if deck != "handout" else build.HANDOUT
            renderer = build.Renderer(results, deck)
            out.append((deck, renderer.render(path.read_text()), renderer))
        return out
    finally:
        if saved is None:
            os.environ.pop("WORKSHOP_RUNS")
        else:
            os.environ["WORKSHOP_RUNS"] = saved


def _uses(rendered):
    return [(deck, text, use) for deck, text, renderer in rendered for use in renderer.charts]


def _placed_width(text: str, name: str) -> set[int]:
    """The widths the slide's HTML gives the chart's image (the CSS width, which Chromium honours)."""
    return {int(w) for w in re.findall(rf'<img [^>]*style="width:(\d+)px;height:\d+px" data-chart="{name}"', text)}


# ------------------------------------------------------------------------------------------- font sizes


def test_every_figure_a_deck_shows_is_a_chart_drawn_from_the_records_or_a_known_exception(rendered):
    drawn = {use.name for _, _, use in _uses(rendered)}
    shown_as_png = {name for _, _, renderer in rendered for name in renderer.pngs}
    assert shown_as_png <= set(PNG_ONLY), f"PNG figures on the slides: {shown_as_png}"
    assert len(drawn) >= 15, drawn
    assert not [p for _, _, renderer in rendered for p in renderer.problems]


def test_every_chart_text_is_at_least_18_px_on_a_1280x720_slide(rendered):
    small = []
    for deck, text, use in _uses(rendered):
        placed = _placed_width(text, use.name)
        assert placed == {use.width}, f"{deck}: chart {use.name} placed at {placed}, drawn for {use.width}"
        # the figure is the slot's exact shape: no letterboxing that would scale it down in one direction
        width_in, height_in = use.figure.get_size_inches()
        assert (round(width_in * 72), round(height_in * 72)) == (use.width, use.height), use.name
        found = charts.inspect(use.figure, use.width)
        assert found.texts, f"{deck}: chart {use.name} has no text at all"
        small += [f"{deck}: {use.name}: {t.text!r} ({t.role}) at {t.font_px:.1f} px" for t in found.texts
                  if t.font_px < charts.MIN_FONT_PX - 1e-6]
    assert not small, "text below 18 px on a 1280x720 slide:\n" + "\n".join(small)


def test_the_font_check_sees_a_chart_shown_smaller_than_drawn(rendered):
    """The check above must fail where it should: a chart placed at half its width has 9 px text."""
    _, _, use = _uses(rendered)[0]
    assert charts.inspect(use.figure, use.width / 2).min_font_px == pytest.approx(charts.MIN_FONT_PX / 2)
    assert charts.inspect(use.figure, use.width).min_font_px >= charts.MIN_FONT_PX


def _placement_problems(found) -> list[str]:
    """Legends on the axes (where the data is) and text outside the figure."""
    problems = []
    width, height = found.size
    for legend in found.legends:
        for axes in found.axes:
            overlap_x = min(legend[2], axes[2]) - max(legend[0], axes[0])
            overlap_y = min(legend[3], axes[3]) - max(legend[1], axes[1])
            if overlap_x > 1 and overlap_y > 1:
                problems.append(f"a legend lies on the axes {axes} ({legend})")
    for t in found.texts:
        x0, y0, x1, y1 = t.box
        if x0 < -1 or y0 < -1 or x1 > width + 1 or y1 > height + 1:
            problems.append(f"{t.text!r} leaves the figure ({t.box})")
    return problems


def test_legends_sit_off_the_data_and_no_text_leaves_the_figure(rendered):
    problems = [f"{deck}: {use.name}: {p}" for deck, _, use in _uses(rendered)
                for p in _placement_problems(charts.inspect(use.figure, use.width))]
    assert not problems, "\n".join(problems)


def test_the_placement_check_sees_a_legend_on_the_data():
    data = charts.ChartData({}, 590, 300)
    with charts.matplotlib.rc_context(charts.STYLE):
        fig, ax = data.figure()
        ax.plot([1, 2, 3], [1, 3, 2], label="a line")
        ax.legend(loc="center")
    assert any("legend lies on the axes" in p for p in _placement_problems(charts.inspect(fig, 590)))


# ------------------------------------------------------------------------------------------- words


def test_no_chart_text_is_a_raw_code_name(rendered):
    raw = []
    for deck, _, use in _uses(rendered):
        for t in charts.inspect(use.figure, use.width).texts:
            words = t.text
            if SNAKE.search(words) or any(re.search(rf"\b{re.escape(c)}\b", words, re.I) for c in labels.CODE_NAMES):
                raw.append(f"{deck}: {use.name}: {words!r} is a code name")
            raw += [f"{deck}: {use.name}: {words!r}: {why}" for pattern, why in RAW if pattern.search(words)]
    assert not raw, "\n".join(raw)


@pytest.mark.parametrize("code, words", [("simplecnn", "SimpleCNN"), ("all_reduce", "all-reduce"),
                                         ("reduce_scatter", "reduce-scatter"), ("2^8", "256"),
                                         ("2^16", "65,536"), ("channels_last", "channels-last"),
                                         ("2x batch", "2× batch"), ("resnet18", "ResNet-18")])
def test_code_names_become_words(code, words):
    assert labels.human(code) == words


def test_numbers_carry_units_and_no_exponent():
    assert labels.fmt_ms(0.303) == "0.30 ms" and labels.fmt_ms(252.1) == "252 ms" and labels.fmt_ms(1520) == "1.52 s"
    assert labels.fmt_bytes(4096) == "4 KiB" and labels.fmt_bytes(16 * 2**20) == "16 MiB"
    assert labels.fmt_sig(0.0) == "0" and labels.fmt_sig(0.000401, 2) == "0.0004" and labels.fmt_sig(97.18) == "97.2"
    assert labels.power_of_two("2^8") == "2⁸"


def test_every_chart_says_what_its_numbers_are(rendered):
    for deck, text, use in _uses(rendered):
        assert re.match(r"(measured|predicted|estimated)\b", use.what), f"{deck}: {use.name}: {use.what!r}"
        caption = re.search(rf'data-chart="{use.name}"[^>]*><figcaption>(.*?)</figcaption>', text).group(1)
        assert use.what.split(";")[0].replace("'", "&#x27;")[:30] in caption.replace("'", "&#x27;")
    predicted = next(use for _, _, use in _uses(rendered) if use.name == "ddp_predicted_scaling")
    # its GPU step: measured (on the GPU and date a record names) or an estimate said to be one
    gpu_step = re.search(r"GPU step measured on one .+?, \d{4}-\d{2}-\d{2}", predicted.what)
    assert gpu_step or ("estimated" in predicted.what and "not measured" in predicted.what), predicted.what
    assert "the star measured on" in predicted.what
    for deck, text, renderer in rendered:  # the PNGs left say so too
        for name in renderer.pngs:
            assert "the notebook's own chart (its data is not in the records)" in text, (deck, name)


def test_the_monitor_is_drawn_from_the_samples_notebook_04_records():
    """The reference run's own samples, drawn at the slide's size with the checks every chart gets; a run recorded
    before notebook 04 kept its samples still shows the notebook's PNG."""
    section = json.loads((REFERENCE / "results" / "section-monitor.json").read_text())
    samples = json.loads((REFERENCE / "results" / "monitor.json").read_text())
    drawn = charts.draw("monitor", {"section-monitor": section, "monitor": samples}, 1152, 380)
    found = charts.inspect(drawn.figure, 1152)
    assert drawn.what.startswith(f"measured: {len(samples['samples'])} samples")
    assert found.min_font_px >= charts.MIN_FONT_PX and found.legends and not any(SNAKE.search(t.text) for t in found.texts)
    assert charts.draw("monitor", {"section-monitor": section}, 1152, 380) is None


def test_charts_are_deterministic_svg():
    section = json.loads((REFERENCE / "results" / "section-ladder.json").read_text())
    one = charts.draw("optimization_ladder", {"section-ladder": section}, 590, 300)
    charts._DRAWN.clear()  # drawn again, not taken from the build's cache
    two = charts.draw("optimization_ladder", {"section-ladder": copy.deepcopy(section)}, 590, 300)
    first, again = charts.to_svg(one.figure), charts.to_svg(two.figure)
    assert two.figure is not one.figure and first == again
    assert first.startswith(b"<?xml") and b"<text" not in first  # text drawn as outlines: no font needed


# ------------------------------------------------------------------------------------------- one number a configuration


def test_each_configuration_shows_one_throughput_or_says_why(rendered):
    by_key: dict[tuple, list] = {}
    for deck, text, renderer in rendered:
        for quote in renderer.quotes:
            by_key.setdefault(quote.key, []).append((deck, text, quote))
    assert by_key, "no throughput of a training configuration was quoted: the bookkeeping is not wired"
    # The results the decks were rendered from (the reference alone), not whatever run folders this session made.
    configurations = quotes.Configurations(rendered[0][2].results)
    unexplained = []
    for key, quoted in by_key.items():
        reference = configurations.reference(key)
        reference_text = quotes.shown(configurations.reference_entry(key).value)
        for deck, text, quote in quoted:
            if quote.shown == reference_text:
                assert quote.reason is None
                continue
            if not quote.reason:
                unexplained.append(f"{deck}: {quotes.describe(key)}: {quote.shown} {quote.unit} ({quote.record}) "
                                   f"against {reference_text} ({reference}), no reason")
            elif _html(quote.reason) not in text:
                unexplained.append(f"{deck}: the reason for {quote.record} is not on its slide")
    assert not unexplained, "\n".join(unexplained)
    # The baseline configuration is quoted by several decks and sweeps: the check is not vacuous.
    baseline_key = configurations.key("baseline")
    assert {q.record for _, _, q in by_key[baseline_key]} >= {"baseline", "ladder-0-baseline", "batch-64",
                                                              "loader-w0-pin0", "strong-1"}


def _html(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;").replace('"', "&quot;")


def _train(name: str, samples_per_s: float, threads: int, steps: int, **config) -> dict:
    base = {"model": "simplecnn", "precision": "fp32", "batch_size": 64, "accumulation_steps": 1, "loader": "torch",
            "num_workers": 0, "seed": 0}
    env = {"device_type": "cpu", "device_name": "x86_64", "hostname": "h", "cpu_cores": 2, "cpu_threads": threads}
    return {"name": name, "kind": "train", "config": {**base, **config}, "environment": env,
            "metrics": {"samples_per_s": samples_per_s, "timed_steps": steps, "world_size": 1}}


def test_a_reason_names_what_differs_threads_device_or_a_separate_short_run(tmp_path):
    build_results = sys.modules["deck_results"]
    records = {r["name"]: r for r in (_train("baseline", 422.0, 2, 91), _train("sweep-64", 352.4, 2, 4),
                                      _train("ddp-1", 164.6, 1, 11), _train("other-batch", 300.0, 2, 4, batch_size=32))}
    moved = _train("elsewhere", 900.0, 2, 50)
    moved["environment"]["device_name"] = "another-cpu"
    records["elsewhere"] = moved
    results = build_results.Results([build_results.Source(tmp_path, "reference results", records)])
    configurations = quotes.Configurations(results)
    assert configurations.reference(configurations.key("sweep-64")) == "baseline"
    assert configurations.reason("baseline") is None and configurations.reason("other-batch") is None
    assert "1 CPU thread per process, the baseline 2" in configurations.reason("ddp-1")
    separate = configurations.reason("sweep-64")
    assert "separate, shorter run (4 timed steps)" in separate and "352–900" not in separate
    assert "352–422 samples/s" in separate  # the spread of the runs on the same machine with the same threads
    assert "another-cpu" in configurations.reason("elsewhere")
    # a row of a section's table is matched to the record whose number it copies
    assert configurations.match({"samples_per_s": 352.4}, results.sources[0]) == "sweep-64"
    assert configurations.match({"samples_per_s": 353.0}, results.sources[0]) is None


def test_a_row_from_an_older_folder_is_matched_to_that_folder_s_record(tmp_path):
    """A newer run that has not yet written its section: the slide shows the older folder's row, and its reason
    compares that folder's record (not the newer copy of the same name) with the newest baseline."""
    build_results = sys.modules["deck_results"]
    newer = {r["name"]: r for r in (_train("baseline", 160.0, 2, 91), _train("sweep-64", 120.0, 2, 4))}
    older = {r["name"]: r for r in (_train("baseline", 422.0, 2, 91), _train("sweep-64", 352.4, 2, 4))}
    results = build_results.Results([build_results.Source(tmp_path / "new", "run folder", newer),
                                     build_results.Source(tmp_path / "old", "run folder", older)])
    configurations = quotes.Configurations(results)
    old_source = results.sources[1]
    assert configurations.match({"samples_per_s": 352.4}, old_source) == "sweep-64"
    quote = configurations.quote("03", "sweep-64", old_source)
    assert quote.shown == "352" and "352 samples/s here, 160 there" in quote.reason
    assert f"in {old_source.label}" in quote.reason


# ------------------------------------------------------------------------------------------- deck 04's I/O slide


def test_the_io_slide_has_one_baseline_per_column_and_explains_the_page_cache(rendered):
    text = next(t for deck, t, _ in rendered if deck == "04_slurm")
    slide = next(s for s in text.split("\n---\n") if "## Data on a parallel file system" in s)
    table = re.search(r"<table>.*?</table>", slide, re.S).group(0)
    headers = re.findall(r"<th>(.*?)</th>", table)
    rows = [re.findall(r"<td[^>]*>(.*?)</td>", row) for row in re.findall(r"<tr>(.*?)</tr>", table)[1:]]
    ratio_columns = [i for i, h in enumerate(headers) if h.startswith("vs. ")]
    assert len(ratio_columns) == 2, headers
    for i in ratio_columns:  # each ratio column: its first number is its one baseline, 1.00
        cells = [row[i] for row in rows if row[i] != "–"]
        assert cells and cells[0] == "1.00" and cells.count("1.00") == 1, (headers[i], cells)
    io = json.loads((REFERENCE / "results" / "section-io.json").read_text())
    small, shards = (next(r for r in io["table"] if r["layout"] == name) for name in ("small files", "shards"))
    explained = " ".join(re.findall(r'<p class="explain">(.*?)</p>', slide))
    assert "page cache" in explained and "not measured here" in explained and "parallel file system" in explained
    assert f"{small['samples_per_s']:,.0f}" in explained and f"{shards['samples_per_s']:,.0f}" in explained
    assert f"{shards['samples_per_s'] / small['samples_per_s']:.2f}×" in explained  # from the measured numbers
    assert f"{small['files']:,.0f} opens" in explained


def test_the_io_explanation_follows_the_numbers():
    note = sys.modules["deck_notes"].io_note
    rows = [{"layout": "small files", "files": 100.0, "mib_on_disk": 1.0, "samples_per_s": 100.0},
            {"layout": "shards", "files": 2.0, "mib_on_disk": 1.5, "samples_per_s": 300.0}]
    faster = " ".join(note({"table": rows}))
    assert "3.00×" in faster and "nothing to save" not in faster and "not measured here" in faster
    assert note({"table": rows[:1]}) == []  # without both rows it says nothing rather than guess


# ------------------------------------------------------------------------------------------- the build's modules


def test_the_build_is_split_into_modules_under_600_lines():
    sizes = {p.name: len(p.read_text().splitlines()) for p in SLIDES.glob("*.py")}
    assert {"build.py", "deck_results.py", "deck_render.py", "deck_charts.py", "deck_tables.py"} <= set(sizes)
    assert all(n < 600 for n in sizes.values()), sizes
