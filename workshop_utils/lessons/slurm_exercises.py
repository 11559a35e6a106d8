"""Notebook 06's exercises: the checks of 6.1 and 6.2 run what the attendee wrote on the cluster.

Every check judges against the exercise's own specification, written once beside it (``JOB_SPEC`` for 6.1),
never against what the attendee's answer implies, and reads an answer with the real tools' rules: sbatch's
reading of ``#SBATCH`` lines and of ``--time``, ``--signal``, ``--nodes`` (Slurm's own parsers, transcribed);
bash's words, quotes, ``$(...)`` and variables (enough of them to follow a job script); torchrun's own argument
parser (``torch.distributed.run.get_args_parser``); the training command's flags for a sweep file's lines. A
wrong answer of any type is one line (``NotYet``: what is wrong, then the fix), never a traceback.

Exercise 6.1: complete a job script.

The attendee fills the gaps of ``JOB_SCRIPT``: the resources (nodes, tasks per node, CPUs per task, time), the
signal that leaves the job time to checkpoint, and the launch line that starts torchrun on every node with its
rendezvous taken from Slurm's variables. ``check_job_script`` reads the script first (a mistake Slurm would
not report, or would report only after the queue, is named at once), then submits it to the cluster, waits,
and judges what happened from ``scontrol``, the job's output and its result record: it ran with the resources
the exercise asks for, every rank joined the process group, a checkpoint was written. Without a reachable
Slurm the check says so and judges the text alone.

Exercise 6.2: a learning-rate sweep as a job array: the sweep file's lines and the ``--array`` spec. The check
names a miscount (a task without a line, a line no task reads) at once, then runs the array with the kit's
``train_array.sbatch``, gathers it with a job that waits for it (``afterok``), and finds one result per rate.

Exercise 6.3: a finished job's efficiency from what it asked for and used (``slurm_jobs.job_usage``), and the
request for the next run. The job the notebook measures has one CPU and no GPU, where forgetting to divide by
the CPUs or to count the GPUs changes nothing; so the check also runs the attendee's exercise cell again on
``OTHER_JOB``, a job with several of each, and judges those answers too.
"""

from __future__ import annotations

import argparse
import ast
import builtins
import contextlib
import dataclasses
import functools
import io
import json
import math
import numbers
import re
import shlex
import signal as signals
import sys
import uuid
from pathlib import Path

from ..system.errors import WorkshopError
from .exercises import NotYet, Unsolved, exercise_check, judge, name_mistake, passed, require_answered
from .slurm_jobs import find_slurm, job_env, job_records, submit, wait_for

EXERCISE = "Exercise 6.1"
GAPS = ("nodes", "ntasks_per_node", "cpus_per_task", "time", "signal", "nproc_per_node", "rdzv_endpoint")
DIRECTIVE_GAPS = GAPS[:5]  # the gaps of the #SBATCH lines; the others are in the launch line

JOB_SCRIPT = """\
#!/bin/bash
#SBATCH --job-name=ex61-train
#SBATCH --nodes={nodes}
#SBATCH --ntasks-per-node={ntasks_per_node}
#SBATCH --cpus-per-task={cpus_per_task}
#SBATCH --time={time}
#SBATCH --signal={signal}
#SBATCH --output=%x-%j.out
set -uo pipefail
export OMP_NUM_THREADS=1  # each of the processes torchrun starts computes in one thread
# The warning signal reaches this script (B:); pass it on to the training processes on every node, not to
# torchrun itself (its command line names the module too, but only the processes it starts run python -u).
forward() {{ srun --overlap --ntasks-per-node=1 pkill -USR1 -f "python[0-9.]* -u -m workshop_utils.train" || true; }}
trap forward USR1
# srun starts one task per node (torchrun); torchrun starts --nproc-per-node training processes.
srun --cpus-per-task="$SLURM_CPUS_PER_TASK" torchrun --nnodes="$SLURM_JOB_NUM_NODES" \\
    --nproc-per-node={nproc_per_node} --rdzv-backend=c10d --rdzv-endpoint={rdzv_endpoint} --rdzv-id="$SLURM_JOB_ID" \\
    -m workshop_utils.train "$@" &
# bash runs the trap only between commands: wait (which a signal interrupts) until training has ended.
while ! wait $!; do kill -0 $! 2>/dev/null || break; done
"""


@dataclasses.dataclass(frozen=True)
class JobSpec:
    """What Exercise 6.1 asks of the job, whatever the attendee's script says."""

    nodes: int = 1  # "2 training processes on one node" (the notebook's section 8)
    tasks_per_node: int = 1  # srun starts one task per node: torchrun, the node's agent
    procs_per_node: int = 2  # the training processes torchrun starts on each node
    cores_per_proc: int = 1  # one core each (OMP_NUM_THREADS=1)
    warning: str = "USR1"  # what the script's trap and the training loop listen for
    min_lead_s: int = 30  # the least warning in which a checkpoint reliably gets written
    needed_s: int = 120  # start-up and a few CPU steps take well under this; the warning's lead comes on top
    max_time_s: int = 3_600  # an hour: far more than a two-minute job needs; a longer request waits longer in the queue

    @property
    def ranks(self) -> int:
        return self.nodes * self.procs_per_node

    @property
    def cores_per_task(self) -> int:
        return self.procs_per_node * self.cores_per_proc


JOB_SPEC = JobSpec()
NEEDED_S = JOB_SPEC.needed_s
# What the training in the job does: a few CPU steps of the small CNN, a checkpoint every few, one line a step.
TRAINING = ("--device", "cpu", "--batch-size", "16", "--train-size", "256", "--test-size", "64", "--steps", "12",
            "--epochs", "100", "--lr", "0.01", "--warmup-steps", "0", "--checkpoint-every", "4", "--log-every", "4", "--no-progress")
FIRST_NODE = '$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)'
RDZV_FIX = (f'--rdzv-endpoint="{FIRST_NODE}:29500", the first node of the job\'s node list (read when the job '
            "runs) and a free port")


class _Problem(Exception):
    """A mistake found while reading an answer: "problem. Fix: hint", as the readers below return them."""


def _show(value, limit: int = 60) -> str:
    """``value`` as it may appear inside a one-line message: no line breaks, no control characters, short."""
    try:
        text = value if isinstance(value, str) else repr(value)
    except Exception:
        text = f"<{type(value).__name__}>"
    text = "".join(ch if ch.isprintable() else repr(ch)[1:-1] for ch in text)
    return text if len(text) <= limit else text[:limit - 1] + "…"


def _kind(value) -> str:
    """What an answer is, in words: "a list", "a dict", "text", ..."""
    if value is None:
        return "None"
    if isinstance(value, str):
        return "text"
    name = type(value).__name__
    return f"an {name}" if name[:1].lower() in "aeiou" else f"a {name}"


# ---------------------------------------------------------------------------------------------- Slurm's rules


def _strtol(text: str) -> tuple[int | None, str]:
    """C's strtol in base 10: leading white space, a sign, digits; (value or None when no digit, what is left)."""
    found = re.match(r"[ \t\n\r\f\v]*([+-]?[0-9]+)", text)
    return (int(found.group(1)), text[found.end():]) if found else (None, text)


def _whole(text) -> int | None:
    """A count as sbatch reads one (``parse_int``: the whole text a number, not negative); else None."""
    if not isinstance(text, str):
        return None
    value, rest = _strtol(text)
    return value if value is not None and value >= 0 and not rest else None


NO_LIMIT = math.inf
SIGNAL_EARLY_S = 60  # sbatch: "the signal may be sent up to 60 seconds earlier than specified"


def time_limit_s(text) -> float | None:
    """``sbatch --time=TEXT`` as the limit Slurm keeps, in seconds; ``NO_LIMIT`` for none; None if sbatch refuses it.

    Slurm's ``time_str2mins``: "minutes", "minutes:seconds", "hours:minutes:seconds", "days-hours",
    "days-hours:minutes" and "days-hours:minutes:seconds"; "-1", "INFINITE" and "UNLIMITED" mean no limit, and
    so does 0. Slurm keeps whole minutes, rounding up: "0:30" is a limit of one minute.
    """
    if not isinstance(text, str) or not text:
        return None
    if text.lower() in ("-1", "infinite", "unlimited"):
        return NO_LIMIT
    if re.fullmatch(r"[0-9:-]+", text) is None:
        return None
    dashes, colons = text.count("-"), text.count(":")
    if dashes > 1 or colons > 2 or (dashes and ":" in text.split("-")[0]):
        return None
    fields = re.split(r"[-:]", text)
    if any(not f for f in fields):
        return None
    numbers_ = [int(f) for f in fields]
    if dashes:  # days-hours[:minutes[:seconds]]
        days, hours, minutes, seconds = (numbers_ + [0, 0, 0])[:4]
    elif colons == 2:  # hours:minutes:seconds
        days, (hours, minutes, seconds) = 0, numbers_
    else:  # minutes[:seconds]
        days, hours, (minutes, seconds) = 0, 0, (numbers_ + [0])[:2]
    total = days * 86400 + hours * 3600 + minutes * 60 + seconds
    return NO_LIMIT if total == 0 else 60 * math.ceil(total / 60)


# Slurm's sig_name2num table: a name with or without SIG, in any case, or a number.
SLURM_SIGNALS = ("HUP", "INT", "QUIT", "ABRT", "KILL", "ALRM", "TERM", "USR1", "USR2", "URG", "CONT", "STOP", "TSTP",
                 "TTIN", "TTOU", "XCPU")


def _signal_number(text: str) -> int:
    """Slurm's ``sig_name2num``: the signal's number, 0 when it names none."""
    value, rest = _strtol(text)
    if value is not None:
        return value if not rest.strip() else 0
    name = text.lstrip()
    name = name[3:] if name[:3].upper() == "SIG" else name
    for known in SLURM_SIGNALS:
        if name[:len(known)].upper() == known and not name[len(known):].strip():
            return int(getattr(signals, "SIG" + known))
    return 0


@dataclasses.dataclass(frozen=True)
class WarningSignal:
    """What ``--signal`` asks Slurm to send before the time limit, and to whom."""

    signal: int  # its number
    lead_s: int  # sent this long before the time limit
    to_batch_shell: bool  # B: the batch shell alone receives it; else every step of the job (srun's tasks)


def slurm_signal(text) -> WarningSignal | None:
    """``sbatch --signal=[{R|B}:]<sig_num>[@sig_time]`` as Slurm's ``get_signal_opts`` reads it; None if refused.

    The lead defaults to 60 s; sig_time is 0 to 65535. ``R`` (reservations) may stand before or after ``B``.
    """
    if not isinstance(text, str):
        return None
    batch, rest = False, text
    if rest[:1] in ("R", "r"):
        rest = rest[1:]
    if rest[:1] in ("B", "b"):
        batch, rest = True, rest[1:]
    if rest[:1] in ("R", "r"):
        rest = rest[1:]
    rest = rest[1:] if rest[:1] == ":" else rest
    name, at, lead = rest.partition("@")
    number = _signal_number(name) % 65536  # Slurm keeps it in 16 bits
    if number < 1:
        return None
    if not at:
        return WarningSignal(number, 60, batch)
    value, left = _strtol(lead)
    value = 0 if value is None and not left else value  # strtol of "" is 0
    if value is None or left or not 0 <= value <= 0xFFFF:
        return None
    return WarningSignal(number, value, batch)


