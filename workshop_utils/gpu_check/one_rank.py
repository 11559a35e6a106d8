"""The multi-GPU code on one GPU: each part in its own process, in a process group of one rank over NCCL
(gloo in a CPU rehearsal).

A node with one GPU cannot run the two-GPU paths, yet every CUDA, NCCL and DTensor call they make runs in a
group of one: NCCL's communicator set-up, DDP's buckets and comm hooks in bf16, FSDP2's ``fully_shard`` with a
bf16 policy, ``parallelize_module``'s plan on the GPT, DCP's save, async_save and load, the collectives and
their timers, the pipeline's schedule. What a group of one cannot show, each verdict says: nothing crosses a
link, so there is no scaling to see, no communication cost and no overlap of it with compute.

    python -m workshop_utils.gpu_check.one_rank PART --device cuda --folder DIR --out FILE

runs one part (the GPU check starts it, one process per part, so a part that hangs or breaks NCCL costs only
its own verdict) and writes ``{"line": ...}`` or ``{"failed": ...}`` to FILE.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from .context import Context, Failed, GpuPath

NOTHING_SENT = "a group of one sends nothing, so "


@dataclass(frozen=True)
class OneRankPart:
    name: str
    what: str
    covers: tuple[str, ...]
    run: Callable[[torch.device, Path], str]  # in the group of one; returns what it measured, in one line
    cannot_show: str  # what one rank cannot show, said in the verdict


def _ddp(device: torch.device, folder: Path) -> str:
    from ..parallel.overlap import measure_overlap

    gpu = device.type == "cuda"
    record = measure_overlap(size="gpt2-small" if gpu else "tiny", batch=8 if gpu else 2, sequence=1024 if gpu else 64,
                             repeats=3, warmup=1, trace=str(folder / "ddp_overlap.json"), device=device)
    rows = ", ".join(f"{r['bucket_cap_mb']:g} MiB: {r['buckets']} buckets, backward {r['compute_ms']:.1f} ms"
                     for r in record["rows"])
    return f"DDP on {record['model']} in {record['precision']}, comm hooks per bucket: {rows}; one backward traced"


def _fsdp(device: torch.device, folder: Path) -> str:
    from ..parallel.sharding import compare_ddp_fsdp

    record = compare_ddp_fsdp(steps=4, batch_size=32, train_size=256, device=device)
    ddp, fsdp = record["losses"]["DDP"], record["losses"]["FSDP"]
    gap = max(abs(a - b) for a, b in zip(ddp, fsdp))
    if not gap < 1e-3:
        raise Failed(f"FSDP2's losses differ from DDP's by {gap:.1e} on the same batches")
    return f"DDP and FSDP2 trained {record['model']} {record['steps']} steps alike: largest loss gap {gap:.1e}"


def _gpt_parallel(device: torch.device, folder: Path) -> str:
    from ..parallel.gpt_parallel import compare_gpt_parallel

    gpu = device.type == "cuda"
    record = compare_gpt_parallel(size="gpt2-small" if gpu else "tiny", steps=2, batch=4, sequence=256 if gpu else 64,
                                  device=device)
    gaps = ", ".join(f"{name} {gap:.1e}" for name, gap in record["weight_gap"].items())
    # The bf16 policy computes in bf16: its weights drift by a few percent of how far they moved; fp32 ones must not.
    if any(not gap < 1e-2 for name, gap in record["weight_gap"].items() if "bf16" not in name):
        raise Failed(f"weights drifted from the unsharded model's: {gaps}")
    return f"{record['model']}: FSDP2 (fp32 and bf16 policy) and the tensor-parallel plan against one model: {gaps}"


def _tensor_parallel(device: torch.device, folder: Path) -> str:
    from ..parallel.tensor_parallel import check_tensor_parallel

    size = dict(batch=4096, features=4096, hidden=16384) if device.type == "cuda" else {}
    record = check_tensor_parallel(**size, device=device)
    worst = max(record["rows"], key=lambda r: r["max_abs_difference"] / max(r["scale"], 1e-30))
    return (f"{len(record['rows'])} splits of a {record['features']}x{record['hidden']} MLP: largest difference "
            f"{worst['max_abs_difference']:.1e} ({worst['split']})")


def _collectives(device: torch.device, folder: Path) -> str:
    from ..parallel.collectives import measure_all_reduce, show_collectives, time_collectives

    shown = show_collectives(device)
    timed = time_collectives([4096, 1 << 20], repeats=3, device=device)
    swept = measure_all_reduce([4096, 1 << 20, 16 << 20], repeats=3, device=device)
    return (f"{len(shown)} collectives shown, {len(timed)} timed, notebook 02's all-reduce sweep over "
            f"{len(swept)} sizes")


def _pipeline(device: torch.device, folder: Path) -> str:
    from ..parallel.pipeline import measure_bubble

    gpu = device.type == "cuda"
    record = measure_bubble((1, 2), batch=256 if gpu else 32, width=1024 if gpu else 128, repeats=2, device=device)
    return (f"one stage, micro-batches 1 and 2: largest gradient difference from the unsplit model "
            f"{record['gradient_max_abs_difference']:.1e}")


def _checkpoint(device: torch.device, folder: Path) -> str:
    from ..parallel.dist_checkpoint import checkpoint_stall, sharded_round_trip

    trip = sharded_round_trip(folder / "dcp-round-trip", steps=2, device=device)
    if not trip["parameters_equal"]:
        raise Failed("the parameters loaded from the DCP checkpoint are not the ones saved")
    stall = checkpoint_stall(folder / "dcp-stall", steps=4, every=2, device=device)
    blocked = ", ".join(f"{r['mode']} {r['blocked_ms_per_save']:.0f} ms" for r in stall["rows"] if r["saves"])
    return f"DCP save and load: the same parameters back; the loop blocked per save: {blocked}"


PARTS: tuple[OneRankPart, ...] = (
    OneRankPart("ddp-one-rank", "DDP's buckets and comm hooks on GPT-2 small in bf16, one backward traced",
                ("parallel.overlap:measure_overlap", "parallel.overlap:_trace_one_backward"), _ddp,
                "how much of the all-reduce the backward pass hides"),
    OneRankPart("fsdp2-one-rank", "DDP, ZeRO and FSDP2 on SimpleCNN", ("parallel.sharding:compare_ddp_fsdp",), _fsdp,
                "the memory sharding saves (one rank holds every shard) or what its gathers cost"),
    OneRankPart("gpt-parallel-one-rank", "FSDP2 per block (fp32 and a bf16 policy) and the tensor-parallel plan on "
                "the GPT, against the unsharded model", ("parallel.gpt_parallel:compare_gpt_parallel",),
                _gpt_parallel, "the all-reduces tensor parallelism adds, or a rank holding part of the model"),
    OneRankPart("tensor-parallel-one-rank", "column, row and MLP splits, by hand and by parallelize_module",
                ("parallel.tensor_parallel:check_tensor_parallel",), _tensor_parallel,
                "what the all-gathers and all-reduces of the splits cost"),
    OneRankPart("collectives-one-rank", "the collectives shown and timed; notebook 02's all-reduce sweep",
                ("parallel.collectives:show_collectives", "parallel.collectives:time_collectives",
                 "parallel.collectives:measure_all_reduce"), _collectives,
                "a link's latency and bandwidth"),
    OneRankPart("pipeline-one-rank", "the pipeline schedule on one stage", ("parallel.pipeline:measure_bubble",),
                _pipeline, "the bubble: one stage waits for no other"),
    OneRankPart("distributed-checkpoint-one-rank", "DCP save, async_save and load of an FSDP2 model",
                ("parallel.dist_checkpoint:_device", "parallel.dist_checkpoint:sharded_round_trip",
                 "parallel.dist_checkpoint:checkpoint_stall"), _checkpoint,
                "a checkpoint split over ranks (one rank writes every shard)"),
)
BY_NAME = {part.name: part for part in PARTS}
TIMEOUT_S = 120  # one part, start-up included


def _launch(names: list[str], ctx: Context, timeout_s: float) -> tuple[dict, str]:
    """Run the parts ``names`` in one process group of one, in a process of its own; what each said, and the
    process's last line of output (for a process that ended before a part said anything)."""
    out = ctx.folder / "one_rank" / f"{names[0]}{'-and-more' if len(names) > 1 else ''}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.unlink(missing_ok=True)
    command = [sys.executable, "-m", "workshop_utils.gpu_check.one_rank", *names, "--device", ctx.device.type,
               "--folder", str(out.parent), "--out", str(out)]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout_s)
        last = [line for line in (done.stderr or done.stdout).splitlines() if line.strip()][-1:]
        ending = f"exit status {done.returncode}: {last[0][:300]}" if last else f"exit status {done.returncode}"
    except subprocess.TimeoutExpired:
        ending = f"the process did not end within {timeout_s:.0f} s (a collective waiting for ever?)"
    said = json.loads(out.read_text()) if out.exists() else {}
    return said, ending


