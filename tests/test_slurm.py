"""The job scripts in slurm/, submitted with sbatch to a real Slurm started on this machine.

Each test submits one script as a user would (training flags after the script name), waits for
the job, then checks what the user relies on: exit code 0:0 in ``scontrol show job``, the lines
the README promises in the job's output file, and the result JSON. Training runs are tiny (CPU,
gloo, synthetic data). Needs munged, slurmctld and slurmd (Debian: slurm-wlm, munge); skipped,
saying so, only where they are not installed.

The jobs notebook 06 submits when tests/test_notebook_06.py runs it against its local Slurm (the environment
check, the one-GPU script, the pre-emptible script signalled, requeued and compared with the one-GPU run) are
checked there, on what they wrote, and so are Exercises 6.1 and 6.2 as its check cells ran them (the attendee's job
script, and the sweep's array gathered by a dependent job); the jobs here are the ones the notebook does not submit.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shlex
import shutil
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from slurm_cluster import SlurmCluster, missing_binaries

import workshop_utils as wu

REPO = Path(__file__).resolve().parent.parent
SCRIPTS = sorted((REPO / "slurm").glob("*.sbatch"))
# 1024 images in batches of 64: 16 steps an epoch. The CPU even where there is a GPU.
TINY = ("--model", "simplecnn", "--batch-size", "64", "--train-size", "1024", "--test-size", "64",
        "--warmup-steps", "0", "--seed", "0", "--device", "cpu")

pytestmark = pytest.mark.skipif(bool(missing_binaries()),
                                reason=f"Slurm/munge not installed (missing: {', '.join(missing_binaries())}); "
                                       "install with: apt-get install slurm-wlm munge")


@pytest.fixture(scope="session")
def cluster(tmp_path_factory):
    root = tmp_path_factory.mktemp("slurm")
    slurm = SlurmCluster(root)
    # Jobs run the same Python as the tests (the venv), and write their runs under the temporary folder.
    slurm.env["PATH"] = f"{Path(sys.executable).parent}:{slurm.env.get('PATH', '/usr/bin:/bin')}"
    slurm.env["WORKSHOP_RUNS"] = str(root / "runs")
    started = time.monotonic()
    try:
        slurm.start()
        print(f"\nlocal Slurm up in {time.monotonic() - started:.1f} s under {root}")
        yield slurm
    finally:
        slurm.stop()


def submit_and_wait(cluster, tmp_path, script: str, *args: str, options=(), env=None, timeout_s=180):
    """sbatch the script; return (job record once ended, its output text, its run folder)."""
    out = tmp_path / f"{script}.out"
    job_id = cluster.sbatch(REPO / "slurm" / script, *args, options=("--output", str(out), *options), env=env)
    job = cluster.wait(job_id, timeout_s)
    text = out.read_text() if out.exists() else ""
    run_dirs = list(Path(cluster.env["WORKSHOP_RUNS"]).glob(f"*-{job_id}"))
    return job, text, (run_dirs[0] if run_dirs else None)


def assert_succeeded(job, text):
    assert (job["JobState"], job["ExitCode"]) == ("COMPLETED", "0:0"), f"job failed:\n{job}\n--- output:\n{text}"


def result_of(run_dir) -> dict:
    return json.loads((run_dir / "result.json").read_text())


# ---------------------------------------------------------------------- lint


@pytest.mark.skipif(shutil.which("shellcheck") is None, reason="shellcheck not installed (apt-get install shellcheck)")
def test_shellcheck_passes_on_every_script():
    assert len(SCRIPTS) >= 7
    result = subprocess.run(["shellcheck", "--shell=bash", *map(str, SCRIPTS)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def test_scripts_bake_in_no_site_account_partition_or_gpu_count():
    for script in SCRIPTS:
        directives = [line for line in script.read_text().splitlines() if line.startswith("#SBATCH")]
        for line in directives:
            assert not re.search(r"--(account|partition|gpus|gres|time|qos)\b|^#SBATCH -[Apt] ", line), \
                f"{script.name}: '{line}' belongs on the sbatch command line"


# ---------------------------------------------------------------------- training scripts


@pytest.mark.slow
def test_one_node_script_starts_one_process_per_task_on_a_cpu_node(cluster, tmp_path):
    job, text, run_dir = submit_and_wait(cluster, tmp_path, "train_one_node.sbatch", *TINY, "--steps", "6",
                                         options=("--ntasks-per-node=2",))
    assert_succeeded(job, text)
    assert "2 process(es)" in text and "NUMA binding off (no GPU)" in text
    assert "rank 0 of 2" in text and "rank 1 of 2" in text
    assert "Done: 6 steps on 2 process(es)" in text
    metrics = result_of(run_dir)["metrics"]
    assert metrics["world_size"] == 2 and metrics["global_batch_size"] == 128


@pytest.mark.slow
def test_one_node_script_ends_its_log_with_the_rank_that_failed_first(cluster, tmp_path):
    """Both ranks print an error when rank 1 fails; the log's last lines name rank 1 and its own error."""
    job, text, run_dir = submit_and_wait(cluster, tmp_path, "train_one_node.sbatch", *TINY, "--steps", "6",
                                         "--fail-at-step", "3", options=("--ntasks-per-node=2",))
    assert job["JobState"] == "FAILED" and job["ExitCode"] == "1:0", job
    assert re.search(r"^error: rank 1 failed first: InjectedFailure: injected failure on rank 1 at step 3 "
                     r"\(--fail-at-step\) \(then rank 0 (lost its connection to it|was stopped by torchrun with "
                     r"SIGTERM)\)\. Fix: ", text, re.M), text  # which of the two rank 0 meets first is a race
    assert text.rstrip().endswith("InjectedFailure: injected failure on rank 1 at step 3 (--fail-at-step)"), text
    assert (run_dir / "torchrun.out").exists() and "results in" not in text


