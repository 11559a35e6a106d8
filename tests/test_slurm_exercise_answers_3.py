"""Notebook 06's Exercise 6.1 check, a third round: what the second review found that bash would not run as the
check read it (a syntax error, ``local`` outside a function, code never reached, a function defined again, a
subshell around the body) and pipelines and wrappers that leave the launch as it was.
"""

from __future__ import annotations

import pytest

import workshop_utils as wu
from workshop_utils.exercises import slurm_exercises as se
from test_slurm_exercise_answers import simulated_sample  # noqa: F401 (the fixture: which rows run their simulation)
from test_slurm_exercise_answers_2 import FIRST, LAUNCH, PKILL, WAIT, host, refused, script

EP_END = '-m workshop_utils.train "$@" &'
FORWARD_LINE = next(line for line in script().splitlines() if line.startswith("forward() {"))
BODY = "forward() {"


SIMULATED = {  # the rows whose simulated job runs in make test: a sample of each kind (WORKSHOP_EVERY_ROW=1 runs all)
    *(f"test_right_answers_pass[{name}]" for name in ("set -e with the template", "bash -c exec torchrun $@")),
    *(f"test_wrong_answers_are_named[{name}]" for name in (
        "a wait loop that never ends", "pkill python by name", "timeout 50m torchrun",
        "a background job after the launch", "torchrun --rdzv-conf=join_timeout=1", "srun --mem=1",
        "exec >/dev/null 2>&1", "bash -c reading a variable not exported", "set -e with a plain wait")),
    "test_a_random_port_is_said_to_be_what_random_drew",
}


@pytest.fixture(autouse=True)
def no_slurm(monkeypatch):
    monkeypatch.setenv("WORKSHOP_SLURM", "off")
    monkeypatch.setattr(se, "submit", lambda *a, **k: pytest.fail("a check submitted a job in a text-only test"))


def around_launch(before: str, after: str):
    return lambda s: s.replace(LAUNCH, before + "\n" + LAUNCH).replace(EP_END, EP_END + "\n" + after)


def body_in(opening: str, closing: str):
    return lambda s: s.replace(BODY, opening + "\n" + BODY) + closing + "\n"


