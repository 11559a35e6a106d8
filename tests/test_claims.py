"""What the room is told is what the kit measured: the decks' code shows the call each slide is about and whole
statements, no text cut off with "…", a cap never called "out of memory", the commit the numbers come from on every
deck; the measurements the sentences rest on (one step's memory per precision mode, the profiler's memory per step,
the GradScaler's title, the checkpoint stall's sentence; tests/test_notebooks.py reads the same on the main job's run); the noise an attendee
saw (a blank stderr strip, the banner once per launch, a launch line that pastes into a shell); the documented
commands and counts against what they name."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

import workshop_utils as wu

REPO = Path(__file__).resolve().parents[1]
SLIDES = REPO / "slides"
REFERENCE = REPO / "results" / "reference"
sys.path.insert(0, str(SLIDES))

import build  # noqa: E402  the slides' build (slides/ is not a package)
from deck_labels import memory_stop_label, table_rows  # noqa: E402
from deck_render import DIRECTIVE, Renderer, join_soft_breaks, whole_sentences  # noqa: E402

DECKS = sorted(p.stem for p in (SLIDES / "decks").glob("*.md"))
CODE_DIRECTIVES = ("code", "file", "cell")


@pytest.fixture(scope="module")
def rendered(tmp_path_factory):
    """Every deck rendered from the reference results alone: deck -> (Markdown, renderer)."""
    os.environ["WORKSHOP_RUNS"] = str(tmp_path_factory.mktemp("runs"))  # no run folder: the reference alone
    results = build.find_results(None, REFERENCE)
    return {deck: (renderer.render((SLIDES / "decks" / f"{deck}.md").read_text()), renderer)
            for deck in DECKS for renderer in [Renderer(results, deck)]}


def _code_directives(deck: str):
    for match in DIRECTIVE.finditer((SLIDES / "decks" / f"{deck}.md").read_text()):
        if match.group(1) in CODE_DIRECTIVES:
            options = dict(token.partition("=")[::2] for token in shlex.split(match.group(2)) if "=" in token)
            yield match.group(0), options


# ------------------------------------------------------------------------------------------- the decks


@pytest.mark.parametrize("deck", DECKS)
def test_every_code_excerpt_names_its_call_and_ends_at_the_statement_holding_it(deck, rendered):
    """01's all-reduce slide stopped before dist.all_reduce, 03's profiler slide before the profiler: an excerpt now
    names the call it is about (shows=...), and the build refuses one that would stop before it."""
    text, renderer = rendered[deck]
    assert not [m for m in renderer.missing if "code" in m or "file" in m or "cell" in m], renderer.missing
    blocks = re.findall(r"```(python|bash)\n(.*?)\n```", text, re.S)
    for directive, options in _code_directives(deck):
        assert options.get("shows"), f"{deck}: {directive} does not say which call it shows (shows=...)"
        lang = "bash" if re.search(r"\.(sbatch|sh)\b", directive) else "python"
        holding = [code for kind, code in blocks if kind == lang and options["shows"] in code]
        assert holding, f"{deck}: no excerpt shows {options['shows']!r}"
        for code in holding:
            body = code.splitlines()
            if body[-1] == "# ... (continues in the source)":
                body = body[:-1]
            end = max(i for i, line in enumerate(body) if options["shows"] in line) + 1
            while end < len(body) and not build.whole_code("\n".join(body[:end]), lang):
                end += 1
            assert end == len(body), f"{deck}: the excerpt goes on past the statement holding {options['shows']!r}"
            assert build.whole_code("\n".join(body), lang)


def test_an_excerpt_that_would_cut_its_call_is_refused_not_shortened():
    source = "def f(x):\n    a = 1\n    b = 2\n    c = 3\n    return dist.all_reduce(\n        x)\n"
    assert Renderer.excerpt(source, None, None, 6, "python", shows="dist.all_reduce").splitlines()[-1] == "        x)"
    with pytest.raises(LookupError, match="after max_lines=4"):
        Renderer.excerpt(source, None, None, 4, "python", shows="dist.all_reduce")
    cut = Renderer.excerpt(source, None, None, 9, "python", shows="b = 2")
    assert cut.splitlines() == ["def f(x):", "    a = 1", "    b = 2", "# ... (continues in the source)"]


@pytest.mark.parametrize("deck", DECKS)
def test_no_slide_text_is_cut_off_with_an_ellipsis(deck, rendered):
    text, _ = rendered[deck]
    visible = re.sub(r"<!--.*?-->|```.*?```", "", text, flags=re.S)
    pieces = [piece.strip() for piece in re.split(r"<[^>]+>|\n", visible)]
    assert not [piece for piece in pieces if piece.endswith(("…", "..."))], deck


def test_sentences_are_kept_whole():
    text = "First one is here. Second one (a, b) is longer than the limit allows. Third."
    assert whole_sentences(text, 30) == "First one is here."
    assert whole_sentences(text, 5) == "First one is here."  # at least the first, never cut inside it
    assert whole_sentences("a; b; c;", 100) == "a; b; c"


@pytest.mark.parametrize("deck", DECKS)
def test_each_deck_names_the_commit_its_numbers_were_measured_at(deck, rendered):
    commits = {json.loads(p.read_text()).get("git_commit") for p in (REFERENCE / "results").glob("*.json")}
    commit = max(commits - {None}, key=lambda c: sum(
        json.loads(p.read_text()).get("git_commit") == c for p in (REFERENCE / "results").glob("*.json")))
    assert f"at commit <code>{commit[:7]}</code>" in rendered[deck][0]
    assert commit[:7] in (REFERENCE / "RUN.md").read_text()  # the one RUN.md names


def test_a_cap_is_never_labelled_out_of_memory(rendered):
    """03's batch slide said "out of memory" where a 600 MiB cap stopped the CPU sweep."""
    text = rendered["03_optimization"][0]
    slide = next(s for s in text.split("\n---\n") if "Batch size: throughput against memory" in s)
    assert "over the 600 MiB cap" in slide and "out of memory" not in slide.split("<!--")[0]
    capped = {"text": "Memory limit: a cap of 600 MiB.",
              "table": [{"batch_size": 512, "status": "out of memory at batch 512"}]}
    assert memory_stop_label(table_rows(capped)[0]["status"]) == "over the 600 MiB cap"
    device = {"text": "Memory limit: the GPU memory.",
              "table": [{"batch_size": 8192, "status": "out of memory at batch 8192"}]}
    assert memory_stop_label(table_rows(device)[0]["status"]) == "out of memory"
    assert memory_stop_label("ok") is None


