"""Exercise 6.1, the job script judged by what bash did with it in a simulated job: as the exercise's job, on
two nodes (only #SBATCH --nodes changed), and where training fails. The verdict is the first thing that went
wrong, one message per kind of failure, quoting bash, srun or torchrun where they spoke.
"""

from __future__ import annotations

import re

from .answer_values import show
from .job_script import RDZV_FIX, TRAINING, JobSpec
from .job_script_run import MACHINE_SLEEP_S, MOST_PROCESSES, NODE_NAMES, JobRun, Outcome, simulate
from .job_script_static import comment_in_command, line_of
from .slurm_rules import slurm_signal, time_limit_s

LAUNCH_FIX = ("keep the template's launch line, srun --cpus-per-task=\"$SLURM_CPUS_PER_TASK\" torchrun ... -m "
              "workshop_utils.train \"$@\" &, at the script's top level")
WAIT_LOOP = "while ! wait $!; do kill -0 $! 2>/dev/null || break; done"  # the template's, after the launch
WAIT_FIX = (f"keep the template's loop after the launch, `{WAIT_LOOP}`, which waits again after each warning until "
            "training has ended")
BACKGROUND_FIX = ("the launch in the background (& at the end of its line) and the template's loop after it, whose "
                  "wait the warning interrupts so that bash runs the trap")
FORWARD_FIX = ("trap forward USR1, with forward() { srun --overlap --ntasks-per-node=1 pkill -USR1 -f "
               "\"python[0-9.]* -u -m workshop_utils.train\" || true; } as in the template")
NPROC_FIX = ("Fix: --nproc-per-node, the training processes torchrun starts on each node.", "--nproc-per-node")
ENDPOINT_FIX = (f"Fix: {RDZV_FIX}.", "--rdzv-endpoint")  # the fix, and what names the line to fix
CORES_FIX = ("#SBATCH --cpus-per-task, one core for each training process, srun --cpus-per-task="
             "\"$SLURM_CPUS_PER_TASK\" and OMP_NUM_THREADS=1, as in the template")

FIRST_JOB = 1000  # the first run's job id

_TEMPLATE_WAIT = re.compile(r"&[ \t]*(#[^\n]*)?\n(?:[ \t]*#[^\n]*\n)*[ \t]*" + re.escape(WAIT_LOOP))


def _said(log: str, *patterns: str) -> str:
    """The first line of the job's log that matches, as bash, srun or torchrun wrote it; "" if none does."""
    for line in log.splitlines():
        if any(re.search(p, line) for p in patterns):
            return show(re.sub(r"^\S*job\.sbatch: ", "", line.strip()), 160)
    return ""


def _bare(command: str) -> str:
    """A command line as the script wrote it, without the simulation's paths to its stand-ins."""
    return re.sub(r"^\S+/(py/rt|py/python3[.0-9]*) -IS \S+/bin/", "", command or "")


