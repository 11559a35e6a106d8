"""Exercise 6.1's check, tried as an attendee would try to fool it: through its one public call and nothing else.

Each test holds a finding of a review that read only the notebook and help(wu.check_job_script): a right answer
the check refused, a refusal that named the wrong mistake or gave a fix that was already there, an answer whose
verdict changed from one run to the next, a script that could harm the machine the check runs on, and calls
that pass here and would fail only in class. A pass returns True; a refusal is a WorkshopError, one line that
starts "✗ Exercise 6.1" and names the mistake. No Slurm is asked (WORKSHOP_SLURM=off, tests/conftest.py): the
verdicts come from the #SBATCH lines and from bash running the script in the check's simulated job.
"""

from __future__ import annotations

import contextlib
import io
import subprocess
from pathlib import Path

import pytest

import workshop_utils as wu

FIRST = 'scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1'
SOLVED = dict(nodes=1, ntasks_per_node=1, cpus_per_task=2, time="00:05:00", signal="B:USR1@60", nproc_per_node=2,
              rdzv_endpoint=f'"$({FIRST}):$((29500 + SLURM_JOB_ID % 1000))"')


def answers(**change) -> dict:
    return {**SOLVED, **change}


def first_node_after(command: str) -> dict:
    """The notebook's answers, with ``command`` run in the batch shell where it reads the first node's name."""
    return answers(rdzv_endpoint=f'"$({command}; {FIRST}):29500"')


def verdict(answer, **call) -> str:
    """The one line the check gives: its pass line, or its refusal."""
    said = io.StringIO()
    try:
        with contextlib.redirect_stdout(said):
            assert wu.check_job_script(answer, **call) is True
    except wu.WorkshopError as err:
        message = str(err)
        assert len(message.splitlines()) == 1 and message.startswith("✗ Exercise 6.1: ") and err.fix, message
        assert "the check itself failed" not in message, message
        return message
    line = said.getvalue().strip()
    assert line.startswith("✓ Exercise 6.1: correct") and len(line.splitlines()) == 1, line
    return line


def refused(answer, *words, **call) -> str:
    message = verdict(answer, **call)
    assert message.startswith("✗"), f"a wrong answer passed: {message}"
    for word in words:
        assert word in message, f"{word!r} not in: {message}"
    return message


@pytest.fixture(scope="module")
def simulated() -> str:
    """The notebook's own answer passes; where this machine cannot run the simulated job, the tests that need
    it are skipped, with the check's own reason."""
    line = verdict(SOLVED)
    assert line.startswith("✓"), line
    if "bash ran it right in a simulated job" not in line:
        pytest.skip(f"the check could not run its simulated job here: {line}")
    return line


# ------------------------------------------------------------------------------------------ no stopwatch


@pytest.mark.slow
@pytest.mark.parametrize("sleep", ["/bin/sleep 0.2", "python3 -c 'import time; time.sleep(0.2)'"])
def test_a_short_sleep_on_the_machines_clock_before_the_launch_passes(simulated, sleep):
    """The job's clock moved on while bash slept on the machine's: the warning and the time limit came before
    the launch, and each run named another mistake (srun's options, srun --overlap, pkill's pattern)."""
    assert verdict(first_node_after(sleep)) == simulated


@pytest.mark.slow
def test_the_same_answer_gets_the_same_line_twice(simulated):
    assert verdict(SOLVED) == simulated


def test_a_long_sleep_on_the_machines_clock_is_named_at_once(simulated):
    """Neither skipped nor waited for: a sleep the job's clock cannot skip is named, whatever the machine."""
    refused(first_node_after("/bin/sleep 1000"), "`/bin/sleep 1000`", "machine's own clock", "1000 s")


# ------------------------------------------------------------------------------------------ the right mistake


def test_a_command_that_never_ends_before_the_launch_is_named(simulated):
    """It was "srun did not start the launch ... Fix: srun ... with no other srun option": the launch line was
    the template's; the job's time ran out while bash waited for the command before it."""
    message = refused(first_node_after("sleep 400"), "time limit", "`sleep 400`", "does not end")
    assert "srun did not start" not in message


