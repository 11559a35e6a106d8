"""The GPT's own blocks, sharded by FSDP2 and split by tensor parallelism: notebook 05's toy layers in a real model.

* **FSDP2** (``shard_gpt``): ``fully_shard`` on each block, then on the whole model (embeddings,
  final norm, the tied output layer). Each block is one unit: its parameters are all-gathered just
  before its forward (and again before its backward), and its gradients reduce-scattered as soon
  as its backward ends, so at most a block or two is ever whole on a rank. A mixed-precision
  policy gathers and computes in bf16 (half the traffic) while the stored shards, the gradients
  that are reduced and the optimizer stay fp32.
* **Tensor parallelism** (``split_gpt``): inside each block, Megatron-LM's plan through PyTorch's
  ``parallelize_module``: the fused query, key and value layer and the MLP's first layer column-wise
  (each rank computes its heads, whose queries, keys and values sit together in the fused layer's rows,
  and its share of the hidden features), both output projections row-wise
  (their partial sums meet in one all-reduce each). Two all-reduces per block per forward; the
  embeddings and norms stay whole on every rank.

``compare_gpt_parallel`` trains the same weights on the same batches of real text four ways on
every rank of a torchrun job (the unsharded model, FSDP2 in fp32, FSDP2 with the bf16 policy,
tensor parallelism) and records each one's losses, how far its weights end from the unsharded
model's (as a fraction of how far those moved), and the bytes each rank holds for parameters, gradients and AdamW's two moments.
"""

from __future__ import annotations

import copy

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from ..system.errors import WorkshopError, choose
from .sharding import held_bytes

# Which layers of a block split which way (names inside spine.gpt.Block).
COLUMNWISE = ("attn.qkv", "mlp.fc")  # attn.qkv's rows are head by head: a contiguous share is whole heads
ROWWISE = ("attn.proj", "mlp.proj")


def shard_gpt(model: nn.Module, mesh, bf16: bool = False) -> nn.Module:
    """FSDP2, one unit per block and the rest as the root's; ``bf16`` gathers and computes in bf16."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) if bf16 else \
        MixedPrecisionPolicy()
    for block in model.blocks:
        fully_shard(block, mesh=mesh, mp_policy=policy)
    return fully_shard(model, mesh=mesh, mp_policy=policy)


def why_not_split(size, world: int) -> str | None:
    """Why tensor parallelism cannot split this GPT over ``world`` ranks, or None when it can."""
    if size.heads % world or (4 * size.width) % world:
        return (f"{size.heads} heads and {4 * size.width} hidden features do not split evenly over {world} "
                "ranks: each rank needs whole heads")
    return None


def split_gpt(model: nn.Module, mesh) -> nn.Module:
    """Tensor parallelism inside every block; each rank must get whole heads."""
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    reason = why_not_split(model.size, mesh.size())
    if reason:
        raise WorkshopError(f"Tensor parallelism: {reason}.",
                            "use a number of ranks that divides the head count (2 or 4 for the tiny GPT).")
    plan = {**{name: ColwiseParallel() for name in COLUMNWISE}, **{name: RowwiseParallel() for name in ROWWISE}}
    for block in model.blocks:
        parallelize_module(block, mesh, plan)
    return model


def _whole(parameter: torch.Tensor) -> torch.Tensor:
    """A parameter as one tensor: a sharded one is gathered (every rank must call this, in the same order)."""
    return parameter.full_tensor() if hasattr(parameter, "full_tensor") else parameter


def _weight_gap(model: nn.Module, reference: nn.Module, start: nn.Module) -> float:
    """How far ``model``'s weights ended from ``reference``'s, as a fraction of how far the reference moved.

    An L2 ratio, not the largest element: Adam divides each gradient by its own running size, so a
    weight whose gradient is nearly zero moves a full step in either direction on a rounding difference.
    """
    gap = moved = 0.0
    for p, q, s in zip(model.parameters(), reference.parameters(), start.parameters()):
        gap += (_whole(p) - q).double().square().sum().item()
        moved += (q - s).double().square().sum().item()
    return (gap / moved) ** 0.5 if moved else float("inf")


def _batches(size, steps: int, batch: int, sequence: int, device, data_root=None):
    """The first ``steps`` x ``batch`` windows of the corpus in batches, the same on every rank."""
    from ..spine.text import first_windows, load_text

    data = load_text(data_root, quiet=True)
    data.check_vocabulary(size.vocab)
    inputs, targets = first_windows(data.train_tokens, sequence, steps * batch, device)
    return list(zip(inputs.split(batch), targets.split(batch))), data


def _train(model, batches, lr: float, share) -> tuple[list[float], dict]:
    """AdamW steps on ``share(inputs)`` of every batch; the mean loss over ranks; bytes held after step 1."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, foreach=False)  # foreach groups cannot mix DTensors
    losses, held = [], {}
    for step, (inputs, targets) in enumerate(batches):
        optimizer.zero_grad(set_to_none=True)
        logits = model(share(inputs))
        loss = F.cross_entropy(logits.flatten(0, 1).float(), share(targets).flatten())
        loss.backward()
        optimizer.step()
        if step == 0:
            held = held_bytes(model, optimizer)  # gradients still present: the peak of the three
        mean = loss.detach().clone()
        dist.all_reduce(mean)
        losses.append(mean.item() / dist.get_world_size())
    return losses, held