RIGHT = {
    "head then tr -d": host('"$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1 | tr -d \'\\n\'):29500"'),
    "head then cat": host('"$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1 | cat):29500"'),
    "head then xargs": host('"$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1 | xargs):29500"'),
    "local inside a function": host('"$head:29500"', f'first() {{ local h="{FIRST}"; head="$h"; }}\nfirst'),
    "if true around the launch": around_launch("if true; then", "fi"),
    "the launch in an else branch": around_launch("if false; then :; else", "fi"),
    "bash -c exec torchrun $@": lambda s: s.replace(LAUNCH, LAUNCH.replace("torchrun", "bash -c 'exec torchrun \"$@\"' torchrun")),
    "a body in { }": body_in("{", "}"),
    "an exit guarded by if": lambda s: s.replace(LAUNCH, 'if [ -z "${SLURM_JOB_ID:-}" ]; then exit 1; fi\n' + LAUNCH),
    "an exit after ||": lambda s: s.replace(LAUNCH, 'cd "$SLURM_SUBMIT_DIR" || exit 1\n' + LAUNCH),
    "exit after the wait": lambda s: s + "exit 0\n",
    # The third review's right answers
    "function NAME() {": lambda s: s.replace("forward() {", "function forward() {"),
    "srun -n of the job's nodes": lambda s: s.replace(LAUNCH, LAUNCH.replace("srun", 'srun -n "$SLURM_JOB_NUM_NODES"')),
    "srun --ntasks=$SLURM_NNODES": lambda s: s.replace(LAUNCH, LAUNCH.replace("srun", 'srun --ntasks="$SLURM_NNODES"')),
    "--node-rank=$SLURM_NODEID": lambda s: s.replace('--rdzv-id="$SLURM_JOB_ID"',
                                                     '--rdzv-id="$SLURM_JOB_ID" --node-rank="$SLURM_NODEID"'),
    "nice -n 5 torchrun": lambda s: s.replace(LAUNCH, LAUNCH.replace("torchrun", "nice -n 5 torchrun")),
    "stdbuf -oL torchrun": lambda s: s.replace(LAUNCH, LAUNCH.replace("torchrun", "stdbuf -oL torchrun")),
    "if [ 1 -eq 1 ] around the launch": around_launch("if [ 1 -eq 1 ]; then", "fi"),
    "set -e with the template": lambda s: s.replace("set -uo pipefail", "set -euo pipefail"),
    "pid=$! and wait $pid": lambda s: s.replace(WAIT, 'pid=$!\nwhile ! wait "$pid"; do kill -0 "$pid" 2>/dev/null || break; done'),
    "a long --rdzv-conf timeout": lambda s: s.replace("--rdzv-backend=c10d", "--rdzv-backend=c10d --rdzv-conf=join_timeout=900"),
    "#!/usr/bin/env bash": lambda s: s.replace("#!/bin/bash", "#!/usr/bin/env bash"),
    # The fourth review's right answers
    "cd || { echo; exit 1; }": lambda s: s.replace(LAUNCH, 'cd "$SLURM_SUBMIT_DIR" || { echo "cannot cd" >&2; exit 1; }\n'
                                                  + LAUNCH),
    "[ -z ] && { echo; exit 1; }": lambda s: s.replace(LAUNCH, '[ -z "${SLURM_JOB_ID:-}" ] && { echo use sbatch; exit 1; }\n'
                                                      + LAUNCH),
    "until wait; rc; test": lambda s: s.replace(WAIT, 'pid=$!\nuntil wait "$pid"; rc=$?; [ "$rc" -le 128 ]; do :; done'),
    "while wait; test -gt 128": lambda s: s.replace(WAIT, "pid=$!\nwhile wait $pid; [ $? -gt 128 ]; do :; done"),
    "while true with wait && break": lambda s: s.replace(
        WAIT, "pid=$!\nwhile true; do wait $pid && break; kill -0 $pid 2>/dev/null || break; done"),
    "srun -N $SLURM_NNODES in forward": lambda s: s.replace("srun --overlap --ntasks-per-node=1 ",
                                                            'srun --overlap -N "$SLURM_NNODES" --ntasks-per-node=1 '),
    "setsid srun": lambda s: s.replace(LAUNCH, "setsid " + LAUNCH),
    # The fifth review's right answers
    "an exit in a case arm": lambda s: s.replace("set -uo pipefail\n", 'set -uo pipefail\ncase "${1:-}" in\n'
                                                 '  -h|--help) echo usage; exit 0 ;;\nesac\n'),
    "| tee train.log &": lambda s: s.replace('"$@" &', '"$@" 2>&1 | tee train.log &'),
    "set -e then set +e then false": lambda s: s.replace(LAUNCH, "set -e\nset +e\nfalse\n" + LAUNCH),
    "set -e then ! false": lambda s: s.replace(LAUNCH, "set -e\n! false\n" + LAUNCH),
    "apptainer exec": lambda s: s.replace(LAUNCH, LAUNCH.replace("torchrun", "apptainer exec img.sif torchrun")),
    "/usr/bin/time -v": lambda s: s.replace(LAUNCH, LAUNCH.replace("torchrun", "/usr/bin/time -v torchrun")),
    "a launch function called with $@": lambda s: s.replace(LAUNCH, "launch() {\n" + LAUNCH).replace(
        EP_END, EP_END + "\n}\nlaunch \"$@\""),
    "#SBATCH --mem=4G": lambda s: s.replace("#SBATCH --output", "#SBATCH --mem=4G\n#SBATCH --output"),
    # The sixth review's right answers
    "$(which torchrun)": lambda s: s.replace(LAUNCH, LAUNCH.replace("torchrun", '"$(which torchrun)"')),
    "$(command -v torchrun)": lambda s: s.replace(LAUNCH, LAUNCH.replace("torchrun", "`command -v torchrun`")),
    "bash -c with --node-rank=$SLURM_NODEID": lambda s: s.replace(LAUNCH, LAUNCH.replace(
        "torchrun", "bash -c 'exec torchrun --node-rank=\"$SLURM_NODEID\" \"$@\"' torchrun")),
    "bash -c reading an exported variable": lambda s: s.replace(LAUNCH, "export RESTARTS=3\n" + LAUNCH.replace(
        "torchrun", "bash -c 'exec torchrun --max-restarts=${RESTARTS} \"$@\"' torchrun")),
    "a case arm that matches": around_launch("case x in\n  x)", ";;\nesac"),
    "trap \"$NAME\" of a set name": lambda s: s.replace("trap forward USR1", 'handler=forward\ntrap "$handler" USR1'),
    "exec 2>&1 to the job's log": lambda s: s.replace(LAUNCH, "exec 2>&1\n" + LAUNCH),
    "a launch function given the options": lambda s: s.replace(
        LAUNCH, 'launch() { srun --cpus-per-task="$SLURM_CPUS_PER_TASK" torchrun "$@"; }\nlaunch'),
    "until wait": lambda s: s.replace(WAIT, "until wait $!; do kill -0 $! 2>/dev/null || break; done"),
    "a dash in a comment": lambda s: s.replace("set -uo pipefail", "# one node \u2014 two processes\nset -uo pipefail"),
}