class Judge:
    """One run's outcome, read against the exercise: each method names one kind of failure, or None."""

    def __init__(self, script: str, outcome: Outcome, spec: JobSpec, written: dict):
        self.script, self.o, self.spec, self.written = script, outcome, spec, written
        self.nodes = outcome.run.nodes
        self.where = "" if self.nodes == 1 else (f"on {self.nodes} nodes (the same script with only #SBATCH "
                                                 f"--nodes={self.nodes}, as the notebook says it must train), ")
        roles = ("torchrun", "training", "srun")
        self.agents, self.trainings, self.sruns = (outcome.of("start", role=role) for role in roles)
        self.launches = {e["pid"]: e for e in outcome.of("launch")}
        self.end = next(iter(outcome.of("batch_end")), None)  # the batch shell's end, where it ended
        self.agent = self.agents[0] if self.agents else {}
        self.step = next((s for s in self.sruns if s["pid"] == self.agent.get("ppid")), {})  # the srun of torchrun

    def said(self, *patterns: str) -> str:
        found = _said(self.o.log, *patterns or (r"line \d+: ",))
        return f" (the job's log says: {found})" if found else ""

    def drawn(self) -> str:
        """What this run drew that the next job may draw otherwise, where the script reads it: the job's id, bash's
        $RANDOM."""
        notes = []  # where the first run refuses a port, "port 0 (in job 1000)" names its id
        reads_id = re.search(r"SLURM_JOB_?ID", self.script.replace('--rdzv-id="$SLURM_JOB_ID"', ""))
        if reads_id and self.o.run.job_id != FIRST_JOB:
            notes.append(f" (the job's id was {self.o.run.job_id} in this run: Slurm may give any job that id)")
        if re.search(r"\bRANDOM\b", self.script):
            notes.append(f" (bash's $RANDOM was {self.o.run.random} in this run: any job may draw that)")
        return "".join(notes)

    def at(self, command: str) -> str:
        """`command` and the line of the script that holds it."""
        command = _bare(command)
        return f"`{show(command, 90)}`{line_of(self.script, command.split()[0] if command else '?')}"

    def launch(self, token: str = "torchrun") -> str:
        """The launch as the job ran it, and the script's line that holds ``token``, else torchrun."""
        srun = self.step or next((s for s in self.sruns if re.search(r"torchrun|torch\.distributed\.run",
                                                                    " ".join(s.get("argv") or []))), {})
        words = list((srun or self.agent).get("argv") or ["torchrun"])
        if words[-len(TRAINING):] == list(TRAINING):
            words[-len(TRAINING):] = ['"$@"']
        shown = " ".join([re.sub(r"^\S*/", "", words[0]), *words[1:]])
        return f"`{show(shown, 200)}`{line_of(self.script, token) or line_of(self.script, 'torchrun')}"

    def end_of_batch(self) -> str:
        end = self.end
        if end is None:
            return "the job ran until its time limit" if self.o.reason == "time_limit" else "the batch shell ran on"
        how = f"with exit status {end['status']}" if end["signal"] is None else f"killed by {end['signal']}"
        return f"the batch shell ended {how} after {end['t']:g} s"

    def running(self) -> str:
        limit = next((e for e in self.o.events if e["what"] in ("time_limit", "spinning", "wall_limit")), {})
        shown = [show(re.sub(r"\S*/jobsim-[^/\s]+/", "", _bare(r["command"])), 50) for r in limit.get("running", [])]
        return "the batch shell was running: " + ", ".join(shown) if shown else "nothing else was running"

    def stopped(self) -> str | None:
        """The check stopped the job before its end: a fork bomb, a long sleep on the machine's clock."""
        event = next(iter(self.o.of(self.o.reason)), {})
        if self.o.reason == "runaway" and "processes" in event:
            return (f"{self.where}the check stopped the job: it ran more than {MOST_PROCESSES} processes at once, "
                    f"most of them {self.at(event.get('command') or '')} (a fork bomb). Fix: the template's lines, "
                    "each command started once.")
        if self.o.reason == "machine_sleep":
            return (f"{self.where}the check stopped the job: {self.at(event.get('command') or '')} sleeps "
                    f"{event['seconds']:g} s on the machine's own clock, and the check waits for at most "
                    f"{MACHINE_SLEEP_S} s of such sleeps. Fix: before the launch, only commands that end soon.")
        return None

    def never_launched(self) -> str | None:
        """Nothing started torchrun: what bash was doing, where it stopped, or what srun said."""
        if self.agents:
            return None
        start = f"{self.where}nothing started torchrun, so the job trained nothing: bash never got to run a launch: "
        waiting = next(iter(self.o.of("time_limit")), {}).get("waiting")
        if waiting:
            return (f"{start}its time limit came while the batch shell waited for {self.at(waiting[-1])}, a command "
                    f"that does not end by itself{self.said()}. Fix: before the launch, only commands that end; the "
                    "launch in the background (&).")
        srun = _said(self.o.log, r"^srun: (error|fatal|unrecognized|option|invalid|Job)|slurmstepd: error")
        if srun:
            return (f"{self.where}nothing started torchrun: srun did not start the launch {self.launch()}: {srun}. "
                    f"Fix: {LAUNCH_FIX}.")
        name = next(iter(re.findall(r"line \d+: (\w+): unbound variable", self.said())), "")  # bash's set -u
        unread = next((f"line {k}, `{show(line.rstrip(), 50)}`" for k, line in enumerate(self.script.split("\n"), 1)
                       if re.match(r"\s*#[\s#]*sbatch\s", line, re.I) and not line.startswith("#SBATCH")), None)
        if name.startswith("SLURM_") and unread:  # an option sbatch never read, so Slurm set no variable for it
            return (f"{start}{self.end_of_batch()}{self.said()}: {unread}, is no #SBATCH line to sbatch, which reads "
                    "only lines that begin with #SBATCH, in capitals. Fix: #SBATCH at the line's start.")
        drawn = "" if name else self.drawn()  # what the job drew broke the launch line: its port
        fix = (f"set {name} before it is read, or give it a default, ${{{name}:-VALUE}}" if name else
               RDZV_FIX if drawn else LAUNCH_FIX)
        if name.startswith("SLURM_"):
            fix = (f"read a variable Slurm sets in this job's batch shell, such as $SLURM_CPUS_PER_TASK, or give it a "
                   f"default, ${{{name}:-VALUE}}: Slurm sets {name} "
                   + ("only in a job array" if "SLURM_ARRAY_" in name else "only for some jobs, or in srun's tasks"))
        killed = (" (a command of the script signalled it: kill $$, kill -9 -1 or pkill -u $USER reach the batch "
                  "shell too)" if (self.end or {}).get("signal") else "")
        return f"{start}{self.end_of_batch()}{killed}{self.said()}{drawn}. Fix: {fix}."

    def wrong_launch(self) -> str | None:
        """The launch ran, but not as the exercise needs: where srun put torchrun, what torchrun read."""
        fix, said, quote, token = f"Fix: {LAUNCH_FIX}.", "", "", "torchrun"
        counts = [[a["node"] for a in self.agents].count(k) for k in range(self.nodes)]
        error = next((e for e in self.o.events if e["what"] in ("torchrun_error", "rdzv_error")), None)
        if counts != [1] * self.nodes:
            said = ("the job started torchrun " + ", ".join(f"{c} time{'s' * (c > 1)} on {NODE_NAMES[k]}" if c else
                                                            f"none on {NODE_NAMES[k]}" for k, c in enumerate(counts))
                    + ", where the exercise needs one agent per node")
            asked = self.o.run.options.get("ntasks-per-node")
            if max(counts) > 1 and str(max(counts)) == asked and not {"ntasks", "ntasks-per-node"} & set(
                    self.step.get("options") or {}):  # srun started as many tasks on a node as the job asked for
                said += (f": srun starts the tasks the job asks for on each node, and #SBATCH --ntasks-per-node="
                         f"{asked}{line_of(self.script, '#SBATCH --ntasks-per-node')} asks for {asked}")
                fix = "Fix: #SBATCH --ntasks-per-node, the tasks (torchrun agents) srun starts on each node."
        elif not any("srun" in a["under"] for a in self.agents):
            said = ("torchrun is started without srun: the batch shell runs on the job's first node only, so with "
                    "--nodes=2 the other node would start no agent")
        elif any("timeout" in a["under"] for a in self.agents + self.trainings):
            said = "timeout ends training on a clock of its own, without a checkpoint (#SBATCH --time limits the job)"
        elif error:
            said = f"torchrun on {NODE_NAMES[error['node']]} stopped: {show(error['error'].rstrip('.'), 200)}"
            said += self.drawn() if re.search(r"port|endpoint", error["error"]) else ""
            if "$" in error["error"]:
                said += " (bash expands nothing between single quotes)"
            if "Cuda is not available" in error["error"]:
                said += " (the job asks for no GPU, so torchrun counts none for --nproc-per-node=gpu)"
                fix, token = NPROC_FIX
            elif "endpoint" in error["error"] or error["what"] == "rdzv_error":
                fix, token = ENDPOINT_FIX
        elif len(self.launches) < len(self.agents):
            said, quote = "torchrun stopped at its arguments", self.said(r"^torchrun: error", r"Error: ")
            if comment := comment_in_command(self.script):
                said, quote = f"{said}{quote}: {comment}", ""
                fix = "Fix: the comment above or below the command, not between its lines."
        for launch in self.launches.values():
            if said:
                break
            if launch["nproc"] != self.spec.procs_per_node:
                said = (f"torchrun started {launch['nproc']} training process(es) on {NODE_NAMES[launch['node']]}, "
                        f"not the {self.spec.procs_per_node} the exercise asks for")
                fix, token = NPROC_FIX
            elif str(launch["script"]).split(":")[0] in NODE_NAMES:  # the node list's names, split into words
                said = (f"torchrun ran {show(launch['script'])}, a node's name, as the training: the endpoint became "
                        "every node's name, which bash split into words")
                fix, token = ENDPOINT_FIX
            elif not launch["module"] or launch["script"] != "workshop_utils.train" or launch["run_path"]:
                said = f"torchrun ran {show(launch['script'])}, not the training (-m workshop_utils.train)"
                quote = self.said(r"^(ModuleNotFoundError|FileNotFoundError|.*No module named|.*can't open file)")
            elif launch["port"] == 0 and not launch["implicit"]:
                said = f"port 0 (in job {self.o.run.job_id}) is no port the other nodes' agents can know"
                fix, token = ENDPOINT_FIX
        if said:
            return f"{self.where}the launch {self.launch(token)} ran wrong: {said}{quote}. {fix}"
        return self.rendezvous()

    def rendezvous(self) -> str | None:
        """The agents met once, all of them, at the first node."""
        joins, done = self.o.of("rdzv_join"), self.o.of("rdzv_done")
        everyone = next((d for d in done if len(d["nodes"]) == self.nodes), None)
        if everyone and everyone["store"][0] == 0:
            return None
        if everyone:  # torchrun meets there; the exercise asks for the node the batch shell runs on
            return (f"{self.where}the launch {self.launch('--rdzv-endpoint')} ran wrong: the torchrun agents met at "
                    f"{NODE_NAMES[everyone['store'][0]]}, a node of the job but not its first, where the batch "
                    f"shell runs and the exercise asks them to meet. Fix: {RDZV_FIX}.")
        left = ", ".join(NODE_NAMES[k] for k in range(self.nodes) if not done or k not in done[0]["nodes"])
        met = f"met, but {left} was left out of the rendezvous" if done else "never completed the rendezvous"
        waited = "; ".join(f"{NODE_NAMES[j['node']]} at {j['host']}:{j['port']} ({j['backend']}, --nnodes "
                           f"{j['min']}{'' if j['min'] == j['max'] else ':' + str(j['max'])}"
                           + (f", --node-rank {j['node_rank']}" if j["node_rank"] is not None else "")
                           + f", id {show(j['store'][2], 20)})" for j in joins)
        checked = (('--nnodes="$SLURM_JOB_NUM_NODES"', any((j["min"], j["max"]) != (self.nodes,) * 2 for j in joins)),
                   ("--rdzv-backend=c10d", any(j["backend"] != "c10d" for j in joins)),
                   ('--rdzv-id="$SLURM_JOB_ID"', len({j["store"][2] for j in joins}) > 1),
                   (RDZV_FIX, len({(j["target"], j["port"]) for j in joins}) != 1 or joins[0]["target"] != 0))
        fixes = [fix for fix, off in checked if off] or [fix for fix, _ in checked]  # what the joins show off, or all
        return (f"{self.where}the launch {self.launch('--nnodes')} ran wrong: the torchrun agents {met} (they waited: "
                f"{waited or 'none joined'}). Fix: {', '.join(fixes[:-1])}{' and ' * (len(fixes) > 1)}{fixes[-1]}.")

    def training_setup(self) -> str | None:
        """The training processes: one world, one core and thread each, the script's arguments, their log."""
        spec, where = self.spec, self.where
        ended = self.ended_early()
        if ended or not self.trainings:
            return ended or f"{where}no training process started{self.said(r'Error|error|failed')}. Fix: {LAUNCH_FIX}."
        first, world = self.trainings[0], self.nodes * spec.procs_per_node
        cores, threads = int(first.get("jobsim_cpus") or 1), first.get("omp_num_threads")
        if any(t.get("world_size") != str(world) for t in self.trainings):
            return (f"{where}the training processes formed a world of {first.get('world_size')}, not {world}. "
                    f"Fix: {LAUNCH_FIX}.")
        asked = self.o.run.options.get("cpus-per-task")
        if threads == "1" and asked == str(cores) != str(spec.cores_per_task):  # the request, not the launch, is off
            return (f"{where}#SBATCH --cpus-per-task={asked}{line_of(self.script, '#SBATCH --cpus-per-task')} gives "
                    f"the launch's task {cores} core(s) for its {spec.procs_per_node} training processes (the launch "
                    f"{self.launch()}), where the exercise gives each process one core. Fix: #SBATCH --cpus-per-task, "
                    "one core for each training process.")
        if threads != "1" or cores != spec.cores_per_task:
            bare = ("" if (self.step.get("options") or {}).get("cpus-per-task") else ", srun starts torchrun without "
                    "--cpus-per-task: Slurm 22.05 to 23.02 then give its task one core")
            return (f"{where}OMP_NUM_THREADS={show(threads)} for {spec.procs_per_node} training processes on {cores} "
                    f"core(s) (the launch {self.launch()}{bare}), where the exercise gives each process one core and "
                    f"one thread. Fix: {CORES_FIX}.")
        args = first.get("args") or []
        if list(args) != list(TRAINING):
            gone = [w for w in TRAINING if w.startswith("--") and w not in args]
            got = (f"other arguments than the script was given ({show(' '.join(args), 70)}, without {' '.join(gone)})"
                   if args else "none of the script's arguments")
            return (f"the training got {got}: the launch does not pass \"$@\" on unchanged, or shift or set -- changed "
                    "them before it. Fix: \"$@\" at the end of the launch line, the arguments left as they are.")
        streams = [s for s in ("stdout", "stderr") if first.get(s) in ("closed", "/dev/null")]
        lost = [t["rank"] for t in self.trainings if f"rank {t['rank']} of" not in self.o.log]
        if streams or lost:
            how = f"its {streams[0]} is {first[streams[0]]}" if streams else f"rank {lost[0]}'s lines are missing"
            return (f"the training's output never reached the job's log ({how}). Fix: no redirection on the launch "
                    "line and no exec > ..., as in the template.")
        return None

    def ended_early(self) -> str | None:
        """A training process that ended before the warning: a failed start, a kill, a step's limit."""
        warned_at = next((e["t"] for e in self.o.events if e["what"] in ("warning", "time_limit")), 1e12)
        first = next((e for e in self.o.events if e["t"] < warned_at and (
            (e["what"] == "signal" and e["role"] == "training") or e["what"] == "training_failed" or
            (e["what"] == "step_end" and any(e["codes"])))), None)
        if first is None:
            return None
        local = next((x["local_addr"] for x in self.launches.values() if x.get("local_addr")), None)
        how = f" (--local-addr={local}: the ranks met at an address only its own node reaches)" if local else ""
        said = self.said(r"slurmstepd: error", r"DistNetworkError", r"Error: ", r"line \d+: ")
        if first["what"] == "signal" and not (how or said):  # no tool said why: a kill of the script's own
            saved = " and saved its checkpoint that early" if any(
                e["what"] == "checkpoint" and e["t"] < warned_at for e in self.o.events) else ": no checkpoint"
            return (f"{self.where}training ended before the warning came: {first['signal']} reached it "
                    f"{first['t']:g} s into the job, sent by the script itself, not by Slurm's warning{saved}. Fix: "
                    "signal the training only from the trap, when the warning comes: no kill, pkill or scancel of "
                    "your own before it.")
        return f"{self.where}training ended before the warning came{how}{said}: no checkpoint. Fix: {LAUNCH_FIX}."

    def warning_lost(self) -> str | None:
        """The warning reached every training process, and nothing else of the attendee's."""
        where, wanted = self.where, f"SIG{self.spec.warning}"
        first = next(iter(self.o.of("warning")), None)
        if first is None:
            return (f"{where}{self.end_of_batch()} before the warning came{self.said()}: the batch shell must wait "
                    f"while training runs. Fix: {WAIT_FIX}.")
        if not first["batch"] or first["signal"] != wanted:
            given = show(self.written.get("signal", self.o.run.options.get("signal")))
            how = (f"sends {first['signal']}" if first["batch"] else f"has no B:, so Slurm sends {first['signal']} to "
                   "the job's steps (torchrun, which it ends), not to the batch shell: the script's trap never fires")
            return (f"--signal={given} {how}; the trap and the training loop listen for {wanted}. Fix: "
                    f"--signal=B:{self.spec.warning}@N, N the seconds of warning.")
        end = next((k for k, e in enumerate(self.o.events) if e["what"] == "time_limit"), len(self.o.events))
        others = sorted((e for e in self.o.events[:end] if e["what"] == "signal" and e["role"] in ("torchrun",
                         "kernel")), key=lambda e: e["role"] != "kernel")
        sent = self.o.of("signalled")
        hit = {}
        for e in sent:
            hit.setdefault(NODE_NAMES[e["node"]], set()).update(e["hit"])
        by = (f"`{show(' '.join([sent[0]['program'], *sent[0]['argv'][1:]]), 80)}` sent {sent[0]['signal']} to "
              + ", ".join(f"{len(pids)} on {node}" for node, pids in hit.items())
              + (" only" if len(hit) < self.nodes else "") if sent else "")
        batch = next(iter(self.o.of("batch_start")), {}).get("pid")
        program = next((e["role"] for e in self.o.of("start") if e["pid"] == batch), None)
        if others and program:  # exec: the batch shell's process runs another program, and bash's trap is gone
            return (f"{where}`exec`{line_of(self.script, 'exec ')} replaced the batch shell with {program}, and its "
                    f"trap with it: the warning went to {program}, and it reached torchrun on "
                    f"{NODE_NAMES[others[0]['node']]}, which {others[0]['signal']} ends. Fix: no exec: "
                    f"{BACKGROUND_FIX}.")
        if others:
            other = "a Jupyter kernel" if others[0]["role"] == "kernel" else "torchrun itself"
            step = next((s for s in self.sruns if (s.get("options") or {}).get("signal")), None)
            # the signaller as it started (what it reports after signalling may come after the job's end)
            tool = next((e for e in self.o.of("start") if e["role"] in ("pkill", "killall", "scancel")), None)
            by = (f"srun --signal={step['options']['signal']} signals the step's tasks" if step else tool and
                  f"`{show(' '.join([tool['role'], *tool['argv'][1:]]), 80)}` signalled it" or by)
            return (f"{where}the warning reached {other} on {NODE_NAMES[others[0]['node']]}, which "
                    f"{others[0]['signal']} ends{' (' + by + ')' if by else ''}: only the training processes may get "
                    f"it. Fix: {FORWARD_FIX}.")
        warned = {e["pid"] for e in self.o.of("signal", role="training", signal=wanted)}
        if len(warned) < len(self.trainings):
            takes = first.get("batch_takes")
            busy = _said(self.o.log, r"step creation temporarily disabled")
            names = " and ".join(sorted({"`" + show(re.sub(r"^\S*/", "", t.get("cmdline") or ""), 50) + "`" for t in
                                         self.trainings}))
            by = by and f"{by}; the training processes run as {names}"
            idle, fix = self._idle(first)
            why = ("nothing in the script traps it (or the trap is reset to the default action), so it ended the "
                   "batch shell" if takes == "default" else
                   f"the batch shell ignores {wanted}" if takes == "ignored" else
                   f"the trap's srun waited for the launch's cores: {busy}" if busy else by or idle or
                   _said(self.o.log, r"line \d+: ", r"^(pkill|killall|pgrep|srun|scancel|kill): ") or
                   "the trap signalled none of them")
            return (f"{where}the warning reached {len(warned)} of {len(self.trainings)} training processes ({why}). "
                    f"Fix: {fix if why == idle else FORWARD_FIX}.")
        return self.checkpoint_lost()

    def _idle(self, first: dict) -> tuple[str, str]:
        """Nothing ran after the warning: what the batch shell ran when it came, and the fix. bash runs a trap only
        once the command in the foreground has ended, or when the warning interrupts its wait."""
        until = next(iter(self.o.of("time_limit")), {})
        started = [e for e in self.o.of("start") if first["t"] <= e["t"] < until.get("t", 1e12)]
        running = [r for r in first.get("running") or [] if r.get("role") != "kernel"]
        if not running or started or until.get("log_size") != first.get("log_size"):
            return "", FORWARD_FIX
        pid, command = running[-1]["pid"], self.at(running[-1]["command"])
        background = {s["pid"]: s.get("background") for s in self.o.of("start")}
        if all(background.get(r["pid"]) for r in running):
            return (f"after the warning nothing in the job ran: the trap does nothing ({command} ran in the "
                    "background)", FORWARD_FIX)
        launch = background.get(pid) is False and pid in {a[k] for a in self.agents for k in ("pid", "ppid")}
        return ("after the warning nothing in the job ran: the trap does nothing, or bash had not run it yet (it runs "
                f"a trap only once the command in the foreground ends; the batch shell was running "
                f"{'the launch in the foreground, ' * launch}{command})", BACKGROUND_FIX if launch else FORWARD_FIX)

    def checkpoint_lost(self) -> str | None:
        """Every checkpoint written, then the batch shell ended with status 0."""
        where, end = self.where, self.end
        if {e["pid"] for e in self.o.of("checkpoint")} != {t["pid"] for t in self.trainings}:
            status = end and (f"status {end['status']}" if end["signal"] is None else f"killed by {end['signal']}")
            how = (f"the batch shell ended after the warning, with {status}, while training was still writing it "
                   "(Slurm ends the job with the batch shell)" if end else
                   f"the time limit came first ({self.running()})")
            fix = WAIT_FIX
            if end and end["signal"] is None and _TEMPLATE_WAIT.search(self.script):
                # the template's loop, right after the launch, waits on: what ended bash ran in the trap
                traps = [line.strip() for line in self.script.split("\n") if re.match(r"\s*trap\s", line)]
                how += ("; the loop after the launch is the template's, so the trap ended it" + (
                    f": `{show(traps[0], 60)}`{line_of(self.script, traps[0])}" if len(traps) == 1 else ""))
                fix = ("a trap that passes the warning on and returns: no exit in it or in what it calls, nothing "
                       "it starts in the background (&)")
            return f"{where}no checkpoint: {how}{self.said()}. Fix: {fix}."
        if end is None or self.o.of("time_limit"):
            return f"{where}training ended (every checkpoint written), but {self.loop_never_ends()}"
        if end["status"] != 0:
            return (f"{where}training ended well, but the batch shell then ended with status {end['status']}"
                    f"{self.said()}: Slurm would record the job as FAILED. Fix: {WAIT_FIX}.")
        return None

    def failed_run(self) -> str | None:
        """Where training fails at its start, the batch shell must end too, not wait or spin until the limit."""
        return None if self.end else f"when training fails (a rank exits with an error), {self.loop_never_ends()}"

    def loop_never_ends(self) -> str:
        how = "spun in a loop" if self.o.reason == "spinning" else "waited until the job's time limit"
        return (f"the job's wait loop never ends: the batch shell {how} ({self.running()}){self.said()}. "
                f"Fix: {WAIT_FIX}.")


