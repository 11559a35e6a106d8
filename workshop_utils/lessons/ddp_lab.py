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
``torch.distributed``, compared with DDP's under torchrun on three ranks, so that a world size
typed in as 2 fails) and ``check_ddp_efficiency`` (the weak-scaling efficiency at 64 GPUs from
the ring all-reduce model).
"""

from __future__ import annotations

import ast
import inspect
import json
import math
import os
import re
import shlex
import sys
import textwrap
import time
import traceback
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from .exercise_checks import checked, number, short, verdict
from .exercises import NotYet, Unsolved, attendee_source, passed, require, require_answered
from ..parallel.comm_model import LINKS, ddp_buckets, predict_scaling, ring_all_reduce_s
from ..parallel.failures import MISMATCHED_COLLECTIVE_FIX, record_failure, record_failures, root_cause
from ..parallel.launch import cpu_threads_per_process, free_port, stream, torchrun_command
from ..system.errors import WorkshopError
from ..system.results import fresh_folder, repo_root

LAB_EXERCISE = "Exercise 2.2"
GRADIENTS_EXERCISE = "Exercise 2.1"
EFFICIENCY_EXERCISE = "Exercise 2.3"
PROBE_MODULE = "workshop_utils.lessons.ddp_lab"
TORCHRUN_LOGS = "torchrun"  # the check folder's subfolder where torchrun has the ranks write their error files
SOLUTION_FILE = "train_ddp.py"
STARTER_NAME = "my_train_ddp.py"
# Variables a kernel started inside a job would otherwise hand on to the ranks it launches.
DIST_VARIABLES = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
                  "GROUP_RANK", "TORCHELASTIC_RUN_ID")
THROUGHPUT = re.compile(r"(\d[\d,]*(?:\.\d+)?(?:[eE][+-]?\d+)?)\s*(?:samples|images|imgs?|examples)\s*"
                        r"(?:/\s*s(?:ec(?:ond)?)?\b|per\s+s(?:ec(?:ond)?)?\b)", re.IGNORECASE)
LOSS_LINE = re.compile(r"\bloss\b", re.IGNORECASE)


# ---------------------------------------------------------------- the lab's files


def lab_folder(folder=None) -> Path:
    """The folder holding the lab's scripts: ``folder``, else the checkout's, else ./labs/ddp_lab."""
    candidates = [Path(folder)] if folder is not None else [
        *([repo_root() / "notebooks" / "labs" / "ddp_lab"] if repo_root() else []),
        Path.cwd() / "labs" / "ddp_lab", Path.cwd() / "notebooks" / "labs" / "ddp_lab"]
    for path in candidates:
        if (path / SOLUTION_FILE).exists():
            return path
    raise WorkshopError(f"Cannot find the DDP lab's {SOLUTION_FILE} (looked in {', '.join(map(str, candidates))}).",
                        "run from a checkout of the workshop, or pass the folder that holds notebooks/labs/ddp_lab.")


def solution_text(source: str) -> str:
    """A marked source with the answers kept and the marker and placeholder lines dropped."""
    attendee_source(source, "the solution")  # a malformed block fails here, with its line
    markers = ("### BEGIN SOLUTION", "### END SOLUTION", "### PLACEHOLDER")
    return "\n".join(line for line in source.splitlines() if not line.strip().startswith(markers)) + "\n"


def attendee_script(src, dst) -> Path:
    """Write the attendee's copy of a marked .py file: the notebooks' marker rule, applied to a script."""
    src, dst = Path(src), Path(dst)
    if src.resolve() == dst.resolve():
        raise WorkshopError(f"Would overwrite {src} with its attendee copy.", "write the copy to another path.")
    text = attendee_source(src.read_text(), src.name)
    dst.parent.mkdir(parents=True, exist_ok=True)
    dst.write_text(text + "\n")
    return dst


def start_ddp_lab(run_dir, lab=None) -> Path:
    """The attendee's DDP script in ``run_dir/ddp_lab/``: written once, kept as edited when run again."""
    path = Path(run_dir) / "ddp_lab" / STARTER_NAME
    if path.exists():
        print(f"Your script (kept as you left it): {path}")
        return path
    attendee_script(lab_folder(lab) / SOLUTION_FILE, path)
    gaps = sum(line.strip() == "# YOUR CODE HERE" for line in path.read_text().splitlines())
    print(f"Your script: {path}\n{gaps} places in it say '# YOUR CODE HERE'.")
    return path


