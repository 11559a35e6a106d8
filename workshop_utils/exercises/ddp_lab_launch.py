"""Exercise 2.2's launch line judged: what bash ran (``ddp_lab_bash``), read as torchrun reads it (its own parser and
settings); one line names what would not launch the lab on this machine."""

from __future__ import annotations

import argparse
import contextlib
import io
import logging
import os
import re
import shlex
import shutil
import socket
from pathlib import Path
from typing import NamedTuple
from unittest import mock

import psutil

from .ddp_lab_bash import (ASSIGNS, BY_PATH, LAB_FUNCTIONS, LOADER_VARIABLES, OFF_BUILTINS, STAND_INS, TIMED_OUT,
                           TOOLS, command_words, names_set_by, run_in_bash)
from .ddp_lab_files import LAB_EXERCISE
from .exercise_cells import NotYet
from .exercise_judging import short

TORCH_LAUNCHERS = ("torch.distributed.run", "torch.distributed.launch")  # what `python -m` may name for torchrun
SAFE_SET = ("errexit", "nounset", "pipefail", "errtrace", "xtrace")
# through builtin or command, the shell's own, restricted or not: not the check's cd, source and exec
THROUGH_BUILTIN = (*ASSIGNS, "set", "echo", "printf", "true", "false", ":", "eval")
# What a launch line runs beside the launch and the tools: setting up its environment, and the shell's harmless
# builtins. Anything else is refused, as the trace shows it, whatever the line did with its output.
LAUNCH_LINE_COMMANDS = ("cd", "pushd", "source", ".", *THROUGH_BUILTIN, "exec")
OTHER_LAUNCHERS = ("mpirun", "mpiexec", "deepspeed", "accelerate", "uv", "poetry", "pipenv", "apptainer",
                   "singularity", "horovodrun", "bash", "sh")  # what may start the lab's processes, but not torchrun
ASSIGNERS = ("export", "declare", "typeset", "local", "readonly")  # with -x, -r, -g or -a alone: no query, no -i or -n
CONDAS = ("conda", "mamba", "micromamba")
# what the check's shell keeps readonly (restricted, or its own) and a real shell would set: set, it fails only here
KEPT = ("SHELL", "BASH_ENV", "ENV", "HISTFILE", "PS4", "FUNCNAME", "BASH_XTRACEFD", "BASH_CMDS", "cd", "pushd",
        "source", "exec", "lab_end")  # which activate, or deactivate, an environment and nothing else here
LONGEST_LINE = 100_000  # characters; bash takes a line as one argument, which the kernel limits


class LaunchLine(NamedTuple):
    """The script's own arguments in the line, and the ``VAR=value`` words in front of it (set for the launch)."""

    script_args: list[str]
    assigned: dict[str, str]


def example_line(nproc: int, script: Path) -> str:
    """The notebook's launch line, as a fix shows it: the path quoted for the shell where it needs quoting (a space)."""
    path = "{shlex.quote(str(lab_file))}" if shlex.quote(str(script)) != str(script) else "{lab_file}"
    return f"f\"torchrun --nproc-per-node={nproc} {path}\""


