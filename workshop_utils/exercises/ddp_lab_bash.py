"""Exercise 2.2's launch line run by a restricted bash with recording stand-ins alone on PATH, traced on a descriptor
of its own; what it ran, read back as a ``BashRun`` that ``ddp_lab_launch`` judges."""

from __future__ import annotations

import contextlib
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import NamedTuple

import psutil

# All bash finds on PATH: srun and env run the stand-in named (VAR=value set; srun's own options recorded); nohup,
# nice, stdbuf and timeout are coreutils' own, kept to the stand-ins; torchrun and python record; module (ml) and
# conda, which set up the environment before a launch, do nothing.
LAUNCHERS = ("torchrun", "python", "python3", f"python3.{sys.version_info.minor}")
TOOLS = ("srun", "env", "nohup", "nice", "stdbuf", "timeout", "module", "ml", "conda", "mamba", "micromamba")
STAND_INS = LAUNCHERS + TOOLS
# What the dynamic loader reads to load a library or write a file, in the stand-ins and the tools they run:
# readonly in the line's bash, refused by env and srun.
LOADER_VARIABLES = ("LD_PRELOAD", "LD_LIBRARY_PATH", "LD_AUDIT", "LD_DEBUG", "LD_DEBUG_OUTPUT", "LD_PROFILE",
                    "LD_PROFILE_OUTPUT", "GCONV_PATH")
