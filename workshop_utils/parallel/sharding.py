"""ZeRO and FSDP: stop keeping a full copy of everything on every GPU.

Data parallelism replicates the parameters, the gradients and the optimizer state on every
rank. Adam keeps two moments per parameter, so in fp32 a model of N parameters costs 16 N
bytes on *each* GPU before a single activation is stored. ZeRO (Rajbhandari et al., 2020)
shards these across the p ranks in three stages: the optimizer state (stage 1), then the
gradients (stage 2), then the parameters themselves (stage 3, which is what PyTorch's FSDP
does: parameters are all-gathered just in time for each layer and freed again).

``zero_memory_table`` and ``fewest_gpus`` do the arithmetic; ``compare_ddp_fsdp`` measures it, on every rank of a
torchrun job, by counting the bytes each rank actually holds under DDP and under FSDP2's
``fully_shard``, and records both loss trajectories, which must agree.
"""

from __future__ import annotations

import math
import numbers

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from ..system.errors import WorkshopError

# Bytes per parameter: (parameters, gradients, optimizer state) for Adam.
BYTES_PER_PARAMETER = {
    "fp32": (4, 4, 8),  # fp32 weights and gradients, two fp32 moments
    "mixed": (2, 2, 12),  # bf16/fp16 weights and gradients; fp32 master copy and two fp32 moments (ZeRO paper)
}

# Which of the three a stage shards across the ranks.
ZERO_STAGES = {
    "DDP (replicated)": (False, False, False),
    "ZeRO-1 (optimizer state sharded)": (False, False, True),
    "ZeRO-2 (+ gradients sharded)": (False, True, True),
    "ZeRO-3 / FSDP (+ parameters sharded)": (True, True, True),
}


def zero_memory_table(parameters: int, world_size: int, precision: str = "fp32"):
    """GiB per GPU for parameters, gradients and Adam state under DDP and each ZeRO stage (no activations)."""
    import pandas as pd

    if precision not in BYTES_PER_PARAMETER:
        raise WorkshopError(f"Unknown precision {precision!r}.", f"use one of {sorted(BYTES_PER_PARAMETER)}.")
    if parameters <= 0 or world_size <= 0:
        raise WorkshopError("Parameters and world size must be positive.", "pass e.g. parameters=7e9, world_size=8.")
    rows = []
    for stage, sharded in ZERO_STAGES.items():
        per_gpu = [b * parameters / (world_size if s else 1) / 2**30
                   for b, s in zip(BYTES_PER_PARAMETER[precision], sharded)]
        rows.append({"strategy": stage, "parameters_gib": per_gpu[0], "gradients_gib": per_gpu[1],
                     "optimizer_gib": per_gpu[2], "total_gib": sum(per_gpu)})
    return pd.DataFrame(rows)


def zero_kept_and_sharded_gib(parameters: float, stage: int, precision: str,
                              gib: float = 2**30) -> tuple[float, float]:
    """GiB of parameters, gradients and Adam state a ZeRO stage keeps whole on every GPU, and GiB it shards."""
    if not (isinstance(stage, numbers.Integral) and 0 <= stage < len(ZERO_STAGES)):
        raise WorkshopError(f"stage {stage!r} is no ZeRO stage.", "pass 0 (DDP), 1, 2 or 3.")
    if precision not in BYTES_PER_PARAMETER:
        raise WorkshopError(f"unknown precision {precision!r}.", f"use one of {sorted(BYTES_PER_PARAMETER)}.")
    pairs = list(zip(BYTES_PER_PARAMETER[precision], list(ZERO_STAGES.values())[stage]))
    return (sum(b for b, s in pairs if not s) * parameters / gib, sum(b for b, s in pairs if s) * parameters / gib)