def _node_range(text) -> tuple[int, int] | None:
    """``--nodes=N`` or ``--nodes=MIN-MAX`` as (MIN, MAX); None for what sbatch would not read as a count."""
    if not isinstance(text, str):
        return None
    low, dash, high = text.partition("-")
    low_n, high_n = _whole(low), (_whole(high) if dash else _whole(low))
    if low_n is None or high_n is None or low_n < 1 or high_n < low_n:
        return None
    return low_n, high_n


# ---------------------------------------------------------------------------------------------- sbatch's reading


class _Refusal(Exception):
    """argparse's error, raised instead of printed with an exit."""


class _Parser(argparse.ArgumentParser):
    def error(self, message):
        raise _Refusal(message)

    def exit(self, status=0, message=None):
        raise _Refusal(message or "stopped")


def _sbatch_arguments(rest: str) -> list[str]:
    """The arguments of one ``#SBATCH`` line as sbatch's ``_get_argument`` splits them: white space between,
    quotes and backslashes as in a shell, an unquoted # starting a comment."""
    arguments, i, n = [], 0, len(rest)
    while i < n:
        while i < n and rest[i].isspace():
            i += 1
        if i >= n or rest[i] == "#":
            break
        argument, quote = "", ""
        while i < n and (quote or not rest[i].isspace()):
            ch = rest[i]
            if ch == "\\" and i + 1 < n:
                argument, i = argument + rest[i + 1], i + 2
                continue
            if quote:
                if ch == quote:
                    quote = ""
                else:
                    argument += ch
            elif ch in "\"'":
                quote = ch
            elif ch == "#":
                return arguments + ([argument] if argument else [])
            else:
                argument += ch
            i += 1
        arguments.append(argument)
    return arguments


def sbatch_directives(script: str) -> list[str]:
    """The options of a script's ``#SBATCH`` lines, in order, as sbatch reads them: from the top, lines continued
    with a backslash joined, until the first line that is neither blank nor a comment."""
    return _directives_and_first_command(script)[0]


def _directives_and_first_command(script: str) -> tuple[list[str], str | None, bool]:
    """(the #SBATCH options sbatch reads, the first command, whether #SBATCH lines follow it unread)."""
    arguments, lines = [], script.replace("\\\n", "").split("\n")
    for number, line in enumerate(lines):
        if line.startswith("#SBATCH"):
            arguments += _sbatch_arguments(line[len("#SBATCH"):])
        elif line.strip() and not line.lstrip().startswith("#"):
            return arguments, line, any(later.startswith("#SBATCH") for later in lines[number + 1:])
    return arguments, None, False


@functools.cache
def _directive_parser() -> _Parser:
    """sbatch's options that Exercise 6.1 asks about, by their long and short names; the rest pass by."""
    parser = _Parser(add_help=False, allow_abbrev=False, prog="sbatch")
    for flags in (("-N", "--nodes"), ("-n", "--ntasks"), ("--ntasks-per-node",), ("-c", "--cpus-per-task"),
                  ("-t", "--time"), ("--signal",)):
        parser.add_argument(*flags)
    return parser


# ---------------------------------------------------------------------------------------------- bash's reading
#
# Enough of bash to follow a job script: its commands and their words (quotes, backslashes, $(...), $((...)),
# ${...}, backticks, comments, redirections and here-documents), variables assigned before they are used, and
# what Slurm sets in the job's environment. A word expands into parts: literal text, or a piece known only when
# the job runs: ("var", NAME) set by Slurm or the system, ("unset", NAME) set by nothing, ("subst", COMMAND)
# a command substitution, ("arith", EXPRESSION), ("param", TEXT) any other ${...}.

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_ASSIGNMENT = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)\+?=(.*)", re.S)
# Set in every job's environment, their values known only on the node (SLURM_CPUS_PER_TASK and
# SLURM_NTASKS_PER_NODE only with their options: those come from the #SBATCH lines).
RUNTIME = frozenset({
    "SLURM_JOB_ID", "SLURM_JOBID", "SLURM_JOB_NAME", "SLURM_JOB_NODELIST", "SLURM_NODELIST", "SLURM_NTASKS",
    "SLURM_NPROCS", "SLURM_CPUS_ON_NODE", "SLURM_JOB_CPUS_PER_NODE", "SLURM_TASKS_PER_NODE", "SLURM_SUBMIT_DIR",
    "SLURM_SUBMIT_HOST", "SLURM_CLUSTER_NAME", "SLURM_JOB_PARTITION", "SLURM_JOB_ACCOUNT", "SLURM_NODEID",
    "SLURM_PROCID", "SLURM_LOCALID", "SLURMD_NODENAME", "SLURM_ARRAY_JOB_ID", "SLURM_ARRAY_TASK_ID",
    "SLURM_RESTART_COUNT", "SLURM_JOB_UID", "SLURM_JOB_USER", "SLURM_TASK_PID", "SLURM_CONF", "SLURM_JOB_QOS",
    "SLURM_MEM_PER_NODE", "SLURM_GPUS_ON_NODE", "SLURM_JOB_GPUS", "SLURM_TOPOLOGY_ADDR",
    "HOME", "USER", "LOGNAME", "PATH", "PWD", "SHELL", "HOSTNAME", "TMPDIR", "LANG", "RANDOM", "BASHPID", "PPID",
})
_SPECIAL = "@*#?$!-0123456789"
_SPLIT = ("split",)  # where an unquoted expansion's value splits into two words


def _skip_quote(text: str, i: int) -> int:
    end = text.find("'", i + 1)
    return len(text) if end < 0 else end + 1


def _skip_backtick(text: str, i: int) -> int:
    j = i + 1
    while j < len(text):
        if text[j] == "\\":
            j += 2
        elif text[j] == "`":
            return j + 1
        else:
            j += 1
    return len(text)


def _skip_double(text: str, i: int) -> int:
    j = i + 1
    while j < len(text):
        ch = text[j]
        if ch == "\\":
            j += 2
        elif ch == '"':
            return j + 1
        elif ch == "$" and text[j + 1:j + 2] in ("(", "{") and j + 1 < len(text):
            j = _skip_group(text, j + 1)
        elif ch == "`":
            j = _skip_backtick(text, j)
        else:
            j += 1
    return len(text)


def _skip_group(text: str, i: int) -> int:
    """The end of the (...) or {...} that opens at ``i``, nested ones and quotes inside it included."""
    opening = text[i]
    closing = ")" if opening == "(" else "}"
    depth, j = 0, i
    while j < len(text):
        ch = text[j]
        if ch == "\\":
            j += 2
            continue
        if ch == "'":
            j = _skip_quote(text, j)
            continue
        if ch == '"':
            j = _skip_double(text, j)
            continue
        if ch == "`":
            j = _skip_backtick(text, j)
            continue
        if ch == opening:
            depth += 1
        elif ch == closing:
            depth -= 1
            if depth == 0:
                return j + 1
        j += 1
    return len(text)


_REDIRECT = re.compile(r"&>>|&>|<<<|<<-|<<|<>|<&|>&|>>|>\||<|>")


def shell_commands(text: str) -> list[tuple[list[str], str]]:
    """The simple commands of a shell text, each as (its words as written, the operator that ends it: "\\n",
    ";", "&", "&&", "|", ...). Comments, redirections and here-documents are left out."""
    commands, words, word = [], [], None
    pending, heredocs = None, []  # what the next word is: a redirection's target (dropped) or a heredoc's end
    i, n = 0, len(text)

    def end_word():
        nonlocal word, pending
        if word is None:
            return
        if pending is None:
            words.append(word)
        elif pending in ("<<", "<<-"):
            heredocs.append((re.sub(r"[\"'\\]", "", word), pending == "<<-"))
        pending, word = None, None

    def end_command(operator: str):
        nonlocal words
        end_word()
        if words:
            commands.append((words, operator))
        words = []

    while i < n:
        ch = text[i]
        if ch == "\\":
            if text[i + 1:i + 2] == "\n":
                i += 2
            else:
                word, i = (word or "") + text[i:i + 2], i + 2
            continue
        if ch in " \t\r":
            end_word()
            i += 1
            continue
        if ch == "#" and word is None:
            end = text.find("\n", i)
            i = n if end < 0 else end
            continue
        if ch in "'\"`" or (ch == "$" and text[i + 1:i + 2] in ("(", "{") and i + 1 < n):
            j = (_skip_quote(text, i) if ch == "'" else _skip_double(text, i) if ch == '"' else
                 _skip_backtick(text, i) if ch == "`" else _skip_group(text, i + 1))
            word, i = (word or "") + text[i:j], j
            continue
        redirect = _REDIRECT.match(text, i) if ch in "<>&" else None
        if redirect and (ch != "&" or redirect.group().startswith("&>")):
            if word is not None and word.isdigit():
                word = None  # the file descriptor of 2>...
            end_word()
            pending, i = redirect.group(), redirect.end()
            continue
        two = text[i:i + 2]
        if two in ("&&", "||", ";;", "|&"):
            end_command(two)
            i += 2
            continue
        if ch in ";&|()\n":
            end_command(ch)
            i += 1
            if ch == "\n":
                while heredocs:  # the here-documents' bodies start on the next line
                    end_mark, tabs = heredocs.pop(0)
                    while i < n:
                        line_end = text.find("\n", i)
                        line_end = n if line_end < 0 else line_end
                        line = text[i:line_end]
                        i = line_end + 1
                        if (line.lstrip("\t") if tabs else line) == end_mark:
                            break
            continue
        word, i = (word or "") + ch, i + 1
    end_command("")
    return commands