def solve_ddp_lab(path, lab=None) -> Path:
    """Put the finished DDP script at ``path`` (what the committed notebook runs in place of an attendee's)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(solution_text((lab_folder(lab) / SOLUTION_FILE).read_text()))
    return path


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


def clean_env(threads: int | None = None, hide_gpus: bool = False) -> dict:
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    for name in DIST_VARIABLES:
        env.pop(name, None)
    if threads:
        env["OMP_NUM_THREADS"] = str(threads)
    if hide_gpus:
        env["CUDA_VISIBLE_DEVICES"] = ""  # CPU ranks on a GPU node must not reach for GPU 0
    return env


def reported_throughput(lines) -> float | None:
    """The last samples/s figure in ``lines`` ("throughput: 1234 samples/s"), or None."""
    found = [m.group(1) for line in lines for m in THROUGHPUT.finditer(line)]
    return float(found[-1].replace(",", "")) if found else None


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
        record["backend"] = dist.get_backend() if dist.is_initialized() else None
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


@dataclass
class LabRun:
    """What the checker saw of one run of the attendee's script."""

    ranks: int
    backend: str | None
    samples_per_rank: int
    throughput_reported: float | None
    throughput_measured: float | None
    checkpoint: Path | None
    seconds: float
    folder: Path
    lines: list[str] = field(repr=False, default_factory=list)


def placeholders_left(source: str, exercise: str = LAB_EXERCISE) -> list[int]:
    """Lines that still hold the placeholder ``...``."""
    try:
        tree = ast.parse(source)
    except SyntaxError as err:
        raise NotYet(f"✗ {exercise}: the script does not parse (line {err.lineno}: {err.msg}).",
                     "fix that line; the notebook's file browser opens the file.") from None
    return sorted({n.lineno for n in ast.walk(tree) if isinstance(n, ast.Constant) and n.value is Ellipsis})


def lab_command(command, script: Path, nproc: int, probe: Path, extra: list[str], exercise: str
                ) -> tuple[list[str], str]:
    """The attendee's launch line turned into the one the checker runs (probe inserted); and its launcher."""
    example = f"f\"torchrun --nproc-per-node={nproc} {{lab_file}}\""
    try:
        tokens = (shlex.split(command.strip().lstrip("!").strip()) if isinstance(command, str)
                  else [os.fspath(t) for t in command])
    except (ValueError, TypeError) as err:
        raise NotYet(f"✗ {exercise}: the command cannot be read as a command line ({err}).",
                     f"write it as one string, e.g. {example}.") from None
    require(bool(tokens), exercise, "the command is empty.",
            f"write the launch line, e.g. f\"torchrun --nproc-per-node={nproc} {{lab_file}}\".")
    first = Path(tokens[0]).name
    if first == "torchrun":
        launcher, rest = "torchrun", tokens[1:]
    elif first.startswith("python") or tokens[0] == sys.executable:
        if tokens[1:3] in (["-m", "torch.distributed.run"], ["-m", "torch.distributed.launch"]):
            launcher, rest = "torchrun", tokens[3:]
        else:
            launcher, rest = "python", tokens[1:]
    else:
        raise NotYet(f"✗ {exercise}: the command starts with {tokens[0]!r}.",
                     f"start it with torchrun: f\"torchrun --nproc-per-node={nproc} {{lab_file}}\".")
    scripts = [i for i, t in enumerate(rest) if t.endswith(".py")]
    require(bool(scripts), exercise, "the command names no .py script.",
            f"put your script's path after the launcher's options: torchrun --nproc-per-node={nproc} {script}.")
    at = scripts[0]
    named = Path(rest[at]).expanduser()
    require(named.resolve() == script.resolve(), exercise, f"the command runs {rest[at]}, not your lab script.",
            f"name the file you edited: {script}.")
    flags, args = rest[:at], rest[at + 1:]
    probe_args = ["-m", PROBE_MODULE, "--probe", str(probe), str(script), *args, *extra]
    if launcher == "python":
        return [sys.executable, *probe_args], launcher
    given = _nproc_flag(flags)
    require(given is not None, exercise, "torchrun starts one process unless told how many.",
            f"add --nproc-per-node={nproc}.")
    require(given == str(nproc), exercise, f"--nproc-per-node={given}: the lab runs on {nproc} processes.",
            f"use --nproc-per-node={nproc}.")
    rendezvous = ("--standalone", "--rdzv-endpoint", "--rdzv_endpoint", "--master-port", "--master_port")
    if not any(f.split("=")[0] in rendezvous for f in flags):
        flags = [*flags, "--master-addr=127.0.0.1", f"--master-port={free_port()}"]
    if not any(f.split("=")[0] in ("--log-dir", "--log_dir") for f in flags):
        flags = [*flags, f"--log-dir={probe / TORCHRUN_LOGS}"]
    return [sys.executable, "-m", "torch.distributed.run", *flags, *probe_args], launcher