def test_a_variable_slurm_sets_only_in_job_arrays_is_named(simulated):
    """It was "Fix: keep the template's launch line", which the answer kept: set -u stopped bash at a variable
    that only an array job has."""
    message = refused(answers(rdzv_endpoint=f'"$({FIRST}):$((29500 + SLURM_ARRAY_TASK_ID))"'),
                      "SLURM_ARRAY_TASK_ID: unbound variable", "job array", "${SLURM_ARRAY_TASK_ID:-")
    assert "keep the template's launch line" not in message


# ------------------------------------------------------------------------------------------ right answers


@pytest.mark.slow
@pytest.mark.parametrize("endpoint", [
    f'"$(getent hosts "$({FIRST})" | cut -d " " -f 1):29500"',  # the first node's address, from the name service
    '"$SLURM_TOPOLOGY_ADDR:29500"',  # slurmd sets it in the batch shell: the batch host, the first node
])
def test_the_first_node_however_the_batch_shell_reads_it_passes(simulated, endpoint):
    assert verdict(answers(rdzv_endpoint=endpoint)) == simulated


# ------------------------------------------------------------------------------------------ no harm


def test_killing_every_process_of_yours_reaches_only_the_simulated_job(simulated):
    """kill -9 -1 ends every process its user may signal: in the check, only the simulated job's."""
    bystander = subprocess.Popen(["sleep", "60"])
    try:
        refused(first_node_after("kill -9 -1"), "killed by SIGKILL", "kill -9 -1")
        assert bystander.poll() is None, "kill -9 -1 in the check reached a process of the test's"
    finally:
        bystander.kill()
        bystander.wait()


def test_pkill_python_reaches_only_the_simulated_job(simulated):
    refused(first_node_after("pkill -f python"), "Jupyter kernel")  # the simulated node's, not this one


@pytest.mark.slow
def test_the_scripts_home_is_the_simulated_jobs(simulated):
    """rm -rf ~, harmlessly: what the script does to ~ stays in the simulated job's folder."""
    marker = Path.home() / "ex61-check-was-here"
    assert not marker.exists()
    assert verdict(first_node_after(f"touch ~/{marker.name}")) == simulated
    assert not marker.exists()


def test_a_fork_bomb_is_stopped_and_named(simulated):
    """A loop that starts processes without end (the shape of :(){ :|:& };:, here bounded at 450) is stopped
    before it fills the machine, and nothing of it is left."""
    script = wu.fill_job_script(SOLVED).replace(
        "set -uo pipefail\n", 'set -uo pipefail\nmkfifo ~/never; exec 3<> ~/never\n'
        'for _ in $(seq 450); do cat - ex61-fork-bomb <&3 & done\n', 1)  # each waits on the pipe for good
    refused(script, "processes at once", "`cat`", "fork bomb")
    left = subprocess.run(["pgrep", "-f", "cat - ex61-fork-bomb"], capture_output=True, text=True).stdout.split()
    assert not left, f"the simulated job left processes behind: {left}"


# ------------------------------------------------------------------------------------------ the call itself


@pytest.mark.parametrize("value", [
    "1; rm -rf ~", "1\nrm -rf ~", "1\nkill -9 -1", "1\n:(){ :|:& };:", "1 `reboot`", "1 $(pkill -f python)",
])
def test_commands_in_a_number_gap_are_refused_before_bash_runs_anything(value):
    refused(answers(nodes=value), "nodes")


@pytest.mark.parametrize("call, words", [
    (dict(timeout_s=0), ["timeout_s=0"]), (dict(timeout_s=-5), ["timeout_s=-5"]),
    (dict(timeout_s=float("nan")), ["timeout_s=nan"]), (dict(timeout_s="60"), ["timeout_s='60'"]),
    (dict(timeout_s=None), ["timeout_s=None"]), (dict(jobs_dir=3), ["jobs_dir is an int"]),
])
def test_a_wrong_call_is_named_with_or_without_a_cluster(call, words):
    """Without Slurm these went unread and the check passed; with Slurm, timeout_s=nan would wait for good and
    timeout_s="60" fail after the job was submitted."""
    refused(SOLVED, *words, **call)


def test_a_jobs_dir_that_is_a_file_is_named(tmp_path):
    taken = tmp_path / "jobs"
    taken.write_text("")
    refused(SOLVED, "is a file, not a folder", jobs_dir=taken)