class _Shell:
    """A word's expansion in the batch shell: the script's own variables (assigned before the word is read),
    the values of Slurm's variables that the #SBATCH lines fix, and the pieces known only when the job runs."""

    def __init__(self, known: dict[str, str]):
        self.known = known  # SLURM_JOB_NUM_NODES and the like, from the #SBATCH lines
        self.assigned: dict[str, str] = {}  # NAME -> the word assigned, as written
        self.pieces: list = []  # the non-literal parts of encoded words, by index
        self.budget = 2_000  # variable expansions left: a script of variables made of variables stays quick

    def assign(self, words: list[str]) -> bool:
        """Take a command that only assigns (``A=1 B=2``, ``export A=1``, ``declare -x A=1``); False otherwise."""
        start = 1 if words[0] in ("export", "declare", "typeset", "readonly", "local") else 0
        rest = [w for w in words[start:] if not (start and w.startswith("-"))]
        matches = [_ASSIGNMENT.fullmatch(w) for w in rest]
        if start == 0 and not all(matches):
            return False
        for found in matches:
            if found:
                self.assigned[found.group(1)] = found.group(2)
        return True

    def variable(self, name: str, quoted: bool, depth: int, hidden: frozenset) -> list:
        self.budget -= 1
        if name in self.assigned and name not in hidden and depth < 8 and self.budget > 0:
            parts = self.parts(self.assigned[name], depth + 1, hidden | {name})
            if quoted:
                return parts
            split = []  # an unquoted variable's value splits at white space into words
            for part in parts:
                if isinstance(part, str):
                    pieces = re.split(r"[ \t\n]+", part)
                    for k, piece in enumerate(pieces):
                        if k:
                            split.append(_SPLIT)
                        if piece:
                            split.append(piece)
                else:
                    split.append(part)
            return split
        if name in self.known:
            return [self.known[name]]
        return [("var", name)] if name in RUNTIME or name in _SPECIAL else [("unset", name)]

    def parts(self, word: str, depth: int = 0, hidden: frozenset = frozenset()) -> list:
        """The word's value: literal strings and the pieces the job will know (see above), in order."""
        parts: list = []

        def add(items):
            for item in items:
                if isinstance(item, str) and parts and isinstance(parts[-1], str):
                    parts[-1] += item
                elif item != "":
                    parts.append(item)

        def dollar(i: int, quoted: bool) -> int:
            after = word[i + 1:i + 2]
            if word.startswith("$((", i):
                j = _skip_group(word, i + 1)
                add([("arith", word[i + 3:j - 2] if word[j - 2:j] == "))" else word[i + 3:j])])
                return j
            if after == "(":
                j = _skip_group(word, i + 1)
                add([("subst", word[i + 2:j - 1] if word[j - 1:j] == ")" else word[i + 2:j])])
                return j
            if after == "{":
                j = _skip_group(word, i + 1)
                inner = word[i + 2:j - 1] if word[j - 1:j] == "}" else word[i + 2:j]
                if _NAME.fullmatch(inner) or (len(inner) == 1 and inner in _SPECIAL):
                    add(self.variable(inner, quoted, depth, hidden))
                else:
                    add([("param", inner)])
                return j
            found = _NAME.match(word, i + 1)
            if found:
                add(self.variable(found.group(), quoted, depth, hidden))
                return found.end()
            if after and after in _SPECIAL:
                add([("var", after)])
                return i + 2
            add(["$"])
            return i + 1

        i = 0
        while i < len(word):
            ch = word[i]
            if ch == "\\":
                add([word[i + 1:i + 2]])
                i += 2
            elif ch == "'":
                j = _skip_quote(word, i)
                add([word[i + 1:j - 1] if word[j - 1:j] == "'" and j - 1 > i else word[i + 1:j]])
                i = j
            elif ch == '"':
                j = _skip_double(word, i)
                end = j - 1 if j - 1 > i and word[j - 1] == '"' else j
                k = i + 1
                while k < end:
                    if word[k] == "\\" and k + 1 < end and word[k + 1] in '$`"\\\n':
                        add([word[k + 1]] if word[k + 1] != "\n" else [])
                        k += 2
                    elif word[k] == "$":
                        k = dollar(k, True)
                    elif word[k] == "`":
                        j2 = _skip_backtick(word, k)
                        add([("subst", word[k + 1:j2 - 1])])
                        k = j2
                    else:
                        add([word[k]])
                        k += 1
                i = j
            elif ch == "$":
                i = dollar(i, False)
            elif ch == "`":
                j = _skip_backtick(word, i)
                add([("subst", word[i + 1:j - 1])])
                i = j
            else:
                add([ch])
                i += 1
        return parts

    def fields(self, word: str) -> list[str]:
        """The word's expansion as the words a command receives, each encoded: literal text with every
        non-literal part as \\x00INDEX\\x01 (see ``decode``), so that argparse can read them."""
        out, current = [], ""
        for part in self.parts(word):
            if part is _SPLIT:
                if current:
                    out.append(current)
                current = ""
            elif isinstance(part, str):
                current += part
            else:
                self.pieces.append(part)
                current += f"\x00{len(self.pieces) - 1}\x01"
        return out + [current] if current or not out else out

    def decode(self, text: str) -> list:
        parts = []
        for literal, index in re.findall(r"([^\x00]*)(?:\x00(\d+)\x01|$)", text):
            if literal:
                parts.append(literal)
            if index:
                parts.append(self.pieces[int(index)])
        return parts


def _render(parts: list) -> str:
    """Parts written back as bash would show them, for a message."""
    out = []
    for part in parts:
        if isinstance(part, str):
            out.append(part)
        elif part[0] in ("var", "unset"):
            out.append("$" + part[1])
        elif part[0] == "subst":
            out.append(f"$({part[1]})")
        elif part[0] == "arith":
            out.append(f"$(({part[1]}))")
        elif part[0] == "param":
            out.append("${" + part[1] + "}")
    return "".join(out)


def _literal(parts: list) -> str | None:
    """The parts' text when every part is literal (known before the job runs); else None."""
    return "".join(parts) if all(isinstance(p, str) for p in parts) else None


def _basename(text: str) -> str:
    return text.rsplit("/", 1)[-1]


# ---------------------------------------------------------------------------------------------- the launch line

_PREFIXES = {"{", "!", "if", "then", "else", "elif", "do", "while", "until", "time", "exec", "nohup", "command",
             "builtin"}
# srun's options that take their value as the next word (``-n 2``); every other option is a flag or ``--x=y``.
_SRUN_VALUE = {
    "-A", "--account", "-b", "--begin", "-c", "--cpus-per-task", "-d", "--dependency", "-D", "--chdir", "-e",
    "--error", "-i", "--input", "-J", "--job-name", "-m", "--distribution", "-n", "--ntasks", "-N", "--nodes", "-o",
    "--output", "-p", "--partition", "-q", "--qos", "-t", "--time", "-w", "--nodelist", "-x", "--exclude", "-C",
    "--constraint", "-G", "--gpus", "-L", "--licenses", "-T", "--threads", "-W", "--wait", "-B", "--extra-node-info",
    "--ntasks-per-node", "--ntasks-per-core", "--ntasks-per-socket", "--ntasks-per-gpu", "--ntasks-per-tres",
    "--cpu-bind", "--gpu-bind", "--mem", "--mem-per-cpu", "--mem-per-gpu", "--gpus-per-task", "--gpus-per-node",
    "--gpus-per-socket", "--cpus-per-gpu", "--gres", "--gres-flags", "--mpi", "--export", "--signal", "--het-group",
    "--network", "--comment", "--reservation", "--hint", "--mem-bind", "--cpu-freq", "--time-min", "--prolog",
    "--epilog", "--task-prolog", "--task-epilog", "--nice", "--tres-per-task", "--container", "--accel-bind",
    "--bcast", "--cores-per-socket", "--sockets-per-node", "--threads-per-core", "--switches", "--wckey", "--profile",
    "--acctg-freq", "--jobid", "--uid", "--gid", "--mcs-label", "--tmp", "--tres-bind", "--container-id",
}
_SRUN_LONG = {"-n": "--ntasks", "-N": "--nodes", "-c": "--cpus-per-task"}


@dataclasses.dataclass
class Launch:
    """One command that starts torchrun: srun's options in front of it (None without srun), torchrun's
    arguments (encoded words, see ``_Shell.fields``), how it was started, and the operator that ends it."""

    srun: dict | None
    args: list[str]
    launcher: str
    operator: str


def _srun_options(words: list[str], i: int) -> tuple[dict, int]:
    seen = {}
    while i < len(words) and words[i].startswith("-") and words[i] != "-":
        word = words[i]
        if word == "--":
            return seen, i + 1
        if word.startswith("--"):
            name, eq, value = word.partition("=")
            if eq:
                seen[name], i = value, i + 1
            elif name in _SRUN_VALUE:
                seen[name], i = (words[i + 1] if i + 1 < len(words) else ""), i + 2
            else:
                seen[name], i = None, i + 1
        elif word[:2] in _SRUN_VALUE:
            name = _SRUN_LONG.get(word[:2], word[:2])
            if len(word) > 2:
                seen[name], i = word[2:].removeprefix("="), i + 1
            else:
                seen[name], i = (words[i + 1] if i + 1 < len(words) else ""), i + 2
        else:
            i += 1
    return seen, i


def _launch_of(words: list[str], operator: str) -> Launch | None:
    """The command as a torchrun launch (``torchrun``, ``python[3] -m torch.distributed.run``, either after
    ``srun [options]``), or None when it starts something else."""
    i = 0
    while i < len(words) and (words[i] in _PREFIXES or _ASSIGNMENT.fullmatch(words[i])):
        i += 1
    if i < len(words) and words[i] == "env":
        i += 1
        while i < len(words) and (words[i].startswith("-") or _ASSIGNMENT.fullmatch(words[i])):
            i += 1
    srun = None
    if i < len(words) and _basename(words[i]) == "srun":
        srun, i = _srun_options(words, i + 1)
    if i >= len(words):
        return None
    head = _basename(words[i])
    if head == "torchrun":
        return Launch(srun, words[i + 1:], "torchrun", operator)
    if re.fullmatch(r"python[0-9]*(\.[0-9]+)*", head):
        j, module = i + 1, None
        while j < len(words) and words[j].startswith("-") and words[j] != "-":
            option = words[j]
            if option == "-m":
                module, j = (words[j + 1] if j + 1 < len(words) else ""), j + 2
                break
            if option.startswith("-m"):
                module, j = option[2:], j + 1
                break
            if option.startswith("-c"):
                return None
            j += 2 if option in ("-X", "-W") else 1
        if module == "torch.distributed.run":
            return Launch(srun, words[j:], f"{head} -m torch.distributed.run", operator)
    return None


@functools.cache
def _torchrun_parser() -> argparse.ArgumentParser:
    """torchrun's own argument parser, raising instead of printing and exiting."""
    from torch.distributed.run import get_args_parser

    parser = get_args_parser()

    def refuse(message=None, *args):
        raise _Refusal(message or "stopped")

    parser.error = refuse
    parser.exit = lambda status=0, message=None: refuse(message)
    return parser


def torchrun_args(args: list[str]) -> argparse.Namespace:
    """``args`` as torchrun reads them; ``_Refusal`` with torchrun's message where it would stop."""
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        return _torchrun_parser().parse_args(args)


# ---------------------------------------------------------------------------------------------- the job, read


@dataclasses.dataclass
class JobRequest:
    """What a job script asks for, read as sbatch, bash and torchrun read it."""

    directives: argparse.Namespace  # the #SBATCH options the exercise asks about (None where not given)
    nodes: tuple[int, int]
    tasks_per_node: int
    cpus_per_task: int
    commands: list[tuple[list[str], str]]  # the script's commands, as written
    shell: _Shell  # the expansion the launch line's words got
    launches: list[Launch]
    after: list[list[str]]  # the commands after the first launch, expanded


def _count(value, flag: str, fix: str) -> int:
    number = _whole(value)
    if number is None or number < 1:
        raise _Problem(f"{flag}={_show(value)} is not a count sbatch reads (a whole number, 1 or more). Fix: {fix}")
    return number


