"""Notebook 06's lesson: each step run live against Slurm and recorded, or replayed from a recorded run.

``SlurmLesson`` runs every step of notebook 06 (look at the cluster, submit, watch, gather, pre-empt) and
records what it printed and returned into ``<run>/results/slurm/steps.json``; where no Slurm answers, it
replays the steps of a recorded run instead (``results/reference/slurm/``), saying so. ``JobWatcher`` keeps
what the scheduler did for the timeline figure. The Slurm clients themselves are in ``slurm_jobs``.
"""

from __future__ import annotations

import atexit
import contextlib
import io
import json
import os
import shlex
import sys
import threading
import time
from pathlib import Path

from ..system.errors import WorkshopError
from ..system.results import repo_root, write_atomically, write_json
from .slurm_jobs import (
    FINISHED, POLL_S, SCRIPT_FIELDS, binding_table, cancel, compare_final_parameters, config_flags, find_slurm,
    frame_of, give_up, job_env, job_finished, job_records, job_table, job_usage, node_table, partition_table,
    run_folder, slurm, squeue_text, submit, template, varying_fields, wait_for,
)


# ---------------------------------------------------------------------------------------------- the timeline


class JobWatcher:
    """Polls squeue in the background and keeps every state change of the jobs it is told about, with the time
    it saw it: what the scheduler did, for the timeline figure."""

    def __init__(self, interval_s: float = 1.0):
        self.interval_s = interval_s
        self.t0 = time.monotonic()
        self.ids: list[str] = []
        self.names: dict[str, str] = {}
        self.changes: list[dict] = []  # {"t": s, "job": label, "state": ...}
        self.events: list[dict] = []  # {"t": s, "what": "..."}: things the notebook did (a signal sent)
        self._last: dict[str, str] = {}
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def now(self) -> float:
        return round(time.monotonic() - self.t0, 2)

    def watch(self, job_id: str) -> None:
        with self._lock:
            self.ids.append(str(job_id))
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="slurm-job-watcher", daemon=True)
            self._thread.start()
        self.poll()

    def event(self, what: str) -> None:
        with self._lock:
            self.events.append({"t": self.now(), "what": what})

    def poll(self) -> None:
        with self._lock:
            ids = list(self.ids)
        if not ids:
            return
        try:
            proc = slurm("squeue", "-h", "-r", "-t", "all", "-j", ",".join(ids), "-o", "%i|%j|%T", check=False,
                         timeout_s=10)
        except WorkshopError:
            return  # one missed poll leaves a coarser timeline, nothing worse
        t = self.now()
        with self._lock:
            for line in proc.stdout.splitlines():
                parts = line.strip().split("|")
                if len(parts) != 3 or "[" in parts[0]:
                    continue  # a pending array's not-yet-split tasks ("12_[1-2]"), shown once they are split
                label, name, state = parts
                self.names[label] = name
                if self._last.get(label) != state:
                    self._last[label] = state
                    self.changes.append({"t": t, "job": label, "state": state})
            # A job that has ended is asked about no more: slurmctld forgets it after MinJobAge, and squeue
            # then refuses the whole list.
            for job_id in ids:
                states = [v for k, v in self._last.items() if k.split("_")[0] == job_id]
                if states and all(v in FINISHED for v in states) and job_id in self.ids:
                    self.ids.remove(job_id)

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.poll()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=15)
        self.poll()

    def segments(self):
        """Each job's states as [start, end) intervals in seconds since the watcher started."""
        end = self.now()
        rows = []
        with self._lock:
            by_job: dict[str, list[dict]] = {}
            for change in self.changes:
                by_job.setdefault(change["job"], []).append(change)
            for job, changes in by_job.items():
                for here, after in zip(changes, [*changes[1:], None]):
                    if here["state"] in FINISHED:
                        continue
                    rows.append({"job": job, "name": self.names.get(job, ""), "state": here["state"],
                                 "start_s": here["t"], "end_s": after["t"] if after else end})
        return frame_of(rows, ["job", "name", "state", "start_s", "end_s"])


