"""Exercise 6.1, what no run of the job script shows: its text, its #SBATCH lines as sbatch reads them (sbatch
itself where installed, else Slurm's option tables), the request against the exercise, and ``bash -n``.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
import threading
from pathlib import Path

from .answer_values import Problem, show
from .job_script import GAPS, JobSpec
from .slurm_rules import (INT_MAX, NO_LIMIT, SBATCH, directives_and_first_command, getopt_long, megabytes,
                          node_range, slurm_signal, strtol, time_limit_s)

ODD_SPACES = re.compile("[\u00a0\u1680\u2000-\u200b\u202f\u205f\u3000]")  # spaces sbatch and bash do not split on
_ODD_DASHES = re.compile("(?:^|[\\s=])([\u00ad\u2010-\u2015\u2212\ufe58\ufe63\uff0d]+)[A-Za-z0-9]")
_LONGEST_WORD = 10_000
_BASH = re.compile(r"#!\s*(?:(?:/usr)?(?:/local)?/bin/bash|(?:/usr)?/bin/env\s+bash)(?:\s.*)?")


def line_of(script: str, needle: str) -> str:
    """" (line N)" for the one line (comments aside) that holds ``needle``; "" when none or several do."""
    found = [k for k, line in enumerate(script.split("\n"), 1) if needle in re.sub(r"(^|\s)#(?!SBATCH).*", "", line)]
    return f" (line {found[0]})" if len(found) == 1 else ""


def comment_in_command(script: str) -> str:
    """Where a comment line sits inside a command continued with a backslash: bash ends the command there."""
    comment = re.search(r"^(?![ \t]*#).*(?<!\\)(?:\\\\)*\\\n([ \t]*#.*)\n", script, re.M)
    if not comment:
        return ""
    number = _line(script, comment.start(1))
    return (f"line {number}, `{show(comment.group(1).strip(), 40)}`, is a comment inside the command continued from "
            f"line {number - 1}: it ended the command there, and line {number + 1} ran as a command of its own")


def text_problem(script: str) -> str | None:
    """What is wrong with the script as text, before sbatch or bash reads a word of it."""
    try:
        script.encode("utf-8")
    except UnicodeEncodeError as err:
        return (f"the script holds U+{ord(script[err.start]):04X}, half of a surrogate pair, which no file can hold. "
                "Fix: type that character again, or remove it.")
    if "\x00" in script:
        return "the script holds a NUL character, which bash cannot read. Fix: remove it."
    unfilled = [gap for gap in GAPS if "{" + gap + "}" in script]
    if unfilled:
        return (f"the script still has its gaps ({', '.join('{' + g + '}' for g in unfilled)}). Fix: pass the answers "
                "as a dict, or the script with every gap filled.")
    doubled = re.search(r"\(\)\s*\{\{|;\s*\}\}", script)  # braces doubled as in a Python format string
    if doubled:
        return (f"line {_line(script, doubled.start())} holds {show(doubled.group().strip(' ;'))}: bash reads {{ as "
                "a command, not as the function's body. Fix: one brace each, forward() { ...; }, as printed.")
    if script.startswith("\ufeff"):
        return "the script starts with a byte-order mark (U+FEFF): sbatch refuses it. Fix: save it without BOM."
    if "\r" in script:
        kind = "DOS line breaks (\\r\\n)" if "\r\n" in script else "old Mac line breaks (\\r alone)"
        return f"the script has {kind}: sbatch refuses it. Fix: save it with Unix line breaks (dos2unix)."
    odd = ODD_SPACES.search(script)
    if odd:
        return (f"line {_line(script, odd.start())} holds a U+{ord(odd.group()):04X} space (a non-breaking space): "
                "sbatch and bash take it for part of a word. Fix: replace it with a plain space.")
    for number, line in enumerate(script.split("\n"), 1):
        code = re.sub(r"(^|\s)#(?!SBATCH).*", "", re.sub(r"'[^']*'|\"[^\"]*\"", "", line))  # quotes and comments
        found = _ODD_DASHES.search(code)                                                   # are data
        if found:
            looks = "an invisible soft hyphen" if found.group(1)[0] == "\u00ad" else "a dash that looks like a hyphen"
            return (f"line {number} holds {show(found.group(1))} (U+{ord(found.group(1)[0]):04X}, {looks}) where an "
                    "option starts: the tools take only the plain hyphen-minus. Fix: type the option's hyphens again.")
    if len(script) > 50 * _LONGEST_WORD or re.search(r"\S{%d}" % (_LONGEST_WORD + 1), script):
        return (f"the script holds a word longer than {_LONGEST_WORD} characters (or is longer than "
                f"{50 * _LONGEST_WORD}), which no job script needs. Fix: the template, its gaps filled.")
    escaped = re.search(r"(?<!\\)(?:\\\\)*\\[ \t]+\n", script)
    if escaped:
        return (f"line {_line(script, escaped.start())} ends in a backslash and a space: bash escapes the space, so "
                "the next line runs as a command of its own. Fix: nothing after the backslash.")
    return _shebang_problem(script.split("\n", 1)[0])


def _line(script: str, at: int) -> int:
    return script.count("\n", 0, at) + 1


def _shebang_problem(first: str) -> str | None:
    """The #! line names the program slurmstepd runs the script with: bash, the template's language."""
    if not first.startswith("#!"):
        return "sbatch refuses a script whose first line is not #! and its interpreter. Fix: #!/bin/bash first."
    if _BASH.fullmatch(first):
        return None
    words = first[2:].split()
    program = (words[1] if len(words) > 1 and words[0].endswith("/env") else words[0]) if words else "nothing"
    dash = " (sh is dash on Debian and Ubuntu)" if program.rsplit("/", 1)[-1] in ("sh", "dash") else ""
    return (f"the first line, {show(first)}, names {program} as the script's interpreter, which is no bash{dash}. "
            "Fix: #!/bin/bash as the first line, on a line of its own.")


