"""Exercise 6.1's job script and what it asks for: the template with its gaps, the exercise's own
specification (``JOB_SPEC``), and a filled script read as sbatch, bash and torchrun read it (``JobRequest``):
its #SBATCH options, its commands and variables, and the launch line that starts torchrun.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import functools
import io
import math
import re

from .answer_values import Problem, show
from .bash_expansion import Shell, basename, literal
from .bash_flow import option_after, unreached_commands
from .bash_reader import ASSIGNMENT, LEADING, Command, shell_commands
from .slurm_rules import SRUN, count_problem, directives_and_first_command, getopt_long, node_range, sbatch_options

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
    # "With --nodes=2 the same script trains on two nodes: only #SBATCH --nodes changes" (the notebook): srun
    # must start torchrun on every node, with the job's cores per task.
    every_node: bool = True

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


class Refusal(Exception):
    """argparse's error, raised instead of printed with an exit."""


class RaisingParser(argparse.ArgumentParser):
    def error(self, message):
        raise Refusal(message)

    def exit(self, status=0, message=None):
        raise Refusal(message or "stopped")


# ---------------------------------------------------------------------------------------------- the launch line

COMMAND_PREFIXES = LEADING | {"exec", "nohup", "command", "builtin"}
# Programs that run the command after their own options unchanged, and what those options look like.
_WRAPPERS = {"nice": re.compile(r"-n|-?[0-9]+|--adjustment(=-?[0-9]+)?|-n-?[0-9]+"),
             "setsid": re.compile(r"-[a-z]+|--(ctty|fork|wait)"),
             "timeout": re.compile(r"-[a-zA-Z]+|--[a-z-]+(=\S+)?|[0-9.]+[smhd]?|[A-Z]+[0-9]*"),
             "time": re.compile(r"-[vpq]|--(verbose|portability|quiet|append)|-[oaf]|--(output|format)=\S+"),
             "apptainer": re.compile(r"exec|--?[a-z-]+(=\S+)?|\S+\.(sif|img|simg)|docker://\S+"),
             "singularity": re.compile(r"exec|--?[a-z-]+(=\S+)?|\S+\.(sif|img|simg)|docker://\S+"),
             "stdbuf": re.compile(r"-[ioe](L|[0-9]+[KMG]?)?|--(input|output|error)=\S+|L|[0-9]+[KMG]?"),
             "nohup": re.compile(r"(?!)"), "numactl": re.compile(r"-[a-zA-Z]|--[a-z-]+(=\S+)?|[0-9,-]+|all"),
             "chrt": re.compile(r"-[a-zA-Z]+|--[a-z-]+|[0-9]+"),
             "taskset": re.compile(r"-[a-zA-Z]+|--[a-z-]+|[0-9a-fx,-]+")}


@dataclasses.dataclass
class Launch:
    """One command that starts torchrun: srun's options in front of it (None without srun; canonical long names,
    "--cpus-per-task"), torchrun's arguments (encoded words, see ``Shell.fields``), how it was started, whether
    it runs in the background, and what srun would refuse in its options."""

    srun: dict | None
    args: list[str]
    launcher: str
    background: bool
    srun_refusal: str | None = None
    env: tuple[str, ...] = ()  # the names set in front of it (A=1 srun ..., env A=1 srun ...), for it alone
    exec_: bool = False  # started with exec, which replaces the batch shell (and its trap) with it
    wrappers: tuple[str, ...] = ()  # programs before srun or between it and torchrun (nice, timeout...)


_ENV_TAKES = {"-u", "--unset", "-C", "--chdir", "-S", "--split-string"}  # env's options that take the next word


def _past_wrappers(words: list[str], i: int) -> int:
    """The index past ``nice -n 5``, ``setsid``, ``timeout 50m``...: programs that run the rest unchanged."""
    while i < len(words) and basename(words[i]) in _WRAPPERS:
        i += 1 + next((k for k, w in enumerate(words[i + 1:]) if not _WRAPPERS[basename(words[i])].fullmatch(w)),
                      len(words) - i - 1)
    return i


