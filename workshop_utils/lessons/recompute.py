"""Activation (gradient) checkpointing: trade compute for memory.

The backward pass needs the activations of the forward pass, so training keeps every layer's
intermediate tensors alive until backward reaches it: activation memory grows with depth x
batch. ``torch.utils.checkpoint.checkpoint`` keeps only each block's *input* and runs the
block's forward a second time during backward to recreate the rest. The result is exactly the
same; the price is one extra forward pass per step. A forward pass is about a third of the
arithmetic of forward plus backward, so by arithmetic a step takes about a third longer; measured,
it usually takes longer still (the recomputed blocks allocate their activations again, and small
operations pay their fixed cost twice: 1.36x to 1.58x on two CPU cores in the kit's runs).
``time_ratio`` is what it costs on the machine that ran it.

``measure_recompute`` trains a stack of transformer-style MLP blocks with and without it and
reports peak memory, step time and the largest gradient difference (which must be zero);
``measure_gpt_recompute`` does the same for the GPT, one checkpoint per block.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from ..spine.timing import step_peak_mib, time_repeats


class Block(nn.Module):
    """x + W2 gelu(W1 layernorm(x)): the MLP half of a transformer layer, hidden = 4 x width."""

    def __init__(self, width: int):
        super().__init__()
        self.mlp = nn.Sequential(nn.LayerNorm(width), nn.Linear(width, 4 * width), nn.GELU(),
                                 nn.Linear(4 * width, width))

    def forward(self, x):
        return x + self.mlp(x)


class BlockStack(nn.Module):
    def __init__(self, width: int, depth: int, recompute: bool = False):
        super().__init__()
        self.blocks = nn.ModuleList(Block(width) for _ in range(depth))
        self.recompute = recompute

    def forward(self, x):
        for block in self.blocks:
            # use_reentrant=False is the variant PyTorch recommends: it works with any inputs and hooks.
            x = checkpoint(block, x, use_reentrant=False) if self.recompute and self.training else block(x)
        return x


def measure_recompute(width: int = 256, depth: int = 8, tokens: int = 2048, steps: int = 3, seed: int = 0,
                      device=None) -> dict:
    """Peak memory above the model's own, median step time and gradients, without and with checkpointing."""
    device = torch.device(device or "cpu")
    x = torch.randn(tokens, width, generator=torch.Generator().manual_seed(seed)).to(device)
    measured = _compare(lambda recompute: BlockStack(width, depth, recompute), x, lambda out: out.square().mean(),
                        steps, seed, device)
    return {**measured, "width": width, "depth": depth, "tokens": tokens}


def measure_gpt_recompute(size: str = "tiny", batch: int = 8, sequence: int = 128, steps: int = 3, seed: int = 0,
                          device=None, data_root=None) -> dict:
    """The same on the GPT, checkpointing each block (``GPT.recompute_blocks``), on a batch of real text."""
    import torch.nn.functional as F

    from ..spine.gpt import build_gpt
    from ..spine.text import first_windows, load_text

    device = torch.device(device or "cpu")
    data = load_text(data_root, quiet=True)
    inputs, targets = first_windows(data.train_tokens, sequence, batch, device)

    def build(recompute: bool):
        model = build_gpt(size)
        model.recompute_blocks = recompute
        return model

    measured = _compare(build, inputs, lambda logits: F.cross_entropy(logits.flatten(0, 1), targets.flatten()),
                        steps, seed, device)
    return {**measured, "model": f"GPT {size}", "batch": batch, "sequence": sequence, "data_source": data.source}


def _compare(build, x, loss_of, steps: int, seed: int, device) -> dict:
    """``build(recompute)`` trained on ``x`` without and with recomputation: memory, time, gradients."""
    import pandas as pd

    rows, grads = [], {}
    for recompute in (False, True):
        torch.manual_seed(seed)
        model = build(recompute).to(device)

        def step(model=model):
            model.zero_grad(set_to_none=True)
            loss_of(model(x)).backward()

        step()  # warms up the allocator; its gradients are the ones compared
        grads[recompute] = [p.grad.detach().clone() for p in model.parameters()]
        model.zero_grad(set_to_none=True)
        peak, memory_measure = step_peak_mib(step, device)
        # The two steps above were the warm-up: these are timed back to back (CUDA events on a GPU).
        step_s = time_repeats(step, steps, warmup=0, device=device).median
        rows.append({"activation_checkpointing": recompute, "peak_memory_mib": peak, "step_ms": 1e3 * step_s})
    table = pd.DataFrame(rows)
    return {"table": table, "memory_ratio": table.peak_memory_mib.iloc[1] / table.peak_memory_mib.iloc[0],
            "time_ratio": table.step_ms.iloc[1] / table.step_ms.iloc[0],
            "gradient_max_abs_difference": max((a - b).abs().max().item() for a, b in zip(grads[False], grads[True])),
            "memory_measure": memory_measure}
