"""Notebook 06's Exercise 6.1/6.2 checks, continued: the adversarial review's findings (its report's A, B, C and D
rows), each a right answer that must pass or a wrong one that must be refused in one line naming its mistake.

Right answers include the kit's own idioms (slurm/train_*.sbatch); wrong ones are judged against the exercise's
specification (``JOB_SPEC``: the same script must train on two nodes with only #SBATCH --nodes changed) and the
rules of bash, sbatch, srun, pkill and torchrun.
"""

from __future__ import annotations

import time
from decimal import Decimal

import pytest

import workshop_utils as wu
from workshop_utils.exercises import slurm_exercises as se
from test_slurm_exercise_answers import refused as refused_by
from test_slurm_exercise_answers import simulated_sample  # noqa: F401 (the fixture: which rows run their simulation)

FIRST = '$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)'
SOLVED = dict(nodes=1, ntasks_per_node=1, cpus_per_task=2, time="00:05:00", signal="B:USR1@60", nproc_per_node=2,
              rdzv_endpoint=f'"{FIRST}:$((29500 + SLURM_JOB_ID % 1000))"')
EP = SOLVED["rdzv_endpoint"]
LAUNCH = 'srun --cpus-per-task="$SLURM_CPUS_PER_TASK" torchrun'
WAIT = "while ! wait $!; do kill -0 $! 2>/dev/null || break; done"
PKILL = 'pkill -USR1 -f "python[0-9.]* -u -m workshop_utils.train"'
FORWARD = "srun --overlap --ntasks-per-node=1 pkill"
NNODES = '--nnodes="$SLURM_JOB_NUM_NODES"'
LIST = 'scontrol show hostnames "$SLURM_JOB_NODELIST"'


SIMULATED = {  # the rows whose simulated job runs in make test: a sample of each kind (WORKSHOP_EVERY_ROW=1 runs all)
    *(f"test_right_answers_the_review_found_refused_now_pass[{name}]" for name in ("B2 an array's first", "A5 exec")),
    *(f"test_wrong_answers_the_review_found_accepted_are_named[{name}]" for name in (
        "A1 wait", "A2 pkill torchrun", "A3 no srun", "A3 no --overlap", "A4 a typo", "A6 --nnodes=1",
        "B5 a loop that sleeps long")),
}


@pytest.fixture(autouse=True)
def no_slurm(monkeypatch):
    monkeypatch.setenv("WORKSHOP_SLURM", "off")
    monkeypatch.setattr(se, "submit", lambda *a, **k: pytest.fail("a check submitted a job in a text-only test"))


def script() -> str:
    return se.fill_job_script(SOLVED)


def before_launch(lines: str):
    return lambda s: s.replace(LAUNCH, lines + "\n" + LAUNCH)


def host(endpoint: str, lines: str = ""):
    return lambda s: (before_launch(lines)(s) if lines else s).replace(EP, endpoint)


RIGHT = {
    # B1: ports the batch shell fixes once
    "B1 the kit's port line": lambda s: host('"$head_node:$port"', f'head_node="{FIRST}"\n'
                                             'port="${WORKSHOP_RDZV_PORT:-$(( 29500 + SLURM_JOB_ID % 1000 ))}"')(s),
    "B1 ${PORT:-29500}": host(f'"{FIRST}:${{PORT:-29500}}"'),
    "B1 ${PORT-29500}": host(f'"{FIRST}:${{PORT-29500}}"'),
    "B1 RANDOM": host(f'"{FIRST}:$((29500 + RANDOM % 1000))"'),
    "B1 let": host(f'"{FIRST}:$port"', "let port=29500+SLURM_JOB_ID%1000"),
    "B1 shuf": host(f'"{FIRST}:$(shuf -i 20000-30000 -n 1)"'),
    "B6 $[...]": host(f'"{FIRST}:$[29500 + SLURM_JOB_ID % 1000]"'),
    # B2: the first node, as people take it
    "B2 an array's first": host('"${nodes[0]}:29500"', f"nodes=( $({LIST}) )"),
    "B2 mapfile": host('"${nodes[0]}:29500"', f"mapfile -t nodes < <({LIST})"),
    "B2 read": host('"$H:29500"', f"read -r H < <({LIST})"),
    "B2 head <<<": host(f'"$(head -n 1 <<< "$({LIST})"):29500"'),
    # B3: node counts that match the job's, here and on two nodes
    "B3 SLURM_NTASKS": lambda s: s.replace(NNODES, '--nnodes="$SLURM_NTASKS"'),
    "B3 SLURM_NNODES": lambda s: s.replace(NNODES, "--nnodes=$SLURM_NNODES"),
    "B3 1:2": lambda s: s.replace(NNODES, "--nnodes=1:2"),
    # B4: arrays on the launch line
    "B4 the kit's numa idiom": lambda s: before_launch("numa=()")(s).replace(
        NNODES, NNODES + ' ${numa[@]+"${numa[@]}"}'),
    "B4 an empty array": lambda s: before_launch("extra=()")(s).replace(NNODES, NNODES + ' "${extra[@]}"'),
    "B4 options in an array": lambda s: before_launch(f"args=({NNODES} --nproc-per-node=2)")(s).replace(
        NNODES + " \\\n    --nproc-per-node=2", '"${args[@]}"'),
    # B5, B6: waiting, env, a trap set by a called function
    "B5 a polling loop": lambda s: s.replace(WAIT, "while kill -0 $! 2>/dev/null; do sleep 1; done"),
    "B6 srun env torchrun": lambda s: s.replace(LAUNCH, LAUNCH.replace("torchrun", "env OMP_NUM_THREADS=1 torchrun")),
    "B6 a trap set in a function called": lambda s: s.replace("trap forward USR1",
                                                              "setup() { trap forward USR1; }\nsetup"),
    "B6 ${NPROC:-2}": lambda s: s.replace("--nproc-per-node=2", "--nproc-per-node=${NPROC:-2}"),
    # Refused while the check read the script ("exec replaces the batch shell"): with the template's trailing &,
    # exec replaces the background subshell that runs the launch, and the batch shell keeps its trap and its wait
    # loop. Bash runs it, and the run shows the warning passed on and every checkpoint written.
    "A5 exec": lambda s: s.replace(LAUNCH, "exec " + LAUNCH),
}