def _nproc_flag(flags: list[str]) -> str | None:
    for i, flag in enumerate(flags):
        name, _, value = flag.partition("=")
        if name in ("--nproc-per-node", "--nproc_per_node"):
            return value or (flags[i + 1] if i + 1 < len(flags) else "")
    return None


def _read(path: Path) -> str:
    return path.read_text(errors="replace") if path.exists() else ""


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
    stderr = {rank: _read(folder / f"rank{rank}.stderr") for rank in range(nproc)}
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


def _training_epochs(record: dict) -> list[list[int]]:
    """The epochs of the loader that drew the most samples (the training loader), in order."""
    by_dataset: dict[int, list[list[int]]] = {}
    for entry in record["epochs"]:
        by_dataset.setdefault(entry["dataset"], []).append(entry["indices"])
    if not by_dataset:
        return []
    return max(by_dataset.values(), key=lambda epochs: sum(map(len, epochs)))


def _state_dict(obj):
    """The model state dict inside a loaded checkpoint (a dict of tensors), or None."""
    import torch

    if isinstance(obj, dict) and obj and all(isinstance(v, torch.Tensor) for v in obj.values()):
        return obj
    if isinstance(obj, dict):
        for value in obj.values():
            found = _state_dict(value)
            if found is not None:
                return found
    return None


# The reported throughput must be within this factor of what the probe saw: one rank's rate (1/nproc of the
# job's, at most 1/2) and any rate counted twice (at least 2x) lie outside it, the right one within a few percent.
THROUGHPUT_TOLERANCE = 1.4


def _training_entries(record: dict) -> list[dict]:
    """The probe's entries (one per epoch) of the loader that drew the most samples, in order."""
    by_dataset: dict[int, list[dict]] = {}
    for entry in record["epochs"]:
        by_dataset.setdefault(entry["dataset"], []).append(entry)
    return max(by_dataset.values(), key=lambda entries: sum(len(e["indices"]) for e in entries), default=[])


def _measured_throughput(records: list[dict]) -> tuple[float, float]:
    """(at least, at most): samples per second of the whole job over its training loop, as the probe saw it.

    At most: the training loader's samples from its first draw to about one step after its last (each
    draw starts a step; a loader with workers draws a few batches ahead, which makes this an upper bound).
    At least: the same samples from the first draw to the end of the script, which adds what runs after
    the loop (the checkpoint, the process group's end).
    """
    entries = [_training_entries(r) for r in records]
    drawn = sum(len(e["indices"]) for mine in entries for e in mine)
    first = min(r["first_draw"] for r in records if r["first_draw"])
    at_least = drawn / max(1e-9, max(r["end"] for r in records) - first)
    timed = [mine for mine in entries if mine and all("last" in e for e in mine)]
    draws = min((sum(e["draws"] for e in mine) for mine in timed), default=0)
    if len(timed) < len(entries) or draws < 2:
        return at_least, at_least
    start = min(mine[0]["first"] for mine in timed)
    span = (max(mine[-1]["last"] for mine in timed) - start) * draws / (draws - 1)
    return at_least, max(at_least, drawn / max(1e-9, span))


def _judge_throughput(reported: float, measured: tuple[float, float], nproc: int, exercise: str) -> None:
    """The throughput line (step 7) is the whole job's rate: every rank's samples over the loop's time."""
    low, high = measured

    def near(rate: float) -> bool:
        return low / THROUGHPUT_TOLERANCE <= rate <= high * THROUGHPUT_TOLERANCE

    if near(reported):
        return
    require(not near(reported * nproc), exercise,
            f"the reported throughput, {reported:.0f} samples/s, is one rank's: the {nproc} ranks together drew "
            f"about {high:.0f} samples/s.",
            "count every rank's samples: seen * world_size / elapsed (step 7).")
    raise NotYet(f"✗ {exercise}: the reported throughput, {reported:.0f} samples/s, is far from what the ranks drew: "
                 f"{reported / high:.2g}x their about {high:.0f} samples/s.",
                 "count every rank's samples once, over the training loop's time: seen * world_size / elapsed.")