@pytest.mark.slow
def test_multi_node_script_runs_two_torchrun_agents_and_restarts_after_a_crash(cluster, tmp_path):
    """Two agents (--nnodes=2) meet at the c10d rendezvous; one slurmd, so both run on this host.

    Rank 1 crashes at step 3 on the first attempt: the agents restart both ranks (--max-restarts),
    which resume from rank 0's checkpoint at step 2 and finish the run.
    """
    job, text, run_dir = submit_and_wait(
        cluster, tmp_path, "train_multi_node.sbatch", *TINY, "--steps", "6", "--checkpoint-every", "2",
        "--fail-at-step", "3", options=("--nodes=1", "--ntasks-per-node=2"), timeout_s=240)
    assert_succeeded(job, text)
    host = socket.gethostname().split(".")[0]
    assert re.search(rf"2 agent\(s\) x 1 process\(es\), rendezvous at {host}:\d+", text), text
    assert f"[{host} rank 0]" in text and f"[{host} rank 1]" in text, "per-rank prefixes missing"
    assert "injected failure on rank 1 at step 3" in text
    metrics = result_of(run_dir)["metrics"]
    assert metrics["world_size"] == 2 and metrics["steps"] == 6
    assert metrics["resumed_from_step"] == 2
    assert (run_dir / "torchrun-logs").is_dir()


@pytest.mark.slow
def test_multi_node_script_without_restarts_ends_its_log_with_the_rank_that_failed_first(cluster, tmp_path):
    job, text, run_dir = submit_and_wait(
        cluster, tmp_path, "train_multi_node.sbatch", *TINY, "--steps", "6", "--fail-at-step", "3",
        options=("--nodes=1", "--ntasks-per-node=2"), env={"WORKSHOP_MAX_RESTARTS": "0"}, timeout_s=240)
    assert job["JobState"] == "FAILED", job
    assert re.search(r"^error: rank 1 failed first: InjectedFailure: injected failure on rank 1 at step 3 "
                     r"\(--fail-at-step\) \(then rank 0 ", text, re.M), text
    assert text.rstrip().endswith("InjectedFailure: injected failure on rank 1 at step 3 (--fail-at-step)"), text


