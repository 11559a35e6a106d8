"""The slide decks: build from a run folder, then load every deck in a real headless Chromium.

The browser is driven over the Chrome DevTools Protocol (CDP) with the ``websocket-client`` package: CDP reports
every network request and console message of the page (the checks below need both), takes screenshots and needs
no chromedriver. Chromium and its child processes are started here and stopped by pid at the end.

The decks are built from a small run folder written by the test itself (records shaped like the notebooks' ones,
figures drawn with Pillow), so the test runs in seconds of Python and does not depend on ``make run``.
Screenshots of every slide go to test-artifacts/slides/<deck>/.
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

REPO = Path(__file__).resolve().parents[1]
SLIDES = REPO / "slides"
ARTIFACTS = REPO / "test-artifacts" / "slides"
VIEWPORT = (1280, 720)  # Marp's slide size: at this viewport one CSS pixel of the slide is one screen pixel


def _load_build():
    spec = importlib.util.spec_from_file_location("slides_build", SLIDES / "build.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["slides_build"] = module
    spec.loader.exec_module(module)
    return module


build = _load_build()
CHROMIUM = build.chromium_path()
NODE = shutil.which("node")
needs_browser = pytest.mark.skipif(CHROMIUM is None or NODE is None,
                                   reason="slide browser tests need Chromium (apt-get install chromium) and "
                                          "Node.js (apt-get install nodejs npm); "
                                          f"found chromium={CHROMIUM}, node={NODE}")


# ------------------------------------------------------------------------------------------- fixtures


ENV = {"device_type": "cpu", "device_name": "test-cpu", "gpus": [], "torch": "x", "cuda": None, "cudnn": None,
       "nccl": None, "python": "3", "cpu_cores": 2, "hostname": "test", "date": "2026-01-01T00:00:00+00:00",
       "slurm": {}}


def _figure(path: Path, size=(1000, 600), color=(70, 130, 180)) -> None:
    from PIL import Image, ImageDraw

    path.parent.mkdir(parents=True, exist_ok=True)
    image = Image.new("RGB", size, "white")
    draw = ImageDraw.Draw(image)
    for i in range(10):
        draw.rectangle([60 + i * 90, size[1] - 60 - i * 45, 120 + i * 90, size[1] - 40], fill=color)
    image.save(path)


def _section(folder: Path, key: str, title: str, order: float, table: list[dict], figures: list[str]) -> None:
    record = {"name": f"section-{key}", "kind": "section", "title": title, "order": order,
              "text": f"Test section {key}.", "table": table, "figures": figures, "environment": ENV}
    (folder / "results" / f"section-{key}.json").write_text(json.dumps(record))


def make_run_folder(folder: Path) -> Path:
    """A run folder shaped like the main job's: train record, report sections of all notebooks, figures."""
    (folder / "results").mkdir(parents=True)
    baseline = {"name": "baseline", "kind": "train", "environment": ENV,
                "config": {"batch_size": 64, "precision": "fp32"},
                "metrics": {"parameters": 2474506, "samples_per_s": 51.9, "step_ms_median": 1211.1,
                            "data_wait_fraction": 0.021, "data_source": "synthetic"}}
    (folder / "results" / "baseline.json").write_text(json.dumps(baseline))
    names = ["baseline_curves", "scaling", "precision_modes", "gradient_magnitudes", "loader_sweep"]
    for name in names:
        _figure(folder / "figures" / f"{name}.png")
    summary = [{"metric": m, "value": v} for m, v in
               [("samples/s", 51.9), ("step ms (median)", 1211.1), ("peak memory MiB", 1289.9), ("MFU", None)]]
    _section(folder, "baseline", "Single-GPU baseline (notebook 01)", 1, summary, ["figures/baseline_curves.png"])
    wide = [{f"column {c}": r * c + 0.5 for c in range(11)} | {"mode": f"mode-{r}"} for r in range(12)]
    _section(folder, "ddp", "DDP scaling (notebook 02)", 2, wide, ["figures/scaling.png"])
    _section(folder, "precision-modes", "Mixed precision (notebook 03)", 3,
             [{"model": "simplecnn", "precision": p, "samples/s": 100.0 + i} for i, p in
              enumerate(["fp32", "tf32", "fp16", "bf16"])], ["figures/precision_modes.png"])
    _section(folder, "loader", "Data loading (notebook 04)", 4, [], ["figures/loader_sweep.png"])
    return folder


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """Every deck built (HTML and PDF) from a complete test run folder."""
    if CHROMIUM is None or NODE is None:
        pytest.skip("needs Chromium and Node.js")
    if not (SLIDES / "node_modules" / ".bin" / "marp").exists():
        subprocess.run(["npm", "ci", "--prefix", str(SLIDES), "--no-audit", "--no-fund"], check=True)
    base = tmp_path_factory.mktemp("slides")
    run = make_run_folder(base / "run")
    out = base / "build"
    started = time.perf_counter()
    assert build.main(["--run-dir", str(run), "--out", str(out), "--strict"]) == 0
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


