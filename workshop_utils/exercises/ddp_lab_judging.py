"""Reading and judging one run of the DDP lab: the attendee's launch line, as torchrun itself reads it, then what
the probe recorded on every rank. ``findings`` gives each part of a finished run (the data, the model, the
checkpoint, the output, the end) its first mistake, in the order an attendee makes them: one run shows every
part's. A run that crashed is judged in ``ddp_lab``, which knows the crash's ranks.
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import io
import os
import re
import shlex
import sys
from dataclasses import dataclass, field
from pathlib import Path

from .ddp_lab_files import LAB_EXERCISE, LOSS_LINE, THROUGHPUT, read_output, reported_throughput
from .exercise_cells import NotYet, require
from .exercise_judging import short

CHAINS = ("&&", ";", "||", "|", "&")  # shell operators that put a second command beside the launch
TORCH_LAUNCHERS = ("torch.distributed.run", "torch.distributed.launch")  # what `python -m` may name for torchrun


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


@dataclass
class LaunchLine:
    """The attendee's torchrun line as the check runs it: the script's own arguments, and the ``VAR=value`` words
    in front of it (set for the launch, as the shell would)."""

    script_args: list[str]
    assigned: dict[str, str]


def placeholders_left(source: str, exercise: str = LAB_EXERCISE) -> list[int]:
    """Lines that still hold the placeholder ``...``."""
    try:
        tree = ast.parse(source)
    except SyntaxError as err:
        raise NotYet(f"✗ {exercise}: the script does not parse (line {err.lineno}: {err.msg}).",
                     "fix that line; the notebook's file browser opens the file.") from None
    return sorted({n.lineno for n in ast.walk(tree) if isinstance(n, ast.Constant) and n.value is Ellipsis})


def torchrun_reads(args: list[str], launch: bool = False) -> argparse.Namespace:
    """``args`` as torchrun's own parser reads them (with ``--use-env``, which ``torch.distributed.launch`` adds to
    it; ``nproc_per_node`` None where no option gave it); ``ValueError`` with torchrun's message where it would
    stop."""
    from torch.distributed.run import get_args_parser

    parser = get_args_parser()
    parser.set_defaults(nproc_per_node=None)
    if launch:
        parser.add_argument("--use-env", "--use_env", default=False, action="store_true")

    def refuse(message=None, *_):
        raise ValueError(message or "stopped")

    parser.error, parser.exit = refuse, lambda status=0, message=None: refuse(message)
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        return parser.parse_args(args)


def example_line(nproc: int, script: Path) -> str:
    """The notebook's launch line, as a fix shows it: the path quoted for the shell where it needs quoting (a space)."""
    path = "{shlex.quote(str(lab_file))}" if shlex.quote(str(script)) != str(script) else "{lab_file}"
    return f"f\"torchrun --nproc-per-node={nproc} {path}\""


