"""Notebook 06's Exercise 6.1 check, a seventh round: what the review of the sixth round's changes found. Output
thrown away on the launch line itself, the script's arguments moved before the launch, launches a case arm
never reaches or a loop starts twice, OMP_NUM_THREADS set on the launch line, exports taken back or made by
``set -a``, per-node variables read inside ``bash -c``, waits without an operand or twice in a row, and
invisible or digit-led look-alike dashes.
"""

from __future__ import annotations

import pytest

import workshop_utils as wu
from test_slurm_exercise_answers import simulated_sample  # noqa: F401 (the fixture: which rows run their simulation)
from test_slurm_exercise_answers_2 import SOLVED, WAIT, refused, script
from workshop_utils.exercises import slurm_exercises as se

TEMPLATE = script()
LAUNCH = TEMPLATE[TEMPLATE.index("srun --cpus"):TEMPLATE.index("# bash runs")]
BARE = LAUNCH.rstrip().rstrip("&").rstrip()  # the launch without its &
STEP = 'srun --cpus-per-task="$SLURM_CPUS_PER_TASK" torchrun'
EXPORTED = 'export EP="$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1):29500"\n'


def through_bash_c(endpoint: str = '"$EP"') -> str:
    return ("srun --cpus-per-task=\"$SLURM_CPUS_PER_TASK\" bash -c 'torchrun --nnodes=\"$SLURM_JOB_NUM_NODES\" "
            f"--nproc-per-node=2 --rdzv-backend=c10d --rdzv-endpoint={endpoint} --rdzv-id=\"$SLURM_JOB_ID\" "
            "-m workshop_utils.train \"$@\"' torchrun \"$@\" &\n")


SIMULATED = {  # the rows whose simulated job runs in make test: a sample of each kind (WORKSHOP_EVERY_ROW=1 runs all)
    "test_right_answers_pass[a function srun that passes on to command srun]", "test_right_answers_pass[wait $! twice]",
    "test_what_running_the_script_shows_right[PyTorch's own Slurm example]",
    *(f"test_wrong_answers_are_named[{name}]" for name in (
        "OMP_NUM_THREADS=2 in front of srun", "shift before the launch",
        "$SLURMD_NODENAME inside bash -c")),
    *(f"test_what_running_the_script_shows_wrong[{name}]" for name in (
        "command srun past a function srun", "$SLURM_ARRAY_TASK_ID in the port")),
}


@pytest.fixture(autouse=True)
def no_slurm(monkeypatch):
    monkeypatch.setenv("WORKSHOP_SLURM", "off")
    monkeypatch.setattr(se, "submit", lambda *a, **k: pytest.fail("a check submitted a job in a text-only test"))


def launch_as(text: str) -> str:
    return TEMPLATE.replace(LAUNCH, text)