def _judge_run(records: list[dict], params: list, out_dir: Path, nproc: int, exercise: str) -> dict:
    """Every verification of a finished run, in the order an attendee meets the mistakes."""
    import torch

    facts: dict = {}
    world = records[0]["env"].get("WORLD_SIZE")
    require(world is not None, exercise, "the script ran without WORLD_SIZE: it was started with `python`, so one "
            "process trained alone.", f"launch it with `torchrun --nproc-per-node={nproc} <script>`.")
    require(len(records) == nproc and world == str(nproc), exercise,
            f"{len(records)} process(es) ran (WORLD_SIZE={world}), the lab needs {nproc}.",
            f"launch with torchrun --nproc-per-node={nproc}.")

    # The data: a shard per rank, reshuffled every epoch.
    epochs = [_training_epochs(r) for r in records]
    for rank, mine in enumerate(epochs):
        require(bool(mine) and len(mine[0]) > 0, exercise, f"rank {rank} drew no samples from a DataLoader.",
                "train from a DataLoader over the dataset (step 3).")
    require(min(len(e) for e in epochs) >= 2, exercise, "the run trained one epoch: a reshuffle cannot be seen.",
            "run at least 2 epochs (the script's default is 3).")
    first = [set(e[0]) for e in epochs]
    for rank in range(1, nproc):
        shared = len(first[0] & first[rank]) / max(1, min(len(first[0]), len(first[rank])))
        require(shared < 0.9, exercise, f"ranks 0 and {rank} trained on the same samples in epoch 0 "
                f"({shared:.0%} shared): every rank read the whole data set.",
                "give the DataLoader a DistributedSampler(dataset) in place of shuffle=True (step 3).")
        require(shared <= 0.1, exercise, f"the shards of ranks 0 and {rank} overlap by {shared:.0%} in epoch 0.",
                "every rank needs the same seed and epoch in its DistributedSampler, so that the shards "
                "split one permutation.")
    require(epochs[0][0] != epochs[0][1], exercise, "rank 0 read its shard in the same order in epochs 0 and 1: "
            "the sampler never reshuffled.",
            "call sampler.set_epoch(epoch) at the start of every epoch (step 5), with shuffle=True in the sampler.")
    facts["samples_per_rank"] = len(epochs[0][0])

    # The model: wrapped in DDP, so that every rank ends with the same parameters.
    require(all(params) and len({len(p) for p in params}) == 1, exercise,
            "no parameters to compare: no torch.optim optimizer (and no DDP model) was found.",
            "train with a torch.optim optimizer over the model's parameters.")
    gap = max(float((a - b).abs().max()) for rank in range(1, nproc) for a, b in zip(params[0], params[rank]))
    if any(not r["ddp"] for r in records):
        after = (f"the ranks' parameters differ by up to {gap:.2g} after training: their gradients were never "
                 "averaged" if gap else "nothing averaged the ranks' gradients")
        raise NotYet(f"✗ {exercise}: the model was not wrapped in DistributedDataParallel; {after}.",
                     "wrap it: ddp_model = DDP(model, device_ids=[local_rank] on a GPU, else None) (step 4).")
    scale = max(1.0, max(float(p.abs().max()) for p in params[0]))
    require(gap <= 1e-6 * scale, exercise, f"the ranks' parameters differ by up to {gap:.2g} after training, "
            "although DDP wrapped the model.",
            "run the forward pass through the DDP model (ddp_model(images)), not the plain one.")
    facts["backend"] = records[0]["backend"]

    # The checkpoint: one file, by rank 0, holding the trained weights.
    savers = [r["rank"] for r in records if r["saves"]]
    require(not [r for r in savers if r != 0], exercise,
            f"every rank saved a checkpoint (ranks {', '.join(map(str, savers))} called torch.save).",
            "save on rank 0 alone: if rank == 0: torch.save(...) (step 8).")
    require(savers == [0], exercise, "no checkpoint was written.",
            "save the model on rank 0 into args.out_dir (step 8).")
    files = sorted(p for p in out_dir.rglob("*") if p.is_file()) if out_dir.exists() else []
    if not files:
        elsewhere = next(r["saves"][0] for r in records if r["rank"] == 0)
        raise NotYet(f"✗ {exercise}: torch.save wrote {elsewhere}, not into the --out-dir folder.",
                     "save into Path(args.out_dir).")
    require(len(files) == 1, exercise, f"{len(files)} files were written ({', '.join(p.name for p in files)}), "
            "not one checkpoint.", "save one file, once.")
    try:
        loaded = torch.load(files[0], map_location="cpu", weights_only=True)
    except Exception as err:  # noqa: BLE001 - any unreadable checkpoint gets the same advice
        raise NotYet(f"✗ {exercise}: the checkpoint cannot be read as weights ({type(err).__name__}).",
                     "save model.state_dict(), not the model object.") from None
    state = _state_dict(loaded)
    require(state is not None, exercise, "the checkpoint holds no state dict.",
            "save model.state_dict() (step 8).")
    require(not any(k.startswith("module.") for k in state), exercise,
            "the checkpoint's keys start with 'module.': it holds the DDP wrapper's state dict.",
            "save the plain model's: model.state_dict() or ddp_model.module.state_dict().")
    saved = [t.float() for t in state.values()]
    missing = [p for p in params[0] if not any(s.shape == p.shape and torch.equal(s, p) for s in saved)]
    require(not missing, exercise, "the checkpoint does not hold the trained parameters.",
            "save after the training loop, the model you trained.")
    facts["checkpoint"] = files[0]

    # The output: rank 0 alone logs, and reports a throughput that is near what ran.
    outputs = [_read(out_dir.parent / f"rank{r}.stdout") for r in range(nproc)]
    for rank in range(1, nproc):
        chatty = [line for line in outputs[rank].splitlines() if THROUGHPUT.search(line) or LOSS_LINE.search(line)]
        if chatty:
            raise NotYet(f"✗ {exercise}: rank {rank} logged too ({chatty[0].strip()!r}).",
                         "print on rank 0 alone: if rank == 0: print(...) (steps 6 and 7).")
    reported = reported_throughput(outputs[0].splitlines())
    require(reported is not None, exercise, "rank 0 printed no throughput.",
            "print e.g. f\"throughput: {seen * world_size / elapsed:.0f} samples/s\" on rank 0 (step 7).")
    measured = _measured_throughput(records)
    _judge_throughput(reported, measured, nproc, exercise)
    facts["reported"], facts["measured"] = reported, measured[1]

    # The end: the process group closed.
    open_ranks = [str(r["rank"]) for r in records if not r["torn_down"]]
    require(not open_ranks, exercise, f"the script ended with the process group still open (rank(s) "
            f"{', '.join(open_ranks)}).", "end with dist.destroy_process_group() (step 9).")
    return facts


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
    facts = _judge_run(records, params, out_dir, nproc, exercise)
    passed(exercise, f"{nproc} {facts['backend']} ranks, disjoint shards of {facts['samples_per_rank']} samples "
                     f"reshuffled every epoch; parameters equal on every rank; one checkpoint, by rank 0; "
                     f"{facts['reported']:.0f} samples/s reported, about {facts['measured']:.0f} seen by the checker; "
                     "process group closed")
    return LabRun(nproc, facts["backend"], facts["samples_per_rank"], facts["reported"], facts["measured"],
                  facts["checkpoint"], seconds, folder, lines)