def read_launch_line(command, script: Path, nproc: int, exercise: str = LAB_EXERCISE) -> LaunchLine:
    """The attendee's launch line as bash runs it with recording stand-ins, then the launch it recorded as
    torchrun's own parser reads it; one line names what would not launch the lab."""
    example = example_line(nproc, script)

    def refuse(wrong, problem: str, fix: str) -> None:
        if wrong:
            raise NotYet(f"✗ {exercise}: {problem}", fix.replace("EXAMPLE", example))

    refuse(not isinstance(command, (str, list, tuple)), f"`lab_command` = {short(repr(command), 40)} cannot be read "
           f"as a command line: it must be a text (a str), not {type(command).__name__}.",
           "write the launch line in quotes, e.g. EXAMPLE.")
    odd_item = next((t for t in ([] if isinstance(command, str) else command)
                     if not isinstance(t, (str, os.PathLike))), None)
    refuse(odd_item is not None, f"`lab_command` is a list with an item that is no word: {short(repr(odd_item), 40)} "
           f"({type(odd_item).__name__}).", "give each word as a str, or write one string: EXAMPLE.")
    tokens = [] if isinstance(command, str) else [os.fspath(t) for t in command]
    several = next((t for t in tokens if len(t.split()) > 1 and not _names(t, script)), None)
    refuse(several, f"`lab_command` is a list whose item {short(repr(several), 50)} holds several words"
           f"{' (its only item)' * (len(tokens) == 1)}: each item is one word to torchrun.",
           "give each word its own item (shlex.split(line) splits a line), or write one string: EXAMPLE.")
    text = command.strip(" \t\n").lstrip("!").strip(" \t\n") if isinstance(command, str) else shlex.join(tokens)
    try:  # a file name's undecodable bytes come back as they went in (surrogateescape); a lone surrogate cannot
        odd = "a NUL byte (\\0)" if "\0" in text else text.encode("utf-8", "surrogateescape") and ""
    except UnicodeEncodeError as error:
        odd = f"the character {ascii(text[error.start])}"
    refuse(odd or len(text) > LONGEST_LINE, f"the command holds {odd}, which no shell line holds." if odd else
           f"the command is {len(text):,} characters long: no launch line is.", "write the launch line alone, e.g. "
           "EXAMPLE.")
    joined = text.replace("\\\n", "")  # as bash reads it: a backslash-newline joins the lines
    braces = re.search(r"(?<!\$)\{[A-Za-z_][^{}]*\}", joined)  # {lab_file} left in; ${VAR} is the shell's
    refuse(braces, f"the command holds {short(braces and braces.group(0), 60)} as written: the f in front of the "
           "quotes, which puts the value in, is missing.", "write it as an f-string: EXAMPLE.")
    pasted = next((what for what, found in (  # what a line copied from a page or a slide brings along
        ("typographic quotes (“ ” ‘ ’), which the shell takes as letters", re.search("[“”‘’]", text)),
        ("a non-breaking or another typographic space, which the shell takes as a letter",
         re.search("[\xa0\u2000-\u200b\u202f\u205f\u3000\ufeff]", text)),
        ("typographic dashes (– — −) or a soft hyphen, which the shell takes as letters",
         re.search("[\u2010-\u2015\u2212\xad]", text)),
        ("a carriage return (a Windows line end), which the shell takes as a letter", "\r" in text),
        ("a Jupyter magic in front (%%bash, %sx), which is no part of a shell line", re.match(r"%%?\w+\s", text)),
        ("a # in front, which makes the whole line a comment", re.match(r"#(?!!)[^\n]*$", text)),
        ("Markdown's backticks around it, which the shell reads as a command to run",
         re.fullmatch("`+[^`]*`+|```.*", text, re.S)),
        ("a prompt in front (its $, % or >), which is no part of the line",
         re.match(r"(\(\S+\) )?(\[[^\]\n]*\]|\S*)[$%] |>+ ", text))) if found), None)
    refuse(pasted, f"the command holds {pasted}.", "type the line as plain text: EXAMPLE.")
    expanded = next((t for t in text.split() if "$" in t or "`" in t or re.search("/dev/(tcp|udp)/", t)), None)
    shown = text[text.find(expanded):] if expanded else ""  # from that word on: $((...)) and `...` hold spaces
    refuse(expanded, f"the command holds a shell expansion ({short(shown, 60)}), which the check does not "
           "expand.", "write the values themselves, e.g. EXAMPLE (an f-string puts Python's values in).")
    refuse(not text, "the command has no launch line.", "write the launch line, e.g. EXAMPLE.")
    unquoted = re.sub(r"""\\.|'[^']*'|"(?:[^"\\]|\\.)*"|(?:^|(?<=[\s;&|(){}]))#.*""", "''", joined)  # as bash
    # reads them, left to right: an escaped character, a quoted string, a comment; then N>, N<, N>&, N<&- outside
    descriptor = re.search(r"(?:^|(?<=[\s;&|(){}]))(0*(?:[3-9]|[1-9]\d+))[<>]|[<>]&\s*(0*(?:[3-9]|[1-9]\d+))",
                           unquoted)  # N> or N< (N redirected), or >&N or <&N (N copied or moved)
    refuse(descriptor, f"the command redirects file descriptor {descriptor and int(descriptor[1] or descriptor[2])}, "
           "which the check's shell keeps for itself: a launch line needs only 0, 1 and 2.", "leave that out: EXAMPLE.")
    refuse("||" in unquoted, "the command has ||, which runs what follows it only where the command before it fails: "
           "the check cannot tell where that would be.", "write the launch line alone, EXAMPLE, or with && after a "
           "command that sets it up.")
    launches, after, background, said, complaints, commands, cut, closed, strays, functions = run_in_bash(
        text, _launches_torchrun)

    def complaint(pattern: str) -> str | None:
        return next((found.group(1) for found in map(re.compile(pattern).search, complaints) if found), None)

    assigned_names = [name for command in commands for name in names_set_by(command)]
    loader = next((name for name in assigned_names if name in LOADER_VARIABLES), None) or complaint(
        r"\b(%s): (?:readonly variable|the check's shell loads no)" % "|".join(LOADER_VARIABLES))
    refuse(loader, f"the command sets {loader}, which makes every program load what it names: the check runs no "
           "library or file of the line's.", "leave it out: EXAMPLE.")
    redirected = complaint(r"^(.*): restricted: cannot redirect output")
    refuse(redirected, f"the command redirects output ({short(redirected or '', 40)}), which the check's shell does "
           "not take: the check shows the launch's output itself.", "leave the redirection out: EXAMPLE.")
    off = next((short(" ".join(words), 40) if words[0] == "set" else words[0] for words in map(command_words, commands)
                if words and (words[0] in OFF_BUILTINS or words[0] == "set" and not _safe_set(words[1:]))), None)
    refuse(off, f"the command runs {off}, which the check's shell leaves out: around a launch it changes what runs, "
           "or stops it, and the check runs the launch alone.", f"leave {off} out" + (
               " (set -e, -u, -x and -o pipefail may stay)" if off and off.startswith("set") else "") + ": EXAMPLE.")
    ran = [(command_words(command, prefixes := []), prefixes) for command in commands if command not in after]
    exec_alone = next((prefix for words, prefixes in ran for prefix in prefixes if prefix.startswith("exec") and (
        not words or re.search(r" -\w*c", prefix))), None)
    refuse(exec_alone, f"the command runs {exec_alone}, which changes what the line's commands after it get (their "
           "output, or their environment).", "leave it out: EXAMPLE.")
    ours = {*LAUNCH_LINE_COMMANDS, *STAND_INS, *BY_PATH, *LAB_FUNCTIONS, *functions}
    through = {*THROUGH_BUILTIN, *STAND_INS}
    unknown = next((words for words, prefixes in ran if words and not words[0].startswith("-") and (
        words[0] not in (through if {p.split()[0] for p in prefixes} & {"builtin", "command"} else ours)
        or words[0] in (*ASSIGNERS, "printf") and any(re.fullmatch(r"[-+](?![xrga]+$).*", w) for w in words[1:])
        or words[0] in CONDAS and words[1:2] not in (["activate"], ["deactivate"]))), None)
    sourced = next((" ".join(words[:2]) for words, _ in ran if words[:1] in (["source"], ["."]) and re.match(
        r"/(dev|proc)/", os.path.normpath("/" + (words[1:] or ["/dev/stdin"])[0].lstrip("/")))), None)
    refuse(sourced, f"the command runs {short(sourced or '', 50)}: the commands it reads are the line's own, which the "
           "check does not see there.", "source only a file, such as an environment's activate: EXAMPLE.")
    names_torchrun = "torchrun" in text or "torch.distributed" in text
    conda = unknown and unknown[0] in CONDAS and " ".join(unknown[:2])
    refuse(conda, f"the command runs {conda}: the check's {unknown and unknown[0]} only activates an environment.",
           f"{unknown and unknown[0]} activate ENV && then the launch line, e.g. EXAMPLE.")
    asks = unknown and unknown[0] in (*ASSIGNERS, "printf") and short(" ".join(unknown[:3]), 40)
    refuse(asks, f"the command runs {asks}, which asks the check's shell what it holds, or sets a variable other than "
           "plainly (as a number, a name or with printf).", "export NAME=value, then the launch: EXAMPLE.")
    if unknown and not launches:  # what is no part of a launch line, whatever its output or its stderr said
        refuse(True, *_not_run(unknown[0], names_torchrun, False))
    refuse(strays and (launches or not said), f"the command runs {short(strays[0] if strays else '', 60)}, which "
           "starts no torchrun: the check runs nothing else through srun, env, nohup, nice, stdbuf or timeout.",
           "write the launch line alone, EXAMPLE, and run anything else in a cell of its own.")
    if not launches:
        refuse(said.startswith(TIMED_OUT), f"bash's run of the line {said}, though the check's torchrun ends at "
               "once: something in the line waits or loops.", "make it the launch line only, e.g. EXAMPLE.")
        found = re.fullmatch(r"(.*?): (?:command not found|restricted: cannot specify `/' in command names|the check "
                             r"runs no program by its path)", said)
        refuse(True, *_not_run(found.group(1) if found else "", names_torchrun, False, said))
    refuse(cut, "the command closes or moves the check's trace of what bash runs, so the check cannot tell what "
           "runs beside the launch.", "write the launch line alone: EXAMPLE.")
    ours_set = next((name for name in assigned_names if name.startswith("LAB_") or name in KEPT), None)
    refuse(ours_set, f"the command sets {ours_set}, which the check's shell keeps for itself (a real shell would "
           "set it).", "leave it out: EXAMPLE.")
    # PATH=... in front of a command: restricted bash says so, and runs it (BASH_CMDS, which bash reads too, is KEPT)
    path = "PATH" in assigned_names or complaint(r"\b(PATH): readonly variable")
    refuse(path, "the command sets PATH: bash would look for torchrun there, not where the kernel finds it.",
           "leave PATH as it is: EXAMPLE.")
    refuse(background == "launch", "the command ends in &, which runs the launch in the background: nothing would "
           "wait for it to end." if joined.rstrip().endswith("&") else "the command runs the launch with &, in the "
           "background, which a launch line does not need: the check waits for the launch itself.",
           "leave the & out: EXAMPLE.")
    refuse(background, "the command has a single &, which runs a command beside the launch, in the background: "
           "one would not wait for the other.", "write && to run the launch after a command succeeds, or run that "
           "command in a cell of its own: EXAMPLE.")  # bash's $! tells, in whatever order the trace's lines landed
    before = launches[0][1] if len(launches) > 1 and not _launches_torchrun(launches[0][1]) else None
    refuse(before, f"the command runs {short(shlex.join(before or []), 50)} before the launch: the check runs the one "
           "torchrun launch alone.", "write the launch line alone, EXAMPLE, and run anything else in a cell of its "
           "own.")
    refuse(after or len(launches) > 1, "the command chains a second command to the launch ("
           + short(", ".join(after) or f"{len(launches)} launches", 60) + "); the check runs the one torchrun launch "
           "alone.", "make it the launch line only, e.g. EXAMPLE; run anything else in a cell of its own.")
    if unknown:  # after a chain or a pipe, which say more
        refuse(True, *_not_run(unknown[0], names_torchrun, True))
    refuse(closed, "the command closes the launch's output or its errors (>&-), which the check shows.",
           "leave that out: EXAMPLE.")
    folder, tokens, assigned, srun = launches[0]
    refuse("PYTHON_EXEC" in assigned, f"the command sets PYTHON_EXEC={short(assigned.get('PYTHON_EXEC', ''), 40)}, "
           "which torchrun runs in place of python.", "leave it out: EXAMPLE.")
    quoted = shlex.quote(str(script))
    refuse(quoted != str(script) and str(script) in text and str(script) not in tokens, f"the path of your script "
           f"({quoted}) holds a space or another character the shell splits at: unquoted, torchrun would get it as "
           "several words.", "quote it for the shell: EXAMPLE.")
    module, start = _python_module(tokens) if tokens[0].startswith("python") else (None, 1)
    refuse(not _launches_torchrun(tokens), f"the command starts {tokens[0]!r}"
           f"{f' with -m {module}' if module else ''}, not torchrun: nothing would start the lab's {nproc} processes "
           "or set RANK, LOCAL_RANK and WORLD_SIZE in them.", "launch it with torchrun: EXAMPLE.")
    tasks = _srun_tasks(srun, assigned, tokens[0]) if srun is not None else 1
    refuse(tasks != 1, f"srun would start {tasks} tasks, each a torchrun of its own: the lab's one node needs one." if
           isinstance(tasks, int) else tasks, "leave srun out, or give it --ntasks=1 alone: EXAMPLE.")
    options = "write only the options the lab needs, in full, then your script: EXAMPLE."
    try:  # as torchrun itself reads its options: the last of a repeated one, abbreviations, ambiguities, no script
        parsed = _torchrun_reads(tokens[start:], assigned, launch=module == "torch.distributed.launch")
    except ValueError as refusal:
        refuse(True, f"torchrun would stop at once: {short(str(refusal), 160)}.", options)
    refuse(parsed.training_script.endswith("/"), f"the script's path ends in / ({short(parsed.training_script, 60)}"
           "), which names a folder: Python would not open the file.", "name the file without the /: EXAMPLE.")
    named = Path(parsed.training_script)  # as bash left it: a ~ in quotes is no home folder
    try:
        resolved = (Path(os.path.normpath(folder)) / named).resolve()  # cd moved logically, as bash's does
    except (OSError, RuntimeError) as error:
        refuse(True, f"torchrun would run {short(str(named), 60)!r}, which no file is ({error}).",
               "name your script after torchrun's options: EXAMPLE.")
    shown = str(resolved) if named.name == script.name else named.name  # the same name: where it points tells
    refuse(resolved != script.resolve(), f"torchrun would run {shown!r} " + (
        "as a program (--no-python), with your file as its argument," if parsed.no_python else
        "as the training script") + f" in place of your lab script {quoted}" + (
        " (bash puts the home folder for a ~ only unquoted, at a word's start)." if "~" in str(named) else "."),
        "name only your script after torchrun's options: EXAMPLE.")
    flag = "-m" if parsed.module else "--no-python" if parsed.no_python else None
    refuse(flag, f"with {flag}, torchrun would run your script " + (
        "as a module name (python -m): Python finds no module named by a path." if parsed.module else
        "as a program of its own, without python: a .py file is no program to execute."),
        f"leave {flag} out: torchrun runs the script with python, EXAMPLE.")
    refuse(module == "torch.distributed.launch" and not parsed.use_env, "torch.distributed.launch (the launcher "
           "torchrun replaced) passes --local-rank=<n> to the script as an argument; the lab's script takes no such "
           "argument, and its argparse would stop every rank (\"unrecognized arguments: --local-rank=0\").",
           "launch with torchrun, which sets LOCAL_RANK in each process's environment instead: EXAMPLE.")
    from torch.distributed.run import determine_local_world_size, parse_min_max_nnodes

    wrong = []  # as torchrun turns them into numbers (02 is 2; gpu, cpu, auto: what this machine has); a value
    for option, value, read, right in (("--nproc-per-node", parsed.nproc_per_node, determine_local_world_size, nproc),
                                       ("--nnodes", parsed.nnodes, parse_min_max_nnodes, (1, 1)),
                                       ("--node-rank", parsed.node_rank, int, 0)):  # it cannot read, it refuses below
        try:
            got = None if value is None else read(str(value))
        except (ValueError, RuntimeError):
            got = None
        if value is None or got not in (None, right):
            wrong.append(f"no {option} (so one process)" if value is None else f"{option}={value}" + (
                f" ({got} here)" if read is determine_local_world_size and not str(value).strip().lstrip(
                    "+-").isdigit() else ""))
    late = next((word for word in parsed.training_script_args if re.match(r"--(nproc|nnodes|node.rank)", word)), "")
    refuse(wrong, f"torchrun reads its options before the script: {short(late, 30)} comes after it, so it goes to "
           f"your script, and torchrun would run with {', '.join(wrong)}." if late else f"torchrun would run with "
           f"{', '.join(wrong)}; the lab runs {nproc} processes on one node, node 0 (torchrun waits for any other node "
           "it is told of).", "put torchrun's options before the script: EXAMPLE." if late else
           f"use --nproc-per-node={nproc} alone: EXAMPLE.")
    backend = "c10d" if parsed.standalone else parsed.rdzv_backend
    refuse(backend not in ("static", "c10d"), f"--rdzv-backend={backend} needs a rendezvous server of its own; "
           "torchrun's static or c10d rendezvous meets on this machine.", "leave --rdzv-backend out: EXAMPLE.")
    host = "" if parsed.standalone else _rendezvous_host(parsed)
    refuse(host not in _this_machine(), f"torchrun would meet its ranks at {short(host, 40)!r}, not on this machine: "
           "the lab's one node is this one.", "leave --master-addr and --rdzv-endpoint out: EXAMPLE.")
    local = parsed.local_addr or ""
    refuse(local not in _this_machine(), f"--local-addr={short(local, 40)} is no address of this machine: torchrun "
           "would name it to the other ranks, which would never reach it.", "leave --local-addr out: EXAMPLE.")
    refusal = _config_refusal(parsed)
    refuse(refusal, f"torchrun would stop at once: {short((refusal or '').rstrip('.'), 160)}.", options)
    return LaunchLine(list(parsed.training_script_args), assigned)