def plot_job_timeline(segments, events=(), title: str = "What the scheduler did"):
    """One bar per job: waiting (pending) in grey, running in colour; the notebook's own actions as lines."""
    import matplotlib.pyplot as plt

    jobs = list(dict.fromkeys(segments["job"])) if len(segments) else []
    fig, ax = plt.subplots(figsize=(10, 0.45 * max(len(jobs), 3) + 1.3))
    colours = {"PENDING": "#c8c8c8", "RUNNING": "#2b7bba", "COMPLETING": "#8fbfe0", "REQUEUED": "#e08f3a",
               "SUSPENDED": "#e0c03a"}
    for y, job in enumerate(jobs):
        for row in segments[segments["job"] == job].itertuples():
            ax.barh(y, row.end_s - row.start_s, left=row.start_s, color=colours.get(row.state, "#999999"),
                    edgecolor="white", height=0.7)
    names = dict(zip(segments["job"], segments["name"])) if len(segments) else {}
    ax.set_yticks(range(len(jobs)), [f"{job} {names.get(job, '')}" for job in jobs])
    ax.invert_yaxis()
    for event in events:
        ax.axvline(event["t"], color="#c0392b", lw=1, ls="--")
        ax.text(event["t"], 0.99, f" {event['what']}", color="#c0392b", fontsize=8, va="top",
                transform=ax.get_xaxis_transform())
    handles = [plt.Rectangle((0, 0), 1, 1, color=colours[s]) for s in ("PENDING", "RUNNING")]
    ax.legend(handles, ["pending (queued, waiting)", "running"], loc="upper left", bbox_to_anchor=(1.01, 1.0),
              fontsize=8, frameon=False)
    ax.set_xlabel("seconds since the first submission")
    ax.set_title(title)
    ax.grid(axis="x", alpha=0.3)
    fig.tight_layout()
    return fig


# ---------------------------------------------------------------------------------------------- the lesson


class _Tee(io.TextIOBase):
    """Print to the notebook and keep a copy: what a live step printed is what a replay shows."""

    def __init__(self, out):
        self.out, self.kept = out, []

    def write(self, text):
        self.kept.append(text)
        return self.out.write(text)

    def flush(self):
        self.out.flush()


