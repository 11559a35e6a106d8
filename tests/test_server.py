"""A server's share of a node, as an attendee's notebook sees it: cores from the CPU quota, memory from the limit.

The fake trees hold the files the kernel shows under /proc and /sys/fs/cgroup (v1, v2, a container's view), so
every layout is tried on any machine. The real ones put a process in a cgroup with a quota and a limit, where
this machine lets the tests write cgroups (root, cgroup v1 or v2), and read it back through the package.
"""

from __future__ import annotations

import multiprocessing
import os
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path

import pytest

import workshop_utils as wu
from workshop_utils.system import results, server
from workshop_utils.system.errors import WorkshopError

ROOT = Path(__file__).resolve().parents[1]
NOBODY = 65534


def _fake(tmp_path: Path, cgroup: str, mounts: list[tuple[str, str, str, str]], files: dict[str, str]) -> Path:
    """A /proc/self with ``cgroup`` and mountinfo lines (root, point, fstype, options), and the cgroup files."""
    proc = tmp_path / "proc"
    proc.mkdir()
    (proc / "cgroup").write_text(cgroup)
    lines = [f"{30 + i} 23 0:{28 + i} {root} {tmp_path / point} rw,relatime - {fstype} cgroup rw,{options}"
             for i, (root, point, fstype, options) in enumerate(mounts)]
    (proc / "mountinfo").write_text("\n".join(["22 1 0:21 / / rw - overlay overlay rw", *lines]) + "\n")
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    return proc


V1 = [("/", "cg/cpu,cpuacct", "cgroup", "cpu,cpuacct"), ("/", "cg/memory", "cgroup", "memory")]


def test_a_v1_quota_in_a_nested_cgroup_counts_and_the_tightest_level_wins(tmp_path):
    proc = _fake(tmp_path, "4:memory:/hub/alice\n2:cpu,cpuacct:/hub/alice\n0::/\n", V1, {
        "cg/cpu,cpuacct/cpu.cfs_quota_us": "-1", "cg/cpu,cpuacct/cpu.cfs_period_us": "100000",
        "cg/cpu,cpuacct/hub/cpu.cfs_quota_us": "400000", "cg/cpu,cpuacct/hub/cpu.cfs_period_us": "100000",
        "cg/cpu,cpuacct/hub/alice/cpu.cfs_quota_us": "150000", "cg/cpu,cpuacct/hub/alice/cpu.cfs_period_us": "100000",
        "cg/memory/memory.limit_in_bytes": "9223372036854771712",
        "cg/memory/hub/alice/memory.limit_in_bytes": str(6 * 2**30),
        "cg/memory/hub/alice/memory.usage_in_bytes": str(2 * 2**30),
        "cg/memory/hub/alice/memory.stat": f"cache 0\ntotal_inactive_file {2**30}\n",
    })
    folders = server.cgroup_folders(proc)
    assert server.cgroup_cpu_limit(folders) == 1.5
    assert server.cgroup_memory(folders) == (6 * 2**30, 5 * 2**30)  # the page cache that can go is not in use


def test_a_v2_cpu_max_and_memory_max_are_read_and_max_means_no_limit(tmp_path):
    files = {"cg2/user.slice/cpu.max": "max 100000", "cg2/user.slice/jupyter-bob.service/cpu.max": "200000 100000",
             "cg2/user.slice/jupyter-bob.service/memory.max": str(4 * 2**30),
             "cg2/user.slice/jupyter-bob.service/memory.current": str(2**30),
             "cg2/user.slice/jupyter-bob.service/memory.stat": "anon 1\ninactive_file 0\n",
             "cg2/user.slice/memory.max": "max"}
    proc = _fake(tmp_path, "0::/user.slice/jupyter-bob.service\n", [("/", "cg2", "cgroup2", "nsdelegate")], files)
    folders = server.cgroup_folders(proc)
    assert server.cgroup_cpu_limit(folders) == 2.0
    assert server.cgroup_memory(folders) == (4 * 2**30, 3 * 2**30)


def test_a_containers_own_subtree_mounted_as_its_root_is_read_there(tmp_path):
    # Kubernetes: the process's cgroup is /kubepods/pod1/c1 on the node, and that subtree is what is mounted.
    proc = _fake(tmp_path, "0::/kubepods/pod1/c1\n", [("/kubepods/pod1/c1", "cg2", "cgroup2", "nsdelegate")],
                 {"cg2/cpu.max": "50000 100000", "cg2/memory.max": str(3 * 2**30), "cg2/memory.current": "0"})
    folders = server.cgroup_folders(proc)
    assert server.cgroup_cpu_limit(folders) == 0.5
    assert server.cgroup_memory(folders)[0] == 3 * 2**30