def _verdict_detail(part: OneRankPart, said: dict) -> str:
    return f"{said['line']}; {NOTHING_SENT}it cannot show {part.cannot_show}"


def _in_own_process(part: OneRankPart) -> Callable[[Context], str]:
    def run(ctx: Context) -> str:
        said, ending = _launch([part.name], ctx, TIMEOUT_S)
        mine = said.get(part.name, {})
        if "line" in mine:
            return _verdict_detail(part, mine)
        raise Failed(mine.get("failed") or ending)

    return run


def one_rank_paths() -> tuple[GpuPath, ...]:
    """The parts as GPU-check paths (one GPU each, each started in a process of its own)."""
    return tuple(GpuPath(p.name, f"{p.what}, in a process group of one", p.covers, _in_own_process(p), least_s=15)
                 for p in PARTS)


def run_group(paths, ctx: Context, budget_s: float, say=print) -> list:
    """The one-rank ``paths`` in one process (one start-up, one group), each with its own verdict: the GPU run's way,
    where every second of a short GPU slot counts. A part the process never reached says why."""
    from .runner import Verdict

    names = [p.name for p in paths]
    if not names:
        return []
    began = time.monotonic()
    said, ending = _launch(names, ctx, max(1.0, min(budget_s, TIMEOUT_S * len(names))))
    say(f"{len(names)} parts in one process group of one ({ctx.device.type}): {time.monotonic() - began:.1f} s in all, "
        f"the process's start-up included")
    verdicts = []
    for path in paths:
        part, mine = BY_NAME[path.name], said.get(path.name, {})
        if "line" in mine:
            verdict = Verdict(path.name, path.what, "ok", _verdict_detail(part, mine), mine["seconds"])
        elif "failed" in mine:
            verdict = Verdict(path.name, path.what, "failed", mine["failed"], mine["seconds"])
        else:
            verdict = Verdict(path.name, path.what, "not reached" if "did not end" in ending else "failed",
                              f"the group of one ended before this part: {ending}")
        verdicts.append(verdict)
        say(verdict.line())
    return verdicts