def test_the_template_as_print_shows_it_is_bash_as_bash_reads_it(simulated):
    """print(wu.JOB_SCRIPT) showed forward() {{ ...; }} (a Python format string): copied and filled by hand, bash
    stopped at {{. The template now prints as bash reads it, and a script with doubled braces is named."""
    assert "forward() { srun" in wu.JOB_SCRIPT and "{{" not in wu.JOB_SCRIPT
    script = wu.JOB_SCRIPT
    for gap, value in SOLVED.items():
        script = script.replace("{" + gap + "}", str(value))
    assert verdict(script).startswith("✓")
    refused(script.replace("forward() { ", "forward() {{ ").replace("|| true; }", "|| true; }}"), "{{",
            "one brace each")


# ------------------------------------------------------------------------------------------ the line at fault
# A refusal names the line at fault, in words that are true of what ran, and never spells out a gap's answer.

TEMPLATE = wu.fill_job_script(SOLVED)
LAUNCH_END = '-m workshop_utils.train "$@" &\n'
WAIT = "while ! wait $!; do kill -0 $! 2>/dev/null || break; done"


@pytest.mark.parametrize("endpoint", ['"$SLURM_SUBMIT_HOST:29500"', f'"$({FIRST}):80"'])
def test_a_wrong_endpoint_is_told_in_words_not_as_the_answer(simulated, endpoint):
    """The fix was --rdzv-endpoint="$(scontrol show hostnames ... | head -n 1):29500": the gap's answer, pasted
    as it stood, passed (and its fixed port was not the notebook's per-job one)."""
    message = refused(answers(rdzv_endpoint=endpoint), "torchrun on gpu-a017 stopped", "job's first node")
    assert "head -n" not in message and "$(" not in message and ":29500\"" not in message, message


@pytest.mark.slow
def test_an_endpoint_on_the_last_node_is_named_as_not_the_first_without_a_hang(simulated):
    """Real torchrun meets there (the agent on that node hosts the store): it was refused as a wait that never
    ended ("they waited: ..."); the fault is that the endpoint is not the first node, where the batch shell runs."""
    message = refused(answers(rdzv_endpoint=f'"$({FIRST.replace("head", "tail")}):29500"'), "met at gpu-a018",
                      "not its first", "where the batch shell runs", "--rdzv-endpoint")
    assert "waited" not in message and "--nnodes" not in message.split("Fix:")[1], message


def test_two_tasks_per_node_names_the_sbatch_line_not_the_launch(simulated):
    message = refused(answers(ntasks_per_node=2), "started torchrun 2 times", "#SBATCH --ntasks-per-node=2 (line 4)",
                      "Fix: #SBATCH --ntasks-per-node")
    assert "keep the template's launch line" not in message, message


@pytest.mark.parametrize("nproc", [1, '"$SLURM_NTASKS_PER_NODE"'])
def test_one_process_per_node_names_nproc_per_node(simulated, nproc):
    message = refused(answers(nproc_per_node=nproc), "1 training process", "(line 17)", "Fix: --nproc-per-node")
    assert "keep the template's launch line" not in message, message


def test_a_comment_between_continued_lines_is_named_as_the_backslash_space_is(simulated):
    """It was "torchrun stopped at its arguments ... Fix: keep the template's launch line", which the script had."""
    script = TEMPLATE.replace('--nnodes="$SLURM_JOB_NUM_NODES" \\\n',
                              '--nnodes="$SLURM_JOB_NUM_NODES" \\\n    # meet on the first node\n')
    refused(script, "torchrun stopped at its arguments", "line 17, `# meet on the first node`, is a comment",
            "ended the command", "line 18 ran as a command of its own", "Fix: the comment above or below")
    harmless = TEMPLATE.replace("# bash runs", "true \\\n  # a comment that ends a command already whole\n# bash runs")
    assert verdict(harmless).startswith("✓"), "a comment after a continued line that bash runs right was refused"