def test_no_cgroup_files_means_no_limit_not_an_error(tmp_path):
    proc = _fake(tmp_path, "garbage line\n1:cpu:/x\n", [], {})
    assert server.cgroup_cpu_limit(server.cgroup_folders(proc)) is None
    assert server.cgroup_memory(server.cgroup_folders(proc)) == (None, None)
    assert server.cgroup_folders(tmp_path / "no-such-proc") == {}


def test_jupyterhubs_limits_count_where_no_cgroup_enforces_them(monkeypatch):
    monkeypatch.setattr(server, "cgroup_cpu_limit", lambda folders=None: None)
    monkeypatch.setattr(server, "cgroup_memory", lambda folders=None: (None, None))
    monkeypatch.setattr(server, "affinity_cores", lambda: 64)
    monkeypatch.setenv("CPU_LIMIT", "2.0")
    monkeypatch.setenv("MEM_LIMIT", str(6 * 2**30))
    found = server.this_server(gpus=False)
    assert server.cpu_cores() == 2 and found.cores == 2 and found.cores_source == "JupyterHub's cpu_limit"
    # Nothing counts this kernel against a limit no cgroup enforces: what it holds already is not free.
    held = server.tree_rss_bytes() / 2**30
    assert found.memory_limit_gib == 6 and abs(found.memory_gib - (6 - held)) < 0.05 and held > 0.01
    assert found.memory_source == "JupyterHub's mem_limit"
    assert found.line() == (f"this server: 2 cores (JupyterHub's cpu_limit), {found.memory_gib:.1f} GiB free "
                            "of its 6.0 GiB (JupyterHub's mem_limit), no GPU")
    with pytest.raises(WorkshopError, match="needs about 6.2 GiB"):  # the limit itself, not the limit plus the kernel
        server.fit_to_server(memory_gib=6.2, quiet=True)
    for garbage in ("not a number", "2G", "-1", "0", "nan", "inf"):
        monkeypatch.setenv("CPU_LIMIT", garbage)
        monkeypatch.setenv("MEM_LIMIT", garbage)
        found = server.this_server(gpus=False)
        assert server.cpu_cores() == 64 and found.memory_source != "JupyterHub's mem_limit"
        assert f"CPU_LIMIT={garbage!r} is not a positive number: left out" in found.line()
        assert f"MEM_LIMIT={garbage!r} is not a positive number: left out" in found.line()


def test_slurms_memory_per_cpu_counts_with_the_cpus_it_was_given(monkeypatch):
    monkeypatch.setattr(server, "cgroup_memory", lambda folders=None: (None, None))
    monkeypatch.setenv("SLURM_MEM_PER_CPU", "1024")
    monkeypatch.setenv("SLURM_CPUS_ON_NODE", "3")
    found = server.this_server(gpus=False)
    assert found.memory_limit_gib == 3 and found.memory_source == "Slurm's --mem-per-cpu"


def test_a_quota_above_one_core_but_below_the_cores_is_named_with_its_size(monkeypatch):
    monkeypatch.setattr(server, "cgroup_cpu_limit", lambda folders=None: 1.5)
    monkeypatch.setattr(server, "affinity_cores", lambda: 2)
    found = server.this_server(gpus=False)
    assert found.cores == 2 and found.cpu_quota == 1.5
    assert found.line().startswith("this server: 2 cores (CPU quota of 1.5 cores)")
    monkeypatch.setattr(server, "cgroup_cpu_limit", lambda folders=None: 0.01)
    assert "everything runs about 100x slower" in server.this_server(gpus=False).line()


@pytest.mark.parametrize("need", ["3", "3 GiB", [3], 0, -1, float("nan"), float("-inf"), True, False])
def test_a_profiles_own_memory_need_that_is_no_number_of_gib_is_one_line(need):
    with pytest.raises(WorkshopError) as caught:
        wu.pick_settings({"cpu": dict(epochs=1, memory_gib=need), "gpu": dict(epochs=1)}, "cpu")
    assert "memory_gib=" in str(caught.value) and "is not a number of GiB above 0" in str(caught.value)
    with pytest.raises(WorkshopError, match="gpu_memory_gib="):
        server.fit_to_server(gpu_memory_gib=need, quiet=True)


def test_a_quota_of_half_a_core_is_one_thread_and_the_line_says_it_runs_at_half_speed(monkeypatch):
    monkeypatch.setattr(server, "cgroup_cpu_limit", lambda folders=None: 0.5)
    found = server.this_server(gpus=False)
    assert server.cpu_cores() == 1
    assert "1 core at 0.5 of its speed (a CPU quota of 0.5 cores)" in found.line()