def behaviour_problem(script: str, read: dict, written: dict, spec: JobSpec) -> str | None:
    """The first mistake a run of the script shows, as "problem. Fix: ..."; None when every run went right."""
    # The simulated job's nodes, which its refusals quote, written into the script: they would pass every run here,
    # and fail the next job, which gets other nodes.
    names = (*NODE_NAMES, *(f"10.1.0.{name[-2:]}" for name in NODE_NAMES))
    for number, line in enumerate(script.split("\n"), 1):
        code = re.sub(r"(^|\s)#(?!SBATCH).*", "", line)
        name = next((n for n in names if re.search(rf"(?<![\w.-]){re.escape(n)}(?![\w-]|\.\d)", code)), None)
        if name:
            fix = RDZV_FIX if "--rdzv-endpoint" in code else "the job's nodes as Slurm gives them when the job runs"
            return (f"line {number} names {name}, a node of this check's simulated job, not one read from the job when "
                    f"it runs: the next job gets other nodes. Fix: {fix}.")
    warning = slurm_signal(read.get("signal"))
    limit = int(time_limit_s(read["time"]))
    sent = warning and (warning.signal, warning.lead_s, warning.to_batch_shell)
    # Job ids any cluster gives: one where % 1000 gives 0; one where % 40000 or % 50000 pass 65535 above 29500 and
    # whose last three digits bash reads as octal (089: "value too great for base"); one shorter than three digits,
    # as on a new cluster. bash's $RANDOM fixed at 846 (below 1024, where only root may listen), at 32611 (near its
    # largest), at 0: any job may draw each.
    runs = [JobRun(read, limit, sent, nodes=1, job_id=FIRST_JOB, python="python3", random=846),
            JobRun(read, limit, sent, nodes=2, job_id=199089, python="python3.11", random=32611),
            JobRun(read, limit, sent, nodes=1, job_id=7, random=0, fail=True)]
    for run in runs:
        judge = Judge(script, simulate(script, run), spec, written)
        kinds = (judge.stopped, judge.never_launched, judge.wrong_launch, judge.failed_run) if run.fail else (
            judge.stopped, judge.never_launched, judge.wrong_launch, judge.training_setup, judge.warning_lost)
        problem = next(filter(None, (kind() for kind in kinds)), None)
        if problem:
            unknown = _said(judge.o.log, r"this simulat|the check's simulated job")  # a stand-in's limit, not bash's
            return problem + (f" Note: the job's log says {unknown}: the check's simulated job could not follow that "
                              "command, so a real job may have gone otherwise; with the commands of the template the "
                              "check can judge." if unknown else "")
    return None