def test_a_paragraph_wrapped_in_the_source_is_one_line_on_the_slide():
    source = ("---\nmarp: true\ntheme: workshop\n---\n\n- **1** a sentence\n  that goes on\n- two\n\n"
              "```bash\na \\\n  b\n```\n<!--\nnote\nmore\n-->\npara\nstill para\n| a |\n| b |\n")
    joined = join_soft_breaks(source)
    assert "marp: true\ntheme: workshop" in joined  # the front matter keeps its lines
    assert "- **1** a sentence that goes on\n- two" in joined and "para still para" in joined
    assert "a \\\n  b" in joined and "note\nmore" in joined and "| a |\n| b |" in joined


@pytest.mark.parametrize("deck", DECKS)
def test_no_list_item_breaks_mid_sentence(deck, rendered):
    outside = re.sub(r"<!--.*?-->|```.*?```", "", rendered[deck][0], flags=re.S)
    lines = outside.splitlines()
    continued = [b for a, b in zip(lines, lines[1:]) if re.match(r"\s*[-*] ", a) and re.match(r"\s{2,}[^\s<|-]", b)]
    assert not continued, continued


def _slides(deck: str) -> list[str]:
    """A deck template's slides, speaker notes left out."""
    text = (SLIDES / "decks" / f"{deck}.md").read_text()
    return [re.sub(r"<!--.*?-->", "", slide, flags=re.S) for slide in text.split("\n---\n")]


@pytest.mark.parametrize("deck", DECKS)
def test_every_deck_shows_the_gpt(deck, rendered):
    """The GPT is the day's second workload: decks 00 and 04 never named it on a slide."""
    text, _ = rendered[deck]
    assert "GPT" in re.sub(r"<!--.*?-->", "", text, flags=re.S), deck