def test_below_the_memory_a_profile_needs_the_notebook_stops_at_its_start_in_one_line(monkeypatch, capsys):
    monkeypatch.setattr(server, "cgroup_memory", lambda folders=None: (2 * 2**30, int(1.5 * 2**30)))
    profiles = {"cpu": dict(epochs=1, memory_gib=40.0), "gpu": dict(epochs=1, memory_gib=40.0)}
    with pytest.raises(WorkshopError) as caught:
        wu.pick_settings(profiles, "cpu")
    message = str(caught.value)
    assert "\n" not in message and "needs about 40 GiB of memory" in message and "1.5 GiB free of its 2.0 GiB (memory limit)" in message
    shown = capsys.readouterr().out
    assert "this server:" in shown and "memory_gib" not in shown.splitlines()[0]  # a need, not a size
    assert wu.pick_settings({"cpu": dict(epochs=1, memory_gib=0.1), "gpu": dict(epochs=1)}, "cpu")["epochs"] == 1


# ------------------------------------------------------------------------------------------------- real cgroups

def _cgroup_root(controller: str) -> Path | None:
    """Where this process may make a child cgroup for ``controller`` (v1 or v2), or None."""
    folders = server.cgroup_folders().get(controller)
    if os.geteuid() != 0 or not folders:
        return None
    probe = folders[0] / f"probe-{uuid.uuid4().hex[:8]}"
    try:
        probe.mkdir()
        probe.rmdir()
    except OSError:
        return None
    return folders[0]


needs_cgroups = pytest.mark.skipif(_cgroup_root("cpu") is None or _cgroup_root("memory") is None,
                                   reason="needs root and writable cgroups (cpu and memory)")


def _in_cgroup(code: str, quota_cores: float | None = None, memory_bytes: int | None = None, **popen) -> str:
    """Run ``code`` in a fresh python inside new cgroups with that quota and limit; return its output."""
    made = []
    try:
        for controller, files in (("cpu", {"cpu.cfs_quota_us": int(quota_cores * 100000) if quota_cores else None,
                                           "cpu.max": f"{int(quota_cores * 100000)} 100000" if quota_cores else None}),
                                  ("memory", {"memory.limit_in_bytes": memory_bytes, "memory.max": memory_bytes})):
            folder = _cgroup_root(controller) / f"test-server-{uuid.uuid4().hex[:8]}"
            folder.mkdir()
            made.append(folder)
            for name, value in files.items():
                if value is not None and (folder / name).exists():
                    (folder / name).write_text(str(value))
        enter = "; ".join(f"echo $$ > {folder}/cgroup.procs" for folder in made)
        done = subprocess.run(["sh", "-c", f'{enter}; exec "$0" -c "$1"', sys.executable, textwrap.dedent(code)],
                              capture_output=True, text=True, timeout=120, **popen)
        assert done.returncode == 0, done.stdout + done.stderr
        return done.stdout
    finally:
        for folder in made:
            folder.rmdir()


@needs_cgroups
def test_a_cgroup_with_a_one_core_quota_gives_one_core_one_thread_and_one_thread_per_rank():
    out = _in_cgroup("""
        import torch, workshop_utils as wu
        from workshop_utils.parallel.launch import cpu_threads_per_process
        server = wu.fit_to_server()
        print(wu.cpu_cores(), torch.get_num_threads(), cpu_threads_per_process(2), server.cores_source)
    """, quota_cores=1.0)
    assert out.splitlines()[-1] == "1 1 1 CPU quota", out
    assert out.startswith("this server: 1 core (CPU quota)"), out


@needs_cgroups
def test_a_memory_limit_below_the_profiles_need_stops_the_notebook_in_one_line_not_the_oom_killer():
    out = _in_cgroup("""
        import workshop_utils as wu
        try:
            wu.pick_settings({"cpu": dict(epochs=1, memory_gib=3.0), "gpu": dict(epochs=1)}, "cpu")
        except wu.WorkshopError as err:
            print("REFUSED", err)
    """, memory_bytes=2**30)
    refused = [line for line in out.splitlines() if line.startswith("REFUSED")]
    assert len(refused) == 1 and "needs about 3 GiB of memory" in refused[0] and "of its 1.0 GiB (memory limit)" in out


# ------------------------------------------------------------------------------- each attendee's own folder