def _not_run(name: str, names_torchrun: bool, launched: bool, said: str = "") -> tuple[str, str]:
    """(problem, fix) for a command ``name`` the check's shell does not run (``launched``: beside a launch);
    ``said``: bash's complaint, where there is no name."""
    problem = f"the command runs {short(name, 60)} beside the launch" if launched else \
        "bash ran the line and it started no torchrun"
    alone = "write the launch line alone, EXAMPLE, and run anything else in a cell of its own."
    if not name:
        return problem + (f" ({short(said, 120)})." if said else "."), "write the torchrun line, e.g. EXAMPLE."
    if len(name.split()) > 1 and not launched:
        return f"{problem}: it took the whole line, in quotes, as the name of one command.", (
            "leave the quotes around the line out: EXAMPLE.")
    if "/" in name:
        return (f"{problem}, by its path" if launched else f"{problem}: it runs {short(name, 60)} by its path") + (
            ", and the check's shell runs a launch's tools by their names, as the kernel's PATH finds them."), (
            alone if launched else "write torchrun by its name: EXAMPLE.")
    if shutil.which(name) and not names_torchrun or name in OTHER_LAUNCHERS:
        return f"{problem}: it runs {name}, which is no torchrun.", "launch it with torchrun: EXAMPLE."
    if shutil.which(name) or launched:
        return (f"{problem}: {name} is none of what a launch line needs beside torchrun and python (srun, env, "
                "nohup, nice, stdbuf, timeout, time, module, conda; cd, source, export, set -e)."), alone
    return f"{problem} ({short(name, 60)}: command not found).", "write the torchrun line, e.g. EXAMPLE."


