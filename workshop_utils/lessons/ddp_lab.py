"""Notebook 02's DDP lab and its exercises: the attendee writes the code, these functions judge it.

The lab. ``notebooks/labs/ddp_lab/train_single.py`` is a plain single-device training script;
``train_ddp.py`` beside it is its DDP version, the answers between the exercise markers of
``lessons.exercises``. ``start_ddp_lab`` writes the attendee's copy of it (markers applied,
``attendee_script``) into the run folder, where the attendee fills the gaps, and
``check_ddp_lab`` runs the result under torchrun on two processes and judges it.

The checker does not ask the script to report anything. Its ranks run under a probe
(``python -m workshop_utils.lessons.ddp_lab --probe ...``, inserted where the command names
the script) that watches PyTorch from the outside: the indices every DataLoader draws, each
DistributedDataParallel built, every ``torch.save``, the optimizer's parameters at the end,
whether the process group was still open, and each rank's output. A script that prints the
right lines but trains differently is judged by what it did. Each common mistake gets its own
line: launched with ``python`` (no WORLD_SIZE), every rank on the same samples, no
``set_epoch`` (the same order every epoch), no DDP wrap (parameters differ between ranks),
every rank saving, every rank logging, no throughput line, one rank's throughput (or any other
far from what the ranks drew), the process group left open, a hang, a crash (its last lines shown).

The other exercises: ``check_average_gradients`` (gradients averaged by hand with
``torch.distributed``, compared with DDP's under torchrun on three ranks, then four, so that any
world size typed in fails) and ``check_ddp_efficiency`` (the weak-scaling efficiency at 64 GPUs from
the ring all-reduce model).

This module is what starts the ranks and what they run (``python -m``, ``main``): ``run_single``, the
two checks that launch torchrun, and each rank's side of them (``_probe``, ``_gradients``). The code
that branches on CUDA stays here because the GPU check's list of paths names it here. Below it:
``ddp_lab_files`` (the scripts, the ranks' environment), ``ddp_lab_judging`` (the launch line and a
finished run's records), ``ddp_lab_gradients`` (Exercise 2.1's files between the ranks and its failure
lines) and ``ddp_efficiency`` (Exercise 2.3).
"""

from __future__ import annotations

import json
import math
import os
import re
import shlex
import sys
import time
import traceback
from collections import Counter
from pathlib import Path

from ..parallel.failures import MISMATCHED_COLLECTIVE_FIX, record_failure, record_failures, root_cause
from ..parallel.launch import cpu_threads_per_process, free_port, stream, torchrun_command
from ..system.errors import WorkshopError
from ..system.results import fresh_folder
from .ddp_efficiency import check_ddp_efficiency
from .ddp_lab_files import (DIST_VARIABLES, EFFICIENCY_EXERCISE, GRADIENTS_EXERCISE, LAB_EXERCISE, LOSS_LINE,
                            PROBE_MODULE, SOLUTION_FILE, STARTER_NAME, THROUGHPUT, TORCHRUN_LOGS, attendee_script,
                            clean_env, lab_folder, read_output, reported_throughput, solution_text, solve_ddp_lab,
                            start_ddp_lab)
from .ddp_lab_gradients import (COLLECTIVES, GRADIENTS_WAIT_S, function_source, gradients_failure,
                                placeholder_body, shipped_globals, wait_for_ranks, write_json)
from .ddp_lab_judging import THROUGHPUT_TOLERANCE, LabRun, judge_run, lab_command, placeholders_left
from .exercise_judging import checked, short
from .exercises import NotYet, Unsolved, passed, require, require_answered

# What was defined here before the lab's helpers moved below it; importers keep this one path.
__all__ = [
    "COLLECTIVES", "DIST_VARIABLES", "EFFICIENCY_EXERCISE", "GRADIENTS_EXERCISE", "GRADIENTS_WAIT_S", "LAB_EXERCISE",
    "LAUNCH_HERE", "LOSS_LINE", "PROBE_MODULE", "SOLUTION_FILE", "STARTER_NAME", "THROUGHPUT", "THROUGHPUT_TOLERANCE",
    "TORCHRUN_LOGS", "LabRun", "attendee_script", "check_average_gradients", "check_ddp_efficiency", "check_ddp_lab",
    "clean_env", "lab_command", "lab_device", "lab_folder", "main", "placeholders_left", "reported_throughput",
    "run_single", "solution_text", "solve_ddp_lab", "start_ddp_lab",
]
# ---------------------------------------------------------------- the launches: one process, or the lab's ranks