def _as_nobody(code: str, home: Path, cwd: Path, env: dict | None = None) -> subprocess.CompletedProcess:
    """``code`` in the kit's python as another user (uid 65534), with that home and working folder."""
    environment = {k: v for k, v in os.environ.items() if k != results.RUNS_VARIABLE}
    environment.update(HOME=str(home), **(env or {}))
    return subprocess.run(["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups",
                           sys.executable, "-c", textwrap.dedent(code)],
                          capture_output=True, text=True, timeout=120, cwd=cwd, env=environment)


def _readable_by_others(path: Path) -> bool:
    return all(os.stat(p).st_mode & 0o005 == 0o005 for p in [path, *path.parents])


needs_another_user = pytest.mark.skipif(
    os.geteuid() != 0 or not _readable_by_others(ROOT) or not _readable_by_others(Path(sys.executable).parent),
    reason="needs root (to run as another user) and a checkout and venv that other users can read")


@pytest.fixture
def attendee_home(tmp_path_factory):
    """A home of the other user's own, in a folder every user can enter."""
    base = Path(f"/tmp/test-server-{uuid.uuid4().hex[:8]}")
    home = base / "home"
    home.mkdir(parents=True)
    base.chmod(0o755)
    os.chown(home, NOBODY, NOBODY)
    yield home
    subprocess.run(["rm", "-rf", str(base)], check=True)


@needs_another_user
def test_a_run_folder_from_a_read_only_install_lands_in_the_attendees_own_space(attendee_home):
    code = "import workshop_utils as wu; print(wu.new_run_dir('baseline'))"
    in_home = Path(_as_nobody(code, attendee_home, cwd=Path("/")).stdout.strip())
    assert in_home.parent == attendee_home / "workshop-runs" and in_home.is_dir(), in_home
    copy = attendee_home / "workshop"
    copy.mkdir()
    os.chown(copy, NOBODY, NOBODY)
    in_copy = Path(_as_nobody(code, attendee_home, cwd=copy).stdout.strip())
    assert in_copy.parent == copy / "runs" and in_copy.stat().st_uid == NOBODY
    assert not [p for p in ROOT.glob("runs/*") if p.stat().st_uid == NOBODY]  # nothing in the shared install


@needs_another_user
def test_a_home_that_cannot_be_written_is_one_line_naming_it_and_the_fix(attendee_home):
    attendee_home.chmod(0o555)
    os.chown(attendee_home, 0, 0)
    done = _as_nobody("""
        import workshop_utils as wu
        try:
            wu.new_run_dir('baseline')
        except wu.WorkshopError as err:
            print(err)
    """, attendee_home, cwd=Path("/"))
    lines = done.stdout.strip().splitlines()
    assert len(lines) == 1 and f"Cannot create a run folder in {attendee_home / 'workshop-runs'} (your home" in lines[0]
    assert "Fix: set WORKSHOP_RUNS to a folder you can write" in lines[0], done.stdout + done.stderr


@needs_another_user
def test_a_runs_folder_of_another_user_is_one_line_not_a_traceback(attendee_home, tmp_path):
    theirs = Path(f"{attendee_home}-theirs")
    theirs.mkdir(mode=0o755)
    done = _as_nobody("""
        import workshop_utils as wu
        try:
            wu.new_run_dir()
        except wu.WorkshopError as err:
            print(err)
    """, attendee_home, cwd=Path("/"), env={results.RUNS_VARIABLE: str(theirs)})
    assert done.stdout.count("\n") == 1 and f"Cannot create a run folder in {theirs} ($WORKSHOP_RUNS)" in done.stdout


def _new_run_dir_in(folder: str) -> str:
    os.environ[results.RUNS_VARIABLE] = folder
    return str(results.new_run_dir("same-name"))


def test_attendees_of_the_same_name_starting_at_the_same_second_get_a_folder_each(tmp_path):
    # Two servers with one user name (a container image's "jovyan") and one $WORKSHOP_RUNS: nothing is mixed.
    with multiprocessing.get_context("spawn").Pool(6) as pool:
        folders = pool.map(_new_run_dir_in, [str(tmp_path)] * 12)
    assert len(set(folders)) == 12 and all(Path(f).is_dir() and not any(Path(f).iterdir()) for f in folders)