def read_launch_line(command, script: Path, nproc: int, exercise: str = LAB_EXERCISE) -> LaunchLine:
    """The attendee's launch line, read before anything starts: as a shell splits it, then as torchrun reads its
    options. One line names what would not launch the lab as asked."""
    example = example_line(nproc, script)
    require(isinstance(command, (str, list, tuple)), exercise,
            f"`lab_command` = {short(repr(command), 40)} cannot be read as a command line: it must be a text "
            f"(a str), not {type(command).__name__}.", f"write the launch line in quotes, e.g. {example}.")
    try:
        tokens = (_words(command.strip().lstrip("!").strip()) if isinstance(command, str)
                  else [os.fspath(t) for t in command])
    except (ValueError, TypeError) as err:
        raise NotYet(f"✗ {exercise}: the command cannot be read as a command line ({err}).",
                     f"write it as one string, e.g. {example}.") from None
    require(bool(tokens), exercise, "the command is empty.", f"write the launch line, e.g. {example}.")
    text = command if isinstance(command, str) else " ".join(tokens)
    quoted = shlex.quote(str(script))
    braces = re.search(r"(?<!\$)\{[A-Za-z_][^{}]*\}", text)  # {lab_file} left in; ${VAR} is the shell's
    redirect = next((t for t in tokens if set(t) <= set("<>&|0123456789") and ("<" in t or ">" in t)), None)
    expanded = next((t for t in (text.split() if isinstance(command, str) else tokens) if "$" in t or "`" in t), None)
    for found, problem, fix in (  # what a shell would do to the line, which the check, running no shell, does not
            (braces, f"the command holds {braces and braces.group(0)} as written: the f in front of the quotes, "
                     "which puts the value in, is missing.", f"write it as an f-string: {example}."),
            (quoted != str(script) and str(script) in text and str(script) not in tokens,
             f"the path of your script ({quoted}) holds a space or another character the shell splits at: "
             "unquoted, torchrun would get it as several words.", f"quote it for the shell: {example}."),
            (redirect, f"the command redirects ({redirect}): the check reads the ranks' output itself and runs the "
                       "launch without a shell.", f"leave the redirection out, e.g. {example}."),
            (expanded, f"the command holds a shell expansion ({short(expanded or '', 40)}), which the check does "
                       "not run through a shell.",
             f"write the values themselves, e.g. {example} (an f-string puts Python's values in).")):
        require(not found, exercise, problem, fix)
    tokens, folder, chained, assigned = _launch_part(tokens)
    require(not chained, exercise, f"the command chains a second command after the launch "
                                   f"({short(' '.join(chained), 60)}); the check runs the one torchrun launch alone.",
            f"make it the launch line only, e.g. {example}, without &&, ;, || or |; run anything else in a cell "
            "of its own.")
    require(bool(tokens), exercise, "the command has no launch line after its prefixes.",
            f"write the launch line, e.g. {example}.")
    first = Path(tokens[0]).name
    module = tokens[2] if tokens[1:2] == ["-m"] and len(tokens) > 2 else None
    python = first.startswith("python") or tokens[0] == sys.executable
    require(first == "torchrun" or python, exercise, f"the command starts with {tokens[0]!r}.",
            f"start it with torchrun: {example}.")
    require(first == "torchrun" or module in TORCH_LAUNCHERS, exercise,
            f"`{first}` starts one process and sets none of torchrun's variables (RANK, LOCAL_RANK, WORLD_SIZE): "
            f"one process would train alone, not the lab's {nproc}.",
            f"launch it with torchrun, which starts the processes and sets those variables in each: {example}.")
    launcher, rest = (module or "torchrun"), tokens[1 if first == "torchrun" else 3:]
    require(any(t.endswith(".py") for t in rest), exercise, "the command names no .py script.",
            f"put your script's path after the launcher's options: torchrun --nproc-per-node={nproc} {quoted}.")

    def yours(word: str) -> bool:
        named = Path(word).expanduser()
        return (named if named.is_absolute() or folder is None else Path(folder).expanduser() / named).resolve() \
            == script.resolve()

    try:  # as torchrun itself reads its options: the last of a repeated one, abbreviations, ambiguities
        parsed = torchrun_reads(rest, launch=launcher == "torch.distributed.launch")
    except ValueError as refusal:
        raise NotYet(f"✗ {exercise}: torchrun would stop at once: {short(str(refusal), 160)}.",
                     f"write its options in full: torchrun --nproc-per-node={nproc} {quoted}.") from None
    if not yours(parsed.training_script):
        shown = Path(parsed.training_script).name
        require(not (parsed.no_python and shown.startswith("python") and any(map(yours, parsed.training_script_args))),
                exercise, f"--no-python makes torchrun run {shown!r} as a program with your file: that line runs, "
                          "but the check starts your script as torchrun does without it.",
                f"drop --no-python and {shown!r}: torchrun --nproc-per-node={nproc} {quoted}.")
        if shown.endswith(".py"):
            raise NotYet(f"✗ {exercise}: the command runs {shlex.quote(parsed.training_script)}, not your lab script.",
                         f"name the file you edited: {quoted}.")
        raise NotYet(f"✗ {exercise}: torchrun runs its first word after the options, {shown!r}, as the training "
                     f"script, and hands it your file as an argument.",
                     "name only your script after torchrun's options: torchrun starts it with Python itself."
                     if shown.startswith("python") else f"write the launch line as {example}.")
    require(launcher != "torch.distributed.launch" or parsed.use_env, exercise,
            "torch.distributed.launch (the launcher torchrun replaced) passes --local-rank=<n> to the script as an "
            "argument; the lab's script takes no such argument, and its argparse would stop every rank "
            "(\"unrecognized arguments: --local-rank=0\").",
            f"launch with torchrun, which sets LOCAL_RANK in each process's environment instead: {example}.")
    nodes = str(parsed.nnodes)
    require(nodes in ("1", "1:1"), exercise,
            f"--nnodes={nodes}: torchrun would wait for {nodes} nodes to join, and the check runs on this one.",
            f"leave --nnodes out (or --nnodes=1): --nproc-per-node={nproc} on one node.")
    require(int(parsed.node_rank) == 0, exercise,
            f"--node-rank={parsed.node_rank} on a one-node launch: the ranks would wait for a node 0 that never "
            "starts, until the time limit.", "leave --node-rank out: one node is node 0.")
    require(parsed.nproc_per_node is not None, exercise, "torchrun starts one process unless told how many.",
            f"add --nproc-per-node={nproc}.")
    require(str(parsed.nproc_per_node) == str(nproc), exercise,
            f"--nproc-per-node={parsed.nproc_per_node}: the lab runs on {nproc} processes.",
            f"use --nproc-per-node={nproc}.")
    return LaunchLine(list(parsed.training_script_args), assigned)