def _launch_of(words: list[str], command: Command, shell: Shell | None = None) -> Launch | None:
    """The command as a torchrun launch (``torchrun``, ``python[3] -m torch.distributed.run``, either after
    ``srun [options]``), or None when it starts something else. ``shell`` reads the variables a ``bash -c``
    text may use: Slurm's and those the script exports."""
    i, env = 0, []
    while i < len(words) and (words[i] in COMMAND_PREFIXES or ASSIGNMENT.fullmatch(words[i])):
        env += [ASSIGNMENT.fullmatch(words[i]).group(1)] if ASSIGNMENT.fullmatch(words[i]) else []
        i += 1
    if i < len(words) and words[i] == "env":
        i += 1
        while i < len(words) and (words[i].startswith("-") or ASSIGNMENT.fullmatch(words[i])):
            env += [ASSIGNMENT.fullmatch(words[i]).group(1)] if ASSIGNMENT.fullmatch(words[i]) else []
            i += 2 if words[i] in _ENV_TAKES else 1
    srun, refusal, replaces, outer = None, None, "exec" in words[:i], i
    i = _past_wrappers(words, i)  # setsid srun ...
    outer_wrappers = tuple(basename(w) for w in words[outer:i] if basename(w) in _WRAPPERS)
    if i < len(words) and basename(words[i]) == "srun":
        try:
            found, rest = getopt_long(words[i + 1:], SRUN)
            srun, i = {"--" + name: value for name, value in found}, len(words) - len(rest)
        except Problem as problem:  # named as srun's mistake if torchrun follows
            starts = [k for k in range(i + 1, len(words)) if basename(words[k]) == "torchrun" or
                      re.fullmatch(r"python[0-9.]*", basename(words[k]))]
            if not starts:
                return None
            srun, refusal, i = {}, str(problem), starts[0]
    wrapped = i
    i = _past_wrappers(words, i)
    wrappers = outer_wrappers + tuple(basename(w) for w in words[wrapped:i] if basename(w) in _WRAPPERS)
    while i < len(words) and words[i] == "env":  # srun ... env A=1 torchrun
        i += 1
        while i < len(words) and (words[i].startswith("-") or ASSIGNMENT.fullmatch(words[i])):
            env += [ASSIGNMENT.fullmatch(words[i]).group(1)] if ASSIGNMENT.fullmatch(words[i]) else []
            i += 2 if words[i] in _ENV_TAKES else 1
    if i >= len(words):
        return None
    head, background = basename(words[i]), command.background
    if head in ("bash", "sh") and words[i + 1:i + 2] == ["-c"] and i + 2 < len(words) and "torchrun" in words[i + 2] \
            and ("\x00" in words[i + 2] or _command_string(words[i + 2], words[i + 4:], shell, tuple(env)) is None):
        raise Problem("the launch runs through bash -c with a text the check cannot follow: it reads one command of "
                      "plain words, \"$@\" and the variables the inner bash has (Slurm's, exported ones), in single "
                      "quotes. Fix: bash -c 'exec torchrun ... \"$@\"' torchrun \"$@\", or the template's launch line.")
    if head in ("bash", "sh") and words[i + 1:i + 2] == ["-c"] and i + 2 < len(words) and "\x00" not in words[i + 2]:
        inner = _launch_of(_command_string(words[i + 2], words[i + 4:], shell, tuple(env)) or [],  # $0, then "$@"
                           command, shell)
        if inner and words[i + 3:i + 4] and words[i + 3].startswith("-"):
            raise Problem(f"bash -c takes the word after its command string as $0, so {show(words[i + 3])} never "
                          "reaches torchrun through \"$@\". Fix: a name for $0 first: bash -c '...' torchrun "
                          "--nnodes=...")
        # exec inside bash -c replaces that bash, not the batch shell.
        return inner and dataclasses.replace(inner, srun=srun if inner.srun is None else inner.srun,
                                             srun_refusal=refusal or inner.srun_refusal, env=tuple(env) + inner.env,
                                             exec_=replaces)
    if head == "torchrun":
        return Launch(srun, words[i + 1:], "torchrun", background, refusal, tuple(env), replaces, wrappers)
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
            return Launch(srun, words[j:], f"{head} -m torch.distributed.run", background, refusal, tuple(env),
                          replaces, wrappers)
    return None