def read_job_script(script: str, spec: JobSpec = JOB_SPEC) -> JobRequest:
    """The script as sbatch, bash and torchrun read it; ``_Problem`` for what none of them would read."""
    if "\x00" in script:
        raise _Problem("the script holds a NUL character, which bash cannot read. Fix: remove it.")
    unfilled = [gap for gap in GAPS if "{" + gap + "}" in script]
    if unfilled:
        raise _Problem(f"the script still has its gaps ({', '.join('{' + g + '}' for g in unfilled)}). Fix: pass "
                       "the answers as a dict, or the script with every gap filled.")
    if not script.startswith("#!"):
        raise _Problem("sbatch refuses a script whose first line is not #! and its interpreter. Fix: #!/bin/bash as "
                       "the first line.")
    arguments, first_command, unread = _directives_and_first_command(script)
    if unread:
        first = _show(first_command.strip())
        raise _Problem(f"sbatch reads #SBATCH lines only above the script's first command ({first}), and some come "
                       "after it: they would be ignored. Fix: every #SBATCH line at the top.")
    try:
        directives, _ = _directive_parser().parse_known_args(arguments)
    except _Refusal as err:
        raise _Problem(f"sbatch would refuse the #SBATCH lines: {_show(str(err), 100)}. Fix: --option=VALUE, "
                       "one value for each option.") from None
    nodes = (1, 1) if directives.nodes is None else _node_range(directives.nodes)  # sbatch's default: one node
    if nodes is None:
        raise _Problem(f"--nodes={_show(directives.nodes)} is not a node count sbatch reads. Fix: --nodes="
                       f"{spec.nodes}.")
    if directives.ntasks_per_node is not None:
        tasks = _count(directives.ntasks_per_node, "--ntasks-per-node",
                       "--ntasks-per-node=1 (the one task on each node is torchrun).")
    elif directives.ntasks is not None:
        tasks = math.ceil(_count(directives.ntasks, "--ntasks", "--ntasks-per-node=1 in its place.") / nodes[0])
    else:
        tasks = 1  # sbatch's default: one task
    cpus = 1 if directives.cpus_per_task is None else _count(
        directives.cpus_per_task, "--cpus-per-task", f"--cpus-per-task={spec.cores_per_task}.")
    known = {"SLURM_JOB_NUM_NODES": str(nodes[0]), "SLURM_NNODES": str(nodes[0])} if nodes[0] == nodes[1] else {}
    if directives.cpus_per_task is not None:
        known["SLURM_CPUS_PER_TASK"] = str(cpus)
    if directives.ntasks_per_node is not None:
        known["SLURM_NTASKS_PER_NODE"] = str(tasks)
    shell = _Shell(known)
    commands = shell_commands(script)
    launches, after = [], []
    for words, operator in commands:
        if shell.assign(words):
            continue
        fields = [f for w in words for f in shell.fields(w)]
        launch = _launch_of(fields, operator)
        if launch:
            launches.append(launch)
        elif launches:
            after.append(fields)
    return JobRequest(directives, nodes, tasks, cpus, commands, shell, launches, after)


# ---------------------------------------------------------------------------------------------- the rendezvous


def _n(count: int, noun: str) -> str:
    return f"one {noun}" if count == 1 else f"{count} {noun}s"


_JOB_IDS = ("SLURM_JOB_ID", "SLURM_JOBID", "SLURM_ARRAY_JOB_ID")
# Job ids the port must suit: small, around the usual modulus, and up to Slurm's default MaxJobId.
_SAMPLE_JOB_IDS = (1, 2, 999, 1000, 1234, 65535, 65536, 67_043_327)


def _c_division(a: int, b: int, remainder: bool) -> int:
    """bash's integer / and % (C's: the quotient rounds toward zero)."""
    if b == 0:
        raise ZeroDivisionError
    quotient = abs(a) // abs(b) * (1 if (a >= 0) == (b >= 0) else -1)
    return a - b * quotient if remainder else quotient


def _evaluate(node, names: dict) -> int:
    if isinstance(node, ast.Expression):
        return _evaluate(node.body, names)
    if isinstance(node, ast.Constant) and type(node.value) is int:
        return node.value
    if isinstance(node, ast.Name) and node.id in names:
        return names[node.id]
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.UAdd, ast.USub)):
        value = _evaluate(node.operand, names)
        return -value if isinstance(node.op, ast.USub) else value
    if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Sub, ast.Mult, ast.Div, ast.Mod)):
        a, b = _evaluate(node.left, names), _evaluate(node.right, names)
        if isinstance(node.op, ast.Add):
            return a + b
        if isinstance(node.op, ast.Sub):
            return a - b
        if isinstance(node.op, ast.Mult):
            return a * b
        return _c_division(a, b, isinstance(node.op, ast.Mod))
    raise ValueError("not bash arithmetic the check reads")


def _arithmetic_ports(expression: str, shell: _Shell) -> list[tuple[int, int]]:
    """(job id, port) for sample job ids of a ``$((...))`` port; ValueError where the check cannot evaluate it."""
    if len(expression) > 200:
        raise ValueError("too long")
    names: dict[str, int] = {}

    def name_of(found) -> str:
        name = found.group(1) or found.group(2)
        if name in _JOB_IDS:
            return "JOB"
        value = shell.assigned.get(name, shell.known.get(name))
        value = _literal(shell.parts(value)) if value is not None else None
        if value is None or re.fullmatch(r"[0-9]+", value.strip()) is None:
            raise ValueError(f"${name}")
        names[name] = int(value)
        return name

    if re.search(r"[^\w\s$+\-*/%(){}]", expression):
        raise ValueError("an operator the check does not read")
    python = re.sub(r"\$\{([A-Za-z_]\w*)\}|\$?([A-Za-z_]\w*)", name_of, expression)
    # JOB % m is largest at m - 1 and smallest at m: those job ids too, whatever the modulus.
    moduli = {int(m) for m in re.findall(r"%\s*([0-9]{1,9})\b", expression) if int(m) > 0}
    jobs = sorted({*_SAMPLE_JOB_IDS, *(m - 1 for m in moduli if m > 1), *moduli, *(2 * m - 1 for m in moduli)})
    try:
        tree = ast.parse(python.strip(), mode="eval")
        return [(job, _evaluate(tree, {**names, "JOB": job})) for job in jobs]
    except (SyntaxError, RecursionError, MemoryError, ZeroDivisionError, KeyError) as err:
        raise ValueError(type(err).__name__) from None


def _first_node_problem(inner: str, shell: _Shell) -> str | None:
    """Why ``$(inner)`` is not the first node of the job's node list; None when it is."""
    commands = shell_commands(inner)
    pipeline = [[shell.parts(w) for w in words] for words, _ in commands]
    shown = [[_literal(p) for p in words] for words in pipeline]
    operators = [operator for _, operator in commands]
    if not pipeline or shown[0][:1] == [None] or _basename(shown[0][0] or "") != "scontrol":
        return "is not read from the job's node list"
    words = [w for w in pipeline[0][1:] if not (_literal(w) or "").startswith("-")]
    if [_literal(w) for w in words[:1]] != ["show"] or len(words) < 2 or _literal(words[1]) not in ("hostnames",
                                                                                                   "hostname"):
        return "is not `scontrol show hostnames`, which lists the job's nodes one a line"
    if len(words) > 3:
        return "gives scontrol more than one node list"
    if len(words) == 3 and words[2] not in ([("var", "SLURM_JOB_NODELIST")], [("var", "SLURM_NODELIST")]):
        return f"expands {_show(_render(words[2]))}, not the job's node list $SLURM_JOB_NODELIST"
    if len(pipeline) == 1:
        return ("lists every node of the job, one a line: on two nodes torchrun would get both names as its one "
                "host")
    if len(pipeline) > 2 or operators[0] != "|":
        return "is not one name taken from scontrol's list as the check can read it"
    second = [w for w in shown[1]]
    head = " ".join(w if w is not None else "?" for w in second)
    if second[:1] == ["tail"]:
        return "is the job's last node, not its first"
    if re.fullmatch(r"head( -n ?\+?1| -1| --lines[= ]\+?1)", head) or re.fullmatch(
            r"sed( -n '?1p'?| '?1q'?| -n '?1\{p;q\}'?)", head) or re.fullmatch(
            r"awk '?NR ?== ?1( ?\{ ?print;? ?(exit;? ?)?\})?'?", head):
        return None
    return f"keeps `{_show(head)}` of scontrol's list, not its first line"


def _host_problem(parts: list, shell: _Shell) -> str | None:
    """Why the rendezvous host is not the job's first node; None when it is."""
    shown = _show(_render(parts))
    literal = _literal(parts)
    if literal is not None:
        bare = literal.strip("[]").lower()
        if bare in ("localhost", "localhost.localdomain", "ip6-localhost", "::1", "0.0.0.0") or bare.startswith("127."):
            return (f"the rendezvous host {shown} is each node's own loopback: on two nodes every agent would wait at "
                    f"its own node and they would never meet. Fix: {RDZV_FIX}.")
        return (f"the rendezvous host {shown} is a fixed name: the job runs on whichever nodes Slurm gives it, "
                f"usually not that one. Fix: {RDZV_FIX}.")
    if len(parts) == 1:
        kind, what = parts[0]
        if kind == "var" and what in ("SLURM_JOB_NODELIST", "SLURM_NODELIST"):
            return (f"the rendezvous host ${what} is the job's whole node list in Slurm's short form (node[01-02]), "
                    f"not one host. Fix: {RDZV_FIX}.")
        if kind == "unset":
            return (f"the rendezvous host ${what}: nothing in the script or Slurm sets it, so the host would be "
                    f"empty. Fix: {RDZV_FIX}, or set {what} from it on a line before the launch.")
        if kind == "var" and what == "SLURMD_NODENAME":
            return None  # the node the batch script runs on, which Slurm makes the job's first node, by its node name
        if (kind == "var" and what == "HOSTNAME") or (
                kind == "subst" and re.fullmatch(r"\s*hostname( -[sf]| --short| --fqdn)?\s*", what)):
            return (f"the rendezvous host {shown} is the machine the batch shell runs on, not a name from the job's "
                    f"node list, which is what the exercise asks for. Fix: {RDZV_FIX}.")
        if kind == "subst":
            why = _first_node_problem(what, shell)
            return None if why is None else f"the rendezvous host {shown} {why}. Fix: {RDZV_FIX}."
    return (f"the rendezvous host {shown} is not the job's first node as the check can read it (the first line of "
            f"scontrol's list, directly or through a variable set before the launch). Fix: {RDZV_FIX}.")


def _port_problem(parts: list | None, shell: _Shell) -> str | None:
    """Why the rendezvous port is not one an agent can listen on; None when it is (or torchrun's default)."""
    if parts is None:
        return None  # no port: torchrun's c10d default, 29400
    fix = "Fix: a port from 1024 to 65535, e.g. 29500, or $((29500 + SLURM_JOB_ID % 1000))."
    literal = _literal(parts)
    if literal is not None and re.fullmatch(r"[0-9]+", literal):
        samples = [(None, int(literal))]
    elif len(parts) == 1 and parts[0][0] == "arith":
        try:
            samples = _arithmetic_ports(parts[0][1], shell)
        except ValueError as err:
            return f"the port {_show(_render(parts))} is not a number the check can read ({_show(str(err))}). {fix}"
    else:
        return (f"the port {_show(_render(parts))} is not a number the check can read (a number, or $((...)) of "
                f"the job id). {fix}")
    for job, port in samples:
        if not 1024 <= port <= 65535:
            value = "" if job is None else f" is {port} for job {job}"
            why = "only root may listen below 1024" if port < 1024 else "ports end at 65535"
            return f"the port {_show(_render(parts))}{value}: {why}. {fix}"
    return None


def _endpoint_parts(parts: list) -> tuple[list, list | None]:
    """(host, port) of a rendezvous endpoint as torchrun splits it: at the last colon, unless [IPv6]."""
    literal = _literal(parts)
    if literal is not None and literal.startswith("[") and literal.endswith("]"):
        return parts, None
    for k in range(len(parts) - 1, -1, -1):
        if isinstance(parts[k], str) and ":" in parts[k]:
            before, _, after = parts[k].rpartition(":")
            return [*parts[:k], *([before] if before else [])], [*([after] if after else []), *parts[k + 1:]]
    return parts, None


