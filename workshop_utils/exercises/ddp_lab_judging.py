"""Judging the DDP lab's run: each part's first mistake in what the probe recorded on every rank (the launch line
is ``ddp_lab_launch``'s; ``ddp_lab`` judges a crash)."""

from __future__ import annotations

import ast
from dataclasses import dataclass, field
from pathlib import Path

from .ddp_lab_files import LAB_EXERCISE, LOSS_LINE, THROUGHPUT, read_output, reported_throughput
from .exercise_cells import NotYet, require
from .exercise_judging import short


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
    """Lines that still hold the placeholder ``...``: not an index (``images[...]``, ``tuple[int, ...]``)."""
    try:
        tree = ast.parse(source)
    except SyntaxError as err:
        raise NotYet(f"✗ {exercise}: the script does not parse (line {err.lineno}: {err.msg}).",
                     "fix that line; the notebook's file browser opens the file.") from None
    indices = {id(n) for s in ast.walk(tree) if isinstance(s, ast.Subscript) for n in ast.walk(s.slice)}
    return sorted({n.lineno for n in ast.walk(tree) if isinstance(n, ast.Constant) and n.value is Ellipsis
                   and id(n) not in indices})


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
    """(at least, at most) the job's samples per second, as the probe saw them: from the first draw to the script's
    end, or to about one step after the last draw (a loader with workers draws ahead)."""
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


def sampler_mistake(records: list[dict], exercise: str) -> NotYet | None:
    """The first DistributedSampler given another rank or world size than its process's, named by what it was given
    (LOCAL_RANK, LOCAL_WORLD_SIZE); recorded before the sampler ran, so that one that refused them is named too."""
    for given, local, what in (("rank", "LOCAL_RANK", "rank"), ("num_replicas", "LOCAL_WORLD_SIZE", "world size")):
        wrong = [(r, s[given]) for r in records for s in r.get("samplers", [])
                 if s[given] not in (None, r["rank"] if given == "rank" else int(r["env"]["WORLD_SIZE"]))]
        if wrong:
            named = f", its {local} (counted on its own node)" if all(
                str(v) == r["env"].get(local) for r, v in wrong) else ""
            return NotYet(f"✗ {exercise}: rank {wrong[0][0]['rank']}'s DistributedSampler was given {given}="
                          f"{wrong[0][1]}{named}, which is not its global {what} (the check runs your script as two "
                          "nodes): the shards overlap or leave samples out.",
                          "take the rank and the world size from RANK and WORLD_SIZE, which count every node's "
                          "processes; LOCAL_RANK only picks the GPU (step 1).")
    return None


def _data(records, params, out_dir, nproc, facts):
    """A shard per rank (the sampler given the global rank and world size), reshuffled every epoch."""
    epochs = [[e["indices"] for e in _training_entries(r)] for r in records]
    empty = next((rank for rank, mine in enumerate(epochs) if not mine or not mine[0]), None)
    if empty is not None:
        yield f"rank {empty} drew no samples from a DataLoader.", "train from a DataLoader over the dataset (step 3)."
        return
    if min(len(e) for e in epochs) < 2:
        yield ("the run trained one epoch: a reshuffle cannot be seen.",
               "run at least 2 epochs (the script's default is 3).")
        return
    first = [set(e[0]) for e in epochs]
    shares = ((len(first[0] & first[rank]) / max(1, min(len(first[0]), len(first[rank]))), rank)
              for rank in range(1, nproc))
    shared, rank = next(((share, rank) for share, rank in shares if share > 0.1), (0, 0))
    if shared:
        yield (f"ranks 0 and {rank} share {shared:.0%} of their samples in epoch 0"
               + (": every rank read the whole data set." if shared >= 0.9 else "."),
               "give the DataLoader a DistributedSampler(dataset) in place of shuffle=True, with the same seed on "
               "every rank, so that the shards split one permutation (step 3).")
    same = next((rank for rank, mine in enumerate(epochs) if mine[0] == mine[1]), None)
    if same is not None:
        yield (f"rank {same} read its shard in the same order in epochs 0 and 1: "
               + ("the sampler never reshuffled." if same == 0 else "its sampler never reshuffled, though rank 0's "
                  "did."), "call sampler.set_epoch(epoch) at the start of every epoch on every rank (step 5), with "
               "shuffle=True in the sampler.")
    apart = not shared and same is None  # apart in epoch 0, and each rank reshuffled: apart in every epoch?
    for epoch in range(1, min(map(len, epochs)) * apart):
        shards = [set(e[epoch]) for e in epochs]
        later = next(((len(shards[a] & shards[b]) / max(1, min(len(shards[a]), len(shards[b]))), a, b)
                      for a in range(nproc) for b in range(a + 1, nproc)
                      if len(shards[a] & shards[b]) > 0.1 * min(len(shards[a]), len(shards[b]))), None)
        if later:
            yield (f"ranks {later[1]} and {later[2]} share {later[0]:.0%} of their samples in epoch {epoch}, "
                   "though not in epoch 0: their samplers reshuffled with different epochs.",
                   "call sampler.set_epoch(epoch) with the same epoch on every rank, at the start of every epoch "
                   "(step 5): the shards split one permutation only where every rank's is the same.")
            break
    facts["samples_per_rank"] = len(epochs[0][0])


