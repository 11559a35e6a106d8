"""The notebooks as users run them, each one executed exactly once per test session.

The session fixture ``main_run`` runs the main job (``python -m workshop_utils.run_notebooks``, what
``make run`` does) once over every notebook in notebooks/, with the cpu profile, into one run folder:
papermill executes each notebook headless and passes it the run folder and the profile. The tests
below then read what that run recorded: notebooks.json, the executed copies in ``<run>/notebooks/``,
the results and figures, and report.md. Nothing else in the suite executes a real notebook in its solved
form (tests/test_run_notebooks.py uses tiny notebooks of its own; the attendee copies run through nbval
in tests/test_attendee_notebooks.py). nbval's expectations are checked on this run's executed copies
(tests/test_nbval.py says how), not by executing the solved notebooks again.
"""

import json
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import nbformat
import pytest
from helpers import ACCURACY_FLOOR_PCT, HANG_LIMIT_FACTOR
from nbval_expected import compared, sanitize_patterns

from workshop_utils.system.profiles import TIME_BUDGET_S, notebook_profiles

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
BASELINE = ROOT / "notebooks" / "01_single_gpu_baseline.ipynb"
NBVAL = ROOT / "tests" / "nbval"  # what nbval expects of the cells whose output is the same on every machine
PROFILE = "cpu"
BUDGET_S = TIME_BUDGET_S[PROFILE]
# A notebook that hangs is stopped and reported failed; the others still run. Over budget is shown, not failed.
NOTEBOOK_LIMIT_S = HANG_LIMIT_FACTOR * BUDGET_S
RUN_LIMIT_S = len(NOTEBOOKS) * NOTEBOOK_LIMIT_S + 120

# The first test to ask for main_run waits for the whole run: pytest's per-test timeout must cover it.
pytestmark = pytest.mark.timeout(RUN_LIMIT_S + 60)


def _ids(path: Path) -> str:
    return path.stem


def _code(notebook: Path) -> list:
    return [c for c in nbformat.read(notebook, as_version=4).cells if c.cell_type == "code"]


def _section_keys(notebook: Path) -> list[str]:
    """The report sections a notebook writes: the keys of its ``add_report_section(run_dir, "<key>", ...)`` calls."""
    return re.findall(r'add_report_section\(\s*run_dir,\s*"([^"]+)"', "\n".join(c.source for c in _code(notebook)))


@dataclass
class MainRun:
    dir: Path
    proc: subprocess.CompletedProcess
    log: dict  # notebook name -> its notebooks.json entry
    names: list  # notebooks.json's order
    report: str


@pytest.fixture(scope="session")
def main_run(tmp_path_factory) -> MainRun:
    """The one execution of every notebook in this session: the main job with the cpu profile."""
    run_dir = tmp_path_factory.mktemp("main-run")
    proc = subprocess.run([sys.executable, "-m", "workshop_utils.run_notebooks", "--profile", PROFILE,
                           "--run-dir", str(run_dir), "--timeout", str(NOTEBOOK_LIMIT_S)],
                          capture_output=True, text=True, timeout=RUN_LIMIT_S)
    log_path, report_path = run_dir / "notebooks.json", run_dir / "report.md"
    assert log_path.exists() and report_path.exists(), proc.stdout[-2000:] + proc.stderr[-3000:]
    log = json.loads(log_path.read_text())
    return MainRun(run_dir, proc, {e["notebook"]: e for e in log}, [e["notebook"] for e in log],
                   report_path.read_text())


# ---------------------------------------------------------------------- as committed (no execution)


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=_ids)
def test_committed_without_outputs_and_with_parameters(notebook):
    code = _code(notebook)
    assert all(not c.outputs and c.execution_count is None for c in code), "clear outputs before committing"
    parameters = [c for c in code if "parameters" in c.metadata.get("tags", [])]
    assert len(parameters) == 1 and code[0] is parameters[0]
    assert 'profile = "auto"' in parameters[0].source and "run_dir = None" in parameters[0].source
    assert _section_keys(notebook), "every notebook adds at least one section to the main job's report"