def compare_gpt_parallel(size: str = "tiny", steps: int = 4, batch: int = 8, sequence: int = 64, lr: float = 1e-3,
                         seed: int = 0, device=None, data_root=None) -> dict:
    """The unsharded GPT, FSDP2 (fp32 and bf16 policy) and tensor parallelism, trained alike on every rank.

    Every rank sees the same ``batch`` sequences a step: the unsharded model and tensor parallelism
    use all of them, FSDP's ranks their share each (it is data parallel), which averages to the same
    gradient. ``device`` None: where the process group's collectives run (this rank's GPU under NCCL).
    """
    from torch.distributed.device_mesh import init_device_mesh

    from ..spine.distributed import collective_device
    from ..spine.gpt import GPT_SIZES, build_gpt

    device = torch.device(device) if device is not None else collective_device()
    rank, world = dist.get_rank(), dist.get_world_size()
    if min(steps, batch, sequence) < 1 or batch % world:
        raise WorkshopError(f"steps={steps}, batch={batch}, sequence={sequence} on {world} ranks: FSDP gives each "
                            "rank an equal share of every batch.", f"use a batch that is a multiple of {world}.")
    choose(size, tuple(GPT_SIZES), "size")
    if sequence > GPT_SIZES[size].context:
        raise WorkshopError(f"sequence={sequence} is longer than the {size} GPT's context.",
                            f"use at most {GPT_SIZES[size].context} tokens.")
    torch.manual_seed(seed)
    reference = build_gpt(size).to(device)
    batches, data = _batches(reference.size, steps, batch, sequence, device, data_root)
    mesh = init_device_mesh(device.type, (world,))
    everything, mine = (lambda t: t), (lambda t: t[rank::world])
    strategies = {
        "one model (unsharded)": (lambda m: m, everything),
        "FSDP2 per block": (lambda m: shard_gpt(m, mesh), mine),
        "FSDP2 per block, bf16 policy": (lambda m: shard_gpt(m, mesh, bf16=True), mine),
        "tensor parallel per block": (lambda m: split_gpt(m, mesh), everything),
    }
    skipped = {}
    reason = why_not_split(reference.size, world)
    if reason:  # e.g. GPT-2 small's 12 heads on 8 GPUs: the other three still run
        skipped["tensor parallel per block"] = reason
        del strategies["tensor parallel per block"]
    start = copy.deepcopy(reference)
    losses, held, drift = {}, {}, {}
    for name, (wrap, share) in strategies.items():
        model = reference if name.startswith("one model") else wrap(copy.deepcopy(start))
        losses[name], held[name] = _train(model, batches, lr, share)
        if model is not reference:
            drift[name] = _weight_gap(model, reference, start)
        del model
    everyone = [None] * world
    dist.all_gather_object(everyone, held)
    rows = [{"strategy": name, "rank": r, **everyone[r][name]} for name in strategies for r in range(world)]
    for row in rows:
        row["total"] = row["parameters"] + row["gradients"] + row["optimizer"]
    parameters = sum(p.numel() for p in reference.parameters())
    return {"kind": "gpt_parallel", "model": f"GPT {size}", "size": size, "parameters": parameters,
            "world_size": world, "steps": steps, "batch": batch, "sequence": sequence, "lr": lr,
            "data_source": data.source, "corpus": data.fingerprint(), "losses": losses,
            "weight_gap": drift, "held_bytes": rows, "skipped": skipped,
            "unsharded_bytes": 16 * parameters}  # fp32 weights and gradients, AdamW's two fp32 moments


def gpt_parallel_table(record: dict):
    """One row per strategy: the most any rank holds, against the unsharded model, and how far it drifted."""
    import pandas as pd

    held = pd.DataFrame(record["held_bytes"])
    largest = held.groupby("strategy", sort=False)[["parameters", "gradients", "optimizer", "total"]].max()
    table = (largest / 2**20).add_suffix("_mib")
    table["of_unsharded"] = largest.total / record["unsharded_bytes"]
    reference = next(iter(record["losses"].values()))
    table["largest_loss_gap"] = [max(abs(a - b) for a, b in zip(record["losses"][name], reference))
                                 for name in table.index]
    table["weight_gap"] = [record["weight_gap"].get(name, 0.0) for name in table.index]
    return table
