"""Exercise 6.1's simulated cluster, the programs' side: the training processes and the tools in ``PROGRAMS``, each
this file under another name, tell the runner what they did and wait for it where the real program waits on a
cluster; the work itself is real (signals are sent). Standard library only, so that each starts in milliseconds.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import selectors
import shutil
import signal
import socket
import sys

SIM = ""  # the simulation's folder, given by the wrapper that runs this file as a program
CATCHABLE = [s for s in signal.Signals if s not in (signal.SIGKILL, signal.SIGSTOP, signal.SIGCHLD, signal.SIGCONT,
                                                     signal.SIGWINCH, signal.SIGURG) and s < 32]


class Link:
    """This process's line to the runner: one JSON object a line over a Unix socket, both ways."""

    def __init__(self, role: str, **hello):
        self.sock = socket.socket(socket.AF_UNIX)
        self.sock.connect(os.path.join(SIM, "sock"))
        self.buffer, self.inbox = b"", []
        self.send(op="hello", role=role, pid=os.getpid(), ppid=os.getppid(), argv=sys.argv, **hello)
        self.config = self.wait("config")

    def send(self, **message):
        self.sock.sendall(json.dumps(message).encode() + b"\n")

    def read(self) -> list[dict]:
        data = self.sock.recv(1 << 16)
        if not data:  # the runner has gone: the job is over
            os._exit(0)
        self.buffer += data
        *lines, self.buffer = self.buffer.split(b"\n")
        return [json.loads(line) for line in lines]

    def wait(self, op: str) -> dict:
        """The first message ``op`` the runner sent; the others keep their order, however many one read brought."""
        while True:
            for at, message in enumerate(self.inbox):
                if message.get("op") == op:
                    return self.inbox.pop(at)
            self.inbox += self.read()


class Loop:
    """Wait for the runner's messages, signals and children at once; handlers run one at a time."""

    def __init__(self, link: Link):
        self.link, self.pending = link, []
        read, write = os.pipe()
        os.set_blocking(write, False)
        signal.set_wakeup_fd(write)
        self.selector = selectors.DefaultSelector()
        self.selector.register(link.sock, selectors.EVENT_READ)
        self.selector.register(read, selectors.EVENT_READ)
        for sig in {*CATCHABLE, signal.SIGCHLD}:
            signal.signal(sig, lambda number, _: self.pending.append(number))
        self.pending.append(signal.SIGCHLD)  # a child that ended before the handler was set is reaped all the same

    def run(self, on_message, on_signal, on_child=None):
        while True:
            messages = list(self.link.inbox)
            self.link.inbox.clear()
            for key, _ in self.selector.select(0 if messages or self.pending else None):
                if key.fileobj is self.link.sock:
                    messages += self.link.read()
                else:
                    os.read(key.fileobj, 512)
            for message in messages:
                on_message(message)
            while self.pending:
                number = self.pending.pop(0)
                if number != signal.SIGCHLD:
                    on_signal(number)
                elif on_child:
                    for pid, status in reaped():
                        on_child(pid, status)


def reaped():
    """(pid, status) of each child that has ended, without waiting for one that has not."""
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if not pid:
            return
        yield pid, status


def die_of(link: Link, number: int, role: str) -> None:
    """Record a signal, then take its default action, as the real program does with a signal it does not handle."""
    link.send(op="note", what="signal", role=role, signal=signal.Signals(number).name)
    signal.signal(number, signal.SIG_DFL)
    os.kill(os.getpid(), number)


def status_code(status: int) -> int:
    return os.waitstatus_to_exitcode(status) if os.WIFEXITED(status) else 128 + os.WTERMSIG(status)


def say(text: str, code: int | None = None) -> None:
    print(text, file=sys.stderr, flush=True)
    if code is not None:
        sys.exit(code)


def hostlist(text: str) -> list[str]:
    """Slurm's hostlist expression as names: gpu-a[017-018],login1 -> gpu-a017, gpu-a018, login1."""
    names = []
    for part in re.findall(r"[^,\[]+(?:\[[^\]]*\])?[^,]*", text):
        found = re.fullmatch(r"([^\[]*)\[([^\]]*)\](.*)", part)
        if not found:
            names.append(part)
            continue
        for piece in found.group(2).split(","):
            first, _, last = piece.partition("-")
            numbers = range(int(first), int(last or first) + 1)
            names += [f"{found.group(1)}{n:0{len(first)}d}{found.group(3)}" for n in numbers]
    return names


