"""Exercise 6.1's judge of how a job script passes Slurm's warning on: the batch shell's trap and what it runs
(srun --overlap on every node, pkill sending SIGUSR1 to the training processes and not to torchrun), the launch
in the background, and the loop that waits for it again after each trapped signal, as bash, srun and pkill do it.
"""

from __future__ import annotations

import re
import signal as signals

from .answer_values import Problem, show
from .bash_flow import constant, errexit_after
from .bash_expansion import basename, literal, render
from .bash_reader import ASSIGNMENT, LEADING, Command, shell_commands
from .job_script import JobRequest, JobSpec, Launch
from .slurm_rules import SRUN, getopt_long, whole

TEMPLATE_WAIT = "while ! wait $!; do kill -0 $! 2>/dev/null || break; done"
TEMPLATE_FORWARD = ('forward() { srun --overlap --ntasks-per-node=1 pkill -USR1 -f "python[0-9.]* -u -m '
                    'workshop_utils.train" || true; }')
_SENDERS = ("pkill", "kill", "killall", "scancel")
ALL_NODES = "$SLURM_JOB_NUM_NODES"
_SILENT = (":", "true", "false", "echo", "printf", "wait", "exit", "return", "sleep", "date", "logger")  # send nothing
# What runs on a node while the job trains: torchrun (the agent) and the batch node's srun, which must not be
# signalled (torchrun and srun do not handle SIGUSR1: srun passes it on to torchrun, whose default action ends
# it), and the training processes, which must be.
_ENV = "/home/user/venv/bin"
_TRAINING_ARGS = "-m workshop_utils.train --device cpu --steps 12 --checkpoint-every 4"
_NOT_TO_SIGNAL = (("torchrun", f"{_ENV}/python {_ENV}/torchrun --nnodes=1 --nproc-per-node=2 --rdzv-backend=c10d "
                               f"--rdzv-endpoint=node01:29500 --rdzv-id=7 {_TRAINING_ARGS}"),
                  ("torchrun", f"{_ENV}/python3 {_ENV}/torchrun --nnodes 1 {_TRAINING_ARGS}"),
                  ("srun", f"srun --cpus-per-task=2 torchrun --nnodes=1 --nproc-per-node=2 {_TRAINING_ARGS}"),
                  # a Jupyter kernel of the same user on the node (the notebook suggests one in a job)
                  ("python", f"{_ENV}/python -m ipykernel_launcher -f /home/user/.local/share/jupyter/kernel.json"))
_TRAINING = (("python", f"{_ENV}/python -u {_TRAINING_ARGS}"), ("python3", f"{_ENV}/python3 -u {_TRAINING_ARGS}"),
             ("python3.11", f"/usr/bin/python3.11 -u {_TRAINING_ARGS}"))
_PKILL_VALUES = {"-g", "-G", "-P", "-s", "-t", "-u", "-U", "-F", "--ns", "--nslist", "--signal", "-d", "--delimiter",
                 "--session", "--terminal", "--euid", "--uid", "--group", "--pgroup", "--parent", "--pidfile"}


def _words(command: Command) -> list[str]:
    words = list(command.words)
    while words and words[0] in LEADING:
        words = words[1:]
    return words


def _signal_of(text: str) -> int | None:
    name = text.upper().removeprefix("SIG")
    if name.isdigit():
        return int(name)
    return int(getattr(signals, "SIG" + name)) if hasattr(signals, "SIG" + name) and name.isalnum() else None


def signal_name(number: int) -> str:
    try:
        return signals.Signals(number).name
    except ValueError:
        return f"signal {number}"