def _command_string(text: str, positional: list[str], shell: Shell | None, given: tuple = ()) -> list[str] | None:
    """The words of ``bash -c TEXT $0 ARGS...`` when TEXT is one simple command of plain words, "$@" and the
    variables the inner bash has: Slurm's own for its task (``--node-rank=$SLURM_NODEID``) and exported ones."""
    inner = [c for c in shell_commands(text) if not c.nested]
    if len(inner) != 1:
        return None
    words = []
    for word in inner[0].words:
        names = re.findall(r"\$\{?([A-Za-z_]\w*)\}?", word)
        if word in ('"$@"', "$@"):
            words += positional
        elif re.fullmatch(r"[\w./:=,+-]+", word):
            words.append(word)
        elif shell is not None and re.fullmatch(r"(?:[\w./:=,+\"-]|\$\{?[A-Za-z_]\w*\}?)+", word):
            own = [n for n in names if n in ("SLURMD_NODENAME", "HOSTNAME")]  # each node's own, read there
            if own and "rdzv" in word:
                raise Problem(f"the bash -c text reads ${own[0]} on each node, where it is that node's own name: on "
                              "two nodes each agent would wait at its own node for the others. Fix: expand the host "
                              f"in the batch shell: {RDZV_FIX}.")
            unexported = [n for n in names if not n.startswith("SLURM") and n not in ("HOSTNAME", *shell.exported)]
            if unexported and "torchrun" in text:
                name = unexported[0]
                if name in given:
                    raise Problem(f"the bash -c text reads ${name}, set in front of the launch for it alone: bash "
                                  "passes it on, but the check cannot follow a value set that way. Fix: export "
                                  f"{name} on a line of its own before the launch.")
                sets = "the script sets but does not export" if name in shell.assigned else "nothing exports"
                raise Problem(f"the bash -c text reads ${name}, which {sets}: the bash that srun starts sees it "
                              f"empty. Fix: export {name} before the launch.")
            if unexported:
                return None
            words += shell.fields(word)
        else:
            return None
    return words


@functools.cache
def _torchrun_parser() -> argparse.ArgumentParser:
    """torchrun's own argument parser, raising instead of printing and exiting."""
    from torch.distributed.run import get_args_parser

    parser = get_args_parser()

    def refuse(message=None, *args):
        raise Refusal(message or "stopped")

    parser.error = refuse
    parser.exit = lambda status=0, message=None: refuse(message)
    return parser


# torchrun's options that take a number: a value known only when the job runs ($SLURM_NODEID) parses as 0 here.
_NUMBER_OPTIONS = re.compile(r"--(node[-_]rank|max[-_]restarts|monitor[-_]interval|master[-_]port)")


def torchrun_args(args: list[str]) -> argparse.Namespace:
    """``args`` as torchrun reads them; ``Refusal`` with torchrun's message where it would stop."""
    args = list(args)
    for k, arg in enumerate(args):
        option, equals, value = arg.partition("=")
        if _NUMBER_OPTIONS.fullmatch(option) and equals and "\x00" in value:
            args[k] = f"{option}=0"
        elif _NUMBER_OPTIONS.fullmatch(arg) and k + 1 < len(args) and "\x00" in args[k + 1]:
            args[k + 1] = "0"
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        return _torchrun_parser().parse_args(args)


