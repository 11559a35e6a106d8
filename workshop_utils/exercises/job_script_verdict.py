"""Exercise 6.1, the job script judged by what it did: bash ran it in a simulated job (``job_script_run``), once
as the exercise's job, once as the same job on two nodes (only #SBATCH --nodes changed, as the notebook says),
and once where the training fails. The first thing that went wrong against the exercise (``JOB_SPEC``) is the
verdict, said as what happened, with bash's, srun's and torchrun's own words where they spoke.
"""

from __future__ import annotations

import re

from .answer_values import show
from .job_script import RDZV_FIX, TRAINING, JobSpec
from .job_script_run import MACHINE_SLEEP_S, MOST_PROCESSES, NODE_NAMES, JobRun, Outcome, simulate
from .job_script_static import line_of
from .slurm_rules import slurm_signal, time_limit_s

TEMPLATE_FIX = "keep the template's launch line, its gaps filled"
WAIT_FIX = ("Fix: keep the template's loop after the launch, `while ! wait $!; do kill -0 $! 2>/dev/null || break; "
            "done`, which waits again after each warning until training has ended")


def _n(count, noun: str) -> str:
    return f"one {noun}" if count == 1 else f"{count} {noun}{'es' if noun.endswith('ss') else 's'}"


def _said(log: str, *patterns: str) -> str:
    """The first line of the job's log that matches, as bash, srun or torchrun wrote it; "" if none does."""
    for line in log.splitlines():
        if any(re.search(p, line) for p in patterns):
            return show(re.sub(r"^\S*job\.sbatch: ", "", line.strip()), 160)
    return ""


