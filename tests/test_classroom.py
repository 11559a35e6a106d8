"""A class on a real JupyterHub: attendees at once, each in a server with a CPU quota and a memory limit.

The whole class (``python -m workshop_utils.classroom``) runs once here, small: two attendees who run notebook 01
and the DDP lab's launch at the same moment, and one whose server has less memory than notebook 01 needs, who
must be told so in one line at its start instead of being killed mid-run. The record the command writes is what
these tests read. Where this machine cannot write cgroups or make users, the class says so and runs without them.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from workshop_utils import classroom
from workshop_utils.classroom import attendee, hub
from workshop_utils.classroom.cgroups import Cgroups
from workshop_utils.system.errors import WorkshopError

ROOT = Path(__file__).resolve().parents[1]
SHORT_GIB = 1.0


def test_the_exercise_section_is_the_set_up_and_the_section_up_to_its_check():
    cells = attendee.exercise_section(ROOT / "notebooks" / classroom.LAB_NOTEBOOK, classroom.LAB_MARKER)
    assert "parameters" in cells[0].metadata.get("tags", [])
    assert "check" in cells[-1].metadata.get("tags", []) and "check_ddp_lab" in cells[-1].source
    assert any("exercise" in c.metadata.get("tags", []) and "lab_command" in c.source for c in cells)
    assert not any("check_average_gradients" in c.source for c in cells)  # 2.1 is another section's


@pytest.mark.parametrize("argv, expected", [
    (["--attendees", "0"], "a class has 1 to 200 attendees"),
    (["--memory", "0"], "--memory 0.0: a server's memory limit must be from 0.125"),
    (["--set", "epochs"], "is not NAME=VALUE"),
    (["--attendees", "two"], "invalid int value"),
    (["--cpus", "inf"], "--cpus inf: each server's CPU quota must be from 0.01 core"),
    (["--cpus", "1e300"], "--cpus 1e+300: each server's CPU quota"),
    (["--cpus", "0.0001"], "--cpus 0.0001: each server's CPU quota"),
    (["--memory", "inf"], "--memory inf: a server's memory limit must be from 0.125 to 1024 GiB"),
    (["--short-of-memory", "-1"], "--short-of-memory -1.0: a server's memory limit"),
    (["--short-of-memory", "nan"], "--short-of-memory nan: a server's memory limit"),
    (["--short-of-memory", "0"], "--short-of-memory 0.0: a server's memory limit"),
    (["--short-of-memory", "5", "--memory", "3"], "--short-of-memory 5.0 is not short of the class's --memory 3.0"),
    (["--record", "/proc/cpuinfo"], "--record /proc/cpuinfo is a file, not a folder"),
])
def test_bad_arguments_are_one_line_before_anything_starts(argv, expected, capsys, monkeypatch):
    monkeypatch.setattr(classroom, "make_attendees", lambda *a, **k: pytest.fail("started a class"))
    with pytest.raises(SystemExit) as stopped:
        classroom.main(argv)
    said = capsys.readouterr().err
    assert stopped.value.code == 2 and said.count("\n") == 1 and expected in said, said


def test_the_servers_start_hand_out_and_stop_together_and_a_failure_is_not_lost(tmp_path):
    """Every attendee's step runs at once (a barrier that only all of them together pass), each result under its
    attendee's name; one attendee's error reaches the class, not only a thread's log."""
    import threading

    people = [attendee.Attendee(f"a{i}", tmp_path / f"a{i}") for i in range(3)]
    together = threading.Barrier(len(people), timeout=60)

    def step(person):
        together.wait()  # one after the other, the first would wait here alone and the barrier would break
        return person.name.upper()

    assert classroom._for_each(people, step) == {"a0": "A0", "a1": "A1", "a2": "A2"}

    def fails_for_one(person):
        if person.name == "a1":
            raise WorkshopError("The hub would not start a1's server (500: boom).", "see the hub's log.")
        return person.name

    with pytest.raises(WorkshopError, match="a1's server"):
        classroom._for_each(people, fails_for_one)