# The folders and the exit code are written into the text, not read from the environment, which the line sets;
# bash -p reads no BASH_ENV, SHELLOPTS or function from it. A launch run with & shows three ways. POSIX starts it with
# SIGINT ignored (the check starts bash with it at its default): bash does so for a program it runs with & itself, not
# inside a list, a group, a function or eval run with &. Every such command gets /dev/null as its input: that tells,
# where the line names no null of its own (the check gives bash a file). bash's own $! (the launch, or the subshell it
# runs in) tells the rest; and where /proc is, so does a shell above the stand-in with SIGINT ignored (bash forks one
# for a list, a group or a subshell run with &, whatever input the line then gives the launch).
# The kernel's own programs by their paths are their stand-ins there too.
STAND_IN = r"""#!@BASH@ -p
tools=@TOOLS@ record=@RECORD@ NO_LOADER="the check's shell loads no library a line names"
case ${0##*/} in
srun|env|nohup|nice|stdbuf|timeout) printf '%s\0' "${0##*/}" "$@" > "$record/$$.tool" ;;&  # what it started, below
nohup|nice|stdbuf|timeout)
    # The real tool reads its own options and runs the next word from PATH, a stand-in: never a program by its path.
    for ((at = 1; at <= $#; at++)); do
        word=${!at}
        [[ $word == */* && ${word%/*} -ef @KERNEL_BIN@ && -f $tools/${word##*/} ]] &&
            { set -- "${@:1:at-1}" "${word##*/}" "${@:at+1}"; break; }  # the kernel's own by its path: by its name
        [[ $word != */* && -f $tools/$word ]] && break
        [[ $word == */* ]] && { echo "$word: the check runs no program by its path" >&2; exit 127; }
    done
    real=$(PATH=@SYSTEM_PATH@ type -P "${0##*/}") || { echo "${0##*/}: not installed here" >&2; exit 127; }
    exec -a "${0##*/}" "$real" "$@" ;;
srun|env)
    # srun's own options are read from its record; env takes NAME=value and -u NAME alone: its first other word is
    # the program it runs
    me=${0##*/} NO_PATH="leaves the launch no PATH to find torchrun"
    [[ $me == srun ]] && printf '%s\0' "$@" > "$record/$$.srun"
    while (( $# )); do
        word=$1
        [[ $word == */* && ${word%/*} -ef @KERNEL_BIN@ && -f $tools/${word##*/} ]] && word=${word##*/}
        [[ $word != */* && -f $tools/$word ]] && exec "$tools/$word" "${@:2}"
        [[ $word =~ ^(@LOADER@)= ]] && { echo "$me: ${word%%=*}: $NO_LOADER" >&2; exit 125; }
        [[ $me == env ]] && case $word in
            -uPATH|--unset=PATH|PATH=*) echo "env: $word: $NO_PATH" >&2; exit 125 ;;
            -u|--unset) [[ ${2-} == PATH ]] && { echo "env: $word PATH: $NO_PATH" >&2; exit 125; }
                shift ;;
            -u?*|--unset=*|--) ;;
            -*) echo "env: $word: the check's env takes NAME=value and -u NAME alone" >&2; exit 125 ;;
            *=*) ;;
            */*) echo "$word: the check runs no program by its path" >&2; exit 127 ;;
            *) echo "$word: command not found" >&2; exit 127 ;;
        esac
        [[ $word =~ ^[A-Za-z_][A-Za-z0-9_]*= && ! $word =~ ^(LAB_|BASH_ENV=|ENV=|SHELLOPTS=|BASHOPTS=|PATH=) ]] &&
            export "$word"
        shift
    done
    exit 0 ;;
module|ml|conda|mamba|micromamba) exit 0 ;;  # what they are asked to do is read from the trace
esac
how=
[[ $(trap -p INT) ]] && how=background
(( @NULL_MEANS_AND@ )) && [[ /dev/stdin -ef /dev/null ]] && how=background  # what bash gives a command run with &
up=$PPID  # a list, a group or a subshell run with &: bash ignores SIGINT in the shell it forks for it
while [[ $how != background* && -r /proc/$up/stat ]]; do  # up to the line's bash, the first of its session
    read -r stat < "/proc/$up/stat"; read -r _ parent _ session _ <<< "${stat##*) }"
    (( up == session || up <= 1 )) && break
    while read -r key value; do [[ $key == SigIgn: ]] && break; done < "/proc/$up/status"
    (( 0x${value:-0} & 2 )) && how=background
    up=$parent
done
[[ -p /dev/stdin || -p /dev/stdout ]] && how+=" pipe"
[[ -e /dev/fd/1 && -e /dev/fd/2 ]] || how+=" closed"  # bash checks the descriptors themselves
printf '%s\0' "$how" "$PPID" "$LAB_CD" "${0##*/}" "$@" > "$record/$$.argv"
for name in $(compgen -e); do printf '%s=%s\0' "$name" "${!name}"; done > "$record/$$.env"
# A shell the line left beside the launch when the subshell that forked it ended (`(echo hi &); torchrun ...`) is
# waited for by nothing: it traces what it runs before the launch is recorded, however the machine schedules it.
# Not a loop (past @FORK_TICKS@ clock ticks of CPU), which the check stops when the line ends; and not past the line's
# time, should nothing stop the line then.
if read -r stat < "/proc/$$/stat"; then
    read -r _ up _ session _ <<< "${stat##*) }"
    mine=" $session "  # the shells above the launch (its own, orphaned: `({ torchrun ...; } &)`) and the line's bash
    while (( up > 1 && up != session )) && read -r stat < "/proc/$up/stat"; do
        mine+="$up "
        read -r _ up _ <<< "${stat##*) }"
    done
    while (( SECONDS < @LINE_TIMEOUT_S@ )); do
        left=
        for file in /proc/[0-9]*/stat; do
            pid=${file#/proc/}
            [[ $mine != *" ${pid%/stat} "* ]] && read -r stat < "$file" 2>/dev/null &&
                [[ ${stat#* (} == "bash) "* ]] || continue
            read -ra f <<< "${stat##*) }"  # state, parent, group, session, ..., user and system CPU at 11, 12
            [[ ${f[3]} == "$session" && ${f[0]} != Z ]] && (( f[11] + f[12] < @FORK_TICKS@ )) &&
                ! [[ -r /proc/${f[1]}/stat && $(< "/proc/${f[1]}/stat") =~ \)\ .\ [0-9]+\ [0-9]+\ $session\  ]] \
                && { left=1; break; }
        done
        [[ $left ]] || break
        PATH=@SYSTEM_PATH@ sleep 0.01
    done
fi
echo "# launched $$" >> "$record/trace"
exit @EXIT@
"""
# Before the line: 1 MiB of output and 256 MiB of memory at most; cd and pushd move LAB_CD (a restricted bash has no
# cd) to a folder that exists; /usr/bin/env is env, and the kernel's own Python and torchrun by their paths
# (f"{sys.executable} -m ...") are python and torchrun; source (a venv's activate, conda's) reads nothing, and ends the
# line where there is no such file; exec runs its command and ends the line (a restricted bash has no exec); every
# command first waits for those in the background (so does the end): the trace is in order. Nothing the line does
# hides a command from the trace or an & from the end: the trace has a descriptor of its own (BASH_XTRACEFD; a line
# that redirects one above 2 is refused), these functions, PS4 (which names a command's function) and BASH_CMDS
# (bash's table of where commands are) are readonly, and the builtins that would change what runs around a launch are
# off (enable too, so that nothing turns them back on). set stays, for what a Slurm script sets before a launch (stop
# on an error, an unset variable or a failed pipe; trace): its other words are refused, as the trace shows them.
OFF_BUILTINS = ("kill", "shopt", "trap", "ulimit", "hash", "history", "enable")
KERNEL_BIN = Path(sys.executable).parent
BY_PATH = {**{str(KERNEL_BIN / name): name for name in ("torchrun", "python3", "python")
              if (KERNEL_BIN / name).exists()}, sys.executable: "python"}  # the kernel's own: that name's stand-in