def _trap_problem(job: JobRequest, warning: int, spec: JobSpec) -> tuple[str | None, int, list[Command]]:
    """(why the batch shell's trap for the warning does nothing, the index in ``job.ran`` where it is set, the
    commands it runs)."""
    found, where, unread = None, -1, None
    for index, command in enumerate(job.ran):
        words = _words(command)
        if words[:1] != ["trap"]:
            continue
        args = [literal(job.shell.parts(w)) for w in words[1:]]
        raw = words[2:] if args[:1] == ["--"] else words[1:]
        args = args[1:] if args[:1] == ["--"] else args
        if args[:1] == [None] and len(args) > 1 and None not in args[1:] and \
                warning in [_signal_of(n) for n in args[1:]]:
            if 0 <= job.launched_at < index and re.fullmatch(r'"[^"`$\\]*(\$![^"`$\\]*)+"', raw[0]):
                args[0] = raw[0][1:-1]  # set after the launch, "...$!..." names the launch, as '...$!...' would
            else:
                unread = (raw[0], index)  # an action bash expands as it sets the trap: "kill $!" before any &
                continue
        if not args or None in args or args[0] in ("-p", "-l", "-P"):
            continue
        action, names = (args[0], args[1:]) if len(args) > 1 or _signal_of(args[0]) is None else ("-", args)
        if warning not in [_signal_of(n) for n in names]:
            continue
        if command.where:
            found, where = ("elsewhere", command.where, action), index
            continue
        found, where = ("here", "", action), index
    if found is None and unread:
        word, index = unread
        fix = f"Fix: {TEMPLATE_FORWARD} and trap forward USR1, as in the template."
        if "$!" in word and not word.startswith("'") and index < job.launched_at:
            return (f"the trap's action {show(word)} is in double quotes, so bash expands $! when it sets the trap, "
                    "before anything runs in the background: $! is empty then, and at the warning the trap signals "
                    f"no process. {fix}"), index, []
        return (f"the trap's action {show(word)} is expanded as bash sets the trap, into what this check cannot "
                f"read before the job runs. {fix}"), index, []
    if found is None:
        return (f"nothing in the script traps SIG{spec.warning}: its default action ends bash, so the warning would "
                "end the batch shell and reach no training process. Fix: trap forward USR1, as in the template."), -1, []
    kind, place, action = found
    fix = f"Fix: {TEMPLATE_FORWARD} and trap forward USR1, as in the template."
    if kind == "elsewhere":
        return (f"the trap for SIG{spec.warning} is set only in {place}, which runs apart from the batch shell: the "
                f"batch shell keeps the default action, which ends it. {fix}"), where, []
    if action == "":
        return (f"trap \"\" {spec.warning} makes the batch shell ignore the warning, so nothing passes it on to the "
                f"training. {fix}"), where, []
    if action == "-":
        return (f"trap - {spec.warning} restores the default action for SIG{spec.warning}, which ends the batch "
                f"shell at the warning. {fix}"), where, []
    runs = []
    for command in [c for c in shell_commands(action) if not c.nested]:
        words = _words(command)
        if not words:
            continue
        if words[0] in job.functions:
            runs += job.functions[words[0]]
        elif basename(words[0]) in ("srun", *_SENDERS, "true", ":", "echo", "printf", "wait", "exit", "return"):
            runs.append(command)
        else:
            return (f"the trap runs {show(words[0])}, which is neither a function the script defines nor a command "
                    f"that passes the signal on: bash would say \"command not found\" at the warning. {fix}"), where, []
    return None, where, runs


def _sent_signal(program: str, args: list[str]) -> tuple[int, list[str], bool]:
    """(the signal pkill/kill/killall sends, their other operands, whether pkill matches full command lines)."""
    sent, rest, full, i, given = int(signals.SIGTERM), [], False, 0, False
    while i < len(args):
        arg = args[i]
        if arg in ("--signal", "-s") and (program != "pkill" or arg == "--signal") and i + 1 < len(args):
            sent, i, given = _signal_of(args[i + 1]) or -1, i + 2, True
            continue
        if arg.startswith("--signal="):
            sent, given = _signal_of(arg.partition("=")[2]) or -1, True
        elif program == "pkill" and arg in _PKILL_VALUES:
            rest, i = rest + [arg, args[i + 1] if i + 1 < len(args) else ""], i + 2
            continue
        elif program == "kill" and given and re.fullmatch(r"-[0-9]+", arg):
            rest.append(arg)  # after the signal, kill -1 is a process id: every process the user may signal
        elif re.fullmatch(r"-(SIG)?[A-Za-z]+[0-9]*|-[0-9]+", arg) and _signal_of(arg[1:]) is not None:
            sent, given = _signal_of(arg[1:]), True
        elif program == "pkill" and re.fullmatch(r"-[a-zA-Z]+", arg):
            full = full or "f" in arg
            rest.append(arg)
        elif arg == "--full":
            full = True
        else:
            rest.append(arg)
        i += 1
    return sent, rest, full