def _words(line: str) -> list[str]:
    """A shell line's words, its operators apart: "x.py;rm" is three words, as the shell reads it. A backslash
    at a line's end continues it, a word that starts with # starts a comment, and a second line is a second
    command (read as after a ;)."""
    words: list[str] = []
    for part in line.replace("\\\n", " ").split("\n"):
        lexer = shlex.shlex(part, posix=True, punctuation_chars=True)
        lexer.whitespace_split, lexer.commenters = True, ""  # a # inside a word (a#b) is no comment
        tokens = list(lexer)
        tokens = tokens[:next((i for i, t in enumerate(tokens) if t.startswith("#")), len(tokens))]
        words += [";", *tokens] if tokens and words else tokens
    return words


def _launch_part(tokens: list[str]) -> tuple[list[str], str | None, list[str], dict[str, str]]:
    """The launch itself in a line as typed in a terminal or a Slurm script, the folder a ``cd`` moved to, what the
    line chains after the launch (``&&``, ``;``, ``||``, ``|``, ``&``), which the check does not run, and the
    ``VAR=value`` assignments in front of it.

    The launch is the first command that starts torchrun, srun or python (else the last command); what comes before
    it (``cd dir &&``, ``module load ... &&``) is taken off, and so are its ``VAR=value`` words, ``env`` and an
    ``srun ...`` prefix.
    """
    folder, start = None, 0
    for end in [i for i, t in enumerate(tokens) if t in CHAINS] + [len(tokens)]:
        head = tokens[start:end]
        command = next((Path(t).name for t in head if not _assignment(t) and t != "env"), "")
        if command in ("torchrun", "srun") or command.startswith("python") or end == len(tokens):
            break
        if len(head) == 2 and head[0] == "cd":
            moved = Path(head[1]).expanduser()
            folder = str(moved if folder is None or moved.is_absolute() else Path(folder) / moved)
        start = end + 1
    if end < len(tokens):
        return head, folder, tokens[end:], {}  # the launch, then a second command
    assigned = {}
    while head and (head[0] == "env" or _assignment(head[0])):
        word = head.pop(0)
        if _assignment(word):
            name, _, assigned[name] = word.partition("=")
    if head and Path(head[0]).name == "srun":
        launch = [i for i, t in enumerate(head) if Path(t).name == "torchrun" or Path(t).name.startswith("python")]
        head = head[launch[0]:] if launch else head
    return head, folder, [], assigned


def _assignment(word: str) -> bool:
    """``VAR=value`` before a command: the shell sets VAR for it."""
    return "=" in word and not word.startswith("-") and word.split("=")[0].isidentifier()


# ---------------------------------------------------------------- what the ranks did


def _training_entries(record: dict) -> list[dict]:
    """The probe's entries (one per epoch) of the loader that drew the most samples, in order."""
    by_dataset: dict[int, list[dict]] = {}
    for entry in record["epochs"]:
        by_dataset.setdefault(entry["dataset"], []).append(entry)
    return max(by_dataset.values(), key=lambda entries: sum(len(e["indices"]) for e in entries), default=[])


def _state_dict(obj):
    """The model state dict inside a loaded checkpoint (a dict of tensors), or None."""
    import torch

    if not isinstance(obj, dict):
        return None
    if obj and all(isinstance(v, torch.Tensor) for v in obj.values()):
        return obj
    return next((found for value in obj.values() if (found := _state_dict(value)) is not None), None)