def fewest_gpus(parameters: float, budget_gib: float, stage: int, precision: str = "mixed",
                gib: float = 2**30) -> float:
    """The smallest world size whose share fits ``budget_gib``, ``math.inf`` when none does; ``gib=1e9`` counts GB."""
    kept, split = zero_kept_and_sharded_gib(parameters, stage, precision, gib)
    if kept > budget_gib or (kept == budget_gib and split):
        return math.inf
    gpus = max(1, math.ceil(split / (budget_gib - kept))) if split else 1
    while gpus > 1 and kept + split / (gpus - 1) <= budget_gib:  # the ceil of a rounded quotient may be one off
        gpus -= 1
    while kept + split / gpus > budget_gib:
        gpus += 1
    return gpus


def local_bytes(tensors) -> int:
    """Bytes this rank holds for ``tensors``: a sharded DTensor counts only its local shard."""
    total = 0
    for t in tensors:
        if t is None:
            continue
        local = t.to_local() if hasattr(t, "to_local") else t
        total += local.numel() * local.element_size()
    return total


def held_bytes(model: nn.Module, optimizer: torch.optim.Optimizer) -> dict:
    """What this rank holds right after an optimizer step, in the three ZeRO categories."""
    params = list(model.parameters())
    state = [v for s in optimizer.state.values() for v in s.values() if torch.is_tensor(v) and v.dim() > 0]
    return {"parameters": local_bytes(params), "gradients": local_bytes(p.grad for p in params),
            "optimizer": local_bytes(state)}


def shard_model(model: nn.Module, mesh) -> nn.Module:
    """FSDP2: each top-level child is one unit (gathered, used, freed in turn), then the root."""
    from torch.distributed.fsdp import fully_shard

    for child in model.children():
        for block in (child.children() if isinstance(child, nn.Sequential) else [child]):
            if any(p.requires_grad for p in block.parameters()):
                fully_shard(block, mesh=mesh)
    return fully_shard(model, mesh=mesh)


def train_step(model, optimizer, images, labels, seed: int, rank: int, step: int) -> torch.Tensor:
    """One optimizer step with the training loop's dropout seeding; the gradients stay until the next step."""
    from ..spine.trainer import seed_dropout

    optimizer.zero_grad(set_to_none=True)
    seed_dropout(seed, rank, step)  # the same masks whichever way the model is wrapped
    loss = F.cross_entropy(model(images), labels)
    loss.backward()
    optimizer.step()
    return loss.detach()


def _train(model, batches, steps: int, seed: int, rank: int, lr: float) -> tuple[list[float], dict]:
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    losses, held = [], {}
    for step, (images, labels) in zip(range(steps), batches):
        mean = train_step(model, optimizer, images, labels, seed, rank, step)
        if step == 0:
            held = held_bytes(model, optimizer)  # gradients still present: the peak of the three
        dist.all_reduce(mean)
        losses.append(mean.item() / dist.get_world_size())
    return losses, held


def compare_ddp_fsdp(model_name: str = "simplecnn", steps: int = 8, batch_size: int = 32, lr: float = 1e-3,
                     train_size: int = 1024, seed: int = 0, device=None, data_root=None) -> dict:
    """Train the same model from the same weights on the same batches, once with DDP and once with FSDP.

    Runs on every rank of a process group; returns per-rank bytes held and both loss curves.
    ``device`` None: where the process group's collectives run (this rank's GPU under NCCL).
    """
    from torch.distributed.device_mesh import init_device_mesh
    from torch.nn.parallel import DistributedDataParallel

    from ..spine.data import load_data, make_loader
    from ..spine.distributed import collective_device
    from ..spine.models import build_model, count_parameters

    device = torch.device(device) if device is not None else collective_device()
    rank, world = dist.get_rank(), dist.get_world_size()
    data = load_data(data_root, train_size=train_size, test_size=64, seed=seed, quiet=True)

    def batches():
        loader = make_loader("device", data.train_images, data.train_labels, batch_size, device, train=True,
                             seed=seed, rank=rank, world_size=world)
        epoch = 0
        while True:
            yield from loader.epoch(epoch)
            epoch += 1

    def fresh_model():
        torch.manual_seed(seed)
        return build_model(model_name).to(device)

    results = {}
    ddp = DistributedDataParallel(fresh_model(), device_ids=[device.index] if device.type == "cuda" else None)
    results["DDP"] = _train(ddp, batches(), steps, seed, rank, lr)
    del ddp
    mesh = init_device_mesh(device.type, (world,))
    results["FSDP"] = _train(shard_model(fresh_model(), mesh), batches(), steps, seed, rank, lr)

    everyone = [None] * world
    dist.all_gather_object(everyone, {name: held for name, (_, held) in results.items()})
    rows = [{"strategy": name, "rank": r, **everyone[r][name]} for name in results for r in range(world)]
    for row in rows:
        row["total"] = row["parameters"] + row["gradients"] + row["optimizer"]
    return {"kind": "ddp_vs_fsdp", "model": model_name, "parameters": count_parameters(build_model(model_name)),
            "world_size": world, "steps": steps, "batch_per_rank": batch_size, "data_source": data.source,
            "losses": {name: losses for name, (losses, _) in results.items()}, "held_bytes": rows}