@pytest.mark.parametrize("deck", DECKS)
def test_a_slide_quoting_a_record_says_where_it_was_measured(deck):
    """01's GPT slide quoted tokens/s with no run, profile or commit beside them. A slide quoting a value of a
    measurement record (not a report section, which says so itself) shows a {{measured}} line, a section or a
    figure of that run."""
    for slide in _slides(deck):
        for name in set(re.findall(r"\{\{value ([\w.-]+)", slide)):
            record = REFERENCE / "results" / f"{name}.json"
            if not record.is_file() or json.loads(record.read_text()).get("kind") == "section":
                continue
            assert re.search(rf"\{{\{{measured {re.escape(name)}\b|\{{\{{section |\{{\{{figure ", slide), \
                f"{deck}: a slide quotes {name} without saying where it was measured"


def test_the_measured_line_names_the_run_profile_commit_and_record(rendered):
    text, _ = rendered["01_fundamentals"]
    slide = next(s for s in text.split("\n---\n") if "The second workload" in s)
    line = re.search(r'<p class="fineprint">(Measured by notebook 01[^<]*)</p>', slide).group(1)
    record = json.loads((REFERENCE / "results" / "gpt.json").read_text())
    profile = json.loads((REFERENCE / "reference.json").read_text())["profile"]
    assert f"at its {profile} profile" in line and f"at commit {record['git_commit'][:7]}" in line
    assert f"{record['config']['batch_size']} × {record['config']['sequence_length']} tokens a step" in line
    assert "results/reference/results/gpt.json" in line and "the reference run of" in line
    results = build.find_results(None, REFERENCE)
    renderer = Renderer(results, "x")
    assert "missing" in renderer.render('{{measured no-such-record notebook="01"}}')
    assert renderer.missing == ["x: record no-such-record is in no run folder and not in the reference results "
                                "(run `make run` first)"]


def test_deck_03_shows_the_gpts_precision_and_what_bounds_each_gpt_rung(rendered):
    text, renderer = rendered["03_optimization"]
    slides = text.split("\n---\n")
    precision = next(s for s in slides if "The same modes on the GPT" in s)
    section = json.loads((REFERENCE / "results" / "section-precision-gpt.json").read_text())
    assert f"{section['table'][1]['tokens/s']:,.0f}" in precision  # the section's own table
    seed = json.loads((REFERENCE / "results" / "gpt-fp32-seed1.json").read_text())
    spread = abs(seed["metrics"]["final_test_loss"] - section["table"][0]["test loss (nats/token)"])
    assert f"seed-to-seed spread of {spread:.3f}" in precision
    ladder = next(s for s in slides if "The GPT's own ladder" in s)
    assert 'data-chart="gpt_ladder_breakdown"' in ladder
    assert {"ladder_breakdown", "gpt_ladder_breakdown"} <= {chart.name for chart in renderer.charts}


def test_a_gpt_loss_gap_is_read_against_fp32s_seed_spread():
    from deck_notes import precision_gpt_note

    def section(bf16_loss, note=""):
        return {"table": [{"precision": "fp32", "test loss (nats/token)": 3.0, "speed-up vs fp32": 1.0, "note": ""},
                          {"precision": "bf16", "test loss (nats/token)": bf16_loss, "note": note}]}

    seed = {"gpt-fp32-seed1": {"metrics": {"final_test_loss": 3.02}}}
    inside = precision_gpt_note(section(3.01), seed.get)[0]
    assert "+0.010 nats/token" in inside and "inside fp32's own seed-to-seed spread of 0.020" in inside
    assert "no measurable effect" in inside
    outside = precision_gpt_note(section(3.1), seed.get)[0]
    assert "outside" in outside and "no measurable effect" not in outside
    assert precision_gpt_note(section(3.1, "speed probe: 2 of 40 steps"), seed.get) == \
        ["bf16: speed probe: 2 of 40 steps."]
    assert precision_gpt_note(section(3.01), {}.get) == []  # no second seed: no verdict