# ---------------------------------------------------------------------------------------------- the processes


def _fd_target(fd: int) -> str:
    try:
        return os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        return "closed"


def training() -> None:
    """A training process toward a job: it greets, trains until SIGUSR1, checkpoints and ends."""
    env = os.environ
    limit = float(env.get("JOBSIM_MEM_MB") or 0)
    if 0 < limit < 1024:  # PyTorch alone takes a few hundred MiB: the step's cgroup ends the process
        say(f"slurmstepd: error: Detected 1 oom-kill event(s) in StepId={env.get('SLURM_JOB_ID')}."
            f"{env.get('SLURM_STEP_ID')}. Some of your processes may have been killed by the cgroup out-of-memory "
            "handler.")
        os.kill(os.getpid(), signal.SIGKILL)
    link = Link("training", args=sys.argv[1:], stdout=_fd_target(1), stderr=_fd_target(2),
                **{k.lower(): env.get(k) for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE",
                                                    "GROUP_RANK", "MASTER_ADDR", "MASTER_PORT", "OMP_NUM_THREADS",
                                                    "JOBSIM_CPUS", "SLURMD_NODENAME")})
    for stream, text in ((sys.stdout, f"rank {env.get('RANK')} of {env.get('WORLD_SIZE')} (local rank "
                                      f"{env.get('LOCAL_RANK')}, node {env.get('GROUP_RANK')}) on "
                                      f"{env.get('SLURMD_NODENAME')}, pid {os.getpid()}"),
                         (sys.stderr, f"rank {env.get('RANK')}: its warnings reach the job's log")):
        with contextlib.suppress(OSError, ValueError):  # a stream the launch closed
            print(text, file=stream, flush=True)
    loop, warned = Loop(link), []
    link.send(op="ready")
    go = link.wait("go")
    if go.get("fail"):
        link.send(op="note", what="training_failed", error=go["fail"])
        say(go["fail"])
        sys.exit(1)

    def on_signal(number):
        if number != signal.SIGUSR1:
            die_of(link, number, "training")
        link.send(op="note", what="signal", role="training", signal="SIGUSR1")
        if not warned:  # the training loop checkpoints once and stops; a second warning changes nothing
            warned.append(number)
            link.send(op="timer", s=link.config["checkpoint_s"], tag="checkpoint")

    def on_message(message):
        if message.get("tag") == "checkpoint":
            link.send(op="note", what="checkpoint")
            sys.exit(0)

    loop.run(on_message, on_signal)


# ---------------------------------------------------------------------------------------------- the tools


def _signal_number(text: str) -> int | None:
    """A signal as procps and coreutils name one: USR1, SIGUSR1, usr1 or 10."""
    if text.isdigit():
        return int(text) if 0 <= int(text) < 65 else None
    name = "SIG" + text.upper().removeprefix("SIG")
    return int(signal.Signals.__members__[name]) if name in signal.Signals.__members__ else None


def _signal_matches(program: str, select, number: int, quiet: bool = False) -> None:
    """Signal the processes of this node that ``select`` (a pgrep command line) finds, as pkill or killall."""
    import subprocess

    link = Link(program)
    found = subprocess.run(["pgrep", *select], capture_output=True, text=True)
    if found.returncode > 1:
        say(found.stderr.strip().replace("pgrep", program), found.returncode)
    link.send(op="same_node", pids=[int(p) for p in found.stdout.split()])
    hit = []
    for pid in link.wait("same_node")["pids"]:
        try:
            os.kill(pid, number)
            hit.append(pid)
        except OSError as err:
            say(f"{program}: killing pid {pid} failed: {err.strerror}")
    name = signal.Signals(number).name if number else "0"  # signal 0 only asks whether the process exists
    link.send(op="note", what="signalled", program=program, argv=sys.argv, signal=name, hit=hit)
    if not hit and program == "killall" and not quiet:
        say(f"{select[-1]}: no process found")
    sys.exit(0 if hit else 1)