def _model(records, params, out_dir, nproc, facts):
    """Wrapped in DDP, so that every rank ends with the same parameters."""
    if not all(params) or len({len(p) for p in params}) != 1:
        yield ("no parameters to compare: no torch.optim optimizer (and no DDP model) was found.",
               "train with a torch.optim optimizer over the model's parameters.")
        return
    gap = max(float((a - b).abs().max()) for rank in range(1, nproc) for a, b in zip(params[0], params[rank]))
    wrapped = all(r["ddp"] for r in records)
    if gap > 1e-6 * max(1.0, max(float(p.abs().max()) for p in params[0])) or not wrapped:
        yield (("" if wrapped else "the model was not wrapped in DistributedDataParallel; ")
               + f"the ranks' parameters differ by up to {gap:.2g} after training.",
               "wrap the model, ddp_model = DDP(model, device_ids=[local_rank] on a GPU, else None), and run the "
               "forward pass through ddp_model (step 4).")
    facts["backend"] = records[0]["backend"]


def _checkpoint(records, params, out_dir, nproc, facts):
    """One file, by rank 0, holding the trained weights."""
    import torch

    savers = [r["rank"] for r in records if r["saves"]]
    if savers != [0]:
        who = ("every rank" if len(savers) == len(records) else f"{len(savers)} ranks" if len(savers) > 1 else
               f"only rank {savers[0]}" if savers else "no rank")
        yield (f"{who} saved a checkpoint" + (f" (ranks {', '.join(map(str, savers))} called torch.save)."
                                              if len(savers) > 1 else "."),
               "save on global rank 0 alone, into args.out_dir: if rank == 0: torch.save(...), rank from RANK "
               "(steps 1 and 8).")
        return
    files = sorted(p for p in out_dir.rglob("*") if p.is_file()) if out_dir.exists() else []
    if len(files) != 1:
        yield (f"torch.save wrote {records[0]['saves'][0]}, not into the --out-dir folder." if not files else
               f"{len(files)} files were written ({', '.join(p.name for p in files)}).",
               "save one file, once, into Path(args.out_dir).")
        return
    try:
        state = _state_dict(torch.load(files[0], map_location="cpu", weights_only=True)) or {}
    except Exception:  # noqa: BLE001 - any unreadable checkpoint gets the same advice
        state = {}
    wrapped = next((k for k in state if k.startswith("module.")), None)
    saved = [t.float() for t in state.values()]
    if wrapped:
        yield (f"{files[0].name} holds the DDP wrapper's state dict: its keys carry DDP's `module.` prefix "
               f"({short(wrapped, 40)}), which the plain model does not load.",
               "save ddp_model.module.state_dict() (or model.state_dict()) (step 8).")
    elif not state or not all(any(s.shape == p.shape and torch.equal(s, p) for s in saved) for p in params[0]):
        yield (f"{files[0].name} does not hold the trained parameters as the plain model's state dict.",
               "after the training loop, save model.state_dict() or ddp_model.module.state_dict() (step 8).")
    facts["checkpoint"] = files[0]


def _output(records, params, out_dir, nproc, facts):
    """Rank 0 alone logs, and reports the whole job's throughput, near what the ranks drew."""
    outputs = [read_output(out_dir.parent / f"rank{r}.stdout") for r in range(nproc)]
    chatty = [(rank, line) for rank in range(1, nproc) for line in outputs[rank].splitlines()
              if THROUGHPUT.search(line) or LOSS_LINE.search(line)]
    if chatty:
        yield (f"rank {chatty[0][0]} logged too ({chatty[0][1].strip()!r}).",
               "print where the global rank is 0: if rank == 0: print(...), rank from RANK (steps 6 and 7).")
    reported = reported_throughput(outputs[0].splitlines())
    if reported is None:
        yield ("rank 0 printed no throughput.",
               "print e.g. f\"throughput: {seen * world_size / elapsed:.0f} samples/s\" on rank 0 (step 7).")
        return
    low, high = _measured_throughput(records)

    def near(rate: float) -> bool:
        return low / THROUGHPUT_TOLERANCE <= rate <= high * THROUGHPUT_TOLERANCE

    if not near(reported):
        yield (f"the reported throughput, {reported:.0f} samples/s, is far from the about {high:.0f} samples/s the "
               f"{nproc} ranks drew ({reported / high:.2g}x)" + (": it is one rank's." if near(reported * nproc)
                                                                  else "."),
               "count every rank's samples once, over the training loop's time: seen * world_size / elapsed, "
               "world_size from WORLD_SIZE (LOCAL_WORLD_SIZE counts one node's) (step 7).")
    facts["reported"], facts["measured"] = reported, high


def _end(records, params, out_dir, nproc, facts):
    """The process group closed."""
    open_ranks = [str(r["rank"]) for r in records if not r["torn_down"]]
    if open_ranks:
        yield (f"the script ended with the process group still open (rank(s) {', '.join(open_ranks)}).",
               "end with dist.destroy_process_group() (step 9).")


def findings(records: list[dict], params: list, out_dir: Path, per_node: tuple[int, ...], exercise: str,
             facts: dict | None = None) -> list[NotYet]:
    """Every mistake a finished run shows, in the order an attendee meets them (a part stops at a mistake the
    rest of it depends on); [] when right."""
    facts = {} if facts is None else facts
    world, nproc = records[0]["env"].get("WORLD_SIZE"), sum(per_node)
    require(len(records) == nproc and world == str(nproc), exercise,
            f"{len(records)} process(es) ran (WORLD_SIZE={world}); the check runs {nproc}, "
            f"{' + '.join(map(str, per_node))} on two nodes.", f"launch with torchrun --nproc-per-node={per_node[0]}.")
    sampler = sampler_mistake(records, exercise)
    found = [sampler] if sampler else []
    for part in ((_model, _checkpoint, _output, _end) if sampler else (_data, _model, _checkpoint, _output, _end)):
        found += [NotYet(f"✗ {exercise}: {problem}", fix) for problem, fix in part(records, params, out_dir, nproc,
                                                                                   facts)]
    return found