# ---------------------------------------------------------------------------------------------- #SBATCH lines


def _sbatch_reading(script: str) -> dict[str, str] | None:
    """sbatch's own reading of the #SBATCH lines (``sbatch -v``, stopped once it has listed them; no controller
    is named, so nothing is submitted); ``Problem`` with its words; None where it says neither."""
    with tempfile.TemporaryDirectory(prefix="sbatch-") as folder:
        (Path(folder) / "slurm.conf").write_text("ClusterName=check\nSlurmctldHost=localhost\n")
        (Path(folder) / "job.sbatch").write_text(script)
        env = {k: v for k, v in os.environ.items() if not k.startswith(("SBATCH_", "SLURM_", "SALLOC_", "SRUN_"))}
        env["SLURM_CONF"] = os.path.join(folder, "slurm.conf")
        listed, said, done = {}, [], False
        with subprocess.Popen(["sbatch", "-v", "job.sbatch"], cwd=folder, env=env, stdin=subprocess.DEVNULL,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, errors="replace") as sbatch:
            guard = threading.Timer(60, sbatch.kill)  # an sbatch that neither lists nor refuses: the tables decide
            guard.start()
            for line in sbatch.stdout:
                if "end of defined options" in line:
                    done = True
                    break
                found = re.fullmatch(r"sbatch: ([a-z-]+)\s+: (.*)", line.rstrip("\n"))
                if found:
                    listed[found.group(1)] = found.group(2)
                elif re.search(r"error|fatal|option|Invalid|invalid|ambiguous|unrecognized", line):
                    said.append(re.sub(r"^sbatch: (error: |fatal: )?", "", line.strip()))
            sbatch.kill()
            guard.cancel()
    if said and not done:
        raise Problem(" ".join(said))
    listed.pop("verbose", None)
    return listed if done else None


def _table_reading(arguments: list[str]) -> dict[str, str]:
    """The #SBATCH options as Slurm's own tables read them, where sbatch is not installed. Each value is checked as
    sbatch checks it, where it stands: one that a later line replaces is refused too."""
    found, rest = getopt_long(arguments, SBATCH)
    if rest:
        raise Problem(f"Invalid directive found in batch script: {rest[0]}")
    return {name: _table_value(name, value) for name, value in found}


_SPECIFICATIONS = {"time": time_limit_s, "signal": slurm_signal, "mem": megabytes, "mem-per-cpu": megabytes,
                   "mem-per-gpu": megabytes}  # what reads each option's value: None where sbatch refuses it


def _table_value(name: str, value: str | None) -> str:
    """``value`` as sbatch keeps it ("set" for a bare flag); ``Problem`` in sbatch's words where it refuses it."""
    if name in _SPECIFICATIONS and _SPECIFICATIONS[name](value) is None:
        raise Problem(f"Invalid --{name} specification")
    if name == "nodes":
        node_range(value)
    if name in ("ntasks-per-node", "cpus-per-task", "ntasks"):
        number, rest = strtol(value or "")
        if number is not None and number >= 2**63:  # a C long: strtol stops there
            raise Problem(f"Numeric argument ({2**63 - 1}) to big for --{name}")  # sbatch's words, as it spells them
        if number is None or rest or number <= 0:  # sbatch's parse_int: a number above 0, nothing after it
            raise Problem(f'Invalid numeric value "{value}" for --{name}')
        return str((number + 2**31) % 2**32 - 2**31)  # kept in a C int, as sbatch lists it
    return "set" if value is None else value