_PKILL_SELECT = {"P": "--parent", "t": "--terminal", "g": "--pgroup", "G": "--group", "F": "--pidfile",
                 "r": "--runstates"}
_PKILL_SELECT_LONG = {"--parent", "--terminal", "--pgroup", "--group", "--pidfile", "--runstates", "--session",
                      "--ns", "--nslist", "--older", "--cgroup"}


def _pkill_option_problem(options: list[str]) -> str | None:
    """Why pkill's options keep the signal from some training process; None when they do not."""
    for option, value in zip(options, [*options[1:], ""]):
        if option in ("-u", "-U", "--euid", "--uid") and value in ("root", "0"):
            return f"pkill {option} {value} matches root's processes only, and the training runs as you"
        if not option.startswith("-"):
            continue
        if re.search(r"\s", option):
            return f"pkill reads {show(option)} as its options, not as the pattern (it starts with -)"
        letters = set(option[1:]) if re.fullmatch(r"-[a-zA-Z]+", option) else set()
        name = option.split("=")[0]
        if "v" in letters or name == "--inverse":
            return ("pkill -v signals every process except the ones that match: torchrun (which SIGUSR1 ends) and "
                    "the batch shell itself, not the training")
        if letters & {"n", "o"} or name in ("--newest", "--oldest"):
            return f"pkill {option} signals one process per node, and each node trains --nproc-per-node of them"
        chosen = sorted(letters & set(_PKILL_SELECT)) or ([name] if name in _PKILL_SELECT_LONG else [])
        if chosen:
            return (f"pkill {option} narrows the match by {_PKILL_SELECT.get(chosen[0], chosen[0])}, which the "
                    "training processes do not share on every node: the pattern alone picks them")
    return None


def _pkill_problem(pattern: str, full: bool, exact: bool) -> str | None:
    try:
        compiled = re.compile(pattern)
    except (re.error, RecursionError, OverflowError):
        return None  # not a pattern the check can read: pkill's own regex rules decide
    match = compiled.fullmatch if exact else compiled.search
    hit = [name for name, line in _NOT_TO_SIGNAL if match(line if full else name[:15])]
    if hit and hit[0] not in ("torchrun", "srun"):
        return (f"pkill {'-f ' if full else ''}{show(pattern)} matches every {hit[0]} process of yours on the node, "
                "a Jupyter kernel among them, which SIGUSR1 ends")
    if hit:
        return (f"pkill {'-f ' if full else ''}{show(pattern)} matches {hit[0]}'s own {'command line' if full else 'name'} too: SIGUSR1 "
                f"ends {hit[0]} (it does not handle it), and the training processes go with it before they "
                "checkpoint")
    missed = [name for name, line in _TRAINING if not match(line if full else name[:15])]
    if len(missed) == len(_TRAINING):
        return f"pkill {'-f ' if full else ''}{show(pattern)} matches no training process"
    if missed:
        return (f"pkill {'-f ' if full else ''}{show(pattern)} misses training processes started as {missed[0]}: "
                "torchrun starts them with its own interpreter, python, python3 or python3.11 as the environment "
                "has it")
    return None


