"""Exercise 6.1's judge of a job script's text: the first mistake it shows against the exercise's own
specification (``JOB_SPEC``), as "problem. Fix: hint". The resources, the time limit and the warning signal,
the launch (srun starting torchrun on every node with the job's cores), the rendezvous: the job's first
node and a port torchrun can meet on, as bash would expand them and torchrun would read them.
"""

from __future__ import annotations

import math
import re
import signal as signals

from .answer_values import Problem, show
from .bash_arithmetic import BashArithmeticError, Unreadable, moduli, parse
from .bash_arithmetic import evaluate as evaluate_arithmetic
from .bash_arithmetic import expand as expand_arithmetic
from .bash_expansion import RUNTIME, Shell, basename, literal, render
from .bash_reader import shell_commands
from .job_script import (COMMAND_PREFIXES, JOB_SPEC, RDZV_FIX, JobRequest, JobSpec, Launch, Refusal, node_text,
                         read_job_script, torchrun_args, torchrun_option_problem)
from .job_script_forward import forward_problem, signal_name
from .job_script_text import syntax_problem, text_problem
from .slurm_rules import NO_LIMIT, SIGNAL_EARLY_S, getopt_long, option_table, slurm_signal, time_limit_s, whole

NO_LAUNCH = ("no torchrun line: the job would start nothing (torchrun, or python -m torch.distributed.run, with srun "
             "in front). Fix: keep the launch line of the template.")
_JOB_IDS = ("SLURM_JOB_ID", "SLURM_JOBID", "SLURM_ARRAY_JOB_ID")
# Job ids the port must suit: small, around the usual modulus, and up to Slurm's default MaxJobId.
_SAMPLE_JOB_IDS = (1, 2, 999, 1000, 1234, 65535, 65536, 67_043_327)


def _n(count: int, noun: str) -> str:
    return f"one {noun}" if count == 1 else f"{count} {noun}s"


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


def _rendezvous_problem(job: JobRequest, args, spec: JobSpec) -> str | None:
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


# ---------------------------------------------------------------------------------------------- the request


def _launch_problem(job: JobRequest, launch: Launch, spec: JobSpec) -> str | None:
    """srun in front of torchrun, where the exercise needs it on every node."""
    if launch.srun_refusal:
        return (f"srun would refuse its options: {show(launch.srun_refusal, 100)}. Fix: srun "
                "--cpus-per-task=\"$SLURM_CPUS_PER_TASK\" torchrun ..., as in the template.")
    if launch.srun is None and spec.every_node:
        return (f"{launch.launcher} is started without srun: the batch shell runs on the job's first node only, so "
                "with --nodes=2 (the notebook: only #SBATCH --nodes changes) the second node would start no agent "
                "and the rendezvous would wait for it until it times out. Fix: srun "
                f"--cpus-per-task=\"$SLURM_CPUS_PER_TASK\" {launch.launcher} ..., as in the template.")
    if "timeout" in launch.wrappers:
        return ("timeout in front of torchrun ends it on a clock of its own, before the job's time limit and its "
                "warning, so no checkpoint is written. Fix: leave timeout out: #SBATCH --time limits the job.")
    for name, value in (launch.srun or {}).items():
        why = _SRUN_BREAKS.get(name)
        if name == "--export" and value is not None and (literal(job.shell.decode(value)) or "ALL").split(",")[0] \
                .upper() != "ALL":
            why = "starts torchrun without the batch shell's environment (its PATH among it): torchrun is not found"
        if why:
            shown = f"{name}={show(render(job.shell.decode(value)))}" if value is not None else name
            return (f"srun {shown} on the launch line {why}. Fix: srun --cpus-per-task=\"$SLURM_CPUS_PER_TASK\" "
                    "torchrun ..., as in the template.")
    for nodes in (job.nodes[0], 2) if spec.every_node else (job.nodes[0],):
        value = (launch.srun or {}).get("--ntasks")
        count = whole(_on_nodes(job, job.shell.decode(value), nodes) or "") if value is not None else None
        if value is not None and count is not None and count != nodes * spec.tasks_per_node:
            return (f"srun --ntasks={show(render(job.shell.decode(value)))} starts {count} torchrun agent(s) in a job "
                    f"of {_n(nodes, 'node')}: every node needs exactly one. Fix: leave --ntasks out (srun starts "
                    "the job's tasks, one per node), or --ntasks=\"$SLURM_JOB_NUM_NODES\".")
    return None