def test_the_gpus_a_server_sees_are_listed_with_their_free_memory_and_a_short_one_stops_early(monkeypatch):
    import torch

    free = {0: (2 * 2**30, 10 * 2**30), 1: (9 * 2**30, 10 * 2**30)}  # another tenant holds most of GPU 0
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda index: free[index])
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda index: "NVIDIA H100 80GB HBM3 MIG 1g.10gb")
    found = server.this_server()
    assert [(g.index, round(g.free_gib), round(g.total_gib)) for g in found.gpus] == [(0, 2, 10), (1, 9, 10)]
    assert found.line().endswith("GPU 0 NVIDIA H100 80GB HBM3 MIG 1g.10gb, 2 of 10 GiB free; "
                                 "GPU 1 NVIDIA H100 80GB HBM3 MIG 1g.10gb, 9 of 10 GiB free")
    assert server.fit_to_server(gpu_memory_gib=8, quiet=True).gpus  # GPU 1 has room
    with pytest.raises(WorkshopError) as caught:
        server.fit_to_server(gpu_memory_gib=12, quiet=True)
    assert "needs about 12 GiB of GPU memory" in str(caught.value) and "9.0 GiB free" in str(caught.value)


def test_an_install_of_ones_own_keeps_results_out_of_it_when_working_elsewhere(tmp_path, monkeypatch):
    """A container image with the kit installed as the attendee's own user: results go beside the notebooks."""
    install, copy = tmp_path / "kit", tmp_path / "workshop"
    install.mkdir(), copy.mkdir()
    monkeypatch.setattr(results, "repo_root", lambda: install)
    monkeypatch.delenv(results.RUNS_VARIABLE, raising=False)
    monkeypatch.chdir(copy)
    assert results.runs_root() == copy / "runs"
    monkeypatch.chdir(install)  # a developer in their own checkout: its runs/, as make run and make slides expect
    assert results.runs_root() == install / "runs"
    (install / "notebooks").mkdir()
    monkeypatch.chdir(install / "notebooks")
    assert results.runs_root() == install / "runs"


def test_run_folder_paths_are_read_as_a_shell_reads_them_and_bad_tags_are_one_line(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.chdir(tmp_path)
    assert wu.resolve_run_dir("~/runs/mine") == tmp_path / "home" / "runs" / "mine"
    assert not (tmp_path / "~").exists()
    for given, expected in (("~/x", tmp_path / "home" / "x"), ("rel", tmp_path / "rel"), ("  ", None)):
        monkeypatch.setenv(results.RUNS_VARIABLE, given)
        assert results.runs_root() == (expected or tmp_path / "runs"), given
    monkeypatch.setenv(results.RUNS_VARIABLE, str(tmp_path / "r"))
    for tag in ("a/b", "/abs", "../../escape", "a\0b", ".."):
        with pytest.raises(WorkshopError, match="is not a plain name"):
            wu.new_run_dir(tag)
    with pytest.raises(WorkshopError, match="Cannot create the run folder"):
        wu.resolve_run_dir("a\0b")


def test_a_working_folder_that_was_removed_sends_results_home_and_says_why(tmp_path, monkeypatch):
    gone = tmp_path / "gone"
    gone.mkdir()
    monkeypatch.chdir(gone)
    gone.rmdir()
    monkeypatch.delenv(results.RUNS_VARIABLE, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setattr(results, "repo_root", lambda: None)
    root, why = results.runs_root_and_why()
    assert root == tmp_path / "workshop-runs" and why == "your home: no working folder"
    assert wu.new_run_dir().parent == tmp_path / "workshop-runs"


def test_the_peak_memory_of_a_child_is_caught_and_proportional_memory_is_read_only_to_raise_it(monkeypatch):
    """The main job's memory figures (each profile's memory_gib) come from PeakMemory: a child holding 256 MiB
    for a moment is in its peak, and the costly PSS read happens only when the cheap resident total could raise it."""
    reads = {"proportional": 0, "resident": 0}
    measure = server.tree_rss_bytes

    def counted(*args, proportional=True, **kwargs):
        reads["proportional" if proportional else "resident"] += 1
        return measure(*args, proportional=proportional, **kwargs)

    monkeypatch.setattr(server, "tree_rss_bytes", counted)
    hold = "import sys; block = bytearray(256 * 2**20); print('held', flush=True); sys.stdin.read()"
    with wu.PeakMemory(interval_s=0.05, proportional_every_s=60) as peak:
        child = subprocess.Popen([sys.executable, "-c", hold], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                 text=True)
        assert child.stdout.readline() == "held\n"
        # the block is held until the sampler has seen it and sampled a while after, however busy the machine
        deadline = time.monotonic() + 60
        while (peak.mib < 256 or reads["resident"] < reads["proportional"] + 5) and time.monotonic() < deadline:
            time.sleep(0.05)
        child.communicate(timeout=30)
    assert peak.mib >= 256
    assert reads["resident"] >= reads["proportional"] + 5 and reads["proportional"] >= 1