def _gpt_run(folder, tokens_per_s, batch=16):
    (folder / f"run-{tokens_per_s}.json").write_text(json.dumps({
        "benchmark": "gpt_throughput", "profile": "gpu",
        "environment": {"device_name": "NVIDIA H100 80GB HBM3", "date": "2026-11-26T00:00:00"},
        "settings": {"modes": ["bf16"], "gpt_size": "gpt2-small", "batch_sequences": batch, "sequence_tokens": 1024,
                     "compile": True},
        "summary": {"bf16_mfu": 0.4, "bf16_tokens_per_s": tokens_per_s}}))


def test_a_jobs_time_is_estimated_from_the_measured_rates_and_says_so(tmp_path):
    from deck_notes import gpt_time_estimate

    _gpt_run(tmp_path, 2**19 / 60)  # one step of 2^19 tokens a minute on one GPU
    _gpt_run(tmp_path, 2**19 / 30)
    _gpt_run(tmp_path, 1.0, batch=64)  # another size: left out
    said = gpt_time_estimate(tokens=str(2**19), batch="16", gpus="4", steps="120", folder=tmp_path)
    assert said.startswith("estimated, not measured") and "H100 80GB HBM3, 2026-11-26" in said
    assert "take 15 to 30 minutes on 4 GPUs" in said  # 120 steps of 30 or 60 GPU-seconds, on 4 GPUs
    assert "no GPU run" in gpt_time_estimate(batch="16", folder=tmp_path / "empty")


def test_the_gpt_job_on_deck_04_asks_for_gpt_2s_batch_with_real_flags():
    """The command trains what the slide says: --gpus x --batch-size x --accumulation-steps x the context is 2^19
    tokens, the estimate beside it is of that many tokens and steps, and every flag is one the module takes."""
    slide = next(s for s in _slides("04_slurm") if "The GPT as a batch job" in s)
    block = re.search(r"```bash\n(.*?)```", slide, re.S).group(1).replace("\\\n", " ")
    tokens = shlex.split(block)
    option = {t.split("=")[0]: t.split("=", 1)[1] for t in tokens if t.startswith("--") and "=" in t}
    value = lambda flag: tokens[tokens.index(flag) + 1]
    context = wu.GPT_SIZES[value("--gpt-size")].context
    batch = int(option["--gpus"]) * int(value("--batch-size")) * int(value("--accumulation-steps")) * context
    assert batch == 2**19
    estimate = re.search(r"\{\{gpu gpt_time ([^}]*)\}\}", slide).group(1)
    assert f"tokens={batch}" in estimate and f"steps={value('--steps')}" in estimate
    assert f"gpus={option['--gpus']}" in estimate and f"batch={value('--batch-size')}" in estimate
    helped = subprocess.run([sys.executable, "-m", "workshop_utils.train", "--help"], capture_output=True, text=True,
                            cwd=REPO, timeout=300).stdout
    script = tokens.index("slurm/train_one_node.sbatch")
    for token in tokens[script + 1:]:
        if token.startswith("--"):
            assert re.search(rf"(?<![\w-]){re.escape(token)}(?![\w-])", helped), token


def test_the_storage_chart_names_no_device_memory_on_a_cpu():
    """04's I/O chart said "device memory" for a CPU run, where the device is the CPU and its memory the host's."""
    import deck_charts

    section = json.loads((REFERENCE / "results" / "section-io.json").read_text())

    def labels(device_type):
        record = {**section, "environment": {**section["environment"], "device_type": device_type}}
        drawn = deck_charts.draw("io_layouts", {"section-io": record}, 590, 260)
        return " ".join(t.get_text() for t in drawn.figure.axes[0].get_yticklabels())

    assert "device memory" not in labels("cpu") and "GPU" not in labels("cpu") and "host memory" in labels("cpu")
    assert "in GPU memory" in labels("cuda")


# ------------------------------------------------------------------------------------------- measurements


@pytest.fixture(scope="module")
def small_images():
    return wu.make_synthetic_cifar(256, 64, seed=0)


