"""Exercise 6.1's judge of the rendezvous: the host torchrun's agents meet at must be the job's first node (the
first line of ``scontrol show hostnames``, as bash would expand it), and the port one they can all reach, the
same on every node and apart from other jobs'.
"""

from __future__ import annotations

import re

from .answer_values import Problem, show
from .bash_arithmetic import BashArithmeticError, Unreadable, moduli, parse
from .bash_arithmetic import evaluate as evaluate_arithmetic
from .bash_arithmetic import expand as expand_arithmetic
from .bash_expansion import RUNTIME, Shell, basename, literal, render
from .bash_reader import shell_commands
from .job_script import RDZV_FIX, JobRequest, JobSpec, torchrun_option_problem
from .slurm_rules import getopt_long, option_table

_JOB_IDS = ("SLURM_JOB_ID", "SLURM_JOBID", "SLURM_ARRAY_JOB_ID")
# Job ids the port must suit: small, around the usual modulus, and up to Slurm's default MaxJobId.
_SAMPLE_JOB_IDS = (1, 2, 999, 1000, 1234, 65535, 65536, 67_043_327)


# ---------------------------------------------------------------------------------------------- the first node

# GNU head's options (it reorders them, so they may follow its file).
_HEAD = option_table("head", "bytes lines quiet silent verbose zero-terminated help version",
                     "quiet silent verbose zero-terminated help version", "", "cbytes nlines qquiet vverbose "
                     "zzero-terminated", permute=True)


def _keeps_first_line(words: list) -> tuple[bool, list]:
    """Whether ``head``/``sed``/``awk`` with these words (literal text, None where unknown) keeps its input's
    first line alone, and the file operands it reads instead of its input."""
    if None in words or not words:
        return False, []
    program, args = basename(words[0]), words[1:]
    if program == "head":
        if args[:1] and re.fullmatch(r"-[0-9]+", args[0]):  # the old form, head -1
            args = ["-n", args[0][1:], *args[1:]]
        try:
            found, files = getopt_long(args, _HEAD)
        except Problem:
            return False, []
        files = [f for f in files if f != "-"]  # - is its standard input
        options = dict(found)
        lines = options.get("lines", "10")
        # head reads NUM in base 10 (01 is 1); -v and a second file add a header, -c counts bytes, -z NULs.
        first = re.fullmatch(r"\s*\+?0*1", lines or "") is not None
        return first and not {"bytes", "verbose", "zero-terminated"} & set(options) and len(files) <= 1, files
    if program == "sed":
        quiet = any(a in ("-n", "--quiet", "--silent") for a in args)
        rest = [a for a in args if a not in ("-n", "--quiet", "--silent", "-E", "-r", "-u")]
        if not rest or rest[0].startswith("-"):
            return False, []
        script = re.sub(r"\s", "", rest[0])
        keeps = (re.fullmatch(r"0*1p|0*1\{p(;q)?;?\}|0*1p;0*1q", script) if quiet else
                 re.fullmatch(r"(0*1)?q|0*1!d|0*2,\$d", script))
        return keeps is not None and len(rest) <= 2, rest[1:]
    if program == "awk" and args and not args[0].startswith("-"):
        script = re.sub(r"\s", "", args[0])
        keeps = re.fullmatch(r"NR==0*1(\{print(\$0)?;?(exit;?)?\})?|\{print(\$0)?;exit;?\}", script)
        return keeps is not None and len(args) <= 2, args[1:]
    return False, []


def _passes_name_on(words: list) -> bool:
    """Whether this filter leaves one host name as the name: ``cat``, ``xargs``, ``tr -d`` of white space."""
    if None in words or not words:
        return False
    program, args = basename(words[0]), words[1:]
    if program == "cat":
        return all(a == "-" for a in args)
    if program == "xargs":
        return args in ([], ["echo"])
    return program == "tr" and len(args) == 2 and args[0] == "-d" and \
        re.fullmatch(r"(\\[ntr]|[ \t\n]|\[:space:\]|\[:blank:\])+", args[1]) is not None