def test_notebooks_name_the_kernel_that_the_readme_and_the_makefile_register():
    readme = re.search(r"ipykernel install --prefix \S+ \\?\s*--name (\S+)", (ROOT / "docs" / "portal.md").read_text()).group(1)
    makefile = re.search(r"^KERNEL := (\S+)$", (ROOT / "Makefile").read_text(), re.M).group(1)
    names = {nbformat.read(n, as_version=4).metadata["kernelspec"]["name"] for n in NOTEBOOKS}
    assert names == {readme} == {makefile}


# ---------------------------------------------------------------------- the main job's one run


@pytest.mark.notebook
def test_the_main_job_ran_every_notebook_once_and_each_passed(main_run):
    proc = main_run.proc
    failed = {n: e["error"] for n, e in main_run.log.items() if e["status"] != "ok"}
    assert proc.returncode == 0 and not failed, f"{failed}\n{proc.stderr[-3000:]}"
    assert main_run.names == [p.name for p in NOTEBOOKS], "each notebook exactly once, in name order"
    for name, entry in main_run.log.items():
        assert (entry["status"], entry["profile"], entry["budget_s"], entry["limit_s"], entry["error"],
                entry["cell"], entry["timed_out"], entry["check"]) \
            == ("ok", PROFILE, BUDGET_S, NOTEBOOK_LIMIT_S, "", None, False, False), entry
        assert 0 < entry["seconds"] < NOTEBOOK_LIMIT_S and entry["over_budget"] == (entry["seconds"] > BUDGET_S), entry
        # The console and the report say the same, whether or not this machine kept to the budget.
        word, cell = ("SLOW   ", "ok, **over budget**") if entry["over_budget"] else ("ok     ", "ok")
        assert f"{word} {name} {entry['seconds']:.1f} s" in proc.stdout
        assert f"| {name} | {cell} | {entry['seconds']:.1f} | {BUDGET_S} |" in main_run.report
        assert (main_run.dir / "notebooks" / name).exists(), "the executed copy is kept"
    assert f"Profile {PROFILE} (asked for); {len(NOTEBOOKS)} notebook(s)" in proc.stdout


@pytest.mark.notebook
@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=_ids)
def test_executed_notebook_got_its_parameters_and_no_cell_failed(main_run, notebook):
    executed = nbformat.read(main_run.dir / "notebooks" / notebook.name, as_version=4)
    code = [c for c in executed.cells if c.cell_type == "code"]
    injected = [c for c in code if "injected-parameters" in c.metadata.get("tags", [])]
    assert len(injected) == 1 and code[1] is injected[0], "papermill injects right after the parameters cell"
    namespace: dict = {}
    exec(injected[0].source, namespace)  # noqa: S102 - papermill writes plain assignments
    assert namespace["profile"] == PROFILE and Path(namespace["run_dir"]) == main_run.dir.resolve()
    errors = [(c.execution_count, o.get("ename"), o.get("evalue")) for c in code for o in c.outputs
              if o.output_type == "error"]
    assert not errors, errors
    unrun = [c.source.splitlines()[:1] for c in code
             if c.execution_count is None or c.metadata.get("papermill", {}).get("status") != "completed"]
    assert not unrun, f"cells not run to completion: {unrun}"


@pytest.mark.notebook
@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=_ids)
def test_the_saved_copy_holds_no_wall_of_progress_bars(main_run, notebook):
    """What GitHub or nbviewer shows of a run's copy: one settled text per stream, no refresh of a bar."""
    executed = nbformat.read(main_run.dir / "notebooks" / notebook.name, as_version=4)
    for cell in executed.cells:
        streams = [o for o in cell.get("outputs", []) if o.output_type == "stream"]
        assert not any("\r" in o.text.replace("\r\n", "") for o in streams), cell.source[:80]
        assert not any("it/s]" in o.text or "step/s]" in o.text for o in streams), cell.source[:80]