@pytest.mark.slow
def test_staged_data_script_copies_verifies_and_trains_from_local_storage(cluster, tmp_path):
    shared = tmp_path / "shared-data"
    (shared / "sub").mkdir(parents=True)
    for i, name in enumerate(("a.bin", "b.bin", "sub/c.bin")):
        (shared / name).write_bytes(bytes([i]) * 4096)
    scratch = tmp_path / "node-local"
    scratch.mkdir()
    job, text, run_dir = submit_and_wait(cluster, tmp_path, "train_staged_data.sbatch", *TINY, "--steps", "3",
                                         env={"WORKSHOP_DATA": str(shared), "WORKSHOP_LOCAL_SCRATCH": str(scratch)})
    assert_succeeded(job, text)
    local = scratch / f"workshop-data-{job['JobId']}"
    assert "staged 3 file(s)" in text and f"to {local}" in text and "checksums match" in text
    assert f"training reads {local}" in text
    assert result_of(run_dir)["metrics"]["steps"] == 3
    assert not local.exists(), "the node-local copy must be removed when the job ends"


@pytest.mark.slow
def test_staged_data_script_stops_with_a_clear_error_when_the_data_is_missing(cluster, tmp_path):
    job, text, _ = submit_and_wait(cluster, tmp_path, "train_staged_data.sbatch", "--steps", "3",
                                   env={"WORKSHOP_DATA": str(tmp_path / "nowhere")})
    assert job["JobState"] == "FAILED" and job["ExitCode"] == "2:0", job
    assert "is not a folder" in text and "Fix:" in text


# ---------------------------------------------------------------------- job arrays and dependencies


@pytest.mark.slow
def test_array_runs_one_task_per_sweep_line_and_a_dependent_job_gathers_them(cluster, tmp_path):
    sweep = tmp_path / "sweep.txt"
    sweep.write_text("--lr 0.02\n--lr 0.1 --seed 1\n")
    out = tmp_path / "array-%A_%a.out"
    array = cluster.sbatch(REPO / "slurm" / "train_array.sbatch", str(sweep), *TINY, "--steps", "3",
                           options=("--array=0-1", "--output", str(out)))
    folder = Path(cluster.env["WORKSHOP_RUNS"]) / f"wu-sweep-{array}"
    # The gathering job: --wrap makes a job script of one command; afterok holds it until every task succeeded.
    gather = cluster.run("sbatch", "--parsable", f"--dependency=afterok:{array}", "--output",
                         str(tmp_path / "gather.out"), "--wrap",
                         shlex.join([sys.executable, "-c", "import sys, workshop_utils as wu; "
                                     "print(wu.gather_array(*sys.argv[1:]))", str(folder), str(folder / "sweep.csv")])
                         ).stdout.strip().split(";")[0]
    cluster.jobs.append(gather)
    assert "Dependency" in cluster.job(gather).get("Reason", "") or cluster.job(gather)["JobState"] != "PENDING"
    job = cluster.wait(gather, 240)
    tasks = [cluster.job(f"{array}_{i}") for i in (0, 1)]
    texts = [Path(str(out).replace("%A", array).replace("%a", str(i))).read_text() for i in (0, 1)]
    for task, text in zip(tasks, texts):
        assert_succeeded(task, text)
    assert_succeeded(job, (tmp_path / "gather.out").read_text())
    assert re.search(rf"^task 0 of array {array} \(job \d+\) on \S+: cores \d+, 1 thread\(s\); its flags: --lr 0\.02$",
                     texts[0], re.M), texts[0]
    assert "its flags: --lr 0.1 --seed 1" in texts[1]
    configs = [json.loads((folder / f"task-{i}" / "result.json").read_text())["config"] for i in (0, 1)]
    assert [(c["lr"], c["seed"], c["max_steps"], c["name"]) for c in configs] == \
        [(0.02, 0, 3, "wu-sweep-0"), (0.1, 1, 3, "wu-sweep-1")]
    table = (folder / "sweep.csv").read_text().splitlines()
    assert table[0].startswith("task,lr,seed,steps,") and len(table) == 3, table