@pytest.mark.parametrize("edit", RIGHT.values(), ids=RIGHT.keys())
def test_right_answers_the_review_found_refused_now_pass(edit, capsys):
    text = edit(script())
    assert text != script()
    assert wu.check_job_script(text) is True, se.script_problem(text)


def refused(text, *words) -> str:
    message = refused_by(lambda: wu.check_job_script(text), *words)
    assert message.startswith("✗ Exercise 6.1"), message
    return message


WRONG = {
    # A1: one wait returns at the trapped signal
    "A1 wait": (lambda s: s.replace(WAIT, "wait"), ["ended after the warning, with status 138",
                                                    "no checkpoint"]),
    "A1 wait $!": (lambda s: s.replace(WAIT, "wait $!"), ["ended after the warning", "138"]),
    "A1 wait -n": (lambda s: s.replace(WAIT, "wait -n"), ["ended after the warning"]),
    "B5 a loop that sleeps long": (lambda s: s.replace(WAIT, "while kill -0 $!; do sleep 300; done"),
                                   ["`sleep 300`", "runs a trap only once"]),
    # A2: signalling torchrun, or the wrong signal
    "A2 pkill -f the module": (lambda s: s.replace(PKILL, "pkill -USR1 -f workshop_utils.train"),
                               ["reached torchrun itself", "`pkill -USR1 -f workshop_utils.train`"]),
    "A2 pkill torchrun": (lambda s: s.replace(PKILL, "pkill -USR1 torchrun"),
                          ["reached torchrun itself", "`pkill -USR1 torchrun`"]),
    "A2 USR2": (lambda s: s.replace("pkill -USR1", "pkill -USR2"), ["sent SIGUSR2", "reached 0 of 2"]),
    "A2 pkill's default TERM": (lambda s: s.replace("pkill -USR1", "pkill"), ["sent SIGTERM"]),
    "A11 scancel": (lambda s: s.replace(f"{FORWARD} -USR1 -f \"python[0-9.]* -u -m workshop_utils.train\"",
                                        "scancel --signal=USR1 $SLURM_JOB_ID"), ["reached torchrun itself", "scancel"]),
    # A3: forwarding that misses nodes or waits
    "A3 no srun": (lambda s: s.replace(FORWARD, "pkill"), ["2 of 4", "2 on gpu-a017 only"]),
    "A3 no --overlap": (lambda s: s.replace(FORWARD, "srun --ntasks-per-node=1 pkill"),
                        ["step creation temporarily disabled", "srun --overlap"]),
    "A3 --ntasks=1": (lambda s: s.replace(FORWARD, "srun --overlap --ntasks=1 pkill"),
                      ["2 of 4", "2 on gpu-a017 only"]),
    # A4: traps that do nothing
    "A4 a typo": (lambda s: s.replace("trap forward USR1", "trap forwrd USR1"), ["forwrd", "command not found"]),
    "A4 ignored": (lambda s: s.replace("trap forward USR1", 'trap "" USR1'), ["ignores SIGUSR1"]),
    "A4 reset": (lambda s: s.replace("trap forward USR1", "trap - USR1"), ["default action"]),
    "A4 in a subshell": (lambda s: s.replace("trap forward USR1", "( trap forward USR1 )"),
                         ["nothing in the script traps it"]),  # the subshell's trap ends with it
    "A4 after the wait": (lambda s: s.replace("trap forward USR1\n", "").replace(WAIT, WAIT + "\ntrap forward USR1"),
                          ["nothing in the script traps it"]),  # not set yet when the warning comes
    "A4 undefined": (lambda s: s.replace("forward() {", "#forward() {"), ["forward: command not found"]),
    # A6, A7
    "A6 --nnodes=1": (lambda s: s.replace(NNODES, "--nnodes=1"), ["left out of the rendezvous", "only #SBATCH --nodes"]),
    "A6 --nnodes=1:1": (lambda s: s.replace(NNODES, "--nnodes=1:1"), ["--nnodes=1:1", "left out of the rendezvous"]),
    "A6 no --nnodes": (lambda s: s.replace(NNODES + " ", ""), ["--nnodes 1,", "left out of the rendezvous"]),
    "A6 srun -N 2": (lambda s: s.replace(LAUNCH, LAUNCH.replace("torchrun", "-N 2 torchrun")),
                     ["did not start the launch", "Only allocated 1 nodes asked for 2"]),
    "A7 #!/bin/sh": (lambda s: s.replace("#!/bin/bash", "#!/bin/sh"), ["dash", "#!/bin/bash"]),
    # A9: a non-breaking space
    "A9 NBSP in #SBATCH": (lambda s: s.replace("#SBATCH --nodes=1", "#SBATCH --nodes=1\u00a0"), ["U+00A0", "line 3"]),
    # A10: #SBATCH lines that change the job
    **{f"A10 --{line}": (lambda s, line=line: s.replace("#SBATCH --cpus-per-task=2",
                                                       f"#SBATCH --cpus-per-task=2\n#SBATCH --{line}"),
                         [f"#SBATCH --{line.split('=')[0]}", "leave"])
       for line in ("ntasks=2", "cpus-per-gpu=4", "exclusive", "hold", "test-only", "array=0-3", "nodelist=n1")},
    # C: the mistake named is the one made
    "C1 a single-quoted endpoint": (host(f"'{FIRST}:29500'"), ["endpoint '$(scontrol show hostnames"]),
    "C2 a backslash and a space": (lambda s: s.replace(NNODES + " \\\n", NNODES + " \\ \n"),
                                   ["ends in a backslash and a space", "line 16"]),
    "C5 CR-only line ends": (lambda s: s.replace("\n", "\r"), ["\\r alone"]),
    "C5 a BOM": (lambda s: "\ufeff" + s, ["byte-order mark"]),
}