_REFUSAL_FIXES = (  # what sbatch's refusal names, and the fix for it
    (r"\$", "#SBATCH lines are read by sbatch, not by a shell: a $VARIABLE stays as written; give the value itself."),
    ("--time", "a time sbatch reads: MINUTES, MM:SS, HH:MM:SS, D-HH, D-HH:MM or D-HH:MM:SS (00:05:00)."),
    ("--signal", "B:SIGNAL@SECONDS, e.g. B:USR1@60 (seconds alone, no unit)."),
    ("node count", "--nodes=N, the whole number of nodes the job needs."),
    ("[Nn]umeric|number of", "a whole number, 1 or more."),
    ("--mem", "a size sbatch reads (a whole number, then K, M, G or T), or leave it out as the template does."))


def read_directives(script: str) -> tuple[dict[str, str], dict[str, str]]:
    """(the options as sbatch reads them, the same as written); ``Problem`` for what sbatch refuses."""
    arguments, first_command, unread = directives_and_first_command(script)
    if unread:
        raise Problem(f"sbatch reads #SBATCH lines only above the script's first command "
                      f"({show(first_command.strip())}), and some come after it: they would be ignored. Fix: every "
                      "#SBATCH line at the top.")
    try:
        written = dict(getopt_long(arguments, SBATCH)[0])
    except Problem:
        written = {}
    try:
        read = (_sbatch_reading(script) if shutil.which("sbatch") else None) or _table_reading(arguments)
    except Problem as err:
        said = re.sub(r"\d{24,}", lambda m: f"{m.group()[:12]}… ({len(m.group())} digits)", str(err)).rstrip(".")
        fix = next((fix for pattern, fix in _REFUSAL_FIXES if re.search(pattern, said)),
                   "--option=VALUE with the option's whole name, one value for each option.")
        raise Problem(f"sbatch would refuse the #SBATCH lines: {show(said, 200)}. Fix: {fix}") from None
    foreign = re.search(r"^#(PBS|BSUB).*", script, re.M)
    if foreign and "ignore-pbs" not in read:
        raise Problem(f"line {_line(script, foreign.start())}, {show(foreign.group(), 60)}, is read by sbatch too: it "
                      "turns #PBS and #BSUB lines into options of the job, beside the #SBATCH lines. Fix: remove it "
                      "(or add --ignore-pbs); the template's #SBATCH lines ask for what the exercise needs.")
    return read, written


# ---------------------------------------------------------------------------------------------- the request

_CHANGES_THE_JOB = {
    "exclusive": "holds whole nodes, every core of them, while the training uses a few",
    "hold": "queues the job held: it never starts until someone releases it",
    "test-only": "makes sbatch only estimate when the job would start: nothing is queued",
    "array": "makes the job an array: the same training would run once per task",
    "cpus-per-gpu": "sets the cores per GPU, which sbatch refuses beside --cpus-per-task (and the job has no GPU)",
    "nodelist": "ties the job to named nodes: it waits for them, and with --nodes=2 their count must match",
    "ntasks": "fixes the job's task count, whatever the node count: with --nodes=2 (only #SBATCH --nodes changes) "
              "the tasks would no longer be one per node",
    "begin": "delays the job's start: it waits in the queue until then",
    "dependency": "makes the job wait for another job (and never start if that one fails)",
    "deadline": "cancels the job when it cannot end by then, which a queue can make it miss",
    "time-min": "lets Slurm cut the time limit down to it, below what the warning's lead was planned on",
    **{gpus: "asks for GPUs, which this training does not use (it runs on CPU cores): the job would wait for a GPU "
             "node and hold its GPUs idle" for gpus in ("gres", "gpus", "gpus-per-node", "gpus-per-task")},
}


def _value_problem(name: str, value: str) -> str | None:
    """Options the template leaves out that are harmless with some values and break the job with others."""
    if name == "export" and value.split(",")[0].upper() != "ALL":
        return ("starts the job without the environment it was submitted from (PATH and the activated Python among "
                "it): torchrun would not be found")
    if name in ("output", "error") and value.strip() == "/dev/null":
        return "throws the job's log away: the ranks' lines that the check (and you) read go nowhere"
    mib = megabytes(value) if name in ("mem", "mem-per-cpu") else None
    if mib is not None and 0 < mib < 1024:
        unit = " (MiB without a unit)" if value.strip().isdigit() else ""
        return (f"gives {'each core' if name == 'mem-per-cpu' else 'the job'} {show(value)} of memory{unit}: Slurm "
                "ends the job as soon as its processes load PyTorch, a few hundred MiB each")
    return None