@pytest.mark.slow
def test_array_task_without_a_sweep_line_fails_with_one_line(cluster, tmp_path):
    sweep = tmp_path / "sweep.txt"
    sweep.write_text("--lr 0.02\n")
    job, text, _ = submit_and_wait(cluster, tmp_path, "train_array.sbatch", str(sweep), options=("--array=1",))
    assert job["JobState"] == "FAILED" and job["ExitCode"] == "2:0", job
    assert re.search(rf"^error: task 1 has no line 2 in {re.escape(str(sweep))} \(1 line\(s\)\)\. Fix: --array=0-0\.$",
                     text, re.M), text


# ---------------------------------------------------------------------- pre-flight

# What the pre-flight job runs here: a tiny notebook of the workshop's shape in the cpu profile (the real
# notebooks run once per test session, in tests/test_notebooks.py). On a GPU node,
# WORKSHOP_TEST_PREFLIGHT_ARGS="" submits the real pre-flight (every notebook, gpu profile).
PREFLIGHT_ARGS = os.environ.get("WORKSHOP_TEST_PREFLIGHT_ARGS")


@pytest.mark.slow
def test_preflight_job_runs_the_notebooks_and_reports_each_against_its_budget(cluster, tmp_path):
    from test_run_notebooks import write_notebook

    if PREFLIGHT_ARGS is None:
        folder = tmp_path / "notebooks"
        write_notebook(folder, "01_tiny.ipynb", "import workshop_utils as wu", "print(wu.TrainConfig().model)")
        args = ["--notebooks", str(folder), "--profile", "cpu"]
    else:
        args = shlex.split(PREFLIGHT_ARGS)
    job, text, run_dir = submit_and_wait(cluster, tmp_path, "preflight.sbatch", *args,
                                         timeout_s=600 if PREFLIGHT_ARGS is None else 1800)
    assert_succeeded(job, text)
    log = json.loads((run_dir / "notebooks.json").read_text())
    assert log and all(e["status"] == "ok" and e["check"] and e["limit_s"] == e["budget_s"] == 300 for e in log)
    for entry in log:
        assert f"ok      {entry['notebook']} {entry['seconds']:.1f} s" in text
        assert (run_dir / "notebooks" / entry["notebook"]).exists()
    assert f"Pre-flight: ready: {len(log)} of {len(log)} notebook(s) pass within their budget" in text
    report = (run_dir / "report.md").read_text()
    assert "**Pre-flight: ready.**" in report and f"| {log[0]['notebook']} | ok |" in report


@pytest.mark.slow
def test_preflight_job_fails_with_one_line_on_a_bad_selection(cluster, tmp_path):
    job, text, _ = submit_and_wait(cluster, tmp_path, "preflight.sbatch", "--only", "99", "--profile", "cpu")
    assert job["JobState"] == "FAILED" and job["ExitCode"] == "2:0", job
    assert re.search(r"^error: No notebook in \S+ matches \['99'\]\. Fix: ", text, re.M), text
    assert "Traceback" not in text


# ---------------------------------------------------------------------- Jupyter


def _listening_addresses(port: int) -> set[str]:
    """Local addresses with a listening TCP socket on ``port``, from /proc/net/tcp{,6}."""
    found = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            rows = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            local, state = row.split()[1], row.split()[3]
            address, hex_port = local.split(":")
            if state == "0A" and int(hex_port, 16) == port:
                found.add(address)
    return found


def _outward_address() -> str | None:
    """This machine's own non-loopback IPv4 address, if it has one (no packet is sent)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        try:
            sock.connect(("192.0.2.254", 9))
            address = sock.getsockname()[0]
        except OSError:
            return None
    return None if address.startswith("127.") else address


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args, **kwargs):
        return None  # a redirect comes back as the HTTPError it is


def _http_status(url: str, token: str | None = None) -> tuple[int, str]:
    """(status, Location header) of one request, redirects not followed."""
    request = urllib.request.Request(url, headers={"Authorization": f"token {token}"} if token else {})
    try:
        with urllib.request.build_opener(_NoRedirect).open(request, timeout=10) as answer:
            return answer.status, answer.headers.get("Location", "")
    except urllib.error.HTTPError as err:
        return err.code, err.headers.get("Location", "")


def _command_lines() -> str:
    """Every process's command line, as `ps` would show them to any user of the node."""
    lines = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            lines.append(cmdline.read_bytes().replace(b"\0", b" ").decode(errors="replace"))
        except OSError:
            continue  # the process ended meanwhile
    return "\n".join(lines)