def fake_kernels(monkeypatch, module, kernels: list[str], failing_cell: int | None = None) -> list[str]:
    """Kernels that behave as ``kernels`` says at their first cell ("never answers": the websocket closes; "dies at
    once"; "answers"; "closes later": at the second), in ``module``'s view; the list of those started, in order,
    filled as they start."""
    import contextlib

    from workshop_utils.portal_check.kernel import Cell

    started = []

    @contextlib.contextmanager
    def kernel_socket(*args, **kwargs):
        started.append(kernels[len(started)])
        yield started[-1]

    def run_cell(behaviour, code, number, kernel, timeout_s):
        if number == 1 and behaviour == "never answers":
            raise WorkshopError(f"The websocket of kernel {kernel} closed while cell {number} ran.", "see its log.")
        if number == 1 and behaviour == "dies at once":
            return Cell("died", "", "the kernel died while the cell ran")
        if number == 2 and behaviour == "closes later":
            raise WorkshopError(f"The websocket of kernel {kernel} closed while cell {number} ran.", "see its log.")
        if number == failing_cell:
            return Cell("error", "", "NameError: name 'x' is not defined")
        # the handout's command names the interpreter, whose path may hold any word ("check" in a CI checkout's)
        if "-m workshop_utils.handout" in code:
            return Cell("ok", "written to ~/x\n")
        return Cell("ok", "✓ right\n" if "# check" in code else "")

    monkeypatch.setattr(module, "kernel_socket", kernel_socket)
    monkeypatch.setattr(module, "run_cell", run_cell)
    return started


@pytest.mark.parametrize("kernels, failing_cell, ok, error", [
    (["never answers", "answers"], None, True, ""),  # the port race: its websocket closes before cell 1's answer
    (["dies at once", "answers"], None, True, ""),  # the server's word that the kernel died before cell 1 answered
    (["answers"], 3, False, "NameError"),  # a cell's own error is the attendee's result: no second kernel
    (["closes later"], None, False, "closed while cell 2 ran"),  # it answered, then its socket closed: no second
    (["never answers", "never answers"], None, False, "closed while cell 1 ran"),  # started again once, not more
])
def test_a_kernel_that_never_answers_its_first_cell_is_started_again_once(monkeypatch, kernels, failing_cell, ok,
                                                                          error):
    import nbformat

    started = fake_kernels(monkeypatch, attendee, kernels, failing_cell)
    cells = [nbformat.v4.new_code_cell("x = 1", metadata={"tags": ["parameters"]}), nbformat.v4.new_code_cell("y = 2"),
             nbformat.v4.new_code_cell("print(x)  # check", metadata={"tags": ["check"]})]
    run = attendee.run_notebook("http://hub/user/a", "token", "kernel", "workshop/01.ipynb", cells, {"profile": "cpu"},
                                cell_timeout_s=10)
    assert (run.ok, run.kernel_starts, started) == (ok, len(kernels), kernels), run
    assert error in run.error and run.checks_passed == ok and run.failed_cell == failing_cell, run


@pytest.mark.parametrize("kernels, handed_out", [(["never answers", "answers"], True),
                                                 (["dies at once", "answers"], True),
                                                 (["never answers", "never answers"], False)])
def test_the_handouts_kernel_is_started_again_once_when_it_never_answers(monkeypatch, kernels, handed_out):
    started = fake_kernels(monkeypatch, classroom, kernels)
    monkeypatch.setattr(sys, "executable", "/builds/check/.venv/bin/python")  # a checkout's path may hold any word
    if handed_out:
        assert classroom._handout("http://hub/user/a", "token", 10) == "written to ~/x"
    else:
        with pytest.raises(WorkshopError, match="closed while cell 1 ran"):
            classroom._handout("http://hub/user/a", "token", 10)
    assert started == kernels


needs_cgroups = pytest.mark.skipif(Cgroups.unavailable() is not None, reason=str(Cgroups.unavailable()))


@pytest.mark.slow
@needs_cgroups
def test_a_server_past_its_memory_limit_is_counted_as_killed_for_memory_and_stopped_by_id():
    groups = Cgroups(f"test-classroom-{uuid.uuid4().hex[:6]}")
    try:
        folders = groups.make("a", cpu_cores=1.0, memory_bytes=128 * 2**20)
        hog = subprocess.Popen(["sh", "-c", f'echo $$ > {folders["memory"]}/cgroup.procs; echo $$ > '
                                            f'{folders["cpu"]}/cgroup.procs; exec "$0" -c "$1"',
                                sys.executable, "b = bytearray(512 * 2**20); import time; time.sleep(60)"])
        assert hog.wait(timeout=60) == -9  # the kernel's OOM killer, inside the cgroup only
        usage = groups.usage("a")
        assert usage["oom_kills"] >= 1 and 100 <= usage["peak_memory_mib"] <= 129, usage
        sleeper = subprocess.Popen(["sh", "-c", f'echo $$ > {folders["memory"]}/cgroup.procs; exec sleep 300'])
        for _ in range(50):
            if sleeper.pid in groups.pids("a"):
                break
            time.sleep(0.1)
    finally:
        groups.remove()
    assert sleeper.wait(timeout=30) != 0 and not any(p.exists() for p in groups.parents.values())


