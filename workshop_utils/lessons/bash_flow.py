"""Which top-level commands of a job script bash never reaches, as far as the text alone decides it.

A condition made of constants (``true``, ``false``, ``:``, ``[ 1 -eq 0 ]``) is decided by asking bash; any other
condition may go either way, and what it guards counts as reached. The script ends for good at an ``exit`` (or a
call of a function that exits), an ``exec`` of another program, or a failing constant under ``set -e``, once
nothing conditional stands in front of it.
"""

from __future__ import annotations

import functools
import re
import shutil
import subprocess

from .answer_values import show
from .bash_expansion import basename
from .bash_reader import LEADING, OPENS, Command

# A case is marked by the reader (Command.in_case), not framed here.
_OPENERS = frozenset(OPENS) - {"case"}
_CLOSERS = frozenset(OPENS.values()) - {"esac"}
_CONSTANT = re.compile(r"[^$`<>|;&()\\]*")  # a word with nothing bash would expand or run
_LAUNCHERS = re.compile(r"srun|torchrun|python[0-9.]*")
_PURE_TESTS = frozenset({"-n", "-z", "-eq", "-ne", "-lt", "-le", "-gt", "-ge", "-a", "-o"})  # strings and numbers


@functools.lru_cache(maxsize=256)
def _bash_says(text: str) -> bool | None:
    bash = shutil.which("bash")
    if bash is None:
        return None
    try:
        return subprocess.run([bash, "-c", text], capture_output=True, timeout=5).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return None


def constant(words: list[str]) -> bool | None:
    """Whether the command succeeds, for ``true``, ``false``, ``:`` and tests of constants; None otherwise."""
    negate = words[:1] == ["!"]
    words = words[1:] if negate else words
    words = words[1:] if words[:1] == ["command"] else words  # command false is false
    if words[:1] in (["/bin/false"], ["/usr/bin/false"], ["/bin/true"], ["/usr/bin/true"]):
        words = [basename(words[0]), *words[1:]]
    if not words or words[0] not in ("true", "false", ":", "[", "test", "[[") or \
            not all(_CONSTANT.fullmatch(w) for w in words):
        return None
    if any(re.fullmatch(r"-[a-zA-Z]+", w) and w not in _PURE_TESTS for w in words[1:]):
        return None  # a file, variable or terminal test: this machine's answer is not the cluster's
    said = {"true": True, ":": True, "false": False}.get(words[0]) if len(words) == 1 else _bash_says(" ".join(words))
    return None if said is None else said != negate


def option_after(words: list[str], on: bool, letter: str, name: str) -> bool:
    """Whether a shell option is on after this command: ``set -LETTER``/``-o NAME`` turn it on, ``set +LETTER``/
    ``+o NAME`` off (set -e is errexit, set -a allexport)."""
    if words[:1] != ["set"]:
        return on
    flags = " ".join(words[1:])  # letters bundle (-euo), and a bundle's o takes the next word (-uo allexport)
    if re.search(rf"(^|\s)\+[a-zA-Z]*{letter}|(^|\s)\+[a-zA-Z]*o\s+{name}\b", flags):
        return False
    return on or re.search(rf"(^|\s)-[a-zA-Z]*{letter}|(^|\s)-[a-zA-Z]*o\s+{name}\b", flags) is not None


def errexit_after(words: list[str], errexit: bool) -> bool:
    """Whether set -e is on after this command."""
    return option_after(words, errexit, "e", "errexit")


def _exits(body: list[Command], exiting: set[str]) -> bool:
    """Whether a function's body ends the script every time it is called: an exit (or a call of a function that
    exits) outside any condition."""
    depth, previous = 0, "\n"
    for command in body:
        words, k = command.words, 0
        while k < len(words) and (words[k] in LEADING or words[k] in _OPENERS or words[k] in _CLOSERS):
            depth += (words[k] in _OPENERS) - (words[k] in _CLOSERS)
            k += 1
        if depth <= 1 and (words[k:k + 1] == ["exit"] or words[k:k + 1] and words[k] in exiting) and \
                previous not in ("&&", "||") and not command.where:
            return True
        previous = command.operator
    return False


def _matches(subject: str, patterns: tuple) -> bool | None:
    """Whether a case's word matches one of an arm's patterns: ``*`` matches any word; constants are asked of bash."""
    if "*" in patterns:
        return True
    if not all(_CONSTANT.fullmatch(w) for w in (subject, *patterns)):
        return None
    return _bash_says(f"case {subject} in {'|'.join(patterns)}) exit 0;; esac; exit 1")


def _unmatched_arm(command: Command) -> str | None:
    """Why a command in a case arm never runs: its patterns never match the case's word, or an earlier arm's
    always takes it first."""
    if command.case_arm is None:
        return None
    subject, patterns, earlier = command.case_arm
    arm = "|".join(patterns)
    if _matches(subject, patterns) is False:
        return f"in the case arm `{arm})`, which `{show(subject)}` never matches"
    taken = next((e for e in earlier or () if _matches(subject, e)), None)
    return None if taken is None else \
        f"in the case arm `{arm})`, after the arm `{'|'.join(taken)})`, which takes `{show(subject)}` first"