def pkill(argv: list[str]) -> None:
    number, rest = signal.SIGTERM, list(argv)
    for i, arg in enumerate(rest):  # procps: the first -SIGNAL anywhere, or --signal SIGNAL
        if arg.startswith("--signal"):
            value = arg.partition("=")[2] if "=" in arg else rest[i + 1] if i + 1 < len(rest) else ""
            number = _signal_number(value)
            if number is None:
                say(f"pkill: Unknown signal \"{value}\"", 2)
            del rest[i:i + (1 if "=" in arg else 2)]
            break
        if arg[:1] == "-" and _signal_number(arg[1:]) is not None:
            number = _signal_number(arg[1:])
            del rest[i]
            break
    _signal_matches("pkill", [a for a in rest if a not in ("-e", "--echo")], number)


def killall(argv: list[str]) -> None:
    number, select, names, quiet, regex = signal.SIGTERM, [], [], False, False
    args = list(argv)
    while args:
        arg = args.pop(0)
        if arg in ("-s", "--signal"):
            number = _signal_number(args.pop(0) if args else "") or say("killall: unknown signal", 1)
        elif arg in ("-q", "--quiet"):
            quiet = True
        elif arg in ("-r", "--regexp"):
            regex = True
        elif arg in ("-I", "--ignore-case"):
            select.append("-i")
        elif arg in ("-u", "--user") and args:
            select += ["-u", args.pop(0)]
        elif arg[:1] == "-" and _signal_number(arg[1:]) is not None:
            number = _signal_number(arg[1:])
        elif arg[:1] != "-":
            names.append(arg)
    if not names:
        say("Usage: killall [OPTION]... [--] NAME...", 1)
    _signal_matches("killall", [*select, *([] if regex else ["-x"]), "|".join(names) if regex else names[0]],
                    number, quiet)


def scontrol(argv: list[str]) -> None:
    link = Link("scontrol")
    words = [a for a in argv if not a.startswith("-")]
    shows = len(words) >= 2 and "show".startswith(words[0])
    if shows and words[1].startswith("hostn"):
        text = words[2] if len(words) > 2 else os.environ.get("SLURM_JOB_NODELIST")
        if not text:
            say("scontrol: error: No hostlist specified", 1)
        print("\n".join(hostlist(text)))
    elif shows and "job".startswith(words[1]):
        config = link.config  # laid out as Slurm's: BatchHost, the first node, on a line of its own
        print(f"JobId={config['job']} JobName=ex61-train\n   JobState=RUNNING Reason=None\n   NumNodes="
              f"{len(config['nodes'])}\n   NodeList={os.environ.get('SLURM_JOB_NODELIST', '')}\n   BatchHost="
              f"{config['nodes'][0]}")
    elif shows and words[1] in ("node", "nodes"):  # the job's nodes, as Slurm lays them out (a node's name is its
        nodes = link.config["nodes"]                # address here, as on many clusters)
        for name in hostlist(",".join(words[2:])) if len(words) > 2 else nodes:
            if name not in nodes:
                say(f"Node {name} not found", 1)
            print(f"NodeName={name} Arch=x86_64 CoresPerSocket=8\n   CPUAlloc=2 CPUTot=16 CPULoad=0.10\n   "
                  f"NodeAddr={name} NodeHostName={name}\n   RealMemory=64000 AllocMem=0 State=MIXED\n   "
                  "Partitions=cpu\n")
    else:
        say(f"scontrol: error: {' '.join(argv)}: this simulated scontrol knows show hostnames, show job and show "
            "node only", 1)


def hostname(argv: list[str]) -> None:
    config = Link("hostname").config
    node = config["node"]
    addresses = any(a in ("-i", "-I", "--ip-address", "--all-ip-addresses") for a in argv)
    print(f"10.1.0.{17 + node}" if addresses else config["nodes"][node])


def uname(argv: list[str]) -> None:
    """uname -n names the node the process runs on; every other question goes to this machine's uname."""
    if argv and all(a in ("-n", "--nodename") for a in argv):
        config = Link("uname").config
        print(config["nodes"][config["node"]])
        return
    _this_machines("uname", argv)


def getent(argv: list[str]) -> None:
    """getent hosts NODE knows the job's nodes; every other question goes to this machine's getent."""
    nodes = Link("getent").config["nodes"]
    if len(argv) > 1 and argv[0] in ("hosts", "ahosts", "ahostsv4") and all(key in nodes for key in argv[1:]):
        for key in argv[1:]:
            address = f"10.1.0.{17 + nodes.index(key)}"
            print(f"{address:<15} {key}" if argv[0] == "hosts" else
                  f"{address:<15} STREAM {key}\n{address:<15} DGRAM\n{address:<15} RAW")
        return
    _this_machines("getent", argv)


