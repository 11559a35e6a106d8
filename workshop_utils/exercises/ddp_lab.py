"""Notebook 02's DDP lab and Exercise 2.1, run as two nodes on this machine (two torchrun agents) so that a rank
from LOCAL_RANK or a world size from LOCAL_WORLD_SIZE fails; a probe in each rank records what the script did to
PyTorch. The code that branches on CUDA stays here: the GPU check's list of paths names it."""

from __future__ import annotations

import copy
import inspect
import json
import os
import runpy
import shlex
import shutil
import signal
import sys
import threading
import time
import traceback
from collections import Counter
from pathlib import Path
from unittest import mock

from ..parallel.failures import LOST_PEER, record_failure, record_failures
from ..parallel.launch import cpu_threads_per_process, free_port, job_env, stream
from ..system.errors import WorkshopError
from ..system.results import fresh_folder, write_json
from .ddp_efficiency import check_ddp_efficiency
from .ddp_lab_files import (GRADIENTS_EXERCISE, LAB_EXERCISE, STARTED, attendee_script, failed_run, first_to_stall,
                            lab_folder, limit_words, note_progress, read_output, reported_throughput, run_nodes,
                            scaled_limit, solution_text, solve_ddp_lab, start_ddp_lab, torchrun_agent,
                            watch_progress, what_ran)
from .ddp_lab_gradients import (COLLECTIVES, PER_NODE, SECOND_WORLD, compared, function_source, gradients_failure,
                                judge_comparison, placeholder_body, shipped_globals, wait_for_ranks, watched)
from .ddp_lab_judging import LabRun, findings, placeholders_left, sampler_mistake
from .ddp_lab_launch import example_line, read_launch_line
from .exercise_cells import NotYet, Unsolved, passed, require, require_answered
from .exercise_judging import checked, short

__all__ = [  # the lab's public names (wu's table, the GPU check, the tests)
    "LAB_EXERCISE", "LabRun", "attendee_script", "check_average_gradients", "check_ddp_efficiency", "check_ddp_lab",
    "judge_average_gradients", "lab_device", "lab_folder", "lab_nodes", "main", "placeholders_left",
    "read_launch_line", "run_single", "solution_text", "solve_ddp_lab", "start_ddp_lab",
]


def run_single(script, out_dir, threads: int | None = None, timeout_s: float = 300, echo: bool = True,
               args=()) -> float | None:
    """The samples/s ``python script --out-dir out_dir`` reported (None if none), run as a lab rank runs (a GPU
    process would be no baseline for CPU ranks)."""
    command = [sys.executable, str(script), *map(str, args), "--out-dir", str(out_dir)]
    if echo:
        print("$ python " + shlex.join(map(str, command[1:])), flush=True)
    ranks = sum(lab_nodes(2))
    env = job_env(threads or cpu_threads_per_process(ranks), hide_gpus=lab_device(ranks) == "cpu")
    codes, lines = stream({"": command}, env, timeout_s, echo)
    if codes[0]:
        raise WorkshopError(f"{Path(script).name} exited with status {codes[0]}: {(lines or ['(no output)'])[-1]}",
                            "read its output above.")
    return reported_throughput(lines)


def _backend_of(module) -> str:
    """The backend the DDP module's collectives run on (with no backend given, the config names one per device)."""
    import torch.distributed as dist

    kind = next((p.device.type for p in module.parameters()), "cpu")
    config = dict(pair.split(":", 1) for pair in dist.get_backend_config().split(",") if ":" in pair)
    return config.get(kind, dist.get_backend())


def lab_device(nproc: int) -> str:
    """NCCL needs a GPU per rank: "cuda" with that many GPUs, else "cpu" (gloo, GPUs hidden from the ranks)."""
    import torch

    return "cuda" if torch.cuda.is_available() and torch.cuda.device_count() >= nproc else "cpu"


def lab_nodes(nproc: int) -> tuple[int, ...]:
    """``nproc`` on node 0, one more on node 1: a world size typed in for ``nproc`` is wrong on every machine."""
    return nproc, 1


