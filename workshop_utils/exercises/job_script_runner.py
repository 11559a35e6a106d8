"""Exercise 6.1's simulated job, the runner: PID 1 of the job's namespace, serving the stand-ins (nodes, steps'
cores, the rendezvous, the job's clock). The clock moves only when two looks at /proc agree that every process waits,
so what happens depends on the order of events, never on how fast this machine is. Standard library only.
"""

from __future__ import annotations

import collections
import contextlib
import heapq
import itertools
import json
import os
import selectors
import signal
import socket
import struct
import time

from .job_script_standins import CATCHABLE, reaped

SHELLS = ("bash", "sh", "dash", "job.sbatch")  # the batch shell goes by its script's name
LOOPBACK = ("localhost", "localhost.localdomain", "ip6-localhost", "::1", "0.0.0.0")
# nanosleep and clock_nanosleep, by machine: a process asleep in one wakes by the machine's clock, by itself
NANOSLEEP = {"x86_64": (35, 230), "aarch64": (101, 115)}.get(os.uname().machine, ())


def read_proc(pid: int, name: str, mode: str = "r"):
    """/proc/PID/NAME as text (bytes with mode "rb"); None once the process has gone."""
    try:
        with open(f"/proc/{pid}/{name}", mode) as file:
            return file.read()
    except OSError:
        return None


def refused(host, port) -> str:
    """What torch says where nothing listens at the address."""
    return f"torch.distributed.DistNetworkError: failed to connect to [{host}]:{port} (errno: 111 - Connection refused)"


class Conn:
    def __init__(self, sock):
        self.sock, self.buffer, self.pid, self.role, self.node = sock, b"", 0, "?", 0

    def send(self, **message):
        with contextlib.suppress(OSError):  # a program that has gone gets no answer
            self.sock.sendall(json.dumps(message).encode() + b"\n")