def _scontrol_problem(words: list, shell: Shell) -> str | None:
    """Why this command is not `scontrol show hostnames` of the job's node list; None when it is."""
    if not words or literal(words[0]) is None or basename(literal(words[0])) != "scontrol":
        return "is not read from the job's node list"
    rest = [w for w in words[1:] if not (literal(w) or "").startswith("-")]
    if [literal(w) for w in rest[:1]] != ["show"] or len(rest) < 2 or literal(rest[1]) not in ("hostnames",
                                                                                              "hostname"):
        return "is not `scontrol show hostnames`, which lists the job's nodes one a line"
    if len(rest) > 3:
        return "gives scontrol more than one node list"
    if len(rest) == 3 and rest[2] not in ([("var", "SLURM_JOB_NODELIST")], [("var", "SLURM_NODELIST")]):
        return f"expands {show(render(rest[2]))}, not the job's node list $SLURM_JOB_NODELIST"
    return None


def _first_node_problem(inner: str, shell: Shell) -> str | None:
    """Why ``$(inner)`` is not the first node of the job's node list; None when it is: scontrol's list piped
    into a filter that keeps its first line, or that filter reading the list from a process substitution."""
    commands = [c for c in shell_commands(inner) if not c.nested]
    pipeline = [[shell.parts(w) for w in c.words] for c in commands]
    while len(pipeline) > 1 and commands[-2].operator == "|" and commands[-1].stdin is None and \
            _passes_name_on([literal(w) for w in pipeline[-1]]):
        commands, pipeline = commands[:-1], pipeline[:-1]
    if not pipeline:
        return "is not read from the job's node list"
    if any(c.stdout_elsewhere for c in commands):
        return "sends its output elsewhere (a > redirection), so the substitution would be empty"
    if len(pipeline) == 1:
        words = pipeline[0]
        if words and literal(words[0]) is not None and basename(literal(words[0])) == "scontrol":
            return (_scontrol_problem(words, shell) or "lists every node of the job, one a line: on two nodes "
                    "torchrun would get both names as its one host")
        substituted = [w[0][1] for w in words if len(w) == 1 and not isinstance(w[0], str) and w[0][0] == "procsub"]
        stdin = shell.parts(commands[0].stdin) if commands[0].stdin else []
        if len(stdin) == 1 and not isinstance(stdin[0], str) and stdin[0][0] == "procsub":
            substituted.append(stdin[0][1])
        herestring = shell.parts(commands[0].herestring) if commands[0].herestring else []
        if len(herestring) == 1 and not isinstance(herestring[0], str) and herestring[0][0] == "subst":
            substituted.append(herestring[0][1])  # head <<< "$(scontrol ...)"
        plain = [literal(w) for w in words if not (len(w) == 1 and not isinstance(w[0], str) and w[0][0] == "procsub")]
        if len(substituted) != 1:
            return "is not read from the job's node list"
        source = [c for c in shell_commands(substituted[0]) if not c.nested]
        why = _scontrol_problem([shell.parts(w) for w in source[0].words], shell) if len(source) == 1 else (
            "is not read from the job's node list")
        if len(source) == 1 and source[0].stdout_elsewhere:
            why = "sends scontrol's list elsewhere (a > redirection), so head would read nothing"
        if why:
            return why
        keeps, files = _keeps_first_line(plain)
        kept = show(" ".join(w or "?" for w in plain))
        return None if keeps and not files else f"keeps `{kept}` of scontrol's list, not its first line"
    if len(pipeline) > 2 or commands[0].operator != "|":
        return "is not one name taken from scontrol's list as the check can read it"
    why = _scontrol_problem(pipeline[0], shell)
    if why:
        return why
    second = [literal(w) for w in pipeline[1]]
    if second[:1] == ["tail"]:
        return "is the job's last node, not its first"
    keeps, files = _keeps_first_line(second)
    if keeps and not files and commands[1].stdin is None:
        return None
    kept = show(" ".join(w if w is not None else "?" for w in second))
    return f"keeps `{kept}` of scontrol's list, not its first line"