# ---------------------------------------------------------------- gradients averaged by hand

# What a rank's side of check_average_gradients watches: every collective the attendee's function starts.
COLLECTIVES = ("all_reduce", "reduce", "broadcast", "all_gather", "all_gather_into_tensor", "reduce_scatter",
               "reduce_scatter_tensor", "all_to_all", "all_to_all_single", "gather", "scatter", "barrier")
GRADIENTS_WAIT_S = 60  # how long a rank that finished waits for the others to finish the function too


def _placeholder_body(source: str) -> bool:
    """True when a function's body (or a lambda's) is only ``...`` (after a docstring and comments)."""
    tree = ast.parse(source)
    function = next((n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))),
                    None)
    if function is None:
        return False
    if isinstance(function, ast.Lambda):
        return isinstance(function.body, ast.Constant) and function.body.value is Ellipsis
    body = [s for s in function.body if not (isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant)
                                             and isinstance(s.value.value, str))]
    return all(isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant) and s.value.value is Ellipsis
               for s in body)


def _function_source(function, exercise: str) -> tuple[str, str]:
    """(the source the ranks run, the name it defines): a ``def`` as written, a lambda as ``name = lambda ...``.

    Padded with blank lines so that its line numbers are those of the attendee's cell.
    """
    hint = "define it with def average_gradients(model): ... in a notebook cell, and run that cell."
    try:
        lines, first = inspect.getsourcelines(function)
    except (OSError, TypeError):
        raise NotYet(f"✗ {exercise}: the source of `average_gradients` cannot be read: the check sends it to the "
                     "ranks.", hint) from None
    source = textwrap.dedent("".join(lines))
    try:
        tree = ast.parse(source)
    except SyntaxError:
        raise NotYet(f"✗ {exercise}: the source of `average_gradients` cannot be read on its own.", hint) from None
    padding = "\n" * max(0, first - 1)
    if function.__name__ != "<lambda>":
        return padding + source, function.__name__
    lambdas = [n for n in ast.walk(tree) if isinstance(n, ast.Lambda)]
    require(len(lambdas) == 1, exercise, "`average_gradients` is a lambda on a line with other lambdas.", hint)
    segment = ast.get_source_segment(source, lambdas[0])
    name = "average_gradients_lambda"
    return padding + "\n" * (lambdas[0].lineno - 1) + f"{name} = {segment}\n", name