class Judge:
    """One run's outcome, read against the exercise."""

    def __init__(self, script: str, outcome: Outcome, spec: JobSpec, written: dict):
        self.script, self.o, self.spec, self.written = script, outcome, spec, written
        self.nodes = outcome.run.nodes
        self.where = "" if self.nodes == 1 else (f"on {self.nodes} nodes (the same script with only #SBATCH "
                                                 f"--nodes={self.nodes}, as the notebook says it must train), ")
        starts = outcome.of("start")
        self.agents = [e for e in starts if e["role"] == "torchrun"]
        self.trainings = [e for e in starts if e["role"] == "training"]
        self.sruns = {e["pid"]: e for e in starts if e["role"] == "srun"}
        self.launches = {e["pid"]: e for e in outcome.of("launch")}
        self.errors = [e for e in outcome.events if e["what"] in ("torchrun_error", "rdzv_error")]

    def bash_said(self) -> str:
        return self.said(r"line \d+: ")

    def said(self, *patterns) -> str:
        found = _said(self.o.log, *patterns)
        return f" (the job's log says: {found})" if found else ""

    def before_the_end(self, what: str) -> list[dict]:
        """The events of a kind before Slurm's own end of the job (its SIGTERM at the time limit)."""
        end = next((k for k, e in enumerate(self.o.events) if e["what"] == "time_limit"), len(self.o.events))
        return [e for e in self.o.events[:end] if e["what"] == what]

    def end_of_batch(self) -> str:
        """How the batch shell ended, in words."""
        end = next(iter(self.o.of("batch_end")), None)
        if end is None:
            return "the job ran until its time limit" if self.o.reason == "time_limit" else "the batch shell ran on"
        how = f"with exit status {end['status']}" if end["signal"] is None else f"killed by {end['signal']}"
        return f"the batch shell ended {how} after {end['t']:g} s"

    @staticmethod
    def bare(command: str) -> str:
        """A command line as the script wrote it, without the simulation's paths to its stand-ins."""
        return re.sub(r"^\S+/(py/rt|py/python3[.0-9]*) -IS \S+/bin/", "", command)

    def stopped_problem(self) -> str | None:
        """The check stopped the job before its end: a fork bomb, a long sleep on the machine's clock."""
        event = next((e for e in self.o.events if e["what"] == self.o.reason), {})
        command, where = show(self.bare(event.get("command") or ""), 50), self.where
        if self.o.reason == "runaway" and "processes" in event:
            most = "copies of the batch shell" if command in ("bash", "sh", "job.sbatch") else f"`{command}`"
            return (f"{where}the job ran more than {MOST_PROCESSES} processes at once (most of them {most}): a "
                    "function or loop that keeps starting programs (a fork bomb) fills the node until nothing can "
                    "start, so the check stopped it there. Fix: the template's lines, each command started once.")
        if self.o.reason == "machine_sleep":
            return (f"{where}`{command}`{line_of(self.script, command)} sleeps on the machine's own clock "
                    f"({event['seconds']:g} s asked; a sleep program by its path, a program that polls, Python's "
                    "time.sleep), which the simulated job cannot skip, and the check waits for at most "
                    f"{MACHINE_SLEEP_S} s of such sleeps. Fix: before the launch, only commands that end soon (sleep "
                    "by its name, sleep N, is the job's own, which the check skips).")
        return None

    def unlaunched_problem(self) -> str | None:
        """Why bash never reached the launch: the time limit came first, set -u stopped it, a signal ended it."""
        where, events = self.where, self.o.events
        start = f"{where}nothing started torchrun, so the job would train nothing: bash never got to run a launch: "
        limit = next((k for k, e in enumerate(events) if e["what"] == "time_limit"), None)
        if limit is not None and not any(e["what"] == "start" and e["role"] == "srun" and "torchrun" in " ".join(
                e.get("command") or []) for e in events[:limit]):
            waiting = [self.bare(c) for c in events[limit].get("waiting") or []]
            what = f"still waited for `{show(waiting[-1], 50)}`{line_of(self.script, waiting[-1])}" if waiting else \
                "had not reached it"
            return (f"{start}its time limit came while the batch shell {what}, a command that does not end by itself "
                    "(bash runs the next line only once it has). Fix: before the launch, only commands that end; "
                    "the launch itself in the background (&), as in the template.")
        unbound = re.fullmatch(r"line (\d+): ([A-Za-z_]\w*): unbound variable", _said(self.o.log, r"line \d+: "))
        if unbound:  # bash's first complaint: a variable by its name (not $!, which only a launch sets)
            line, name = unbound.groups()
            why = ("Slurm sets it only in the tasks of a job array (sbatch --array), and this job is none" if
                   name.startswith("SLURM_ARRAY_") else "Slurm does not set it in this job's batch shell (srun sets "
                   "some, such as SLURM_STEP_ID or SLURM_LAUNCH_NODE_IPADDR, only in the tasks it starts)" if
                   name.startswith("SLURM") else "nothing in the script or the job's environment sets it by then")
            return (f"{start}it stopped at line {line}, `{name}: unbound variable`: {why}, and set -u ends the "
                    f"script at the first variable that is not set. Fix: a variable the batch shell has (SLURM_JOB_ID, "
                    f"SLURM_JOB_NODELIST, ...), or a default: ${{{name}:-VALUE}}.")
        end = next(iter(self.o.of("batch_end")), None)
        if end is not None and end["signal"] and not self.bash_said():
            return (f"{start}the batch shell was killed by {end['signal']} after {end['t']:g} s, before it: a command "
                    "of the script signalled it (kill $$, kill -9 -1 or pkill -u $USER reach every process of yours "
                    "in the job, the batch shell too). Fix: nothing before the launch that signals your own "
                    "processes; the template's lines.")
        return None

    # ------------------------------------------------------------------------------------------ the launch

    def launch_problem(self) -> str | None:
        script, where = self.script, self.where
        if not self.agents:
            unlaunched = self.unlaunched_problem()
            if unlaunched:
                return unlaunched
            srun = _said(self.o.log, r"^srun: (error|fatal|unrecognized|option|invalid)", r"slurmstepd: error",
                         r"^srun: Job")
            if srun:
                launch = self._launch_srun()
                options = f" {' '.join(self._srun_words(launch))}" if launch else ""
                return (f"{where}srun{options} did not start the launch: {srun}. Fix: srun --cpus-per-task="
                        "\"$SLURM_CPUS_PER_TASK\" torchrun ..., as in the template, with no other srun option.")
            return (f"{where}nothing started torchrun, so the job would train nothing: bash never got to run a launch "
                    f"({self.end_of_batch()}){self.bash_said()}. Fix: {TEMPLATE_FIX}: srun ... torchrun ... "
                    "-m workshop_utils.train \"$@\" &, at the script's top level.")
        for node in range(self.nodes):
            here = [a for a in self.agents if a["node"] == node]
            name = NODE_NAMES[node]
            if not here:
                srun = self._launch_srun()
                how = (" (it ran without srun, which starts one on every node)" if not any(
                    "srun" in a["under"] for a in self.agents) else
                    f" (srun {' '.join(self._srun_words(srun))} started it on {NODE_NAMES[0]} only)" if srun else "")
                return (f"{where}torchrun started on {NODE_NAMES[0]} only, none on {name}{how}: the rendezvous would "
                        f"wait for {name}'s agent until it times out. Fix: srun "
                        "--cpus-per-task=\"$SLURM_CPUS_PER_TASK\" torchrun ..., as in the template, with no srun "
                        "option that picks the nodes or tasks.")
            if len(here) > 1:
                if len({a["ppid"] for a in here}) == 1:  # one srun's tasks
                    nproc = self.launches.get(here[0]["pid"], {}).get("nproc", "?")
                    total = nproc * len(here) if isinstance(nproc, int) else "?"
                    return (f"{where}srun starts {len(here)} torchruns on each node and each starts "
                            f"{_n(nproc, 'process')}, {total} per node: {len(here)} torchrun agents on {name}, each "
                            "taken for a node of its own by the rendezvous. Fix: --ntasks-per-node=1 (the one task is "
                            "torchrun) and --nproc-per-node the processes per node.")
                return (f"{where}the job started torchrun {len(here)} times on {name}: it would train {len(here)} "
                        "times over, side by side on the same cores. Fix: one launch line, at the script's top level, "
                        "as in the template.")
        if not any("srun" in a["under"] for a in self.agents):
            return (f"torchrun is started without srun{line_of(script, 'torchrun')}: the batch shell runs on the job's "
                    "first node only, so with --nodes=2 (the notebook: only #SBATCH --nodes changes) the second node "
                    "would start no agent. Fix: srun --cpus-per-task=\"$SLURM_CPUS_PER_TASK\" torchrun ..., as in "
                    "the template.")
        wrapped = [a for a in self.agents + self.trainings if "timeout" in a["under"]]
        if wrapped:
            timer = next((e for e in self.o.of("start") if e["role"] == "timeout"), {})
            return (f"timeout on the launch line (timeout {show(' '.join(timer.get('argv', ['?'])[1:2]))}"
                    f"{line_of(script, 'timeout ')}) ends training on a clock of its own, apart from the job's limit "
                    "and its warning: no checkpoint is written when it fires. Fix: leave timeout out: #SBATCH --time "
                    "limits the job.")
        return None

    def _launch_srun(self) -> dict | None:
        """The srun that starts torchrun (or python -m torch.distributed.run)."""
        return next((e for e in self.sruns.values() if re.search(r"torchrun|torch\.distributed\.run",
                                                                   " ".join(e.get("command") or []))), None)

    @staticmethod
    def _srun_words(srun: dict) -> list[str]:
        """srun's options as srun read them, in their long form."""
        return [f"--{k}" + (f"={v}" if v is not None else "") for k, v in srun.get("options", {}).items()]

    def torchrun_problem(self) -> str | None:
        noted = next((e["error"] for e in self.errors if e["what"] == "torchrun_error"), "")
        said = show(noted, 200) if noted else _said(self.o.log, r"^torchrun: error")
        if said:
            fix, gloss = "keep the options of the template's launch line", ""
            if "rendezvous endpoint" in noted:
                fix = RDZV_FIX
                endpoint = re.search(r"endpoint '(.*)' must", noted, re.S)
                text = endpoint.group(1) if endpoint else ""
                gloss = (": bash left $ in it, kept as text by single quotes or a backslash" if "$" in text or "`" in
                         text else ": its host is empty" if text.startswith(":") else
                         ": it holds a line break, more than one line of a command's output" if "\n" in text else
                         ": it holds a space" if " " in text.strip() else
                         ": ports end at 65535, and a port is 1 to 5 digits" if "port number" in noted else "")
            return f"{self.where}torchrun stopped at its arguments ({said}){gloss}. Fix: {fix}."
        spec = self.spec
        for pid, launch in self.launches.items():
            args = next(a for a in self.agents if a["pid"] == pid)
            if launch["nproc"] != spec.procs_per_node:
                raw = next((w for w in args["argv"] if "nproc" in w), "--nproc-per-node")
                at = line_of(self.script, raw.split("=")[0] + "=")
                return (f"{show(raw)}{at}: torchrun started {launch['nproc']} training "
                        f"process(es) on {NODE_NAMES[launch['node']]}, not the {spec.procs_per_node} the exercise asks "
                        f"for. Fix: --nproc-per-node={spec.procs_per_node}.")
            if not launch["module"] or launch["script"] != "workshop_utils.train" or launch["run_path"]:
                how = ("--run-path runs it as a file path" if launch["run_path"] else
                       "-m is missing" if not launch["module"] else f"the module is {show(launch['script'])}")
                worker = self.said(r"^(ModuleNotFoundError|FileNotFoundError|.*No module named|.*can't open file)")
                return (f"the launch line runs {show(launch['script'])} ({how}), not the training, "
                        f"-m workshop_utils.train{worker}. Fix: -m workshop_utils.train \"$@\" at its end, as in the "
                        "template.")
            if launch["port"] == 0 and not launch["implicit"]:
                return (f"port 0{line_of(self.script, '--rdzv-endpoint')} (in job {self.o.run.job_id}) is not a port "
                        "torchrun's agents can meet on: the first node's agent would listen on whatever port the "
                        f"system picks, which the other nodes' agents cannot know. Fix: {RDZV_FIX}.")
        return None

    # ------------------------------------------------------------------------------------------ the rendezvous

    def rendezvous_problem(self) -> str | None:
        where, fix = self.where, f"Fix: {RDZV_FIX}."
        joins = self.o.of("rdzv_join")
        for error in (e for e in self.errors if e["what"] == "rdzv_error"):
            host, port = error.get("host"), error.get("port")
            if "EACCES" in error["error"]:
                drawn = (f", where bash's $RANDOM was {self.o.run.random}: any job may draw that" if "RANDOM" in
                         self.script else "")
                return (f"the rendezvous port {port} (in job {self.o.run.job_id}{drawn})"
                        f"{line_of(self.script, '--rdzv-endpoint')}: only root may listen below 1024, so torchrun on "
                        f"{NODE_NAMES[error['node']]} stopped: {show(error['error'], 90)}. Fix: a port from 1024 to "
                        "65535, e.g. 29500, or $((29500 + SLURM_JOB_ID % 1000)).")
            if "Name or service not known" in error["error"]:
                return (f"{where}the rendezvous host {show(host)} is no node of the job, so torchrun on "
                        f"{NODE_NAMES[error['node']]} could not reach it ({show(error['error'], 90)}): the agents "
                        f"meet at a node of the job's node list, by the name Slurm gives it. {fix}")
            if error.get("nobody_hosts"):
                conf = (self.launches.get(error["pid"], {}).get("conf") or {}).get("is_host")
                told = f" (--rdzv-conf is_host={conf}: no agent decides it hosts)" if conf else ""
                return (f"{where}no agent hosted the rendezvous{told}: torchrun on {NODE_NAMES[error['node']]} was "
                        f"told to meet at {show(self._endpoint_of(error['pid']))}, where no agent listens "
                        f"({show(error['error'], 80)}). {fix}")
            conf = self.launches.get(error["pid"], {}).get("conf") or {}
            return (f"{where}torchrun on {NODE_NAMES[error['node']]} stopped waiting for the other nodes' agents "
                    f"({show(error['error'], 90)}): nodes start seconds apart, and it waited only "
                    f"{conf.get('join_timeout', 600)} s (--rdzv-conf{line_of(self.script, '--rdzv-conf')}). Fix: leave "
                    "--rdzv-conf out, as the template does (torchrun then waits 600 s).")
        done = self.o.of("rdzv_done")
        waiting = [j for j in joins if not any(j["store"] == d["store"] for d in done)]
        if self.nodes == 1 and waiting:
            said = self._nnodes()
            at = line_of(self.script, "--nnodes").replace(" (line", ", line").rstrip(")")
            return (f"torchrun waited for {waiting[0]['min']} nodes ({show(said)}{at}) in "
                    "a job of one: the rendezvous never completed, and nothing trained. Fix: "
                    "--nnodes=\"$SLURM_JOB_NUM_NODES\", Slurm's count of the job's nodes.")
        if self.nodes > 1 and not any(len(d["nodes"]) == self.nodes for d in done):
            return self._never_met(joins, done)
        for d in done:
            host_node = d["store"][0]
            if host_node != 0 and self.nodes > 1:
                join = next(j for j in joins if j["store"] == d["store"])
                return (f"{where}the rendezvous host {show(join['host'])} is the job's node {NODE_NAMES[host_node]}, "
                        "not its first, the one the exercise meets at (the first line of scontrol's list). " + fix)
        return None

    def _nnodes(self) -> str:
        """torchrun's --nnodes as given (the last one, which torchrun takes)."""
        words = [w for a in self.agents for w in a["argv"] if w.startswith("--nnodes")]
        return words[-1] if words else "no --nnodes (1)"

    def _endpoint_of(self, pid: int) -> str:
        launch = self.launches.get(pid, {})
        return f"{launch.get('host')}:{launch.get('port')}"

    def _never_met(self, joins: list, done: list) -> str:
        where, fix = self.where, f"Fix: {RDZV_FIX}."
        at = {j["node"]: j for j in joins}
        if len(at) < self.nodes:
            return f"{where}the agents on {NODE_NAMES[0]} and {NODE_NAMES[1]} never met. {fix}"
        first, second = at[0], at[1]
        if first["backend"] == "static":
            return (f"{where}the agents never met: torchrun's static rendezvous (the default without "
                    "--rdzv-backend=c10d) needs each node started with its own --node-rank, and both took "
                    f"--node-rank {first['node_rank']} from one srun line. Fix: --rdzv-backend=c10d and {RDZV_FIX}.")
        if done and first["store"] == second["store"]:
            closed = min(len(d["nodes"]) for d in done)
            said = self._nnodes()
            return (f"{where}torchrun on {NODE_NAMES[1]} was left out of the rendezvous: {show(said)}"
                    f"{line_of(self.script, '--nnodes')} made the agents agree on {_n(closed, 'node')}, so the round "
                    "closed without it. Fix: --nnodes=\"$SLURM_JOB_NUM_NODES\", Slurm's count of the job's nodes.")
        if first["target"] == 0 and second["target"] == 1 and first["host"] != second["host"]:
            return (f"{where}each node's agent waited at its own node ({show(first['host'])} on {NODE_NAMES[0]}, "
                    f"{show(second['host'])} on {NODE_NAMES[1]}): the host is read on each node, where it names that "
                    f"node, so they never met. Fix: expand the host in the batch shell: {RDZV_FIX}.")
        if first["target"] == 0 and second["target"] == 1:
            alone = " (--standalone: each agent meets on its own localhost)" if any(
                "--standalone" in a["argv"] for a in self.agents) else ""
            return (f"{where}every agent waited at its own loopback, {show(first['host'])}:{first['port']}{alone}, so "
                    f"the agents on {NODE_NAMES[0]} and {NODE_NAMES[1]} never met. {fix}")
        if first["store"][2] != second["store"][2]:
            return (f"{where}the agents never met: their --rdzv-id differ ({show(first['store'][2])}, "
                    f"{show(second['store'][2])}). Fix: --rdzv-id=\"$SLURM_JOB_ID\", the same on every node.")
        return f"{where}the agents on {NODE_NAMES[0]} and {NODE_NAMES[1]} never met. {fix}"

    # ------------------------------------------------------------------------------------------ the processes

    def process_problem(self) -> str | None:
        spec, where = self.spec, self.where
        if not self.trainings:
            said = self.said(r"Error|error|failed", r"No such file")
            return f"{where}no training process started{said}. Fix: {TEMPLATE_FIX}."
        world = self.nodes * spec.procs_per_node
        first = self.trainings[0]
        if any(t.get("world_size") != str(world) for t in self.trainings):
            return (f"{where}the training processes formed a world of {first.get('world_size')}, not "
                    f"{world}. Fix: {TEMPLATE_FIX}.")
        threads = first.get("omp_num_threads")
        cores = int(first.get("jobsim_cpus") or 1)
        if threads != str(spec.cores_per_proc):
            crowd = (f": {int(threads) * spec.procs_per_node} threads would take turns on them, each process slowed by "
                     "the others" if (threads or "").isdigit() and int(threads) * spec.procs_per_node > cores else "")
            crowd = crowd or (": 0 is no thread count, so OpenMP starts a thread per core" if threads == "0" else "")
            return (f"OMP_NUM_THREADS={show(threads)} for {spec.procs_per_node} training processes on {cores} core(s), "
                    f"where the exercise gives each process one core and one thread{crowd}. Fix: export "
                    "OMP_NUM_THREADS=1, one thread per process, as the template does.")
        job_cpus = int(self.o.run.options.get("cpus-per-task") or 1)
        srun = self.sruns.get(self.agents[0]["ppid"]) or self._launch_srun()
        need = spec.procs_per_node * spec.cores_per_proc
        if cores != job_cpus and srun is not None and srun.get("options", {}).get("cpus-per-task") is None:
            return (f"srun starts torchrun without --cpus-per-task{line_of(self.script, 'torchrun')}: Slurm 22.05 to "
                    "23.02 do not pass the job's --cpus-per-task on to srun, so there its one task gets one core and "
                    f"the {spec.procs_per_node} training processes take turns on it. Fix: srun "
                    "--cpus-per-task=\"$SLURM_CPUS_PER_TASK\" torchrun ..., as in the template, which every Slurm "
                    "reads alike.")
        if cores < need:
            return (f"--cpus-per-task={cores} for {spec.procs_per_node} training processes: they would take turns on "
                    f"{cores} core(s). Fix: --cpus-per-task={need} (one core per process here).")
        if cores > need:
            return (f"--cpus-per-task={cores} for {spec.procs_per_node} training processes of one thread each "
                    f"(OMP_NUM_THREADS=1): {cores - need} core(s) would sit idle, held from everyone else. Fix: "
                    f"--cpus-per-task={need}, one core per process.")
        args = first.get("args") or []
        if list(args) != list(TRAINING):
            if not args:
                return ("the training got none of the script's arguments, the check's training flags (steps, "
                        "checkpoints): the launch line does not pass \"$@\" on, or something before it emptied them "
                        "(set --). Fix: keep \"$@\" at the end of the launch line, and the arguments as they are.")
            lost = [w for w in TRAINING if w.startswith("--") and w not in args]
            return (f"the training got other flags than the script was given ({show(' '.join(args), 70)}"
                    f"{', without ' + ' '.join(lost) if lost else ''}): something before the launch changed the "
                    "script's arguments (shift, set --), or the launch passes others. Fix: keep \"$@\" at the end of "
                    "the launch line, and the arguments as they are.")
        for stream in ("stdout", "stderr"):
            target = first.get(stream)
            if target == "closed" or target == "/dev/null":
                how = "is closed" if target == "closed" else "goes to /dev/null"
                return (f"the training's {stream} {how}, so its lines never reach the job's log: the ranks' lines "
                        "that the check (and you) read go nowhere (the launch's output goes to /dev/null, or an exec "
                        "redirection threw the job's log away). Fix: no redirection on the launch line and no exec "
                        "> ..., as in the template.")
        missing = [t["rank"] for t in self.trainings if f"rank {t['rank']} of" not in self.o.log]
        if missing:
            return (f"rank {missing[0]}'s lines never reached the job's log. Fix: no redirection on the launch line, "
                    "as in the template.")
        return None

    # ------------------------------------------------------------------------------------------ the warning

    def warning_problem(self) -> str | None:
        warnings = self.o.of("warning")
        spec, where = self.spec, self.where
        total = len(self.trainings)
        if not warnings:
            return (f"{where}{self.end_of_batch()} before the warning came{self.bash_said()}: the batch shell "
                    f"must wait while training runs. {WAIT_FIX}.")
        first, given = warnings[0], show(self.written.get("signal", self.o.run.options.get("signal")))
        wanted = f"SIG{spec.warning}"
        if not first["batch"]:
            also = (f", and sends {first['signal']}, where the trap and the training loop listen for {wanted}"
                    if first["signal"] != wanted else "")
            return (f"--signal={given} has no B:, so Slurm sends the warning to the "
                    "job's steps (the tasks srun started: torchrun, which it ends), not to the batch shell: the "
                    f"script's trap never fires{also}. Fix: --signal=B:{spec.warning}@60.")
        if first["signal"] != wanted:
            return (f"--signal={given} sends {first['signal']}: the trap and the "
                    f"training loop listen for {wanted}. Fix: --signal=B:{spec.warning}@SECONDS, SECONDS the warning's "
                    "lead time.")
        warned = {e["pid"] for e in self.o.of("signal", role="training", signal=wanted)}
        others = sorted((e for e in self.before_the_end("signal") if e["role"] in ("torchrun", "kernel")),
                        key=lambda e: e["role"] != "kernel")
        if others:
            hit, by = others[0], self._signaller()
            if hit["role"] == "kernel":
                return (f"{where}the warning reached a Jupyter kernel of yours on {NODE_NAMES[hit['node']]} (another "
                        f"job's, python too){by}: the trap's signal goes to every python process of yours there, not "
                        "to the training alone. Fix: pkill -USR1 -f \"python[0-9.]* -u -m workshop_utils.train\".")
            step = next((e for e in self.sruns.values() if (e.get("options") or {}).get("signal")), None)
            if step:
                at = line_of(self.script, "srun --signal")
                return (f"srun --signal={show(step['options']['signal'])} on the launch{at} makes Slurm signal the "
                        "step's tasks, the torchrun agents, which it ends, and their training processes with them. "
                        "Fix: no --signal on srun: #SBATCH --signal=B:... warns the batch shell, whose trap passes it "
                        "on.")
            return (f"{where}the warning reached torchrun itself{by}, which {hit['signal']} ends, and its training "
                    "processes with it, before any checkpoint: a pattern that matches torchrun's own command line "
                    "(it names the module too) or its name. Fix: pkill -USR1 -f \"python[0-9.]* -u -m "
                    "workshop_utils.train\", which matches the processes torchrun starts, started with python -u.")
        if len(warned) < total:
            return self._not_reached(first, warned, total)
        checkpoints = {e["pid"] for e in self.o.of("checkpoint")}
        end = next(iter(self.o.of("batch_end")), None)
        if checkpoints != {t["pid"] for t in self.trainings}:
            if end is not None:
                number = sum(1 for w in warnings if w["t"] <= end["t"])
                after = "the second warning" if number > 1 else "the warning"
                hint = (f" ({end['status']} = 128 + {end['status'] - 128}: what wait returns when a trapped signal "
                        "interrupts it; under set -e that ends the script)" if (end["status"] or 0) > 128 else "")
                return (f"{where}the batch shell ended after {after}, with status {end['status']}{hint}, while "
                        f"training was still writing its checkpoint: Slurm ends the job with the batch shell, so the "
                        f"checkpoint is lost{self.bash_said()}. {WAIT_FIX}.")
            return (f"{where}the job reached its time limit before every checkpoint was written "
                    f"({self._running()}). {WAIT_FIX}.")
        if end is None or self.o.of("time_limit"):
            how = ("kept running with nothing to wait for (bash spun in a loop)" if self.o.reason == "spinning" else
                   "waited until the job's time limit")
            if self._running().count(",") or "bash" in self._running():
                how += (" for another job it sent to the background (wait $! waits for the last one: keep the "
                        "launch's, pid=$!, right after it)")
            return (f"{where}training ended (every checkpoint written), but the batch shell {how} "
                    f"({self._running()}){self.bash_said()}: the job's wait loop never ends. {WAIT_FIX}.")
        if end["status"] != 0:
            return (f"{where}training ended well, but the batch shell then ended with status {end['status']}"
                    f"{self.bash_said()}: Slurm would record the job as FAILED. {WAIT_FIX}.")
        return None

    def ended_early(self) -> str | None:
        """A training process that ended before the warning: a step limit, a failed start, a kill."""
        warned_at = next((e["t"] for e in self.o.events if e["what"] in ("warning", "time_limit")), 1e12)
        ended = [e for e in self.o.events if e["t"] < warned_at and (
            (e["what"] == "signal" and e["role"] == "training") or e["what"] == "training_failed" or
            (e["what"] == "step_end" and any(e["codes"])))]
        if not ended:
            return None
        said = _said(self.o.log, r"slurmstepd: error", r"DistNetworkError", r"Error: ")
        local = next((x["local_addr"] for x in self.launches.values() if x.get("local_addr")), None)
        hint = (f" (the training processes meet at the first agent's address, which --local-addr={local} made one "
                "that only its own node reaches)" if local else "")
        return (f"{self.where}training ended before the warning came{hint}"
                f"{' (the job' + chr(39) + 's log says: ' + said + ')' if said else ''}: the job would have stopped "
                f"without a checkpoint. Fix: {TEMPLATE_FIX}.")

    def _signaller(self) -> str:
        sent = self.o.of("signalled") + [dict(program="scancel", argv=self.command(e["pid"])) for e in
                                         self.o.of("scancel")]
        return f" (`{show(' '.join([sent[0]['program'], *sent[0]['argv'][1:]]), 80)}` signalled it)" if sent else ""

    def command(self, pid: int) -> list[str]:
        return next((e.get("argv") or [] for e in self.o.of("start") if e["pid"] == pid), [])

    def _running(self) -> str:
        limit = next((e for e in self.o.events if e["what"] in ("time_limit", "spinning", "wall_limit")), {})
        running = limit.get("running") or limit.get("bash_children") or []
        shown = [show(self.bare(r["command"]), 50) for r in running]
        return "the batch shell was running: " + ", ".join(shown) if shown else "nothing else was running"

    def _not_reached(self, first: dict, warned: set, total: int) -> str:
        where = self.where
        reached = f"the warning reached {len(warned)} of {total} training processes"
        takes = first.get("batch_takes")
        if takes == "default":
            return (f"{where}the warning (SIG{self.spec.warning}) ended the batch shell: nothing in the script traps "
                    "it (or the trap is reset to the signal's default action), so the job ended with it. Fix: trap "
                    "forward USR1, with forward() passing the warning on, as in the template.")
        if takes == "ignored":
            return (f"{where}the batch shell ignores SIG{self.spec.warning} (trap '' USR1): the warning goes nowhere, "
                    f"and {reached}. Fix: trap forward USR1, as in the template.")
        sent = self.o.of("signalled")
        busy = self.said(r"step creation temporarily disabled")
        if busy:
            return (f"{where}{reached}: the trap's srun waited for cores that the launch's step holds{busy}. Fix: srun "
                    "--overlap in forward(), which shares them, as in the template.")
        # Until the time limit, not the second warning: on a loaded machine bash has run the first warning's trap
        # only once the second came, then both.
        until = next(iter(self.o.of("time_limit")), None) or next(iter(self.o.of("warning", number=2)), {})
        started = [e for e in self.o.of("start") if first["t"] <= e["t"] < until.get("t", 1e12)]
        running = [r for r in first.get("running") or [] if r.get("role") != "kernel"]
        if running and not sent and not started and until.get("log_size") == first.get("log_size"):
            command = self.bare(running[-1]["command"])
            return (f"{where}{reached}: after the warning nothing in the job ran: the trap does nothing, or bash had "
                    f"not run it, as it runs a trap only once the command it waits for in the foreground has ended, "
                    f"here `{show(command, 50)}` (a command without &). {WAIT_FIX}.")
        if sent:
            by_node = {}
            for e in sent:
                by_node.setdefault(NODE_NAMES[e["node"]], []).extend(e["hit"])
            argv = sent[0]["argv"]
            command = show(" ".join([sent[0]["program"], *argv[1:]]), 80)
            if sent[0]["signal"] != f"SIG{self.spec.warning}":
                return (f"{where}{reached}: `{command}` sent {sent[0]['signal']}, which ends them before any "
                        f"checkpoint: the training loop listens for SIG{self.spec.warning}. Fix: pkill -USR1, as in "
                        "the template.")
            counts = ", ".join(f"{len(set(pids))} on {node}" for node, pids in by_node.items())
            missed = [NODE_NAMES[n] for n in range(self.nodes) if NODE_NAMES[n] not in by_node]
            names = sorted({show(re.sub(r"^\S*/", "", t.get("cmdline") or ""), 50) for t in self.trainings})
            tail = (f"; it ran on {', '.join(by_node)} only, not on {', '.join(missed)}: the trap's command runs on "
                    "the batch node only unless srun --overlap --ntasks-per-node=1 runs it on every node"
                    if missed else ": its pattern and options must pick exactly the processes torchrun starts, here "
                    f"{' and '.join(f'`{n}`' for n in names)}")
            return (f"{where}{reached} (`{command}` signalled {counts}{tail}). Fix: srun --overlap "
                    "--ntasks-per-node=1 pkill -USR1 -f \"python[0-9.]* -u -m workshop_utils.train\", as in the "
                    "template.")
        said = _said(self.o.log, r"line \d+: ", r"^(pkill|killall|pgrep|srun|scancel|kill): ")
        said = f" (the job's log says: {said})" if said else ""
        return (f"{where}{reached}: the trap ran nothing that signals them{said}. Fix: trap forward USR1 with "
                "forward() as in the template.")

    def failed_run_problem(self) -> str | None:
        """Where training fails at its start, the batch shell must end too, not wait or spin until the limit."""
        if self.o.of("batch_end"):
            return None
        how = ("kept running: its loop spins with nothing left to wait for" if self.o.reason == "spinning" else
               "waited until the job's time limit")
        return (f"when training fails (a rank exits with an error), the batch shell {how} ({self._running()})"
                f"{self.bash_said()}: the wait loop never ends. {WAIT_FIX}.")


