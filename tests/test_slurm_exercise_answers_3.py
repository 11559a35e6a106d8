"""Notebook 06's Exercise 6.1 check, a third round: what the second review found that bash would not run as the
check read it (a syntax error, ``local`` outside a function, code never reached, a function defined again, a
subshell around the body) and pipelines and wrappers that leave the launch as it was.
"""

from __future__ import annotations

import pytest

import workshop_utils as wu
from workshop_utils.lessons import slurm_exercises as se
from test_slurm_exercise_answers_2 import FIRST, LAUNCH, PKILL, WAIT, host, refused, script

EP_END = '-m workshop_utils.train "$@" &'
FORWARD_LINE = next(line for line in script().splitlines() if line.startswith("forward() {"))
BODY = "forward() {"


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
    "a file test is the cluster's to decide": around_launch("if [ -d /scratch/nowhere ]; then", "fi"),
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
    "while jobs %1; do wait %1": lambda s: s.replace(WAIT, "while jobs %1 >/dev/null 2>&1; do wait %1; done"),
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
                                 ["local", "can only be used in a function", "outside any function"]),
    "exit before the launch": (lambda s: s.replace(LAUNCH, "exit 0\n" + LAUNCH), ["exit", "never"]),
    "if false around the launch": (around_launch("if false; then", "fi"), ["if false", "never"]),
    "while false around the launch": (around_launch("while false; do", "done"), ["while false", "never"]),
    "the body in a subshell": (body_in("(", ")"), ["subshell", "batch shell"]),
    "head then tr -d of a letter": (host('"$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1 | tr -d a):29500"'),
                                    ["not one name"]),
    "bash -c without $0": (lambda s: s.replace(LAUNCH, LAUNCH.replace("torchrun", "bash -c 'exec torchrun \"$@\"'")),
                           ["$0", "never reaches torchrun"]),
    # The third review's wrong answers: launches never reached
    **{f"never reached: {name}": (lambda s, line=line: s.replace(LAUNCH, line + "\n" + LAUNCH), ["never"])
       for name, line in {"if true; then exit": "if true; then exit 0; fi", "true && exit": "true && exit",
                          "[ -n x ] && exit": '[ -n "x" ] && exit 0', "a function that exits": "bye() { exit 0; }\nbye",
                          "exec sleep": "exec sleep 1", "set -e; false": "set -e\nfalse"}.items()},
    "return at the top level || exit": (lambda s: s.replace(LAUNCH, "return 0 2>/dev/null || exit 0\n" + LAUNCH),
                                         ["exit 0", "never"]),
    "kill $$": (lambda s: s.replace(LAUNCH, "kill $$\n" + LAUNCH), ["kill $$", "never"]),
    "false && the launch": (lambda s: s.replace(LAUNCH, "false && " + LAUNCH), ["false &&", "never"]),
    "true || the launch": (lambda s: s.replace(LAUNCH, "true || " + LAUNCH), ["true ||", "never"]),
    "if [ 1 -eq 0 ]": (around_launch("if [ 1 -eq 0 ]; then", "fi"), ["[ 1 -eq 0 ]", "never"]),
    # wait loops
    "wait for a variable never set": (lambda s: s.replace(WAIT, 'pid=$!\nwhile ! wait "$pdi"; do kill -0 "$pid" || break; done'),
                                      ["$pdi", "never sets"]),
    "the wait loop in the background": (lambda s: s.replace(WAIT, WAIT + " &"), ["in the background"]),
    "a wait loop that never ends": (lambda s: s.replace(WAIT, "while ! wait $!; do :; done"), ["never ends", "127"]),
    # pkill that misses the training
    "pkill -v": (lambda s: s.replace("pkill -USR1", "pkill -USR1 -v"), ["pkill -v", "torchrun"]),
    "pkill -n": (lambda s: s.replace("pkill -USR1", "pkill -USR1 -n"), ["one process per node"]),
    **{f"pkill {option}": (lambda s, option=option: s.replace("pkill -USR1", f"pkill -USR1 {option}"), ["narrows"])
       for option in ("-P $$", "-t pts/0", "-g 0", "--older 100000", "-r T", "--ns $$")},
    "a pattern read as options": (lambda s: s.replace('"python[0-9.]* -u -m', '"-u -m'), ["as its options"]),
    "python3 alone": (lambda s: s.replace('"python[0-9.]* -u -m', '"python3 -u -m'), ["misses", "started as python"]),
    "unset -f forward": (lambda s: s.replace("trap forward USR1", "trap forward USR1\nunset -f forward"),
                         ["command not found"]),
    # srun and torchrun options that break the launch
    **{f"srun {option}": (lambda s, option=option: s.replace(LAUNCH, LAUNCH.replace("srun", f"srun {option}")), words)
       for option, words in {"-n1": ["--ntasks=1", "exactly one"], "--ntasks=1": ["exactly one"],
                             '--nodelist="$SLURMD_NODENAME"': ["--nodelist"], "--test-only": ["nothing runs"],
                             "--multi-prog": ["configuration file"], "--export=NONE": ["not found"],
                             "--relative=1": ["--relative"], "--mem=1": ["memory"], "-t 0:10": ["time limit"]}.items()},
    **{f"torchrun {option}": (lambda s, option=option: s.replace('--rdzv-id="$SLURM_JOB_ID"',
                                                                 f'--rdzv-id="$SLURM_JOB_ID" {option}'), words)
       for option, words in {"--no-python": ["--no-python"], "--run-path": ["--run-path"],
                             "--local-addr=127.0.0.1": ["--local-addr"], "--rdzv-conf=is_host=false": ["is_host"],
                             "--rdzv-conf=join_timeout=1": ["1 s"]}.items()},
    # #SBATCH lines that break or delay the job
    **{f"#SBATCH --{line}": (lambda s, line=line: s.replace("#SBATCH --output", f"#SBATCH --{line}\n#SBATCH --output"),
                             [f"#SBATCH --{line.split('=')[0]}"])
       for line in ("mem=1", "mem-per-cpu=1", "gres=gpu:1", "begin=now+1day", "dependency=afterok:1", "export=NONE",
                    "time-min=100")},
    "#SBATCH --output=/dev/null": (lambda s: s.replace("--output=%x-%j.out", "--output=/dev/null"), ["log away"]),
    "a message with no encoded bytes": (lambda s: s.replace(LAUNCH, LAUNCH.replace("torchrun", "bash -c 'exec torchrun \"$@\"'")),
                                        ["--nnodes=$SLURM_JOB_NUM_NODES"]),
    "#!/bin/zsh": (lambda s: s.replace("#!/bin/bash", "#!/bin/zsh"), ["zsh, not bash"]),
    "#!/usr/bin/env zsh": (lambda s: s.replace("#!/bin/bash", "#!/usr/bin/env zsh"), ["zsh, not bash"]),
    # The fourth review's wrong answers
    "a trap that exits": (lambda s: s.replace("trap forward USR1", "trap 'forward; exit 0' USR1"), ["exit", "checkpoint"]),
    "forward that exits": (lambda s: s.replace("|| true; }", "|| true; exit 0; }"), ["exit", "checkpoint"]),
    "a background job after the launch": (lambda s: s.replace(EP_END + "\n", EP_END + "\n(while sleep 30; do date; done) &\n"),
                                          ["$!", "pid=$!"]),
    "& inside forward": (lambda s: s.replace("|| true; }", "|| true & }"), ["$!", "no & inside forward"]),
    "srun --signal on the launch": (lambda s: s.replace(LAUNCH, LAUNCH.replace("srun", "srun --signal=USR1@60")),
                                    ["--signal", "torchrun agents"]),
    "forward defined after the wait": (lambda s: s.replace(FORWARD_LINE + "\n", "").replace(WAIT, WAIT + "\n" + FORWARD_LINE),
                                       ["defined only after the wait loop"]),
    "an unset variable in the loop's body": (lambda s: s.replace(WAIT, 'pid=$!\nwhile ! wait $pid; do kill -0 $pdi 2>/dev/null || break; done'),
                                             ["$pdi", "never sets"]),
    "a launch function called without $@": (lambda s: s.replace(LAUNCH, "launch() {\n" + LAUNCH).replace(
        EP_END, EP_END + "\n}\nlaunch"), ['called without "$@"']),
    "kill -USR1 -1": (lambda s: s.replace(PKILL, "kill -USR1 -1"), ["-1", "every process"]),
    "killall python3": (lambda s: s.replace(PKILL, "killall -USR1 python3"), ["misses", "named python"]),
    "pkill -U root": (lambda s: s.replace("pkill -USR1", "pkill -USR1 -U root"), ["root"]),
    "pkill --cgroup": (lambda s: s.replace("pkill -USR1", "pkill -USR1 --cgroup /x"), ["narrows"]),
    "#SBATCH --deadline": (lambda s: s.replace("#SBATCH --output", "#SBATCH --deadline=now+1minute\n#SBATCH --output"),
                           ["--deadline"]),
    "#!/bin/bash -e and false": (lambda s: s.replace("#!/bin/bash", "#!/bin/bash -e").replace(LAUNCH, "false\n" + LAUNCH),
                                 ["set -e", "never"]),
    "a function that exits through another": (lambda s: s.replace(LAUNCH, "g() { exit 1; }\nf() { g; }\nf\n" + LAUNCH),
                                              ["`f`", "never"]),
    "a lone surrogate": (lambda s: s.replace("ex61-train", "ex61-train\ud800"), ["U+D800"]),
    # The fifth review's wrong answers
    **{f"a loop that never ends: {loop}": (lambda s, loop=loop: s.replace(WAIT, loop), ["never ends"])
       for loop in ("while true; do wait; done", "while true; do wait $!; done", "while :; do wait $!; sleep 1; done",
                    "pid=$!\nwhile true; do wait $pid || continue; done")},
    "set -e with a plain wait": (lambda s: s.replace("set -uo pipefail", "set -euo pipefail").replace(
        WAIT, "pid=$!\nwait $pid\nwhile kill -0 $pid 2>/dev/null; do wait $pid; done"), ["set -e", "138"]),
    "timeout 50m torchrun": (lambda s: s.replace(LAUNCH, LAUNCH.replace("torchrun", "timeout 50m torchrun")),
                             ["timeout", "clock of its own"]),
    "timeout -s USR1 100": (lambda s: s.replace(LAUNCH, LAUNCH.replace("torchrun", "timeout -s USR1 100 torchrun")),
                            ["timeout"]),
    "pkill python by name": (lambda s: s.replace('-f "python[0-9.]* -u -m workshop_utils.train"', "python"),
                             ["every python process", "Jupyter kernel"]),
    "pkill -s": (lambda s: s.replace(PKILL, PKILL.replace("-USR1", "-s USR1")), ["pkill -s", "session"]),
    "forward defined again as a no-op": (lambda s: s.replace("trap forward USR1", "trap forward USR1\nforward() { :; }"),
                                         ["forward", "sends no signal"]),
    "--rdzv_conf=x": (lambda s: s.replace("--rdzv-backend=c10d", "--rdzv-backend=c10d --rdzv_conf=x"),
                      ["--rdzv-conf", "key=value"]),
    # The sixth review's wrong answers
    "exec >/dev/null 2>&1": (lambda s: s.replace(LAUNCH, "exec > /dev/null 2>&1\n" + LAUNCH),
                             ["/dev/null", "job's log away"]),
    "exec 2>/dev/null": (lambda s: s.replace(LAUNCH, "exec 2>/dev/null\n" + LAUNCH), ["/dev/null"]),
    "a case arm that never matches": (around_launch("case x in\n  y|z)", ";;\nesac"),
                                      ["case arm `y|z)`", "never matches", "never runs"]),
    "for i in ; do": (around_launch("for i in ; do", "done"), ["no words", "zero times"]),
    'trap "kill -USR1 $!" before the launch': (lambda s: s.replace("trap forward USR1", 'trap "kill -USR1 $!" USR1'),
                                               ["double quotes", "$! is empty"]),
    'trap "kill -USR1 $!" after the launch': (lambda s: s.replace("trap forward USR1\n", "").replace(
        EP_END, EP_END + '\ntrap "kill -USR1 $!" USR1'), ["kill in the trap runs on the batch node only"]),
    "bash -c reading a variable not exported": (lambda s: s.replace(LAUNCH, "R=3\n" + LAUNCH.replace(
        "torchrun", "bash -c 'exec torchrun --max-restarts=$R \"$@\"' torchrun")), ["$R", "does not export"]),
    "while wait $!": (lambda s: s.replace(WAIT, "while wait $!; do kill -0 $! 2>/dev/null || break; done"),
                      ["`while wait $!` ends the loop when wait fails", "138"]),
    "until ! wait $!": (lambda s: s.replace(WAIT, "until ! wait $!; do kill -0 $! 2>/dev/null || break; done"),
                        ["ends the loop when wait fails"]),
    "a launch function given one process": (lambda s: s.replace(
        LAUNCH, 'launch() { srun --cpus-per-task="$SLURM_CPUS_PER_TASK" torchrun "$@"; }\nlaunch').replace(
        "--nproc-per-node=2", "--nproc-per-node=1"), ["--nproc-per-node=1"]),
    "en dashes": (lambda s: s.replace("--nproc-per-node", "\u2013\u2013nproc-per-node"), ["U+2013", "hyphen"]),
    "an em dash in #SBATCH": (lambda s: s.replace("#SBATCH --time", "#SBATCH \u2014time"), ["line 6", "U+2014"]),
    "OMP_NUM_THREADS=2": (lambda s: s.replace("OMP_NUM_THREADS=1", "OMP_NUM_THREADS=2"),
                          ["OMP_NUM_THREADS=2 for 2 training processes on 2 core(s)", "4 threads"]),
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


def test_a_random_port_is_not_said_to_depend_on_the_job():
    message = se.script_problem(host('"$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1):$RANDOM"')(script()))
    assert message and "can be" in message and "for job" not in message, message


def test_a_short_warning_is_refused_with_the_least_that_passes():
    from test_slurm_exercise_answers_2 import SOLVED

    assert wu.check_job_script({**SOLVED, "signal": "B:USR1@30"}) is True
    refused(se.fill_job_script({**SOLVED, "signal": "B:USR1@20"}), "20 s of warning", "at least 30 s")