# srun options that change where or how the launch runs, and what each does to it.
_SRUN_BREAKS = {
    "--nodelist": "ties the step to named nodes: with --nodes=2 the other node starts no agent",
    "--exclude": "leaves nodes of the job out: their agents never start",
    "--relative": "starts the step at a node other than the job's first, which srun refuses on one node",
    "--test-only": "only estimates when the step would start: nothing runs",
    "--multi-prog": "reads the first word after the options as a configuration file, not as the program to run",
    "--time": "gives the step its own time limit, one the warning was not planned on",
    "--mem": "gives the step its own memory limit, one the processes may not fit",
    "--mem-per-cpu": "gives the step its own memory limit, one the processes may not fit",
    "--immediate": "gives up when the step's resources are not free at once",
    "--signal": "makes Slurm signal the step's tasks, the torchrun agents, which SIGUSR1 ends",
}


_NODE_COUNTS = ("SLURM_JOB_NUM_NODES", "SLURM_NNODES")
_TASK_COUNTS = ("SLURM_NTASKS", "SLURM_NPROCS")


def _on_nodes(job: JobRequest, parts: list, nodes: int) -> str | None:
    """The parts' text in a job of ``nodes`` nodes (Slurm's node and task counts filled in); None if unknown."""
    tasks = whole(job.directives.ntasks) if job.directives.ntasks is not None else nodes * job.tasks_per_node
    filled = [str(nodes) if p in [("var", v) for v in _NODE_COUNTS] else
              str(tasks) if p in [("var", v) for v in _TASK_COUNTS] else p for p in parts]
    return literal(filled)


def _node_count_problem(job: JobRequest, args, launch: Launch, spec: JobSpec) -> str | None:
    """torchrun's --nnodes (and srun's --nodes) in this job, and in the same script run with --nodes=2."""
    fix = "Fix: --nnodes=\"$SLURM_JOB_NUM_NODES\", Slurm's count of the job's nodes."
    low = job.nodes[0]
    parts = job.shell.decode(args.nnodes)
    shown = show(render(parts))
    for nodes in (low, 2) if spec.every_node else (low,):
        text = _on_nodes(job, parts, nodes)
        first, _, last = (text or "").partition(":")
        least, most = whole(first.strip()), whole(last.strip()) if last else whole(first.strip())
        if text is None or least is None or most is None:
            return f"--nnodes={shown} is not a count of nodes the check can read before the job runs. {fix}"
        if not least <= nodes <= most:
            if nodes == low:
                return (f"--nnodes={shown}: torchrun would wait for that many nodes to join, and the job has "
                        f"{_n(low, 'node')}. {fix}")
            return (f"--nnodes={shown}: right for {_n(low, 'node')}, but the same script must train on two nodes "
                    "with only #SBATCH --nodes changed (the notebook), and there torchrun would still take "
                    f"{_n(most, 'node')}: the other node's agent could not join the rendezvous. {fix}")
        step = (launch.srun or {}).get("--nodes")
        if step is not None and _on_nodes(job, job.shell.decode(step), nodes) != str(nodes):
            return (f"srun --nodes={show(render(job.shell.decode(step)))}: the step must span the job's own nodes "
                    f"({_n(nodes, 'node')} with --nodes={nodes}); srun cannot take more than the job holds, and "
                    "fewer would leave a node without its agent. Fix: leave srun's --nodes out.")
    return None


def _step_cpus(job: JobRequest, launch: Launch) -> tuple[str | None, bool]:
    """(srun's cores per task as written, whether any reach it): --cpus-per-task, a cpu= in --tres-per-task,
    or SRUN_CPUS_PER_TASK exported (which srun reads from 22.05 to 23.02, where it ignores SLURM_CPUS_PER_TASK)."""
    srun = launch.srun or {}
    if srun.get("--cpus-per-task") is not None:
        return srun["--cpus-per-task"], True
    tres = re.search(r"(?:^|,)cpu[=:](\d+)", literal(job.shell.decode(srun.get("--tres-per-task") or "")) or "")
    if tres:
        return tres.group(1), True
    return None, "SRUN_CPUS_PER_TASK" in job.shell.exported or "SRUN_CPUS_PER_TASK" in launch.env