@pytest.mark.parametrize("how, words", [
    ("foreground", ["the launch in the foreground", "Fix: the launch in the background (&"]),
    ("exec", ["`exec` (line 16) replaced the batch shell with srun", "Fix: no exec"]),
])
def test_a_launch_that_keeps_bash_from_its_trap_is_named(simulated, how, words):
    """Both got "Fix: trap forward USR1, with forward() {...} as in the template", which the scripts had."""
    script = TEMPLATE.replace(LAUNCH_END, LAUNCH_END[:-3] + "\n").replace(WAIT, "")
    message = refused(script.replace("srun --cpus", "exec srun --cpus") if how == "exec" else script, *words)
    assert "trap forward USR1, with" not in message, message


def test_an_exit_in_the_trap_is_named_not_the_loop(simulated):
    """It was "Fix: keep the template's loop after the launch", which the script had: the trap's exit ended it."""
    message = refused(TEMPLATE.replace("trap forward USR1", "trap 'forward; exit 0' USR1"),
                      "the trap ended it: `trap 'forward; exit 0' USR1` (line 14)", "no exit in it")
    assert "keep the template's loop" not in message, message


@pytest.mark.slow
def test_waiting_twice_for_the_launch_passes_as_slurm_warns_once(simulated):
    """The simulation sent the warning a second time, 1 s after the first, which Slurm does not (slurmctld marks
    the job WARN_SENT): a second wait after the trap then lost the checkpoint ("after the second warning")."""
    assert verdict(TEMPLATE.replace(WAIT, 'PID=$!\nwait "$PID"\nwait "$PID"')) == simulated


def test_a_task_count_instead_of_tasks_per_node_speaks_of_no_line_that_is_gone():
    """It said "--ntasks-per-node becomes only a maximum" where --ntasks had replaced that line."""
    message = refused(TEMPLATE.replace("#SBATCH --ntasks-per-node=1", "#SBATCH --ntasks=1"), "#SBATCH --ntasks=1",
                      "fixes the job's task count", "one per node")
    assert "--ntasks-per-node" not in message, message


@pytest.mark.parametrize("change", [dict(time="999:00:00"), dict(time="2"), dict(time="UNLIMITED"),
                                    dict(signal="B:USR1@10"), dict(signal="USR1@60"), dict(cpus_per_task=1)],
                         ids=str)
def test_no_refusal_spells_out_a_gap_as_the_notebook_fills_it(simulated, change):
    """The fixes read "e.g. 00:05:00", "--signal=B:USR1@60" and "#SBATCH --cpus-per-task=2": whole answers to paste."""
    message = refused(answers(**change))
    for gap in ("time", "signal", "cpus_per_task"):
        assert f"{gap.replace('_', '-')}={SOLVED[gap]}" not in message and f"e.g. {SOLVED[gap]}" not in message, message
    assert "@60" not in message.replace(str(change.get("signal")), ""), message


@pytest.mark.parametrize("endpoint", ["gpu-a017:29500", "10.1.0.17:29500",
                                      '"gpu-a017:$((29500 + SLURM_JOB_ID % 1000))"'])
def test_the_simulated_jobs_own_node_written_in_is_refused(simulated, endpoint):
    """Refusals quote the launch as it ran (--rdzv-endpoint=gpu-a017:29500): pasted, that name passed every run of
    the simulated job, whose first node always has it, and would fail the next real job."""
    refused(answers(rdzv_endpoint=endpoint), "line 17 names", "simulated job", "the next job gets other nodes",
            "job's first node")


# ---------------------------------------------------------------- found by a fifth review
def test_too_few_cores_names_the_request_that_asked_for_them(simulated):
    """It opened with OMP_NUM_THREADS=1 and the launch's line, both right, and listed four things to fix."""
    message = refused(answers(cpus_per_task=1), "#SBATCH --cpus-per-task=1 (line 5)", "one core for each training")
    assert not message.startswith("✗ Exercise 6.1: OMP_NUM_THREADS") and "OMP_NUM_THREADS=1, as in" not in message


def test_a_rendezvous_at_each_nodes_own_host_names_only_the_endpoint_to_fix(simulated):
    """Its Fix listed --nnodes, --rdzv-backend and --rdzv-id too, which the script had right."""
    message = refused(answers(rdzv_endpoint="localhost:29500"), "never completed the rendezvous", "Fix: --rdzv-endpoint")
    assert "--rdzv-backend=c10d" not in message.split("Fix:")[1], message


# ------------------------------------------------------------------------------------------ what the job draws