@pytest.mark.notebook
def test_the_demos_show_what_their_text_says(main_run):
    """Read on this run, not assumed: tf32 (plain fp32 on a CPU) needs fp32's step memory; the GradScaler trace
    both backs off and grows; a cap, not the device, stops the CPU's batch sweep and says so; the checkpoint
    record keeps the first save apart and times the background write, and the report says what it shows."""
    results = main_run.dir / "results"
    record = {name: json.loads((results / f"{name}.json").read_text())["metrics"]
              for name in ("simplecnn-fp32", "simplecnn-tf32")}
    assert record["simplecnn-fp32"]["step_memory_mib"] == record["simplecnn-tf32"]["step_memory_mib"] > 0
    notebook = nbformat.read(main_run.dir / "notebooks" / "03_mixed_precision.ipynb", as_version=4)
    trace = next(c for c in notebook.cells if "wu.grad_scaler_trace(" in c.source)
    shown = " ".join(o.get("data", {}).get("text/plain", "") for o in trace.outputs)
    assert "grew: scale doubled" in shown and "overflow: step skipped" in shown
    sweep = json.loads((results / "section-batch_size.json").read_text())
    assert sweep["table"][-1]["status"].startswith("over the 600 MiB memory cap at batch")
    stall = json.loads((results / "beyond-checkpoint.json").read_text())["stall"]
    modes = {row["mode"]: row for row in stall["rows"]}
    assert modes["async"]["background_write_ms"] > 0 and modes["async"]["later_saves_blocked_ms"] is not None
    section = json.loads((results / "section-beyond-checkpoint.json").read_text())
    assert "dcp.async_save blocked training" in section["text"]


@pytest.mark.notebook
@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=_ids)
def test_each_notebook_adds_its_sections_and_figures_to_the_report(main_run, notebook):
    number = notebook.name[:2]
    for key in _section_keys(notebook):
        path = main_run.dir / "results" / f"section-{key}.json"
        assert path.exists(), f"{notebook.name} did not write {path.name}"
        section = json.loads(path.read_text())
        assert section["title"].endswith(f"(notebook {number})"), section["title"]
        assert f"## {section['title']}" in main_run.report
        for figure in section["figures"]:
            assert (main_run.dir / figure).stat().st_size > 5_000, figure
            assert f"]({figure})" in main_run.report, f"{figure} is not shown in report.md"


@pytest.mark.notebook
def test_baseline_record_obeys_the_cpu_profile_it_was_given(main_run):
    """Notebook 01 received profile="cpu" and run_dir from the main job, and its record shows both obeyed."""
    sizes = notebook_profiles(BASELINE)[PROFILE]
    record = json.loads((main_run.dir / "results" / "baseline.json").read_text())
    config, metrics = record["config"], record["metrics"]
    assert (config["epochs"], config["batch_size"], config["num_workers"]) \
        == (sizes["epochs"], sizes["batch_size"], sizes["num_workers"])
    assert metrics["steps"] == sizes["epochs"] * (sizes["train_size"] // sizes["batch_size"])
    assert metrics["parameters"] == 2_474_506 and metrics["data_source"] == "synthetic"
    assert len(record["step_loss"]) == metrics["steps"]
    section = json.loads((main_run.dir / "results" / "section-baseline.json").read_text())
    assert section["title"] == "Single-GPU baseline (notebook 01)" and f"{PROFILE} profile" in section["text"]
    assert (main_run.dir / "figures" / "baseline_curves.png").stat().st_size > 10_000
    assert "## Single-GPU baseline (notebook 01)" in main_run.report and "| throughput" in main_run.report
    assert "Synthetic data" in main_run.report  # no CIFAR-10 here, and the report says so


@pytest.mark.slow
def test_main_job_rejects_an_unknown_notebook(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "workshop_utils.run_notebooks", "--only", "99",
                           "--run-dir", str(tmp_path / "run")], capture_output=True, text=True)
    assert proc.returncode == 2 and "No notebook" in proc.stderr
    assert not (tmp_path / "run").exists()