def _request_problem(job: JobRequest, args, launch: Launch, spec: JobSpec) -> str | None:
    """Nodes, tasks, processes and cores against the exercise's."""
    low, high = job.nodes
    if (low, high) != (spec.nodes, spec.nodes):
        return (f"--nodes={node_text(job)}: the exercise asks for {_n(spec.nodes, 'node')}, with "
                f"{spec.procs_per_node} training processes on it. Fix: --nodes={spec.nodes}.")
    problem = _launch_problem(job, launch, spec)
    if problem:
        return problem
    tasks, tasks_flag = job.tasks_per_node, "--ntasks-per-node"
    for flag in ("--ntasks-per-node", "--ntasks"):  # srun's own count wins over the #SBATCH line's
        value = (launch.srun or {}).get(flag)
        if value is not None:
            number = whole(_on_nodes(job, job.shell.decode(value), low) or "")
            if number is None or number < 1:
                return (f"srun {flag}={show(render(job.shell.decode(value)))} is not a count the check can read. "
                        "Fix: leave it out: srun starts the job's tasks, one per node.")
            tasks, tasks_flag = (number if flag == "--ntasks-per-node" else math.ceil(number / low)), f"srun {flag}"
            break
    nproc_text = literal(job.shell.decode(args.nproc_per_node))
    if nproc_text in ("auto", "cpu", "gpu"):
        per = "GPU" if nproc_text == "gpu" else "core (or GPU)"
        return (f"--nproc-per-node={nproc_text}: torchrun would start one process per {per} of the node, not the "
                f"{spec.procs_per_node} the exercise asks for. Fix: --nproc-per-node={spec.procs_per_node}.")
    nproc = whole(nproc_text)
    if nproc is None or nproc < 1:
        return (f"--nproc-per-node={show(render(job.shell.decode(args.nproc_per_node)))} is not a number of "
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
    problem = _node_count_problem(job, args, launch, spec)
    if problem:
        return problem
    cpus = job.cpus_per_task
    step, reaches = _step_cpus(job, launch)
    step_cpus = whole(literal(job.shell.decode(step))) if step is not None else None
    if step_cpus is not None and step_cpus != cpus:
        return (f"srun --cpus-per-task={step_cpus} for a job with --cpus-per-task={cpus}: the launch would ask for "
                "other cores than the job holds. Fix: srun --cpus-per-task=\"$SLURM_CPUS_PER_TASK\".")
    need = nproc * spec.cores_per_proc
    if cpus < need:
        given = "" if job.directives.cpus_per_task is not None else " (sbatch's default without --cpus-per-task)"
        return (f"--cpus-per-task={cpus}{given} for {nproc} training processes: they would take turns on {cpus} "
                f"core(s). Fix: --cpus-per-task of at least {nproc} (one core per process here).")
    if cpus > need:
        return (f"--cpus-per-task={cpus} for {nproc} training processes of one thread each (OMP_NUM_THREADS=1): "
                f"{cpus - need} core(s) would sit idle, held from everyone else. Fix: --cpus-per-task={need}, "
                "one core per process.")
    threads_word = job.shell.assigned.get("OMP_NUM_THREADS") if "OMP_NUM_THREADS" in job.shell.exported else None
    threads = whole(literal(job.shell.parts(threads_word)) or "") if threads_word is not None else None
    if threads is not None and threads * nproc > cpus:
        return (f"OMP_NUM_THREADS={threads} for {nproc} training processes on {cpus} core(s): {threads * nproc} "
                "threads would take turns on them, each process slowed by the others. Fix: export OMP_NUM_THREADS=1, "
                "one thread per process, as the template does.")
    if launch.srun is not None and not reaches and cpus > 1:
        return (f"srun starts torchrun without --cpus-per-task: Slurm 22.05 to 23.02 do not pass the job's "
                f"--cpus-per-task on to srun, so there its one task gets one core and the {nproc} training processes "
                "(and their DataLoader workers) take turns on it. Fix: srun --cpus-per-task=\"$SLURM_CPUS_PER_TASK\" "
                "torchrun ..., as in the template, which every Slurm reads alike.")
    return None


def _time_problem(job: JobRequest, spec: JobSpec) -> str | None:
    """--time and --signal against the exercise's: the limit fits the work and the warning, which the batch
    shell receives in time to pass on."""
    text = job.directives.time
    if text is None:
        return ("no --time: the job would get the partition's default limit, perhaps shorter than it needs, perhaps "
                "far longer than it asks for. Fix: --time with the work and the warning's lead, e.g. 00:05:00.")
    if text == "":
        return ("--time= is empty, which sbatch refuses (\"Invalid --time specification\") before it queues "
                "anything. Fix: --time with the work and the warning's lead, e.g. 00:05:00.")
    limit = time_limit_s(text)
    if limit is None:
        return (f"--time={show(text)} is not a duration Slurm reads. Fix: minutes (5), MM:SS, HH:MM:SS (00:05:00), "
                "D-HH, D-HH:MM or D-HH:MM:SS.")
    if limit == NO_LIMIT:
        return (f"--time={show(text)} asks for no time limit: the job gets the partition's longest, waits longer "
                "for a slot, and its warning comes only then. Fix: a limit the job fits into, e.g. 00:05:00.")
    flag = job.directives.signal
    if flag is None or flag == "":
        empty = "--signal= is empty, which sbatch refuses (\"Invalid --signal specification\"); and with " if (
            flag == "") else ""
        return (f"{empty}no --signal: when the time limit comes, Slurm ends the job without warning and the steps "
                "since the last checkpoint are lost. Fix: #SBATCH --signal=B:USR1@60 sends SIGUSR1 to the script 60 s "
                "before the end; its trap passes it on and the training loop checkpoints and stops.")
    warning = slurm_signal(flag)
    if warning is None:
        return (f"--signal={show(flag)} is not a signal option sbatch reads ([B:]SIGNAL[@SECONDS]). Fix: "
                "--signal=B:USR1@SECONDS, SECONDS the warning's lead time.")
    if warning.signal != int(getattr(signals, "SIG" + spec.warning)):
        return (f"--signal={show(flag)} sends {signal_name(warning.signal)}: the trap and the training loop "
                f"listen for SIG{spec.warning}. Fix: --signal=B:{spec.warning}@SECONDS, SECONDS the warning's lead "
                "time.")
    if not warning.to_batch_shell:
        return (f"--signal={show(flag)} has no B:, so Slurm sends SIG{spec.warning} to the job's steps (the tasks "
                "srun started), not to the batch shell: the script's trap never fires. Fix: "
                f"--signal=B:{spec.warning}@{warning.lead_s}.")
    lead = warning.lead_s
    if lead < spec.min_lead_s:
        return (f"--signal gives {lead} s of warning: too little to write a checkpoint on a busy file system. Fix: "
                f"at least {spec.min_lead_s} s, a minute to be safe (B:{spec.warning}@60).")
    # sbatch may send the signal up to 60 s before the time asked for (its manual): that minute counts too.
    if limit < spec.needed_s + lead + SIGNAL_EARLY_S:
        return (f"--time of {limit:g} s: the job needs about {spec.needed_s} s, and the warning comes {lead} s before "
                f"the end, up to {SIGNAL_EARLY_S} s earlier still (sbatch's resolution), so it could run out of time. "
                f"Fix: {_longer(spec, lead)}.")
    if limit > spec.max_time_s:
        return (f"--time={show(text)} asks for {limit / 3600:g} h for about {spec.needed_s // 60} minutes of work: "
                "a long request waits longer for its slot and holds what it does not use. Fix: the work and the "
                "warning's lead, with some room: e.g. 00:05:00.")
    return None


def _longer(spec: JobSpec, lead: int) -> str:
    """The fix for a limit the warning's lead leaves too short: a longer limit, or a shorter lead."""
    need = spec.needed_s + lead + SIGNAL_EARLY_S
    minutes = math.ceil(need / 60)
    example = f"{minutes // 60:02d}:{minutes % 60:02d}:00"
    if need > spec.max_time_s:
        return (f"a warning of a minute or two (B:{spec.warning}@60): a {lead} s lead would need a limit of {need} s, "
                "far more than the work")
    shorter = f", or a shorter warning (B:{spec.warning}@60)" if lead > 2 * spec.min_lead_s * 2 else ""
    return f"at least {need} s, e.g. {example}{shorter}"


def _command_word(fields: list[str]) -> str:
    words = [w for w in fields if w not in COMMAND_PREFIXES]
    return words[0] if words else ""


def _job_problem(job: JobRequest, spec: JobSpec) -> str | None:
    if not job.launches:
        return NO_LAUNCH
    if len(job.launches) > 1:
        return (f"the script starts torchrun {len(job.launches)} times: the job would train {len(job.launches)} "
                "times over. Fix: one launch line, as in the template.")
    launch = job.launches[0]
    try:
        args = torchrun_args(launch.args)
    except Refusal as err:
        return (f"torchrun would refuse its arguments: {show(job.shell.readable(str(err)), 100)}. Fix: keep the options of the "
                "template's launch line.")
    problem = _request_problem(job, args, launch, spec) or _time_problem(job, spec) or _rendezvous_problem(
        job, args, spec)
    if problem:
        return problem
    script = literal(job.shell.decode(args.training_script))
    if not args.module or script != "workshop_utils.train":
        return (f"the launch line runs {show(render(job.shell.decode(args.training_script)))}, not the training "
                "(-m workshop_utils.train). Fix: -m workshop_utils.train \"$@\" at its end, as in the template.")
    if not any(("var", "@") in job.shell.decode(a) for a in args.training_script_args):
        return ("the launch line does not pass \"$@\" on: the check's training flags (steps, checkpoints) would never "
                "reach the training. Fix: keep \"$@\" at the end of the launch line.")
    return forward_problem(job, launch, spec)


def script_problem(script: str, spec: JobSpec = JOB_SPEC) -> str | None:
    """The first mistake the script's text shows against the exercise (``spec``), as "problem. Fix: ...";
    None when the text is right."""
    problem = text_problem(script) if isinstance(script, str) else None
    if problem:
        return problem
    try:
        job = read_job_script(script, spec)
        problem = syntax_problem(script) or _job_problem(job, spec)
        return job.shell.readable(problem) if problem else None  # no encoded word reaches a message
    except Problem as problem:
        return str(problem)
    except RecursionError:
        return ("the script nests its quotes and substitutions deeper than the check follows. Fix: the launch line "
                "of the template, its gaps filled.")