@pytest.mark.parametrize("endpoint, words", [
    # bash reads the id's last three digits as octal where they start with 0 (089: "value too great for base"),
    # and finds none in a job id of one or two digits, as on a new cluster: some jobs never launch
    (f'"$({FIRST}):$((29500 + ${{SLURM_JOB_ID: -3}}))"', ("value too great for base", "job's id was 199089")),
    (f'"$({FIRST}):29${{SLURM_JOB_ID: -3}}"', ("port: 29,", "job's id was 7")),
    (f'"$({FIRST}):$((29500 + ${{SLURM_JOB_ID: -4}} % 1000))"', ("operand expected", "job's id was 7")),
    # RANDOM % 1000 + 1000 draws a port only root may listen on in some jobs
    (f'"$({FIRST}):$((RANDOM % 1000 + 1000))"', ("port: 1000,", "$RANDOM was 0")),
])
def test_a_port_that_fails_for_some_job_ids_or_draws_is_refused_naming_the_draw(simulated, endpoint, words):
    refused(answers(rdzv_endpoint=endpoint), *words, "--rdzv-endpoint=HOST:PORT")


@pytest.mark.parametrize("endpoint", [f'"$({FIRST}):$((20000 + SLURM_JOB_ID % 30000))"',
                                      f'"$({FIRST}):$((10000 + RANDOM))"'])
def test_a_port_right_for_every_job_id_and_draw_passes(simulated, endpoint):
    assert verdict(answers(rdzv_endpoint=endpoint)) == simulated


# ------------------------------------------------------------------------------------------ the first node's name


@pytest.mark.parametrize("host", ["$(python3 -c 'import socket; print(socket.gethostname())')",
                                  "$(cat /proc/sys/kernel/hostname)",
                                  "$(scontrol show node \"$(" + FIRST + ")\" | grep -oP 'NodeAddr=\\K\\S+')"])
def test_the_batch_hosts_name_read_any_way_a_real_job_allows_passes(simulated, host):
    """The batch shell runs on the job's first node: gethostname() there names it, as hostname does, and
    scontrol show node gives its address."""
    assert verdict(answers(rdzv_endpoint=f'"{host}:29500"')) == simulated


def test_a_command_the_simulated_job_cannot_follow_is_said_to_be_the_checks_limit(simulated):
    message = refused(answers(rdzv_endpoint='"$(scontrol show partition cpu | head -n 1):29500"'),
                      "this simulated scontrol knows", "could not follow that command")
    assert message.index("Fix:") < message.index("Note:"), message


# ------------------------------------------------------------------------------------------ a gap's own text


@pytest.mark.parametrize("change, words", [
    (dict(rdzv_endpoint=f'“$({FIRST}):29500”'), ("U+201C", "typographic quote", "straight")),
    (dict(rdzv_endpoint=f'"$({FIRST}):29500’"'), ("U+2019",)),
    (dict(signal=b"B:USR1@60"), ("is bytes", "the b before the quotes")),
    (dict(nproc_per_node="2 # one per core"), ("starts a comment in bash", "a line of its own above")),
    (dict(rdzv_endpoint=f'"$({FIRST}):29500" # the first node'), ("starts a comment in bash",)),
    (dict(nodes=" 1"), ("`nodes` starts with a space", "sbatch splits")),
    (dict(time=" 00:05:00"), ("`time` starts with a space",)),
])
def test_a_gaps_own_text_is_named_before_any_run(change, words):
    """Pasted quotes, bytes, a comment that would swallow the launch line's backslash, a space sbatch splits at:
    named as what the attendee typed, not as what torchrun or sbatch then made of it."""
    refused(answers(**change), *words)


@pytest.mark.parametrize("change", [dict(rdzv_endpoint=f'"$({FIRST}):$((29500 + 10#$SLURM_JOB_ID % 1000))"'),
                                    dict(rdzv_endpoint=f'"$({FIRST})":$((29500 + $# ))'),
                                    dict(cpus_per_task="2  # one core per process")])
def test_a_hash_that_starts_no_comment_in_bash_is_no_comment(simulated, change):
    """# inside a word or after $ is no comment to bash; sbatch takes a comment after an #SBATCH value."""
    assert verdict(answers(**change)) == simulated