@needs_cgroups
def test_a_cpu_weight_is_the_hierarchys_own_share_and_holds_a_process_in_a_new_session():
    """The test session's background run (tests/attendee_run.py) relies on it: its kernels start new sessions."""
    groups = Cgroups(f"test-classroom-{uuid.uuid4().hex[:6]}")
    try:
        folder = groups.make("a", None, None, cpu_weight=10)["cpu"]
        weight = "cpu.weight" if groups.v2["cpu"] else "cpu.shares"
        for group in (folder, folder.parent):  # the parent too: a weight counts only among siblings
            assert (group / weight).read_text().strip() == ("10" if groups.v2["cpu"] else "102"), group
        child = subprocess.Popen(["sh", "-c", f'echo $$ > {folder}/cgroup.procs; exec setsid sleep 300'])
        for _ in range(50):
            if child.pid in groups.pids("a"):
                break
            time.sleep(0.1)
        assert child.pid in groups.pids("a")
    finally:
        groups.remove()
    assert child.wait(timeout=30) != 0 and not any(p.exists() for p in groups.parents.values())


@pytest.fixture(scope="module")
def class_record(tmp_path_factory):
    if hub.missing_pieces():
        if not (ROOT / "portal" / "package-lock.json").exists() or subprocess.run(["which", "npm"]).returncode:
            pytest.skip(hub.missing_pieces())
        subprocess.run(["npm", "ci", "--prefix", str(ROOT / "portal"), "--no-audit", "--no-fund", "--loglevel=error"],
                       check=True, timeout=600)
    folder = tmp_path_factory.mktemp("classroom")
    # The class is about sharing one machine, not about the training's size: notebook 01 with a sixth of its cpu
    # profile's images (two epochs of 512: section 7 still resumes from the first epoch's checkpoint, and the
    # deterministic pair's 256 images still run 8 steps, past the 5 of warm-up) runs every section and check.
    done = subprocess.run([sys.executable, "-m", "workshop_utils.classroom", "--attendees", "2", "--no-solo",
                           "--short-of-memory", str(SHORT_GIB), "--set", "epochs=2", "--set", "train_size=512",
                           "--record", str(folder)],
                          capture_output=True, text=True, timeout=1800)
    records = list(folder.glob("classroom-*.json"))
    assert records, done.stdout[-3000:] + done.stderr[-3000:]
    return done, json.loads(records[0].read_text())


@pytest.mark.slow
def test_two_attendees_at_once_finish_notebook_01_and_the_lab_with_every_check_passing(class_record):
    done, record = class_record
    assert done.returncode == 0 and record["passed"], done.stdout[-3000:] + done.stderr[-3000:]
    assert record["attendees"] == 2 and not record["failures"]
    for row in record["rows"][:2]:
        assert [r["notebook"] for r in row["runs"]] == [classroom.NOTEBOOK, classroom.LAB_NOTEBOOK], row
        assert all(r["ok"] and r["checks"] >= 1 and r["checks_passed"] == r["checks"] for r in row["runs"]), row


@pytest.mark.slow
def test_each_attendees_results_are_in_their_own_folder_and_none_in_the_install(class_record):
    _, record = class_record
    for row in record["rows"][:2]:
        assert row["own_folder"] and row["run_folders"], row
        assert all(folder.startswith(f"{classroom.HANDOUT}/runs/") for folder in row["run_folders"]), row
    assert record["records_in_the_install"] == []


@pytest.mark.slow
def test_a_server_short_of_memory_is_told_at_the_notebooks_start_in_one_line_not_killed(class_record):
    _, record = class_record
    short = record["rows"][-1]
    first = short["runs"][0]
    assert short["memory_limit_gib"] == SHORT_GIB and short["refused_in_one_line"] and short["passed"], short
    assert first["failed_cell"] is not None and first["failed_cell"] <= 6, first  # at the start, not mid-run
    assert "needs about" in first["error"] and "\n" not in first["error"] and not short["oom_kills"]


@pytest.mark.slow
def test_the_record_says_how_the_class_ran_and_every_attendees_peak_memory(class_record):
    _, record = class_record
    assert record["per_attendee_limits"] == {"cpus": 1.0, "memory_gib": 3.0}
    assert record["wall_s"] > 0 and record["environment"]["cpu_cores"] >= 1 and record["git_commit"]
    if Cgroups.unavailable() is None:
        assert record["cgroups"].startswith("a cgroup per server")
        assert all(row["peak_memory_mib"] and row["oom_kills"] == 0 for row in record["rows"]), record["rows"]
    else:
        assert record["cgroups"].startswith("none: ")