def run_single(script, out_dir, threads: int | None = None, timeout_s: float = 300, echo: bool = True,
               args=()) -> float | None:
    """``python script --out-dir out_dir``, its output streamed; the samples/s it reported (None if none).

    It runs where each rank of the two-process lab runs (``lab_device(2)``): on a node with one GPU the
    ranks are CPU processes, and a single process on the GPU beside them would compare a GPU with a CPU.
    ``threads`` is OMP_NUM_THREADS; None gives it what each rank of a two-process job gets (half the cores),
    so that on a CPU the one process and each DDP rank compute with the same share of the machine.
    """
    command = [sys.executable, str(script), *map(str, args), "--out-dir", str(out_dir)]
    if echo:
        print("$ python " + " ".join(shlex.quote(str(a)) for a in command[1:]), flush=True)
    env = clean_env(threads or cpu_threads_per_process(2), hide_gpus=lab_device(2) == "cpu")
    codes, lines = stream({"": command}, env, timeout_s, echo)
    if codes[0]:
        raise WorkshopError(f"{Path(script).name} exited with status {codes[0]}: {(lines or ['(no output)'])[-1]}",
                            "read its output above.")
    return reported_throughput(lines)


def _backend_of(module) -> str:
    """The backend the DDP module's collectives run on: init_process_group() with no backend says "undefined",
    and its config names one per device type ("cpu:gloo,cuda:nccl")."""
    import torch.distributed as dist

    backend = dist.get_backend()
    if backend in ("gloo", "nccl", "mpi", "ucc"):
        return backend
    kind = next((p.device.type for p in module.parameters()), "cpu")
    config = dict(pair.split(":", 1) for pair in dist.get_backend_config().split(",") if ":" in pair)
    return config.get(kind, backend)


def lab_device(nproc: int) -> str:
    """NCCL needs a GPU per rank: "cuda" with that many GPUs, else "cpu" (gloo, GPUs hidden from the ranks)."""
    import torch

    return "cuda" if torch.cuda.is_available() and torch.cuda.device_count() >= nproc else "cpu"


# ---------------------------------------------------------------- the probe: runs in every rank


class _Tee:
    """A text stream that also copies what it is given into a file (one rank's output, for the checker)."""

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