@pytest.mark.skipif(importlib.util.find_spec("jupyterlab") is None,
                    reason="JupyterLab is not installed in this environment (pip install jupyterlab)")
@pytest.mark.slow
def test_jupyter_listens_on_loopback_only_with_a_token_and_prints_the_tunnel(cluster, tmp_path):
    out = tmp_path / "jupyter.out"
    private = tmp_path / "home" / ".workshop"  # not there yet: the job creates it
    job_id = cluster.sbatch(REPO / "slurm" / "jupyter.sbatch", options=("--output", str(out)),
                            env={"WORKSHOP_JUPYTER_DIR": str(private)})
    port = None
    try:
        tunnel = re.compile(r"^\s*ssh -N -L (\d+):127\.0\.0\.1:(\d+) -J \S+@\S+ \S+@(\S+)$", re.M)
        where = re.compile(r"is in (\S+) \(readable by you only\)")
        deadline = time.monotonic() + 120
        while True:
            text = out.read_text() if out.exists() else ""
            found, named = tunnel.search(text), where.search(text)
            if found and named:
                port = int(found.group(1))
                try:
                    _http_status(f"http://127.0.0.1:{port}/api/status")
                    break  # the server answers
                except urllib.error.URLError:
                    pass  # not listening yet
            assert time.monotonic() < deadline and cluster.job(job_id).get("JobState") in ("PENDING", "RUNNING"), \
                f"JupyterLab did not come up: {cluster.job(job_id)}\n{text}"
            time.sleep(0.5)

        host = socket.gethostname().split(".")[0]
        assert found.group(2) == str(port) and found.group(3) == host, text
        assert f"listening on 127.0.0.1:{port} only" in text
        # The URL with its token: in a file only its owner can read, in a folder only its owner can enter.
        info = Path(named.group(1))
        assert info == private / f"jupyter-{job_id}.url"
        assert info.stat().st_mode & 0o777 == 0o600, oct(info.stat().st_mode)
        assert private.stat().st_mode & 0o777 == 0o700, oct(private.stat().st_mode)
        url = info.read_text().strip()
        match = re.fullmatch(rf"http://127\.0\.0\.1:{port}/lab\?token=([0-9a-f]{{48}})", url)
        assert match, url
        token = match.group(1)

        status = f"http://127.0.0.1:{port}/api/status"
        assert _http_status(status)[0] == 403, "answered without a token"
        assert _http_status(status, token="wrong")[0] == 403 and _http_status(f"{status}?token=wrong")[0] == 403
        code, location = _http_status(f"http://127.0.0.1:{port}/lab")
        assert code == 302 and "/login" in location, (code, location)  # the page itself: sent to log in
        assert _http_status(status, token=token)[0] == 200
        assert _http_status(url)[0] == 200  # the URL the user opens
        # Bound to the loopback address alone: 127.0.0.1 (0100007F), never 0.0.0.0 or the node's own address.
        assert _listening_addresses(port) == {"0100007F"}
        listening = subprocess.run(["ss", "-Hltn", f"sport = :{port}"], capture_output=True, text=True).stdout \
            if shutil.which("ss") else f"127.0.0.1:{port}"
        assert {line.split()[3] for line in listening.splitlines() if line.strip()} == {f"127.0.0.1:{port}"}, listening
        outward = _outward_address()
        if outward:
            with pytest.raises(OSError):
                socket.create_connection((outward, port), timeout=5).close()
        assert token not in _command_lines(), "the token must not show in any command line (ps)"
    finally:
        cluster.run("scancel", job_id, check=False)
    cluster.wait(job_id, 60)
    deadline = time.monotonic() + 30
    while port and _listening_addresses(port) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not _listening_addresses(port), "JupyterLab still listening after scancel"
    # The job output (often readable by the whole project), Jupyter's own log lines included, never has it.
    text = out.read_text()
    assert token not in text, f"the token leaked into the job output:\n{text}"
    assert not re.search(r"[0-9a-f]{48}", text), text  # nor any token-like string
    deadline = time.monotonic() + 15
    while info.exists() and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not info.exists(), "the URL file must be removed when the job ends"


