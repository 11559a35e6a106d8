"""The losses of a training step and of evaluation, for images and tokens alike.

A batch's predictions are (batch, classes) for the CNNs and (batch, positions, vocab) for the GPT; the loss is
cross-entropy over every prediction. The GPT computes its own in its forward pass (``GPT.forward``), so a
compiled GPT compiles its loss too; evaluation splits a token model's batch so its logits stay within a budget.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .distributed import all_reduce_sum
from .models import unwrap
from .precision import autocast


def predictions_loss(logits: torch.Tensor, targets: torch.Tensor, reduction: str = "mean") -> torch.Tensor:
    """Cross-entropy over every prediction: (batch, classes) for images, (batch, positions, vocab) for tokens."""
    # flatten(0, -2) of a 2-D tensor is the tensor itself: the CNNs' loss is computed exactly as before.
    return F.cross_entropy(logits.flatten(0, -2), targets.flatten(), reduction=reduction)


# Logits one evaluation forward pass may hold, in elements (512 MiB in fp32). A token model's logits are
# sequences x positions x vocabulary: GPT-2 small's 512-sequence batch would be 105 GiB in fp32 alone.
EVAL_LOGITS_BUDGET = 2**27


def evaluation_chunks(model: torch.nn.Module, inputs: torch.Tensor) -> int:
    """Samples per evaluation forward pass: the whole batch for images, a logits budget's worth for tokens."""
    size = getattr(unwrap(model), "size", None)
    if size is None or inputs.dim() < 2:
        return max(1, len(inputs))
    return max(1, EVAL_LOGITS_BUDGET // (inputs[0].numel() * size.vocab))


def forward_loss(model, inputs: torch.Tensor, targets: torch.Tensor, text: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """One micro-batch's mean loss and count of right predictions.

    The GPT computes both inside its forward pass, so a compiled GPT compiles its loss too (``GPT.forward``);
    the CNNs' loss is the cross-entropy of their logits, here.
    """
    if text:
        return model(inputs, targets)
    logits = model(inputs)
    return predictions_loss(logits, targets), (logits.detach().argmax(-1) == targets).sum()


@torch.no_grad()
def evaluate(model, loader, device, precision: str) -> tuple[float, float]:
    """Mean loss and accuracy per prediction (image, or next token) over ``loader``, summed across ranks."""
    model.eval()
    totals = torch.zeros(3, device=device, dtype=torch.float64)  # loss sum, correct, count
    for batch_inputs, batch_targets in loader.epoch(0):
        rows = evaluation_chunks(model, batch_inputs)
        for inputs, targets in zip(batch_inputs.split(rows), batch_targets.split(rows)):
            with autocast(precision, device):
                logits = model(inputs)
            totals[0] += predictions_loss(logits.float(), targets, reduction="sum")
            totals[1] += (logits.argmax(-1) == targets).sum()
            totals[2] += targets.numel()
            del logits  # the next chunk's logits take its place, not a second copy beside it
    loss_sum, correct, count = all_reduce_sum(totals).tolist()
    return loss_sum / max(count, 1), correct / max(count, 1)