def torchrun_option_problem(args: argparse.Namespace, shell: Shell) -> str | None:
    """torchrun options that parse but break this launch: how it runs the module, where agents meet."""
    fix = "Fix: leave it out, as the template does."
    if args.no_python:
        return f"--no-python runs the module's name as a program, and torchrun refuses it beside -m. {fix}"
    if args.run_path:
        return f"--run-path runs workshop_utils.train as a file path, not as the module -m names. {fix}"
    if args.local_addr:
        return ("--local-addr fixes the address this node's agent gives the others: one address for every node, "
                f"so on two nodes the second node's processes are told the wrong one. {fix}")
    conf = literal(shell.decode(args.rdzv_conf)) if args.rdzv_conf else None
    if not conf:
        return None
    from torch.distributed.elastic.rendezvous.utils import _parse_rendezvous_config  # torchrun's own reader

    try:
        pairs = _parse_rendezvous_config(conf)
    except ValueError:
        return (f"--rdzv-conf={show(conf)} is not key=value pairs: torchrun stops at it before any agent "
                "starts. Fix: leave --rdzv-conf out, as the template does (or key=value,key=value).")
    if "is_host" in pairs:
        return (f"--rdzv-conf={show(conf)} decides by hand whether a node hosts the rendezvous store, the same on "
                "every node: torchrun decides it from the endpoint, the node whose address it is. " + fix)
    short = {k: v for k, v in pairs.items() if k.endswith("timeout") and v.isdigit() and int(v) < 60}
    if short:
        key = next(iter(short))
        return (f"--rdzv-conf={show(conf)} gives the nodes {short[key]} s ({key}): a node whose agent starts later "
                f"than that (a busy node, a slow file system) fails the job. {fix}")
    return None


# ---------------------------------------------------------------------------------------------- the job, read


@dataclasses.dataclass(frozen=True)
class Directives:
    """The #SBATCH options the exercise asks about, as given (None where not given; "" where given empty)."""

    nodes: str | None = None
    ntasks: str | None = None
    ntasks_per_node: str | None = None
    cpus_per_task: str | None = None
    time: str | None = None
    signal: str | None = None


@dataclasses.dataclass
class JobRequest:
    """What a job script asks for, read as sbatch, bash and torchrun read it."""

    directives: Directives
    nodes: tuple[int, int]
    tasks_per_node: int
    cpus_per_task: int
    commands: list[Command]  # the script's commands, as written
    shell: Shell  # the expansion the launch line's words got
    launches: list[Launch]
    after: list[list[str]]  # the commands after the first launch, expanded
    ran: list[Command] = dataclasses.field(default_factory=list)  # in the order bash runs them, calls followed
    functions: dict[str, list[Command]] = dataclasses.field(default_factory=dict)  # NAME -> its body's commands
    launched_at: int = -1  # the index in ``ran`` of the first launch
    defined_at: dict[str, int] = dataclasses.field(default_factory=dict)  # NAME -> len(ran) where it is defined


def _count(value, flag: str, fix: str) -> int:
    problem = count_problem(value, flag)
    if problem:
        raise Problem(f"{problem}. Fix: {fix}")
    return int(value)


def _node_text(text: str, low: int, high: int) -> str:
    """How sbatch reads a --nodes text, where its k or m suffix makes it other than it looks."""
    if not re.search(r"[kKmM]", text):
        return ""
    read = str(low) if low == high else f"{low}-{high}"
    return f" (sbatch reads it as {read} node{'s' * (high != 1)}: k multiplies by 1024, m by 1048576)"


_CHANGES_THE_JOB = {
    "exclusive": "holds whole nodes, every core of them, while the training uses {cores}",
    "hold": "queues the job held: it never starts until someone releases it",
    "test-only": "makes sbatch only estimate when the job would start: nothing is queued",
    "array": "makes the job an array: the same training would run once per task",
    "cpus-per-gpu": "sets the cores per GPU, which sbatch refuses beside --cpus-per-task (and the job has no GPU)",
    "nodelist": "ties the job to named nodes: it waits for them, and with --nodes=2 their count must match",
    "ntasks": "fixes the job's task count: --ntasks-per-node becomes only a maximum, and with --nodes=2 (only "
              "#SBATCH --nodes changes) the tasks would no longer be one per node",
    "begin": "delays the job's start: it waits in the queue until then",
    "dependency": "makes the job wait for another job (and never start if that one fails)",
    "deadline": "cancels the job when it cannot end by then, which a queue can make it miss",
    "time-min": "lets Slurm cut the time limit down to it, below what the warning's lead was planned on",
    **{gpus: "asks for GPUs, which this training does not use (it runs on CPU cores): the job would wait for a GPU "
             "node and hold its GPUs idle" for gpus in ("gres", "gpus", "gpus-per-node", "gpus-per-task")},
}