def _probe(folder: Path, script: str, args: list[str]) -> None:
    """Run ``script`` as ``__main__`` while recording what it does to PyTorch; write the record at the end."""
    import runpy
    import traceback

    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel
    from torch.utils.data import dataloader

    rank = int(os.environ.get("RANK") or 0)
    sys.stdout = _Tee(sys.stdout, folder / f"rank{rank}.stdout")
    sys.stderr = _Tee(sys.stderr, folder / f"rank{rank}.stderr")
    record = {"rank": rank, "env": {k: os.environ.get(k) for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE")},
              "epochs": [], "ddp": 0, "backend": None, "saves": [], "first_draw": None, "end": None,
              "torn_down": None, "error": None}
    optimizers, ddp_modules = [], []
    save = torch.save

    def next_index(self, _original=dataloader._BaseDataLoaderIter._next_index):
        index = _original(self)
        # A new sampler iterator (a new epoch, or a persistent loader reset) starts a new entry.
        if getattr(self, "_lab_probe_source", None) is not self._sampler_iter:
            self._lab_probe_source = self._sampler_iter
            self._lab_probe_entry = {"dataset": id(self._dataset), "indices": []}
            record["epochs"].append(self._lab_probe_entry)
        self._lab_probe_entry["indices"].extend(index if isinstance(index, list) else [index])
        now = time.time()
        record["first_draw"] = record["first_draw"] or now
        entry = self._lab_probe_entry  # when this loader's batches were drawn: the throughput's clock
        entry["first"], entry["last"], entry["draws"] = entry.get("first") or now, now, entry.get("draws", 0) + 1
        return index

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
        return save(obj, f, *a, **k)

    dataloader._BaseDataLoaderIter._next_index = next_index
    DistributedDataParallel.__init__ = ddp_init
    torch.optim.Optimizer.__init__ = optimizer_init
    torch.save = recorded_save

    sys.argv = [script, *args]
    sys.path.insert(0, str(Path(script).resolve().parent))  # as `python script` would
    code = 0
    try:
        runpy.run_path(script, run_name="__main__")
    except SystemExit as stop:
        code = stop.code if isinstance(stop.code, int) else (0 if stop.code is None else 1)
        if code:
            record["error"] = f"SystemExit: {stop.code}"
            record_failure(stop)
    except BaseException as err:  # noqa: BLE001 - recorded, shown as the script's own traceback, then exit 1
        record["error"] = f"{type(err).__name__}: {err}"
        frames = err.__traceback__  # from the script's first frame on: the probe's and runpy's are noise
        while frames is not None and Path(frames.tb_frame.f_code.co_filename).resolve() != Path(script).resolve():
            frames = frames.tb_next
        # Before anything closes the process group: the ranks this failure stops come later in time.
        record_failure(err.with_traceback(frames or err.__traceback__))
        traceback.print_exception(type(err), err, err.__traceback__)
        code = 1
    record["end"] = time.time()
    record["torn_down"] = not (dist.is_available() and dist.is_initialized())
    parameters, seen = [], set()
    for tensor in [p for o in optimizers for g in o.param_groups for p in g["params"]] or \
            [p for m in ddp_modules for p in m.parameters()]:
        if id(tensor) not in seen:
            seen.add(id(tensor))
            parameters.append(tensor.detach().float().cpu().clone())
    save(parameters, folder / f"rank{rank}-params.pt")
    (folder / f"rank{rank}.json").write_text(json.dumps(record))
    sys.stdout.flush()
    sys.stderr.flush()
    if not record["torn_down"]:
        dist.destroy_process_group()  # recorded above; closed here so that this process ends cleanly
    raise SystemExit(code)


# ---------------------------------------------------------------- the lab's checker


def _crash(code: int, lines: list[str], folder: Path, nproc: int, exercise: str) -> NotYet:
    """The one line a failed run gets: a known mistake by its symptom, else the rank that failed first.

    Every rank a failure stops records an error of its own too (a lost connection), so the rank
    is picked by ``root_cause``, from the error files the probe writes under torchrun.
    """
    errors = {}
    for rank in range(nproc):
        path = folder / f"rank{rank}.json"
        if path.exists() and json.loads(path.read_text()).get("error"):
            errors[rank] = json.loads(path.read_text())["error"]
    stderr = {rank: read_output(folder / f"rank{rank}.stderr") for rank in range(nproc)}
    everything = "\n".join([*lines, *errors.values(), *stderr.values()])
    missing = re.search(r"KeyError: '(RANK|LOCAL_RANK|WORLD_SIZE)'|environment variable (\w+) expected", everything)
    if missing:
        name = missing.group(1) or missing.group(2)
        return NotYet(f"✗ {exercise}: the script found no {name}: it was started with `python`, which starts one "
                      "process and sets none of torchrun's variables.",
                      f"launch it with `torchrun --nproc-per-node={nproc} <script>`: torchrun starts the processes "
                      "and sets RANK, LOCAL_RANK and WORLD_SIZE in each.")
    known = [
        ("Default process group has not been initialized",
         "a DistributedSampler or DDP was built before the process group existed.",
         "call dist.init_process_group(...) first (step 2)."),
        ("Duplicate GPU detected", "two ranks use the same GPU.",
         "give each rank its own: torch.device('cuda', local_rank) and torch.cuda.set_device(device)."),
        ("mutually exclusive with shuffle", "the DataLoader got both a sampler and shuffle=True.",
         "drop shuffle=True: the DistributedSampler shuffles."),
    ]
    for symptom, problem, hint in known:
        if symptom in everything:
            return NotYet(f"✗ {exercise}: {problem}", hint)
    cause = root_cause(lines, nproc, folder / TORCHRUN_LOGS, rank_output=stderr)
    if cause is not None:  # the streamed output above interleaves the ranks: these lines are the failing one's alone
        if cause.last_lines:
            print(cause.last_lines_text())
        return NotYet(f"✗ {exercise}: the run failed (exit status {code}); {cause.line}.", cause.fix)
    # Launched with `python`: one process and no torchrun report, its own output is all there is.
    tail = [line for line in (stderr.get(0) or "\n".join(lines)).splitlines() if line.strip()][-6:]
    if tail:
        print("--- the last lines of the output:", *tail, sep="\n")
    last = errors.get(0) or next((line.strip() for line in reversed(tail)
                                  if re.match(r"\s*\w+(Error|Exception)\b", line)),
                                 tail[-1].strip() if tail else "(no output)")
    return NotYet(f"✗ {exercise}: the run failed (exit status {code}); the script: {' '.join(last.split())}",
                  "the traceback above names the line; fix it and run this cell again.")


class _LaunchHere:
    """``check_ddp_lab``'s default command: the checker writes the torchrun line itself (tests, the GPU check)."""

    def __repr__(self) -> str:
        return "LAUNCH_HERE"


LAUNCH_HERE = _LaunchHere()


@checked
def check_ddp_lab(script, workdir, nproc: int = 2, command=LAUNCH_HERE, timeout_s: float = 240, echo: bool = True,
                  args=(), exercise: str = LAB_EXERCISE) -> LabRun:
    """Run the attendee's DDP script on ``nproc`` processes under the probe; pass, or ``NotYet`` naming the mistake.

    ``command`` is the launch line the attendee wrote ("torchrun --nproc-per-node=2 my_train_ddp.py"), a
    string or a list of words; left out (``LAUNCH_HERE``), the checker launches torchrun itself. The
    checker appends ``--out-dir`` (a fresh folder under ``workdir``) to the script's arguments, and
    ``args`` before it. NCCL ranks when this machine has ``nproc`` GPUs, else gloo ranks that see no GPU.
    The throughput the script reports must be the whole job's, within ``THROUGHPUT_TOLERANCE`` of what
    the probe saw the ranks draw.
    """
    script = Path(script)
    require(script.exists(), exercise, f"{script} does not exist.", "run the cell that writes your copy first.")
    gaps = placeholders_left(script.read_text(), exercise)
    if gaps:
        raise Unsolved(f"… {exercise}: not yet solved: {script.name} still has the placeholder `...` on line(s) "
                       f"{', '.join(map(str, gaps))}.", "replace each `...` under '# YOUR CODE HERE' with your code.")
    require_answered(command, exercise, "`lab_command` is still the placeholder `...`.",
                     f"write the launch line: f\"torchrun --nproc-per-node={nproc} {{lab_file}}\".")
    require(command is not None, exercise, "`lab_command` is None.",
            f"write the launch line as a string: f\"torchrun --nproc-per-node={nproc} {{lab_file}}\".")
    launch_here = command is LAUNCH_HERE
    if not launch_here:
        lab_command(command, script, nproc, Path("probe"), [], exercise)  # a wrong line fails before any folder
    folder = fresh_folder(workdir, "check")
    probe, out_dir = folder, folder / "out"
    extra = [*map(str, args), "--out-dir", str(out_dir)]
    device = lab_device(nproc)
    if launch_here:
        argv = torchrun_command(PROBE_MODULE, ["--probe", str(probe), str(script.resolve()), *extra], nproc,
                                port=free_port(), log_dir=probe / TORCHRUN_LOGS)
    else:
        argv, _ = lab_command(command, script, nproc, probe, extra, exercise)
    if echo:
        given = (f"torchrun --nproc-per-node={nproc} {script}" if launch_here
                 else command if isinstance(command, str) else shlex.join(map(str, command)))
        print(f"$ {given} {shlex.join(extra)}"
              "   (under the checker's probe)", flush=True)
    started = time.perf_counter()
    try:
        codes, lines = stream({"": argv}, clean_env(cpu_threads_per_process(nproc), device == "cpu"), timeout_s, echo)
    except WorkshopError as err:
        if "longer than" not in str(err):
            raise
        raise NotYet(f"✗ {exercise}: the run did not finish within {timeout_s:.0f} s and was stopped: a rank waits "
                     "for the others in a collective they never reach.", MISMATCHED_COLLECTIVE_FIX) from None
    seconds = time.perf_counter() - started
    code = max(codes, key=abs)
    if code:
        raise _crash(code, lines, folder, nproc, exercise)
    import torch

    records = [json.loads((probe / f"rank{r}.json").read_text()) for r in range(nproc)
               if (probe / f"rank{r}.json").exists()]
    require(bool(records), exercise, "the script ran, but no rank reached its end.",
            "read the output above.")
    params = [torch.load(probe / f"rank{r['rank']}-params.pt", weights_only=True) for r in records]
    facts = judge_run(records, params, out_dir, nproc, exercise)
    passed(exercise, f"{nproc} {facts['backend']} ranks, disjoint shards of {facts['samples_per_rank']} samples "
                     f"reshuffled every epoch; parameters equal on every rank; one checkpoint, by rank 0; "
                     f"{facts['reported']:.0f} samples/s reported, about {facts['measured']:.0f} seen by the checker; "
                     "process group closed")
    return LabRun(nproc, facts["backend"], facts["samples_per_rank"], facts["reported"], facts["measured"],
                  facts["checkpoint"], seconds, folder, lines)


# ---------------------------------------------------------------- gradients averaged by hand


def _gradients(source_file: str, name: str, folder: str) -> None:
    """One rank's side of ``check_average_gradients``: the attendee's average against DDP's, same model and batch.

    Writes ``rank<r>.json``: the comparison, or the attendee's error (with its line), or why the ranks
    could not be compared (their collective calls differ, a rank never finished). Each collective the
    function starts is logged to ``rank<r>.calls`` first, so that a hang or an abort still shows who
    called what.
    """
    import copy

    import torch
    import torch.distributed as dist
    from torch import nn
    from torch.nn.parallel import DistributedDataParallel

    from ..spine.distributed import setup_distributed, teardown_distributed

    folder = Path(folder)
    info, device = setup_distributed()
    rank, world_size = info.rank, info.world_size
    result = {"rank": rank, "world_size": world_size}

    def stop(**why) -> None:  # leave at once: a peer may be stuck in a collective, so no teardown
        write_json(folder / f"rank{rank}.json", {**result, **why, "time": time.time()})
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(3)

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 10)).to(device)
    reference = DistributedDataParallel(copy.deepcopy(model), device_ids=[device.index] if device.type == "cuda"
                                        else None)
    generator = torch.Generator().manual_seed(100 + rank)  # every rank its own batch
    x = torch.randn(16, 64, generator=generator).to(device)
    y = torch.randint(0, 10, (16,), generator=generator).to(device)
    nn.functional.cross_entropy(model(x), y).backward()
    own = [p.grad.clone() for p in model.parameters()]

    started: list[str] = []
    originals = {op: getattr(dist, op) for op in COLLECTIVES if hasattr(dist, op)}

    def watched(op, original):
        def call(*args, **kwargs):
            started.append(op)
            with open(folder / f"rank{rank}.calls", "a") as log:
                log.write(op + "\n")
            return original(*args, **kwargs)
        return call

    for op, original in originals.items():
        setattr(dist, op, watched(op, original))
    try:
        namespace = {"torch": torch, "dist": dist, "nn": nn, "__name__": "attendee"}
        exec(compile(Path(source_file).read_text(), source_file, "exec"), namespace)  # noqa: S102 - their cell
        namespace[name](model)
    except (Exception, SystemExit) as err:  # noqa: BLE001 - the attendee's code (sys.exit too): line and error
        theirs = [f for f in traceback.extract_tb(err.__traceback__) if f.filename == source_file]
        stop(error=f"{type(err).__name__}: {short(err, 160)}" if str(err) else type(err).__name__,
             error_type=type(err).__name__, line=theirs[-1].lineno if theirs else None,
             code=(theirs[-1].line or "").strip() if theirs else None, calls=started)
    finally:
        for op, original in originals.items():
            setattr(dist, op, original)
    mine = [p.grad for p in model.parameters()]
    write_json(folder / f"rank{rank}.done", {"calls": started})
    why = wait_for_ranks(folder, rank, world_size, started)
    if why:
        stop(stopped=why, calls=started)

    nn.functional.cross_entropy(reference(x), y).backward()
    ddp = [p.grad for p in reference.parameters()]
    try:  # how many all-reduces DDP itself made: its buckets (a private report of PyTorch's; may vanish)
        buckets = len(str(reference._get_ddp_logging_data()["bucket_sizes"]).split(","))
    except Exception:  # noqa: BLE001
        buckets = None

    def gap(a, b):
        if any(t is None or t.shape != s.shape for t, s in zip(a, b)):
            return math.inf
        return max(float((s.float() - t.float()).abs().max()) for s, t in zip(a, b))

    ratio = residual = None
    if all(t is not None and t.shape == s.shape for t, s in zip(mine, ddp)):
        flat_mine = torch.cat([t.detach().float().flatten() for t in mine])
        flat_ddp = torch.cat([t.detach().float().flatten() for t in ddp])
        ratio = float(flat_mine @ flat_ddp / (flat_ddp @ flat_ddp))  # mine = ratio x DDP's, when proportional
        residual = float((flat_mine - ratio * flat_ddp).norm() / flat_ddp.norm())
    scale = max(float(t.abs().max()) for t in ddp)
    result.update({"calls": started, "ddp_buckets": buckets, "scale": scale, "to_ddp": gap(mine, ddp),
                   "to_own": gap(mine, own), "to_sum": gap(mine, [t * world_size for t in ddp]),
                   "ratio": ratio, "residual": residual, "grad_bytes": sum(4 * t.numel() for t in ddp)})
    teardown_distributed()
    write_json(folder / f"rank{rank}.json", result)