class Tee:
    """A text stream that also copies into a file (one rank's output, for the checker)."""

    def __init__(self, stream, path: Path):
        self._stream, self._file = stream, open(path, "a", buffering=1)

    def write(self, text):
        self._file.write(text)
        return self._stream.write(text)

    def flush(self):
        self._file.flush()
        self._stream.flush()

    def __getattr__(self, name):
        return getattr(self._stream, name)


class _ExitCalled(BaseException):
    """The script's os._exit(code), in its rank's main thread: ended as SystemExit(code) would end it."""

    def __init__(self, code: int) -> None:
        super().__init__(code)
        self.code = code


def _exit_as_a_process_would(rank_pid: int, real_exit=os._exit):
    """os._exit for the script's run. A rank forked from its agent (the CPU lab) tells torchrun that it ended by a
    value it returns: ended by os._exit(0), it returns none, and the agent waits for it until the check's limit,
    where torchrun running the script as a process of its own sees exit status 0 at once. So in the rank's main
    thread os._exit ends the script as SystemExit would (a `finally` of the script still runs); anywhere else (a
    forked DataLoader worker, a thread) it is the real one."""
    def exit_(code: int) -> None:
        if os.getpid() == rank_pid and threading.current_thread() is threading.main_thread():
            raise _ExitCalled(code)
        real_exit(code)
    return exit_


