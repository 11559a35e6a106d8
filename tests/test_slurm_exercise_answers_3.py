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
    "pkill -s": (lambda s: s.replace(PKILL, PKILL.replace("-USR1", "-s USR1")), ["pkill -s", "session"]),
    "forward defined again as a no-op": (lambda s: s.replace("trap forward USR1", "trap forward USR1\nforward() { :; }"),
                                         ["forward", "sends no signal"]),
    "--rdzv_conf=x": (lambda s: s.replace("--rdzv-backend=c10d", "--rdzv-backend=c10d --rdzv_conf=x"),
                      ["--rdzv-conf", "key=value"]),
}


@pytest.mark.parametrize("edit, words", WRONG.values(), ids=WRONG.keys())
def test_wrong_answers_are_named(edit, words):
    text = edit(script())
    assert text != script()
    refused(text, *words)