@checked
def check_average_gradients(average_gradients, workdir, nproc=(3, 4), timeout_s: float = 180,
                            exercise: str = GRADIENTS_EXERCISE) -> dict:
    """Run ``average_gradients(model)`` under torchrun, on each world size of ``nproc`` in turn; its gradients
    must be DDP's.

    Every rank computes the gradients of one small model on its own batch, calls the attendee's
    function on them, then lets DDP do the same from the same start. Passes when both agree on
    every rank at every world size; otherwise names what the result looks like (a sum, this rank's own
    gradients, a division by a number that is not the world size). Two world sizes by default, 3 then 4,
    so that any world size typed in is wrong on one of them. An error in the function is its line and the
    error; collectives that only some ranks make are named as such, from the calls each rank started.
    The ranks run the function's source with the modules it reads from the notebook (``import os`` in its
    cell); a function or variable of the notebook it reads is named before any launch.
    """
    require_answered(average_gradients, exercise, "`average_gradients` is still the placeholder.",
                     "define the function in the exercise cell and run it.")
    require(callable(average_gradients), exercise, "`average_gradients` is not a function.",
            "define it with def average_gradients(model): ...")
    source, name = function_source(average_gradients, exercise)
    if placeholder_body(source):
        raise Unsolved(f"… {exercise}: not yet solved: `average_gradients` still has only `...` in its body.",
                       "for every parameter: dist.all_reduce(p.grad), then divide by dist.get_world_size().")
    source += shipped_globals(average_gradients, exercise)
    sizes = [int(nproc)] if isinstance(nproc, int) else [int(n) for n in nproc]
    results = {size: _gradients_on(source, name, workdir, size, timeout_s, exercise) for size in sizes}
    first = results[sizes[0]]
    calls, buckets = first["calls_made"], first["ddp_buckets"]
    kinds = Counter(calls)
    made = f"{len(calls)} all-reduce call(s)" if set(kinds) == {"all_reduce"} else \
        f"{len(calls)} collective call(s) ({', '.join(f'{n} {op}' for op, n in kinds.items())})"
    ranks = " and ".join(map(str, sizes))
    passed(exercise, f"equal to DDP's on all ranks, on {ranks} ranks; your function made {made}" +
           (f", DDP made {buckets}: it packs the gradients into buckets" if buckets else ""))
    return {"calls": kinds.get("all_reduce", 0), "collectives": len(calls), "ddp_buckets": buckets,
            "max_difference": max(r["max_difference"] for r in results.values()), "world_sizes": sizes}