def _probe(folder: Path, script: str, args: list[str]) -> None:
    """Run ``script`` as ``__main__`` while recording what it does to PyTorch; write the record at the end."""
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel
    from torch.utils.data import DistributedSampler, dataloader

    rank = int(os.environ.get("RANK") or 0)
    sys.stdout = Tee(sys.stdout, folder / f"rank{rank}.stdout")
    sys.stderr = Tee(sys.stderr, folder / f"rank{rank}.stderr")
    env = {k: os.environ.get(k) for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK")}
    record = {"rank": rank, "env": env, "epochs": [], "ddp": 0, "samplers": [], "backend": None, "saves": [],
              "first_draw": None, "end": None, "torn_down": None, "error": None,
              "progress": {"what": "starting (before its first batch)", "time": time.time()}}
    optimizers, ddp_modules = [], []
    save = torch.save
    sampler_arguments = inspect.signature(DistributedSampler.__init__)

    def next_index(self, _original=dataloader._BaseDataLoaderIter._next_index):
        index, now = _original(self), time.time()
        if getattr(self, "_lab_probe_source", None) is not self._sampler_iter:  # a new epoch's sampler
            self._lab_probe_source = self._sampler_iter
            self._lab_probe_entry = {"dataset": id(self._dataset), "indices": [], "first": now, "draws": 0}
            record["epochs"].append(self._lab_probe_entry)
        entry = self._lab_probe_entry
        entry["indices"].extend(index if isinstance(index, list) else [index])
        record["first_draw"] = record["first_draw"] or now
        entry["last"], entry["draws"] = now, entry["draws"] + 1
        epoch = sum(e["dataset"] == entry["dataset"] for e in record["epochs"]) - 1
        record["progress"] = {"what": f"drew batch {entry['draws']} of epoch {epoch}", "time": now}
        return index

    def sampler_init(self, *a, _original=DistributedSampler.__init__, **k):
        given = sampler_arguments.bind(self, *a, **k).arguments  # recorded before the sampler may refuse them
        world, own = given.get("num_replicas"), given.get("rank")
        record["samplers"].append({"rank": dist.get_rank() if own is None and dist.is_initialized() else own,
                                   "num_replicas": dist.get_world_size() if world is None and dist.is_initialized()
                                   else world})
        _original(self, *a, **k)

    def ddp_init(self, module, *a, _original=DistributedDataParallel.__init__, **k):
        _original(self, module, *a, **k)
        record["ddp"] += 1
        record["backend"] = _backend_of(module) if dist.is_initialized() else None
        ddp_modules.append(self.module)

    def optimizer_init(self, *a, _original=torch.optim.Optimizer.__init__, **k):
        _original(self, *a, **k)
        optimizers.append(self)

    def recorded_save(obj, f, *a, **k):
        record["saves"].append(os.fspath(f) if isinstance(f, (str, os.PathLike)) else type(f).__name__)
        record["progress"] = {"what": "called torch.save", "time": time.time()}
        return save(obj, f, *a, **k)

    dataloader._BaseDataLoaderIter._next_index = next_index
    DistributedSampler.__init__ = sampler_init
    DistributedDataParallel.__init__ = ddp_init
    torch.optim.Optimizer.__init__ = optimizer_init
    torch.save = recorded_save
    lock = threading.Lock()
    threading.Thread(target=watch_progress, args=(folder, rank, record, lock), daemon=True).start()

    sys.argv = [script, *args]
    sys.path.insert(0, str(Path(script).resolve().parent))  # as `python script` would
    code = 0
    try:
        with mock.patch.object(os, "_exit", _exit_as_a_process_would(os.getpid())):
            runpy.run_path(script, run_name="__main__")
    except (SystemExit, _ExitCalled) as stop:
        code = stop.code if isinstance(stop.code, int) else (0 if stop.code is None else 1)
        if code:
            record["error"] = f"{'SystemExit' if isinstance(stop, SystemExit) else 'os._exit'}: {stop.code}"
            record_failure(stop)
    except BaseException as err:  # noqa: BLE001 - recorded, shown as the script's own traceback, then exit 1
        record["error"] = f"{type(err).__name__}: {err}"
        frames = err.__traceback__  # from the script's first frame on
        while frames is not None and Path(frames.tb_frame.f_code.co_filename).resolve() != Path(script).resolve():
            frames = frames.tb_next
        record_failure(err.with_traceback(frames or err.__traceback__))
        if LOST_PEER.search(str(err)):  # a consequence of another rank's failure
            # one write: a rank forked from its agent shares the agent's stderr, and print's separate "\n" could
            # land after the agent's own line
            sys.stderr.write(f"rank {rank} stopped: it lost its connection to a rank that failed "
                             f"({type(err).__name__})\n")
        else:  # the script's frames and PyTorch's, not the probe's
            shown = [f for f in traceback.extract_tb(err.__traceback__)
                     if Path(f.filename).resolve() != Path(__file__).resolve() and "runpy" not in f.filename]
            sys.stderr.write("".join(["Traceback (most recent call last):\n", *traceback.format_list(shown),
                                      *traceback.format_exception_only(type(err), err)]))
        code = 1
    with lock:
        record["end"] = time.time()
        note_progress(folder, rank, "finished" if not code else "failed", was=record["progress"])
    record["torn_down"] = not (dist.is_available() and dist.is_initialized())
    trained = {id(p): p for o in optimizers for g in o.param_groups for p in g["params"]} or \
        {id(p): p for m in ddp_modules for p in m.parameters()}
    save([p.detach().float().cpu().clone() for p in trained.values()], folder / f"rank{rank}-params.pt")
    write_json({k: v for k, v in record.items() if k != "progress"}, folder / f"rank{rank}.json")
    sys.stdout.flush()
    sys.stderr.flush()
    if not record["torn_down"]:
        dist.destroy_process_group()  # recorded above; closed here so that this process ends cleanly
    raise SystemExit(code)


def _crash(code: int, lines: list[str], folder: Path, per_node: tuple[int, ...], exercise: str) -> NotYet:
    """A failed run's one line: a rank stopped at the limit, a sampler given wrong counts, two ranks on one GPU
    (NCCL's abort may say nothing else), else the rank that failed first."""
    nproc = sum(per_node)
    stalled = sorted((json.loads(p.read_text()) for p in folder.glob("rank*.stalled")), key=lambda s: s["time"])
    if stalled:  # the first limit reached; the rank named is the one that stopped progressing first
        at = stalled[0]["time"]
        rank, since = first_to_stall(folder, nproc, at) or (stalled[0]["rank"], at - stalled[0]["idle_s"])
        own = next((s for s in stalled if s["rank"] == rank), stalled[0])
        return NotYet(f"✗ {exercise}: stopped at the time limit: rank {rank} was the first to make no progress, "
                      f"for {at - since:.0f} s, past the limit of {limit_words(own['limit_s'], own['startup_s'])}; "
                      f"where each rank was: {what_ran(folder, nproc, at)}.",
                      "find what that rank waits for after that point: a sleep or input(), a loop that never ends, "
                      "or a collective the other ranks never run (a barrier inside `if rank == 0:`).")
    mistake = sampler_mistake([json.loads(p.read_text()) for p in sorted(folder.glob("rank*.json"))], exercise)
    if mistake is not None:  # a sampler that refused what it was given: named by what it was given
        return mistake
    stderr = {rank: read_output(folder / f"rank{rank}.stderr") for rank in range(nproc)}
    if "Duplicate GPU detected" in "\n".join([*lines, *stderr.values()]):
        return NotYet(f"✗ {exercise}: two ranks use the same GPU.",
                      "give each rank its own: torch.device('cuda', local_rank) and torch.cuda.set_device(device).")
    return failed_run(exercise, code, lines, nproc, folder, stderr)


def _status(codes: list[int]) -> int:
    """The launch's exit status: a failing agent's, not that of the one the check stopped seconds after it."""
    return next((code for code in codes if code > 0), max(codes, key=abs))


class _LaunchHere:
    """``check_ddp_lab``'s default command: the checker writes the torchrun line itself."""

    def __repr__(self) -> str:
        return "LAUNCH_HERE"


LAUNCH_HERE = _LaunchHere()


def _lab_records(script: Path, workdir, nproc: int, command, timeout_s: float, echo: bool, args, exercise: str,
                 idle_limit_s: float | None = None):
    """One run under the probe: (records, parameters, out dir, folder, lines, seconds, processes per node)."""
    if command is LAUNCH_HERE:
        command = f"torchrun --nproc-per-node={nproc} {shlex.quote(str(script))}"
    launch = read_launch_line(command, script, nproc, exercise)
    given = command if isinstance(command, str) else shlex.join(map(str, command))
    folder, per_node = fresh_folder(workdir, "check"), lab_nodes(nproc)
    out_dir, ranks = folder / "out", sum(per_node)
    if echo:
        print(f"$ {' '.join([given, *map(shlex.quote, map(str, args))])} --out-dir {shlex.quote(str(out_dir))}   "
              f"(under the checker's probe, as two nodes on this machine: torchrun --nnodes=2, "
              f"{' + '.join(map(str, per_node))} processes)", flush=True)
    started = time.perf_counter()
    codes, lines = run_nodes(["--probe", str(folder), str(script.resolve()), *launch.script_args, *map(str, args),
                              "--out-dir", str(out_dir)], per_node, folder, lab_device(ranks), timeout_s, echo,
                             exercise, launch.assigned, idle_limit_s)
    seconds = time.perf_counter() - started
    if any(codes):
        raise _crash(_status(codes), lines, folder, per_node, exercise)
    import torch

    records = [json.loads(path.read_text()) for path in sorted(folder.glob("rank*.json"))]
    require(bool(records), exercise, "the script ran, but no rank reached its end.", "read the output above.")
    params = [torch.load(folder / f"rank{r['rank']}-params.pt", weights_only=True) for r in records]
    return records, params, out_dir, folder, lines, seconds, per_node


@checked
def check_ddp_lab(script, workdir, nproc: int = 2, command=LAUNCH_HERE, timeout_s: float = 300, echo: bool = True,
                  args=(), exercise: str = LAB_EXERCISE, idle_limit_s: float | None = None) -> LabRun:
    """Run the attendee's DDP script under the probe as ``nproc`` processes plus one on a second node, launched
    by ``command`` (left out, the checker writes it); pass, or ``NotYet`` naming the mistake."""
    script = Path(script)
    require(script.exists(), exercise, f"{script} does not exist.", "run the cell that writes your copy first.")
    gaps = placeholders_left(script.read_text(), exercise)
    if gaps:
        raise Unsolved(f"… {exercise}: not yet solved: {script.name} still has the placeholder `...` on line(s) "
                       f"{', '.join(map(str, gaps))}.", "replace each `...` under '# YOUR CODE HERE' with your code.")
    example = example_line(nproc, script)
    require_answered(command, exercise, "`lab_command` is still the placeholder `...`.",
                     f"write the launch line: {example}.")
    require(command is not None, exercise, "`lab_command` is None.", f"write the launch line as a string: {example}.")
    records, params, out_dir, folder, lines, seconds, per_node = _lab_records(
        script, workdir, nproc, command, timeout_s, echo, args, exercise, idle_limit_s)
    facts: dict = {}
    mistakes = findings(records, params, out_dir, per_node, exercise, facts)
    if mistakes:  # a run that ended: no line of the verdict points into its folder (a crash's does, and keeps it)
        shutil.rmtree(folder, ignore_errors=True)
        raise mistakes[0]
    ranks = sum(per_node)
    passed(exercise, f"{ranks} {facts['backend']} ranks on two nodes ({' + '.join(map(str, per_node))} processes), "
                     f"disjoint shards of {facts['samples_per_rank']} samples reshuffled every epoch; parameters "
                     f"equal on every rank; one checkpoint, by rank 0; {facts['reported']:.0f} samples/s reported, "
                     f"about {facts['measured']:.0f} seen by the checker; process group closed")
    return LabRun(ranks, facts["backend"], facts["samples_per_rank"], facts["reported"], facts["measured"],
                  facts["checkpoint"], seconds, folder, lines)


def _gradients(spec_file: str) -> None:
    """One rank's side of ``judge_average_gradients``: each function against DDP, on the launch's world, then on
    node 0's ranks alone; each collective is logged before it starts, so that a hang still shows who called what."""
    import torch
    import torch.distributed as dist
    from torch import nn
    from torch.nn.parallel import DistributedDataParallel

    from ..spine.distributed import setup_distributed, teardown_distributed

    spec = json.loads(Path(spec_file).read_text())
    top = Path(spec["folder"])
    info, device = setup_distributed()
    rank, startup = info.rank, time.time() - float(os.environ.get(STARTED) or time.time())
    limit = scaled_limit(startup)
    node = os.environ.get("GROUP_RANK", "0")
    note_progress(top, rank, "started")
    originals = {op: getattr(dist, op) for op in COLLECTIVES if hasattr(dist, op)}
    for round_, world in enumerate((info.world_size, SECOND_WORLD), start=1):
        if round_ == 2:  # node 0's ranks, now a job of their own, as torchrun's environment would say
            teardown_distributed()
            if rank >= world:
                break
            os.environ.update(WORLD_SIZE=str(world), ROLE_WORLD_SIZE=str(world), LOCAL_WORLD_SIZE=str(world),
                              GROUP_RANK="0", GROUP_WORLD_SIZE="1", MASTER_PORT=str(spec["second_port"]),
                              TORCHELASTIC_USE_AGENT_STORE="False")
            dist.init_process_group("nccl" if device.type == "cuda" else "gloo", rank=rank, world_size=world,
                                    init_method=f"tcp://127.0.0.1:{spec['second_port']}")
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 10)).to(device)
        generator = torch.Generator().manual_seed(100 * round_ + rank)  # every rank its own batch
        x = torch.randn(16, 64, generator=generator).to(device)
        y = torch.randint(0, 10, (16,), generator=generator).to(device)
        # DDP's gradients first, on every rank alike: no collective of the attendee's can pair with DDP's.
        reference = DistributedDataParallel(copy.deepcopy(model), device_ids=[device.index] if device.type == "cuda"
                                            else None)
        nn.functional.cross_entropy(reference(x), y).backward()
        ddp = [p.grad.detach().clone() for p in reference.parameters()]
        try:  # how many all-reduces DDP itself made: its buckets (a private report of PyTorch's; may vanish)
            buckets = len(str(reference._get_ddp_logging_data()["bucket_sizes"]).split(","))
        except Exception:  # noqa: BLE001
            buckets = None
        for index, (source_file, name) in enumerate(spec["functions"]):
            folder = top / f"round{round_}" / f"fn{index}"
            folder.mkdir(parents=True, exist_ok=True)
            result = {"rank": rank, "world_size": world, "node": node, "limit_s": limit, "startup_s": startup}

            def stop(**why) -> None:  # leave at once: a peer may be stuck in a collective, so no teardown
                write_json({**result, **why, "time": time.time()}, folder / f"rank{rank}.json")
                sys.stdout.flush()
                sys.stderr.flush()
                os._exit(3)

            trial = copy.deepcopy(model)
            nn.functional.cross_entropy(trial(x), y).backward()
            own = [p.grad.clone() for p in trial.parameters()]
            started: list[str] = []
            unwaited: list = []  # the async work nothing waited for
            note_progress(top, rank, f"in your function (world of {world})")
            returned = threading.Event()
            # a function that does not return is stopped at the limit, wherever it waits
            threading.Thread(target=lambda: returned.wait(limit) or stop(stopped="timeout", calls=list(started)),
                             daemon=True).start()
            error = None
            try:
                namespace = {"torch": torch, "dist": dist, "nn": nn, "__name__": "attendee"}
                exec(compile(Path(source_file).read_text(), source_file, "exec"), namespace)  # noqa: S102 - theirs
                watchers = {op: watched(op, original, started, folder / f"rank{rank}.calls", unwaited)
                            for op, original in originals.items()}
                for key, value in list(namespace.items()):  # imported by name: from torch.distributed import ...
                    namespace[key] = next((watchers[op] for op, original in originals.items() if value is original),
                                          value)
                with mock.patch.multiple(dist, **watchers):
                    namespace[name](trial)
            except (Exception, SystemExit) as err:  # noqa: BLE001 - the attendee's code (sys.exit too): line, error
                theirs = [f for f in traceback.extract_tb(err.__traceback__) if f.filename == source_file]
                error = {"error": f"{type(err).__name__}: {short(err, 160)}" if str(err) else type(err).__name__,
                         "line": theirs[-1].lineno if theirs else None,
                         "code": (theirs[-1].line or "").strip() if theirs else None}
            finally:
                returned.set()
            mine = [p.grad for p in trial.parameters()]
            write_json({"calls": started}, folder / f"rank{rank}.done")  # before the error: peers see it done
            if error:
                write_json({**result, **error, "calls": started, "time": time.time()}, folder / f"rank{rank}.json")
            why = wait_for_ranks(folder, rank, world, started, limit)
            if why:
                stop(stopped=why, calls=started, **(error or {}))
            if not error:  # one raised on every rank after the same calls leaves no rank in a collective: go on
                write_json({**result, **compared(mine, ddp, own), "calls": started, "ddp_buckets": buckets,
                            "unwaited": len(unwaited)}, folder / f"rank{rank}.json")
            for pending in unwaited:  # every rank made the same calls: ended here, before the next function's
                pending.work.wait()
    teardown_distributed()
    note_progress(top, rank, "finished")