def test_step_memory_is_the_same_for_the_same_computation_whatever_ran_before(small_images, fake_cpu):
    """The first mode run in a process paid the allocator's growth: tf32 (plain fp32 on a CPU) showed half of
    fp32's peak. One step's tensor memory is counted the same way for every mode, in any order. Counted from the
    allocation records, which do not depend on the CPU's instructions: bf16 is measured as on a CPU that has them."""
    fake_cpu("avx512-bf16")
    config = wu.TrainConfig(model="simplecnn", batch_size=32, device="cpu", progress=False)
    first = wu.step_memory(config.replace(precision="fp32"), small_images)
    bf16 = wu.step_memory(config.replace(precision="bf16"), small_images)
    tf32 = wu.step_memory(config.replace(precision="tf32"), small_images)
    again = wu.step_memory(config.replace(precision="fp32"), small_images)
    assert first["step_memory_mib"] == tf32["step_memory_mib"] == again["step_memory_mib"] > 0
    assert bf16["step_memory_mib"] < first["step_memory_mib"]  # bf16 activations, at a batch where they dominate
    assert "profiler's allocation records" in first["step_memory_measure"]


def test_step_memory_says_why_a_mode_this_cpu_emulates_is_not_measured(small_images, fake_cpu):
    fake_cpu("avx2")
    config = wu.TrainConfig(model="simplecnn", batch_size=32, device="cpu", progress=False, precision="bf16")
    bf16 = wu.step_memory(config, small_images)
    assert bf16["step_memory_mib"] is None
    assert bf16["step_memory_measure"].startswith("not measured: bf16 autocast is emulated on this CPU (AVX2")


def test_the_mode_table_shows_step_memory_not_a_runs_resident_peak():
    record = {"config": {"model": "simplecnn", "precision": "fp32", "channels_last": False},
              "metrics": {"steps": 4, "samples_per_s": 10.0, "step_ms_median": 1.0, "peak_memory_mib": 276.0,
                          "step_memory_mib": 28.5, "final_train_loss": 2.0, "final_test_acc": 0.3}}
    table = wu.mode_table([record])
    assert table["step memory MiB"].tolist() == [28.5] and "peak memory MiB" not in table


def test_profiled_steps_report_the_tensor_memory_the_profiler_counted(small_images, tmp_path):
    """04's memory per step grew 66% in 5 steps under the profiler: that was the profiler's own records in the
    process's resident size. The tensors' peak, from the profiler's allocation records, is flat."""
    config = wu.TrainConfig(batch_size=32, device="cpu", progress=False)
    run = wu.profile_training(config, small_images, tmp_path, wait=0, warmup=1, active=3)
    peaks = run.step_memory.tensor_peak_mib
    assert run.step_memory.step.tolist() == [2, 3, 4] and (peaks > 0).all()
    assert peaks.max() - peaks.min() < 0.01 * peaks.max()
    quick = wu.profile_training(config, small_images, tmp_path / "quick", wait=0, warmup=1, active=1, detail=False)
    assert quick.step_memory.empty  # no memory recorded: nothing claimed


def test_a_trace_that_never_grows_does_not_say_it_grew():
    import pandas as pd

    falling = pd.DataFrame({"step": [1, 2], "scale": [4.0, 2.0], "next scale": [2.0, 1.0], "loss": [1, 1], "event": ""})
    assert wu.plot_scale_trace(falling).axes[0].get_title().startswith("GradScaler: back-off\n")


def _stall(sync_first, sync_later, async_first, async_later, written=40.0):
    rows = [{"mode": "none", "saves": 0, "blocked_ms_per_save": 0.0},
            {"mode": "sync", "saves": 3, "blocked_ms_per_save": (sync_first + 2 * sync_later) / 3,
             "first_save_blocked_ms": sync_first, "later_saves_blocked_ms": sync_later},
            {"mode": "async", "saves": 3, "blocked_ms_per_save": (async_first + 2 * async_later) / 3,
             "first_save_blocked_ms": async_first, "later_saves_blocked_ms": async_later,
             "background_write_ms": written}]
    return {"rows": rows, "state_mib_per_rank": 14.2}


def test_the_checkpoint_sentence_says_what_the_numbers_show():
    """05 said async_save "blocks only for the copy" above a chart where it blocked twice as long as dcp.save."""
    gained = wu.stall_summary(_stall(200, 190, 210, 80))
    assert "blocked training 80 ms a save, the copy of this state (14.2 MiB per rank)" in gained
    assert "where dcp.save blocked 190 ms" in gained and "first call blocked 210 ms" in gained
    even = wu.stall_summary(_stall(60, 53, 150, 55))
    assert "no less than dcp.save's 53 ms" in even and "no write to hide" in even and "shared file systems" in even
    old = wu.stall_summary({"rows": [{"mode": "sync", "saves": 2, "blocked_ms_per_save": 53.0},
                                     {"mode": "async", "saves": 2, "blocked_ms_per_save": 104.6}]})
    assert old.startswith("Per save, dcp.async_save blocked training 105 ms a save (its copy") and "53 ms" in old


