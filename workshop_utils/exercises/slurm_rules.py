"""Slurm's rules, transcribed from its sources (Slurm 26.05's ``src/common``), for notebook 06's checks to read
an answer as Slurm would: getopt_long over sbatch's and srun's option tables, ``--time``, ``--signal``,
``--nodes`` and ``--array``."""

from __future__ import annotations

import collections
import math
import re
import signal as signals

from .answer_values import Problem, show

INT_MAX = 2**31 - 1
NO_LIMIT = math.inf
MAX_JOB_SIZE = 16384  # Slurm's MAX_JOB_SIZE_BITMAP: a list of node counts stays below it
MAX_ARRAY_INDEX = 4_000_000  # Slurm's MaxArraySize is at most 4000001: no task id is larger
# Slurm's sig_name2num table: a name with or without SIG, in any case, or a number.
SLURM_SIGNALS = ("HUP", "INT", "QUIT", "ABRT", "KILL", "ALRM", "TERM", "USR1", "USR2", "URG", "CONT", "STOP", "TSTP",
                 "TTIN", "TTOU", "XCPU")
_ID_RANGE = re.compile(r"([0-9]+)(?:-([0-9]+)(?::([0-9]+))?)?")  # FIRST[-LAST[:STEP]], in --nodes and --array


def strtol(text: str) -> tuple[int | None, str]:
    """C's strtol in base 10: leading white space, a sign, digits; (value or None when no digit, what is left)."""
    found = re.match(r"[ \t\n\r\f\v]*([+-]?[0-9]+)", text)
    return (int(found.group(1)), text[found.end():]) if found else (None, text)


def whole(text) -> int | None:
    """A count as sbatch reads one (``parse_int``: the whole text a number, not negative, below INT_MAX)."""
    value, rest = strtol(text) if isinstance(text, str) else (None, "")
    return value if value is not None and 0 <= value < INT_MAX and not rest else None


def _node_count(text: str) -> int:
    """Slurm's ``str_to_nodes``: a count with an optional k (x1024) then m (x1048576)."""
    value, rest = strtol(text)
    for suffix, scale in (("k", 1024), ("m", 1024 * 1024)):
        if value is not None and rest[:1].lower() == suffix:
            value, rest = value * scale, rest[1:]
    if value is None or not 0 <= value <= INT_MAX or rest.strip():
        raise Problem(f'"{text}" is not a valid node count')  # sbatch's words
    return value


def node_range(text) -> tuple[int, int]:
    """``--nodes`` as Slurm's ``verify_node_count`` reads it: (MIN, MAX), MAX 0 for no maximum; ``Problem`` (the
    reason, without a fix) where sbatch refuses it."""
    text = text if isinstance(text, str) else ""  # refused as the empty count is
    if "," in text or ":" in text:  # a list of counts
        refused, counts = Problem(f'"{text}" is not a valid node count'), []
        for part in text.split(","):
            found = _ID_RANGE.fullmatch(part)
            if not found or any(int(g) >= MAX_JOB_SIZE for g in found.groups() if g):
                raise refused
            counts += range(int(found[1]), int(found[2] or found[1]) + 1, int(found[3] or 1))
        if not counts:
            raise refused
        return min(counts), max(counts)
    low_text, dash, high_text = text.partition("-")
    low = 1 if dash and not low_text.strip() else _node_count(low_text)
    high = low if not dash else -1 if not high_text.strip() else _node_count(high_text)  # sbatch's -1 for "1-"
    if high != 0 and high < low:
        raise Problem(f"Maximum node count {high} is less than minimum node count {low}")  # sbatch's words
    return low, high


def megabytes(text) -> float | None:
    """A memory size as Slurm's ``str_to_mbytes`` reads one: a whole number, MiB, or K, M, G or T after it (then a
    B or not); None where sbatch refuses it (1.5G, 2GiB, -1)."""
    value, rest = strtol(text) if isinstance(text, str) else (None, "")
    found = re.fullmatch(r"(?:([KMGT])B?)?\s*", rest.upper())
    if value is None or value < 0 or not found:
        return None
    return value * {"K": 2**-10, None: 1, "M": 1, "G": 2**10, "T": 2**20}[found.group(1)]


