"""Tensor parallelism: one layer's weight matrix split across ranks (Megatron-LM style).

``nn.Linear`` computes y = x W^T + b with W of shape [out, in]. Two ways to split it over p ranks:

* **column parallel**: each rank keeps out/p rows of W (a slice of the *output* features) and the
  matching slice of b, computes its slice of y from the whole x, and an **all-gather** joins them;
* **row parallel**: each rank keeps in/p columns of W and sees only its slice of x; each computes
  a partial y of full width, an **all-reduce** sums them, and the bias is added once.

A transformer MLP chains the two (column, activation, row) so that it needs a single all-reduce:
the column layer's output slice is exactly the row layer's input slice. ``check_tensor_parallel``
builds each split from a full layer and compares it with the unsplit layer on the same input.
Each rank holds an equal slice, so the split dimensions must divide by the number of ranks:
``check_tensor_parallel`` rounds its sizes up to the next multiple (and says so), which lets
it run on 3, 5, 6 or 7 GPUs as well as on 2, 4 or 8.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from ..system.errors import WorkshopError


def _shard(tensor: torch.Tensor, dim: int, rank: int, world: int) -> torch.Tensor:
    size = tensor.shape[dim]
    if size % world:
        raise WorkshopError(f"A dimension of size {size} does not split into {world} equal parts, one per rank.",
                            f"use sizes divisible by {world} (check_tensor_parallel rounds its sizes up to one).")
    return tensor.chunk(world, dim=dim)[rank].contiguous()


def round_up(size: int, world: int) -> int:
    """The smallest multiple of ``world`` that is at least ``size``."""
    return -(-size // world) * world


class ColumnParallelLinear(nn.Module):
    """This rank's out/p output features of ``full``; ``gather=True`` all-gathers the whole output."""

    def __init__(self, full: nn.Linear, gather: bool = True):
        super().__init__()
        rank, world = dist.get_rank(), dist.get_world_size()
        self.weight = nn.Parameter(_shard(full.weight.detach(), 0, rank, world))
        self.bias = nn.Parameter(_shard(full.bias.detach(), 0, rank, world)) if full.bias is not None else None
        self.gather = gather

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        local = F.linear(x, self.weight, self.bias)
        if not self.gather:
            return local
        parts = [torch.empty_like(local) for _ in range(dist.get_world_size())]
        dist.all_gather(parts, local)
        return torch.cat(parts, dim=-1)


class RowParallelLinear(nn.Module):
    """This rank's in/p input features of ``full``; the partial outputs are summed by an all-reduce."""

    def __init__(self, full: nn.Linear, input_is_split: bool = False):
        super().__init__()
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        self.weight = nn.Parameter(_shard(full.weight.detach(), 1, self.rank, self.world))
        self.bias = nn.Parameter(full.bias.detach().clone()) if full.bias is not None else None
        self.input_is_split = input_is_split

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.input_is_split:
            x = _shard(x, -1, self.rank, self.world)
        partial = F.linear(x, self.weight)
        dist.all_reduce(partial)
        return partial + self.bias if self.bias is not None else partial


def _library_mlp(up: nn.Linear, down: nn.Linear, device) -> nn.Module:
    """The same MLP split by PyTorch's own tensor-parallel API: what to use in real code."""
    import copy

    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    mlp = nn.Sequential(copy.deepcopy(up), nn.GELU(), copy.deepcopy(down))
    mesh = init_device_mesh(device.type, (dist.get_world_size(),))
    return parallelize_module(mlp, mesh, {"0": ColwiseParallel(), "2": RowwiseParallel()})


def check_tensor_parallel(batch: int = 64, features: int = 512, hidden: int = 2048, seed: int = 0,
                          device=None) -> dict:
    """Each split against the unsplit layer, on every rank; the largest difference and the bytes moved.

    ``features`` and ``hidden`` are rounded up to multiples of the world size so that every
    rank holds an equal slice; the record keeps the sizes asked for and the sizes used.
    ``device`` None: where the process group's collectives run (this rank's GPU under NCCL).
    """
    from ..spine.distributed import collective_device

    if min(batch, features, hidden) < 1:
        raise WorkshopError(f"batch={batch}, features={features}, hidden={hidden}: sizes must be positive.",
                            "use e.g. batch=64, features=512, hidden=2048.")
    device = torch.device(device) if device is not None else collective_device()
    world = dist.get_world_size()
    asked = {"features": features, "hidden": hidden}
    features, hidden = round_up(features, world), round_up(hidden, world)
    torch.manual_seed(seed)  # every rank builds the same full layers and input
    up, down = nn.Linear(features, hidden).to(device), nn.Linear(hidden, features).to(device)
    x = torch.randn(batch, features, device=device)
    cases = {
        "column split + all-gather": (up(x), ColumnParallelLinear(up)(x), batch * hidden),
        "row split + all-reduce": (down(up(x)), RowParallelLinear(down)(up(x)), batch * features),
        "MLP: column, GELU, row (one all-reduce)": (
            down(F.gelu(up(x))),
            RowParallelLinear(down, input_is_split=True)(F.gelu(ColumnParallelLinear(up, gather=False)(x))),
            batch * features),
    }
    cases["MLP by torch.distributed.tensor.parallel"] = (down(F.gelu(up(x))), _library_mlp(up, down, device)(x),
                                                       batch * features)
    rows = []
    for name, (full, split, communicated) in cases.items():
        difference = (full - split).abs().max()
        dist.all_reduce(difference, op=dist.ReduceOp.MAX)
        rows.append({"split": name, "world_size": world, "output_shape": list(split.shape),
                     "max_abs_difference": difference.item(), "scale": full.abs().max().item(),
                     "communicated_mib": communicated * 4 / 2**20,
                     "weights_per_rank": f"1/{world}"})
    return {"kind": "tensor_parallel", "batch": batch, "features": features, "hidden": hidden, "asked": asked,
            "rounded_up": asked != {"features": features, "hidden": hidden}, "rows": rows}