RIGHT = {
    "a function given x and the flags shifts x away": launch_as('run() {\nshift\n' + BARE + '\n}\nrun x "$@" &\n'),
    "a shift only for a --debug flag": launch_as('if [ "${1:-}" = "--debug" ]; then shift; fi\n' + LAUNCH),
    "set -a exports the endpoint for bash -c": launch_as("set -a\n" + EXPORTED.replace("export ", "") + "set +a\n"
                                                         + through_bash_c()),
    "the launch in the arm that matches first": launch_as("case x in\n  x) " + BARE + " & ;;\n  *) : ;;\nesac\n"),
    "an arm after ;;& is still tested": launch_as("case x in\n  *) : ;;&\n  x) " + BARE + " & ;;\nesac\n"),
    "a loop over two words that launches nothing": launch_as("for i in 1 2; do echo $i; done\n" + LAUNCH),
    "while ! wait with no operand": TEMPLATE.replace(WAIT, "while ! wait; do :; done"),
    "until wait with no operand": TEMPLATE.replace(WAIT, "until wait; do :; done"),
    "env OMP_NUM_THREADS=1 on the launch": TEMPLATE.replace(STEP, STEP.replace("torchrun",
                                                                               "env OMP_NUM_THREADS=1 torchrun")),
    "an alias srun while scripts expand none": TEMPLATE.replace("set -uo pipefail\n",
                                                                "set -uo pipefail\nalias srun='echo srun'\n"),
    "a function torchrun, which srun does not run": TEMPLATE.replace("set -uo pipefail\n",
                                                                      "set -uo pipefail\ntorchrun() { :; }\n"),
    # The eighth review's right answers
    "set -uo allexport exports the endpoint": launch_as("set -uo allexport\n" + EXPORTED.replace("export ", "")
                                                         + through_bash_c()),
    "unalias srun": TEMPLATE.replace("set -uo pipefail\n", "set -uo pipefail\nshopt -s expand_aliases\n"
                                     "alias srun=echo\nunalias srun\n"),
    "a function srun that passes on to command srun": TEMPLATE.replace(
        "set -uo pipefail\n", 'set -uo pipefail\nsrun() { command srun "$@"; }\n'),
    "env -u FOO srun": TEMPLATE.replace(STEP, "env -u FOO " + STEP),
    "chrt -o 0 srun": TEMPLATE.replace(STEP, "chrt -o 0 " + STEP),
    "taskset -c 0,1 srun": TEMPLATE.replace(STEP, "taskset -c 0,1 " + STEP),
    "a dash in an echo string": TEMPLATE.replace("trap forward USR1\n",
                                                 'trap forward USR1\necho "starting \u2013\u2013nproc-per-node=2"\n'),
    "a dash in a trailing comment": TEMPLATE.replace('-m workshop_utils.train "$@" &',
                                                     '-m workshop_utils.train "$@" &  # \u2013\u2013x'),
    # Refused as "ended after the second warning": the simulation sent the warning twice; Slurm sends it once
    # (slurmctld marks the job WARN_SENT), and the second wait waits for the launch to end.
    "wait $! twice": TEMPLATE.replace(WAIT, "wait $!\nwait $!"),
}


@pytest.mark.parametrize("text", RIGHT.values(), ids=RIGHT.keys())
def test_right_answers_pass(text, capsys):
    assert wu.check_job_script(text)
    assert "✓ Exercise 6.1: correct" in capsys.readouterr().out