# ---------------------------------------------------------------------------------------------- the judge

NO_LAUNCH = ("no torchrun line: the job would start nothing (torchrun, or python -m torch.distributed.run, with srun "
             "in front or not). Fix: keep the launch line of the template.")


def _signal_name(number: int) -> str:
    try:
        return signals.Signals(number).name
    except ValueError:
        return f"signal {number}"


def _command_word(fields: list[str]) -> str:
    words = [w for w in fields if w not in _PREFIXES]
    return words[0] if words else ""


def _request_problem(job: JobRequest, args, launch: Launch, spec: JobSpec) -> str | None:
    """Nodes, tasks, processes and cores against the exercise's."""
    low, high = job.nodes
    if (low, high) != (spec.nodes, spec.nodes):
        asked = str(low) if low == high else f"{low}-{high}"
        return (f"--nodes={asked}: the exercise asks for {_n(spec.nodes, 'node')}, with {spec.procs_per_node} "
                f"training processes on it. Fix: --nodes={spec.nodes}.")
    tasks, tasks_flag = job.tasks_per_node, "--ntasks-per-node"
    for flag in ("--ntasks-per-node", "--ntasks"):  # srun's own count wins over the #SBATCH line's
        value = (launch.srun or {}).get(flag)
        if value is not None:
            number = _whole(_literal(job.shell.decode(value)))
            if number is None or number < 1:
                return (f"srun {flag}={_show(_render(job.shell.decode(value)))} is not a count the check can read. "
                        "Fix: leave it out: srun starts the job's tasks, one per node.")
            tasks, tasks_flag = (number if flag == "--ntasks-per-node" else math.ceil(number / low)), f"srun {flag}"
            break
    nproc_text = _literal(job.shell.decode(args.nproc_per_node))
    if nproc_text in ("auto", "cpu", "gpu"):
        per = "GPU" if nproc_text == "gpu" else "core (or GPU)"
        return (f"--nproc-per-node={nproc_text}: torchrun would start one process per {per} of the node, not the "
                f"{spec.procs_per_node} the exercise asks for. Fix: --nproc-per-node={spec.procs_per_node}.")
    nproc = _whole(nproc_text)
    if nproc is None or nproc < 1:
        return (f"--nproc-per-node={_show(_render(job.shell.decode(args.nproc_per_node)))} is not a number of "
                f"processes the check can read before the job runs. Fix: --nproc-per-node={spec.procs_per_node}.")
    if tasks != spec.tasks_per_node:
        if nproc > 1:
            return (f"{tasks_flag}={tasks} and --nproc-per-node={nproc}: srun starts {tasks} torchruns on each node "
                    f"and each starts {nproc} processes, {tasks * nproc} per node, {tasks} times too many. Fix: "
                    "--ntasks-per-node=1 (the one task is torchrun) and --nproc-per-node the processes per node.")
        return (f"{tasks_flag}={tasks} and --nproc-per-node={nproc}: srun starts {tasks} torchrun agents on the "
                f"node, each with {_n(nproc, 'process')} and each taken for a node of its own by the rendezvous: "
                f"{tasks} agents for one node. Fix: --ntasks-per-node=1 (the one task is torchrun) and "
                f"--nproc-per-node={spec.procs_per_node}.")
    if nproc != spec.procs_per_node:
        return (f"--nproc-per-node={nproc}: torchrun starts {nproc} training process(es) on the node, not the "
                f"{spec.procs_per_node} the exercise asks for. Fix: --nproc-per-node={spec.procs_per_node}.")
    nnodes = _literal(job.shell.decode(args.nnodes))
    low_n, _, high_n = (nnodes or "").partition(":")
    counted = (_whole(low_n), _whole(high_n) if high_n else _whole(low_n))
    if counted != (low, low):
        return (f"--nnodes={_show(_render(job.shell.decode(args.nnodes)))}: torchrun would wait for that many nodes "
                f"to join, and the job has {_n(low, 'node')}. Fix: --nnodes=\"$SLURM_JOB_NUM_NODES\", Slurm's count "
                "of the job's nodes.")
    cpus, cpus_flag = job.cpus_per_task, "--cpus-per-task"
    step = (launch.srun or {}).get("--cpus-per-task")
    step_cpus = _whole(_literal(job.shell.decode(step))) if step is not None else None
    if step_cpus is not None and step_cpus != cpus:
        return (f"srun --cpus-per-task={step_cpus} for a job with --cpus-per-task={cpus}: the launch would ask for "
                "other cores than the job holds. Fix: srun --cpus-per-task=\"$SLURM_CPUS_PER_TASK\".")
    need = nproc * spec.cores_per_proc
    if cpus < need:
        given = "" if job.directives.cpus_per_task is not None else " (sbatch's default without --cpus-per-task)"
        return (f"{cpus_flag}={cpus}{given} for {nproc} training processes: they would take turns on {cpus} core(s). "
                f"Fix: --cpus-per-task of at least {nproc} (one core per process here).")
    if cpus > need:
        return (f"{cpus_flag}={cpus} for {nproc} training processes of one thread each (OMP_NUM_THREADS=1): "
                f"{cpus - need} core(s) would sit idle, held from everyone else. Fix: --cpus-per-task={need}, "
                "one core per process.")
    return None


def _time_problem(job: JobRequest, spec: JobSpec) -> str | None:
    """--time and --signal against the exercise's: the limit fits the work and the warning, which the batch
    shell receives in time to pass on."""
    text = job.directives.time
    if not text:
        return ("no --time: the job would get the partition's default limit, perhaps shorter than it needs, perhaps "
                "far longer than it asks for. Fix: --time with the work and the warning's lead, e.g. 00:05:00.")
    limit = time_limit_s(text)
    if limit is None:
        return (f"--time={_show(text)} is not a duration Slurm reads. Fix: minutes (5), MM:SS, HH:MM:SS (00:05:00), "
                "D-HH, D-HH:MM or D-HH:MM:SS.")
    if limit == NO_LIMIT:
        return (f"--time={_show(text)} asks for no time limit: the job gets the partition's longest, waits longer "
                "for a slot, and its warning comes only then. Fix: a limit the job fits into, e.g. 00:05:00.")
    flag = job.directives.signal
    if not flag:
        return ("no --signal: when the time limit comes, Slurm ends the job without warning and the steps since "
                "the last checkpoint are lost. Fix: #SBATCH --signal=B:USR1@60 sends SIGUSR1 to the script 60 s "
                "before the end; its trap passes it on and the training loop checkpoints and stops.")
    warning = slurm_signal(flag)
    if warning is None:
        return (f"--signal={_show(flag)} is not a signal option sbatch reads ([B:]SIGNAL[@SECONDS]). Fix: "
                "--signal=B:USR1@SECONDS, SECONDS the warning's lead time.")
    if warning.signal != int(getattr(signals, "SIG" + spec.warning)):
        return (f"--signal={_show(flag)} sends {_signal_name(warning.signal)}: the trap and the training loop "
                f"listen for SIG{spec.warning}. Fix: --signal=B:{spec.warning}@SECONDS, SECONDS the warning's lead "
                "time.")
    if not warning.to_batch_shell:
        return (f"--signal={_show(flag)} has no B:, so Slurm sends SIG{spec.warning} to the job's steps (the tasks "
                "srun started), not to the batch shell: the script's trap never fires. Fix: "
                f"--signal=B:{spec.warning}@{warning.lead_s}.")
    lead = warning.lead_s
    if lead < spec.min_lead_s:
        return (f"--signal gives {lead} s of warning: too little to write a checkpoint on a busy file system. Fix: "
                f"give it a minute or more (B:{spec.warning}@60).")
    # sbatch may send the signal up to 60 s before the time asked for (its manual): that minute counts too.
    if limit < spec.needed_s + lead + SIGNAL_EARLY_S:
        return (f"--time of {limit:g} s: the job needs about {spec.needed_s} s, and the warning comes {lead} s before "
                f"the end, up to {SIGNAL_EARLY_S} s earlier still (sbatch's resolution), so it could run out of time. "
                f"Fix: at least {spec.needed_s + lead + SIGNAL_EARLY_S} s, e.g. 00:05:00.")
    if limit > spec.max_time_s:
        return (f"--time={_show(text)} asks for {limit / 3600:g} h for about {spec.needed_s // 60} minutes of work: "
                "a long request waits longer for its slot and holds what it does not use. Fix: the work and the "
                "warning's lead, with some room: e.g. 00:05:00.")
    return None


def _rendezvous_problem(job: JobRequest, args, spec: JobSpec) -> str | None:
    if args.standalone:
        return (f"--standalone: the agents meet on localhost, so the script works on one node only. Fix: "
                f"--rdzv-backend=c10d and {RDZV_FIX}.")
    backend = _literal(job.shell.decode(args.rdzv_backend))
    if backend != "c10d":
        why = ("torchrun's default, static, needs each node started with its own --node-rank, which one srun line "
               "cannot give" if backend == "static" else "the exercise's agents meet in torchrun's own c10d store")
        return f"--rdzv-backend={_show(_render(job.shell.decode(args.rdzv_backend)))}: {why}. Fix: --rdzv-backend=c10d."
    host, port = _endpoint_parts(job.shell.decode(args.rdzv_endpoint))
    if not host or _literal(host) == "" or (_literal(host) or "x").strip() == "":
        return ("no rendezvous endpoint: torchrun's agents on the job's nodes have nowhere to meet. Fix: "
                "--rdzv-endpoint=HOST:PORT with HOST the job's first node, "
                "$(scontrol show hostnames \"$SLURM_JOB_NODELIST\" | head -n 1), and a free port such as 29500.")
    return _host_problem(host, job.shell) or _port_problem(port, job.shell)


def _job_problem(job: JobRequest, spec: JobSpec) -> str | None:
    if not job.launches:
        return NO_LAUNCH
    if len(job.launches) > 1:
        return (f"the script starts torchrun {len(job.launches)} times: the job would train {len(job.launches)} "
                "times over. Fix: one launch line, as in the template.")
    launch = job.launches[0]
    try:
        args = torchrun_args(launch.args)
    except _Refusal as err:
        return (f"torchrun would refuse its arguments: {_show(str(err), 100)}. Fix: keep the options of the "
                "template's launch line.")
    problem = _request_problem(job, args, launch, spec) or _time_problem(job, spec) or _rendezvous_problem(
        job, args, spec)
    if problem:
        return problem
    script = _literal(job.shell.decode(args.training_script))
    if not args.module or script != "workshop_utils.train":
        return (f"the launch line runs {_show(_render(job.shell.decode(args.training_script)))}, not the training "
                "(-m workshop_utils.train). Fix: -m workshop_utils.train \"$@\" at its end, as in the template.")
    if not any(("var", "@") in job.shell.decode(a) for a in args.training_script_args):
        return ("the launch line does not pass \"$@\" on: the check's training flags (steps, checkpoints) would never "
                "reach the training. Fix: keep \"$@\" at the end of the launch line.")
    traps = [words[2:] for words, _ in job.commands if words[:1] == ["trap"]]
    names = {w.strip("'\"").upper().removeprefix("SIG") for signals_ in traps for w in signals_}
    if not names & {spec.warning, str(int(getattr(signals, "SIG" + spec.warning)))}:
        return (f"nothing in the script traps SIG{spec.warning}: its default action ends bash, so the warning would "
                "end the batch shell and reach no training process. Fix: trap forward USR1, as in the template.")
    if launch.operator != "&":
        return ("torchrun runs in the foreground: bash runs a trap only once the command in front has ended, too late "
                "for the warning. Fix: end the launch line with & and wait for it, as in the template.")
    if not any(_command_word(fields) == "wait" for fields in job.after):
        return ("nothing waits for the launch in the background: the batch shell would reach its end at once, and "
                "Slurm ends the job with it. Fix: while ! wait $!; do kill -0 $! 2>/dev/null || break; done, as in "
                "the template.")
    return None