# ------------------------------------------------------------------------------------------- noise


def test_a_progress_bar_in_a_kernel_rewrites_one_output_and_leaves_it_empty(monkeypatch):
    """tqdm on stderr left a blank stderr strip under every training cell in JupyterLab."""
    from workshop_utils.system import progress

    shown = []

    class Handle:
        def update(self, data, raw):
            shown.append(("update", data["text/plain"]))

    def display(data, raw, display_id):
        shown.append(("display", data["text/plain"]))
        return Handle()

    monkeypatch.setattr("IPython.display.display", display)
    monkeypatch.setitem(sys.modules, "ipykernel", sys.modules.get("ipykernel") or type(sys)("ipykernel"))
    monkeypatch.setattr(progress, "in_kernel", lambda: True)
    bar = progress.progress_bar(range(3), desc="run", mininterval=0)
    assert not bar.leave
    for _ in bar:
        pass
    assert shown[0][0] == "display" and all(kind == "update" for kind, _ in shown[1:])
    assert shown[-1] == ("update", "") and any("run" in text for _, text in shown)


def test_the_saved_copy_drops_a_closed_bars_empty_line(tmp_path):
    import nbformat

    from workshop_utils.run_notebooks import settle_streams

    cell = nbformat.v4.new_code_cell("train()", outputs=[
        nbformat.v4.new_output("display_data", data={"text/plain": ""}),
        nbformat.v4.new_output("stream", name="stdout", text="trained\n"),
        nbformat.v4.new_output("display_data", data={"text/plain": "", "image/png": "iVBO"})])
    path = tmp_path / "executed.ipynb"
    nbformat.write(nbformat.v4.new_notebook(cells=[cell]), path)
    settle_streams(path)
    kept = nbformat.read(path, as_version=4).cells[0].outputs
    assert [o.output_type for o in kept] == ["stream", "display_data"]  # the figure stays


def test_the_synthetic_banner_is_shown_once_per_launch(monkeypatch, capsys):
    """02 printed the nine-line banner seven times: once per launch's rank 0."""
    from workshop_utils.parallel import launch
    from workshop_utils.spine import data

    monkeypatch.setattr(data, "_banner_shown", False)
    monkeypatch.delenv(data.SYNTHETIC_SHOWN, raising=False)
    assert data.SYNTHETIC_SHOWN not in launch.job_env(1)
    data.announce_synthetic(["/nowhere"])
    data.announce_synthetic(["/nowhere"])
    err = capsys.readouterr().err
    assert err.count("NO CIFAR-10 FOUND") == 2 and err.count("#####\n") == 2  # the banner once, then one line
    assert launch.job_env(1)[data.SYNTHETIC_SHOWN] == "1"  # and the ranks of the next launch say it in one line


def test_a_relayed_banner_marks_it_shown(monkeypatch):
    from workshop_utils.parallel import launch
    from workshop_utils.spine import data

    monkeypatch.setattr(data, "_banner_shown", False)
    monkeypatch.delenv(data.SYNTHETIC_SHOWN, raising=False)
    banner = [sys.executable, "-c", "print('#  NO CIFAR-10 FOUND: using a SYNTHETIC set'); print('Data: synthetic')"]
    launch.stream({"": banner}, dict(os.environ), 60, echo=True)
    assert data.synthetic_banner_shown()


def test_the_printed_launch_line_pastes_into_a_shell(monkeypatch, capsys):
    """02's `$ torchrun ... --name gpt-no_sync, 25 MiB buckets` could not be pasted: the line is shell-quoted."""
    from workshop_utils.parallel import launch

    monkeypatch.setattr(launch, "stream", lambda *a, **k: ([0], []))
    launch.launch_torchrun("workshop_utils.train", ["--name", "gpt-no_sync, 25 MiB buckets", "--steps", "2"],
                           nproc=1, device="cpu", check=False)
    line = next(l for l in capsys.readouterr().out.splitlines() if l.startswith("$ torchrun "))
    words = shlex.split(line[2:])
    assert words[words.index("--name") + 1] == "gpt-no_sync, 25 MiB buckets"


