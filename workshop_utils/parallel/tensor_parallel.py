"""Tensor parallelism: one layer's weight matrix split across ranks (Megatron-LM style).

``nn.Linear`` computes y = x W^T + b with W of shape [out, in]. Two ways to split it over p ranks:

* **column parallel**: each rank keeps out/p rows of W (a slice of the *output* features) and the
  matching slice of b, computes its slice of y from the whole x, and an **all-gather** joins them;
* **row parallel**: each rank keeps in/p columns of W and sees only its slice of x; each computes
  a partial y of full width, an **all-reduce** sums them, and the bias is added once.

A transformer MLP chains the two (column, activation, row) so that it needs a single all-reduce:
the column layer's output slice is exactly the row layer's input slice.

The collectives are autograd functions, as in Megatron-LM, so the split layers train: each one's
backward is what the unsplit layer's gradient needs. Gathering the output slices has as its
backward taking this rank's slice of the gradient; the input every rank holds whole has as its
backward an all-reduce of the ranks' partial input gradients (one collective each way per layer);
the row layer's all-reduce passes the gradient through unchanged, and an input it slices itself
gathers its gradient back. ``dist.all_gather`` and ``dist.all_reduce`` alone have no backward. ``check_tensor_parallel``
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


class _CopyToRanks(torch.autograd.Function):
    """Forward: the input every rank holds whole, as it is. Backward: the ranks' partial gradients, summed."""

    @staticmethod
    def forward(ctx, x):
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        grad = grad.contiguous().clone()
        dist.all_reduce(grad)
        return grad


class _GatherColumns(torch.autograd.Function):
    """Forward: every rank's slice of the last dimension, joined. Backward: this rank's slice of the gradient."""

    @staticmethod
    def forward(ctx, local):
        parts = [torch.empty_like(local) for _ in range(dist.get_world_size())]
        dist.all_gather(parts, local.contiguous())
        return torch.cat(parts, dim=-1)

    @staticmethod
    def backward(ctx, grad):
        return grad.chunk(dist.get_world_size(), dim=-1)[dist.get_rank()].contiguous()


class _SplitColumns(torch.autograd.Function):
    """Forward: this rank's slice of the last dimension. Backward: every rank's gradient slice, joined."""

    @staticmethod
    def forward(ctx, x):
        return _shard(x, -1, dist.get_rank(), dist.get_world_size())

    @staticmethod
    def backward(ctx, grad):
        return _GatherColumns.forward(ctx, grad)


class _SumOverRanks(torch.autograd.Function):
    """Forward: the ranks' partial outputs, summed. Backward: the gradient as it is (every rank holds it whole)."""

    @staticmethod
    def forward(ctx, partial):
        total = partial.contiguous().clone()
        dist.all_reduce(total)
        return total

    @staticmethod
    def backward(ctx, grad):
        return grad


class ColumnParallelLinear(nn.Module):
    """This rank's out/p output features of ``full``; ``gather=True`` all-gathers the whole output."""

    def __init__(self, full: nn.Linear, gather: bool = True):
        super().__init__()
        rank, world = dist.get_rank(), dist.get_world_size()
        self.weight = nn.Parameter(_shard(full.weight.detach(), 0, rank, world))
        self.bias = nn.Parameter(_shard(full.bias.detach(), 0, rank, world)) if full.bias is not None else None
        self.gather = gather

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        local = F.linear(_CopyToRanks.apply(x), self.weight, self.bias)  # backward: all-reduce of x's gradient
        return _GatherColumns.apply(local) if self.gather else local  # backward: this rank's slice


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
            x = _SplitColumns.apply(x)  # backward: the input gradient's slices gathered
        total = _SumOverRanks.apply(F.linear(x, self.weight))  # backward: the gradient passes through
        return total + self.bias if self.bias is not None else total


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
    hidden_input = up(x).detach()  # the row layer's input, as the column layer hands it on

    def column(layers):
        split = ColumnParallelLinear(layers[0])
        return split, [(split, 0, 0)]

    def row(layers):
        split = RowParallelLinear(layers[1])
        return split, [(split, 1, 1)]

    def mlp(layers):
        column_part, row_part = ColumnParallelLinear(layers[0], gather=False), RowParallelLinear(layers[1], True)
        return (lambda inputs: row_part(F.gelu(column_part(inputs)))), [(column_part, 0, 0), (row_part, 1, 1)]

    cases = {  # name: (the unsplit computation, the split one, its input, the numbers its collective moves)
        "column split + all-gather": (lambda l, i: l[0](i), column, x, batch * hidden),
        "row split + all-reduce": (lambda l, i: l[1](i), row, hidden_input, batch * features),
        "MLP: column, GELU, row (one all-reduce)": (lambda l, i: l[1](F.gelu(l[0](i))), mlp, x, batch * features),
    }
    rows = []
    for name, (unsplit, split, inputs, communicated) in cases.items():
        full, difference, grad_gap = _compare_split(unsplit, split, (up, down), inputs, world)
        rows.append({"split": name, "world_size": world, "output_shape": list(full.shape),
                     "max_abs_difference": difference, "max_grad_difference": grad_gap,
                     "scale": full.abs().max().item(), "communicated_mib": communicated * 4 / 2**20,
                     "weights_per_rank": f"1/{world}"})
    full = down(F.gelu(up(x)))
    difference = (full - _library_mlp(up, down, device)(x)).abs().max().detach()
    dist.all_reduce(difference, op=dist.ReduceOp.MAX)
    rows.append({"split": "MLP by torch.distributed.tensor.parallel", "world_size": world,
                 "output_shape": list(full.shape), "max_abs_difference": difference.item(),
                 "max_grad_difference": None, "scale": full.abs().max().item(),
                 "communicated_mib": batch * features * 4 / 2**20, "weights_per_rank": f"1/{world}"})
    return {"kind": "tensor_parallel", "batch": batch, "features": features, "hidden": hidden, "asked": asked,
            "rounded_up": asked != {"features": features, "hidden": hidden}, "rows": rows}


def _compare_split(unsplit, split, layers, inputs, world: int):
    """The unsplit and the split computation on copies of ``layers``, forward and backward with the same output
    gradient on every rank: the full output, the largest output difference, and the largest gradient difference
    (of the input, and of each split weight against the same slice of the full weight's gradient), over the ranks.

    ``split(layers)`` gives the split computation and, per split module, the index of its full layer and the
    dimension its weight is sliced along.
    """
    import copy

    full_layers, split_layers = copy.deepcopy(layers), copy.deepcopy(layers)
    x_full, x_split = inputs.clone().requires_grad_(), inputs.clone().requires_grad_()
    full = unsplit(full_layers, x_full)
    computation, slices = split(split_layers)
    out = computation(x_split)
    same_everywhere = torch.Generator(device=full.device).manual_seed(1)  # the same output gradient on every rank
    weight = torch.randn(full.shape, generator=same_everywhere, device=full.device)
    (full * weight).sum().backward()
    (out * weight).sum().backward()
    gaps = [(x_full.grad - x_split.grad).abs().max()]
    for module, layer, dim in slices:
        whole = full_layers[layer].weight.grad.chunk(world, dim=dim)[dist.get_rank()]
        gaps.append((whole - module.weight.grad).abs().max())
    both = torch.stack([(full - out).abs().max(), torch.stack(gaps).max()]).detach()
    dist.all_reduce(both, op=dist.ReduceOp.MAX)
    return full.detach(), both[0].item(), both[1].item()