OUTPUT_LIMIT = 2**20  # bytes of the line's trace
PRELUDE_END = f'enable -n {" ".join(OFF_BUILTINS)}'  # the prelude's last command, traced; then the line's
PRELUDE = (f'ulimit -f {OUTPUT_LIMIT >> 10} -v 262144; '  # bash counts KiB
           'cd() { while [[ ${1-} == -[LPe@]* ]]; do shift; done; [[ ${1-} == -- ]] && shift; '
           '(( $# < 2 )) || { echo "cd: too many arguments" >&2; return 1; }; local to=${1-$HOME}; '
           '[[ $to ]] || return 0; [[ $to == /* ]] || to=$LAB_CD/$to; '
           '[[ -d $to ]] || { echo "cd: $1: No such file or directory" >&2; return 1; }; LAB_CD=$to; }; '
           'pushd() { [[ ${1-} == -- ]] && shift; (( $# == 1 )) || { echo "pushd: no other directory" >&2; '
           'return 1; }; cd "$1"; }; /usr/bin/env() { env "$@"; }; /bin/env() { env "$@"; }; '
           'source() { [[ ${1-} == -- ]] && shift; local file=${1-}; [[ $file == activate ]] && return; '
           '[[ $file == /* ]] || file=$LAB_CD/$file; '
           '[[ -f $file ]] || { echo "bash: ${1-}: No such file or directory" >&2; exit 1; }; }; '
           '.() { source "$@"; }; '
           'exec() { while [[ ${1-} == -* ]]; do [[ $1 == -- ]] && { shift; break; }; [[ $1 =~ ^-[cl]*a?$ ]] || '
           '{ echo "bash: exec: $1: invalid option" >&2; exit 2; }; [[ $1 == *a ]] && shift; shift; done; '
           '(( $# )) || return 0; [[ $1 == */* || $(type -t "$1") == file ]] || '
           '{ echo "bash: exec: $1: not found" >&2; exit 127; }; "$@"; exit; }; '
           + "".join(f'{path}() {{ {name} "$@"; }}; ' for path, name in BY_PATH.items() if shlex.quote(path) == path)
           + f'readonly {" ".join(LOADER_VARIABLES)}; '
           + 'trap wait DEBUG; lab_end() { [[ ${!-} ]] && echo "# background $!" >&2; wait; }; trap lab_end EXIT; '
           "readonly -f $(compgen -A function); readonly PS4='+${FUNCNAME:+[$FUNCNAME]} ' BASH_XTRACEFD=@TRACE@ "
           "BASH_CMDS FUNCNAME; builtin set -x; "
           f'{PRELUDE_END}\n')