@pytest.mark.parametrize("edit", RIGHT.values(), ids=RIGHT.keys())
def test_right_answers_pass(edit):
    text = edit(script())
    assert text != script()
    assert wu.check_job_script(text) is True, se.script_problem(text)


WRONG = {
    "donex": (lambda s: s.replace("|| break; done", "|| break; donex"), ["syntax error", "bash -n"]),
    "an unclosed quote": (lambda s: s.replace('"python[0-9.]*', 'python[0-9.]*'), ["matching", "bash -n", "line 1"]),
    "local outside a function": (host('"$head:29500"', f'local head="{FIRST}"'),
                                 ["local: can only be used in a function"]),
    "exit before the launch": (lambda s: s.replace(LAUNCH, "exit 0\n" + LAUNCH), ["never got to run a launch"]),
    "if false around the launch": (around_launch("if false; then", "fi"), ["never got to run a launch"]),
    "while false around the launch": (around_launch("while false; do", "done"), ["never got to run a launch"]),
    # the trap and the wait are the subshell's, which the batch shell waits for in the foreground
    "the body in a subshell": (body_in("(", ")"), ["ended the batch shell", "nothing in the script traps it"]),
    "head then tr -d of a letter": (host('"$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1 | tr -d a):29500"'),
                                    ["[gpu-017]", "Name or service not known"]),
    # bash -c takes the first word after its command string as $0: --nnodes never reaches torchrun
    "bash -c without $0": (lambda s: s.replace(LAUNCH, LAUNCH.replace("torchrun", "bash -c 'exec torchrun \"$@\"'")),
                           ["--nnodes 1,", "left out of the rendezvous"]),
    # The third review's wrong answers: launches never reached
    **{f"never reached: {name}": (lambda s, line=line: s.replace(LAUNCH, line + "\n" + LAUNCH),
                                  ["never got to run a launch"])
       for name, line in {"if true; then exit": "if true; then exit 0; fi", "true && exit": "true && exit",
                          "[ -n x ] && exit": '[ -n "x" ] && exit 0', "a function that exits": "bye() { exit 0; }\nbye",
                          "exec sleep": "exec sleep 1", "set -e; false": "set -e\nfalse"}.items()},
    "return at the top level || exit": (lambda s: s.replace(LAUNCH, "return 0 2>/dev/null || exit 0\n" + LAUNCH),
                                         ["never got to run a launch"]),
    "kill $$": (lambda s: s.replace(LAUNCH, "kill $$\n" + LAUNCH), ["killed by SIGTERM", "never got to run a launch"]),
    "false && the launch": (lambda s: s.replace(LAUNCH, "false && " + LAUNCH), ["never got to run a launch"]),
    "true || the launch": (lambda s: s.replace(LAUNCH, "true || " + LAUNCH), ["never got to run a launch"]),
    "if [ 1 -eq 0 ]": (around_launch("if [ 1 -eq 0 ]; then", "fi"), ["never got to run a launch"]),
    # wait loops
    "wait for a variable never set": (lambda s: s.replace(WAIT, 'pid=$!\nwhile ! wait "$pdi"; do kill -0 "$pid" || break; done'),
                                      ["pdi: unbound variable"]),
    "the wait loop in the background": (lambda s: s.replace(WAIT, WAIT + " &"), ["before the warning came"]),
    "a wait loop that never ends": (lambda s: s.replace(WAIT, "while ! wait $!; do :; done"),
                                    ["when training fails", "never ends"]),
    # pkill that misses the training
    "pkill -v": (lambda s: s.replace("pkill -USR1", "pkill -USR1 -v"), ["-v", "Jupyter kernel"]),
    "pkill -n": (lambda s: s.replace("pkill -USR1", "pkill -USR1 -n"), ["reached 1 of 2", "pkill -USR1 -n"]),
    **{f"pkill {option}": (lambda s, option=option: s.replace("pkill -USR1", f"pkill -USR1 {option}"),
                           ["reached 0 of 2", option.split()[0]])
       for option in ("-P $$", "-t pts/0", "-g 0", "--older 100000", "-r T")},
    "a pattern read as options": (lambda s: s.replace('"python[0-9.]* -u -m', '"-u -m'),
                                  ["reached 0 of 2", "pkill: invalid user name"]),
    # the processes are python3.11 on the second run's cluster
    "python3 alone": (lambda s: s.replace('"python[0-9.]* -u -m', '"python3 -u -m'),
                      ["reached 0 of 4", "python3.11 -u -m workshop_utils.train"]),
    "unset -f forward": (lambda s: s.replace("trap forward USR1", "trap forward USR1\nunset -f forward"),
                         ["command not found"]),
    # srun and torchrun options that break the launch
    **{f"srun {option}": (lambda s, option=option: s.replace(LAUNCH, LAUNCH.replace("srun", f"srun {option}")), words)
       for option, words in {"-n1": ["srun -n1", "none on gpu-a018"], "--ntasks=1": ["none on gpu-a018"],
                             # both tasks (SLURM_NTASKS=2) on the named node, which has cores for one
                             '--nodelist="$SLURMD_NODENAME"': ["--nodelist=gpu-a017", "More processors requested"],
                             "--test-only": ["--test-only", "to start at"],
                             "--multi-prog": ["configuration file"],
                             "--export=NONE": ["--export=NONE", "torchrun: No such file or directory"],
                             "--relative=1": ["--relative"], "--mem=1": ["oom-kill"],
                             "-t 0:10": ["TIME LIMIT", "before the warning came"]}.items()},
    **{f"torchrun {option}": (lambda s, option=option: s.replace('--rdzv-id="$SLURM_JOB_ID"',
                                                                 f'--rdzv-id="$SLURM_JOB_ID" {option}'), words)
       for option, words in {"--no-python": ["--no-python"], "--run-path": ["--run-path"],
                             "--local-addr=127.0.0.1": ["--local-addr=127.0.0.1", "before the warning came"],
                             "--rdzv-conf=is_host=false": ["is_host=false", "Connection refused"],
                             "--rdzv-conf=join_timeout=1": ["join_timeout=1", "RendezvousTimeoutError"]}.items()},
    # #SBATCH lines that break or delay the job
    **{f"#SBATCH --{line}": (lambda s, line=line: s.replace("#SBATCH --output", f"#SBATCH --{line}\n#SBATCH --output"),
                             [f"#SBATCH --{line.split('=')[0]}"])
       for line in ("mem=1", "mem-per-cpu=1", "gres=gpu:1", "begin=now+1day", "dependency=afterok:1", "export=NONE",
                    "time-min=100")},
    "#SBATCH --output=/dev/null": (lambda s: s.replace("--output=%x-%j.out", "--output=/dev/null"), ["log away"]),
    "a message with no encoded bytes": (lambda s: s.replace(LAUNCH, LAUNCH.replace("torchrun", "bash -c 'exec torchrun \"$@\"'")),
                                        ['--nnodes="$SLURM_JOB_NUM_NODES"']),
    "#!/bin/zsh": (lambda s: s.replace("#!/bin/bash", "#!/bin/zsh"), ["names /bin/zsh", "no bash"]),
    "#!/usr/bin/env zsh": (lambda s: s.replace("#!/bin/bash", "#!/usr/bin/env zsh"), ["names zsh", "no bash"]),
    # The fourth review's wrong answers
    "a trap that exits": (lambda s: s.replace("trap forward USR1", "trap 'forward; exit 0' USR1"),
                          ["ended after the warning", "checkpoint"]),
    "forward that exits": (lambda s: s.replace("|| true; }", "|| true; exit 0; }"), ["ended after the warning", "checkpoint"]),
    "a background job after the launch": (lambda s: s.replace(EP_END + "\n", EP_END + "\n(while sleep 30; do date; done) &\n"),
                                          ["wait loop never ends", "was running: /bin/bash job.sbatch"]),
    # $! is forward's srun once the trap has run: the loop stops waiting for the launch
    "& inside forward": (lambda s: s.replace("|| true; }", "|| true & }"), ["ended after the warning"]),
    "srun --signal on the launch": (lambda s: s.replace(LAUNCH, LAUNCH.replace("srun", "srun --signal=USR1@60")),
                                    ["srun --signal=USR1@60", "reached torchrun itself"]),
    "forward defined after the wait": (lambda s: s.replace(FORWARD_LINE + "\n", "").replace(WAIT, WAIT + "\n" + FORWARD_LINE),
                                       ["forward: command not found"]),
    "an unset variable in the loop's body": (lambda s: s.replace(WAIT, 'pid=$!\nwhile ! wait $pid; do kill -0 $pdi 2>/dev/null || break; done'),
                                             ["pdi: unbound variable"]),
    "a launch function called without $@": (lambda s: s.replace(LAUNCH, "launch() {\n" + LAUNCH).replace(
        EP_END, EP_END + "\n}\nlaunch"), ["got none of the script's arguments"]),
    "kill -USR1 -1": (lambda s: s.replace(PKILL, "kill -USR1 -1"), ["Jupyter kernel"]),  # every process of the node
    "killall python3": (lambda s: s.replace(PKILL, "killall -USR1 python3"), ["Jupyter kernel"]),  # python3 too
    "pkill -U root": (lambda s: s.replace("pkill -USR1", "pkill -USR1 -U root"), ["reached 0 of 2", "root"]),
    "pkill --cgroup": (lambda s: s.replace("pkill -USR1", "pkill -USR1 --cgroup /x"), ["reached 0 of 2", "--cgroup"]),
    "#SBATCH --deadline": (lambda s: s.replace("#SBATCH --output", "#SBATCH --deadline=now+1minute\n#SBATCH --output"),
                           ["--deadline"]),
    "#!/bin/bash -e and false": (lambda s: s.replace("#!/bin/bash", "#!/bin/bash -e").replace(LAUNCH, "false\n" + LAUNCH),
                                 ["never got to run a launch"]),
    "a function that exits through another": (lambda s: s.replace(LAUNCH, "g() { exit 1; }\nf() { g; }\nf\n" + LAUNCH),
                                              ["never got to run a launch"]),
    "a lone surrogate": (lambda s: s.replace("ex61-train", "ex61-train\ud800"), ["U+D800"]),
    # The fifth review's wrong answers
    **{f"a loop that never ends: {loop}": (lambda s, loop=loop: s.replace(WAIT, loop), ["never ends"])
       for loop in ("while true; do wait; done", "while true; do wait $!; done", "while :; do wait $!; sleep 1; done",
                    "pid=$!\nwhile true; do wait $pid || continue; done")},
    "set -e with a plain wait": (lambda s: s.replace("set -uo pipefail", "set -euo pipefail").replace(
        WAIT, "pid=$!\nwait $pid\nwhile kill -0 $pid 2>/dev/null; do wait $pid; done"),
        ["ended after the warning, with status 138"]),
    "timeout 50m torchrun": (lambda s: s.replace(LAUNCH, LAUNCH.replace("torchrun", "timeout 50m torchrun")),
                             ["timeout", "clock of its own"]),
    "timeout -s USR1 100": (lambda s: s.replace(LAUNCH, LAUNCH.replace("torchrun", "timeout -s USR1 100 torchrun")),
                            ["timeout"]),
    "pkill python by name": (lambda s: s.replace('-f "python[0-9.]* -u -m workshop_utils.train"', "python"),
                             ["reached a Jupyter kernel", "`pkill -USR1 python`"]),
    "pkill -s": (lambda s: s.replace(PKILL, PKILL.replace("-USR1", "-s USR1")), ["invalid session id"]),
    "forward defined again as a no-op": (lambda s: s.replace("trap forward USR1", "trap forward USR1\nforward() { :; }"),
                                         ["after the warning nothing in the job ran", "the trap does nothing"]),
    "--rdzv_conf=x": (lambda s: s.replace("--rdzv-backend=c10d", "--rdzv-backend=c10d --rdzv_conf=x"),
                      ["rendezvous configuration option 'x'"]),
    # The sixth review's wrong answers
    "exec >/dev/null 2>&1": (lambda s: s.replace(LAUNCH, "exec > /dev/null 2>&1\n" + LAUNCH),
                             ["never reached the job's log", "stdout is /dev/null"]),
    "exec 2>/dev/null": (lambda s: s.replace(LAUNCH, "exec 2>/dev/null\n" + LAUNCH), ["/dev/null"]),
    "a case arm that never matches": (around_launch("case x in\n  y|z)", ";;\nesac"), ["never got to run a launch"]),
    "for i in ; do": (around_launch("for i in ; do", "done"), ["never got to run a launch"]),
    # double quotes expand $! where the trap is set, before any job: set -u stops the script there
    'trap "kill -USR1 $!" before the launch': (lambda s: s.replace("trap forward USR1", 'trap "kill -USR1 $!" USR1'),
                                               ["$!: unbound variable"]),
    # $! is srun's: srun passes the signal to every process of its step, torchrun among them
    'trap "kill -USR1 $!" after the launch': (lambda s: s.replace("trap forward USR1\n", "").replace(
        EP_END, EP_END + '\ntrap "kill -USR1 $!" USR1'), ["reached torchrun itself"]),
    # R is not exported: the bash that srun starts sees it empty, and torchrun refuses --max-restarts=
    "bash -c reading a variable not exported": (lambda s: s.replace(LAUNCH, "R=3\n" + LAUNCH.replace(
        "torchrun", "bash -c 'exec torchrun --max-restarts=$R \"$@\"' torchrun")), ["--max-restarts", "invalid int value"]),
    "while wait $!": (lambda s: s.replace(WAIT, "while wait $!; do kill -0 $! 2>/dev/null || break; done"),
                      ["ended after the warning"]),  # wait's 138 ends the loop, and the script with status 0
    "until ! wait $!": (lambda s: s.replace(WAIT, "until ! wait $!; do kill -0 $! 2>/dev/null || break; done"),
                        ["ended after the warning"]),
    "a launch function given one process": (lambda s: s.replace(
        LAUNCH, 'launch() { srun --cpus-per-task="$SLURM_CPUS_PER_TASK" torchrun "$@"; }\nlaunch').replace(
        "--nproc-per-node=2", "--nproc-per-node=1"), ["--nproc-per-node=1"]),
    "en dashes": (lambda s: s.replace("--nproc-per-node", "\u2013\u2013nproc-per-node"), ["U+2013", "hyphen"]),
    "an em dash in #SBATCH": (lambda s: s.replace("#SBATCH --time", "#SBATCH \u2014time"), ["line 6", "U+2014"]),
    "OMP_NUM_THREADS=2": (lambda s: s.replace("OMP_NUM_THREADS=1", "OMP_NUM_THREADS=2"),
                          ["OMP_NUM_THREADS=2 for 2 training processes on 2 core(s)", "one core and one thread"]),
    "OMP_NUM_THREADS=$SLURM_CPUS_PER_TASK": (lambda s: s.replace("OMP_NUM_THREADS=1",
                                                                 "OMP_NUM_THREADS=$SLURM_CPUS_PER_TASK"),
                                             ["OMP_NUM_THREADS=2"]),
}