def memory_ratio(record: dict) -> float:
    """FSDP's bytes held per rank over DDP's (the largest rank of each): about 1/p."""
    def largest(strategy):
        return max(r["total"] for r in record["held_bytes"] if r["strategy"] == strategy)

    return largest("FSDP") / largest("DDP")


def plot_held_memory(record: dict):
    """Stacked bars: parameters, gradients and Adam state held by each rank, per strategy; and the loss curves.

    The first strategy in the record is the reference (DDP, or the unsharded model). The title states
    the finding: the most any rank holds under the leanest strategy, and how many times less than that.
    """
    import matplotlib.pyplot as plt

    from ..system.plotstyle import PALETTE, style

    rows = record["held_bytes"]
    labels = [f"{r['strategy']}\nrank {r['rank']}" for r in rows]
    largest = {}
    for r in rows:
        largest[r["strategy"]] = max(largest.get(r["strategy"], 0), r["total"])
    reference = next(iter(largest))
    with style():
        fig, (ax_mem, ax_loss) = plt.subplots(1, 2, figsize=(12 if len(rows) <= 4 else 15, 4))
        bottom = [0.0] * len(rows)
        for part, color in zip(("parameters", "gradients", "optimizer"), PALETTE):
            values = [r[part] / 2**20 for r in rows]
            ax_mem.bar(labels, values, bottom=bottom, color=color,
                       label="Adam state" if part == "optimizer" else part)
            bottom = [b + v for b, v in zip(bottom, values)]
        ax_mem.set(xlabel="strategy and rank", ylabel="memory held on the rank (MiB)",
                   title=f"Held after an optimizer step ({record['world_size']} ranks)")
        if len(rows) > 4:
            ax_mem.tick_params(axis="x", labelsize=7)
        ax_mem.legend()
        losses = record["losses"]
        for name, trajectory in losses.items():
            ax_loss.plot(range(1, len(trajectory) + 1), trajectory, "o-" if name == reference else "x--", label=name)
        gaps = [abs(a - b) for name, trajectory in losses.items() if name != reference
                and len(trajectory) == len(losses.get(reference, ())) for a, b in zip(losses[reference], trajectory)]
        gap = f": losses differ by at most {max(gaps):.1e}" if gaps else ""
        ax_loss.set(xlabel="optimizer step", ylabel="training loss (mean over ranks)",
                    title=f"Same trajectory{gap}")
        ax_loss.xaxis.set_major_locator(plt.MaxNLocator(integer=True))
        ax_loss.legend()
        leanest = min(largest, key=largest.get)
        finding = f"{reference} peak {largest[reference] / 2**20:,.1f} MiB per rank"
        if leanest != reference and largest[leanest]:
            finding = (f"peak {largest[leanest] / 2**20:,.1f} MiB held per rank with {leanest}, "
                       f"{largest[reference] / largest[leanest]:.1f}x less than {reference} "
                       f"({largest[reference] / 2**20:,.1f} MiB)")
        fig.suptitle(f"{record['model']}, Adam, {record['world_size']} ranks: {finding}")
        fig.tight_layout()
    return fig
