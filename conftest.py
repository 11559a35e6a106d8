"""Test-wide settings, also seen by the notebooks the main job executes (their kernels inherit the environment).

It also makes ``pytest --nbval-lax notebooks/`` compare what it should: the committed notebooks carry no
outputs, so the expected output of every cell tagged ``nbval-check-output`` comes from
``tests/nbval/<notebook>.json`` (written by ``python tests/nbval_expected.py <run folder>``), and volatile
parts (times, speeds, paths) are masked by ``tests/nbval/sanitize.cfg``. A failing notebook cell is
reported in one line: the notebook, the cell and the error's own first line. With
``WORKSHOP_NBVAL_EXECUTED=<folder>`` nbval's run is also kept: each notebook it executed is written there with
the outputs its cells printed and each cell's outcome (``tests/test_attendee_notebooks.py`` reads them).
"""

import json
import os
import re
import sys
import tempfile
import time
from pathlib import Path

import pytest

# Before anything loads PyTorch: its CPU threads sleep rather than spin while they wait, in this process and
# in every kernel, rank and job the tests start (workshop_utils.system.hardware.wait_passively says why).
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

NBVAL = Path(__file__).resolve().parent / "tests" / "nbval"
CHECKED = "nbval-check-output"
EXECUTED = "WORKSHOP_NBVAL_EXECUTED"
OUTCOME = "nbval_outcome"
ANSI = re.compile(r"\x1b\[[0-9;]*m")


def pytest_addoption(parser):
    parser.addoption("--suite-record", metavar="PATH", default=None,
                     help="write the session's time, outcome counts, slowest tests and environment to PATH (JSON); "
                          "`make test` does, and `python -m workshop_utils.reference --tests PATH` keeps it")


def pytest_configure(config):
    # Results of test runs go to a throw-away folder, never into the checkout's runs/.
    os.environ.setdefault("WORKSHOP_RUNS", tempfile.mkdtemp(prefix="workshop-test-runs-"))
    # Tests must not pick up a developer's real CIFAR-10 unless they ask for it.
    os.environ.pop("WORKSHOP_DATA", None)
    os.environ.setdefault("MPLBACKEND", "Agg")
    # A notebook's profile "auto" means cpu inside the tests, even on a GPU node: the full gpu profile
    # is the main job's and the pre-flight's, not the test suite's. WORKSHOP_PROFILE=gpu make test asks for it.
    os.environ.setdefault("WORKSHOP_PROFILE", "cpu")
    option = config.option
    if getattr(option, "nbval_lax", False) or getattr(option, "nbval", False):
        if not option.nbval_sanitize_with:
            option.nbval_sanitize_with = str(NBVAL / "sanitize.cfg")
        _run_cells_as_jupyter_does()


def _run_cells_as_jupyter_does() -> None:
    """Execute each cell with store_history=True, as Jupyter and papermill do; nbval passes False.

    IPython decides whether a trailing ``;`` hides a cell's value by reading the cell back from its
    history, so without history every check cell (``wu.check_...(...);``) would also show ``True``.
    """
    from nbval import kernel

    def execute_cell_input(self, cell_input, allow_stdin=None):
        return self.kc.execute(cell_input, store_history=True, allow_stdin=allow_stdin, stop_on_error=False)

    kernel.RunningKernel.execute_cell_input = execute_cell_input


def expected_outputs(notebook: Path) -> dict:
    """Cell id -> the outputs nbval expects of that cell, as recorded in tests/nbval/ (WORKSHOP_NBVAL_EXPECTED)."""
    folder = Path(os.environ.get("WORKSHOP_NBVAL_EXPECTED", NBVAL))
    path = folder / f"{notebook.stem}.json"
    return json.loads(path.read_text())["cells"] if path.exists() else {}


def pytest_collection_modifyitems(config, items):
    import nbformat

    for item in items:
        cell = getattr(item, "cell", None)  # nbval's items carry the notebook cell they execute
        if cell is None or CHECKED not in cell.get("metadata", {}).get("tags", []):
            continue
        notebook = Path(str(item.fspath))
        expected = expected_outputs(notebook)
        if cell.get("id") not in expected:
            raise pytest.UsageError(
                f"{notebook.name}: cell {cell.get('id')} is tagged {CHECKED} but tests/nbval/{notebook.stem}.json "
                "has no output for it: run the notebooks (make run) and then python tests/nbval_expected.py <run>.")
        # nbval compares a cell only when its reference ran: give it the recorded outputs and a run count.
        cell["outputs"] = [nbformat.from_dict(output) for output in expected[cell["id"]]]
        cell["execution_count"] = 1