WRONG = {
    "kill with an en dash and a digit": (TEMPLATE.replace("kill -0", "kill \u20130"), ["U+2013"]),
    "a soft hyphen in an option": (TEMPLATE.replace("--nproc-per-node", "\u00ad\u00adnproc-per-node"),
                                   ["U+00AD", "invisible soft hyphen"]),
    "the launch to /dev/null": (launch_as(BARE + " >/dev/null &\n"),
                                ["never reached the job's log", "stdout is /dev/null"]),
    "the launch &>/dev/null": (launch_as(BARE + " &>/dev/null &\n"), ["/dev/null"]),
    "srun --output=/dev/null": (launch_as(BARE.replace("srun ", "srun --output=/dev/null ", 1) + " &\n"),
                                ["/dev/null"]),
    "exec 1>&- closes the log": (launch_as("exec 1>&-\n" + LAUNCH), ["exec", "closed"]),
    "a launch function called >/dev/null": (launch_as("run() {\n" + BARE + '\n}\nrun "$@" >/dev/null &\n'),
                                            ["/dev/null"]),
    "shift before the launch": (launch_as("shift\n" + LAUNCH), ["without --device", "shift"]),
    "set -- before the launch": (launch_as("set --\n" + LAUNCH), ["got none of the script's arguments", "set --"]),
    "shift in the launch function": (launch_as('run() {\nshift\n' + BARE + '\n}\nrun "$@" &\n'),
                                     ["without --device"]),
    "an arm after *) that takes the word": (launch_as("case x in\n  *) : ;;\n  x) " + BARE + " & ;;\nesac\n"),
                                            ["never got to run a launch"]),
    "an arm after *) of any word": (launch_as('case "${1:-}" in\n  *) : ;;\n  x) ' + BARE + " & ;;\nesac\n"),
                                    ["never got to run a launch"]),
    "a launch in a loop over two words": (launch_as("for i in 1 2; do\n" + BARE + " &\ndone\n"),
                                          ["started torchrun 2 times", "one agent per node"]),
    "OMP_NUM_THREADS=2 in front of srun": (TEMPLATE.replace(STEP, "OMP_NUM_THREADS=2 " + STEP),
                                           ["OMP_NUM_THREADS=2 for 2 training processes"]),
    "env OMP_NUM_THREADS=2 torchrun": (TEMPLATE.replace(STEP, STEP.replace("torchrun",
                                                                          "env OMP_NUM_THREADS=2 torchrun")),
                                       ["OMP_NUM_THREADS=2"]),
    "srun --export=ALL,OMP_NUM_THREADS=2": (TEMPLATE.replace(STEP, STEP.replace(
        "srun ", "srun --export=ALL,OMP_NUM_THREADS=2 ")), ["OMP_NUM_THREADS=2"]),
    "OMP_NUM_THREADS=2,1": (TEMPLATE.replace("OMP_NUM_THREADS=1", "OMP_NUM_THREADS=2,1"), ["OMP_NUM_THREADS=2,1"]),
    "OMP_NUM_THREADS=0": (TEMPLATE.replace("OMP_NUM_THREADS=1", "OMP_NUM_THREADS=0"),
                          ["OMP_NUM_THREADS=0 for 2 training processes"]),
    "OMP_NUM_THREADS=2 on four cores": (wu.fill_job_script({**SOLVED, "cpus_per_task": 4}).replace(
        "OMP_NUM_THREADS=1", "OMP_NUM_THREADS=2"), ["OMP_NUM_THREADS=2 for 2 training processes on 4 core(s)"]),
    # EP is no longer exported: the bash that srun starts sees it empty, and torchrun meets at its default
    "export -n before bash -c": (launch_as(EXPORTED + "export -n EP\n" + through_bash_c()), ["localhost:29400"]),
    "declare +x before bash -c": (launch_as(EXPORTED + "declare +x EP\n" + through_bash_c()), ["localhost:29400"]),
    "$SLURMD_NODENAME inside bash -c": (launch_as(through_bash_c('"$SLURMD_NODENAME:29500"')),
                                        ["never completed the rendezvous", "gpu-a018 at gpu-a018:29500"]),
    "$HOSTNAME inside bash -c": (launch_as(through_bash_c('"$HOSTNAME:29500"')),
                                 ["[login01]", "Name or service not known"]),
    # the batch shell expands the double-quoted text, which leaves torchrun its default of one process
    "bash -c in double quotes": (launch_as(EXPORTED + 'srun bash -c "torchrun --nnodes=$SLURM_JOB_NUM_NODES '
                                           '-m workshop_utils.train" torchrun "$@" &\n'),
                                 ["torchrun started 1 training process", "not the 2"]),
    "set -Ee then false": (launch_as("set -Ee\nfalse\n" + LAUNCH), ["never got to run a launch"]),
    "set -e then command false": (launch_as("set -e\ncommand false\n" + LAUNCH), ["never got to run a launch"]),
    "set -e then /bin/false": (launch_as("set -e\n/bin/false\n" + LAUNCH), ["never got to run a launch"]),
    "builtin srun": (TEMPLATE.replace(STEP, "builtin " + STEP), ["srun: not a shell builtin"]),
    "a function named wait": (TEMPLATE.replace("trap forward USR1\n", "trap forward USR1\nwait() { :; }\n"),
                              ["before the warning came"]),  # the loop's wait is the function: it returns at once
    "timeout in front of srun": (TEMPLATE.replace(STEP, "timeout 60 " + STEP), ["timeout", "clock of its own"]),
    "a function srun": (TEMPLATE.replace("set -uo pipefail\n", "set -uo pipefail\nsrun() { echo hi; }\n"),
                        ["nothing started torchrun"]),
    "an alias srun with expand_aliases": (TEMPLATE.replace("set -uo pipefail\n", "set -uo pipefail\nshopt -s "
                                                           "expand_aliases\nalias srun='echo srun'\n"),
                                          ["nothing started torchrun"]),
}