def _value_problem(name: str, value: str) -> str | None:
    """#SBATCH options the template leaves out that are harmless with some values and break the job with others."""
    if name == "export" and value.split(",")[0].upper() != "ALL":
        return ("starts the job without the environment it was submitted from (PATH and the activated Python among "
                "it): torchrun would not be found")
    if name in ("output", "error") and value.strip() == "/dev/null":
        return "throws the job's log away: the ranks' lines that the check (and you) read go nowhere"
    if name in ("mem", "mem-per-cpu"):
        found = re.fullmatch(r"\s*([0-9.]+)\s*([KMGT]?)B?\s*", value.upper())
        mib = float(found.group(1)) * {"K": 2**-10, "": 1, "M": 1, "G": 2**10, "T": 2**20}[found.group(2)] if found \
            else None
        if mib is not None and 0 < mib < 1024:
            return (f"gives the job {show(value)} of memory (MiB without a unit): Slurm ends it as soon as the "
                    "processes load PyTorch, a few hundred MiB each")
    return None


def _extra_options_problem(options: dict, spec: JobSpec):
    """#SBATCH options beyond the template's that change what the job is."""
    for name in ("export", "output", "error", "mem", "mem-per-cpu"):
        why = _value_problem(name, options[name]) if options.get(name) is not None else None
        if why:
            raise Problem(f"#SBATCH --{name}={show(options[name])} {why}. Fix: leave --{name} out, as the template "
                          "does.")
    for name, why in _CHANGES_THE_JOB.items():
        if name in options and (name != "ntasks" or spec.every_node):
            raise Problem(f"#SBATCH --{name}{'=' + show(options[name]) if options[name] else ''} "
                          f"{why.format(cores=spec.cores_per_task)}. Fix: leave --{name} out: the template's #SBATCH "
                          "lines ask for what the exercise needs.")