@pytest.mark.notebook
@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=_ids)
def test_every_exercise_check_passes_in_the_solved_notebooks(main_run, notebook):
    """The committed notebooks hold the solutions: each check cell must print its ✓ line.

    A check on an answer left as the placeholder does not raise (the attendees' copies run through),
    so a solution that still held one would otherwise pass unnoticed.
    """
    executed = nbformat.read(main_run.dir / "notebooks" / notebook.name, as_version=4)
    checks = [c for c in executed.cells if c.cell_type == "code" and "check" in c.metadata.get("tags", [])]
    for cell in checks:
        # a check's line is a stream outside a kernel, shown as bold HTML with its text/plain beside it inside one
        text = "".join(o.get("text", "") + str(o.get("data", {}).get("text/plain", "")) for o in cell.outputs
                       if o.output_type in ("stream", "display_data"))
        assert "✓ Exercise" in text and "not yet solved" not in text, (cell.source, text)


@pytest.mark.notebook
@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=_ids)
def test_stable_outputs_are_the_ones_nbval_expects(main_run, notebook):
    """What ``pytest --nbval-lax notebooks/`` checks, checked on the main job's run instead of a second execution.

    Every cell tagged nbval-check-output is compared with tests/nbval/<notebook>.json as nbval compares it
    (same sanitizer, same skipped keys), so a change that makes nbval fail fails here too.
    """
    patterns = sanitize_patterns()
    expected = json.loads(path.read_text())["cells"] if (path := NBVAL / f"{notebook.stem}.json").exists() else {}
    cells = {c.id: c for c in nbformat.read(main_run.dir / "notebooks" / notebook.name, as_version=4).cells}
    for cell_id, outputs in expected.items():
        ran = compared(cells[cell_id].outputs, patterns)
        assert ran == compared(outputs, patterns), (
            f"{notebook.name}, cell {cell_id} ({cells[cell_id].source.splitlines()[0]}): its output is not the one "
            f"recorded in tests/nbval/ (python tests/nbval_expected.py <run> records a new one)\n"
            f"recorded: {compared(outputs, patterns)}\nthis run: {ran}")


ACCURACY_COMPARED = ("baseline", "ddp-", "simplecnn-", "resnet18-", "ladder-")  # records whose accuracies a table compares


@pytest.mark.notebook
def test_every_compared_accuracy_is_above_20_percent_and_below_100(main_run):
    """Comparisons of accuracy mean something only between chance (10%) and a saturated 100%.

    The floor sits below every seed of every such run recorded on both kinds of CPU, with a margin
    (helpers.ACCURACY_FLOOR_PCT; tests/test_expectations.py holds the recorded spread to it).

    A run cut to a few steps (a precision the CPU only emulates) is a speed probe whose accuracy the
    table leaves blank; it is left out here for the same reason.
    """
    records = {}
    for path in (main_run.dir / "results").glob("*.json"):
        record = json.loads(path.read_text())
        if path.stem.startswith(ACCURACY_COMPARED) and record.get("kind") == "train":
            records[path.stem] = record
    assert {"baseline", "ddp-strong-1", "simplecnn-fp32", "resnet18-fp32", "ladder-0-baseline"} <= set(records)
    longest = {}
    for name, record in records.items():
        key = (name.split("-")[0], record["config"]["channels_last"])
        longest[key] = max(longest.get(key, 0), record["metrics"]["steps"])
    for name, record in records.items():
        if name.startswith(("simplecnn-", "resnet18-")) and \
                record["metrics"]["steps"] < longest[(name.split("-")[0], record["config"]["channels_last"])]:
            continue
        accuracy = record["metrics"]["final_test_acc"]
        assert ACCURACY_FLOOR_PCT < 100 * accuracy < 100, f"{name}: test accuracy {100 * accuracy:.1f}%"


@pytest.mark.notebook
@pytest.mark.parametrize("notebook", [n for n in NOTEBOOKS if n.name[:2] in ("01", "02", "03", "04", "05")], ids=_ids)
def test_every_session_ends_its_demos_with_what_you_should_see(main_run, notebook):
    """Each demo says in one line whether its number is in the expected range, and the main job's are."""
    executed = nbformat.read(main_run.dir / "notebooks" / notebook.name, as_version=4)
    text = "".join(o.get("text", "") + str(o.get("data", {}).get("text/plain", ""))
                   for c in executed.cells if c.cell_type == "code" for o in c.outputs)
    lines = [line for line in text.splitlines() if "What you should see" in line or "accuracy in range" in line]
    assert lines, f"{notebook.name}: no 'what you should see' line"
    # accuracies, the GPT's loss and its shards' bytes are deterministic on a CPU: the cpu profile's must land in
    # their range (speeds may not, on a busy runner)
    deterministic = ("test accuracy", "unigram entropy", "FSDP2 rank holds")
    assert not [line for line in lines if line.startswith("⚠") and any(d in line for d in deterministic)], lines