def _group(device: torch.device) -> None:
    import torch.distributed as dist

    from ..parallel.launch import free_port

    if device.type == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group("nccl" if device.type == "cuda" else "gloo", init_method=f"tcp://127.0.0.1:{free_port()}",
                            rank=0, world_size=1, device_id=device if device.type == "cuda" else None)


def main(argv=None) -> int:
    import torch.distributed as dist

    from .runner import first_line

    parser = argparse.ArgumentParser(prog="python -m workshop_utils.gpu_check.one_rank", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("parts", nargs="+", choices=list(BY_NAME), metavar="PART")
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--folder", default=None, help="for the parts' files (default: a temporary folder)")
    parser.add_argument("--out", required=True, help="JSON file: what each part said, written after each")
    args = parser.parse_args(argv)
    device = torch.device("cuda", 0) if args.device == "cuda" else torch.device("cpu")
    folder = Path(args.folder or tempfile.mkdtemp(prefix="one-rank-"))
    said = {}
    try:
        _group(device)
        for name in args.parts:
            began = time.perf_counter()
            try:
                (folder / name).mkdir(parents=True, exist_ok=True)
                said[name] = {"line": BY_NAME[name].run(device, folder / name)}
            except Exception as err:  # the part's verdict, for the check to show in one line; the next part runs
                said[name] = {"failed": str(err) if isinstance(err, Failed) else first_line(err)}
            said[name]["seconds"] = round(time.perf_counter() - began, 1)
            Path(args.out).write_text(json.dumps(said))
    except Exception as err:  # the group itself did not form: every part says so
        said = {name: {"failed": f"no process group of one: {first_line(err)}", "seconds": 0.0} for name in args.parts}
        Path(args.out).write_text(json.dumps(said))
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
    return 0 if all("line" in s for s in said.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