def _gradients_on(source: str, name: str, workdir, nproc: int, timeout_s: float, exercise: str) -> dict:
    """One launch of Exercise 2.1's function on ``nproc`` ranks: what it made, or ``NotYet`` naming the mistake."""
    folder = fresh_folder(workdir, "gradients")
    source_file = folder / "average_gradients.py"
    source_file.write_text(source)
    device = lab_device(nproc)
    argv = torchrun_command(PROBE_MODULE, ["--gradients", str(source_file), name, str(folder)],
                            nproc, port=free_port(), log_dir=folder / TORCHRUN_LOGS)
    try:
        codes, lines = stream({"": argv}, clean_env(cpu_threads_per_process(nproc), device == "cpu"), timeout_s,
                              echo=False)
    except WorkshopError as err:
        if "longer than" not in str(err):
            raise
        raise NotYet(f"✗ {exercise}: the ranks did not finish within {timeout_s:.0f} s: one waits in a collective "
                     "the others never join.", "call the same all-reduces, in the same order, on every rank.") from None
    results = [json.loads((folder / f"rank{r}.json").read_text()) for r in range(nproc)
               if (folder / f"rank{r}.json").exists()]
    if any(codes) or len(results) < nproc or any(r.get("error") or r.get("stopped") for r in results):
        raise gradients_failure(folder, nproc, codes, lines, exercise)
    worst = {key: max(r[key] for r in results) for key in ("to_ddp", "to_own", "to_sum")}
    tolerance = 1e-5 * max(1.0, max(r["scale"] for r in results))
    calls = results[0]["calls"]
    if worst["to_ddp"] > tolerance:
        require(bool(calls), exercise, "your function made no collective call: every rank kept its own gradients.",
                "all-reduce each parameter's .grad: dist.all_reduce(p.grad).")
        require(worst["to_sum"] > tolerance, exercise,
                f"your gradients are the sum over the {nproc} ranks, {nproc} times DDP's.",
                "divide by dist.get_world_size() after the all-reduce: DDP averages.")
        require(worst["to_own"] > tolerance, exercise, "the gradients are still each rank's own.",
                "write the all-reduced result back into p.grad (dist.all_reduce works in place).")
        ratios = [r["ratio"] for r in results if r["ratio"] is not None and r["residual"] is not None
                  and r["residual"] < 1e-4]
        if len(ratios) == nproc and max(ratios) - min(ratios) < 1e-4 * max(1.0, abs(ratios[0])) and ratios[0] > 0:
            divisor = nproc / ratios[0]
            require(not (abs(divisor - round(divisor)) < 1e-3 and round(divisor) != nproc), exercise,
                    f"your gradients are the sum divided by {round(divisor)}, but {nproc} ranks ran: a world size "
                    "typed in is right only on that many ranks.",
                    "divide by dist.get_world_size(), which is right on any number of ranks.")
        require(False, exercise, f"your gradients differ from DDP's by up to {worst['to_ddp']:.2g} on {nproc} ranks.",
                "every parameter's gradient: summed over the ranks, divided by the world size.")
    return {"calls_made": calls, "ddp_buckets": results[0]["ddp_buckets"], "max_difference": worst["to_ddp"]}


# ---------------------------------------------------------------- the entry the ranks run


@record_failures  # the probe records the script's own failure; this records the probe's and the gradients'
def main(argv=None) -> None:
    """``--probe FOLDER SCRIPT [ARGS...]`` or ``--gradients SOURCE NAME FOLDER``: what a rank of a check runs."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if len(argv) >= 3 and argv[0] == "--probe":
        _probe(Path(argv[1]), argv[2], argv[3:])
    elif len(argv) == 4 and argv[0] == "--gradients":
        _gradients(*argv[1:])
    else:
        print("usage: python -m workshop_utils.lessons.ddp_lab --probe FOLDER SCRIPT [ARGS...] | "
              "--gradients SOURCE NAME FOLDER  (started by check_ddp_lab and check_average_gradients)",
              file=sys.stderr)
        raise SystemExit(2)


if __name__ == "__main__":
    main()