def _host_problem(parts: list, shell: Shell) -> str | None:
    """Why the rendezvous host is not the job's first node; None when it is."""
    shown = show(render(parts))
    text = literal(parts)
    if text is not None:
        bare = text.strip("[]").lower()
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
        if kind == "unset" and what in shell.elsewhere:
            return (f"the rendezvous host ${what} is set only in {shell.elsewhere[what]}, which runs apart from the "
                    "batch shell: the launch line does not see it, so the host would be empty. Fix: set "
                    f"{what} on a line of its own before the launch, or {RDZV_FIX}.")
        if kind == "unset":
            return (f"the rendezvous host ${what}: nothing in the script or Slurm sets it, so the host would be "
                    f"empty. Fix: {RDZV_FIX}, or set {what} from it on a line before the launch.")
        if kind == "var" and what == "SLURMD_NODENAME":
            return None  # the node the batch script runs on, which Slurm makes the job's first node, by its node name
        if (kind == "var" and what == "HOSTNAME") or (
                kind == "subst" and re.fullmatch(r"\s*hostname( -[sf]| --short| --fqdn)?\s*", what)):
            return (f"the rendezvous host {shown} is the batch node's own host name, which need not be the name "
                    "Slurm lists it under, the one the other nodes reach it by; the exercise asks for a name from "
                    f"the job's node list ($SLURMD_NODENAME is the batch node's). Fix: {RDZV_FIX}.")
        if kind == "subst":
            why = _first_node_problem(what, shell)
            return None if why is None else f"the rendezvous host {shown} {why}. Fix: {RDZV_FIX}."
    return (f"the rendezvous host {shown} is not the job's first node as the check can read it (the first line of "
            f"scontrol's list, directly or through a variable set before the launch). Fix: {RDZV_FIX}.")


# ---------------------------------------------------------------------------------------------- the port


def _arithmetic_ports(expression: str, shell: Shell) -> list[tuple[int, int]]:
    """(job id, port) for sample job ids of a ``$((...))`` port; ValueError where bash or the check cannot
    evaluate it."""
    def value_of(name: str, job: int = 0):
        if name == "RANDOM":  # bash's 0 to 32767, drawn once where the batch shell expands it
            return job % 32768
        return job if name in _JOB_IDS else shell.text_of(name)

    def fixed(name: str):
        if name in _JOB_IDS or name == "RANDOM":
            raise Unreadable(name)
        return shell.text_of(name)

    tree = parse(expand_arithmetic(expression, value_of))
    # JOB % m is largest at m - 1 and smallest at m: those job ids too, whatever the modulus.
    found = moduli(tree, fixed)
    jobs = sorted({*_SAMPLE_JOB_IDS, *(m - 1 for m in found if m > 1), *found, *(2 * m - 1 for m in found)})
    return [(job, evaluate_arithmetic(tree, lambda name, job=job: value_of(name, job))) for job in jobs]


def _port_problem(parts: list | None, shell: Shell) -> str | None:
    """Why the rendezvous port is not one torchrun's agents can meet on; None when it is (or torchrun's default)."""
    if parts is None:
        return None  # no port: torchrun's c10d default, 29400
    fix = "Fix: a port from 1024 to 65535, e.g. 29500, or $((29500 + SLURM_JOB_ID % 1000))."
    shown, text = show(render(parts)), literal(parts)
    if text is not None and re.fullmatch(r"[0-9]+", text):
        if len(text) > 5:  # torchrun's _try_parse_port
            return f"the port {shown} is not one torchrun reads: a port is 1 to 5 digits. {fix}"
        samples = [(None, int(text))]
    elif len(parts) == 1 and parts[0][0] in ("subst", "param"):
        return None  # a number the batch shell fixes once, before srun starts the agents: they all get the same
    elif len(parts) == 1 and (parts[0][0] == "arith" or parts[0] in [("var", n) for n in (*_JOB_IDS, "RANDOM")]):
        try:
            samples = _arithmetic_ports(parts[0][1], shell)
        except BashArithmeticError as err:
            return f"the port {shown} is not a number bash reads ({show(str(err))}). {fix}"
        except (Unreadable, RecursionError) as err:
            if str(err).lstrip("$") in RUNTIME:
                return None  # known only when the job runs, and fixed once in the batch shell
            return f"the port {shown} is not a number the check can read ({show(str(err))}). {fix}"
    else:
        return (f"the port {shown} is not a number the check can read (a number, or $((...)) of the job id). {fix}")
    worst = min(samples, key=lambda s: (0 if s[1] <= 0 else 1 if s[1] > 65535 else 2 if s[1] < 1024 else 3))
    job, port = worst
    random = "RANDOM" in render(parts)  # its draws stand in for the sample job ids
    value = "" if job is None else f" can be {port}" if random else f" is {port} for job {job}"
    if port == 0:
        lead = "port 0" if job is None else f"the port {shown}{value}, and port 0"
        return (f"{lead} is not a port torchrun can rendezvous on: the first node's agent would listen on whatever "
                f"port the system picks, which the other nodes' agents cannot know. {fix}")
    if port < 0:
        why = "a negative port, which torchrun refuses"
    elif port > 65535:
        why = "ports end at 65535"
    elif port < 1024:
        why = "only root may listen below 1024"
    else:
        return None
    return f"the port {shown}{value}: {why}. {fix}"