# The reported throughput must be within this factor of what the probe saw: one rank's rate (1/nproc of the
# job's, at most 1/2) and any rate counted twice (at least 2x) lie outside it, the right one within a few percent.
THROUGHPUT_TOLERANCE = 1.4


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


def _local_firsts(records: list[dict], ranks: list[int]) -> str:
    """", each the first process (LOCAL_RANK 0) of its node: ..." when ``ranks`` are exactly those, on 2+ nodes."""
    firsts = sorted(r["rank"] for r in records if r["env"].get("LOCAL_RANK") == "0")
    if len(firsts) < 2 or sorted(ranks) != firsts:
        return ""
    return (", each the first process (LOCAL_RANK 0) of its node: a test that lets every rank through, or a "
            "`rank` read from LOCAL_RANK, which is 0 on every node")


def sampler_mistake(records: list[dict], per_node: tuple[int, ...], exercise: str) -> NotYet | None:
    """The first DistributedSampler given another rank or world size than its process's, by what it was given (a
    LOCAL_RANK, a LOCAL_WORLD_SIZE, a number typed in); None when every sampler was given its own. Read from what
    the probe recorded before the sampler ran, so that one that refused its arguments is named too. GROUP_WORLD_SIZE
    is not told apart: on the lab's two nodes it is 2, as a world size typed in for 2 is."""
    layout = f"the check runs your script as two nodes, {' + '.join(map(str, per_node))} processes"
    for r in records:
        env, rank = r["env"], r["rank"]
        for sampler in r.get("samplers", []):
            if sampler["rank"] != rank:
                local = str(sampler["rank"]) == env.get("LOCAL_RANK")
                return NotYet(f"✗ {exercise}: rank {rank}'s DistributedSampler was given rank={sampler['rank']}"
                              + (f", its LOCAL_RANK: torchrun numbers the processes from 0 on every node, so on two "
                                 f"nodes two ranks read the same shard ({layout})." if local else
                                 f", but it is rank {rank}: two ranks read the same shard."),
                              "take the global rank from RANK: rank = int(os.environ['RANK']) for the sampler, the "
                              "logging and the checkpoint; LOCAL_RANK only picks the GPU (step 1).")
    wrong = [(r, s["num_replicas"]) for r in records for s in r.get("samplers", [])
             if s["num_replicas"] != int(r["env"]["WORLD_SIZE"])]
    if not wrong:
        return None
    record, given = wrong[0]
    world = record["env"]["WORLD_SIZE"]
    if all(str(n) == r["env"].get("LOCAL_WORLD_SIZE") for r, n in wrong):
        sizes = sorted({(r["env"].get("GROUP_RANK"), n) for r, n in wrong})
        what = (f"LOCAL_WORLD_SIZE, the processes of one node ("
                f"{', '.join(f'{n} on node {node}' for node, n in sizes)})")
    else:
        what = f"{given}: a world size typed in is right only on that many ranks"
    return NotYet(f"✗ {exercise}: rank {record['rank']}'s DistributedSampler was given num_replicas={what}; the job "
                  f"has {world} ranks ({layout}), so the shards overlap or leave ranks out.",
                  "take the world size from WORLD_SIZE: world_size = int(os.environ['WORLD_SIZE']), every node's "
                  "ranks (step 1).")


def _data(records, params, out_dir, per_node, exercise, facts) -> None:
    """A shard per rank (the sampler given the global rank and world size), reshuffled every epoch."""
    nproc = sum(per_node)
    mistake = sampler_mistake(records, per_node, exercise)
    if mistake is not None:
        raise mistake
    epochs = [[e["indices"] for e in _training_entries(r)] for r in records]
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


def _model(records, params, out_dir, per_node, exercise, facts) -> None:
    """Wrapped in DDP, so that every rank ends with the same parameters."""
    nproc = sum(per_node)
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