@pytest.mark.slow
def test_nothing_the_class_started_is_left_running(class_record):
    _, record = class_record
    names = [row["attendee"] for row in record["rows"]]
    leftover = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            environ = Path(f"/proc/{pid}/environ").read_bytes()
        except OSError:
            continue
        if any(f"JUPYTERHUB_USER={name}".encode() in environ for name in names):
            leftover.append(pid)
    assert not leftover
    assert not any(Path(f"/home/{name}").exists() or Path(f"/tmp/torchinductor_{name}").exists() for name in names)
    assert subprocess.run(["id", names[0]], capture_output=True).returncode != 0  # the accounts are gone


# ------------------------------------------------------------------------------------------------- the handout

@pytest.mark.slow
def test_the_handout_gives_the_exercises_as_placeholders_and_keeps_an_attendees_own_work(tmp_path, capsys):
    from workshop_utils.handout import hand_out

    folder = tmp_path / "workshop"
    written = hand_out(folder)
    notebooks = sorted(p.name for p in folder.glob("*.ipynb"))
    assert notebooks == sorted(p.name for p in (ROOT / "notebooks").glob("*.ipynb"))
    copy = (folder / classroom.NOTEBOOK).read_text()
    assert "### PLACEHOLDER" not in copy and "### BEGIN SOLUTION" not in copy
    assert copy != (ROOT / "notebooks" / classroom.NOTEBOOK).read_text()  # the solutions are not handed out
    mine = json.loads(copy)
    mine["cells"].append({"cell_type": "markdown", "id": "mine", "metadata": {}, "source": "my notes"})
    (folder / classroom.NOTEBOOK).write_text(json.dumps(mine))
    again = hand_out(folder)
    assert json.loads((folder / classroom.NOTEBOOK).read_text()) == mine and again == []
    assert f"kept your own {classroom.NOTEBOOK}" in capsys.readouterr().out.splitlines()[-1]
    solved = tmp_path / "solutions"
    hand_out(solved, solutions=True)
    assert (solved / classroom.NOTEBOOK).read_bytes() == (ROOT / "notebooks" / classroom.NOTEBOOK).read_bytes()
    assert len(written) == len(notebooks)


def test_a_handout_folder_that_cannot_be_written_is_one_line(tmp_path, capsys):
    from workshop_utils import handout

    blocked = tmp_path / "a-file"
    blocked.write_text("")
    with pytest.raises(SystemExit) as stopped:
        handout.main([str(blocked / "workshop")])
    said = capsys.readouterr().err
    assert stopped.value.code == 2 and said.count("\n") == 1 and "is a file, not a folder" in said, said


def test_a_handout_folder_given_empty_or_as_an_unknown_users_home_is_one_line(capsys):
    from workshop_utils import handout

    for argv, expected in (([""], "The handout folder is empty"), (["~nosuchuser-here/x"], "no such user's home"),
                           (["--from", "/proc/cpuinfo"], "is not a folder of notebooks")):
        with pytest.raises(SystemExit) as stopped:
            handout.main(argv)
        said = capsys.readouterr().err
        assert stopped.value.code == 2 and said.count("\n") == 1 and expected in said, (argv, said)


@pytest.mark.slow
def test_what_a_full_disk_cut_short_is_never_kept_as_an_attendees_work(tmp_path, monkeypatch, capsys):
    from workshop_utils import handout

    real, calls = handout.attendee_notebook, []

    def disk_fills_up(source, out):
        calls.append(source)
        if len(calls) == 3:
            Path(out).write_text('{"cel')  # half a file, as a full disk leaves it
            raise OSError(28, "No space left on device", str(out))
        return real(source, out)

    monkeypatch.setattr(handout, "attendee_notebook", disk_fills_up)
    folder = tmp_path / "workshop"
    with pytest.raises(WorkshopError, match="No space left on device"):
        handout.hand_out(folder)
    assert len(list(folder.glob("*.ipynb"))) == 2 and not list(folder.glob(".*"))  # whole ones only
    monkeypatch.setattr(handout, "attendee_notebook", real)
    (folder / "04_profiling_optimization.ipynb").write_text("")  # a file that is no notebook
    (folder / "05_beyond_data_parallel.ipynb").mkdir()  # nor is a folder
    handout.hand_out(folder)
    said = capsys.readouterr().out
    assert "set aside what was no notebook: 04_profiling_optimization.ipynb, 05_beyond_data_parallel.ipynb" in said
    assert all(handout._is_notebook(p) for p in folder.glob("0*.ipynb"))
    assert len(list(folder.glob("*.not-a-notebook-*"))) == 2