# the check's own functions, whose commands are no part of the line
LAB_FUNCTIONS = ("cd", "pushd", "/usr/bin/env", "/bin/env", "source", ".", "exec", *BY_PATH, "lab_end")
TRACED = re.compile(r"\++(?:\[(.*?)\])? (.*)")  # a command bash ran, nested as deep as the +, in a function
# the check's, at the line's own level (exit ends the line, as the check's exec does; the DEBUG trap's wait)
LAB_COMMANDS = ("exit", "lab_end", "wait", PRELUDE_END)
ASSIGNS = ("export", "declare", "typeset", "local", "readonly", "unset")  # the builtins that set what they name
ASSIGNMENT = re.compile(r"([A-Za-z_]\w*)(\[[^\]]*\])?\+?=")  # NAME=, NAME+=, NAME[key]= in front of a command
LINE_TIMEOUT_S = 20  # bash's time to run the line, each of its two runs
FORK_CPU_S = 0.1  # the CPU seconds past which a bash the line left in the background is a loop, not a fork
BASH_OWN = ("PWD", "OLDPWD", "SHLVL", "_", "BASH_XTRACEFD", "SHELLOPTS", "BASHOPTS")
TIMED_OUT = "did not end within"


class BashRun(NamedTuple):
    """What bash did with the line (the check's own commands left out)."""

    # each launch: its folder, its words, the variables the line gave it, srun's own arguments where srun started it
    launches: list[tuple[str, list[str], dict, list[str] | None]]
    after: list[str]  # the commands after the launch
    background: str  # what ran with &: "launch", "other" (bash's $! was set), or ""
    said: str  # bash's first complaint
    complaints: list[str]
    commands: list[str]  # every command it ran (its trace)
    cut: bool  # bash sent its trace back to stderr: the line moved the trace's descriptor
    closed: bool = False  # a launch ran with its output or its errors closed
    strays: tuple[str, ...] = ()  # what a tool (srun, env, nohup, ...) was given that started no stand-in
    functions: frozenset = frozenset()  # the line's own functions that ran