def _first_error_line(text: str) -> str:
    """The exception's own line ("WorkshopError: ...", "NameError: ...") out of a kernel's coloured traceback."""
    lines = [line.strip() for line in ANSI.sub("", text).splitlines() if line.strip()]
    found = [line for line in lines if re.match(r"^[A-Za-z_][\w.]*(Error|Exception|Interrupt|Exit)\b:?", line)]
    return (found or lines or ["(no message)"])[-1]


def _keep_outputs(item, report) -> None:
    """Put what the cell printed, and whether it passed, into nbval's copy of the notebook (written at the end)."""
    if report.when == "call" or (report.when == "setup" and not report.passed):
        item.cell["outputs"] = list(getattr(item, "test_outputs", None) or [])
        item.cell["metadata"][OUTCOME] = report.outcome
        _executed[Path(str(item.fspath)).name] = item.parent.nb


_executed: dict = {}


_started = time.monotonic()
_durations: dict[str, float] = {}
_file_of: dict[str, str] = {}


def pytest_runtest_logreport(report):
    _durations[report.nodeid] = _durations.get(report.nodeid, 0.0) + report.duration
    _file_of[report.nodeid] = report.location[0]


def _write_suite_record(session, exitstatus) -> None:
    """What `make test` took, so the measurements page (results/reference/RUN.md) can say it without a typed figure."""
    path = session.config.getoption("suite_record")
    if not path:
        return
    from workshop_utils.system.hardware import environment
    from workshop_utils.system.results import git_commit, write_json

    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    counts = {key: len(reporter.stats.get(key, [])) for key in ("passed", "failed", "skipped", "error")}
    slowest = sorted(_durations.items(), key=lambda item: -item[1])[:15]
    files: dict[str, list] = {}  # where CI's minutes go, file by file: [seconds, tests]
    for name, seconds in _durations.items():
        entry = files.setdefault(_file_of.get(name) or name.split("::")[0], [0.0, 0])
        entry[0] += seconds
        entry[1] += 1
    write_json({"kind": "test_suite", "seconds": round(time.monotonic() - _started, 1), "exit_status": int(exitstatus),
                "counts": counts, "marker_expression": session.config.option.markexpr or None,
                "git_commit": git_commit(), "environment": environment("cpu"),
                "slowest": [{"test": name, "seconds": round(seconds, 1)} for name, seconds in slowest],
                # the attendee copies' run beside the tests (tests/attendee_run.py), where the session had one
                "background": dict(getattr(sys.modules.get("attendee_run"), "timings", None) or {}) or None,
                "files": [{"file": name, "seconds": round(seconds, 1), "tests": count}
                          for name, (seconds, count) in sorted(files.items(), key=lambda item: -item[1][0])]}, path)


def pytest_sessionfinish(session, exitstatus):
    _write_suite_record(session, exitstatus)
    folder = os.environ.get(EXECUTED)
    if folder and _executed:
        import nbformat

        Path(folder).mkdir(parents=True, exist_ok=True)
        for name, notebook in _executed.items():
            nbformat.write(notebook, Path(folder) / name)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    cell = getattr(item, "cell", None)
    if cell is not None and os.environ.get(EXECUTED):
        _keep_outputs(item, report)
    if cell is None or not report.failed or call.excinfo is None:
        return
    error = call.excinfo.value
    details = ANSI.sub("", getattr(error, "inner_traceback", None) or "")
    if str(error) == "Cell outputs differ":
        cause = "its output is not the one recorded in tests/nbval/ (the difference is below)"
    elif details:
        cause = _first_error_line(details)
    else:
        cause = str(error).splitlines()[0] if str(error) else type(error).__name__
    source = next((line for line in cell["source"].splitlines() if line.strip()), "")
    line = f"{Path(str(item.fspath)).name}, {item.name} ({source.strip()[:60]}): {cause}"
    report.longrepr = f"{line}\n\n{details}" if details else line