def script_problem(script: str, spec: JobSpec = JOB_SPEC) -> str | None:
    """The first mistake the script's text shows against the exercise (``spec``), as "problem. Fix: ...";
    None when the text is right."""
    if isinstance(script, str) and "\r" in script:
        return ("the script has DOS line breaks (\\r\\n): sbatch refuses such a script before it queues anything. "
                "Fix: save it with Unix line breaks (dos2unix, or your editor's line-ending setting).")
    try:
        return _job_problem(read_job_script(script, spec), spec)
    except _Problem as problem:
        return str(problem)


# ---------------------------------------------------------------------------------------------- answers' types


def _number_of(value) -> float:
    """One real number from an int, a float, a NumPy scalar or 0-d array, a 0-d tensor; ``_Problem`` saying what
    ``value`` is otherwise (None, a truth value, text, a list, an array of several, NaN, ...)."""
    if value is None:
        raise _Problem("is None")
    if isinstance(value, bool) or type(value).__name__ in ("bool_", "bool"):
        raise _Problem(f"is {value}, a truth value, not a number")
    if isinstance(value, (str, bytes)):
        raise _Problem(f"is text ({_show(repr(value))}), not a number: the quotes make it a string")
    shape = getattr(value, "shape", None)
    if shape is not None and not isinstance(value, numbers.Number):
        try:
            dims = tuple(shape)
        except Exception:
            dims = None
        if dims != ():
            raise _Problem(f"is {_kind(value)} of shape {dims}, not one number")
        try:
            item = value.item()
        except Exception:
            raise _Problem(f"is {_kind(value)}, not a number") from None
        return _number_of(item)
    if isinstance(value, numbers.Complex) and not isinstance(value, numbers.Real):
        raise _Problem("is a complex number")
    if not isinstance(value, numbers.Real):
        raise _Problem(f"is {_kind(value)}, not a number")
    try:
        number = float(value)
    except Exception:
        raise _Problem(f"is {_show(value)}, beyond what a float holds") from None
    if not math.isfinite(number):
        raise _Problem(f"is {number}")
    return number


def _gap_text(gap: str, value, exercise: str) -> str:
    """A gap's answer as the script's text: text as it is, a whole number (of any numeric type) as its digits."""
    if isinstance(value, str):
        if "\n" in value or "\r" in value:
            raise NotYet(f"✗ {exercise}: `{gap}` ({_show(value)}) holds a line break: what follows it would become "
                         "a line of its own in the script.", f"only what goes after --{gap.replace('_', '-')}=, on "
                         "one line.")
        words = _sbatch_arguments(value) if gap in DIRECTIVE_GAPS else []
        if len(words) > 1:
            flag = "--" + gap.replace("_", "-")
            raise NotYet(f"✗ {exercise}: `{gap}` ({_show(value)}) is {len(words)} words to sbatch: its #SBATCH line "
                         f"would take only {_show(words[0])} as the value.", f"one value for {flag}, without spaces.")
        return str(value)
    try:
        number = _number_of(value)
    except _Problem as problem:
        raise NotYet(f"✗ {exercise}: `{gap}` {problem}.", "each gap takes text or a whole number: what goes after "
                     f"its flag in the script, --{gap.replace('_', '-')}=...") from None
    if number != int(number):
        raise NotYet(f"✗ {exercise}: `{gap}` = {number:g} is not a whole number.",
                     f"what goes after --{gap.replace('_', '-')}= is text or a whole number.")
    return str(int(number))


def fill_job_script(answers: dict, exercise: str = EXERCISE) -> str:
    """``JOB_SCRIPT`` with the gaps filled from ``answers``; any gap still ``...`` leaves it unsolved."""
    unknown = [key for key in answers if key not in GAPS]
    missing = [gap for gap in GAPS if answers.get(gap, ...) is ...]
    if missing:
        also = f" (answers also has {', '.join(_show(k) for k in unknown)}, which is no gap)" if unknown else ""
        raise Unsolved(f"… {exercise}: not yet solved: fill {', '.join(missing)}{also}.",
                       "each is what goes after its flag in the script above.")
    if unknown:
        raise NotYet(f"✗ {exercise}: answers has {', '.join(_show(k) for k in unknown)}, which the script has no gap "
                     "for.", f"keep to the gaps: {', '.join(GAPS)}.")
    return JOB_SCRIPT.format(**{gap: _gap_text(gap, answers[gap], exercise) for gap in GAPS})


def _kit_failure(exercise: str, err: Exception) -> NotYet:
    """A bug of the check itself, still one line for the attendee (and a test failure for the kit)."""
    return NotYet(f"✗ {exercise}: the check itself failed on this answer ({type(err).__name__}: {_show(str(err))}).",
                  "this is a bug in the kit: tell the instructor, with your answer.")


# ---------------------------------------------------------------------------------------------- Exercise 6.1


def _judge_finished(job_id: str, output: Path, checkpoints: Path, result: Path, spec: JobSpec) -> str:
    """What the finished job shows: "" when everything is right, else the problem and its fix."""
    records = job_records(job_id)
    record = records[0] if records else {}
    state = record.get("JobState", "unknown (Slurm forgot the job)")
    log = output.read_text(errors="replace") if output.exists() else ""
    if state == "TIMEOUT":
        return (f"job {job_id} ran out of time (state TIMEOUT at its limit of {record.get('TimeLimit', '?')}). Fix: "
                "ask for more --time than the job needs, with room for the signal's lead time.")
    if state != "COMPLETED":
        last = [line for line in log.splitlines() if line.strip()][-1:] or ["no output"]
        return (f"job {job_id} ended {state}, exit code {record.get('ExitCode', '?')}: {_show(last[0], 200)}. Fix: "
                f"read {output.name}, the job's output.")
    nodes, cpus = _whole(record.get("NumNodes")), _whole(record.get("NumCPUs"))
    need = spec.nodes * spec.cores_per_task
    if nodes != spec.nodes or (cpus is not None and cpus < need):
        return (f"job {job_id} got {nodes} node(s) and {cpus} CPU(s), not the {spec.nodes} node(s) and {need} CPU(s) "
                "the exercise asks for. Fix: check the #SBATCH lines.")
    # Every rank is in the process group once it forms, and rank 0's record says how large it was. Each rank's
    # greeting says so too, but two ranks' lines may share one line of the log: they are searched, not anchored.
    try:
        world = json.loads(result.read_text())["metrics"]["world_size"]
    except (OSError, ValueError, KeyError, TypeError):
        world = None
    greeted = {int(rank) for rank, size in re.findall(r"rank (\d+) of (\d+) \(local rank", log)
               if int(size) == spec.ranks}
    if world != spec.ranks and greeted != set(range(spec.ranks)):
        said = f"trained with {world} process(es)" if world is not None else "wrote no result"
        return (f"job {job_id}: ranks {sorted(greeted) or 'none'} of the {spec.ranks} the exercise asks for said they "
                f"joined, and the run {said}. Fix: --nproc-per-node is the processes per node, --nnodes the nodes.")
    if not list(checkpoints.glob("*.pt")):
        return f"job {job_id} wrote no checkpoint into {checkpoints}. Fix: keep \"$@\" at the end of the launch line."
    return ""


def _refuse(exercise: str, problem: str):
    """A "problem. Fix: hint" line of the readers above, raised as the check's one-line answer."""
    said, _, fix = problem.partition(". Fix: ")
    raise NotYet(f"✗ {exercise}: {said}.", fix)


def _text_then_cluster(exercise: str, problem: str | None, reads_right: str, subject: str, prefix: str,
                       jobs_dir) -> Path | None:
    """First the text: a mistake is the check's one line. Then the cluster: without one, the check passes on
    the text and says so (None); with one, a new folder for the check's jobs (a check run twice keeps both)."""
    if problem:
        _refuse(exercise, problem)
    site = find_slurm()
    if not site.available:
        passed(exercise, f"{reads_right}; {site.line}, so {subject} not run here")
        return None
    folder = Path(jobs_dir or ".").resolve() / f"{prefix}-{uuid.uuid4().hex[:8]}"
    folder.mkdir(parents=True)
    return folder


@exercise_check
def check_job_script(script, jobs_dir=None, timeout_s: float = 300, exercise: str = EXERCISE) -> bool:
    """Read the script (or ``JOB_SCRIPT`` filled from a dict of answers) against ``JOB_SPEC``, then run it on the
    cluster when one answers, and judge what it did."""
    if script is ...:
        raise Unsolved(f"… {exercise}: not yet solved: fill the gaps of the job script.",
                       "each is what goes after its flag in the script.")
    try:
        if isinstance(script, dict):
            script = fill_job_script(script, exercise)
        elif not isinstance(script, str):
            raise NotYet(f"✗ {exercise}: the answer is {_kind(script)}: the check takes the dict of answers "
                         "(answers = dict(nodes=..., ...)) or the whole script as text.",
                         "fill the dict in the exercise cell and pass it.")
        problem = script_problem(script)
    except WorkshopError:
        raise
    except Exception as err:
        raise _kit_failure(exercise, err) from err
    folder = _text_then_cluster(exercise, problem, "the script reads right", "it was", "ex61", jobs_dir)
    if folder is None:
        return True
    spec = JOB_SPEC
    (folder / "job.sbatch").write_text(script)
    checkpoints, result = folder / "checkpoints", folder / "result.json"
    try:
        job_id = submit(folder / "job.sbatch", [*TRAINING, "--checkpoint-dir", str(checkpoints), "--out", str(result)],
                        cwd=folder, env=job_env(folder))
    except WorkshopError as err:
        said = _show(str(err.problem), 300)
        if "partition" in said.lower():
            raise NotYet(f"✗ {exercise}: sbatch refused the script: {said}",
                         "name a partition that sinfo lists, or leave --partition out for the default.") from None
        raise NotYet(f"✗ {exercise}: sbatch refused the script: {said}", "read sbatch's message above.") from None
    wait_for([job_id], timeout_s=timeout_s)
    output = next(folder.glob(f"*-{job_id}.out"), folder / f"slurm-{job_id}.out")
    problem = _judge_finished(job_id, output, checkpoints, result, spec)
    if problem:
        _refuse(exercise, problem)
    limit = time_limit_s(read_job_script(script, spec).directives.time)
    return passed(exercise, f"job {job_id} ({folder / 'job.sbatch'}) ran on {spec.nodes} node(s) with {spec.ranks} "
                            "ranks, wrote its checkpoints"
                            + (f", inside its {limit} s limit" if limit and limit != NO_LIMIT else ""))


# ---------------------------------------------------------------------------------------------- Exercise 6.2

SWEEP = "Exercise 6.2"
MAX_ARRAY_INDEX = 4_000_000  # Slurm's MaxArraySize is at most 4000001: no task id is larger