def _write_json(path: Path, data: dict) -> None:
    """Write ``data`` where another process may read it at any moment: whole, or not at all."""
    partial = path.with_suffix(path.suffix + ".partial")
    partial.write_text(json.dumps(data))
    partial.replace(path)


def _started_calls(folder: Path, rank: int) -> list[str]:
    path = folder / f"rank{rank}.calls"
    return path.read_text().split() if path.exists() else []


def _stopped(path: Path) -> bool:
    """A rank's record says it left without a comparison (an error in the function, or the ranks' calls differ)."""
    if not path.exists():
        return False
    record = json.loads(path.read_text())
    return bool(record.get("error") or record.get("stopped"))


def _wait_for_ranks(folder: Path, rank: int, world_size: int, mine: list[str]) -> str | None:
    """After this rank's function returned: None once every rank's did with the same calls, else why not.

    Before DDP's reference runs its own all-reduces, every rank must be done with the attendee's: a
    collective only some ranks started would otherwise pair with DDP's, and abort the run or corrupt it.
    A rank still inside a collective that this rank will never call ("mismatch") is told apart from a
    rank that has not got there yet by the calls it started.
    """
    deadline = time.time() + GRADIENTS_WAIT_S
    while True:
        done = {r: json.loads((folder / f"rank{r}.done").read_text()) for r in range(world_size)
                if (folder / f"rank{r}.done").exists()}
        if len(done) == world_size:
            return None if all(d["calls"] == mine for d in done.values()) else "mismatch"
        if any(_stopped(folder / f"rank{r}.json") for r in range(world_size) if r != rank):
            return "peer failed"
        waiting = [r for r in range(world_size) if r not in done]
        if any(len(_started_calls(folder, r)) > len(mine) for r in waiting):
            return "mismatch"
        if time.time() > deadline:
            return "timeout"
        time.sleep(0.02)


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
        _write_json(folder / f"rank{rank}.json", {**result, **why, "time": time.time()})
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
    except Exception as err:  # noqa: BLE001 - the attendee's code: their line and the error, for the checker
        theirs = [f for f in traceback.extract_tb(err.__traceback__) if f.filename == source_file]
        stop(error=f"{type(err).__name__}: {short(err, 160)}" if str(err) else type(err).__name__,
             error_type=type(err).__name__, line=theirs[-1].lineno if theirs else None,
             code=(theirs[-1].line or "").strip() if theirs else None, calls=started)
    finally:
        for op, original in originals.items():
            setattr(dist, op, original)
    mine = [p.grad for p in model.parameters()]
    _write_json(folder / f"rank{rank}.done", {"calls": started})
    why = _wait_for_ranks(folder, rank, world_size, started)
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
    _write_json(folder / f"rank{rank}.json", result)


def _collective_summary(calls: dict[int, list[str]]) -> str:
    """Who started which collectives: "rank 0: 4 all_reduce; ranks 1, 2: none"."""
    groups: dict[str, list[int]] = {}
    for rank in sorted(calls):
        counted = Counter(calls[rank])
        text = ", ".join(f"{n} {op}" for op, n in counted.items()) or "none"
        groups.setdefault(text, []).append(rank)
    return "; ".join(f"rank{'s' * (len(r) > 1)} {', '.join(map(str, r))}: {text}" for text, r in groups.items())


