"""The slide decks: results per section, tables made for reading, slide budgets, and every deck in a real Chromium.

Most checks render the deck templates in Python (no Marp, no browser) against run folders written by the
tests themselves: a complete older run, a newer run that holds one notebook's results only, and a reference
folder, so that each section's source can be asserted. The browser tests then build every deck (HTML and
PDF) from a copy of the real reference results and load each one in headless Chromium over the DevTools
protocol (``websocket-client``): no request may leave ``file:``/``data:``, no console error, every slide renders
at 1280x720 with nothing outside the slide or clipped, and the PDF has one page per slide. Screenshots of every
slide go to test-artifacts/slides/<deck>/. Chromium and its child processes are started here and stopped by pid.
"""

from __future__ import annotations

import base64
import importlib.util
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import zlib
from pathlib import Path

import pytest
from helpers import load_slides_build

REPO = Path(__file__).resolve().parents[1]
SLIDES = REPO / "slides"
REFERENCE = REPO / "results" / "reference"
ARTIFACTS = REPO / "test-artifacts" / "slides"
VIEWPORT = (1280, 720)  # Marp's slide size: at this viewport one CSS pixel of the slide is one screen pixel
DECKS = sorted(p.stem for p in (SLIDES / "decks").glob("*.md"))
SNAKE = re.compile(r"\b[a-z0-9]+_[a-z0-9_]+\b")  # a code name such as samples_per_s


build = load_slides_build()
tables = sys.modules["deck_tables"]
CHROMIUM = build.chromium_path()
NODE = shutil.which("node")
needs_browser = pytest.mark.skipif(CHROMIUM is None or NODE is None,
                                   reason="slide browser tests need Chromium (apt-get install chromium) and "
                                          "Node.js (apt-get install nodejs npm); "
                                          f"found chromium={CHROMIUM}, node={NODE}")


# ------------------------------------------------------------------------------------------- run folders


def _env(date: str, device: str) -> dict:
    return {"device_type": "cpu", "device_name": device, "gpus": [], "torch": "x", "cuda": None, "cudnn": None,
            "nccl": None, "python": "3", "cpu_cores": 2, "hostname": "test", "date": f"{date}T00:00:00+00:00",
            "slurm": {}}


def _figure(path: Path, color=(70, 130, 180)) -> None:
    from PIL import Image, ImageDraw

    path.parent.mkdir(parents=True, exist_ok=True)
    image = Image.new("RGB", (1000, 420), "white")
    draw = ImageDraw.Draw(image)
    for i in range(10):
        draw.rectangle([60 + i * 90, 360 - i * 30, 120 + i * 90, 380], fill=color)
    image.save(path)


def copy_sections(source: Path, target: Path, env: dict, keep=lambda record: True, commit: str = "0000000") -> Path:
    """A run folder with the chosen records of ``source`` (real shapes), stamped with ``env`` and ``commit``, and their
    figures."""
    (target / "results").mkdir(parents=True, exist_ok=True)
    for path in sorted((source / "results").glob("*.json")):
        record = json.loads(path.read_text())
        if not keep(record):
            continue
        record["environment"], record["git_commit"] = env, commit
        (target / "results" / path.name).write_text(json.dumps(record))
        for figure in record.get("figures") or []:
            _figure(target / figure)
    return target


def notebook_of(record: dict) -> int | None:
    return int(record["order"]) if record.get("kind") == "section" else None


@pytest.fixture(scope="module")
def three_folders_once(tmp_path_factory):
    base = tmp_path_factory.mktemp("folders")
    runs = base / "runs"
    reference = copy_sections(REFERENCE, base / "reference", _env("2026-01-01", "ref-cpu"), commit="1111111")
    for figure in (REFERENCE / "figures").glob("*.png"):
        shutil.copy(figure, reference / "figures" / figure.name)
    # The older run lacks notebook 05 (it failed there) and the baseline record.
    copy_sections(REFERENCE, runs / "20260201-090000", _env("2026-02-01", "old-cpu"),
                  lambda r: notebook_of(r) in (1, 2, 3, 4) and r.get("name") != "baseline", commit="2222222")
    copy_sections(REFERENCE, runs / "20260301-090000-profiling", _env("2026-03-01", "new-cpu"),
                  lambda r: notebook_of(r) == 4, commit="3333333")
    (runs / "20260302-000000").mkdir()  # a run that recorded nothing yet is passed over
    return base


@pytest.fixture
def three_folders(three_folders_once, tmp_path, monkeypatch):
    """The reference results, an older complete run, and a newer run of notebook 04 alone (its own run folder)."""
    shutil.copytree(three_folders_once, tmp_path, dirs_exist_ok=True)
    monkeypatch.setenv("WORKSHOP_RUNS", str(tmp_path / "runs"))
    return tmp_path / "reference"


def render(results, deck: str, text: str):
    renderer = build.Renderer(results, deck)
    return renderer.render(text), renderer


# ------------------------------------------------------------------------------------------- results per section