def _this_machines(name: str, argv: list[str]) -> None:
    path = os.pathsep.join(p for p in os.environ.get("PATH", "").split(os.pathsep) if p != os.path.join(SIM, "bin"))
    program = shutil.which(name, path=path) or say(f"{name}: command not found", 127)
    os.execv(program, [name, *argv])


def _seconds(text: str) -> float:
    found = re.fullmatch(r"([0-9]*\.?[0-9]+)([smhd]?)|inf(inity)?", text)
    if not found:
        say(f"sleep: invalid time interval ‘{text}’\nTry 'sleep --help' for more information.", 1)
    return 1e12 if found.group(1) is None else float(found.group(1)) * {"": 1, "s": 1, "m": 60, "h": 3600,
                                                                         "d": 86400}[found.group(2)]


def sleep(argv: list[str]) -> None:
    if not argv:
        say("sleep: missing operand\nTry 'sleep --help' for more information.", 1)
    link = Link("sleep")
    link.send(op="timer", s=sum(_seconds(a) for a in argv), tag="wake")
    link.wait("timer")


def timeout(argv: list[str]) -> None:
    args, number, kill_after = list(argv), signal.SIGTERM, None

    def value_of(arg: str, short: str) -> str:  # -sUSR1, -s USR1, --signal=USR1, --signal USR1
        if arg.startswith(short) and len(arg) > 2:
            return arg[2:]
        if "=" in arg:
            return arg.partition("=")[2]
        if not args:
            said = f"option '{arg}'" if arg.startswith("--") else f"option requires an argument -- '{arg[1]}'"
            say(f"timeout: {said}{' requires an argument' * arg.startswith('--')}", 125)
        return args.pop(0)

    while args and args[0].startswith("-") and args[0] != "-":
        arg = args.pop(0)
        if arg in ("-s", "--signal") or arg.startswith(("-s", "--signal=")):
            value = value_of(arg, "-s")
            number = _signal_number(value)
            if number is None:
                say(f"timeout: {value}: invalid signal", 125)
        elif arg in ("-k", "--kill-after") or arg.startswith(("-k", "--kill-after=")):
            kill_after = _seconds(value_of(arg, "-k"))
    if len(args) < 2:
        say("timeout: missing operand", 125)
    import subprocess

    duration = _seconds(args[0])
    link = Link("timeout", duration=duration, command=args[1:])
    child = subprocess.Popen(args[1:])
    outcome = []

    def on_message(message):
        if message.get("tag") == "due":
            outcome.append(124)
            child.send_signal(number)
            if kill_after:
                link.send(op="timer", s=kill_after, tag="kill")
        elif message.get("tag") == "kill":
            child.kill()

    def on_child(pid, status):
        if pid == child.pid:
            sys.exit(outcome[0] if outcome else status_code(status))

    if duration > 0:
        link.send(op="timer", s=duration, tag="due")
    Loop(link).run(on_message, child.send_signal, on_child)


def container(argv: list[str]) -> None:
    """apptainer or singularity exec IMAGE COMMAND: the cluster's image holds the same programs."""
    takes_value = {"-B", "--bind", "--env", "--env-file", "-H", "--home", "--pwd", "-W", "--workdir", "--overlay",
                   "-S", "--scratch", "--mount", "--network", "--security"}
    args = list(argv[1:]) if argv[:1] in (["exec"], ["run"]) else say(
        f"{os.path.basename(sys.argv[0])}: this simulation runs only exec IMAGE COMMAND", 255)
    while args and args[0].startswith("-"):
        args = args[2:] if args[0] in takes_value else args[1:]
    if len(args) < 2:
        say("FATAL: exec needs an image and a command", 255)
    program = shutil.which(args[1], path=os.environ.get("PATH", "/bin:/usr/bin"))
    if program is None:
        say(f"FATAL: \"{args[1]}\": executable file not found in $PATH", 255)
    os.execv(program, args[1:])