def _gradients_failure(folder: Path, nproc: int, codes, lines, exercise: str) -> NotYet:
    """The one line for a run of the attendee's function that did not end in a comparison on every rank."""
    from ..parallel.failures import LOST_PEER

    records = {r: json.loads((folder / f"rank{r}.json").read_text()) for r in range(nproc)
               if (folder / f"rank{r}.json").exists()}
    errors = sorted((r for r in records.values() if r.get("error")), key=lambda r: r["time"])
    first = next((r for r in errors if not LOST_PEER.search(r["error"])), None)
    calls = {r: _started_calls(folder, r) for r in range(nproc)}
    stopped = {r.get("stopped") for r in records.values()}
    if first is None and ("mismatch" in stopped or len({tuple(c) for c in calls.values()}) > 1):
        return NotYet(f"✗ {exercise}: the ranks made different collective calls ({_collective_summary(calls)}): a "
                      "collective completes only when every rank makes it, so a rank waited for the others forever.",
                      "make the same calls on every rank, in the same order: no dist.all_reduce inside "
                      "`if dist.get_rank() == 0:`.")
    first = first or (errors[0] if errors else None)
    if first is not None:
        where = f" on line {first['line']} (`{short(first['code'], 80)}`)" if first.get("line") else ""
        hint = ("on the ranks your function sees torch and dist, not the notebook's other variables: get what it "
                "needs inside it (dist.get_world_size())." if first["error_type"] == "NameError"
                else "that line of your function raised it; fix it and run the exercise cell again.")
        lost = [str(r) for r in sorted(records) if r != first["rank"] and LOST_PEER.search(records[r].get("error", ""))]
        failed = [str(r) for r in sorted(records) if r != first["rank"] and records[r].get("error")
                  and str(r) not in lost]
        then = "".join(f"; rank{'s' * (len(ranks) > 1)} {', '.join(ranks)} {what}"
                       for ranks, what in ((failed, "failed too"), (lost, "lost their connection to it")) if ranks)
        return NotYet(f"✗ {exercise}: your function raised {first['error']} on rank {first['rank']}{where}{then}.",
                      hint)
    if "timeout" in stopped:
        late = [str(r) for r in range(nproc) if not (folder / f"rank{r}.done").exists()]
        return NotYet(f"✗ {exercise}: rank(s) {', '.join(late)} did not finish your function within "
                      f"{GRADIENTS_WAIT_S} s.",
                      "the function should take milliseconds: look for a loop that never ends.")
    cause = root_cause(lines, nproc, folder / TORCHRUN_LOGS)
    print(cause.last_lines_text() if cause else "\n".join(["--- the last lines of the output:", *lines[-6:]]))
    return NotYet(f"✗ {exercise}: the ranks failed outside your function: "
                  f"{cause.line if cause else (lines or ['(no output)'])[-1].strip()}",
                  "the lines above show the error.")


@checked
def check_average_gradients(average_gradients, workdir, nproc: int = 3, timeout_s: float = 180,
                            exercise: str = GRADIENTS_EXERCISE) -> dict:
    """Run ``average_gradients(model)`` on ``nproc`` ranks under torchrun; its gradients must be DDP's.

    Every rank computes the gradients of one small model on its own batch, calls the attendee's
    function on them, then lets DDP do the same from the same start. Passes when both agree on
    every rank; otherwise names what the result looks like (a sum, this rank's own gradients, a
    division by a number that is not the world size). Three ranks by default, so that a world size
    typed in as 2 is wrong. An error in the function is its line and the error; collectives that only
    some ranks make are named as such, from the calls each rank started.
    """
    require_answered(average_gradients, exercise, "`average_gradients` is still the placeholder.",
                     "define the function in the exercise cell and run it.")
    require(callable(average_gradients), exercise, "`average_gradients` is not a function.",
            "define it with def average_gradients(model): ...")
    source, name = _function_source(average_gradients, exercise)
    if _placeholder_body(source):
        raise Unsolved(f"… {exercise}: not yet solved: `average_gradients` still has only `...` in its body.",
                       "for every parameter: dist.all_reduce(p.grad), then divide by dist.get_world_size().")
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
        raise _gradients_failure(folder, nproc, codes, lines, exercise)
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
        require(False, exercise, f"your gradients differ from DDP's by up to {worst['to_ddp']:.2g}.",
                "every parameter's gradient: summed over the ranks, divided by the world size.")
    buckets = results[0]["ddp_buckets"]
    kinds = Counter(calls)
    made = f"{len(calls)} all-reduce call(s)" if set(kinds) == {"all_reduce"} else \
        f"{len(calls)} collective call(s) ({', '.join(f'{n} {op}' for op, n in kinds.items())})"
    passed(exercise, f"equal to DDP's on all {nproc} ranks; your function made {made}" +
           (f", DDP made {buckets}: it packs the gradients into buckets" if buckets else ""))
    return {"calls": kinds.get("all_reduce", 0), "collectives": len(calls), "ddp_buckets": buckets,
            "max_difference": worst["to_ddp"]}