def behaviour_problem(script: str, read: dict, written: dict, spec: JobSpec) -> str | None:
    """The first mistake a run of the script shows, as "problem. Fix: ..."; None when every run went right."""
    warning = slurm_signal(read.get("signal"))
    limit = int(time_limit_s(read["time"]))
    sent = warning and (warning.signal, warning.lead_s, warning.to_batch_shell)
    # Job ids where % 1000 gives 0 and % 40000 or % 50000 pass 65535 above 29500; bash's $RANDOM fixed at 846
    # (below 1024, where only root may listen), then at 32611 (near its largest): any job may draw either.
    runs = [JobRun(read, limit, sent, nodes=1, job_id=1000, python="python3", random=846),
            JobRun(read, limit, sent, nodes=2, job_id=199999, python="python3.11", random=32611),
            JobRun(read, limit, sent, nodes=1, job_id=1000, fail=True)]
    for run in runs:
        judge = Judge(script, simulate(script, run), spec, written)
        stopped = judge.stopped_problem()
        if stopped:
            return stopped
        if run.fail:
            problem = judge.failed_run_problem()
        else:
            problem = (judge.launch_problem() or judge.torchrun_problem() or judge.rendezvous_problem()
                       or judge.ended_early() or judge.process_problem() or judge.warning_problem())
        if problem:
            return problem
    return None