@pytest.mark.notebook
@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=_ids)
def test_every_chart_is_shown_inline_as_jupyterlab_shows_it(main_run, notebook):
    """The main job's kernels draw with the inline backend, as JupyterLab's do: every cell that saves a chart
    shows it. Before, only a notebook's first chart appeared (the look's context switched interactive mode off)."""
    executed = nbformat.read(main_run.dir / "notebooks" / notebook.name, as_version=4)
    charts, missing = 0, []
    for index, cell in enumerate(executed.cells):
        if cell.cell_type != "code" or "save_figure(" not in cell.source:
            continue
        if any(output.get("output_type") == "error" for output in cell.outputs):
            continue
        charts += 1
        images = sum("image/png" in output.get("data", {}) for output in cell.outputs)
        if images < cell.source.count("save_figure("):
            missing.append(f"cell {index}: {cell.source.splitlines()[0][:60]}")
    assert charts, "each notebook draws at least one chart"
    assert not missing, f"charts drawn but not shown inline: {missing}"


@pytest.mark.notebook
@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=_ids)
def test_each_notebook_stays_within_the_memory_its_profile_asks_of_a_server(main_run, notebook):
    """A portal sizes attendees' servers by ``memory_gib``: the run's peak (the kernel and all it started) must fit."""
    need = notebook_profiles(notebook)[PROFILE].get("memory_gib")
    peak = main_run.log[notebook.name]["peak_memory_mib"]
    assert need is not None, f"{notebook.name}'s {PROFILE} profile says nothing of the memory it needs (memory_gib)"
    assert 0 < peak <= need * 1024, f"{notebook.name} peaked at {peak} MiB, above its memory_gib={need}"


# ---------------------------------------------------------------------- notebook 05's launches, read from this run
# Notebook 05 launches each multi-process part once in the main job; these tests read what those launches recorded
# (results/beyond-*.json, the checkpoint folder, the executed copy) instead of starting the same parts again.
# tests/test_beyond_dp.py keeps the launches no notebook makes: three ranks, a GPU node's CPU ranks, a time limit.

BEYOND = ROOT / "notebooks" / "05_beyond_data_parallel.ipynb"


def _beyond(main_run, name: str) -> dict:
    return json.loads((main_run.dir / "results" / f"beyond-{name}.json").read_text())


def _beyond_sizes() -> dict:
    return notebook_profiles(BEYOND)[PROFILE]


def _shown_table(main_run, notebook: Path, marker: str) -> list[str]:
    """The text of the table the cell whose source holds ``marker`` showed, line by line."""
    cells = nbformat.read(main_run.dir / "notebooks" / notebook.name, as_version=4).cells
    cell = next(c for c in cells if c.cell_type == "code" and marker in c.source)
    return next(o["data"]["text/plain"] for o in cell.outputs if "text/plain" in o.get("data", {})).splitlines()


@pytest.mark.notebook
def test_every_collective_delivers_what_its_definition_says(main_run):
    """Rank r starts with [10r, 10r + 1, ...] (one element per rank); the root is rank 0."""
    import workshop_utils as wu

    header, *lines = _shown_table(main_run, BEYOND, 'wu.launch_demo("collectives-show"')
    p = len(re.findall(r"rank \d+", header))
    assert header.split() == ["collective", *[f"{word}" for r in range(p) for word in ("rank", str(r))]] and p >= 2
    held = [[10 * r + i for i in range(p)] for r in range(p)]
    column, firsts = [sum(h[i] for h in held) for i in range(p)], [h[0] for h in held]
    expected = {"broadcast": [held[0]] * p, "scatter": [[r] for r in range(p)],
                "gather": [firsts] + ["-"] * (p - 1), "all_gather": [firsts] * p,
                "reduce_scatter": [[column[r]] for r in range(p)], "all_reduce": [column] * p}
    got = {}
    for line in lines:
        name = line.split()[0]
        outputs = re.findall(r"(?:\[[\d ]*\]|-) -> (\[[\d ]*\]|-)", line)
        got[name] = [out if out == "-" else [int(v) for v in out[1:-1].split()] for out in outputs]
    assert list(got) == list(wu.COLLECTIVES), "one row per collective, in the lesson's order"
    assert got == expected