# ---------------------------------------------------------------- the cost model at 64 GPUs


@checked
def check_ddp_efficiency(efficiency, step_s: float, grad_bytes: float, world_size: int = 64,
                         gpus_per_node: int = 8, exercise: str = EFFICIENCY_EXERCISE) -> float:
    """The weak-scaling efficiency without overlap at ``world_size`` GPUs, from ``predict_scaling``'s model.

    The ring crosses the nodes' InfiniBand beyond one node (NVLink within it); the gradients
    travel in DDP's buckets, one all-reduce each. The mistakes it names: the link inside a
    node, one message in place of the buckets, the overlapped bound, a percentage, a ring of
    p-1 steps, and microseconds or GB/s left unconverted. Answers are compared through the
    communication time they imply, step x (1/efficiency - 1): near an efficiency of 1 and near 0
    alike, the mistakes' efficiencies can agree to many digits, their communication times do not.
    """
    value = number(efficiency, exercise, "efficiency_64", "one number, a fraction")
    if not (step_s > 0 and grad_bytes > 0 and world_size >= 2 and gpus_per_node >= 1):
        raise WorkshopError(f"{exercise}: step_s, grad_bytes, world_size and gpus_per_node must be positive "
                            "(world_size 2 or more).", "pass the inputs of the exercise's cell.")
    within, between = LINKS["nvlink4"], LINKS["ib_ndr"]
    row = predict_scaling(step_s, grad_bytes, [world_size], within, between, gpus_per_node).iloc[0]
    right = float(row.efficiency_no_overlap)
    link = between if world_size > gpus_per_node else within
    buckets = ddp_buckets(grad_bytes)

    def efficiency_with(comm_s: float) -> float:
        return step_s / (step_s + comm_s)

    def ring(n: float, lat_s: float, bytes_per_s: float, steps: float) -> float:
        return steps * lat_s + steps / world_size * n / bytes_per_s

    p, lat, bw = world_size, link.latency_us * 1e-6, link.bandwidth_gbps * 1e9
    mistakes = [
        (efficiency_with(sum(ring_all_reduce_s(b, p, within) for b in buckets)),
         "that is NVLink's figure, the link inside a node.",
         f"{p} GPUs fill {math.ceil(p / gpus_per_node)} nodes: the ring crosses InfiniBand (wu.LINKS['ib_ndr']), "
         "its slowest link, which sets the pace."),
        (efficiency_with(ring_all_reduce_s(grad_bytes, p, link)),
         "the gradients went as one message.", "DDP sends one all-reduce per bucket (wu.ddp_buckets(grad_bytes)); "
         "each pays the latency."),
        (float(row.efficiency_overlap), "that is the bound with overlap.",
         "this exercise asks for no overlap: every bucket's all-reduce after the backward pass."),
        (100 * right, "that looks like a percentage.", "give the efficiency as a fraction (0.85, not 85)."),
        (efficiency_with(sum(ring(b, lat, bw, p - 1) for b in buckets)), "a ring all-reduce takes 2(p-1) steps.",
         "it is a reduce-scatter (p-1 steps) followed by an all-gather (p-1 steps)."),
        (efficiency_with(sum(ring(b, link.latency_us, bw, 2 * (p - 1)) for b in buckets)),
         "the latency went in as seconds.", "latency_us is in microseconds: multiply by 1e-6."),
        (efficiency_with(sum(ring(b, lat, link.bandwidth_gbps, 2 * (p - 1)) for b in buckets)),
         "the bandwidth went in as bytes per second.", "bandwidth_gbps is in GB/s: multiply by 1e9."),
    ]

    def same(a: float, b: float) -> bool:  # the communication time per step each efficiency implies
        if a <= 0 or b <= 0:
            return a == b
        return math.isclose(1 / a - 1, 1 / b - 1, rel_tol=1e-3, abs_tol=1e-12)

    verdict(value, right, exercise, "efficiency_64", mistakes,
            "efficiency = step / (step + the buckets' ring all-reduce times); "
            "t(n, p) = 2(p-1) latency + 2(p-1)/p n / bandwidth.", same=same,
            limits=[(0 < value <= 1, "an efficiency is a fraction between 0 and 1.",
                     "efficiency = step / (step + communication).")])
    passed(exercise, f"{right:.1%} at {world_size} GPUs without overlap, over {link.name.split(',')[0]}")
    return right


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