@pytest.mark.parametrize("edit, words", WRONG.values(), ids=WRONG.keys())
def test_wrong_answers_the_review_found_accepted_are_named(edit, words):
    text = edit(script())
    assert text != script()
    refused(text, *words)


@pytest.mark.parametrize("change, words", [
    (dict(time="00:05:00\u00a0"), ["U+00A0"]), (dict(cpus_per_task="2\u00a0"), ["U+00A0"]),
    (dict(rdzv_endpoint=f'"{FIRST}:29500" --nnodes=1'), ["--nnodes=1", "left out of the rendezvous"]),
    (dict(signal="B:USR1@300"), ["at least 480 s", "shorter warning"]),
    (dict(signal="B:USR1@4096"), ["at least 4276 s", "shorter warning"]),
    (dict(nodes=10 ** 5000), ["about 5001 digits"]), (dict(nodes=-10 ** 5000), ["digits"]),
    (dict(nodes=Decimal("1E+100000")), ["digits"]),
])
def test_answers_in_the_dict_the_review_found_are_named(change, words):
    refused({**SOLVED, **change}, *words)


def test_a_huge_number_never_raises_from_fill_job_script():
    with pytest.raises(wu.WorkshopError):
        se.fill_job_script({**SOLVED, "nodes": 10 ** 5000})


def test_a_very_long_word_is_refused_at_once():
    start = time.perf_counter()
    refused(se.fill_job_script({**SOLVED, "rdzv_endpoint": "x" * 1_000_000 + ":29500"}), "longer than")
    assert time.perf_counter() - start < 2


def test_a_sweep_line_with_a_non_breaking_space_is_named():
    with pytest.raises(wu.WorkshopError) as caught:
        wu.check_array_sweep(["--lr\u00a00.01", "--lr 0.03", "--lr 0.1"], "0-2", [0.01, 0.03, 0.1], wu.TrainConfig())
    assert "U+00A0" in str(caught.value) and len(str(caught.value).splitlines()) == 1


LONG_JOB = {"job": "7", "elapsed_s": 10800, "time_limit_s": 14400, "cpus": 4, "gpus": 2, "cpu_time_s": 180.0,
            "max_rss_mib": 1000.0, "source": "scontrol and the job's own training record"}
RIGHT_LONG = dict(cpu_efficiency=180 / (10800 * 4), time_share=0.75, gpu_hours=6.0, next_time_limit_s=16200,
                  next_memory_mib=1300)


@pytest.mark.parametrize("value, words", [(-120, ["above zero", "positive multiple of 60"]),
                                          (4.5, ["`next_time_limit_s` = 4.5:", "whole minutes"])])
def test_exercise_63_names_a_negative_limit_and_hours_by_their_value(value, words):
    assert wu.check_job_usage(**RIGHT_LONG, usage=LONG_JOB)
    with pytest.raises(wu.WorkshopError) as caught:
        wu.check_job_usage(**{**RIGHT_LONG, "next_time_limit_s": value}, usage=LONG_JOB)
    message = str(caught.value)
    assert len(message.splitlines()) == 1 and all(w in message for w in words), message