@pytest.mark.notebook
def test_collectives_are_timed_per_size_and_fitted(main_run):
    import workshop_utils as wu

    record = _beyond(main_run, "collectives")
    assert {r["collective"] for r in record["rows"]} == set(wu.COLLECTIVES)
    assert max(r["size_bytes"] for r in record["rows"]) == _beyond_sizes()["max_mib"] * 2**20
    assert all(r["seconds"] > 0 for r in record["rows"])
    table = wu.collective_table(record["rows"])
    assert table[table.collective == "all_reduce"].measured_over_model.notna().all()
    assert table[table.collective == "broadcast"].model_seconds.isna().all()


@pytest.mark.notebook
def test_fsdp_holds_one_share_per_rank_and_follows_ddps_loss_trajectory(main_run):
    import workshop_utils as wu

    record, sizes = _beyond(main_run, "fsdp"), _beyond_sizes()
    ddp, fsdp = record["losses"]["DDP"], record["losses"]["FSDP"]
    assert len(ddp) == len(fsdp) == sizes["fsdp_steps"] and record["model"] == sizes["model"]
    assert max(abs(a - b) for a, b in zip(ddp, fsdp)) < 1e-5
    assert wu.memory_ratio(record) == pytest.approx(1 / record["world_size"], abs=0.01)
    first = next(r for r in record["held_bytes"] if r["strategy"] == "DDP")
    assert first["parameters"] == 4 * record["parameters"] and first["optimizer"] == 8 * record["parameters"]


@pytest.mark.notebook
def test_tensor_parallel_splits_equal_the_unsplit_layer(main_run):
    record, sizes = _beyond(main_run, "tensor-parallel"), _beyond_sizes()
    batch, features, hidden = sizes["tp_batch"], sizes["tp_features"], 4 * sizes["tp_features"]
    assert len(record["rows"]) == 4
    for row in record["rows"]:
        assert row["max_abs_difference"] <= 1e-5 * row["scale"], row["split"]
    assert [row["output_shape"] for row in record["rows"][:2]] == [[batch, hidden], [batch, features]]
    # the hand-written splits train: their input and weight-slice gradients are the unsplit layer's
    # (dist.all_gather alone has no backward: the column split's input gradient would be missing)
    assert all(row["max_grad_difference"] <= 1e-5 for row in record["rows"][:3])


def _tensor_parallel_share(model, world: int) -> float:
    """Parameters a rank holds under split_gpt, as a share of the model: column-wise layers split weight
    and bias, row-wise layers their weight (the bias is added once, after the all-reduce, so every rank
    keeps all of it); everything outside the blocks' six linear layers stays whole."""
    from workshop_utils.parallel.gpt_parallel import COLUMNWISE, ROWWISE

    split = 0
    for block in model.blocks:
        layers = dict(block.named_modules())
        split += sum(p.numel() for name in COLUMNWISE for p in layers[name].parameters())
        split += sum(layers[name].weight.numel() for name in ROWWISE)
    total = sum(p.numel() for p in model.parameters())
    return (total - split + split / world) / total