@pytest.mark.slow
def test_jupyter_refuses_a_url_folder_others_can_write_to(cluster, tmp_path):
    """The token is kept only where nobody else can swap or plant the file: a shared folder stops the job."""
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    job, text, _ = submit_and_wait(cluster, tmp_path, "jupyter.sbatch", env={"WORKSHOP_JUPYTER_DIR": str(shared)})
    assert job["JobState"] == "FAILED" and job["ExitCode"] == "2:0", (job, text)
    assert re.search(rf"^error: {re.escape(str(shared))} is not a folder only you can write to.* Fix: ", text, re.M), text
    assert not list(shared.iterdir()), "nothing may be written into a folder others can write to"
    assert "http://" not in text, "no server, no URL"


def test_nsys_job_uses_the_same_capture_options_as_the_notebook():
    import shlex

    import workshop_utils as wu

    text = (REPO / "slurm" / "profile_nsys.sbatch").read_text()
    line = re.search(r"^nsys profile (.*?)\\\n\s*(.*?) --output", text, re.M | re.S)
    in_script = shlex.split(line.group(1)) + shlex.split(line.group(2))
    command = wu.nsys_command(wu.TrainConfig(), "report")
    assert in_script == command[2:command.index("--output")]
    assert "--annotate" in text


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("nsys") is not None, reason="this node has nsys: the missing-nsys path cannot show")
def test_nsys_job_without_nsys_stops_with_one_line(cluster, tmp_path):
    job, text, _ = submit_and_wait(cluster, tmp_path, "profile_nsys.sbatch", "--steps", "2")
    assert job["JobState"] == "FAILED" and job["ExitCode"] == "2:0"
    errors = [line for line in text.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "no nsys command" in errors[0] and "Traceback" not in text


# ---------------------------------------------------------------------- Exercise 6.1: the attendee's job script

SIMULATED = {  # Exercise 6.1's rows whose simulated job runs in make test (WORKSHOP_EVERY_ROW=1 runs all)
    "test_exercise_61_names_each_mistake_in_one_line_before_the_queue[change2-the job started torchrun 2 times on "
    "gpu-a017]",
}
SOLVED_61 = dict(nodes=1, ntasks_per_node=1, cpus_per_task=2, time="00:05:00", signal="B:USR1@60", nproc_per_node=2,
                 rdzv_endpoint='"$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1):'
                               '$((29500 + SLURM_JOB_ID % 1000))"')


def _on_cluster(cluster, monkeypatch):
    """The check's sbatch and scontrol talk to the test cluster, and its jobs run this Python."""
    for key in ("SLURM_CONF", "PATH", "WORKSHOP_RUNS"):
        monkeypatch.setenv(key, cluster.env[key])
    monkeypatch.delenv("WORKSHOP_SLURM", raising=False)


@pytest.mark.slow
def test_exercise_61_names_a_partition_the_cluster_does_not_have(cluster, tmp_path, monkeypatch):
    _on_cluster(cluster, monkeypatch)
    script = wu.fill_job_script(SOLVED_61).replace("#SBATCH --time", "#SBATCH --partition=gpu-big\n#SBATCH --time")
    with pytest.raises(wu.WorkshopError, match=r"sbatch refused the script: .*invalid partition.*gpu-big") as err:
        wu.check_job_script(script, jobs_dir=tmp_path)
    assert "\n" not in str(err.value) and "partition that sinfo lists" in err.value.fix


@pytest.mark.parametrize("change, said", [
    (dict(rdzv_endpoint='""'), "never completed the rendezvous (they waited: gpu-a017 at localhost:29400"),
    (dict(rdzv_endpoint=":29500"), "The hostname of the rendezvous endpoint ':29500' must be"),
    (dict(ntasks_per_node=2), "the job started torchrun 2 times on gpu-a017"),
    (dict(signal=""), "Invalid --signal specification"),
    (dict(signal="TERM@60"), "listen for SIGUSR1"),
    (dict(signal="B:USR1@5"), "5 s of warning"),
    (dict(time="00:01:00"), "--time of 60 s (line 6): the job needs about 120 s"),
    (dict(cpus_per_task=1), "#SBATCH --cpus-per-task=1 (line 5) gives the launch's task 1 core(s) for its 2 training"),
])
def test_exercise_61_names_each_mistake_in_one_line_before_the_queue(change, said, monkeypatch, request):
    from test_slurm_exercise_answers import simulate_the_sample

    simulate_the_sample(request, monkeypatch)
    monkeypatch.setattr("workshop_utils.exercises.slurm_exercises.submit",
                        lambda *a, **k: pytest.fail("a script with a mistake in its text must not be submitted"))
    with pytest.raises(wu.WorkshopError) as err:
        wu.check_job_script({**SOLVED_61, **change})
    assert said in str(err.value) and "\n" not in str(err.value) and err.value.fix


def test_exercise_61_without_slurm_judges_the_text_and_says_it_ran_nothing(monkeypatch, capsys):
    from workshop_utils.exercises.job_script_run import namespaces_problem

    monkeypatch.setenv("WORKSHOP_SLURM", "off")
    assert wu.check_job_script(SOLVED_61)
    unrun = namespaces_problem()  # a machine without PID namespaces says so, and judges the #SBATCH lines alone
    how = (f"its #SBATCH lines read right; its commands were not run here ({unrun})" if unrun else
           "bash ran it right in a simulated job, on 1 node and on 2")
    assert capsys.readouterr().out.strip() == (f"✓ Exercise 6.1: correct ({how}; Slurm not used here "
                                               "(WORKSHOP_SLURM=off), so it was not submitted).")


def test_exercise_61_left_open_is_one_line_and_no_error(capsys):
    assert wu.check_job_script({**SOLVED_61, "time": ..., "signal": ...}) is False
    assert capsys.readouterr().out.strip() == ("… Exercise 6.1: not yet solved: fill time, signal. Fix: each is what "
                                               "goes after its flag in the script above.")


# ---------------------------------------------------------------------- Exercise 6.2: the attendee's job array

RATES = (0.01, 0.03, 0.1)
SWEEP_LINES = [f"--lr {lr}" for lr in RATES]


@pytest.mark.parametrize("lines, array, said", [
    (SWEEP_LINES, "1-3", "task(s) [3] would find no line in the sweep file"),
    (SWEEP_LINES, "0-3", "task(s) [3] would find no line"),
    (SWEEP_LINES, "0-1", "line(s) [3] would never train"),
    (SWEEP_LINES, "0..2", "is not a task list Slurm reads"),
    (SWEEP_LINES[:2], "0-1", "2 line(s) for 3 learning rates"),
    (["--lr 0.01"] * 3, "0-2", "some tasks train the same run twice"),
    (["--lr 0.01", "--seed 1", "--lr 0.1"], "0-2", "line(s) [2] set no --lr"),
    (list(reversed(SWEEP_LINES)), "0-2", "not [0.01, 0.03, 0.1]"),
])
def test_exercise_62_names_each_miscount_in_one_line_before_the_queue(lines, array, said, monkeypatch):
    monkeypatch.setattr("workshop_utils.exercises.slurm_exercises.submit",
                        lambda *a, **k: pytest.fail("a sweep with a mistake must not be submitted"))
    with pytest.raises(wu.WorkshopError) as err:
        wu.check_array_sweep(lines, array, RATES, wu.TrainConfig())
    assert said in str(err.value) and "\n" not in str(err.value) and err.value.fix


def test_exercise_62_left_open_or_without_slurm_is_one_line(monkeypatch, capsys):
    assert wu.check_array_sweep(..., ..., RATES, wu.TrainConfig()) is False
    monkeypatch.setenv("WORKSHOP_SLURM", "off")
    assert wu.check_array_sweep(SWEEP_LINES, "0-2%2", RATES, wu.TrainConfig())
    out = capsys.readouterr().out.strip().splitlines()
    assert out[0].startswith("… Exercise 6.2: not yet solved") and out[1].startswith("✓ Exercise 6.2: correct (3 tasks")