def _sender_problem(job: JobRequest, runs: list[Command], warning: int, spec: JobSpec) -> str | None:
    """Why what the trap runs does not reach the training processes on every node; None when it does."""
    fix = f"Fix: {TEMPLATE_FORWARD}, as in the template."
    unknown, said = False, []
    for command in runs:
        words = [f for w in _words(command) for f in job.shell.fields(w)]
        # The job's own node count stands for itself: srun -N "$SLURM_NNODES" runs on every node.
        words = [ALL_NODES if re.fullmatch(r"\$\{?SLURM_(JOB_NUM_NODES|NNODES)\}?", render(job.shell.decode(w)))
                 else literal(job.shell.decode(w)) or "?" for w in words]
        said += [" ".join(words)] if words else []
        srun = None
        if words and basename(words[0]) == "srun":
            try:
                found, words = getopt_long(words[1:], SRUN)
            except Problem:
                return f"srun in the trap's function has options srun would refuse. {fix}"
            srun = dict(found)
        if not words or basename(words[0]) not in _SENDERS:
            unknown = unknown or bool(words) and basename(words[0]) not in _SILENT
            continue
        program, args = basename(words[0]), words[1:]
        if program == "scancel":
            return ("scancel in the trap signals the job's steps, torchrun included, and SIGUSR1 ends torchrun "
                    f"before the training checkpoints. {fix}")
        if program == "pkill" and "-s" in args:
            session = args[args.index("-s") + 1] if args.index("-s") + 1 < len(args) else ""
            return (f"pkill -s takes a session id, not a signal: pkill -s {show(session)} selects processes by "
                    f"session (and stops at a name that is not a number). {fix}")
        sent, rest, full = _sent_signal(program, args)
        if sent != warning:
            return (f"{program} sends {signal_name(sent) if sent > 0 else 'a signal it cannot read'}, and the "
                    f"training loop listens for SIG{spec.warning}. {fix}")
        if program == "kill" and any(re.fullmatch(r"-[0-9]+|0", a) for a in rest):
            return (f"kill {' '.join(a for a in rest if re.fullmatch(r'-[0-9]+|0', a))} signals a whole process "
                    "group or every process you may signal, torchrun and the batch shell among them (SIGUSR1 ends "
                    f"both). {fix}")
        if program == "killall":
            names = {a for a in rest if not a.startswith("-")}
            missed = [name for name, _ in _TRAINING if name not in names]
            if names and missed and "-r" not in rest and "--regexp" not in rest:
                return (f"killall {' '.join(sorted(names))} misses training processes named {missed[0]}: torchrun "
                        "starts them with its own interpreter, python, python3 or python3.11 as the environment has "
                        f"it. {fix}")
        if program == "pkill":
            narrowed = _pkill_option_problem(rest)
            if narrowed:
                return f"{narrowed}. {fix}"
            pattern = [a for a in rest if not a.startswith("-")][-1:]
            if pattern and pattern[0] != "?":
                why = _pkill_problem(pattern[0], full, "-x" in rest or "--exact" in rest)
                if why:
                    return f"{why}. {fix}"
        if srun is None and spec.every_node:
            return (f"{program} in the trap runs on the batch node only: with --nodes=2 (only #SBATCH --nodes "
                    f"changes) the training processes of the other node never get the warning. {fix}")
        if srun is not None and "overlap" not in srun:
            return ("srun in the trap has no --overlap: the training step holds every CPU of the job, so since "
                    "Slurm 20.11 this step waits for them until training has ended, too late. " + fix)
        tasks = whole(srun.get("ntasks") or "") if srun else None
        if srun is not None and spec.every_node and (tasks is not None and tasks < 2 or
                                                     srun.get("nodes", ALL_NODES) != ALL_NODES):
            return ("srun in the trap fixes its tasks or nodes: with --nodes=2 it would not run on every node, so "
                    "one node's training would not get the warning. Fix: srun --overlap --ntasks-per-node=1, one "
                    "task on each of the job's nodes.")
        return None
    if not unknown:
        return (f"what the trap runs ({show('; '.join(said) or 'nothing')}) sends no signal: the training processes "
                "never hear the warning and the job ends at its time limit without a checkpoint (a function defined "
                f"again replaces the first). {fix}")
    return None  # a command the check does not know (a helper script): what it does decides


def _loop_body(job: JobRequest, index: int) -> list[Command]:
    """The commands of the loop that starts at ``job.ran[index]``, up to its own ``done``."""
    body, depth = [], 0
    for inner in job.ran[index + 1:]:
        depth += inner.words[:1] in (["while"], ["until"], ["for"])
        if inner.words[:1] == ["done"] or inner.words[-1:] == ["done"]:
            if depth == 0:
                break
            depth -= 1
        body.append(inner)
    return body


def _unset_problem(job: JobRequest, index: int, fix: str) -> str | None:
    """A variable the wait loop reads that the script never sets: set -u ends the batch shell there."""
    set_anywhere = {found.group(1) for c in job.commands for w in c.words for found in [ASSIGNMENT.match(w)] if found}
    set_anywhere |= {w for c in job.commands if c.words[:1] in (["read"], ["declare"], ["local"], ["export"])
                     for w in c.words[1:]}
    for command in [job.ran[index], *_loop_body(job, index)]:
        for word in command.words:
            for name in re.findall(r"\$\{?([A-Za-z_][A-Za-z0-9_]*)", word):
                if name not in set_anywhere and not name.startswith("SLURM_") and name not in ("HOME", "USER", "PATH"):
                    return (f"the wait loop reads ${name}, which the script never sets: under set -u bash stops "
                            "there as training starts (without it, wait or kill fails at once), and Slurm ends the "
                            f"job. Fix: $! or a variable set to $! right after the launch. {fix}")
    return None