def test_6_3_a_memory_request_in_another_unit_is_refused_by_its_value():
    usage = {"job": "2", "elapsed_s": 15, "time_limit_s": 600, "cpus": 1, "gpus": 0, "cpu_time_s": 4.65,
             "max_rss_mib": 832.34375, "source": "a test"}
    from test_slurm_exercise_answers import refused as refused_by

    for other, words in ((1100 / 1024, ["= 1.074:", "whole 100 MiB"]),
                         (1100 * 2**20 / 1e6, ["= 1,153:", "whole 100 MiB"]),
                         (1100 * 2**20 / 1e9, ["= 1.153:", "whole 100 MiB"]),
                         (1100 * 1024, ["= 1,126,400 is not right"]), (1100 * 2**20, ["= 1,153,433,600 is not right"])):
        refused_by(lambda other=other: wu.check_job_usage(0.31, 0.025, 0.0, 60, other, usage), *words)


def test_6_3_a_request_not_whole_is_shown_as_given():
    """It was "`next_memory_mib` = 1,100: the request is in whole 100 MiB": the line's rounding showed a whole
    request, so the refusal read as false."""
    usage = {"job": "2", "elapsed_s": 15, "time_limit_s": 600, "cpus": 1, "gpus": 0, "cpu_time_s": 4.65,
             "max_rss_mib": 832.34375, "source": "a test"}
    from test_slurm_exercise_answers import refused as refused_by

    refused_by(lambda: wu.check_job_usage(0.31, 0.025, 0.0, 60, 1100.0000001, usage, cell=""),
               "whole 100 MiB, and 1100.0000001 (as given) is not")
    refused_by(lambda: wu.check_job_usage(0.31, 0.025, 0.0, 60.5, 1100, usage, cell=""), "= 60.5:", "whole minutes")


@pytest.mark.parametrize("key", ["max_rss_mib", "cpus"])
def test_6_3_a_usage_without_a_key_says_it_is_missing(key):
    """It said "usage['max_rss_mib'] is None" of a dict that has no such key."""
    usage = {"job": "2", "elapsed_s": 15, "time_limit_s": 600, "cpus": 1, "gpus": 0, "cpu_time_s": 4.65,
             "max_rss_mib": 832.34375, "source": "a test"}
    del usage[key]
    with pytest.raises(wu.WorkshopError) as caught:
        wu.check_job_usage(0.31, 0.025, 0.0, 60, 1100, usage, cell="")
    assert f"usage has no {key!r}" in str(caught.value) and "None" not in str(caught.value), caught.value


def test_6_3_names_only_the_count_this_job_cannot_show(capsys):
    usage = {"job": "2", "elapsed_s": 100, "time_limit_s": 300, "cpus": 2, "gpus": 0, "cpu_time_s": 150,
             "max_rss_mib": 1000, "source": "a test"}
    assert wu.check_job_usage(0.75, 1 / 3, 0.0, 180, 1300, usage, cell="")
    said = capsys.readouterr().out
    assert "0 GPUs cannot show a missing x gpus" in said and "CPU cannot show" not in said, said


@pytest.mark.parametrize("text, words", WRONG.values(), ids=WRONG.keys())
def test_wrong_answers_are_named(text, words):
    refused(text, *words)


# ---------------------------------------------------------------- what running the script shows
#
# The check once read the script with a reader of bash written for it; bash now runs it in a simulated job. These
# rows changed their verdict with that, each for the reason given beside it (and where the run cannot show what
# a reader could, the row says it is the simulation's limit).

PYTORCH_SLURM_EXAMPLE = (  # pytorch/examples, distributed/ddp-tutorial-series/slurm/sbatch_run.sh, its lines
    "nodes=( $( scontrol show hostnames $SLURM_JOB_NODELIST ) )\nnodes_array=($nodes)\nhead_node=${nodes_array[0]}\n"
    'head_node_ip=$(srun --nodes=1 --ntasks=1 -w "$head_node" hostname --ip-address)\n')