def _array_ranges(spec: str) -> tuple[list[range], int | None]:
    """``--array=SPEC`` as Slurm reads it: (ranges of task ids, the %K limit or None); ``_Problem`` if refused.

    "0-15", "0,6,16-32", "0-15:4" (every 4th), with "%K" at the end to run at most K tasks at a time."""
    body, percent, limit = spec.removeprefix("--array=").partition("%")
    if percent:
        count = _whole(limit) if re.fullmatch(r"[0-9]+", limit) else None
        if count is None:
            raise _Problem(f"--array={_show(spec)} is not a task list Slurm reads: %K takes a whole number. Fix: "
                           "FIRST-LAST%K, e.g. 0-2%2.")
        if count < 1:
            raise _Problem(f"--array={_show(spec)}: %{limit} would let {count} tasks run at a time. Fix: %K with K of "
                           "1 or more, or no % at all.")
    ranges = []
    for part in body.split(","):
        found = re.fullmatch(r"([0-9]+)(?:-([0-9]+)(?::([0-9]+))?)?", part)
        if not found:
            raise _Problem(f"--array={_show(spec)} is not a task list Slurm reads. Fix: FIRST-LAST, e.g. 0-2.")
        first = int(found.group(1))
        last = int(found.group(2)) if found.group(2) is not None else first
        step = int(found.group(3)) if found.group(3) is not None else 1
        if last < first or step < 1 or last > MAX_ARRAY_INDEX:
            raise _Problem(f"--array={_show(spec)} is not a task list Slurm reads (FIRST-LAST with FIRST <= LAST, "
                           f"a step of 1 or more, ids up to {MAX_ARRAY_INDEX}). Fix: FIRST-LAST, e.g. 0-2.")
        ranges.append(range(first, last + 1, step))
    return ranges, (int(limit) if percent else None)


def array_tasks(spec) -> list[int] | None:
    """The task ids of ``--array=SPEC`` ("0-2", "0-2%2", "0,1,2", "0-6:2"); None when Slurm would not read it."""
    if not isinstance(spec, str):
        return None
    try:
        ranges, _ = _array_ranges(spec)
    except _Problem:
        return None
    return sorted({task for r in ranges for task in r})


@functools.cache
def _train_flags() -> _Parser:
    """The flags of ``python -m workshop_utils.train``, from the same generator the command uses."""
    from ..spine.config_flags import add_config_flags

    parser = _Parser(prog="python -m workshop_utils.train", add_help=False)
    add_config_flags(parser)
    parser.add_argument("--global-batch-size", type=int, default=argparse.SUPPRESS)
    parser.add_argument("--out", default=argparse.SUPPRESS)
    return parser


def _sweep_line(number: int, line: str) -> float | None:
    """The learning rate a sweep file's line sets (None: it sets none), read as the task reads it: split at white
    space (``read -r -a``), then the training command's flags; ``_Problem`` where the command would stop."""
    shown = _show(line)
    if "\n" in line or "\r" in line:
        raise _Problem(f"line {number} ({shown}) holds a line break: the sweep file would get more lines than "
                       "tasks. Fix: one line of flags per learning rate.")
    if re.search(r"\{[A-Za-z_][\w.\[\]'\"]*\}", line):
        raise _Problem(f"line {number} ({shown}) still holds its braces: without the f in front, a string keeps "
                       "{lr} as it is; an f-string, f\"--lr {lr}\", puts the value in. Fix: "
                       "sweep_lines = [f\"--lr {lr}\" for lr in learning_rates].")
    try:
        flags = _train_flags().parse_args(line.split())
    except _Refusal as err:
        raise _Problem(f"line {number} ({shown}): python -m workshop_utils.train would stop with "
                       f"\"{_show(str(err))}\". Fix: flags as the command takes them, e.g. \"--lr 0.01\".") from None
    given = vars(flags)
    others = sorted(name for name, value in given.items() if value is not None and name != "lr")
    if others and given.get("lr") is not None:  # a line with no --lr is named with the others that have none
        flags_shown = ", ".join("--" + name.replace("_", "-") for name in others)
        raise _Problem(f"line {number} ({shown}) also sets {flags_shown}: a task's flags come after the sweep's shared "
                       "ones and override them, so that task would not be the same run at another learning rate. "
                       "Fix: only --lr on each line, e.g. \"--lr 0.01\".")
    lr = given.get("lr")
    return None if lr is None else float(lr)


def _learning_rates(values) -> list[float]:
    if isinstance(values, (str, bytes, dict)) or not hasattr(values, "__iter__"):
        raise _Problem(f"learning_rates is {_kind(values)}, not a few numbers. Fix: e.g. (0.01, 0.03, 0.1).")
    rates = []
    for value in values:
        try:
            rate = _number_of(value)
        except _Problem as problem:
            raise _Problem(f"a learning rate {problem}. Fix: learning_rates holds positive numbers.") from None
        if rate <= 0:
            raise _Problem(f"a learning rate of {rate:g}: it must be positive. Fix: learning_rates holds positive "
                           "numbers.")
        rates.append(rate)
    if not rates:
        raise _Problem("learning_rates is empty: a sweep needs a rate or more. Fix: e.g. (0.01, 0.03, 0.1).")
    return rates


def sweep_problem(lines, spec, values) -> str | None:
    """The first mistake in a sweep file's ``lines`` and its ``--array`` spec for the learning rates ``values``."""
    try:
        return _sweep_problem(lines, spec, _learning_rates(values))
    except _Problem as problem:
        return str(problem)


def _sweep_problem(lines, spec, values: list[float]) -> str | None:
    if lines is None or not isinstance(lines, (list, tuple)):
        what = "is None" if lines is None else f"is {_kind(lines)}"
        return (f"sweep_lines {what}: it must be a list of strings, one line of flags per task. Fix: e.g. "
                "[\"--lr 0.02\", ...].")
    wrong = next((k for k, line in enumerate(lines) if not isinstance(line, str)), None)
    if wrong is not None:
        return (f"sweep_lines must be a list of strings: line {wrong + 1} is {_kind(lines[wrong])}. Fix: one line of "
                "flags per task, e.g. [\"--lr 0.02\", ...].")
    if len(lines) != len(values):
        return (f"{len(lines)} line(s) for {len(values)} learning rates: the sweep file needs one line per task. "
                "Fix: one line per learning rate, in their order.")
    read = [_sweep_line(k + 1, line) for k, line in enumerate(lines)]
    missing = [k + 1 for k, lr in enumerate(read) if lr is None]
    if missing:
        return f"line(s) {missing} set no --lr: those tasks would all train with the default. Fix: --lr VALUE."
    if len(set(read)) < len(read):
        return (f"the lines set learning rates {read}: some tasks train the same run twice. Fix: one learning "
                "rate per line.")
    if read != values:
        return f"the lines set {read}, not {values}. Fix: the learning rates in their given order."
    if not isinstance(spec, str):
        return (f"`array` is {_kind(spec)}: it is the text that goes after --array=, e.g. \"0-{len(lines) - 1}\". "
                "Fix: FIRST-LAST, as text.")
    ranges, _ = _array_ranges(spec)
    wanted = list(range(len(lines)))
    count = sum(len(r) for r in ranges)
    if count > 10 * len(lines) + 100:
        return (f"--array={_show(spec)} starts {count} tasks for {len(lines)} lines: task i reads line i+1 of the "
                f"sweep file. Fix: --array=0-{len(lines) - 1} (with %K to run at most K at a time).")
    tasks = sorted({task for r in ranges for task in r})
    if tasks != wanted:
        beyond = [t for t in tasks if t >= len(lines)]
        unread = [t for t in wanted if t not in tasks]
        said = (f"task(s) {beyond} would find no line in the sweep file" if beyond else
                f"line(s) {[t + 1 for t in unread]} would never train")
        return (f"--array={_show(spec)} starts tasks {tasks}: task i reads line i+1 of the sweep file, so {said}. Fix: "
                f"--array=0-{len(lines) - 1} (with %K to run at most K at a time).")
    return None


@exercise_check
def check_array_sweep(sweep_lines, array, values, config, jobs_dir=None, timeout_s: float = 300,
                      exercise: str = SWEEP) -> bool:
    """Read the sweep file's lines and the array spec; where Slurm answers, run the array, gather it with a job
    that waits for it, and check one result per learning rate."""
    from .slurm_jobs import SCRIPT_FIELDS, config_flags, gather_array, template

    if sweep_lines is ... or array is ...:
        raise Unsolved(f"… {exercise}: not yet solved: write sweep_lines and array.",
                       "one line of flags per learning rate; --array names the task ids.")
    try:
        problem = sweep_problem(sweep_lines, array, values)
    except WorkshopError:
        raise
    except Exception as err:
        raise _kit_failure(exercise, err) from err
    if problem:
        _refuse(exercise, problem)
    folder = _text_then_cluster(exercise, None, f"{len(sweep_lines)} tasks read their lines", "they were", "ex62",
                                jobs_dir)
    if folder is None:
        return True
    (folder / "sweep.txt").write_text("\n".join(sweep_lines) + "\n")
    shared = config_flags(config, skip=(*SCRIPT_FIELDS, "lr"))
    env = job_env(folder)  # WORKSHOP_RUNS: the tasks' results go to <folder>/wu-sweep-<array id>/
    job_id = submit(template("train_array.sbatch"), ["sweep.txt", *shared],
                    [f"--array={array.removeprefix('--array=')}", "--cpus-per-task=1", "--time=00:10:00",
                     "--output=%x-%A_%a.out"], cwd=folder, env=env)
    code = "import sys, workshop_utils as wu; print(wu.gather_array(*sys.argv[1:]).to_string(index=False))"
    gather = submit(None, options=[f"--dependency=afterok:{job_id}", "--job-name=ex62-gather", "--time=00:05:00",
                                   "--output=%x-%j.out",
                                   "--wrap=" + " ".join(shlex.quote(a) for a in ["python", "-c", code,
                                                                                  f"wu-sweep-{job_id}",
                                                                                  f"wu-sweep-{job_id}/sweep.csv"])],
                    cwd=folder, env=env)
    wait_for([job_id, gather], timeout_s=timeout_s)
    table = folder / f"wu-sweep-{job_id}" / "sweep.csv"
    if not table.exists():
        raise NotYet(f"✗ {exercise}: the gather job {gather} wrote no {table.name}: a task of array {job_id} failed.",
                     f"read the tasks' output files in {folder}.")
    gathered = gather_array(table.parent)
    rates = sorted(float(v) for v in gathered["lr"]) if "lr" in gathered else []
    if rates != sorted(_learning_rates(values)):
        raise NotYet(f"✗ {exercise}: the gathered table holds learning rates {rates}, not {sorted(values)}.",
                     f"read {table}.")
    return passed(exercise, f"array {job_id}: {len(gathered)} tasks, one per learning rate, gathered by job {gather}")


# ---------------------------------------------------------------------------------------------- Exercise 6.3