@pytest.mark.notebook
def test_the_gpt_sharded_and_split_per_block_trains_like_the_unsharded_model(main_run):
    import workshop_utils as wu

    record, sizes = _beyond(main_run, "gpt-parallel"), _beyond_sizes()
    table = wu.gpt_parallel_table(record)
    assert list(table.index) == ["one model (unsharded)", "FSDP2 per block", "FSDP2 per block, bf16 policy",
                                 "tensor parallel per block"] and record["skipped"] == {}
    reference = record["losses"]["one model (unsharded)"]
    assert len(reference) == sizes["gpt_steps"] and reference[-1] < reference[0]  # it learns: equal losses mean more
    for name in ("FSDP2 per block", "tensor parallel per block"):  # fp32 all through: equal to rounding
        assert table.loc[name, "largest_loss_gap"] < 1e-5 and table.loc[name, "weight_gap"] < 1e-3, name
    bf16 = table.loc["FSDP2 per block, bf16 policy"]
    assert 0 < bf16.largest_loss_gap < 3e-2 and bf16.weight_gap < 0.3  # bf16's rounding, not another model
    n, world = record["parameters"], record["world_size"]
    unsharded = table.loc["one model (unsharded)"]
    assert unsharded.parameters_mib * 2**20 == 4 * n and unsharded.optimizer_mib * 2**20 == 8 * n
    assert unsharded.of_unsharded == 1.0
    for name in ("FSDP2 per block", "FSDP2 per block, bf16 policy"):  # the bf16 copies live only while a block runs
        assert table.loc[name, "of_unsharded"] == pytest.approx(1 / world, abs=0.01), name
    expected = _tensor_parallel_share(wu.build_gpt(sizes["gpt_size"]), world)
    assert 1 / world < expected < 1
    assert table.loc["tensor parallel per block", "parameters_mib"] * 2**20 == pytest.approx(4 * n * expected)


@pytest.mark.notebook
def test_distributed_checkpoint_round_trip_and_reshard_into_one_process(main_run):
    import workshop_utils as wu

    record, sizes = _beyond(main_run, "checkpoint"), _beyond_sizes()
    folder, world = main_run.dir / "checkpoints" / "dcp", record["world_size"]
    trip = record["round_trip"]
    assert trip["parameters_equal"]
    assert trip["next_step_loss"]["saved"] == trip["next_step_loss"]["restored"]  # optimizer state restored too
    assert {f["file"] for f in trip["files"]} == {".metadata", *(f"__{rank}_0.distcp" for rank in range(world))}
    single = wu.load_into_one_process(folder / "sharded", wu.build_model(sizes["model"]))
    assert wu.parameter_checksum(single, buffers=False) == trip["parameter_checksum"]
    stall = {r["mode"]: r for r in record["stall"]["rows"]}
    saves = sizes["ckpt_steps"] // sizes["ckpt_every"]
    assert stall["none"]["saves"] == 0 and stall["sync"]["saves"] == stall["async"]["saves"] == saves >= 2
    assert (folder / "stall" / f"async-step{sizes['ckpt_steps']}" / ".metadata").exists()
    # the first save apart from the later ones, the background write timed, the state's size: what the sentence reads
    for mode in ("sync", "async"):
        assert stall[mode]["first_save_blocked_ms"] > 0 and stall[mode]["later_saves_blocked_ms"] > 0
    assert stall["async"]["background_write_ms"] > 0 and stall["sync"]["background_write_ms"] is None
    assert record["stall"]["state_mib_per_rank"] > 0
    assert "dcp.async_save blocked training" in wu.stall_summary(record["stall"])


# ---------------------------------------------------------------------- notebook 02's GPT launches, read from this run
# Section 10 trains the GPT under DDP twice (no_sync() and an all-reduce after every micro-batch) and measures how
# much of the all-reduce the backward pass hides; tests/test_accumulation.py keeps what no notebook launches.


def _ddp_gpt_records(main_run) -> dict:
    """Section 10's two GPT trainings under DDP, by whether they all-reduced every micro-batch."""
    records = [json.loads(path.read_text()) for path in (main_run.dir / "results").glob("ddp-gpt-*.json")]
    runs = {r["config"]["sync_micro_batches"]: r for r in records if r.get("kind") == "train"}
    assert set(runs) == {False, True}, [r["name"] for r in records]
    return runs