BY_RUNNING_RIGHT = {
    # Refused as "the check cannot follow a value set that way": bash passes EP to the bash that srun starts.
    "the endpoint set in front of srun for bash -c": launch_as(EXPORTED.replace("export ", "").strip() + " "
                                                               + through_bash_c()),
    # Refused as "not a number bash reads": bash reads ${SLURM_JOB_ID:-0} in arithmetic.
    "${SLURM_JOB_ID:-0} in the port": TEMPLATE.replace("$((29500 + SLURM_JOB_ID % 1000))",
                                                       "$((29500 + ${SLURM_JOB_ID:-0} % 1000))"),
    # Refused with "nothing sets $nodes": $nodes is the array's first element, and the step that runs hostname on
    # the first node gives its address.
    "PyTorch's own Slurm example": TEMPLATE.replace(LAUNCH, PYTORCH_SLURM_EXAMPLE + LAUNCH).replace(
        SOLVED["rdzv_endpoint"], '"$head_node_ip:29500"'),
    # The simulation's limit: its nodes share one PID namespace, so pkill --ns with the batch shell's pid finds the
    # training on every node; on a cluster that pid means nothing on the other nodes (the reader refused it).
    "pkill --ns $$, a limit of the simulation": TEMPLATE.replace("pkill -USR1", "pkill -USR1 --ns $$"),
}


@pytest.mark.parametrize("text", BY_RUNNING_RIGHT.values(), ids=BY_RUNNING_RIGHT.keys())
def test_what_running_the_script_shows_right(text, capsys):
    assert wu.check_job_script(text)


BY_RUNNING_WRONG = {
    # Passed by the reader, which looked at the launch only: forward() calls plain srun, the no-op function.
    "command srun past a function srun": (TEMPLATE.replace("set -uo pipefail\n", "set -uo pipefail\nsrun() { :; }\n")
                                          .replace(STEP, "command " + STEP), ["the trap does nothing"]),
    # Passed by the reader: bash's jobs reports the finished launch and forgets it, so the next wait %1 says "no such
    # job" and the script ends with status 127: Slurm records the job FAILED.
    "while jobs %1; do wait %1": (TEMPLATE.replace(WAIT, "while jobs %1 >/dev/null 2>&1; do wait %1; done"),
                                  ["status 127", "wait: %1: no such job"]),
    # Passed by the reader: the job is no array, so under set -u bash stops the launch line at the unset variable.
    "$SLURM_ARRAY_TASK_ID in the port": (TEMPLATE.replace("$((29500 + SLURM_JOB_ID % 1000))",
                                                          "$((29500 + SLURM_ARRAY_TASK_ID))"),
                                         ["SLURM_ARRAY_TASK_ID: unbound variable"]),
    # Broken #! lines the reader passed (it looked for #! alone): slurmstepd could not start the script.
    "#!/bin/bash#SBATCH": (TEMPLATE.replace("#!/bin/bash\n#SBATCH --job-name", "#!/bin/bash#SBATCH --job-name"),
                           ["names /bin/bash#SBATCH", "no bash"]),
    "#!/bin": (TEMPLATE.replace("#!/bin/bash", "#!/bin"), ["names /bin", "no bash"]),
    "#!/bin/ba%H": (TEMPLATE.replace("#!/bin/bash", "#!/bin/ba%H -x"), ["names /bin/ba%H", "no bash"]),
    # The simulation's limit: a run sees the files of the machine it runs on, where /scratch/nowhere is not (the
    # reader left the test to the cluster and passed the script).
    "a file test, a limit of the simulation": (TEMPLATE.replace(LAUNCH, "if [ -d /scratch/nowhere ]; then\n" + BARE
                                                                + " &\nfi\n"), ["never got to run a launch"]),
}


@pytest.mark.parametrize("text, words", BY_RUNNING_WRONG.values(), ids=BY_RUNNING_WRONG.keys())
def test_what_running_the_script_shows_wrong(text, words):
    refused(text, *words)