def _torchrun_reads(args: list[str], env: dict, launch: bool = False) -> argparse.Namespace:
    """``args`` as torchrun's own parser reads them, its PET_ variables from ``env`` (the line's); ``ValueError``
    with torchrun's message where it would stop."""
    from torch.distributed.run import get_args_parser

    with mock.patch.dict(os.environ, {k: v for k, v in env.items() if k.startswith("PET_")}):
        parser = get_args_parser()
    parser.set_defaults(nproc_per_node=env.get("PET_NPROC_PER_NODE"))  # None: no --nproc-per-node, so one
    if launch:
        parser.add_argument("--use-env", "--use_env", default=False, action="store_true")

    def stop(message=None, *_):
        raise ValueError(message or "it prints its help (-h) and runs nothing")

    parser.error, parser.exit = stop, lambda status=0, message=None: stop(message)
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        return parser.parse_args(args)


def _config_refusal(parsed: argparse.Namespace) -> str | None:
    """What torchrun's own reading of its settings refuses, or None (no log folder made, nothing logged)."""
    from torch.distributed.run import config_from_args

    try:
        with mock.patch.object(logging.getLogger("torch.distributed.run"), "disabled", True), \
                mock.patch.dict(os.environ, OMP_NUM_THREADS="1"):
            config_from_args(argparse.Namespace(**{**vars(parsed), "log_dir": os.devnull}))
    except (ValueError, AssertionError, RuntimeError) as refusal:
        return str(refusal) or type(refusal).__name__
    return None