USAGE = "Exercise 6.3"
TIME_MARGIN, MEMORY_MARGIN = 1.5, 1.25  # the next request: what the job used, with room to spare
ANSWERS = ("cpu_efficiency", "time_share", "gpu_hours", "next_time_limit_s", "next_memory_mib")
USAGE_KEYS = ("elapsed_s", "time_limit_s", "cpus", "gpus", "cpu_time_s", "max_rss_mib")
# A second job to judge the attendee's arithmetic on: several CPUs and GPUs, and numbers for which every named
# mistake gives another answer (the notebook's own job has one CPU and no GPU).
OTHER_JOB = {"job": "another job", "elapsed_s": 5410, "time_limit_s": 7200, "cpus": 8, "gpus": 4,
             "cpu_time_s": 25968.0, "max_rss_mib": 23500.0, "source": "made up: 8 CPUs and 4 GPUs for 1.5 hours"}


def next_request(usage: dict) -> tuple[int, int]:
    """(seconds, MiB) to ask for next time: 1.5 x the elapsed time in whole minutes, 1.25 x the peak memory in
    whole 100 MiB."""
    return (60 * math.ceil(TIME_MARGIN * usage["elapsed_s"] / 60),
            100 * math.ceil(MEMORY_MARGIN * usage["max_rss_mib"] / 100))


def _usage_numbers(usage) -> dict:
    """The job's use as plain numbers; ``WorkshopError`` for what ``lesson.usage`` would never return."""
    if not isinstance(usage, dict):
        raise WorkshopError(f"usage is {_kind(usage)}, not what lesson.usage(job) returns.",
                            "pass the dict that lesson.usage(job) returned.")
    read = {}
    for key in USAGE_KEYS:
        try:
            read[key] = _number_of(usage.get(key))
        except _Problem as problem:
            raise WorkshopError(f"usage[{key!r}] {problem}: not what lesson.usage(job) returns.",
                                "pass the dict that lesson.usage(job) returned.") from None
    if min(read["elapsed_s"], read["time_limit_s"], read["cpus"], read["max_rss_mib"]) <= 0 or min(
            read["gpus"], read["cpu_time_s"]) < 0:
        raise WorkshopError(f"usage {_show({k: usage.get(k) for k in USAGE_KEYS}, 200)} holds a count or time below "
                            "what a finished job can have.", "pass the dict that lesson.usage(job) returned.")
    return read


def _answer(value, exercise: str, name: str) -> float:
    """An answer as one number, or ``NotYet`` saying what it is instead (``Unsolved`` for the placeholder)."""
    require_answered(value, exercise, f"`{name}` is still the placeholder `...`.",
                     "replace the `...` in the exercise cell with your code, run that cell, then this one.")
    try:
        return _number_of(value)
    except _Problem as problem:
        raise NotYet(f"✗ {exercise}: `{name}` {problem}.",
                     f"assign one number to `{name}` (an int, a float, or a tensor's .item()).") from None


def _judge_usage(answers: dict, usage: dict, exercise: str) -> None:
    """Each answer against the same arithmetic on ``usage``: the usual mistakes named, then the bounds that any
    right answer keeps, then the value shown (never the answer) with the formula's hint."""
    elapsed, cpus, gpus, limit = usage["elapsed_s"], usage["cpus"], usage["gpus"], usage["time_limit_s"]
    busy = usage["cpu_time_s"] / elapsed  # cores kept busy on average
    right_time, right_memory = next_request(usage)

    def check(name, right, mistakes, bounds, hint, rel=1e-3, abs_tol=0.0):
        value = answers[name]
        name_mistake(value, right, exercise, name, mistakes, rel, abs_tol)
        inside, why, fix = bounds
        if not inside(value) and inside(right):
            raise NotYet(f"✗ {exercise}: `{name}` = {value:.4g}: {why}", fix)
        judge(value, right, exercise, name, [], hint, rel, abs_tol)

    check("cpu_efficiency", busy / cpus, [
        (busy, "that is the cores kept busy on average; efficiency divides by the cores allocated.",
         "cpu_time_s / (elapsed_s x cpus)."),
        (100 * busy / cpus, "a percentage: keep it a share between 0 and 1.", "drop the x 100."),
    ], (lambda v: 0 <= v <= 1, "a share of the allocated core-seconds lies between 0 and 1.",
        "cpu_time_s / (elapsed_s x cpus)."),
        "cpu_time_s / (elapsed_s x cpus): the share of the allocated core-seconds that computed.")
    check("time_share", elapsed / limit, [
        (limit / elapsed, "upside down: the share of the limit the job used is below 1.", "elapsed_s / time_limit_s."),
        (100 * elapsed / limit, "a percentage: keep it a share between 0 and 1.", "drop the x 100."),
    ], (lambda v: 0 <= v <= 1, "a finished job used between none and all of its time limit.",
        "elapsed_s / time_limit_s."), "elapsed_s / time_limit_s.")
    check("gpu_hours", elapsed * gpus / 3600, [
        (elapsed * gpus, "GPU-seconds: an hour has 3,600 of them.", "divide by 3600."),
        (elapsed / 3600, "the job's hours, not its GPU-hours: every GPU it held counts.", "multiply by gpus."),
        (elapsed * gpus / 60, "GPU-minutes: an hour has 3,600 seconds.", "divide elapsed_s x gpus by 3600."),
    ], (lambda v: v >= 0, "a charge is never negative.", "elapsed_s x gpus / 3600."),
        "elapsed_s x gpus / 3600 (0 for a job without GPUs).", abs_tol=1e-9)
    check("next_time_limit_s", right_time, [
        (TIME_MARGIN * elapsed, "not rounded up to whole minutes: Slurm's limits are minutes.",
         "60 x ceil(1.5 x elapsed_s / 60)."),
        (60 * math.ceil(TIME_MARGIN * limit / 60), "that grows the old limit; the new one comes "
         "from what the job used.", "start from elapsed_s, not time_limit_s."),
        (math.ceil(TIME_MARGIN * elapsed / 60), "minutes: the answer is in seconds.", "multiply by 60."),
    ], (lambda v: v > 0 and v % 60 == 0, "Slurm's time limits are whole minutes, so seconds that are a multiple "
        "of 60.", "60 x ceil(1.5 x elapsed_s / 60)."), "60 x ceil(1.5 x elapsed_s / 60).", rel=0)
    check("next_memory_mib", right_memory, [
        (MEMORY_MARGIN * usage["max_rss_mib"], "not rounded up to whole 100 MiB.",
         "100 x ceil(1.25 x max_rss_mib / 100)."),
        (100 * math.ceil(usage["max_rss_mib"] / 100), "no room to spare: the next run's peak can be higher.",
         "1.25 x the peak, then round up."),
    ], (lambda v: v > 0 and v % 100 == 0, "the request is in whole 100 MiB.",
        "100 x ceil(1.25 x max_rss_mib / 100)."), "100 x ceil(1.25 x max_rss_mib / 100).", rel=0)


_RERUNNING = False  # the exercise cell is being run again: a check inside it must not run it once more


def _exercise_cell() -> tuple[str, dict] | tuple[None, None]:
    """The latest notebook cell that assigns every answer of 6.3, and the notebook's namespace, from IPython's
    input history (``_ih`` in the namespace of the cell that called the check); (None, None) outside IPython."""
    frame = sys._getframe(1)
    for _ in range(40):
        if frame is None:
            return None, None
        history = frame.f_globals.get("_ih")
        if isinstance(history, list):
            break
        frame = frame.f_back
    else:
        return None, None
    for source in reversed(history):
        if not isinstance(source, str):
            continue
        try:
            tree = ast.parse(source)
        except (SyntaxError, ValueError):
            continue
        if any(isinstance(node, ast.Attribute) and node.attr == "check_job_usage" or isinstance(node, ast.Name)
               and node.id == "check_job_usage" for node in ast.walk(tree)):
            continue
        stored = {node.id for node in ast.walk(tree) if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store)}
        if set(ANSWERS) <= stored:
            return source, frame.f_globals
    return None, None


def _run_cell(cell: str, namespace: dict, usage: dict) -> dict | None:
    """The answers the cell computes from ``usage`` (run in a copy of ``namespace``, its printing kept); None when
    the cell cannot be run again apart from the notebook (it sets ``usage`` itself, or fails)."""
    global _RERUNNING
    try:
        tree = ast.parse(cell)
    except (SyntaxError, ValueError):
        return None
    if any(isinstance(node, ast.Name) and node.id == "usage" and isinstance(node.ctx, ast.Store)
           for node in ast.walk(tree)):
        return None
    scope = {"__builtins__": builtins, **namespace, "usage": dict(usage)}
    _RERUNNING = True
    try:
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            exec(compile(tree, "<Exercise 6.3, run again>", "exec"), scope)
    except KeyboardInterrupt:
        raise
    except BaseException:
        return None
    finally:
        _RERUNNING = False
    try:
        return {name: _number_of(scope.get(name)) for name in ANSWERS}
    except _Problem:
        return None


@exercise_check
def check_job_usage(cpu_efficiency, time_share, gpu_hours, next_time_limit_s, next_memory_mib, usage: dict,
                    exercise: str = USAGE, cell: str | None = None) -> bool:
    """Each answer against the same arithmetic on ``usage``, the usual mistakes named; then, where the exercise
    cell can be run again (``cell``, by default the notebook's latest cell that assigns all five answers), the
    cell's answers for ``OTHER_JOB``, where a missing division by the CPUs or a GPU count left out shows."""
    given = dict(zip(ANSWERS, (cpu_efficiency, time_share, gpu_hours, next_time_limit_s, next_memory_mib)))
    try:
        answers = {name: _answer(value, exercise, name) for name, value in given.items()}
        read = _usage_numbers(usage)
        _judge_usage(answers, read, exercise)
        namespace: dict = {}
        if cell is None and not _RERUNNING:
            cell, namespace = _exercise_cell()
        again = _run_cell(cell, namespace or {}, usage) if isinstance(cell, str) and not _RERUNNING else None
        judged_elsewhere = False
        # Only a cell that gives the answers passed here, run on the same job, speaks for them on another job;
        # and only one whose answers move with the job: a cell that reads earlier variables, not `usage`, cannot.
        if again is not None and all(math.isclose(again[n], answers[n], rel_tol=1e-9, abs_tol=1e-12) for n in ANSWERS):
            other = _run_cell(cell, namespace or {}, OTHER_JOB)
            if other is not None and not all(math.isclose(other[n], again[n], rel_tol=1e-9, abs_tol=1e-12)
                                             for n in ANSWERS):
                _judge_usage(other, _usage_numbers(OTHER_JOB), f"{exercise} (your cell, run on another job: "
                                                               f"{OTHER_JOB['cpus']} CPUs, {OTHER_JOB['gpus']} GPUs)")
                judged_elsewhere = True
    except WorkshopError:
        raise
    except Exception as err:
        raise _kit_failure(exercise, err) from err
    elapsed, cpus = read["elapsed_s"], read["cpus"]
    right_time, right_memory = next_request(read)
    busy = read["cpu_time_s"] / elapsed
    caveat = ""
    if not judged_elsewhere and (cpus == 1 or read["gpus"] == 0):
        caveat = ("; judged on this job alone, whose 1 CPU or 0 GPUs cannot show a missing / cpus or x gpus: "
                  "compute each answer from `usage` in one cell, so the check can run it on another job")
    return passed(exercise, f"{100 * busy / cpus:.0f}% of {cpus:g} core(s) busy, "
                            f"{100 * elapsed / read['time_limit_s']:.0f}% of the time limit used; next time ask "
                            f"--time={right_time // 60} --mem={right_memory}M{caveat}")