def _endpoint_parts(parts: list) -> tuple[list, list | None]:
    """(host, port) of a rendezvous endpoint as torchrun splits it: its ends stripped, then at the last colon,
    unless [IPv6]."""
    parts = list(parts)
    if parts and isinstance(parts[0], str):
        parts[0] = parts[0].lstrip()
    if parts and isinstance(parts[-1], str):
        parts[-1] = parts[-1].rstrip()
    parts = [p for p in parts if p != ""]
    text = literal(parts)
    if text is not None and text.startswith("[") and text.endswith("]"):
        return parts, None
    for k in range(len(parts) - 1, -1, -1):
        if isinstance(parts[k], str) and ":" in parts[k]:
            before, _, after = parts[k].rpartition(":")
            return [*parts[:k], *([before] if before else [])], [*([after] if after else []), *parts[k + 1:]]
    return parts, None


def rendezvous_problem(job: JobRequest, args, spec: JobSpec) -> str | None:
    if args.standalone:
        return (f"--standalone: the agents meet on localhost, so the script works on one node only. Fix: "
                f"--rdzv-backend=c10d and {RDZV_FIX}.")
    backend = literal(job.shell.decode(args.rdzv_backend))
    if backend != "c10d":
        why = ("torchrun's default, static, needs each node started with its own --node-rank, which one srun line "
               "cannot give" if backend == "static" else "the exercise's agents meet in torchrun's own c10d store")
        return f"--rdzv-backend={show(render(job.shell.decode(args.rdzv_backend)))}: {why}. Fix: --rdzv-backend=c10d."
    problem = torchrun_option_problem(args, job.shell)
    if problem:
        return problem
    endpoint = job.shell.decode(args.rdzv_endpoint)
    host, port = _endpoint_parts(endpoint)
    if not host or (literal(host) or "x").strip() == "":
        return ("no rendezvous endpoint: torchrun's agents on the job's nodes have nowhere to meet. Fix: "
                "--rdzv-endpoint=HOST:PORT with HOST the job's first node, "
                "$(scontrol show hostnames \"$SLURM_JOB_NODELIST\" | head -n 1), and a free port such as 29500.")
    unexpanded = next((p for p in endpoint if isinstance(p, str) and re.search(r"\$[({A-Za-z_\[]|`", p)), None)
    if unexpanded is not None:
        return (f"the rendezvous endpoint holds {show(unexpanded)} as plain text: single quotes (or a backslash) stop "
                "bash from expanding $(...), ${...} and $NAME, so torchrun would get the text itself. Fix: double "
                f"quotes, e.g. {RDZV_FIX}.")
    for side, name, what in ((host, "host", "a host name is letters, digits, dots and dashes"),
                             (port or [], "port", "a port is 1 to 5 digits")):
        if any(isinstance(p, str) and re.search(r"\s", p) for p in side):
            where = "before" if name == "host" else "after"
            return (f"the rendezvous endpoint {show(render(endpoint))} holds a space {where} its colon, inside its "
                    f"quotes: torchrun strips only the ends of the endpoint, so torchrun would read the {name} as "
                    f"'{show(render(side))}' and refuse it ({what}). Fix: no space inside the quotes, e.g. {RDZV_FIX}.")
    return _host_problem(host, job.shell) or _port_problem(port, job.shell)