def _rendezvous_host(parsed: argparse.Namespace) -> str:
    """The host torchrun's ranks meet at: the rendezvous endpoint's, else (static) the master address."""
    from torch.distributed.elastic.rendezvous.utils import parse_rendezvous_endpoint

    endpoint = parsed.rdzv_endpoint or (parsed.master_addr if parsed.rdzv_backend == "static" else "")
    try:
        return parse_rendezvous_endpoint(endpoint, default_port=29400)[0] if endpoint else ""
    except ValueError:
        return endpoint


def _this_machine() -> set[str]:
    """The names and addresses by which this machine reaches itself ("" where torchrun takes localhost)."""
    return {"", "localhost", "127.0.0.1", "::1", "0.0.0.0", socket.gethostname(),
            *(a.address.split("%")[0] for addresses in psutil.net_if_addrs().values() for a in addresses)}


def _names(word: str, script: Path) -> bool:
    """Whether ``word`` names ``script`` (a ~ taken as Python takes it; a word no path can be is no name)."""
    try:
        return Path(os.path.expanduser(word)).resolve() == script.resolve()
    except (OSError, ValueError, RuntimeError):
        return False


def _launches_torchrun(tokens: list[str]) -> bool:
    return tokens[0] == "torchrun" or tokens[0].startswith("python") and _python_module(tokens)[0] in TORCH_LAUNCHERS