@pytest.mark.parametrize("edit, words", WRONG.values(), ids=WRONG.keys())
def test_wrong_answers_are_named(edit, words):
    text = edit(script())
    assert text != script()
    refused(text, *words)


def test_no_message_shows_the_checks_own_placeholders():
    """Words known only when the job runs are written as bash shows them, never as the check's encoding."""
    for text in (script().replace('--nproc-per-node=2', '--nproc-per-node="$X"'),
                 script().replace(LAUNCH, LAUNCH.replace("torchrun", "bash -c 'exec torchrun \"$@\"'"))):
        message = se.script_problem(text)
        assert message and "\x00" not in message and "\\x00" not in message, message


def test_a_random_port_is_said_to_be_what_random_drew():
    """The run fixes bash's $RANDOM at 846, a port only root may listen on: any job may draw it."""
    message = se.script_problem(host('"$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1):$RANDOM"')(script()))
    assert message and "$RANDOM was 846" in message and "port: 846" in message and "EACCES" in message, message


def test_a_short_warning_is_refused_with_the_least_that_passes():
    from test_slurm_exercise_answers_2 import SOLVED

    assert wu.check_job_script({**SOLVED, "signal": "B:USR1@30"}) is True
    refused(se.fill_job_script({**SOLVED, "signal": "B:USR1@20"}), "20 s of warning", "at least 30 s")