def _pdf_pages(path: Path) -> int:
    """Page objects in a PDF, looking inside compressed object streams too (Marp's pdf-lib writes those)."""
    data = path.read_bytes()
    chunks = [data]
    for stream in re.finditer(rb"stream\r?\n(.*?)\r?\nendstream", data, re.S):
        try:
            chunks.append(zlib.decompress(stream.group(1)))
        except zlib.error:
            pass
    return sum(len(re.findall(rb"/Type\s*/Page(?![a-zA-Z])", chunk)) for chunk in chunks)


# ------------------------------------------------------------------------------------------- tests


def test_no_run_folder_names_make_run(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("WORKSHOP_RUNS", str(tmp_path / "runs"))
    code = build.main(["--reference", str(tmp_path / "reference"), "--out", str(tmp_path / "out"), "--html-only"])
    err = capsys.readouterr().err
    assert code == 2 and "No results" in err and "make run" in err
    code = build.main(["--run-dir", str(tmp_path / "nowhere"), "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert code == 2 and "does not exist" in err and "make run" in err


def test_latest_run_folder_then_reference(tmp_path, monkeypatch):
    monkeypatch.setenv("WORKSHOP_RUNS", str(tmp_path / "runs"))
    reference = make_run_folder(tmp_path / "reference")
    assert build.find_results(None, reference).origin == "reference results"
    make_run_folder(tmp_path / "runs" / "20260101-000000")
    make_run_folder(tmp_path / "runs" / "20260102-000000")
    (tmp_path / "runs" / "20260103-000000").mkdir()  # a run that recorded nothing yet is passed over
    found = build.find_results(None, reference)
    assert found.folder.name == "20260102-000000" and found.origin == "latest run folder"


@pytest.mark.slow
@needs_browser
def test_missing_figure_gives_a_notice_not_a_broken_slide(tmp_path, capsys):
    run = make_run_folder(tmp_path / "run")
    (run / "figures" / "gradient_magnitudes.png").unlink()
    out = tmp_path / "out"
    assert build.main(["--run-dir", str(run), "--out", str(out), "--html-only", "--deck", "03"]) == 0
    err = capsys.readouterr().err
    assert "gradient_magnitudes.png" in err and "make run" in err
    html = (out / "03_optimization.html").read_text()
    assert 'class="missing"' in html and "make run" in html
    assert build.main(["--run-dir", str(run), "--out", str(out), "--html-only", "--deck", "03", "--strict"]) == 2


@pytest.mark.slow
@needs_browser
def test_build_fills_in_code_numbers_and_figures(built):
    out, manifest = built
    assert [d["deck"] for d in manifest["decks"]] == ["00_overview", "01_fundamentals", "02_ddp",
                                                      "03_optimization", "04_slurm"]
    assert manifest["missing"] == [] and manifest["results"]["origin"] == "given run folder"
    rendered = {p.stem: p.read_text() for p in (out / "md").glob("*.md")}
    assert all("{{" not in text for text in rendered.values())
    assert "2,474,506" in rendered["00_overview"]  # a number taken from the record, formatted
    assert "def ring_all_reduce_s" in rendered["02_ddp"]  # code pulled from the package
    assert "DistributedDataParallel(model" in rendered["02_ddp"]
    assert "data:image/png;base64," in rendered["03_optimization"]
    assert "<!--" in rendered["01_fundamentals"]  # speaker notes
    print(f"\nslide build took {manifest['test_build_seconds']:.1f} s: "
          + ", ".join(f"{d['deck']} {d['slides']}" for d in manifest["decks"]))


@pytest.mark.slow
@needs_browser
@pytest.mark.parametrize("deck", ["00_overview", "01_fundamentals", "02_ddp", "03_optimization", "04_slurm"])
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
    out = tmp_path / "out"
    assert build.main(["--run-dir", str(make_run_folder(tmp_path / "run")), "--out", str(out), "--html-only"]) == 0
    session = browser.open_page()
    browser.send("Page.navigate", {"url": (out / "99_overfull.html").as_uri()}, session)
    browser.wait_event("Page.loadEventFired", session)
    found = []
    for number in (1, 2, 3):
        browser.evaluate(f"location.hash = '#{number}'", session)
        browser.evaluate("new Promise(r => requestAnimationFrame(() => requestAnimationFrame(r)))", session)
        found.append(bool(browser.evaluate(OVERFLOW_JS, session)["problems"]))
    assert found == [True, True, False]