def _python_module(tokens: list[str]) -> tuple[str | None, int]:
    """(the module ``python [options] -m MODULE`` runs, the index of its first argument), with options read as
    python reads them (-u, -Im, -mMODULE, -W arg); (None, 1) where it runs no module (a script, -c, -h, -V)."""
    index = 1
    while index < len(tokens) and tokens[index].startswith("-") and tokens[index] != "-":
        word = tokens[index]
        if word == "--check-hash-based-pycs" and tokens[index + 1:index + 2] in (["default"], ["always"], ["never"]):
            index += 2  # the one long option that runs on; --help, --version and the rest stop python
            continue
        # letters that take no value, up to one that does (-m, -W, -X: the word's rest, else the next word); -c, -h,
        # -V, -?, unknown letters and other long options run no module
        found = re.fullmatch(r"-[bBdEiIOPqRsSuvx]*(?:([mWX])(.*))?", word, re.S)
        if not found:
            return None, 1
        if found[1] == "m":
            return (found[2], index + 1) if found[2] else (
                tokens[index + 1] if index + 1 < len(tokens) else None, index + 2)
        index += 2 if found[1] and not found[2] else 1
    return None, 1


SRUN_ELSEWHERE = ("chdir", "output", "error", "input", "prolog", "epilog", "task-prolog", "task-epilog", "test-only",
                  "usage", "help", "version", "multi-prog")