@pytest.mark.notebook
def test_no_sync_sends_one_all_reduce_per_step_for_the_same_weights(main_run):
    """Two ranks, several micro-batches a step: no_sync() all-reduces once a step and trains the same model."""
    runs = _ddp_gpt_records(main_run)
    skipped, every = runs[False]["metrics"], runs[True]["metrics"]
    config = runs[False]["config"]
    assert config["accumulation_steps"] > 1 and runs[True]["config"]["bucket_cap_mb"] == config["bucket_cap_mb"]
    assert every["all_reduces"] == config["accumulation_steps"] * skipped["all_reduces"] > 0
    assert skipped["global_batch_size"] == config["batch_size"] * config["accumulation_steps"] * skipped["world_size"]
    assert skipped["world_size"] >= 2
    # The same weights step after step, to rounding: each step's loss and the final evaluation agree.
    assert runs[False]["step_loss"] == pytest.approx(runs[True]["step_loss"], rel=1e-5)
    assert skipped["final_test_loss"] == pytest.approx(every["final_test_loss"], rel=1e-5)


@pytest.mark.notebook
def test_the_overlap_measurement_all_reduces_every_gradient_in_ddps_own_buckets(main_run):
    import math

    import workshop_utils as wu

    record = json.loads((main_run.dir / "results" / "ddp-gpt-overlap.json").read_text())
    size = notebook_profiles(ROOT / "notebooks" / "02_multi_gpu_ddp.ipynb")[PROFILE]["gpt_size"]
    assert (record["backend"], record["model"]) == ("gloo", f"GPT {size}") and record["world_size"] >= 2
    table = wu.overlap_table(record)
    gradient_mib = 4 * wu.count_parameters(wu.build_model("gpt", size=size)) / 2**20
    assert table.gradient_mib.tolist() == pytest.approx([gradient_mib] * len(table))  # each gradient once, in fp32
    rows = sorted(table.itertuples(), key=lambda row: -row.bucket_cap_mb)
    large, small = rows[0], rows[-1]
    assert len(rows) >= 2 and large.buckets >= 1
    assert [row.buckets for row in rows] == sorted({row.buckets for row in rows}), "smaller buckets, more of them"
    assert (table[["compute_ms", "communication_ms", "overlapped_ms"]] > 0).all().all()
    assert ((table.exposed_p25_ms <= table.exposed_ms) & (table.exposed_ms <= table.exposed_p75_ms)).all()
    for row in rows[1:]:
        assert row.hidden_ms == pytest.approx(row.communication_ms - row.exposed_ms)
    if large.buckets == 1:  # every gradient in one bucket, full when the backward pass ends: nothing was hidden
        assert math.isnan(large.hidden_ms) and math.isnan(large.hidden_share)
    for row in table.itertuples():
        assert wu.overlap_sentence(row).startswith(f"{row.bucket_cap_mb:g} MiB buckets ({row.buckets} of them)")
    # Rank 0's trace of one overlapped backward pass with the small buckets: each bucket's all-reduce is in it.
    events = [event.get("name") for event in json.loads((main_run.dir / "traces" / "ddp_overlap.json").read_text())[
        "traceEvents"]]
    assert record["traced_bucket_cap_mb"] == small.bucket_cap_mb and events.count("gloo:all_reduce") == small.buckets


@pytest.mark.notebook
def test_the_ddp_labs_solution_passes_with_every_ranks_record(main_run):
    """Notebook 02 runs the lab's solution through its check: its line, each rank's record and one checkpoint."""
    executed = nbformat.read(main_run.dir / "notebooks" / "02_multi_gpu_ddp.ipynb", as_version=4)
    (cell,) = [c for c in executed.cells if c.cell_type == "code" and "wu.check_ddp_lab(" in c.source]
    text = "".join(o.get("text", "") + str(o.get("data", {}).get("text/plain", "")) for o in cell.outputs)
    assert "✓ Exercise 2.2: correct (3 gloo ranks on two nodes (2 + 1 processes)" in text, text
    check = main_run.dir / "ddp_lab" / "check"
    assert {p.name for p in check.iterdir()} >= {"rank0.json", "rank1.json", "rank2.json", "rank0-params.pt", "out"}
    records = [json.loads((check / f"rank{r}.json").read_text()) for r in range(3)]
    assert [r["samplers"] for r in records] == [[{"rank": r, "num_replicas": 3}] for r in range(3)]
    assert [len(r["saves"]) for r in records] == [1, 0, 0] and all(r["torn_down"] for r in records)
    assert [p.name for p in (check / "out").iterdir()] == ["checkpoint.pt"]