def _time_problem(read: dict, written: dict, spec: JobSpec, at: str) -> str | None:
    """The limit fits the work, the warning's lead and the minute by which Slurm may send the warning early."""
    limit = time_limit_s(read["time"]) if "time" in read else None
    warning = slurm_signal(read.get("signal"))
    lead = warning.lead_s if warning else 0
    shown = show(written.get("time", read.get("time")))
    if limit is None:
        return ("no --time: the job would get the partition's default limit. Fix: --time with the work, the "
                "warning's lead and a minute's room.")
    if limit == NO_LIMIT:
        return (f"--time={shown}{at} asks for no time limit: the job waits longer for a slot, and its warning comes "
                "only then. Fix: a limit for the work, the warning's lead and a minute.")
    if warning is None:
        return ("no --signal: at the time limit Slurm ends the job without warning, and the steps since the last "
                f"checkpoint are lost. Fix: #SBATCH --signal=B:{spec.warning}@N, N the seconds of warning.")
    if lead < spec.min_lead_s:
        return (f"--signal gives {lead} s of warning: too little to write a checkpoint on a busy file system. Fix: at "
                f"least {spec.min_lead_s} s, with room to spare.")
    need = spec.needed_s + lead + spec.early_s
    if limit < need:
        minutes = f", as sbatch reads {shown} (minutes:seconds)" if re.fullmatch(r"\d+:\d+", shown) else ""
        return (f"--time of {limit:g} s{at}{minutes}: the job needs about {spec.needed_s} s, and the warning comes "
                f"{lead} s before the end, up to {spec.early_s} s earlier still (sbatch's manual), so it could run out "
                f"of time. Fix: at least {need} s, or a shorter warning.")
    if limit > spec.max_time_s:
        return (f"--time={shown}{at} asks for {limit / 3600:g} h for about {spec.needed_s // 60} minutes of work: it "
                "waits longer for its slot. Fix: the work and the warning's lead, with some room: minutes, not hours.")
    return None


def request_problem(script: str, read: dict, written: dict, spec: JobSpec) -> str | None:
    """What the #SBATCH lines ask for, against the exercise: what no run of the script can show."""
    nodes = written.get("nodes", read.get("nodes", "1"))
    try:
        low, high = node_range(read.get("nodes", "1"))
    except Problem as why:
        return f"--nodes={show(nodes)}: {why}. Fix: --nodes={spec.nodes}."
    if (low, high) != (spec.nodes, spec.nodes):
        suffix = (f" (sbatch reads it as {low if low == high else f'{low}-{high}'} node{'s' * (high != 1)}: k "
                  "multiplies by 1024, m by 1048576)" if re.search(r"[kKmM]", nodes) else "")
        return (f"--nodes={show(nodes)}{suffix}: the exercise asks for one node, with {spec.procs_per_node} training "
                f"processes on it. Fix: --nodes={spec.nodes}.")
    for name in ("ntasks-per-node", "cpus-per-task"):
        value, given = read.get(name), written.get(name, read.get(name))
        if value is None:
            continue
        big = given.isdigit() and value.lstrip("-").isdigit() and int(given) != int(value)
        if big or not (value.isdigit() and 0 < int(value) < INT_MAX):
            said = f" (too big: sbatch reads it as {value})" if big else ""
            return f"--{name}={show(given)} is no count sbatch takes{said}. Fix: a whole number, 1 or more."
    for name in ("export", "output", "error", "mem", "mem-per-cpu"):
        why = _value_problem(name, written.get(name, read[name])) if name in read else None
        if why:
            return (f"#SBATCH --{name}={show(written.get(name, read[name]))}{line_of(script, '--' + name)} {why}. Fix: "
                    f"leave --{name} out, as the template does.")
    for name, why in _CHANGES_THE_JOB.items():
        if name in read:
            value = written.get(name)
            return (f"#SBATCH --{name}{'=' + show(value) if value else ''}{line_of(script, '--' + name)} {why}. Fix: "
                    f"leave --{name} out: the template's #SBATCH lines ask for what the exercise needs.")
    return _time_problem(read, written, spec, line_of(script, "#SBATCH --time") or line_of(script, "#SBATCH -t"))


def syntax_problem(script: str) -> str | None:
    """bash's own reading of the whole script (``bash -n``); None when bash reads it, or where there is no bash."""
    bash = shutil.which("bash")
    try:
        checked = bash and subprocess.run([bash, "-n"], input=script, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if not checked or checked.returncode == 0:
        return None
    said = next((line for line in checked.stderr.splitlines() if "syntax error" in line or "unexpected" in line),
                checked.stderr.strip().splitlines()[0] if checked.stderr.strip() else "a syntax error")
    return (f"bash would not run it: {show(re.sub(r'^.*?bash: ', '', said), 160)} (what `bash -n` says of the "
            "script). The commands up to there run, the rest never does. Fix: close every loop, if and quote as the "
            "template does.")