SRUN_COUNTS = {"ntasks": ("SLURM_NTASKS", "SLURM_NPROCS"), "nodes": ("SLURM_NNODES",),
               "ntasks-per-node": ("SLURM_NTASKS_PER_NODE",)}  # srun's options, and the variables it reads them from


def _srun_tasks(args: list[str], assigned: dict, launched: str) -> int | str:
    """The tasks srun's options ask for, read as Slurm reads them (an option over its variable; --ntasks over what
    the others work out), or why srun would not start one task of ``launched`` (the stand-in srun's found)."""
    from .answer_values import Problem
    from .job_script_standins import hostlist
    from .slurm_rules import SRUN, getopt_long

    try:
        found, command = getopt_long(args, SRUN)
    except Problem as problem:
        return f"srun would stop at once: {problem}."
    options = {**{key: assigned[name] for key, names in SRUN_COUNTS.items() for name in names if name in assigned},
               **dict(found)}
    program = BY_PATH.get(command[0], command[0]) if command else ""
    if program != launched and program not in TOOLS:
        return f"srun would run {short(program, 40)!r} as its program (an option of srun's takes the word after it)."
    export = (options.get("export") or "").upper()
    moved = next((f"--{name}" + (f"={options[name]}" if options[name] else "") for name in SRUN_ELSEWHERE
                  if name in options), None)
    if moved or "NONE" in export.split(",") or any(name in export for name in LOADER_VARIABLES):
        return (f"srun {moved or '--export=' + options['export']} changes where the launch runs, what runs around "
                "it or instead of it, its output or its environment, from how the check runs it.")
    if ":" in command or "het-group" in options:
        return "srun would start a step of several components (its : or --het-group), each a torchrun of its own."
    count = {key: max(map(int, re.findall(r"\d+", options.get(key) or "")), default=None) for key in (
        *SRUN_COUNTS, "gpus", "gpus-per-task", "ntasks-per-gpu")}
    if count["ntasks"] is not None:
        return count["ntasks"]
    nodelist = options.get("nodelist") or ""
    try:  # a range too long to spell out is more nodes than one, whatever its length
        listed = 2 if sum(int(b) - int(a) for a, b in re.findall(r"(\d+)-(\d+)", nodelist)) > 1000 or nodelist.count(
            ",") > 1000 else len(hostlist(nodelist))
    except ValueError:
        return f"srun would stop at once: {short(nodelist, 40)} is no list of nodes."
    nodes = count["nodes"] or listed or 1
    by_gpus = (count["gpus"] // count["gpus-per-task"] if count["gpus-per-task"] else
               count["gpus"] * (count["ntasks-per-gpu"] or 0)) if count["gpus"] else 0
    return max(nodes * (count["ntasks-per-node"] or 1), by_gpus)


def _safe_set(words: list[str]) -> bool:
    """set's words stop on an error, an unset variable or a failed pipe, or trace: options, and a name only after
    an -o (a name alone would be a positional parameter)."""
    return all(re.fullmatch("-[Eeuxo]+", word) or word in SAFE_SET and re.fullmatch("-[Eeux]*o", before) for before,
               word in zip(["", *words], words))