def test_no_results_anywhere_names_make_run(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("WORKSHOP_RUNS", str(tmp_path / "runs"))
    code = build.main(["--reference", str(tmp_path / "reference"), "--out", str(tmp_path / "out"), "--html-only"])
    err = capsys.readouterr().err
    assert code == 2 and "No results" in err and "make run" in err
    code = build.main(["--run-dir", str(tmp_path / "nowhere"), "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert code == 2 and "does not exist" in err and "make run" in err


def test_folders_are_searched_newest_first_then_the_reference(three_folders, tmp_path):
    results = build.find_results(None, three_folders)
    assert [s.folder.name for s in results.sources] == ["20260301-090000-profiling", "20260201-090000", "reference"]
    assert [s.kind for s in results.sources] == ["run folder", "run folder", "reference results"]
    given = build.find_results(str(tmp_path / "runs" / "20260201-090000"), three_folders)
    assert [s.kind for s in given.sources] == ["given run folder", "reference results"]


def test_each_section_comes_from_the_newest_run_that_has_it(three_folders):
    results = build.find_results(None, three_folders)
    text, renderer = render(results, "03_optimization", "{{results}}\n\n{{section ladder}}\n\n---\n\n"
                                                         "{{section precision-modes}}\n\n---\n\n"
                                                         "{{section beyond-fsdp}}\n\n---\n\n"
                                                         "{{value baseline metrics.samples_per_s}}")
    slides = text.split("\n---\n")
    assert "Not built" not in text and renderer.missing == []
    # notebook 04 ran on its own last: its section is the newest run's, with no fallback note
    assert "new-cpu" in slides[0] and "not in the newest run" not in slides[0].split("</p>", 1)[1]
    # notebook 03 is only in the older complete run
    assert "not in the newest run: from run 20260201-090000 of 2026-02-01 at commit 2222222, old-cpu (cpu)" in slides[1]
    # notebook 05 failed in the older run and was not run since: the reference, said in small print
    assert "not in the newest run: from the reference run of 2026-01-01 at commit 1111111, ref-cpu (cpu)" in slides[2]
    assert 'class="fineprint"' in slides[2]
    assert 'class="from"' in slides[3]  # a value from the reference is marked where it stands
    assert renderer.fallbacks == [
        "03_optimization: section precision-modes from run 20260201-090000 of 2026-02-01 at commit 2222222, "
        "old-cpu (cpu)",
        "03_optimization: section beyond-fsdp from the reference run of 2026-01-01 at commit 1111111, ref-cpu (cpu)",
        "03_optimization: values of baseline from the reference run of 2026-01-01 at commit 1111111, ref-cpu (cpu)"]
    assert "3 item(s) in this deck come from an older run or the reference run" in slides[0]


def test_a_figure_comes_with_its_section_and_a_missing_one_is_a_notice(three_folders, tmp_path):
    results = build.find_results(None, three_folders)
    text, renderer = render(results, "x", "{{section ladder}}")
    # The ladder's chart is drawn from the section's own table, at its size on the slide: no PNG needed.
    assert "data:image/svg+xml;base64," in text and [c.name for c in renderer.charts] == ["optimization_ladder"]
    newest = tmp_path / "runs" / "20260301-090000-profiling"
    (newest / "figures" / "optimization_ladder.png").unlink()
    text, renderer = render(results, "x", "{{section ladder}}")
    assert "data:image/svg+xml;base64," in text and renderer.missing == []
    # The monitor is drawn from the samples notebook 04 keeps (results/monitor.json).
    text, renderer = render(results, "x", "{{section monitor}}")
    assert "data:image/svg+xml;base64," in text and renderer.pngs == []
    # A run recorded before the samples were kept: no chart can be drawn, so the run's PNG, beside its section.
    for samples in tmp_path.rglob("monitor.json"):
        samples.unlink()
    results = build.find_results(None, three_folders)
    text, renderer = render(results, "x", "{{section monitor}}")
    assert "data:image/png;base64," in text and renderer.pngs == ["monitor"] and "notebook's own chart" in text
    (newest / "figures" / "monitor.png").unlink()
    text, renderer = render(results, "x", "{{section monitor}}")
    assert 'class="missing"' in text and "make run" in renderer.missing[0]
    text, renderer = render(results, "x", "{{figure nowhere_to_be_found}}")
    assert 'class="missing"' in text and "nowhere_to_be_found" in renderer.missing[0]


def test_a_notebook_not_run_yet_is_small_print_not_a_failure(three_folders):
    results = build.find_results(None, three_folders)
    text, renderer = render(results, "04_slurm", '{{notebook 06 optional="yes"}}\n\n'
                                                 '{{section slurm-jobs optional="yes" notebook="06"}}\n\n'
                                                 '{{cell 99 contains="x" optional="yes"}}')
    # Notebook 06 exists and its section is in the reference run; the section and notebook 99 are not.
    assert text.count("Not run yet") == 2 and "Not built" not in text
    assert renderer.missing == [] and len(renderer.not_run) == 2
    text, renderer = render(results, "04_slurm", "{{notebook 04}}")
    assert "Data loading" in text and "new-cpu" in text and renderer.not_run == []


def test_sections_gives_one_slide_per_section_each_from_its_newest_folder(three_folders):
    results = build.find_results(None, three_folders)
    text, renderer = render(results, "x", "{{sections 3 5}}")
    slides = text.split("\n\n---\n\n")
    expected = [r for r in _reference_sections().values() if 3 <= r["order"] < 5]
    assert len(slides) == len(expected) and renderer.missing == []
    assert all(s.startswith("<!-- _class: results -->") for s in slides)
    assert "old-cpu" in slides[0] and "new-cpu" in slides[-1]


@pytest.mark.slow
@needs_browser
def test_the_build_prints_what_it_fell_back_on(three_folders, tmp_path, capsys):
    if not (SLIDES / "node_modules" / ".bin" / "marp").exists():
        pytest.skip("needs Marp CLI (npm ci --prefix slides)")
    out = tmp_path / "out"
    assert build.main(["--reference", str(three_folders), "--out", str(out), "--html-only", "--deck", "03",
                       "--deck", "05"]) == 0
    printed = capsys.readouterr().out
    assert "Fell back on older results" in printed
    assert "05_beyond_data_parallel: section beyond-fsdp from the reference run of 2026-01-01" in printed
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["missing"] == [] and manifest["results"]["folder"].endswith("20260301-090000-profiling")
    html = (out / "03_optimization.html").read_text()
    assert "Not built" not in html and "from run 20260201-090000" in html


# ------------------------------------------------------------------------------------------- tables


def _reference_sections() -> dict[str, dict]:
    return {p.stem.removeprefix("section-"): json.loads(p.read_text())
            for p in sorted((REFERENCE / "results").glob("section-*.json"))}


@pytest.mark.parametrize("key", sorted(_reference_sections()))
def test_every_section_table_fits_a_slide_and_reads_like_prose(key):
    rows = _reference_sections()[key]["table"]
    if not rows:
        pytest.skip("a section without a table")
    shown = tables.curate(key, rows)
    assert 0 < len(shown.headers) <= tables.MAX_COLUMNS and len(shown.rows) <= tables.MAX_ROWS
    assert not [h for h in shown.headers if SNAKE.search(h)], shown.headers
    assert key in tables.TABLES, f"section {key} has no chosen columns in slides/deck_tables.py"
    for row in shown.rows:
        for cell in row:  # numbers rounded to what a reader compares: no long tails of decimals
            for whole, decimals in re.findall(r"(\d[\d,]*)\.(\d+)", cell):
                assert len(decimals) <= 2 or whole == "0" and len(decimals.lstrip("0")) <= 3, \
                    f"{key}: {cell} is not rounded"


def test_a_table_drops_empty_columns_and_their_notes_and_says_what_it_left_out():
    rows = [{"rung": f"r{i}", "samples_per_s": 100.0 + i, "vs_previous": 1.0, "vs_baseline": 1.0, "mfu": None}
            for i in range(12)]
    shown = tables.curate("ladder", rows)
    assert "MFU (%)" not in shown.headers and shown.notes == []
    assert len(shown.rows) == 8 and "first 8 of 12 rows" in shown.left_out
    rows[0]["mfu"] = 0.1234
    rows[1]["note"] = "not applicable: CUDA graphs need a GPU"
    shown = tables.curate("ladder", rows)
    assert "MFU (%)" in shown.headers and "12.3" in shown.rows[0] and "BF16 rung" in shown.notes[0]
    assert "Note" not in shown.headers and shown.notes[1] == "r1: not applicable: CUDA graphs need a GPU"
    wide = [{f"some_value_{c}": c * 1.23456 for c in range(9)}]
    shown = tables.curate("a-new-section", wide)
    assert len(shown.headers) == 6 and "3 more column(s)" in shown.left_out
    assert shown.headers[0] == "Some value 0" and shown.rows[0][1] == "1.23"


def test_a_ladder_ratio_shows_its_per_pass_range_and_an_uncredited_one_its_reason():
    rows = [{"rung": "baseline", "samples_per_s": 100.0, "vs_previous": None, "vs_baseline": 1.0, "note": ""},
            {"rung": "channels_last", "samples_per_s": 150.0, "vs_previous": 1.5, "vs_previous_min": 1.4545,
             "vs_previous_max": 1.5556, "vs_baseline": 1.5, "vs_baseline_min": 1.4545, "vs_baseline_max": 1.5556,
             "note": ""},
            {"rung": "fused optimizer", "samples_per_s": 151.0, "vs_previous": None, "vs_previous_min": 0.96,
             "vs_previous_max": 1.06, "vs_baseline": 1.51, "vs_baseline_min": 1.41, "vs_baseline_max": 1.6,
             "note": "no measurable change against the rung below (per-pass ratios 0.96–1.06x)"}]
    shown = tables.curate("ladder", rows)
    gain, baseline_ratio = (shown.headers.index(h) for h in ("This rung's gain (×)", "Against the baseline (×)"))
    assert shown.rows[1][gain] == "1.50 (1.45–1.56)" and shown.rows[2][gain] == "–"
    assert shown.rows[2][baseline_ratio] == "1.51 (1.41–1.60)" and shown.rows[0][baseline_ratio] == "1.00"
    assert shown.notes == [f"fused optimizer: {rows[2]['note']}"]


def test_human_headers_and_rounding():
    assert tables.human_header("self_cpu_ms") == "Self CPU (ms)"
    assert tables.human_header("peak_memory_mib") == "Peak memory (MiB)"
    assert tables.human_header("samples_per_s") == "Throughput (samples/s)"
    assert tables.human_header("tokens_per_s") == "Tokens/s"
    assert [tables.format_cell(v) for v in (505.8621, 14.576, 0.1224, 1234567.0, None, float("nan"), True)] == \
        ["506", "14.6", "0.122", "1,234,567", "–", "–", "yes"]
    assert tables.format_cell(0.0656, "pct1") == "6.6" and tables.format_cell(16777216, "mib_from_bytes") == "16"


# ------------------------------------------------------------------------------------------- the day


def test_the_sessions_fill_their_slots_and_the_instructor_guide_agenda_matches():
    readme = (SLIDES / "INSTRUCTOR.md").read_text()
    for session in build.SESSIONS:
        if session.deck:
            parts = session.talk + session.demo + session.exercise + session.questions
            assert parts == session.minutes, f"{session.title}: parts add up to {parts}, slot is {session.minutes}"
            assert (SLIDES / "decks" / f"{session.deck}.md").is_file()
            low, high = session.budget
            assert 2 * low <= session.talk + 2 and 3 * high >= session.talk
        assert f"| {session.when} | {session.title} |" in readme, f"slides/INSTRUCTOR.md lacks the row of {session.title}"
    assert {s.deck for s in build.SESSIONS if s.deck} == set(DECKS)


def test_decks_show_no_source_document_paths():
    for deck in DECKS:
        assert "sources/" not in (SLIDES / "decks" / f"{deck}.md").read_text(), deck


@pytest.mark.slow
def test_deck_templates_render_within_their_budgets_from_the_reference(tmp_path, monkeypatch):
    """Counted on the template (slides are separated by ---), so the budget is checked without Marp."""
    monkeypatch.setenv("WORKSHOP_RUNS", str(tmp_path / "runs"))
    results = build.find_results(None, REFERENCE)
    for deck in DECKS:
        text, renderer = render(results, deck, (SLIDES / "decks" / f"{deck}.md").read_text())
        body = text.split("\n---\n", 1)[1]  # after the front matter
        slides = len(re.findall(r"^---$", body, re.M)) + 1
        low, high = build.session_of(deck).budget
        assert low <= slides <= high, f"{deck}: {slides} slides, budget {low}-{high}"
        assert renderer.missing == [], renderer.missing
        for table in re.findall(r'<div class="table"><table>.*?</table>', text, re.S):  # results, not the agenda
            headers = re.findall(r"<th>(.*?)</th>", table)
            assert len(headers) <= tables.MAX_COLUMNS and not [h for h in headers if SNAKE.search(h)], headers
            assert len(re.findall(r"<tr>", table)) - 1 <= tables.MAX_ROWS


# ------------------------------------------------------------------------------------------- in a browser


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """Every deck built (HTML and PDF) from the reference results alone."""
    if CHROMIUM is None or NODE is None:
        pytest.skip("needs Chromium and Node.js")
    if not (SLIDES / "node_modules" / ".bin" / "marp").exists():
        subprocess.run(["npm", "ci", "--prefix", str(SLIDES), "--no-audit", "--no-fund"], check=True)
    base = tmp_path_factory.mktemp("slides")
    out = base / "build"
    started = time.perf_counter()
    saved = os.environ.get("WORKSHOP_RUNS")
    os.environ["WORKSHOP_RUNS"] = str(base / "runs")  # no run folder: every result from the reference
    try:
        assert build.main(["--out", str(out), "--strict"]) == 0
    finally:
        if saved is None:
            os.environ.pop("WORKSHOP_RUNS")
        else:
            os.environ["WORKSHOP_RUNS"] = saved
    manifest = json.loads((out / "manifest.json").read_text())
    manifest["test_build_seconds"] = time.perf_counter() - started
    return out, manifest


class Chromium:
    """A headless Chromium with a CDP connection; started and stopped by this object, by pid."""

    def __init__(self):
        import websocket  # websocket-client

        self.profile = Path(tempfile.mkdtemp(prefix="slides-chromium-"))
        command = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
                   "--disable-background-networking", "--disable-component-update", "--disable-sync",
                   "--disable-default-apps", "--disable-extensions", "--mute-audio",
                   f"--user-data-dir={self.profile}", "--remote-debugging-port=0", "--remote-allow-origins=*",
                   "--allow-file-access-from-files", "about:blank"]
        self.process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                        start_new_session=True)
        port_file = self.profile / "DevToolsActivePort"
        deadline = time.monotonic() + 30
        while not (port_file.exists() and len(port_file.read_text().split()) >= 2):
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.close()
                raise RuntimeError(f"Chromium did not start ({CHROMIUM})")
            time.sleep(0.1)
        port, path = port_file.read_text().split()[:2]
        self.ws = websocket.create_connection(f"ws://127.0.0.1:{port}{path}", timeout=60, suppress_origin=True)
        self.next_id = 0
        self.events: list[dict] = []

    def send(self, method: str, params: dict | None = None, session: str | None = None) -> dict:
        self.next_id += 1
        message = {"id": self.next_id, "method": method, "params": params or {}}
        if session:
            message["sessionId"] = session
        self.ws.send(json.dumps(message))
        while True:
            reply = json.loads(self.ws.recv())
            if reply.get("id") == self.next_id:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return reply.get("result", {})
            if "method" in reply:
                self.events.append(reply)

    def wait_event(self, method: str, session: str, timeout: float = 30) -> dict:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for event in self.events:
                if event["method"] == method and event.get("sessionId") == session:
                    return event
            self.events.append(json.loads(self.ws.recv()))
        raise TimeoutError(method)

    def open_page(self) -> str:
        target = self.send("Target.createTarget", {"url": "about:blank"})["targetId"]
        session = self.send("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
        for domain in ("Page", "Network", "Runtime", "Log"):
            self.send(f"{domain}.enable", session=session)
        self.send("Emulation.setDeviceMetricsOverride", {"width": VIEWPORT[0], "height": VIEWPORT[1],
                                                         "deviceScaleFactor": 1, "mobile": False}, session)
        return session

    def evaluate(self, expression: str, session: str):
        result = self.send("Runtime.evaluate", {"expression": expression, "returnByValue": True,
                                                "awaitPromise": True}, session)
        if "exceptionDetails" in result:
            raise RuntimeError(result["exceptionDetails"])
        return result["result"].get("value")

    def close(self) -> None:
        try:
            if getattr(self, "ws", None):
                self.ws.close()
        finally:
            if self.process.poll() is None:
                self.process.terminate()
                try:
                    self.process.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    os.killpg(self.process.pid, signal.SIGKILL)  # its own session: only its children
                    self.process.wait(timeout=10)
            shutil.rmtree(self.profile, ignore_errors=True)


@pytest.fixture(scope="module")
def browser():
    if CHROMIUM is None or NODE is None:
        pytest.skip("needs Chromium and Node.js")
    chromium = Chromium()
    yield chromium
    chromium.close()


OVERFLOW_JS = r"""
(() => {
  const svg = document.querySelector('svg.bespoke-marp-active') || document.querySelector('svg[data-marpit-svg]');
  const section = svg.querySelector('section');
  const box = section.getBoundingClientRect();
  const problems = [];
  const name = el => el.tagName.toLowerCase() + (el.className && typeof el.className === 'string' ? '.' + el.className.split(' ').join('.') : '');
  for (const el of section.querySelectorAll('*')) {
    const r = el.getBoundingClientRect();
    if (r.width === 0 && r.height === 0) continue;
    if (r.left < box.left - 1 || r.top < box.top - 1 || r.right > box.right + 1 || r.bottom > box.bottom + 1)
      problems.push(`${name(el)} box [${r.left|0},${r.top|0},${r.right|0},${r.bottom|0}] outside the slide`);
    const style = getComputedStyle(el);
    if (style.overflowX !== 'visible' && el.scrollWidth > el.clientWidth + 1)
      problems.push(`${name(el)} clips its content horizontally (${el.scrollWidth} > ${el.clientWidth})`);
    if (style.overflowY !== 'visible' && el.scrollHeight > el.clientHeight + 1)
      problems.push(`${name(el)} clips its content vertically (${el.scrollHeight} > ${el.clientHeight})`);
  }
  if (section.scrollHeight > section.clientHeight + 1 || section.scrollWidth > section.clientWidth + 1)
    problems.push(`section content ${section.scrollWidth}x${section.scrollHeight} exceeds ${section.clientWidth}x${section.clientHeight}`);
  const text = section.innerText.trim();
  return {problems, width: box.width, height: box.height, text: text.length,
          images: [...section.querySelectorAll('img')].map(i => i.complete && i.naturalWidth > 0)};
})()
"""

LOCAL_SCHEMES = ("file:", "data:", "blob:", "about:")


def _pdf_chunks(path: Path) -> list[bytes]:
    """A PDF's bytes and its decompressed object streams (Marp's pdf-lib puts page objects in those)."""
    data = path.read_bytes()
    chunks = [data]
    for stream in re.finditer(rb"stream\r?\n(.*?)\r?\nendstream", data, re.S):
        # A stream whose last byte is 0x0D loses it to the "\r?\n" before endstream (1 stream in 256; the
        # bytes change with the build's timestamp): that byte ends zlib's checksum, which decompressobj does
        # not insist on, while zlib.decompress would refuse the whole stream and its pages would go uncounted.
        try:
            chunks.append(zlib.decompressobj().decompress(stream.group(1)))
        except zlib.error:
            pass
    return chunks


def _pdf_pages(path: Path) -> int:
    """Page objects in a PDF, looking inside compressed object streams too."""
    return sum(len(re.findall(rb"/Type\s*/Page(?![a-zA-Z])", chunk)) for chunk in _pdf_chunks(path))


# ------------------------------------------------------------------------------------------- browser tests


@pytest.mark.slow
@needs_browser
def test_build_fills_in_code_numbers_and_figures_within_budget(built):
    out, manifest = built
    assert [d["deck"] for d in manifest["decks"]] == DECKS
    assert manifest["missing"] == [] and manifest["over_budget"] == []
    assert manifest["results"]["origin"] == "reference results"
    held = {p.stem for p in (REFERENCE / "results").glob("*.json")}
    for item in manifest["not_run"]:  # optional sections newer than the reference run (notebook 06, ...)
        named = re.search(r"section '([\w-]+)'", item)
        assert named is None or f"section-{named.group(1)}" not in held, item
    for deck in manifest["decks"]:
        low, high = deck["budget"]
        assert low <= deck["slides"] <= high, deck
    rendered = {p.stem: p.read_text() for p in (out / "md").glob("*.md")}
    assert all("{{" not in text for text in rendered.values())
    assert "2,474,506" in rendered["00_overview"]  # a number taken from the record, formatted
    assert "def ring_all_reduce_s" in rendered["02_ddp"]  # code pulled from the package
    assert "DistributedDataParallel(self.model" in rendered["02_ddp"]
    assert "data:image/svg+xml;base64," in rendered["03_optimization"]  # charts drawn from the records
    assert "data:image/png;base64," not in rendered["03_optimization"]  # no notebook PNG shrunk onto a slide
    assert "<!--" in rendered["01_fundamentals"]  # speaker notes
    assert "10:00–10:15" in rendered["00_overview"]  # the agenda
    for name in DECKS:
        html = (out / f"{name}.html").read_text()
        assert "sources/" not in html and "Not built" not in html, name
        headers = re.findall(r"<th>(.*?)</th>", html)
        assert not [h for h in headers if SNAKE.search(h)], f"{name}: raw column names {headers}"
    print(f"\nslide build took {manifest['test_build_seconds']:.1f} s: "
          + ", ".join(f"{d['deck']} {d['slides']}" for d in manifest["decks"]))


@pytest.mark.slow
@needs_browser
@pytest.mark.parametrize("deck", DECKS)
def test_deck_in_headless_chromium(built, browser, deck):
    out, manifest = built
    entry = next(d for d in manifest["decks"] if d["deck"] == deck)
    html = out / entry["html"]
    session = browser.open_page()
    browser.events.clear()
    browser.send("Page.navigate", {"url": html.as_uri()}, session)
    browser.wait_event("Page.loadEventFired", session)
    time.sleep(0.3)
    slides = browser.evaluate("document.querySelectorAll('svg[data-marpit-svg] > foreignObject > section').length",
                              session)
    assert slides == entry["slides"] > 0

    folder = ARTIFACTS / deck
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    problems = []
    for number in range(1, slides + 1):
        browser.evaluate(f"location.hash = '#{number}'", session)
        active = browser.evaluate(
            "new Promise(r => requestAnimationFrame(() => requestAnimationFrame(() => r("
            "[...document.querySelectorAll('svg[data-marpit-svg]')].findIndex(s => "
            "s.classList.contains('bespoke-marp-active')) + 1))))", session)
        assert active == number, f"{deck}: slide {number} did not become active"
        report = browser.evaluate(OVERFLOW_JS, session)
        assert (report["width"], report["height"]) == VIEWPORT, report
        assert report["text"] > 0 or report["images"], f"{deck} slide {number} is empty"
        assert all(report["images"]), f"{deck} slide {number}: an image did not load"
        problems += [f"slide {number}: {p}" for p in report["problems"]]
        # A chart is drawn at its size on the slide: shown at any other width, its text would not be the size
        # tests/test_slide_charts.py checks (18 px and up at 1280x720).
        charts = browser.evaluate("[...document.querySelectorAll('svg.bespoke-marp-active img[data-chart]')]"
                                  ".map(i => [i.dataset.chart, i.getBoundingClientRect().width, i.width])", session)
        problems += [f"slide {number}: chart {name} shown {shown:.0f} px wide, drawn for {drawn} px"
                     for name, shown, drawn in charts if abs(shown - drawn) > 1]
        browser.evaluate("document.querySelectorAll('.bespoke-marp-osc').forEach(e => e.style.display = 'none')",
                         session)  # the on-screen controls would cover the slide's bottom edge in the screenshot
        shot = browser.send("Page.captureScreenshot", {"format": "png"}, session)["data"]
        (folder / f"{number:02d}.png").write_bytes(base64.b64decode(shot))

    requests = [e["params"]["request"]["url"] for e in browser.events
                if e["method"] == "Network.requestWillBeSent" and e.get("sessionId") == session]
    assert requests and requests[0].startswith("file:")
    leaving = [u for u in requests if not u.startswith(LOCAL_SCHEMES)]
    assert not leaving, f"{deck} requested: {leaving}"
    errors = [e["params"] for e in browser.events if e.get("sessionId") == session and (
        (e["method"] == "Runtime.consoleAPICalled" and e["params"]["type"] in ("error", "assert"))
        or e["method"] == "Runtime.exceptionThrown"
        or (e["method"] == "Log.entryAdded" and e["params"]["entry"]["level"] == "error"))]
    assert not errors, f"{deck}: console errors {errors}"
    assert not problems, f"{deck}: content outside its slide:\n" + "\n".join(problems)

    pdf = out / entry["pdf"]
    assert pdf.read_bytes().startswith(b"%PDF") and _pdf_pages(pdf) == slides
    browser.send("Target.closeTarget", {"targetId": browser.send("Target.getTargetInfo", session=session)
                                        ["targetInfo"]["targetId"]})


@pytest.mark.slow
@needs_browser
def test_overflow_check_catches_an_overfull_slide(tmp_path, monkeypatch, browser):
    """The box check above must fail on a slide whose content does not fit (else it proves nothing)."""
    decks = tmp_path / "decks"
    decks.mkdir()
    lines = "\n".join(f"- bullet line {i} that adds height to the slide" for i in range(30))
    wide = '<div style="width: 2000px">a block wider than the slide</div>'
    (decks / "99_overfull.md").write_text(f"---\nmarp: true\ntheme: workshop\n---\n\n{lines}\n\n---\n\n{wide}\n\n---\n\nfits\n")
    monkeypatch.setattr(build, "DECKS", decks)
    monkeypatch.setenv("WORKSHOP_RUNS", str(tmp_path / "runs"))
    out = tmp_path / "out"
    assert build.main(["--out", str(out), "--html-only"]) == 0
    session = browser.open_page()
    browser.send("Page.navigate", {"url": (out / "99_overfull.html").as_uri()}, session)
    browser.wait_event("Page.loadEventFired", session)
    found = []
    for number in (1, 2, 3):
        browser.evaluate(f"location.hash = '#{number}'", session)
        browser.evaluate("new Promise(r => requestAnimationFrame(() => requestAnimationFrame(r)))", session)
        found.append(bool(browser.evaluate(OVERFLOW_JS, session)["problems"]))
    assert found == [True, True, False]


# ------------------------------------------------------------------------------------------- the handout


def _handout_pages(text: str) -> list[str]:
    """The pages of the handout's Markdown (template or rendered): what follows the front matter, split at ---."""
    body = text.split("\n---\n", 1)[1]
    return re.split(r"^---$", body, flags=re.M)


def _handout_commands(page: str) -> list[list[str]]:
    """Every command in a page's ```bash blocks, as shlex tokens: continued lines joined, comments dropped."""
    import shlex

    commands = []
    for block in re.findall(r"```bash\n(.*?)```", page, re.S):
        for line in block.replace("\\\n", " ").splitlines():
            tokens = shlex.split(line, comments=True)
            if tokens:
                commands.append(tokens)
    return commands


def _reference_only(tmp_path, monkeypatch):
    monkeypatch.setenv("WORKSHOP_RUNS", str(tmp_path / "no-runs"))
    return build.find_results(None, REFERENCE)


def test_a_row_selector_picks_a_table_row_by_its_contents():
    scaling = json.loads((REFERENCE / "results" / "section-ddp-scaling.json").read_text())
    weak = max((r for r in scaling["table"] if r["mode"] == "weak"), key=lambda r: r["world_size"])
    assert build._lookup(scaling, "table[mode=weak,max:world_size].speedup") == weak["speedup"]
    assert build._lookup(scaling, "table[ mode=weak , world_size=1 ].speedup") == 1.0
    assert build._lookup(scaling, "table[mode=strong,min:world_size].world_size") == 1
    ladder = json.loads((REFERENCE / "results" / "section-ladder.json").read_text())
    measured = [r for r in ladder["table"] if r["vs_baseline"] is not None]
    assert build._lookup(ladder, "table[last:vs_baseline].rung") == measured[-1]["rung"]
    assert build._lookup(ladder, "table[first:vs_baseline].rung") == measured[0]["rung"]
    assert build._lookup(ladder, "table[max:vs_baseline].rung") == max(measured, key=lambda r: r["vs_baseline"])["rung"]
    recompute = json.loads((REFERENCE / "results" / "beyond-recompute.json").read_text())
    assert build._lookup(recompute, "rows[activation_checkpointing=yes].step_ms") == recompute["rows"][1]["step_ms"]
    # no such row, or a selector on something that is not a list: missing, so an older folder is tried
    assert build._lookup(scaling, "table[mode=diagonal].speedup") is None
    assert build._lookup(scaling, "text[max:x]") is None
    assert build._lookup(ladder, "table[max:no_such_column].rung") is None
    assert build._lookup(scaling, "table.0.mode") == "strong"  # plain paths read as before
    with pytest.raises(build.BuildError, match="neither key=value"):
        build._lookup(scaling, "table[weak].speedup")


def test_a_value_directive_takes_a_row_from_the_newest_folder_holding_it(three_folders):
    results = build.find_results(None, three_folders)
    text, renderer = render(results, "x", '{{value section-ladder "table[last:vs_baseline].vs_baseline" fmt=".2f"}} '
                                          '{{value section-ddp-scaling "table[mode=weak,max:world_size].efficiency" '
                                          'fmt=".0%"}} {{value section-ladder "table[rung=no such rung].rung"}}')
    assert re.match(r"\d+\.\d\d \d+%<sup", text)  # the ladder is the newest run's; the scaling an older run's
    assert renderer.fallbacks == ["x: values of section-ddp-scaling from run 20260201-090000 of 2026-02-01 at commit "
                                  "2222222, old-cpu (cpu)"]
    assert renderer.missing == ["x: value section-ladder.table[rung=no such rung].rung (run `make run` first)"]


def test_the_handout_has_one_page_per_session_with_its_commands_and_numbers(tmp_path, monkeypatch):
    results = _reference_only(tmp_path, monkeypatch)
    template = build.HANDOUT.read_text()
    text, renderer = render(results, "handout", template)
    assert renderer.missing == [] and "{{" not in text and "Not built" not in text
    sessions = build.handout_sessions()
    assert [s.deck for s in sessions] == [d for d in DECKS if not d.startswith("00_")]  # sessions 1-4 and the bonus
    pages, sources = _handout_pages(text), _handout_pages(template)
    assert len(pages) == len(sessions) == 5
    for session, page, source in zip(sessions, pages, sources):
        assert f"## {session.title}" in page and session.when in page, session.title
        for number in re.findall(r"\b(\d\d)\b", session.demo_what):  # the notebooks it runs, and how to run them
            notebook = next((REPO / "notebooks").glob(f"{number}_*.ipynb"))
            assert f"notebooks/{notebook.name}" in page
            assert any(c[:4] == ["python", "-m", "workshop_utils.run_notebooks", "--only"] and number in c
                       for c in _handout_commands(page)), f"{session.title}: no command runs notebook {number}"
        assert len(_handout_commands(page)) >= 3, session.title
        values = re.findall(r"\{\{value [^{}]*\}\}", source)
        shown = []
        for directive in values:
            value, one = render(results, "handout", directive)
            assert one.missing == [] and value.strip(), directive
            shown.append(value)
        numbers = [v for v in shown if re.search(r"\d", v)]
        assert 3 <= len(numbers), f"{session.title}: {shown}"
        assert 3 <= sum(1 for line in source.splitlines() if line.startswith("| ") and "{{value" in line) <= 5
        assert all(v in page for v in shown)
        assert 'class="provenance"' in page  # where the numbers were measured, on every page


def test_handout_numbers_come_from_the_newest_run_holding_them(three_folders):
    results = build.find_results(None, three_folders)
    template = build.HANDOUT.read_text()
    text, renderer = render(results, "handout", template)
    assert renderer.missing == []
    rows = {}  # each table row of the template, by the records it names, against the same row rendered
    for source, page in zip(_handout_pages(template), _handout_pages(text)):
        for t, r in zip([l for l in source.splitlines() if l.startswith("| ")],
                        [l for l in page.splitlines() if l.startswith("| ")]):
            for record in re.findall(r"\{\{value ([\w-]+)", t):
                rows.setdefault(record, r)
    assert 'class="from"' not in rows["section-ladder"]  # notebook 04 ran last, on its own: the newest run's
    assert ">old</sup>" in rows["section-precision-modes"]  # notebook 03 only in the older complete run
    assert ">ref</sup>" in rows["baseline"] and ">ref</sup>" in rows["beyond-recompute"]  # in the reference alone
    assert "on this handout come from an older run (marked old) or the reference run (marked ref)" in text


@pytest.mark.slow
def test_every_command_on_the_handout_is_a_real_one():
    """Each make target, module, script and job script exists, and every --flag is one its --help lists."""
    helps: dict[tuple, str] = {}

    def help_of(*command) -> str:
        if command not in helps:
            done = subprocess.run([*command, "--help"], cwd=REPO, capture_output=True, text=True, timeout=300)
            assert done.returncode == 0, f"{' '.join(command)} --help failed: {done.stderr[-500:]}"
            helps[command] = done.stdout
        return helps[command]

    def check_flags(tokens, text, what):
        for token in tokens:
            if token.startswith("--"):
                flag = token.split("=", 1)[0]
                assert re.search(rf"(?<![\w-]){re.escape(flag)}(?![\w-])", text), f"{what} has no flag {flag}"

    def sbatch_help() -> str:
        """sbatch's own --help where it answers (it needs a cluster's configuration), else the kit's table of
        what goes on the sbatch command line."""
        if "sbatch" not in helps:
            done = (subprocess.run(["sbatch", "--help"], capture_output=True, text=True, timeout=60)
                    if shutil.which("sbatch") else None)
            helps["sbatch"] = (done.stdout if done is not None and done.returncode == 0
                               else (REPO / "slurm" / "README.md").read_text())
        return helps["sbatch"]

    python = sys.executable
    makefile = (REPO / "Makefile").read_text()
    checked = 0
    for tokens in _handout_commands(build.HANDOUT.read_text()):
        program = tokens[0]
        if program == "make":
            assert re.search(rf"^{re.escape(tokens[1])}:", makefile, re.M), f"no make target {tokens[1]}"
        elif program in ("python", "torchrun"):
            if program == "torchrun":
                cut = tokens.index("-m")
                check_flags(tokens[1:cut], help_of(python, "-m", "torch.distributed.run"), "torchrun")
                tokens = ["python", *tokens[cut:]]
            if tokens[1] == "-m":
                module, rest = tokens[2], tokens[3:]
                assert importlib.util.find_spec(module) is not None, f"no module {module}"
                text = help_of(python, "-m", module)
                if rest and not rest[0].startswith("-"):  # a part, such as parallel_demos' fsdp
                    assert re.search(rf"[{{,]{re.escape(rest[0])}[,}}]", text), f"{module} has no part {rest[0]}"
            else:
                script, rest = tokens[1], tokens[2:]
                assert (REPO / script).is_file(), f"no script {script}"
                text = help_of(python, script)
            check_flags(rest, text, " ".join(tokens[:3]))
        elif program == "sbatch":
            script = next(t for t in tokens if t.endswith(".sbatch"))
            assert (REPO / script).is_file(), f"no job script {script}"
            cut = tokens.index(script)
            check_flags(tokens[1:cut], sbatch_help(), "sbatch")
            if "-m workshop_utils.train" in (REPO / script).read_text():  # the script hands its arguments on
                check_flags(tokens[cut + 1:], help_of(python, "-m", "workshop_utils.train"), script)
            else:
                assert len(tokens) == cut + 1, f"{script} takes no arguments of its own"
        else:
            assert program in ("source", "squeue", "scancel", "printf"), f"unexpected command {tokens}"
        checked += 1
    assert checked >= 25


@pytest.mark.slow
def test_the_build_makes_the_handout_with_every_build_and_with_deck_only_when_named(tmp_path, monkeypatch,
                                                                                  capsys):
    """The build's bookkeeping with Marp stood in for (the browser test below uses the real one)."""
    calls = []

    def fake_marp(args, env, themes=()):
        calls.append(list(themes))
        md_dir, out = (Path(args[args.index(flag) + 1]) for flag in ("--input-dir", "--output"))
        for md in md_dir.glob("*.md"):
            body = md.read_text().split("\n---\n", 1)[1]
            pages = len(re.findall(r"^---$", body, re.M)) + 1
            suffix = ".pdf" if "--pdf" in args else ".html"
            sections = "".join(f'<section id="{i}"></section>' for i in range(1, pages + 1))
            (out / f"{md.stem}{suffix}").write_text(sections)

    monkeypatch.setattr(build, "marp", fake_marp)
    monkeypatch.setenv("WORKSHOP_RUNS", str(tmp_path / "runs"))
    out = tmp_path / "out"
    assert build.main(["--out", str(out), "--html-only"]) == 0
    printed = capsys.readouterr().out
    manifest = json.loads((out / "manifest.json").read_text())
    assert [d["deck"] for d in manifest["decks"]] == DECKS  # not a deck: no budget, not in the list
    handout = manifest["handout"]
    assert handout["pages"] == len(build.handout_sessions()) == 5 and handout["problems"] == []
    assert handout["html"] == "handout.html" and handout["pdf"] is None
    assert handout["sessions"] == [s.title for s in build.handout_sessions()]
    assert re.search(r"^  handout\s+5 pages .*-> .*handout\.html$", printed, re.M)
    theme = calls[-1][0].read_text()
    assert "@theme workshop-handout" in theme and "@size A4" in theme and "@import 'workshop'" in theme
    assert (out / "md" / "handout.md").is_file()

    assert build.main(["--out", str(out), "--html-only", "--deck", "01"]) == 0
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["handout"] is None and [d["deck"] for d in manifest["decks"]] == ["01_fundamentals"]
    assert not (out / "md" / "handout.md").exists() and calls[-1] == []
    assert "handout" not in capsys.readouterr().out

    assert build.main(["--out", str(out), "--html-only", "--deck", "handout"]) == 0
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["decks"] == [] and manifest["handout"]["pages"] == 5
    assert "--deck handout" in " ".join(subprocess.run([sys.executable, str(SLIDES / "build.py"), "--help"],
                                                        capture_output=True, text=True).stdout.split())


def _pdf_media_boxes(path: Path) -> list[tuple[float, float]]:
    """Width and height in points of every page's MediaBox, inside compressed object streams too."""
    number = rb"\s*(-?[\d.]+)"
    return [(float(x1) - float(x0), float(y1) - float(y0)) for chunk in _pdf_chunks(path)
            for x0, y0, x1, y1 in re.findall(rb"/MediaBox\s*\[" + number * 4 + rb"\s*\]", chunk)]


@pytest.mark.slow
@needs_browser
def test_handout_builds_one_a4_page_per_session_and_nothing_leaves_its_page(built, browser, tmp_path, monkeypatch):
    out, manifest = built
    sessions = build.handout_sessions()
    entry = manifest["handout"]
    assert entry["pages"] == len(sessions) == 5 and entry["problems"] == []
    pdf = out / entry["pdf"]
    assert pdf.read_bytes().startswith(b"%PDF") and _pdf_pages(pdf) == len(sessions)
    boxes = _pdf_media_boxes(pdf)
    assert boxes and all(abs(w - 595.3) < 6 and abs(h - 841.9) < 6 for w, h in boxes), boxes  # A4 portrait, in pt

    results = _reference_only(tmp_path, monkeypatch)  # what the fixture built from
    expected = []  # per page: every value its template names, as the build formats it
    for source in _handout_pages(build.HANDOUT.read_text()):
        expected.append([render(results, "handout", d)[0] for d in re.findall(r"\{\{value [^{}]*\}\}", source)])

    session = browser.open_page()
    width, height = build.HANDOUT_PAGE
    browser.send("Emulation.setDeviceMetricsOverride", {"width": width, "height": height, "deviceScaleFactor": 1,
                                                        "mobile": False}, session)
    browser.events.clear()
    browser.send("Page.navigate", {"url": (out / entry["html"]).as_uri()}, session)
    browser.wait_event("Page.loadEventFired", session)
    time.sleep(0.3)
    pages = browser.evaluate("document.querySelectorAll('svg[data-marpit-svg] > foreignObject > section').length",
                             session)
    assert pages == len(sessions)
    folder = ARTIFACTS / "handout"
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    problems = []
    for number, (s, values) in enumerate(zip(sessions, expected), start=1):
        browser.evaluate(f"location.hash = '#{number}'", session)
        browser.evaluate("new Promise(r => requestAnimationFrame(() => requestAnimationFrame(r)))", session)
        report = browser.evaluate(OVERFLOW_JS, session)
        assert (report["width"], report["height"]) == (width, height), report
        problems += [f"page {number}: {p}" for p in report["problems"]]
        text = browser.evaluate("document.querySelector('svg.bespoke-marp-active section').innerText", session)
        code = browser.evaluate("[...document.querySelectorAll('svg.bespoke-marp-active section :is(pre, marp-pre)')]"
                                ".map(p => p.innerText).join('\\n')", session)
        assert s.title in text and s.when in text, f"page {number} is not {s.title}"
        assert "Not built" not in text and "run make run" not in text, f"page {number} shows a notice"
        assert re.search(r"^(make|python|torchrun|sbatch) ", code, re.M), f"page {number} shows no command"
        numbers = [v for v in values if re.search(r"\d", v)]
        assert len(numbers) >= 3 and all(v in text for v in numbers), f"page {number}: {numbers} not all shown"
        browser.evaluate("document.querySelectorAll('.bespoke-marp-osc').forEach(e => e.style.display = 'none')",
                         session)
        shot = browser.send("Page.captureScreenshot", {"format": "png"}, session)["data"]
        (folder / f"{number:02d}.png").write_bytes(base64.b64decode(shot))
    requests = [e["params"]["request"]["url"] for e in browser.events
                if e["method"] == "Network.requestWillBeSent" and e.get("sessionId") == session]
    assert not [u for u in requests if not u.startswith(LOCAL_SCHEMES)], requests
    assert not problems, "content outside its page:\n" + "\n".join(problems)
    browser.send("Target.closeTarget", {"targetId": browser.send("Target.getTargetInfo", session=session)
                                        ["targetInfo"]["targetId"]})


def test_every_session_has_time_for_the_exercises_of_its_notebooks():
    """A session's exercise slot holds at least the estimated minutes of every exercise in the notebooks it runs."""
    numbered = re.compile(r"^#+ Exercise (\d+\.\d+)", re.M)
    found = set()
    for session in build.SESSIONS:
        needed = 0
        for number in build.session_notebooks(session):
            notebook, = (REPO / "notebooks").glob(f"{number}_*.ipynb")
            cells = json.loads(notebook.read_text())["cells"]
            exercises = numbered.findall("\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "markdown"))
            assert set(exercises) <= set(build.EXERCISE_MINUTES), f"{notebook.name}: an exercise without minutes"
            found |= set(exercises)
            needed += sum(build.EXERCISE_MINUTES[e] for e in exercises)
        assert session.exercise >= needed, f"{session.title}: {session.exercise} min for {needed} min of exercises"
    assert found == set(build.EXERCISE_MINUTES)  # no estimate for an exercise that no session runs


def _code_blocks(text: str) -> list[tuple[str, str]]:
    return re.findall(r"```(python|bash)\n(.*?)\n```", text, re.S)


def test_every_code_block_on_every_slide_is_whole(tmp_path, monkeypatch):
    """A code slide is a runnable excerpt: Python that parses, shell that bash -n accepts, never a fragment cut
    inside a call (deck 02 stopped inside init_process_group( ) or after a line continuation (deck 04's job script)."""
    monkeypatch.setenv("WORKSHOP_RUNS", str(tmp_path / "runs"))
    results = build.find_results(None, REFERENCE)
    fragments = []
    for deck in [*DECKS, "handout"]:
        path = SLIDES / "decks" / f"{deck}.md" if deck != "handout" else SLIDES / "handout.md"
        text, _ = render(results, deck, path.read_text())
        for lang, code in _code_blocks(text):
            if not build.whole_code(code, lang):
                fragments.append(f"{deck}: {lang} block starting {code.splitlines()[0][:60]!r}")
    assert not fragments, fragments


@pytest.mark.parametrize("lang, code, whole", [
    ("python", "dist.init_process_group(\n    backend='nccl',", False), ("python", "x = 1\ny = f(x)", True),
    ("bash", "srun torchrun \\\n  --nnodes 2 \\", False), ("bash", "#SBATCH --nodes=2\nsrun hostname", True),
    ("bash", "if true; then\n  echo", False)])
def test_the_wholeness_check_tells_fragments_from_excerpts(lang, code, whole):
    assert build.whole_code(code, lang) is whole


def test_a_long_excerpt_is_cut_at_a_statement_boundary():
    source = "a = 1\nb = call(\n    2,\n    3,\n)\nc = 4\nd = 5\n"
    cut = build.Renderer.excerpt(source, None, None, 3, "python")
    assert cut.splitlines() == ["a = 1", "# ... (continues in the source)"]