def test_a_single_bucket_within_the_noise_says_so():
    import types

    row = types.SimpleNamespace(bucket_cap_mb=25, buckets=1, compute_ms=30.0, communication_ms=5.0,
                                overlapped_ms=44.0, exposed_ms=14.0, exposed_p25_ms=-6.0, exposed_p75_ms=28.1)
    assert "within this machine's noise" in wu.overlap_sentence(row)
    row.exposed_p25_ms = 2.0
    assert "noise" not in wu.overlap_sentence(row)


# ------------------------------------------------------------------------------------------- the docs


def test_the_readme_counts_the_gpu_checks_paths_as_its_record_does():
    record = json.loads(next((REFERENCE / "gpu").glob("gpu_check-*.json")).read_text())
    paths = record["paths"]
    passed = sum(p.get("status") == "ok" for p in paths)
    not_checked = sum(p.get("status") == "not checked" for p in paths)
    readme = " ".join((REPO / "README.md").read_text().split())
    assert f"all {passed} of its one-GPU paths passed and its {not_checked} two-GPU paths were not checked" in readme
    assert f"commit {record['git_commit'][:7]}" in readme


def test_every_documented_preflight_job_names_the_kits_environment():
    """Without WORKSHOP_VENV the pre-flight job ran the bare `python`: `python: command not found`."""
    for page in ("docs/preflight.md", "slides/INSTRUCTOR.md"):
        text = (REPO / page).read_text().replace("\\\n", " ")
        lines = [line for line in text.splitlines() if "sbatch" in line and "preflight.sbatch" in line]
        assert lines and all("WORKSHOP_VENV=" in line for line in lines), page
    assert "6 × 300 s" in (REPO / "docs" / "preflight.md").read_text()


def test_troubleshooting_gives_no_flag_the_kits_runner_refuses():
    text = (REPO / "docs" / "troubleshooting.md").read_text()
    for flag in re.findall(r"`-p [^`]*`", text):
        line = next(line for line in text.splitlines() if flag in line)
        assert "papermill" in line, f"{flag}: the kit's runner has no -p"
    for symptom in ("CUDA out of memory", "NCCL_DEBUG=INFO", "Kernel Restarting"):
        assert symptom in text


def test_the_license_is_the_one_pyproject_names():
    assert 'license = { text = "MIT" }' in (REPO / "pyproject.toml").read_text()
    assert (REPO / "LICENSE").read_text().startswith("MIT License")


def test_a_git_pull_on_an_offline_node_installs_again_from_the_wheel_folder(tmp_path):
    """After pyproject.toml changed, make re-ran `python3 -m venv` (dropping the image's packages) and an online
    pip install on the node without internet. The settings install-offline recorded are used again."""
    import shutil

    if shutil.which("make") is None:
        pytest.skip("make not installed")
    shutil.copy(REPO / "Makefile", tmp_path / "Makefile")
    log = tmp_path / "calls.log"
    fake = tmp_path / "fake-python"
    fake.write_text(f"#!/bin/sh\necho \"$0 $*\" >> {log}\n")
    fake.chmod(0o755)
    (tmp_path / "wheelhouse").mkdir()
    venv = tmp_path / ".venv"
    (venv / "bin").mkdir(parents=True)
    shutil.copy(fake, venv / "bin" / "python")
    settings = f"WHEELHOUSE=wheelhouse SYSTEM_SITE_PACKAGES=yes EXTRAS=none PYTHON={fake}\n"
    (venv / ".offline-install").write_text(settings)
    (venv / ".installed-stamp").touch()
    os.utime(venv / ".installed-stamp", (1, 1))
    (tmp_path / "pyproject.toml").write_text("[project]\nname = 'x'\n")  # newer than the stamp: a git pull
    done = subprocess.run(["make", "install"], cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    calls = log.read_text()
    assert "-m venv --system-site-packages .venv" in calls and "--no-index --find-links wheelhouse" in calls
    assert "installed offline" in done.stdout