def judge_average_gradients(functions, workdir, timeout_s: float = 600, exercise: str = GRADIENTS_EXERCISE,
                            idle_limit_s: float | None = None) -> list:
    """Each of ``functions`` (sources), run in one launch: its facts on both world sizes or its ``NotYet``. One
    that leaves the ranks unable to go on (a hang, a failure on some ranks) ends the launch."""
    folder = fresh_folder(workdir, "gradients")
    files = []
    for index, (source, name) in enumerate(functions):
        (folder / f"fn{index}.py").write_text(source)
        files.append([str(folder / f"fn{index}.py"), name])
    spec = folder / "spec.json"
    spec.write_text(json.dumps({"functions": files, "folder": str(folder), "second_port": free_port()}))
    ranks = sum(PER_NODE)
    codes, lines = run_nodes(["--gradients", str(spec)], PER_NODE, folder, lab_device(ranks), timeout_s, False,
                             exercise, idle_limit_s=idle_limit_s)
    verdicts = []
    for index in range(len(functions)):
        facts = {}
        for round_, world in ((1, ranks), (2, SECOND_WORLD)):
            where = folder / f"round{round_}" / f"fn{index}"
            results = [json.loads(path.read_text()) for path in sorted(where.glob("rank*.json"))]
            try:
                if len(results) < world or any(r.get("error") or r.get("stopped") for r in results):
                    raise gradients_failure(where, world, exercise) or failed_run(
                        exercise, _status(codes), lines, world, folder, where=" outside your function")
                facts[world] = judge_comparison(results, world, exercise)
            except NotYet as mistake:
                facts = mistake
                break
        verdicts.append(facts)
    return verdicts