def _encode(value):
    import pandas as pd

    if isinstance(value, pd.DataFrame):
        return {"__frame__": json.loads(value.to_json(orient="split", index=False)), "attrs": dict(value.attrs)}
    if isinstance(value, dict):
        return {k: _encode(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_encode(v) for v in value]
    return value


def _decode(value):
    import pandas as pd

    if isinstance(value, dict) and "__frame__" in value:
        split = value["__frame__"]
        frame = pd.DataFrame(split["data"], columns=split["columns"])
        frame.attrs.update(value.get("attrs", {}))
        return frame
    if isinstance(value, dict):
        return {k: _decode(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_decode(v) for v in value]
    return value


def reference_folder() -> Path | None:
    root = repo_root()
    return root / "results" / "reference" / "slurm" if root is not None else None


_SUBMITTED: list[str] = []  # every job this kernel submitted: cancelled, if still queued or running, at exit


@atexit.register
def _cancel_leftovers() -> None:
    with contextlib.suppress(Exception):
        live = [j for j in _SUBMITTED if (r := job_records(j)) and not job_finished(r)]
        cancel(live)


class SlurmLesson:
    """Notebook 06's steps: run live where Slurm answers, else replayed from a recorded run.

    Every public method is one step. Live, it runs, prints as it goes, and is recorded (what it printed,
    what it returned) in ``<run_dir>/results/slurm/steps.json``. Without Slurm, it prints the recorded
    output instead, marked as such, and returns the recorded value, so the notebook's later cells work
    on the reference run's jobs.
    """

    def __init__(self, run_dir, timeout_s: float = 240, reference: str | os.PathLike | None = None):
        self.run_dir = Path(run_dir)
        self.timeout_s = timeout_s
        self.site = find_slurm()
        self.live = self.site.available
        self.folder = self.run_dir / "results" / "slurm"
        self.jobs_dir = self.run_dir / "slurm-jobs"
        self.steps: list[dict] = []
        self.outputs: dict[str, Path] = {}  # job id -> its output file (arrays: the first task's)
        self._read_upto: dict[str, tuple[int, str]] = {}  # job id -> (bytes of its output read, unfinished line)
        self._said_cd = False
        self.watcher = JobWatcher() if self.live else None
        if self.live:
            from ..system.hardware import environment

            self.jobs_dir.mkdir(parents=True, exist_ok=True)
            self.about = {"site": self.site.line, "version": self.site.version, "cluster": self.site.cluster,
                          "nodes": "", "environment": environment("cpu")}
            print(self.site.line)
            return
        self.reference = Path(reference) if reference is not None else reference_folder()
        recorded = self.reference / "steps.json" if self.reference is not None else None
        if recorded is None or not recorded.is_file():
            raise WorkshopError(f"{self.site.line}, and no recorded run to show instead ({recorded} is missing).",
                                "run this notebook on a Slurm login node, or restore results/reference/slurm/.")
        saved = json.loads(recorded.read_text())
        self.recorded, self.about = saved["steps"], saved["about"]
        print(f"{self.site.line}: showing the run recorded on {self.about['where']}")

    # -- recording and replaying

    def _step(self, kind: str, run):
        index = len(self.steps)
        if not self.live:
            if index >= len(self.recorded) or self.recorded[index]["kind"] != kind:
                raise WorkshopError(f"The recorded run has no step {index} of kind {kind!r}: it was recorded by "
                                    "another version of this notebook.",
                                    "record it again (tests/test_notebook_06.py explains how).")
            step = self.recorded[index]
            self.steps.append(step)
            if step["printed"]:
                print("[recorded] " + step["printed"].rstrip("\n").replace("\n", "\n[recorded] "))
            return _decode(step["value"])
        tee = _Tee(sys.stdout)
        started = time.monotonic()
        with contextlib.redirect_stdout(tee):
            value = run()
        self.steps.append({"kind": kind, "printed": "".join(tee.kept), "value": _encode(value),
                           "seconds": round(time.monotonic() - started, 2)})
        self.save()
        return value

    def save(self) -> Path:
        env = self.about["environment"]
        self.about["where"] = (f"{self.about['version'] or 'Slurm'}, cluster {self.about['cluster'] or '?'} "
                               f"({self.about['nodes'] or 'nodes not listed'}); jobs submitted {env['date']} from "
                               f"{env['hostname']} ({env['cpu_cores']} CPU cores, {env['device_name']}).")
        return write_json({"about": self.about, "steps": self.steps}, self.folder / "steps.json")

    # -- the cluster

    def cluster(self) -> dict:
        """sinfo as a user sees it, then partitions and nodes as tables (scontrol)."""
        def run():
            print("$ sinfo\n" + slurm("sinfo").stdout.rstrip())
            nodes = node_table()
            first = nodes["node"].iloc[0] if len(nodes) else ""
            if first:
                print(f"\n$ scontrol show node {first}\n" + slurm("scontrol", "show", "node", first).stdout.rstrip())
            self.about["nodes"] = f"{len(nodes)} node(s): " + "; ".join(
                f"{n.node} {n.cpus} CPUs, GRES {n.gres}" for n in nodes.itertuples())
            return {"partitions": partition_table(), "nodes": nodes}
        return self._step("cluster", run)

    # -- submitting

    def submit(self, script: str, config=None, args=(), options=(), *, cpus_per_task: int = 1,
               time_limit: str = "00:10:00") -> str:
        """sbatch one of the kit's job scripts, the training flags generated from ``config``; returns the job id."""
        def run():
            flags = (config_flags(config) if config is not None else []) + [str(a) for a in args]
            return self._sbatch(template(script), flags, [f"--cpus-per-task={cpus_per_task}",
                                                          f"--time={time_limit}", *options])
        return self._step("submit", run)

    def _cd(self) -> None:
        """Submit from the jobs' folder: relative paths (the output file, a sweep file) are relative to it, in
        the job too (its working directory is where it was submitted). Said once, the first time."""
        if not self._said_cd:
            print(f"$ cd {self.jobs_dir}   (the jobs' output files and run folders go here)")
            self._said_cd = True

    def _sbatch(self, script: Path, flags, options, output_name: str = "%x-%j.out") -> str:
        self._cd()
        options = [f"--output={output_name}", *options]
        print("$ " + shlex.join(["sbatch", "--parsable", *options, str(script), *flags]))
        job_id = submit(script, flags, options, cwd=self.jobs_dir, env=job_env(self.jobs_dir))
        self._submitted(job_id)
        records = job_records(job_id)
        name = records[0].get("JobName", "") if records else ""
        self.outputs[job_id] = self.jobs_dir / (output_name.replace("%x", name).replace("%j", job_id)
                                                .replace("%A", job_id).replace("%a", "0"))
        return job_id

    def _submitted(self, job_id: str) -> None:
        _SUBMITTED.append(job_id)
        self.watcher.watch(job_id)
        print(job_id)

    def submit_array(self, configs: list, script: str = "train_array.sbatch", *, max_running: int | None = None,
                     cpus_per_task: int = 1, time_limit: str = "00:10:00") -> str:
        """One job array, one task per config: the fields that differ between the configs go into a sweep file,
        one line per task; the flags they share follow the script name."""
        def run():
            swept = varying_fields(configs)
            if not swept or any(name in SCRIPT_FIELDS for name in swept):
                raise WorkshopError(f"The configs of a sweep must differ in a training setting (they differ in "
                                    f"{list(swept) or 'nothing'}).", "vary e.g. lr: [config.replace(lr=x) for x in ...].")
            # A new file for every sweep: the tasks of an earlier array may not have read theirs yet.
            sweep = fresh_file(self.jobs_dir, f"sweep-{'-'.join(swept)}", ".txt")
            lines = [shlex.join(config_flags(c, only=swept)) for c in configs]
            write_atomically(sweep, lambda tmp: tmp.write_text("\n".join(lines) + "\n"), "Sweep file")
            self._cd()
            print(f"$ cat {sweep.name}\n" + "\n".join(lines))
            array = f"--array=0-{len(configs) - 1}" + (f"%{max_running}" if max_running else "")
            shared = config_flags(configs[0], skip=(*SCRIPT_FIELDS, *swept))
            return self._sbatch(template(script), [sweep.name, *shared],
                                [array, f"--cpus-per-task={cpus_per_task}", f"--time={time_limit}"],
                                output_name="%x-%A_%a.out")
        return self._step("submit_array", run)

    def submit_after(self, job_id: str, command: str, *, name: str = "wu-after", time_limit: str = "00:05:00") -> str:
        """sbatch ``--dependency=afterok:JOB --wrap COMMAND``: runs only once every task of JOB has succeeded."""
        def run():
            self._cd()
            options = [f"--job-name={name}", f"--dependency=afterok:{job_id}", "--cpus-per-task=1",
                       f"--time={time_limit}", "--output=%x-%j.out", f"--wrap={command}"]
            print("$ " + " ".join(["sbatch", "--parsable", *map(_shown_option, options)]))
            new = submit(None, options=options, cwd=self.jobs_dir, env=job_env(self.jobs_dir))
            self._submitted(new)
            self.outputs[new] = self.jobs_dir / f"{name}-{new}.out"
            return new
        return self._step("submit_after", run)

    def gather_command(self, array_id: str) -> str:
        """The shell command the dependent job runs: gather the array's results into one CSV (paths relative to
        the folder the jobs are submitted from)."""
        folder = self.sweep_folder(array_id).name
        code = "import sys, workshop_utils as wu; print(wu.gather_array(*sys.argv[1:]).to_string(index=False))"
        return shlex.join(["python", "-c", code, folder, f"{folder}/sweep.csv"])

    def sweep_folder(self, array_id: str) -> Path:
        return self.jobs_dir / f"wu-sweep-{array_id}"

    # -- watching

    def squeue(self, job_ids) -> None:
        """squeue, now: where each job is (PENDING with its reason, RUNNING on which node)."""
        def run():
            print(f"$ squeue -r -j {','.join(job_ids)}\n" + squeue_text(job_ids))
        self._step("squeue", run)

    def follow(self, job_id: str, *, until: str | None = None, restarts: int = 0, tail: int | None = None) -> dict:
        """Print the job's output file as it grows, and each change of its state, until it ends (a COMPLETED
        job counts after ``restarts`` requeues) or a line holds ``until``. ``tail``: show only the last lines."""
        def run():
            return self._follow(job_id, until, restarts, tail)
        return self._step("follow", run)

    def _follow(self, job_id: str, until: str | None, restarts: int, tail: int | None) -> dict:
        path = self.outputs[job_id]
        # A second follow of the same job goes on from where the first one stopped reading.
        offset, partial = self._read_upto.get(job_id, (0, ""))
        lines, shown_state = [], None
        started = time.monotonic()
        deadline = started + self.timeout_s
        next_poll = 0.0
        records: list[dict] = []
        print(f"$ tail -f {path.name}   (and the job's state, polled every {POLL_S:g} s)")

        def say(text):
            print(f"[{time.monotonic() - started:5.1f} s] {text}", flush=True)

        while True:
            if path.exists():
                with open(path, "rb") as f:
                    f.seek(offset)
                    chunk = f.read()
                offset += len(chunk)
                partial += chunk.decode(errors="replace")
                *complete, partial = partial.split("\n")
                for i, line in enumerate(complete):
                    lines.append(line)
                    if tail is None:
                        say(f"| {line}")
                    if until is not None and until in line:
                        self._read_upto[job_id] = (offset, "\n".join([*complete[i + 1:], partial]))
                        return {"job": job_id, "lines": lines, "state": shown_state, "stopped_at": line}
            now = time.monotonic()
            if now >= next_poll:
                next_poll = now + POLL_S
                records = job_records(job_id)
                state = ",".join(sorted({r.get("JobState", "?") for r in records})) or "gone"
                if state != shown_state:
                    restarted = max((int(r.get("Restarts", 0) or 0) for r in records), default=0)
                    where = records[0].get("NodeList") if records and "RUNNING" in state else ""
                    reason = records[0].get("Reason") if records and "PENDING" in state else ""
                    say(f"job {job_id}: {state}" + (f" on {where}" if where else "") +
                        (f" ({reason})" if reason and reason != "None" else "") +
                        (f", restarts {restarted}" if restarted else ""))
                    shown_state = state
                if not records or job_finished(records, restarts):
                    break
            if now > deadline:
                give_up([job_id], self.timeout_s)
            time.sleep(0.1)
        # The last lines may land after the state changed: read the file to its end once more.
        time.sleep(0.3)
        if path.exists():
            tail_bytes = path.read_bytes()[offset:]
            rest = partial + tail_bytes.decode(errors="replace")
            self._read_upto[job_id] = (offset + len(tail_bytes), "")
            for line in [line for line in rest.split("\n") if line]:
                lines.append(line)
                if tail is None:
                    say(f"| {line}")
        if tail is not None:
            print(f"... the last {min(tail, len(lines))} of {len(lines)} lines:")
            for line in lines[-tail:]:
                print(f"| {line}")
        final = records[0] if records else {}
        return {"job": job_id, "lines": lines, "state": final.get("JobState"), "exit_code": final.get("ExitCode"),
                "restarts": int(final.get("Restarts", 0) or 0)}

    def wait(self, job_ids) -> "object":
        """Wait for the jobs to end; their table (state, exit code, elapsed), from sacct or scontrol."""
        def run():
            table = wait_for(job_ids, self.timeout_s)
            print(f"$ {self._table_command(job_ids, table.attrs['source'])}")
            return table
        return self._step("wait", run)

    def jobs(self, job_ids) -> "object":
        """The table of jobs now (state, exit code, elapsed, restarts), without waiting."""
        def run():
            table = job_table(job_ids)
            print(f"$ {self._table_command(job_ids, table.attrs['source'])}")
            return table
        return self._step("jobs", run)

    @staticmethod
    def _table_command(job_ids, source: str) -> str:
        ids = ",".join(map(str, job_ids))
        if source == "sacct":
            return f"sacct -X -j {ids} -o JobID,JobName,State,ExitCode,Elapsed,Start,End,NodeList"
        return (f"scontrol -o show job {ids}   (sacct has nothing to say here: this cluster keeps no "
                "accounting, so the same columns come from slurmctld's memory)")

    def usage(self, job_id: str) -> dict:
        """What a finished job asked for and used (``job_usage``): the input of the efficiency questions."""
        def run():
            usage = job_usage(job_id, self.jobs_dir)
            if usage["source"] == "sacct":
                print(f"$ sacct -j {job_id} -o JobID,Elapsed,TotalCPU,AllocCPUS,MaxRSS,AllocTRES")
            else:
                print(f"$ scontrol -o show job {job_id}   (and {self.jobs_dir.name}/<its run folder>/result.json: "
                      "this cluster keeps no accounting)")
            print(", ".join(f"{key} {value:g}" if isinstance(value, float) else f"{key} {value}"
                            for key, value in usage.items() if key != "source"))
            return usage
        return self._step("usage", run)

    def signal(self, job_id: str, signal_name: str = "USR1") -> None:
        """``scancel --batch --signal=USR1 JOB``: what Slurm sends before a time limit, sent now."""
        def run():
            command = ["scancel", "--batch", f"--signal={signal_name}", str(job_id)]
            print("$ " + shlex.join(command))
            slurm(*command)
            self.watcher.event(f"scancel --signal={signal_name}")
        self._step("signal", run)

    # -- results

    def bindings(self, job_id: str) -> "object":
        """The env-check job's per-task lines as a table."""
        def run():
            return binding_table(self._output_lines(job_id))
        return self._step("bindings", run)

    def _output_lines(self, job_id: str) -> list[str]:
        path = self.outputs[job_id]
        return path.read_text(errors="replace").splitlines() if path.exists() else []

    def sweep(self, array_id: str, after_id: str) -> "object":
        """The sweep's table, as the dependent job gathered it (its CSV), read into pandas."""
        def run():
            import pandas as pd

            csv = self.sweep_folder(array_id) / "sweep.csv"
            if not csv.is_file():
                raise WorkshopError(f"Job {after_id} did not write {csv}.", "read its output file for the error.")
            print(f"read {csv.relative_to(self.run_dir)}, written by job {after_id}")
            return pd.read_csv(csv)
        return self._step("sweep", run)

    def compare(self, reference_job: str, preempted_job: str) -> dict:
        """The uninterrupted and the preempted-then-resumed run side by side, final parameters compared."""
        def run():
            result = compare_final_parameters(run_folder(self.jobs_dir, reference_job),
                                              run_folder(self.jobs_dir, preempted_job))
            import pandas as pd

            result["table"] = pd.DataFrame(result.pop("rows")).astype({"resumed_from_step": "Int64"})
            return result
        return self._step("compare", run)

    def timeline(self) -> dict:
        """Every state the watcher saw, as intervals, with the notebook's own actions (the signal)."""
        def run():
            self.watcher.stop()
            return {"segments": self.watcher.segments(), "events": list(self.watcher.events)}
        return self._step("timeline", run)

    @property
    def where(self) -> str:
        """Where the jobs ran: this cluster, or the recorded run's."""
        if self.live:
            return self.about.get("where") or self.site.line
        return self.about["where"]


def _shown_option(option: str) -> str:
    """An sbatch option as you would type it: ``--wrap="python -c '...'"`` rather than shlex's quoting of quotes."""
    name, eq, value = option.partition("=")
    if eq and name == "--wrap" and not set(value) & set('"$`\\!'):
        return f'{name}="{value}"'
    return shlex.quote(option)


def fresh_file(folder: Path, stem: str, suffix: str) -> Path:
    """``folder/stem.suffix``, or ``stem-2.suffix``, ... when taken."""
    path, n = Path(folder) / f"{stem}{suffix}", 1
    while path.exists():
        n += 1
        path = Path(folder) / f"{stem}-{n}{suffix}"
    return path