def unreached_commands(commands: list[Command], errexit: bool = False, certain: set | None = None,
                       repeated: dict | None = None) -> dict[int, str]:
    """Index -> why bash never runs that top-level command (``errexit``: set -e from the start, as
    ``#!/bin/bash -e`` sets it). ``certain``, when given, receives the indices of the commands that run every
    time the script does: outside any condition, loop body or case arm; ``repeated``, index -> why it runs
    more than once (a ``for`` over several words)."""
    bodies: dict[str, list[Command]] = {}
    for command in commands:
        if command.function and not command.nested:
            bodies.setdefault(command.function, []).append(command)
    exiting: set[str] = set()
    while True:  # a function that calls one that exits exits too
        more = {name for name, body in bodies.items() if name not in exiting and _exits(body, exiting)}
        if not more:
            break
        exiting |= more
    found, frames, ended = {}, [], None
    previous, previous_status, before = "\n", None, []  # the command before: its operator, status, words
    for index, command in enumerate(commands):
        if command.nested or command.function:
            continue
        words, k = command.words, 0
        runs = True if previous not in ("&&", "||") else (
            None if previous_status is None else previous_status == (previous == "&&"))
        skipped = f"after `{show(' '.join(before))} {previous}`, which skips it"
        while k < len(words) and (words[k] in LEADING or words[k] in _OPENERS or words[k] in _CLOSERS):
            word = words[k]
            if word in ("if", "while", "until"):
                decided = constant(words[k + 1:]) if command.operator in (";", "\n") else None
                condition = f"`{' '.join(words[k:])}`"
                body_runs = None if decided is None else decided == (word != "until")
                frames.append({"now": None if body_runs is None else (f"inside {condition}" if not body_runs else ""),
                               "else": None if body_runs is None else ("" if not body_runs else
                                                                       f"in the else of {condition}")})
                break
            if word in ("for", "select"):
                empty = words[k + 2:] == ["in"] and command.operator in (";", "\n")  # for i in ; do
                items = words[k + 3:] if words[k + 2:k + 3] == ["in"] and command.operator in (";", "\n") else []
                times = len(items) if word == "for" and all(_CONSTANT.fullmatch(w) and w.strip("\"'") and
                                                            not re.search(r"[*?[\s]", w) for w in items) else 0
                frames.append({"now": f"inside `{' '.join(words[k:])}`, a list of no words, which runs its body "
                                      "zero times" if empty else None, "else": None,
                               "times": f"inside `{' '.join(words[k:])}`, which runs its body {times} times"
                               if times > 1 else None})
                break
            if word == "{":  # a group runs as its first command would: `cmd || { ...; exit 1; }` only maybe
                frames.append({"now": "" if runs is True else None if runs is None else skipped, "else": ""})
            elif word in ("else", "elif") and frames:
                frames[-1]["now"] = frames[-1]["else"] if word == "else" else None
            elif word in _CLOSERS and frames:
                frames.pop()
            k += 1
        times = next((f["times"] for f in frames if f.get("times")), None)
        if repeated is not None and times:
            repeated[index] = times
        why = ended or next((f["now"] for f in frames if f["now"]), None) or _unmatched_arm(command)
        if not why and runs is False:
            why = skipped
        if why:
            found[index] = why
            previous, previous_status, before = command.operator, None, words
            continue
        sure = runs is True and not command.where and not command.in_case and all(f["now"] == "" for f in frames)
        if sure and certain is not None and command.operator not in ("&&", "||"):
            certain.add(index)
        rest = words[k:]
        status = constant(rest) if rest and "!" not in words[:k] else None  # set -e ignores a negated command
        if rest[:1] == ["return"]:
            status = False  # outside a function return fails (and returns nothing)
        if sure and command.operator not in ("&&", "||", "|", "|&"):
            if rest[:1] == ["exit"] or rest[:1] and rest[0] in exiting:
                ended = f"after `{show(' '.join(rest))}`, which ends the script"
            elif rest[:1] == ["kill"] and "$$" in rest and all(re.fullmatch(r"-(SIG)?(TERM|KILL|INT|HUP|[0-9]+)|\$\$",
                                                                            w) for w in rest[1:]):
                ended = f"after `{show(' '.join(rest))}`, which ends the batch shell"
            elif rest[:1] == ["exec"] and len(rest) > 1 and not _LAUNCHERS.fullmatch(basename(rest[1])):
                ended = f"after `{show(' '.join(rest))}`, which replaces the batch shell"
            elif errexit and status is False:
                ended = f"after `{show(' '.join(rest))}` under set -e, which ends the script"
            else:
                errexit = errexit_after(rest, errexit)
        previous, previous_status, before = command.operator, status, words
    return found