def read_job_script(script: str, spec: JobSpec = JOB_SPEC) -> JobRequest:
    """The script as sbatch, bash and torchrun read it; ``Problem`` for what none of them would read."""
    if "\x00" in script:
        raise Problem("the script holds a NUL character, which bash cannot read. Fix: remove it.")
    unfilled = [gap for gap in GAPS if "{" + gap + "}" in script]
    if unfilled:
        raise Problem(f"the script still has its gaps ({', '.join('{' + g + '}' for g in unfilled)}). Fix: pass "
                      "the answers as a dict, or the script with every gap filled.")
    if not script.startswith("#!"):
        raise Problem("sbatch refuses a script whose first line is not #! and its interpreter. Fix: #!/bin/bash as "
                      "the first line.")
    arguments, first_command, unread = directives_and_first_command(script)
    if unread:
        first = show(first_command.strip())
        raise Problem(f"sbatch reads #SBATCH lines only above the script's first command ({first}), and some come "
                      "after it: they would be ignored. Fix: every #SBATCH line at the top.")
    try:
        options = sbatch_options(arguments)
    except Problem as err:
        raise Problem(f"sbatch would refuse the #SBATCH lines: {show(str(err), 200)}. Fix: --option=VALUE with "
                      "the option's whole name, one value for each option.") from None
    _extra_options_problem(options, spec)
    directives = Directives(**{field: options.get(field.replace("_", "-")) for field in
                               ("nodes", "ntasks", "ntasks_per_node", "cpus_per_task", "time", "signal")})
    nodes = (1, 1)  # sbatch's default: one node
    if directives.nodes is not None:
        try:
            nodes = node_range(directives.nodes)
        except Problem as why:
            raise Problem(f"--nodes={show(directives.nodes)} {why}. Fix: --nodes={spec.nodes}.") from None
    if directives.ntasks_per_node is not None:
        tasks = _count(directives.ntasks_per_node, "--ntasks-per-node",
                       "--ntasks-per-node=1 (the one task on each node is torchrun).")
    elif directives.ntasks is not None:
        tasks = math.ceil(_count(directives.ntasks, "--ntasks", "--ntasks-per-node=1 in its place.") / max(nodes[0], 1))
    else:
        tasks = 1  # sbatch's default: one task
    cpus = 1 if directives.cpus_per_task is None else _count(
        directives.cpus_per_task, "--cpus-per-task", f"--cpus-per-task={spec.cores_per_task}.")
    known = {}  # the node counts stay unknown: the script must serve another --nodes unchanged
    if directives.cpus_per_task is not None:
        known["SLURM_CPUS_PER_TASK"] = str(cpus)
    if directives.ntasks_per_node is not None:
        known["SLURM_NTASKS_PER_NODE"] = str(tasks)
    shell = Shell(known)
    commands = shell_commands(script)
    launches, after, functions, ran, at, moved = [], [], {}, [], [], []  # moved: shift, set -- before the launch
    aliases: set[str] = set()  # the names aliased once shopt -s expand_aliases made the script expand them
    expanding = []  # [True] after shopt -s expand_aliases (a script expands no alias without it)

    def run(command: Command, depth: int = 0, passes_args: bool = True):
        """Follow one command as bash runs it; a function's body where the function is called (``passes_args``:
        whether that call hands the script's "$@" on)."""
        if not command.nested:
            ran.append(command)
        if depth == 0 and not command.nested and [w for w in command.words if w not in LEADING][:1] == ["local"]:
            raise Problem(f"`{show(' '.join(command.words))}` is outside any function, and local works only inside "
                          "one: bash says \"local: can only be used in a function\" and sets nothing. Fix: a plain "
                          "NAME=value at the script's top level.")
        if not launches and command.discards and not command.where and \
                [w for w in command.words if w not in LEADING] == ["exec"]:
            raise Problem("exec with output to /dev/null (or closed) throws the rest of the job's log away: the "
                          "ranks' lines that the check (and you) read go nowhere. Fix: leave that line out, as the "
                          "template does.")
        plain = [w for w in command.words if w not in LEADING]
        if plain[:2] == ["shopt", "-s"] and "expand_aliases" in plain and not command.where:
            expanding.append(True)
        if plain[:1] == ["alias"] and expanding and not command.where:
            aliases.update(w.split("=", 1)[0] for w in plain[1:] if "=" in w)
        if plain[:1] == ["unalias"] and not command.where:
            aliases.difference_update(plain[1:])
        if not command.where:
            shell.allexport = option_after(plain, shell.allexport, "a", "allexport")
        if command.words[:2] == ["unset", "-f"] and not command.where:
            for name in command.words[2:]:
                functions.pop(name, None)
            return
        if shell.assign(command, take=not launches) or (not launches and shell.unset(command)) or command.nested:
            return
        fields = [f for w in command.words for f in shell.fields(w)]
        try:
            launch = _launch_of(fields, command, shell)
        except Problem as problem:
            raise Problem(shell.readable(str(problem))) from None
        if launch:
            at_head = next((k for k, w in enumerate(command.words)
                            if w not in COMMAND_PREFIXES and not ASSIGNMENT.fullmatch(w)), len(command.words))
            head = command.words[at_head] if at_head < len(command.words) else ""
            if "builtin" in command.words[:at_head]:
                raise Problem(f"builtin {head}: {head} is no bash builtin, so bash says \"not a shell builtin\" and "
                              "starts nothing. Fix: leave builtin out.")
            bypassed = any(w in ("command", "exec") for w in command.words[:at_head])  # both run the program
            passes_on = any(head in inner.words and "command" in inner.words[:inner.words.index(head)]
                            for inner in functions.get(head, []))  # srun() { command srun "$@"; }
            if (head in functions and not passes_on or head in aliases) and not bypassed:
                kind = "a function" if head in functions else "an alias (expand_aliases is on)"
                raise Problem(f"the script defines {kind} named {head}, which the launch line runs in place of the "
                              f"real {head}: nothing trains. Fix: give it another name, or leave it out.")
            discarded = command.discards or any(literal(shell.decode(value)) == "/dev/null" for option, value in
                                                (launch.srun or {}).items() if option in ("--output", "--error"))
            if discarded:
                raise Problem("the launch's output goes to /dev/null (or nowhere): the ranks' lines that the check "
                              "(and you) read never reach the job's log. Fix: no redirection on the launch line, as "
                              "in the template.")
            if moved and any("$@" in w for w in command.words):
                raise Problem(f"`{show(moved[0])}` before the launch changes the script's own arguments, so \"$@\" no "
                              "longer holds the check's training flags as given (shift drops the first of them, set "
                              "-- replaces them). Fix: leave the arguments as they are, as the template does.")
            if not passes_args and any("$@" in w for w in command.words):
                raise Problem("the launch sits in a function called without \"$@\": inside it \"$@\" is the "
                              "function's own arguments, none, so the check's training flags never reach the "
                              "training. Fix: call it with \"$@\", or launch at the script's top level.")
            at.append(len(ran) - 1)
            launches.append(launch)
            return
        at_name = next((k for k, w in enumerate(command.words) if w not in COMMAND_PREFIXES), None)
        called = None if at_name is None else command.words[at_name]
        if called in functions and depth < 8:
            given = command.words[at_name + 1:]  # inside the body, "$@" is these words
            substitute = bool(given)
            for inner in functions[called]:
                inner_plain = [w for w in inner.words if w not in LEADING]
                if inner_plain[:1] == ["shift"] and not inner.where:  # the body's own arguments move on
                    count = int(inner_plain[1]) if inner_plain[1:2] and inner_plain[1].isdigit() else 1
                    if any(w in ('"$@"', "$@") for w in given[:count]):
                        raise Problem(f"`{show(' '.join(inner_plain))}` in {called} drops the first of the script's "
                                      "arguments that \"$@\" hands it, and with it a training flag of the check's. "
                                      "Fix: no shift there, or hand the function its own first argument.")
                    given, substitute = given[count:], True
                words = [out for w in inner.words for out in (given if w in ('"$@"', "$@") else [w])] if substitute \
                    else inner.words
                run(dataclasses.replace(inner, words=words, where=inner.where or command.where,
                                        background=inner.background or command.background,
                                        discards=inner.discards or command.discards), depth + 1,
                    passes_args and any("$@" in w for w in command.words))
        elif launches:
            after.append(fields)

    errexit = re.match(r"#!\S+(\s+-\w*e\w*)", script) is not None  # #!/bin/bash -e
    certain, repeated = set(), {}
    unreached, definitions, defined_at = unreached_commands(commands, errexit, certain, repeated), {}, {}
    for index, command in enumerate(commands):
        if command.function:
            if definitions.get(command.function) != command.definition:  # defined again: the new body replaces it
                functions[command.function], definitions[command.function] = [], command.definition
                defined_at[command.function] = len(ran)
            functions[command.function].append(dataclasses.replace(command, function=None))
        elif index not in unreached:
            plain = [w for w in command.words if w not in LEADING]
            if (plain[:1] == ["shift"] or plain[:2] == ["set", "--"]) and index in certain and not launches:
                moved.append(" ".join(plain))
            count = len(launches)
            run(command)
            if len(launches) > count and index in repeated:
                raise Problem(f"the torchrun line comes {repeated[index]}: the job would start that many trainings, "
                              "side by side on the same cores. Fix: one launch line at the script's top level, as in "
                              "the template.")
        elif not launches and _launch_of([f for w in command.words for f in shell.fields(w)], command, shell):
            raise Problem(f"the torchrun line comes {unreached[index]}: bash never runs it, so the job would start "
                          "nothing. Fix: the launch line at the script's top level, as in the template.")
    shadowed = [name for name in ("wait", "trap", "kill") if name in functions]
    if shadowed:
        raise Problem(f"the script defines a function named {shadowed[0]}, which bash runs in place of its own "
                      f"{shadowed[0]}: the template's trap and wait loop would not do what they say. Fix: give the "
                      "function another name.")
    return JobRequest(directives, nodes, tasks, cpus, commands, shell, launches, after, ran, functions,
                      at[0] if at else -1, defined_at)


def node_text(job: JobRequest) -> str:
    """The --nodes text for a message, with sbatch's reading where a suffix changes it."""
    low, high = job.nodes
    text = job.directives.nodes or str(low)
    return show(text) + _node_text(text, low, high)