@checked
def check_average_gradients(average_gradients, workdir, timeout_s: float = 600,
                            exercise: str = GRADIENTS_EXERCISE, idle_limit_s: float | None = None) -> dict:
    """``average_gradients(model)`` under torchrun, on 3 ranks as two nodes, then on node 0's 2: its gradients
    must be DDP's on every rank at both world sizes."""
    require_answered(average_gradients, exercise, "`average_gradients` is still the placeholder.",
                     "define the function in the exercise cell and run it.")
    require(callable(average_gradients), exercise, "`average_gradients` is not a function.",
            "define it with def average_gradients(model): ...")
    source, name = function_source(average_gradients, exercise)
    if placeholder_body(source):
        raise Unsolved(f"… {exercise}: not yet solved: `average_gradients` still has only `...` in its body.",
                       "for every parameter: dist.all_reduce(p.grad), then divide by dist.get_world_size().")
    source += shipped_globals(average_gradients, exercise)
    facts = judge_average_gradients([(source, name)], workdir, timeout_s, exercise, idle_limit_s)[0]
    if isinstance(facts, NotYet):
        raise facts
    first = facts[sum(PER_NODE)]
    calls, buckets = first["calls_made"], first["ddp_buckets"]
    kinds = Counter(calls)
    made = f"{len(calls)} all-reduce call(s)" if set(kinds) == {"all_reduce"} else \
        f"{len(calls)} collective call(s) ({', '.join(f'{n} {op}' for op, n in kinds.items())})"
    passed(exercise, f"equal to DDP's on all ranks, on {sum(PER_NODE)} ranks as two nodes ({PER_NODE[0]} + "
                     f"{PER_NODE[1]} processes), then on {SECOND_WORLD}; your function made {made}" +
           (f", DDP made {buckets}: it packs the gradients into buckets" if buckets else ""))
    return {"calls": kinds.get("all_reduce", 0), "collectives": len(calls), "ddp_buckets": buckets,
            "max_difference": max(f["max_difference"] for f in facts.values()), "world_sizes": sorted(facts)[::-1]}


@record_failures  # the probe records the script's own failure; this records the probe's and the gradients'
def main(argv=None) -> None:
    """What a rank (``--probe``, ``--gradients``) or a node (``--agent``: torchrun) of a check runs."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["--agent"]:
        return torchrun_agent(argv[1:])
    # a rank forked from its agent ends on torchrun's SIGTERM as a fresh Python does
    for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT):
        signal.signal(sig, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    if len(argv) >= 3 and argv[0] == "--probe":
        _probe(Path(argv[1]), argv[2], argv[3:])
    elif len(argv) == 2 and argv[0] == "--gradients":
        _gradients(argv[1])
    else:
        print("usage: python -m workshop_utils.exercises.ddp_lab --probe FOLDER SCRIPT [ARGS...] | --gradients SPEC | "
              "--agent TORCHRUN_ARGS  (started by check_ddp_lab and check_average_gradients)", file=sys.stderr)
        raise SystemExit(2)


if __name__ == "__main__":
    main()