def run_in_bash(line: str, launches_torchrun) -> BashRun:
    """``line`` run by a restricted bash with the stand-ins alone on PATH, twice: the launch succeeding, then failing,
    so that what follows an ``&&`` or an ``||`` runs; ``launches_torchrun(words)`` tells a launch run with &."""
    launches, after, background, complaints, commands, full, cut, closed = [], [], "", [], [], "", False, False
    strays, functions = [], set()
    bash = shutil.which("bash") or "/bin/bash"
    with tempfile.TemporaryDirectory() as folder:
        (stdin := Path(folder, "stdin")).touch()  # a file, so that a pipe or /dev/null into torchrun shows
        for code in (0, 1):
            (tools := Path(folder, f"run{code}", "bin")).mkdir(parents=True)
            record = tools.parent
            for name in STAND_INS:
                (tools / name).write_text(_stand_in(bash, tools, code, line))
                (tools / name).chmod(0o755)
            base = {"PATH": str(tools), "HOME": os.path.expanduser("~"), "LAB_CD": os.getcwd()}
            trace = os.open(record / "trace", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
            with open(record / "said", "a") as errors, open(record / "out", "a") as out, open(stdin) as nothing:
                ran, outlived = _ran_to_the_end([bash, "--norc", "--noprofile", "-r", "-c", PRELUDE.replace(
                    "@TRACE@", str(trace)) + line], base, Path(base["LAB_CD"]), nothing, out, errors, trace,
                    str(tools))  # ulimit -f keeps the files small
            os.close(trace)
            if not ran:
                return BashRun([], [], "", f"{TIMED_OUT} {LINE_TIMEOUT_S} s", [], [], False)
            trace_text = (record / "trace").read_text(errors="replace")
            order = re.findall(r"^# launched (\d+)$", trace_text, re.M)  # as the stand-ins started
            # bash's own complaints where the line sent its errors to its output (2>&1 > log): bash names itself
            stderr = (record / "said").read_text(errors="replace").replace(folder, "…") + "".join(
                said + "\n" for said in (record / "out").read_text(errors="replace").replace(folder, "…").splitlines()
                if said.startswith(f"{bash}: "))  # bash names itself as started: by its path
            if max((record / name).stat().st_size for name in ("said", "out", "trace")) >= OUTPUT_LIMIT:
                full = f"it ran on until its trace filled the check's {OUTPUT_LIMIT >> 20} MiB: a loop?"
            before, _, traced = re.sub(r"^# launched \d+$", "# launched", trace_text, flags=re.M).partition(
                "# launched\n")
            # bash sends its trace back to stderr when a command moves the trace's descriptor (lab_end's, at
            # least, is traced after it)
            cut = cut or any(map(TRACED.fullmatch, stderr.splitlines()))
            functions |= {found.group(1) for found in map(TRACED.fullmatch, trace_text.splitlines())
                          if found and found.group(1) and found.group(1) not in LAB_FUNCTIONS}
            for part, lines in ((commands, before + traced), (after, traced)):
                part += [found.group(2) for found in map(TRACED.fullmatch, lines.splitlines()) if found and
                         found.group(1) not in LAB_FUNCTIONS and found.group(2) not in LAB_COMMANDS]
            last = re.search(r"^# background (\d+)$", stderr, re.M)  # lab_end's: the last command bash ran with &
            background = background or "other" * bool(last or outlived)  # & in a subshell: no $! here
            complaints += [re.sub(r"^.*?line \d+: ", "", t) for t in stderr.splitlines() if t[:1] not in "+#"]
            started = set()  # a stand-in started by a tool: the tool's own process (exec), or its child (timeout)
            for argv in record.glob("*.argv"):
                started |= {argv.stem, (argv.read_text(errors="surrogateescape").split("\0") + ["", ""])[1]}
            # a tool that started no stand-in ran something else
            strays += [shlex.join(_words(tool)) for tool in record.glob("*.tool") if tool.stem not in started]
            for pid in order:
                argv = record / f"{pid}.argv"
                fields = _words(argv) if argv.exists() else []
                if len(fields) < 4:  # a stand-in stopped while writing it (the line's own ulimit -f)
                    continue
                how, parent, cwd, *words = fields
                if "background" in how or last and last.group(1) in (argv.stem, parent):
                    background = "launch" if launches_torchrun(words) else background or "other"
                after += ["a pipe"] * ("pipe" in how)
                closed = closed or "closed" in how
                env = _words(argv.with_suffix(".env"))
                srun = argv.with_suffix(".srun")  # srun execs the launch: the same process
                if code == 0:
                    launches.append((cwd, words, {k: v for k, _, v in (e.partition("=") for e in env)
                                                  if k not in {"LAB_CD", *BASH_OWN} and base.get(k) != v},
                                     _words(srun) if srun.exists() else None))
    return BashRun(launches, list(dict.fromkeys(after)), background, full or next(iter(complaints), ""), complaints,
                   commands, cut, closed, tuple(dict.fromkeys(strays)), frozenset(functions))


def _stand_in(bash: str, tools: Path, code: int, line: str) -> str:
    """STAND_IN with one run's values written in."""
    values = {"BASH": bash, "EXIT": str(code), "LINE_TIMEOUT_S": str(LINE_TIMEOUT_S),
              "TOOLS": shlex.quote(str(tools)), "RECORD": shlex.quote(str(tools.parent)),
              "SYSTEM_PATH": shlex.quote(os.defpath.strip(":") or "/usr/bin:/bin"),
              "KERNEL_BIN": shlex.quote(str(KERNEL_BIN)), "LOADER": "|".join(LOADER_VARIABLES),
              "FORK_TICKS": str(round(FORK_CPU_S * os.sysconf("SC_CLK_TCK"))),
              # a line that names a null of its own: /dev/null as input no longer tells a launch run with &
              "NULL_MEANS_AND": str(int("null" not in line))}
    return re.sub(r"@([A-Z_]+)@", lambda found: values[found.group(1)], STAND_IN)


def _words(path: Path) -> list[str]:
    """A stand-in's record: the words it wrote, each ended by a NUL."""
    return path.read_text(errors="surrogateescape").split("\0")[:-1]


def _ran_to_the_end(command: list[str], env: dict, cwd: Path, stdin, stdout, stderr, trace: int,
                    tools: str) -> tuple[bool, bool]:
    """Whether ``command`` (in a session of its own) ended within LINE_TIMEOUT_S, and whether something it started
    outlived it (killed then); a stand-in, or a bash forked to start one, is waited for: its record does not race."""
    # SIGINT at its default in the line's bash, however the kit was started (a kernel or a test run started with
    # & inherits it ignored): an ignored SIGINT is how a stand-in tells a launch that bash ran with & (STAND_IN)
    shell = subprocess.Popen(command, env=env, cwd=cwd, stdin=stdin, stdout=stdout, stderr=stderr,
                             pass_fds=(trace,), start_new_session=True,
                             preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    deadline = time.monotonic() + LINE_TIMEOUT_S
    try:
        ended = shell.wait(timeout=LINE_TIMEOUT_S) is not None
    except subprocess.TimeoutExpired:
        ended = False
    outlived = seen = False
    for _ in range(10):  # a process forking as it is killed: until none is left
        while True:  # the line's own processes, once those that end by themselves have
            left = [p for p in psutil.process_iter() if _alive(p, shell.pid)]
            seen = seen or bool(left)
            if not (ended and left and time.monotonic() < deadline and all(_ends_by_itself(p, tools) for p in left)):
                break
            time.sleep(0.01)
        left = [p.pid for p in left if _alive(p)]
        for pid in left:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        if not left:
            break
        outlived = True
        time.sleep(0.05)  # a SIGKILL takes a moment to land
    if seen:  # a chain of processes, each forking the next and ending before a look lists it: bash's group at once
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(shell.pid, signal.SIGKILL)
    shell.wait()
    return ended, ended and outlived


def _ends_by_itself(process, tools: str) -> bool:
    """A stand-in (it records and exits), or a bash with almost no CPU used (a fork yet to start one, a subshell
    waiting for one); a loop uses CPU. CPU time, not a clock, so that a busy machine gives the same verdict."""
    try:
        if any(tools in word for word in process.cmdline()):
            return True
        used = process.cpu_times()
        return used.user + used.system < FORK_CPU_S
    except psutil.Error:
        return True  # it has ended


def _alive(process, session: int | None = None) -> bool:
    """Not ended (a zombie is ended, and its parent, or init, reaps it), and in ``session`` where one is given."""
    try:
        return (session is None or os.getsid(process.pid) == session) and process.status() != psutil.STATUS_ZOMBIE
    except (psutil.Error, ProcessLookupError, PermissionError):
        return False


def command_words(traced: str, prefixes: list | None = None) -> list[str]:
    """The words of a traced line from the command it runs on; its assignments and the builtins that run the next
    word (builtin, command, exec), with their options, go to ``prefixes``."""
    try:  # bash's trace quotes a word as the shell would read it
        words = shlex.split(traced)
    except ValueError:
        words = traced.split()
    while words and (ASSIGNMENT.match(words[0]) or words[0] in ("builtin", "command", "exec", "--")):
        prefix = words.pop(0)
        while prefix != "--" and words and re.fullmatch("-[clpvV]*a?", words[0]):
            option = words.pop(0)
            prefix += f" {option}" + (f" {words.pop(0)}" if option.endswith("a") and words else "")
        if prefixes is not None:
            prefixes.append(prefix)
    return words


def names_set_by(traced: str) -> list[str]:
    """The variables a traced line sets: its leading NAME=value words, or those an export or declare names."""
    words, names = traced.split(), []
    while words and (found := ASSIGNMENT.match(words[0])):
        names.append(found.group(1))
        words.pop(0)
    if words and words[0] in ASSIGNS:
        names += [found.group(1) for word in words[1:] if (found := re.match(r"([A-Za-z_]\w*)(\[|\+?=|$)", word))]
    return names