def time_limit_s(text) -> float | None:
    """``--time`` as Slurm's ``time_str2mins`` reads it, in seconds rounded up to whole minutes; ``NO_LIMIT``
    for none (0 too); None if sbatch refuses it."""
    if not isinstance(text, str) or not text:
        return None
    if text.lower() in ("-1", "infinite", "unlimited"):
        return NO_LIMIT
    found = re.fullmatch(r"(?:([0-9]+)-)?([0-9]+)(?::([0-9]+))?(?::([0-9]+))?", text)
    if not found:
        return None
    days, *fields = found.groups()
    parts = [int(field) for field in fields if field is not None]
    # days-hours[:minutes[:seconds]] and hours:minutes:seconds start with hours, minutes[:seconds] with minutes
    unit = 3600 if days is not None or len(parts) == 3 else 60
    total = int(days or 0) * 86400 + sum(part * scale for part, scale in zip(parts, (unit, unit // 60, 1)))
    return NO_LIMIT if total == 0 else 60 * math.ceil(total / 60)


def _signal_number(text: str) -> int:
    """Slurm's ``sig_name2num``: the signal's number, 0 when it names none."""
    value, rest = strtol(text)
    if value is not None:
        return value if not rest.strip() else 0
    name = text.lstrip()
    name = name[3:] if name[:3].upper() == "SIG" else name
    for known in SLURM_SIGNALS:
        if name[:len(known)].upper() == known and not name[len(known):].strip():
            return int(getattr(signals, "SIG" + known))
    return 0


# ``--signal``: its number, its lead in seconds, and whether the batch shell alone gets it (B:), not the steps.
WarningSignal = collections.namedtuple("WarningSignal", "signal lead_s to_batch_shell")


def slurm_signal(text) -> WarningSignal | None:
    """``--signal=[{R|B}:]<sig_num>[@sig_time]`` as Slurm's ``get_signal_opts`` reads it; None if refused."""
    if not isinstance(text, str):
        return None
    flags = re.match(r"[Rr]?([Bb]?)[Rr]?:?", text)  # each flag's letter skipped in turn, then one colon
    name, at, lead = text[flags.end():].partition("@")
    number = _signal_number(name) % 65536  # Slurm keeps it in 16 bits
    value, left = strtol(lead) if at else (60, "")
    value = 0 if value is None and not left else value  # strtol of "" is 0
    if number < 1 or value is None or left or not 0 <= value <= 0xFFFF:
        return None
    return WarningSignal(number, value, bool(flags.group(1)))


def array_ranges(spec: str) -> list[range]:
    """``--array=SPEC`` as Slurm reads it: the ranges of task ids; ``Problem`` where Slurm refuses it."""
    body, percent, limit = spec.removeprefix("--array=").partition("%")
    count = whole(limit) if re.fullmatch(r"[0-9]+", limit) else None
    why = "" if not percent else "%K takes a whole number" if count is None else (
        f"%{limit} would let none run: %K with K of 1 or more, or no %" if count < 1 else "")
    ranges = []
    for part in body.split(","):
        found = _ID_RANGE.fullmatch(part)
        if not found:
            why = why or "FIRST-LAST, e.g. 0-15"
            continue
        first, last, step = int(found[1]), int(found[2] or found[1]), int(found[3] or 1)
        if last < first or step < 1 or last > MAX_ARRAY_INDEX:
            why = why or f"FIRST <= LAST, a step of 1 or more, ids up to {MAX_ARRAY_INDEX}"
        else:
            ranges.append(range(first, last + 1, step))
    if why:
        raise Problem(f"--array={show(spec)} is not a task list Slurm reads ({why}). Fix: FIRST-LAST, e.g. 0-15, "
                      "with %K to run at most K at a time.")
    return ranges


def array_tasks(spec) -> list[int] | None:
    """The task ids of ``--array=SPEC`` ("0-2", "0-2%2", "0,1,2", "0-6:2"); None when Slurm would not read it."""
    if not isinstance(spec, str):
        return None
    try:
        return sorted({task for ids in array_ranges(spec) for task in ids})
    except Problem:
        return None


# ---------------------------------------------------------------------------------------------- getopt_long

# A command's options as getopt_long sees them: each long name in order with its argument (0 none, 1 required,
# 2 optional), the short letters (letter -> long name), and the option each long name stands for (an alias's).
OptionTable = collections.namedtuple("OptionTable", "long short alias")


def option_table(names: str, short: str, alias: dict) -> OptionTable:
    """A table from Slurm's lists: each long name as Python's getopt spells it (name= takes an argument, name=? may
    take one, a bare name none); the short letters as "Nnodes cc..." pairs (letter then its long name)."""
    long = {name: {"": 0, "=": 1, "=?": 2}[argument] for name, argument in re.findall(r"([^\s=]+)(=\??|)", names)}
    return OptionTable(long, {pair[0]: pair[1:] for pair in short.split()},
                       {name: alias.get(name, name) for name in long})


def _long_name(body: str, table: OptionTable) -> str:
    """The option ``--body`` names: itself, or the one option its name is a prefix of (aliases count as one)."""
    name = body.partition("=")[0]
    if name in table.long:
        return name
    matches = [option for option in table.long if option.startswith(name)]
    if not matches:
        raise Problem(f"unrecognized option '--{body}'")
    differ = [option for option in matches
              if (table.long[option], table.alias[option]) != (table.long[matches[0]], table.alias[matches[0]])]
    if differ:
        listed = " ".join(f"'--{option}'" for option in [matches[0], *differ])
        raise Problem(f"option '--{body}' is ambiguous; possibilities: {listed}")
    return matches[0]


def getopt_long(args: list[str], table: OptionTable) -> tuple[list[tuple[str, str | None]], list[str]]:
    """(option, value) for each option in ``args`` as glibc's getopt_long reads them (a unique prefix names an
    option), then the operands; ``Problem`` with getopt's own words where it would stop."""
    found, i = [], 0
    # Slurm's tables do not permute: the first operand (or "--") ends the options
    while i < len(args) and args[i].startswith("-") and args[i] not in ("-", "--"):
        arg = args[i]
        if arg.startswith("--"):
            _, eq, value = arg[2:].partition("=")
            name = _long_name(arg[2:], table)
            if eq and table.long[name] == 0:
                raise Problem(f"option '--{name}' doesn't allow an argument")
            if not eq and table.long[name] == 1:
                if i + 1 >= len(args):
                    raise Problem(f"option '--{name}' requires an argument")
                i, value = i + 1, args[i + 1]
            found.append((table.alias[name], value if eq or table.long[name] == 1 else None))
        else:
            for j, letter in enumerate(arg[1:], 2):  # the letters, each with what follows it (from j)
                if letter not in table.short:
                    raise Problem(f"invalid option -- '{letter}'")
                name = table.short[letter]
                if table.long[name] == 0:
                    found.append((table.alias[name], None))
                    continue
                rest = arg[j:]
                if not rest and table.long[name] == 1:
                    if i + 1 >= len(args):
                        raise Problem(f"option requires an argument -- '{letter}'")
                    i, rest = i + 1, args[i + 1]
                found.append((table.alias[name], rest or None))
                break
        i += 1
    operands = args[i:]
    return found, operands[1:] if operands[:1] == ["--"] else operands


SBATCH = option_table(
    "account= acctg-freq= array= autocomplete= batch= begin= bb= bbf= cluster-constraint= chdir= cluster= clusters= "
    "comment= consolidate-segments container= container-id= context= contiguous constraint= core-spec= "
    "cores-per-socket= cpu-freq= cpus-per-gpu= cpus-per-task= deadline= delay-boot= dependency= distribution= error= "
    "exclude= exclusive=? export= export-file= external extra= extra-node-info= get-user-env gid= gpu-bind= gpu-freq= "
    "gpus= gpus-per-node= gpus-per-socket= gpus-per-task= gres= gres-flags= help hint= hold ignore-pbs input= "
    "job-name= kill-on-invalid-dep= licenses= mail-type= mail-user= mcs-label= mem= mem-bind= mem-per-cpu= "
    "mem-per-gpu= mem-update= mincpus= network= nice=? no-kill=? no-requeue nodefile= nodelist= nodes= ntasks= "
    "ntasks-per-core= ntasks-per-gpu= ntasks-per-node= ntasks-per-socket= ntasks-per-tres= oom-kill-step=? open-mode= "
    "output= overcommit oversubscribe parsable partition= prefer= priority= profile= propagate=? qos= quiet reboot "
    "requeue=? resources= reservation= resv-ports=? runtime= segment= signal= sockets-per-node= spread-job "
    "spread-segments stepmgr switches= tasks-per-node= test-only thread-spec= threads-per-core= time= time-min= tmp= "
    "tres-bind= tres-per-task= uid= use-min-nodes verbose version usage wait wait-all-nodes= wckey= wrap=",
    "Aaccount aarray bbegin Dchdir Mclusters Cconstraint Score-spec ccpus-per-task ddependency mdistribution eerror "
    "xexclude Bextra-node-info Ggpus hhelp Hhold iinput Jjob-name Llicenses kno-kill Fnodefile wnodelist Nnodes "
    "nntasks ooutput Oovercommit soversubscribe ppartition qqos Qquiet ttime vverbose Vversion Wwait",
    alias={"tasks-per-node": "ntasks-per-node"})

SRUN = option_table(
    "accel-bind= account= acctg-freq= async autocomplete= bcast=? bcast-exclude= begin= bb= bbf= cluster-constraint= "
    "chdir= cluster= clusters= comment= compress=? consolidate-segments container= container-id= context= contiguous "
    "constraint= core-spec= cores-per-socket= cpu-bind= cpu_bind= cpu-freq= cpus-per-gpu= cpus-per-task= deadline= "
    "debugger-test delay-boot= dependency= disable-status distribution= epilog= error= exact exclude= exclusive=? "
    "export= external-launcher=? extra= extra-node-info= gpu-bind= gpu-freq= gpus= gpus-per-node= gpus-per-socket= "
    "gpus-per-task= gres= gres-flags= help het-group= hint= hold ignore-signals= immediate=? input= interactive jobid= "
    "job-name= kill-on-bad-exit=? label licenses= mail-type= mail-user= threads= mcs-label= mem= mem-bind= "
    "mem-per-cpu= mem-per-gpu= mem-update= mincpus= mpi= msg-timeout= multi-prog network= nice=? no-allocate no-kill=? "
    "nodefile= nodelist= nodes= ntasks= ntasks-per-core= ntasks-per-gpu= ntasks-per-node= ntasks-per-socket= "
    "ntasks-per-tres= oom-kill-step=? open-mode= output= overcommit overlap=? oversubscribe pack-group= parsable "
    "partition= prefer= preserve-env priority= profile= prolog= propagate=? pty=? qos= quiet quit-on-interrupt reboot "
    "relative= resources= reservation= resv-ports=? runtime= segment= send-libs=? signal= slurmd-debug= "
    "sockets-per-node= spread-job spread-segments stepmgr switches= task-epilog= task-prolog= tasks-per-node= "
    "test-only thread-spec= threads-per-core= time= time-min= tmp= treewidth= tres-bind= tres-per-task= unbuffered "
    "use-min-nodes verbose version usage wait= wait-for-children wckey= whole x11=?",
    "Aaccount bbegin Dchdir Mclusters Cconstraint Score-spec ccpus-per-task ddependency Xdisable-status "
    "mdistribution eerror xexclude Bextra-node-info Ggpus hhelp Hhold Iimmediate iinput Jjob-name "
    "Kkill-on-bad-exit llabel Llicenses Tthreads Zno-allocate kno-kill Fnodefile wnodelist Nnodes nntasks ooutput "
    "Oovercommit soversubscribe ppartition Epreserve-env qqos Qquiet rrelative ttime uunbuffered vverbose Vversion "
    "Wwait",
    alias={"tasks-per-node": "ntasks-per-node", "cpu_bind": "cpu-bind", "pack-group": "het-group"})


# ---------------------------------------------------------------------------------------------- #SBATCH lines

MAGIC = ("#SBATCH", "#SLURM")  # sbatch reads both (the second with a warning)


def sbatch_arguments(rest: str) -> list[str]:
    """The arguments of one ``#SBATCH`` line as sbatch's ``get_argument`` splits them, which is not quite as a shell
    would: unquoted white space ends an argument even after a backslash (``a\\ b`` is two), a backslash keeps the
    character after it, a quote inside quotes too; an unquoted # starts a comment, an empty argument ends the line;
    ``Problem`` for a quote that does not close."""
    words, word, quote, escaped = [], None, "", False
    for char in rest:
        if char in " \t\n\v\f\r" and not quote:  # an escaped space too
            words += [] if word is None else ["".join(word)]
            word, escaped = None, False
        elif escaped or (quote and char not in (quote, "\\")):
            word, escaped = word + [char], False
        elif char == "\\":
            word, escaped = word or [], True
        elif quote or char in "'\"":
            word, quote = word or [], "" if quote else char
        elif char == "#":
            break
        else:
            word = (word or []) + [char]
    if quote:
        raise Problem(f"sbatch stops at a quote that does not close in #SBATCH{show(rest)}. Fix: close the quote.")
    words += [] if word is None else ["".join(word)]
    return words[:words.index("")] if "" in words else words


def directives_and_first_command(script: str) -> tuple[list[str], str | None, bool]:
    """(the #SBATCH options sbatch reads, the first command, whether #SBATCH lines follow it unread)."""
    arguments, lines = [], script.split("\n")
    for number, line in enumerate(lines):
        magic = next((m for m in MAGIC if line.startswith(m)), None)
        if magic:
            arguments += sbatch_arguments(line[len(magic):])
        elif line.strip() and not line.lstrip().startswith("#"):
            return arguments, line, any(later.startswith(MAGIC) for later in lines[number + 1:])
    return arguments, None, False