def _checkpoint(records, params, out_dir, per_node, exercise, facts) -> None:
    """One file, by rank 0, holding the trained weights."""
    import torch

    savers = [r["rank"] for r in records if r["saves"]]
    who = "every rank" if len(savers) == len(records) else f"{len(savers)} ranks"
    require(not [r for r in savers if r != 0], exercise,
            f"{who} saved a checkpoint (ranks {', '.join(map(str, savers))} called torch.save)"
            f"{_local_firsts(records, savers)}.", "save where the global rank is 0: rank = int(os.environ['RANK']); "
                                                  "if rank == 0: torch.save(...) (steps 1 and 8).")
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
    require(state is not None, exercise, "the checkpoint holds no state dict.", "save model.state_dict() (step 8).")
    require(not any(k.startswith("module.") for k in state), exercise,
            "the checkpoint's keys start with 'module.': it holds the DDP wrapper's state dict.",
            "save the plain model's: model.state_dict() or ddp_model.module.state_dict().")
    saved = [t.float() for t in state.values()]
    missing = [p for p in params[0] if not any(s.shape == p.shape and torch.equal(s, p) for s in saved)]
    require(not missing, exercise, "the checkpoint does not hold the trained parameters.",
            "save after the training loop, the model you trained.")
    facts["checkpoint"] = files[0]


def _output(records, params, out_dir, per_node, exercise, facts) -> None:
    """Rank 0 alone logs, and reports the whole job's throughput, near what the ranks drew."""
    nproc = sum(per_node)
    outputs = [read_output(out_dir.parent / f"rank{r}.stdout") for r in range(nproc)]
    chatty = {rank: [line for line in outputs[rank].splitlines() if THROUGHPUT.search(line) or LOSS_LINE.search(line)]
              for rank in range(1, nproc)}
    loggers = [rank for rank, lines in chatty.items() if lines]
    if loggers:
        raise NotYet(f"✗ {exercise}: rank {loggers[0]} logged too ({chatty[loggers[0]][0].strip()!r})"
                     f"{_local_firsts(records, [0, *loggers])}.",
                     "print where the global rank is 0: if rank == 0: print(...), rank from RANK (steps 6 and 7).")
    reported = reported_throughput(outputs[0].splitlines())
    require(reported is not None, exercise, "rank 0 printed no throughput.",
            "print e.g. f\"throughput: {seen * world_size / elapsed:.0f} samples/s\" on rank 0 (step 7).")
    low, high = _measured_throughput(records)

    def near(rate: float) -> bool:
        return low / THROUGHPUT_TOLERANCE <= rate <= high * THROUGHPUT_TOLERANCE

    if not near(reported):
        require(not near(reported * nproc), exercise,
                f"the reported throughput, {reported:.0f} samples/s, is one rank's: the {nproc} ranks together drew "
                f"about {high:.0f} samples/s.", "count every rank's samples: seen * world_size / elapsed, world_size "
                                                "from WORLD_SIZE (LOCAL_WORLD_SIZE counts one node's) (step 7).")
        raise NotYet(f"✗ {exercise}: the reported throughput, {reported:.0f} samples/s, is far from what the ranks "
                     f"drew: {reported / high:.2g}x their about {high:.0f} samples/s.",
                     "count every rank's samples once, over the training loop's time: seen * world_size / elapsed.")
    facts["reported"], facts["measured"] = reported, high


def _end(records, params, out_dir, per_node, exercise, facts) -> None:
    """The process group closed."""
    open_ranks = [str(r["rank"]) for r in records if not r["torn_down"]]
    require(not open_ranks, exercise, f"the script ended with the process group still open (rank(s) "
            f"{', '.join(open_ranks)}).", "end with dist.destroy_process_group() (step 9).")


PARTS = (_data, _model, _checkpoint, _output, _end)


def findings(records: list[dict], params: list, out_dir: Path, per_node: tuple[int, ...], exercise: str,
             facts: dict | None = None) -> list[NotYet]:
    """The first mistake of each part of a finished run of ``per_node`` processes on each node, in the order an
    attendee meets them; [] when it is right.

    ``facts`` collects what the passing line says (the backend, the shard, the checkpoint, the throughputs).
    """
    facts = {} if facts is None else facts
    world, nproc = records[0]["env"].get("WORLD_SIZE"), sum(per_node)
    require(len(records) == nproc and world == str(nproc), exercise,
            f"{len(records)} process(es) ran (WORLD_SIZE={world}); the check runs {nproc}, "
            f"{' + '.join(map(str, per_node))} on two nodes.", f"launch with torchrun --nproc-per-node={per_node[0]}.")
    found = []
    for part in PARTS:
        try:
            part(records, params, out_dir, per_node, exercise, facts)
        except NotYet as mistake:
            found.append(mistake)
    return found