class Runner:
    def __init__(self, config: dict):
        self.config, self.sim = config, config["sim"]
        self.now, self.timers, self.order = 0.0, [], itertools.count()  # timers due at once run in order
        self.events, self.procs, self.steps, self.waiting, self.rounds = [], {}, {}, [], {}
        self.conns, self.bash, self.bash_status = {}, 0, None
        self.selector = selectors.DefaultSelector()
        self.last, self.base_cpu, self.started, self.ending = None, {}, time.monotonic(), False
        self.started_now = 0  # programs started since the clock last moved
        self.slept = {}  # (pid, runs): the seconds each sleep on the machine's clock asked for

    # ------------------------------------------------------------------------------------------ bookkeeping
    def note(self, what: str, **details):
        self.events.append(dict(t=round(self.now, 3), what=what, **details))

    def at(self, when: float, action, *args, **kwargs):
        heapq.heappush(self.timers, (when, next(self.order), action, args, kwargs))

    @staticmethod
    def parent(pid: int) -> int:
        try:
            return int((read_proc(pid, "stat") or "").rsplit(")", 1)[1].split()[1])
        except (ValueError, IndexError):
            return 0

    def node_of(self, pid: int) -> int:
        """The node a process runs on: its JOBSIM_NODE (srun sets it for its tasks), else its parent's."""
        while pid > 1:
            environ = read_proc(pid, "environ", "rb")
            if environ is None:
                return 0
            found = [item[12:] for item in environ.split(b"\0") if item.startswith(b"JOBSIM_NODE=")]
            if found:
                return int(found[0] or 0)
            pid = self.parent(pid)
        return 0

    def command_of(self, pid: int) -> str:
        return " ".join(part.decode(errors="replace") for part in (read_proc(pid, "cmdline", "rb") or b"").split(b"\0")
                        if part)

    def ancestors(self, pid: int) -> list[str]:
        """What a process runs under, nearest first: the stand-ins' roles, the other programs' names."""
        chain = []
        while (pid := self.parent(pid)) > 0:
            chain.append(self.procs.get(pid, {}).get("role") or self.command_of(pid).split(" ")[0].rsplit("/", 1)[-1])
        return chain

    def dispositions(self, pid: int, number: int) -> str:
        """How a process takes a signal: caught (a handler, bash's trap), ignored, or its default action."""
        status = read_proc(pid, "status")
        if status is None:
            return "gone"
        masks = dict(line.split(":\t", 1) for line in status.splitlines() if ":\t" in line)
        bit = 1 << (number - 1)
        return ("caught" if int(masks["SigCgt"], 16) & bit else "ignored" if int(masks["SigIgn"], 16) & bit else
                "default")

    def children_of(self, pid: int) -> list[dict]:
        return [dict(pid=int(name), command=self.command_of(int(name)), role=self.procs.get(int(name), {}).get("role"))
                for name in os.listdir("/proc") if name.isdigit() and self.parent(int(name)) == pid]

    def leaves_of(self, pid: int) -> list[str]:
        """The commands a process waits for in the end: the leaves of its tree."""
        children = self.children_of(pid)
        return [c["command"] for c in children if not self.children_of(c["pid"])] + [
            leaf for c in children for leaf in self.leaves_of(c["pid"])]

    # ------------------------------------------------------------------------------------------ processes
    def spawn(self, path: str, argv: list[str], env: dict, cwd: str, out: int | None = None) -> int:
        log = os.open(os.path.join(self.sim, "job.log"), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        pid = os.fork()
        if pid == 0:
            try:
                os.setsid()
                signal.signal(signal.SIGINT, signal.SIG_DFL)
                signal.signal(signal.SIGQUIT, signal.SIG_DFL)  # as slurmstepd starts a batch script
                os.chdir(cwd)
                os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
                os.dup2(log if out is None else out, 1)
                os.dup2(log, 2)
                os.execve(path, argv, env)
            except OSError as err:  # slurmstepd's words when the #! line names no program
                os.write(2, f"slurmstepd: error: execve(): {os.path.basename(path)}: {err.strerror}\n".encode())
            os._exit(127)
        os.close(log)
        return pid

    def signal_all(self, number: int):
        """Slurm ending the job: every process of it, not the other jobs' kernels."""
        for name in os.listdir("/proc"):
            pid = int(name) if name.isdigit() else 0
            if pid > 1 and self.procs.get(pid, {}).get("role") != "kernel":
                with contextlib.suppress(OSError):
                    os.kill(pid, number)

    def signal_steps(self, number: int) -> list[int]:
        """Every step's tasks, each with its process group, as slurmctld signals a job's steps."""
        targets = [pid for step in self.steps.values() for pid in step["tasks"]]
        for pid in targets:
            with contextlib.suppress(OSError):
                os.killpg(pid, number)
        return targets

    def reap(self):
        for pid, status in reaped():
            if self.procs.get(pid, {}).get("role") == "kernel" and os.WIFSIGNALED(status):
                self.note("signal", pid=pid, role="kernel", node=self.procs[pid]["node"],
                          signal=signal.Signals(os.WTERMSIG(status)).name)
            if pid == self.bash:
                self.bash_status = code = os.waitstatus_to_exitcode(status)
                self.note("batch_end", status=code if code >= 0 else None,
                          signal=signal.Signals(-code).name if code < 0 else None)
                self.ending = True  # what the batch shell started before it ended gets to say so first

    # ------------------------------------------------------------------------------------------ messages
    def receive(self, conn: Conn):
        try:
            data = conn.sock.recv(1 << 16)
        except OSError:
            data = b""
        if not data:
            self.selector.unregister(conn.sock)
            conn.sock.close()
            self.conns.pop(conn.sock, None)
            return
        conn.buffer += data
        *lines, conn.buffer = conn.buffer.split(b"\n")
        for line in lines:
            self.handle(conn, json.loads(line))

    def handle(self, conn: Conn, m: dict):
        op = m.pop("op")
        if op == "hello":
            conn.pid, conn.role = m["pid"], m["role"]
            self.started_now += 1
            if self.started_now > self.config["most_starts"]:  # a trap that signals its own shell, for instance
                self.note("runaway", command=self.command_of(conn.pid), starts=self.started_now)
                self.finish("runaway", kill=True)
            conn.node = self.node_of(conn.pid)
            self.procs[conn.pid] = dict(role=conn.role, node=conn.node)
            # bash's asynchronous commands (&) ignore SIGQUIT where there is no job control; it waits for the others
            self.note("start", pid=conn.pid, role=conn.role, node=conn.node, under=self.ancestors(conn.pid),
                      cmdline=self.command_of(conn.pid), **{k: v for k, v in m.items() if k not in ("pid", "role")},
                      background=self.dispositions(conn.pid, signal.SIGQUIT) == "ignored")
            c = self.config
            conn.send(op="config", node=conn.node, nodes=c["node_names"], job=c["job_id"], now=self.now,
                      end=c["time_s"], cpus=c["cpus_per_node"], skew=c["skew_s"], checkpoint_s=c["checkpoint_s"],
                      kill_wait=c["kill_wait_s"], python=c["python"], max_workers=c["max_workers"])
        elif op == "note":
            self.note(m.pop("what"), pid=conn.pid, node=conn.node, **m)
        elif op == "timer":
            self.at(m["at"] if "at" in m else self.now + m["s"], conn.send, op="timer", tag=m["tag"])
        elif op == "step":
            self.step(conn, m)
        elif op == "tasks":
            self.steps[conn]["tasks"].update({int(pid): node for pid, node in m["pids"].items()})
        elif op == "step_end":
            self.steps.pop(conn, None)
            self.note("step_end", pid=conn.pid, codes=m["codes"])
            self.grant_waiting()
        elif op == "same_node":
            conn.send(op="same_node", pids=[p for p in m["pids"] if p > 1 and p != conn.pid and
                                            self.node_of(p) == conn.node])
        elif op == "rdzv":
            self.rendezvous(conn, m)
        elif op == "scancel":  # scancel --signal: the steps' processes, the batch shell too with --batch or --full
            targets = self.signal_steps(m["signal"]) if m["steps"] else []
            if m["batch"] and self.bash_status is None:
                os.kill(self.bash, m["signal"])
            self.note("scancel", pid=conn.pid, signal=signal.Signals(m["signal"]).name, steps=targets,
                      batch=m["batch"])
            conn.send(op="scancel")
        elif op == "ready":
            conn.send(op="go", fail=self.training_fails(conn))

    def step(self, conn: Conn, m: dict):
        self.steps[conn] = dict(cpus={int(k): v for k, v in m["cpus"].items()}, overlap=m["overlap"], tasks={},
                                granted=False, id=len([e for e in self.events if e["what"] == "step"]))
        self.note("step", pid=conn.pid, node=conn.node, cpus=m["cpus"], overlap=m["overlap"])
        busy = not self.grant(conn)
        conn.send(op="step", busy=busy, step=self.steps[conn]["id"])
        if busy:
            self.waiting.append(conn)

    def grant(self, conn: Conn) -> bool:
        """A step without --overlap gets its cores only where no other step holds them. A step with --overlap holds
        none: Slurm counts no cores used for it (a launch after `srun --overlap ... &` still starts)."""
        step = self.steps[conn]
        held = collections.Counter()
        for other in self.steps.values():
            if other is not step and other["granted"] and not other["overlap"]:
                held.update(other["cpus"])
        if not step["overlap"] and any(held[node] + cpus > self.config["cpus_per_node"]
                                       for node, cpus in step["cpus"].items()):
            return False
        step["granted"] = True
        return True

    def grant_waiting(self):
        for conn in list(self.waiting):
            if conn in self.steps and self.grant(conn):
                self.waiting.remove(conn)
                conn.send(op="granted")

    def training_fails(self, conn: Conn) -> str | None:
        """Why a training process stops at its start: the failing run, or a master address out of reach."""
        env = next(e for e in reversed(self.events) if e.get("pid") == conn.pid and e["what"] == "start")
        if self.config["fail"] and env.get("rank") == "0":
            return "RuntimeError: the simulated training failed (this run checks that the job then ends)"
        for round_ in self.rounds.values():
            if round_["closed"] and round_["master_addr"] == env.get("master_addr") and \
                    self.resolve(env.get("master_addr") or "", conn.node) != round_["master_node"]:
                return refused(env.get("master_addr"), env.get("master_port"))
        return None

    # ------------------------------------------------------------------------------------------ rendezvous
    def resolve(self, host: str, node: int) -> int | None:
        names = self.config["node_names"]
        if host in LOOPBACK or host.startswith("127."):
            return node
        if host in names:
            return names.index(host)
        if host.startswith("10.1.0.") and host[7:].isdigit() and 0 <= int(host[7:]) - 17 < len(names):
            return int(host[7:]) - 17
        return None

    def rendezvous(self, conn: Conn, m: dict):
        """torchrun's agents meet: c10d in a store one of them hosts at the endpoint, static by node rank."""
        if m["backend"] not in ("c10d", "static"):
            return self.rdzv_error(conn, f"ValueError: The rendezvous backend '{m['backend']}' is not registered.")
        target, port, conf = self.resolve(m["host"], conn.node), m["port"], m["conf"]
        if target is None:
            return self.rdzv_error(conn, f"torch.distributed.DistNetworkError: failed to connect to [{m['host']}]:"
                                         f"{port} (errno: -2 - Name or service not known)", host=m["host"])
        is_host = {"true": True, "1": True, "false": False, "0": False}.get(str(conf.get("is_host", "")).lower())
        if m["backend"] == "static":
            is_host = m["node_rank"] == 0
        hosts = target == conn.node if is_host is None else is_host
        store = (conn.node if hosts else target, port, str(m["run_id"]))
        if hosts and 0 < port < 1024:
            return self.rdzv_error(conn, "torch.distributed.DistNetworkError: The server socket has failed to listen "
                                         f"on any local network address. port: {port}, code: -13, name: EACCES, "
                                         "message: permission denied", host=m["host"], port=port)
        round_ = self.rounds.setdefault(store, dict(members=[], hosted=False, closed=False, master_node=None))
        round_["hosted"] |= hosts
        member = dict(conn=conn, node=conn.node, nproc=m["nproc"], rank=m["node_rank"], host=m["host"], port=port,
                      hosts=hosts, min=m["min"], max=m["max"], local_addr=m["local_addr"])
        self.note("rdzv_join", pid=conn.pid, node=conn.node, host=m["host"], port=port, target=target, hosts=hosts,
                  store=list(store), min=m["min"], max=m["max"], backend=m["backend"], node_rank=m["node_rank"])
        if round_["closed"]:
            return self.at(self.now + float(conf.get("join_timeout", 600)), self.gives_up, conn, store, True)
        round_["members"].append(member)
        first = round_["members"][0]
        if port == 0 and not hosts:  # the host listens on a port the system picked, which nobody else knows
            return self.rdzv_error(conn, refused(m["host"], 0), host=m["host"], port=0)
        if m["backend"] == "static":
            ranks = sorted(x["rank"] for x in round_["members"])
            if ranks == list(range(first["max"])):
                self.close(store)
        elif len(round_["members"]) >= first["max"]:
            self.close(store)
        elif len(round_["members"]) == first["min"]:
            self.at(self.now + float(conf.get("last_call_timeout", 30)), self.close, store)
        self.at(self.now + float(conf.get("join_timeout", 600)), self.gives_up, conn, store, True)
        self.at(self.now + 60, self.gives_up, conn, store, False)  # a client gives up on a store nobody hosts

    def close(self, store):
        round_ = self.rounds[store]
        if round_["closed"] or not round_["hosted"]:
            return
        round_["closed"] = True
        members = round_["members"]
        if members[0]["rank"] is not None:
            members.sort(key=lambda x: x["rank"])
        world, offset = sum(x["nproc"] for x in members), 0
        master = members[0]
        address = master["local_addr"] or self.config["node_names"][master["node"]]
        round_.update(master_node=master["node"], master_addr=address)
        self.note("rdzv_done", store=list(store), nodes=[x["node"] for x in members], world=world)
        for group, x in enumerate(members):
            x["conn"].send(op="round", group_rank=group, groups=len(members), world=world, rank_offset=offset,
                           master_addr=address, master_port=29501)
            offset += x["nproc"]

    def rdzv_error(self, conn: Conn, error: str, **details):
        """An agent gives up: torchrun stops, and leaves the round it was waiting in."""
        self.note("rdzv_error", pid=conn.pid, node=conn.node, error=error, **details)
        for round_ in self.rounds.values():
            if not round_["closed"]:
                round_["members"] = [x for x in round_["members"] if x["conn"] is not conn]
                round_["hosted"] = any(x["hosts"] for x in round_["members"])
        conn.send(op="round", error=error)

    def gives_up(self, conn: Conn, store, timed_out: bool):
        """An agent still outside a closed round stops: at its join timeout, or where nobody hosts the store."""
        round_ = self.rounds[store]
        member = round_["closed"] and conn in [x["conn"] for x in round_["members"]]
        if conn in self.conns.values() and not member:
            if timed_out:
                self.rdzv_error(conn, "torch.distributed.elastic.rendezvous.api.RendezvousTimeoutError: the "
                                      "rendezvous did not complete in time")
            elif not round_["hosted"]:
                self.rdzv_error(conn, refused(self.config["node_names"][store[0]], store[1]), nobody_hosts=True)

    # ------------------------------------------------------------------------------------------ the clock
    def time_limit(self):
        """Slurm ends the job at its limit: SIGTERM to every process, SIGKILL kill_wait_s later."""
        self.note("time_limit", running=self.children_of(self.bash) if self.bash_status is None else [],
                  waiting=self.leaves_of(self.bash) if self.bash_status is None else [],
                  log_size=os.path.getsize(os.path.join(self.sim, "job.log")))
        self.signal_all(signal.SIGTERM)
        self.at(self.now + self.config["kill_wait_s"], self.finish, "time_limit", kill=True)

    def warn(self):
        """Slurm's warning, sent once (slurmctld marks the job WARN_SENT)."""
        sig, lead, batch = self.config["warning"]
        if self.bash_status is not None:
            return
        takes, log_size = self.dispositions(self.bash, sig), os.path.getsize(os.path.join(self.sim, "job.log"))
        if batch:
            targets = [self.bash]
            os.kill(self.bash, sig)
        else:
            targets = self.signal_steps(sig)
        self.note("warning", signal=signal.Signals(sig).name, batch=batch, targets=targets,
                  running=self.children_of(self.bash), batch_takes=takes, log_size=log_size)

    def snapshot(self) -> dict:
        """Every process but this one: its name, its state, its time on a CPU (ns), how often it has run."""
        found = {}
        for name in os.listdir("/proc"):
            if not name.isdigit() or name == "1":
                continue
            try:
                comm, rest = (read_proc(name, "stat") or "").split("(", 1)[1].rsplit(")", 1)
                ran, _, runs = (int(word) for word in (read_proc(name, "schedstat") or "").split()[:3])
            except (ValueError, IndexError):
                continue
            found[int(name)] = (comm, rest.split()[0], ran, runs)
        return found

    @staticmethod
    def machine_sleep(pid: int) -> float | None:
        """The seconds a process sleeps on the machine's clock (/bin/sleep, Python's time.sleep), which the job's
        clock cannot skip; 0 when it does for a time this cannot read; None when it waits for something else."""
        words = (read_proc(pid, "syscall") or "").split()
        try:
            number = int(words[0])
        except (ValueError, IndexError):
            return None
        if number not in NANOSLEEP:
            return None
        args = [int(word, 16) for word in words[1:4]]
        clock, flags, request = args if number == NANOSLEEP[1] else (time.CLOCK_MONOTONIC, 0, args[0])
        try:
            with open(f"/proc/{pid}/mem", "rb") as memory:
                memory.seek(request)
                seconds, nanoseconds = struct.unpack("qq", memory.read(16))
            asked = seconds + nanoseconds / 1e9
            return max(asked - time.clock_gettime(clock), 0.0) if flags & 1 else asked  # 1: TIMER_ABSTIME
        except (OSError, ValueError, OverflowError, struct.error):
            return 0.0

    def idle(self) -> bool:
        """True once two looks at /proc agree that every process waits: nothing can happen until we act."""
        snap = self.snapshot()
        if len(snap) > self.config["most_processes"]:  # a fork bomb: stopped before it fills the machine
            names = [comm for comm, *_ in snap.values()]
            self.note("runaway", processes=len(snap), command=max(set(names), key=names.count))
            self.finish("runaway")
        # A shell that keeps a CPU busy with nothing happening around it loops for good (while true; do wait; done);
        # a program that computes (python -c ...) may take its time.
        spent = {pid: ran - self.base_cpu.get(pid, 0) for pid, (comm, _, ran, _) in snap.items() if comm in SHELLS}
        if sum(spent.values()) > self.config["spin_cpu_s"] * 1e9:
            busy = max(spent, key=spent.get)
            self.note("spinning", pid=busy, command=self.command_of(busy), role=self.procs.get(busy, {}).get("role"),
                      running=self.children_of(self.bash))
            self.finish("spinning", kill=True)
        quiet = all(state in "SZTtIX" for _, state, *_ in snap.values())
        sleeps = {}  # a sleep on the machine's clock ends by itself: waited for, up to machine_sleep_s in all
        for pid, (_, state, _, runs) in snap.items() if quiet else ():
            seconds = self.machine_sleep(pid) if state == "S" else None
            if seconds is not None:
                sleeps[pid] = self.slept.setdefault((pid, runs), seconds)  # one sleep: the runs it has had
        if sleeps and sum(self.slept.values()) > self.config["machine_sleep_s"]:
            asleep = {p: sum(s for (q, _), s in self.slept.items() if q == p) for p in sleeps}  # each one's in all
            pid = max(asleep, key=asleep.get)
            self.note("machine_sleep", pid=pid, command=self.command_of(pid), running=self.children_of(self.bash),
                      seconds=round(asleep[pid], 3))
            self.finish("machine_sleep")
        quiet = quiet and not sleeps
        same, self.last = quiet and snap == self.last, snap if quiet else None
        return same

    def progress(self):
        """Something happened: the CPU the processes spend from here on is counted afresh."""
        self.last = None
        self.base_cpu = {pid: ran for pid, (_, _, ran, _) in self.snapshot().items()}

    # ------------------------------------------------------------------------------------------ the run
    def start(self):
        listener = socket.socket(socket.AF_UNIX)
        listener.bind(os.path.join(self.sim, "sock"))
        listener.listen(64)
        self.selector.register(listener, selectors.EVENT_READ, "accept")
        wake_read, wake_write = os.pipe()
        os.set_blocking(wake_write, False)
        signal.set_wakeup_fd(wake_write)
        signal.signal(signal.SIGCHLD, lambda *_: None)
        self.selector.register(wake_read, selectors.EVENT_READ, "wake")
        c = self.config
        for node in range(len(c["node_names"])):
            self.kernel(node)
        script = os.path.join(self.sim, "job.sbatch")
        self.bash = self.spawn(script, [script, *c["args"]], dict(c["env"], JOBSIM_NODE="0"), c["cwd"])
        self.note("batch_start", pid=self.bash)
        self.at(c["time_s"], self.time_limit)
        if c["warning"]:
            self.at(c["time_s"] - c["warning"][1], self.warn)
        self.progress()

    def kernel(self, node: int):
        """Another job's Jupyter kernel on the node: it writes down every signal it gets and keeps running."""
        found = os.path.join(self.sim, f"kernel-{node}.signals")
        code = (f"for s in {' '.join(s.name[3:] for s in CATCHABLE)}; do trap \"echo SIG$s >> {found}\" $s; done; "
                f"echo ready; exec 1>&-; exec 3<> {self.sim}/kernel.fifo; while :; do read -u 3 _; done")
        ready, out = os.pipe()
        pid = self.spawn(os.path.join(self.sim, "py", "kernel", "python3"), ["python3", "-c", code, "-m",
                         "ipykernel_launcher", "-f", f"/run/user/jupyter/kernel-{node}.json"],
                         dict(self.config["env"], JOBSIM_NODE=str(node)), self.config["cwd"], out)
        os.close(out)
        with os.fdopen(ready) as said:  # its traps are set once it says so
            said.readline()
        self.procs[pid] = dict(role="kernel", node=node, signals=found)

    def serve_once(self, timeout) -> bool:
        ready = self.selector.select(timeout)
        for key, _ in ready:
            if key.data == "accept":
                sock, _ = key.fileobj.accept()
                self.conns[sock] = conn = Conn(sock)
                self.selector.register(sock, selectors.EVENT_READ, conn)
            elif key.data == "wake":
                os.read(key.fileobj, 512)
                self.reap()
            else:
                self.receive(key.data)
        return bool(ready)

    def run(self):
        pause = 0.0005
        while True:
            if self.serve_once(pause):
                self.progress()
                pause = 0.0005
                continue
            if time.monotonic() - self.started > self.config["wall_s"]:
                self.note("wall_limit", running=self.children_of(self.bash))
                self.finish("wall_limit")
            if not self.idle():
                pause = min(pause * 2, 0.005)
            elif self.ending:
                self.finish("batch_end", kill=True)  # the job is over: Slurm ends what is left of it
            elif self.timers:
                when, _, action, args, kwargs = heapq.heappop(self.timers)
                self.started_now = 0 if when > self.now else self.started_now
                self.now = max(self.now, when)
                action(*args, **kwargs)
                self.progress()
                pause = 0.0005

    def finish(self, reason: str, kill: bool = False):
        if kill:
            self.signal_all(signal.SIGKILL)
        for pid, proc in self.procs.items():
            if proc["role"] == "kernel" and os.path.exists(proc["signals"]):
                with open(proc["signals"]) as file:
                    for name in file.read().split():
                        self.note("signal", pid=pid, role="kernel", node=proc["node"], signal=name)
        part = os.path.join(self.sim, "outcome.json.part")
        with open(part, "w") as file:
            json.dump(dict(reason=reason, events=self.events), file)
        os.rename(part, os.path.join(self.sim, "outcome.json"))
        os._exit(0)  # PID 1 leaves: the kernel ends every process left in the namespace


def serve(config_path: str) -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)  # PID 1 takes no signal it has no handler for: the script's
    with open(config_path) as file:               # kill -INT 1 must not reach it as a KeyboardInterrupt
        runner = Runner(json.load(file))
    runner.start()
    runner.run()