def scancel(argv: list[str]) -> None:
    """scancel --signal=SIG [--batch|--full] JOB; without --signal (ending the job) it refuses."""
    number, batch, steps, job = None, False, True, None
    args = list(argv)
    while args:
        arg = args.pop(0)
        if arg.startswith(("--signal", "-s")):
            value = arg.partition("=")[2] if "=" in arg else arg[2:] if arg.startswith("-s") and len(arg) > 2 else (
                args.pop(0) if args else "")
            number = _signal_number(value) or say(f"scancel: error: Invalid job signal: {value}", 1)
        elif arg in ("-b", "--batch"):
            batch, steps = True, False
        elif arg in ("-f", "--full"):
            batch = True
        elif not arg.startswith("-"):
            job = arg
    link = Link("scancel")
    if job != str(link.config["job"]):
        say(f"scancel: error: Kill job error on job id {job}: Invalid job id specified", 1)
    if number is None:
        say("scancel: error: this simulation only sends signals (scancel --signal=...)", 1)
    link.send(op="scancel", signal=number, batch=batch, steps=steps)
    link.wait("scancel")


def slurm_client(argv: list[str]) -> None:
    """sbatch, squeue, sinfo, ...: the simulated job has no controller to ask, and must never reach a real one."""
    say(f"{os.path.basename(sys.argv[0])}: error: the check's simulated job has no Slurm controller to ask", 1)


MOUNT_FLAGS = {"ro": 1, "nosuid": 2, "nodev": 4, "noexec": 8, "noatime": 1 << 10, "nodiratime": 1 << 11,
               "relatime": 1 << 21}  # a mount's flags as mountinfo names them, as mount(2) takes them
MS_REMOUNT, MS_BIND, MS_REC = 1 << 5, 1 << 12, 1 << 14


def confine(keep: str, argv: list[str], node: str) -> None:
    """Every mount read-only but ``keep`` (the simulation's folder), the machine named ``node`` (so that any way of
    asking, gethostname() or /proc/sys/kernel/hostname, names the batch shell's node), then ``argv``; run as root of
    user, mount and UTS namespaces of its own, which need no privilege. /proc and /sys stay: the job mounts a /proc
    of its own."""
    import ctypes

    with contextlib.suppress(OSError):  # where it cannot, the job sees this machine's name, as before
        socket.sethostname(node)

    libc = ctypes.CDLL(None, use_errno=True)

    def mount(source: str, target: str, flags: int) -> None:
        if libc.mount(source.encode(), target.encode(), None, flags, None) != 0:
            raise OSError(ctypes.get_errno(), f"mount {target}: {os.strerror(ctypes.get_errno())}")

    keep = os.path.realpath(keep)  # as mountinfo names it
    mount(keep, keep, MS_BIND | MS_REC)  # a mount of its own, which the remounts below leave writable
    with open("/proc/self/mountinfo") as file:
        mounts = [(line.split(" - ")[0].split(), line.split(" - ")[1].split()[0]) for line in file]
    for fields, kind in mounts:
        target = re.sub(r"\\([0-7]{3})", lambda code: chr(int(code.group(1), 8)), fields[4])
        if kind in ("proc", "sysfs") or target == keep or target.startswith(("/proc/", "/sys/")):
            continue
        flags = sum(MOUNT_FLAGS.get(option, 0) for option in fields[5].split(","))  # its locked flags kept
        try:
            mount("none", target, MS_REMOUNT | MS_BIND | MOUNT_FLAGS["ro"] | flags)
        except OSError:
            if target == "/":
                raise
    os.execvp(argv[0], argv)


CLIENTS = ("sbatch", "squeue", "sinfo", "salloc", "sacct", "sstat", "sattach", "sbcast", "strigger", "sprio",
           "sshare", "sacctmgr", "sreport", "sdiag", "scrontab")
PROGRAMS = {"scancel": scancel, **{name: slurm_client for name in CLIENTS}, "pkill": pkill, "killall": killall,
            "scontrol": scontrol, "hostname": hostname, "uname": uname, "getent": getent, "sleep": sleep,
            "timeout": timeout, "apptainer": container, "singularity": container}


def main(sim: str) -> None:
    """The program this file stands in for, by the name it was started under."""
    global SIM
    SIM = sim
    PROGRAMS[os.path.basename(sys.argv[0])](sys.argv[1:])