def _wait_loop_problem(job: JobRequest, index: int, words: list[str], fix: str, negated: bool) -> str | None:
    """Why ``while ! wait ...`` would not end when training does, or waits for nothing; None when it is right."""
    problem = _unset_problem(job, index, fix)
    if problem:
        return problem
    simple = index + 1 < len(job.ran) and job.ran[index + 1].words[:1] == ["do"]  # one command as its condition
    loop = job.ran[index].words[0]
    if simple and negated == (loop == "until"):  # while wait, until ! wait: a failing wait ends the loop
        shown = f"{loop} {'! ' if negated else ''}{' '.join(words)}"
        return (f"`{show(shown)}` ends the loop when wait fails, and a trapped signal makes it fail (138): at the "
                "warning the batch shell leaves the loop and reaches its end while training still checkpoints, and "
                f"Slurm ends the job with it. Wait again while wait fails. {fix}")
    if not simple or any(w in ("break", "exit", "return") for c in _loop_body(job, index) for w in c.words):
        return None
    if words == ["wait"]:
        return None  # without an operand wait returns 0 once no job is left, whatever the jobs returned
    return ("the loop never ends when training fails: wait returns the failure, then 127 for a process already "
            f"reaped, and the loop asks again until the time limit. Leave it once the process is gone. {fix}")


def _errexit_problem(job: JobRequest) -> str | None:
    """Under set -e, a wait outside a condition ends the batch shell when the trapped signal interrupts it."""
    errexit, previous = False, "\n"
    for index, command in enumerate(job.ran):
        words = _words(command)
        if not command.where:
            errexit = errexit_after(words, errexit)
        guarded = "!" in command.words[:command.words.index(words[0])] if words else True
        if errexit and index > job.launched_at and words[:1] == ["wait"] and not guarded and not command.where \
                and command.words[0] not in ("while", "until") and command.operator not in ("&&", "||") \
                and previous not in ("&&", "||"):
            return (f"under set -e, `{show(' '.join(words))}` ends the batch shell: a trapped signal interrupts wait, "
                    "which then returns 138, and set -e exits right after the trap, while training still writes its "
                    "checkpoint. Fix: wait in a loop's condition, as the template does (while ! wait $!; ...).")
        previous = command.operator
    return None


def _pid_problem(job: JobRequest, runs: list[Command], waits_at: int) -> str | None:
    """Something started in the background after the launch takes over $!, which the wait loop waits for."""
    if not any("$!" in w or "${!}" in w for w in job.ran[waits_at].words):
        return None
    first = job.launched_at
    while first < waits_at and job.ran[first].operator in ("|", "|&"):  # `torchrun ... | tee log &`: one job
        first += 1
    between = [c for c in job.ran[first + 1:waits_at] if c.background and not c.nested]
    if between:
        return (f"`{show(' '.join(between[0].words))} &` runs in the background after the launch, so $! is its "
                "process, not srun's: the wait loop would wait for it. Fix: pid=$! right after the launch line, "
                "and wait \"$pid\".")
    if any(c.background for c in runs):
        return ("the trap starts a command in the background (&), which sets $! to it: after the first warning the "
                "wait loop waits for that command, not for training. Fix: no & inside forward.")
    return None


def _wait_problem(job: JobRequest, spec: JobSpec) -> tuple[str | None, int]:
    """(why the batch shell does not wait for the launch through every trapped signal, the index in ``job.ran``
    of the loop that does)."""
    fix = f"Fix: {TEMPLATE_WAIT}, as in the template."
    plain, waits = None, 0
    for index in range(job.launched_at + 1, len(job.ran)):
        command = job.ran[index]
        raw = list(command.words)
        if command.where and command.where != "the background":
            continue
        if command.where and raw[:1] in (["while"], ["until"]):
            return ("the wait loop runs in the background (&): the batch shell goes on to its end at once, and Slurm "
                    f"ends the job with it. {fix}"), -1
        words = _words(command)
        negated = "!" in raw[:raw.index(words[0])] if words else False  # `!` may count among the leading words
        negated = negated or words[:1] == ["!"]
        words = words[1:] if words[:1] == ["!"] else words
        if raw[:1] in (["while"], ["until"]) and words[:1] == ["wait"]:
            return _wait_loop_problem(job, index, words, fix, negated), index
        if raw[:1] in (["while"], ["until"]) and any(_words(c)[:1] == ["wait"] for c in _loop_body(job, index)):
            forever = constant(words) is (raw[0] == "while")  # while true, while :, until false
            if forever and not any(w in ("break", "exit", "return") for c in _loop_body(job, index) for w in c.words):
                return ("the loop never ends: `{}` has nothing that leaves it, and once training has ended wait "
                        "returns at once, every time, until the time limit. {}".format(show(" ".join(raw)), fix)), -1
            return _unset_problem(job, index, fix), index  # its own condition or break ends it
        if raw[:1] == ["while"] and words[:2] == ["kill", "-0"]:
            for inner in job.ran[index + 1:]:
                inner_words = _words(inner)
                if inner.words[:1] == ["done"]:
                    break
                if inner_words[:1] == ["sleep"]:
                    seconds = whole(literal(job.shell.parts(inner_words[1])) or "") if len(inner_words) > 1 else None
                    if seconds is None or seconds > spec.min_lead_s // 3:
                        return (f"the loop sleeps {show(' '.join(inner_words[1:]))} between its checks, and bash "
                                "runs the trap only once sleep has ended: the warning would reach the training "
                                f"too late. {fix}"), -1
            return None, index
        if words[:1] == ["wait"]:
            plain, waits = plain or " ".join(words), waits + 1
    if plain is not None and waits > 1:
        return (f"the script waits {waits} times in a row (`{show(plain)}` first): each trapped signal ends one wait, "
                f"so {waits} signals (a warning and a second one, a requeue's) end the batch shell while training "
                f"still checkpoints. Wait in a loop, for as many signals as come. {fix}"), -1
    if plain is not None:
        return (f"`{show(plain)}` waits once: bash's wait returns as soon as a trapped signal arrives, so after the "
                "trap the batch shell reaches its end while training still checkpoints, and Slurm ends the job "
                f"with it. Wait again in a loop. {fix}"), -1
    return ("nothing waits for the launch in the background: the batch shell would reach its end at once, and "
            f"Slurm ends the job with it. {fix}"), -1


def forward_problem(job: JobRequest, launch: Launch, spec: JobSpec) -> str | None:
    """Why the warning would not reach the training processes, or the batch shell would not wait for them;
    None when it would."""
    warning = int(getattr(signals, "SIG" + spec.warning))
    problem, trapped_at, runs = _trap_problem(job, warning, spec)
    if problem:
        return problem
    if launch.exec_:
        return ("exec replaces the batch shell with srun: its trap is gone, and srun passes SIGUSR1 on to torchrun, "
                "which it ends. Fix: no exec: end the launch line with & and wait for it, as in the template.")
    if not launch.background:
        return ("torchrun runs in the foreground: bash runs a trap only once the command in front has ended, too late "
                "for the warning. Fix: end the launch line with & and wait for it, as in the template.")
    problem, waits_at = _wait_problem(job, spec)
    if problem:
        return problem
    if trapped_at > waits_at:
        return ("the trap is set only after the wait loop, once training has ended: during training the warning "
                "meets the default action, which ends the batch shell. Fix: trap forward USR1 before the launch, "
                "as in the template.")
    late = [name for name, at in job.defined_at.items() if at > waits_at and name in _trap_words(job)]
    if late:
        return (f"{late[0]} is defined only after the wait loop: when the warning comes, during the loop, bash "
                f"has no {late[0]} yet and says \"command not found\". Fix: define it before the trap, as the "
                "template does.")
    if any(_words(c)[:1] == ["exit"] for c in runs):
        return ("the trap ends the batch shell (exit) right after passing the warning on: Slurm then ends the job's "
                "steps while the training still writes its checkpoint. Fix: no exit in the trap: the wait loop "
                "ends the script once training has.")
    return _errexit_problem(job) or _pid_problem(job, runs, waits_at) or _sender_problem(job, runs, warning, spec)


def _trap_words(job: JobRequest) -> set[str]:
    return {w for c in job.ran if _words(c)[:1] == ["trap"] for w in _words(c)[1:]}

