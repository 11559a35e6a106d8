"""A GPT-2-style decoder: the workload that fills a GPU, sized by name.

Pre-norm blocks (LayerNorm before attention and before the MLP, residual
around each), causal self-attention through
``F.scaled_dot_product_attention(..., is_causal=True)`` so PyTorch can pick its
fused kernels (flash or memory-efficient on a GPU, its flash kernel on a CPU),
a 4x MLP with GPT-2's tanh GELU, learned position embeddings, and the token
table tied to the output layer. No dropout: runs that see their corpus about
once (nanoGPT's pretraining default) need none, and with none a step depends
only on the weights and the batch.

Two sizes (``GPT_SIZES``):

* ``tiny``: 4 layers of width 128, context 128, the byte vocabulary (256).
  The cpu profile's model: a step of 16 sequences of 128 bytes took 0.4 s in
  one thread of a busy two-core machine.
* ``gpt2-small``: GPT-2 small's shape (12 layers, width 768, 12 heads,
  context 1024). Its vocabulary is GPT-2's 50,257 tokens padded to 50,304
  (393 x 128): the output layer, about a quarter of the model's FLOPs, then has
  tensor-core-friendly shapes, token shards written by nanoGPT's preparation
  scripts (GPT-2 BPE ids) fit it, and tokens/s and MFU compare with published
  GPT-2-small runs. On the byte corpus ids above 255 never occur; the model
  learns to keep their logits low, and the cost is the same as on real BPE.

What a step costs, by formula: ``flops_per_token_closed_form`` (FLOPs) and
``activation_bytes_per_sequence`` (the activations kept for the backward pass),
from which ``largest_micro_batch`` plans gradient accumulation.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from ..system.errors import WorkshopError, choose


@dataclass(frozen=True)
class GPTSize:
    layers: int
    width: int  # model dimension d
    heads: int
    context: int  # longest sequence: rows of the position table
    vocab: int


ATTENTION = ("fused", "math")

GPT_SIZES = {
    "tiny": GPTSize(layers=4, width=128, heads=4, context=128, vocab=256),
    "gpt2-small": GPTSize(layers=12, width=768, heads=12, context=1024, vocab=50304),
}


class CausalSelfAttention(nn.Module):
    """Queries, keys and values from one fused layer without biases (one large matrix multiply instead of three),
    its output features ordered head by head, each head's query, key and value side by side: a column-wise split
    for tensor parallelism then hands each rank whole heads (GPT-2's order, all queries then all keys, would hand
    rank 0 the queries and half the keys). The head count follows from the width the layer gives, so the same
    code runs on a rank's heads."""

    def __init__(self, width: int, heads: int):
        super().__init__()
        self.head_width = width // heads
        self.qkv = nn.Linear(width, 3 * width, bias=False)  # rows: (head, query|key|value, feature)
        self.proj = nn.Linear(width, width)
        self.fused = True  # False: the unfused reference below (GPT.use_attention)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, length, _ = x.shape
        q, k, v = self.qkv(x).view(batch, length, -1, 3, self.head_width).transpose(1, 2).unbind(3)
        if self.fused:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:  # what the fused kernel computes, written out: the (length x length) matrix stored per head
            scores = (q @ k.transpose(-2, -1)) / math.sqrt(self.head_width)
            future = torch.ones(length, length, dtype=torch.bool, device=x.device).triu(1)
            y = scores.masked_fill(future, float("-inf")).softmax(dim=-1) @ v
        return self.proj(y.transpose(1, 2).reshape(batch, length, -1))


class MLP(nn.Module):
    def __init__(self, width: int):
        super().__init__()
        self.fc = nn.Linear(width, 4 * width)
        self.gelu = nn.GELU(approximate="tanh")  # GPT-2's GELU
        self.proj = nn.Linear(4 * width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(self.gelu(self.fc(x)))


class Block(nn.Module):
    """Pre-norm: the residual stream itself is never normalised, which keeps deep stacks trainable."""

    def __init__(self, width: int, heads: int):
        super().__init__()
        self.ln_1, self.attn = nn.LayerNorm(width), CausalSelfAttention(width, heads)
        self.ln_2, self.mlp = nn.LayerNorm(width), MLP(width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    """Token ids (batch, sequence) in, next-token logits (batch, sequence, vocab) out."""

    def __init__(self, size: GPTSize):
        super().__init__()
        if size.width % size.heads:
            raise WorkshopError(f"width {size.width} does not split into {size.heads} heads.",
                                "pick a width that is a multiple of the number of heads.")
        self.size = size
        self.wte = nn.Embedding(size.vocab, size.width)
        self.wpe = nn.Embedding(size.context, size.width)
        self.blocks = nn.ModuleList(Block(size.width, size.heads) for _ in range(size.layers))
        self.ln_f = nn.LayerNorm(size.width)
        self.lm_head = nn.Linear(size.width, size.vocab, bias=False)
        self.lm_head.weight = self.wte.weight  # tied: one matrix reads tokens in and writes logits out
        # Activation checkpointing per block: keep each block's input, recompute the rest in backward.
        self.recompute_blocks = False
        self.apply(self._init_weights)
        # GPT-2's scaled init: each block adds two projections to the residual stream, so their
        # weights shrink with depth and the stream's variance stays put however many blocks there are.
        for name, p in self.named_parameters():
            if name.endswith("proj.weight"):
                nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * size.layers))

    @staticmethod
    def _init_weights(module: nn.Module) -> None:
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
        if isinstance(module, nn.Linear) and module.bias is not None:
            nn.init.zeros_(module.bias)

    def forward(self, tokens: torch.Tensor, targets: torch.Tensor | None = None):
        """Logits; with ``targets``, the mean cross-entropy and the count of right next tokens instead.

        Computed here, the loss and the accuracy count are compiled with the model when it is compiled: the
        logits' fp32 log-softmax fuses into the reductions that read them, and no argmax outside keeps a
        (batch, sequence, vocab) tensor alive through the backward pass (GPT-2 small: 1.6 GiB in bf16 at 16 x 1,024).
        """
        logits = self.logits(tokens)
        if targets is None:
            return logits
        flat, wanted = logits.flatten(0, -2).float(), targets.flatten()
        loss = F.cross_entropy(flat, wanted)
        # A next token is right when its logit is the row's largest: a comparison with the maximum the loss's
        # log-softmax takes anyway (compiled, one pass over the logits serves both), not an argmax's index search.
        with torch.no_grad():
            right = (flat.gather(1, wanted[:, None]).squeeze(1) >= flat.amax(1)).sum()
        return loss, right

    def logits(self, tokens: torch.Tensor) -> torch.Tensor:
        length = tokens.shape[1]
        if length > self.size.context:
            raise WorkshopError(f"A sequence of {length} tokens is longer than the model's context of "
                                f"{self.size.context}.", f"use sequences of at most {self.size.context} tokens.")
        positions = torch.arange(length, device=tokens.device)
        x = self.wte(tokens) + self.wpe(positions)
        if bf16_autocast(tokens.device.type):
            # The residual stream in bf16, as the blocks' outputs are under autocast: half the bytes every
            # residual add and layer norm reads and writes (fp32 adds would promote it back at each block).
            x = x.to(torch.bfloat16)
        for block in self.blocks:
            # use_reentrant=False: the variant PyTorch recommends, which works with FSDP2 and DTensors too.
            x = checkpoint(block, x, use_reentrant=False) if self.recompute_blocks and self.training else block(x)
        return self.lm_head(self.ln_f(x))

    def use_attention(self, kind: str) -> "GPT":
        """``fused``: ``scaled_dot_product_attention``, which picks PyTorch's flash or memory-efficient kernel;
        ``math``: matmul, mask, softmax, matmul as separate operations, the attention matrix stored for backward."""
        choose(kind, ATTENTION, "attention")
        for block in self.blocks:
            block.attn.fused = kind == "fused"
        return self

    def non_embedding_parameters(self) -> int:
        """Parameters outside the token and position tables (Kaplan et al.'s N)."""
        return sum(p.numel() for p in self.parameters()) - self.wte.weight.numel() - self.wpe.weight.numel()


def bf16_autocast(device_type: str) -> bool:
    """Whether autocast to bf16 is on for ``device_type`` here (the calls changed in PyTorch 2.4)."""
    if device_type not in ("cpu", "cuda"):  # the meta device (shapes only) has no autocast
        return False
    if hasattr(torch, "get_autocast_dtype"):
        return torch.is_autocast_enabled(device_type) and torch.get_autocast_dtype(device_type) == torch.bfloat16
    if device_type == "cpu":
        return torch.is_autocast_cpu_enabled() and torch.get_autocast_cpu_dtype() == torch.bfloat16
    return torch.is_autocast_enabled() and torch.get_autocast_gpu_dtype() == torch.bfloat16


def build_gpt(size: str = "tiny") -> GPT:
    choose(size, tuple(GPT_SIZES), "gpt_size")
    return GPT(GPT_SIZES[size])


def flops_per_token_closed_form(size: GPTSize, sequence_length: int, parameters: int) -> int:
    """6·N + 12·layers·width·sequence: a training step's FLOPs per token (PaLM, appendix B; nanoGPT's MFU).

    6·N: each weight multiplies once forward and twice backward, 2 FLOPs a multiply-add. 12·L·d·T:
    attention's scores and weighted sum, which no weight counts; a causal mask skips half of
    them in a fused kernel but every MFU convention counts them all. Which ``parameters`` to pass
    is the caller's statement of what N counts.
    """
    return 6 * parameters + 12 * size.layers * size.width * sequence_length


def activation_bytes_per_sequence(size: GPTSize, sequence_length: int, stored_attention: bool = False,
                                  logits: bool = True) -> float:
    """Activations one sequence keeps for the backward pass in 16-bit training. Korthikanti et al. (2022), section
    4: s·h·(34 + 5·a·s/h) bytes a layer, the 5·a·s/h the attention matrix a fused kernel never stores; the loss's
    bf16 logits and fp32 log-softmax (2 + 4 bytes a token and vocabulary entry) come on top unless ``logits=False``.
    """
    per_layer = sequence_length * size.width * 34 + (5 * size.heads * sequence_length ** 2 if stored_attention else 0)
    return float(size.layers * per_layer + (sequence_length * size.vocab * (2 + 4) if logits else 0))


def largest_micro_batch(size: GPTSize, sequence_length: int, free_bytes: float, tokens_per_rank: int) -> int:
    """The largest power of two of sequences that fits ``free_bytes`` and divides a rank's share of the batch."""
    per_sequence, micro = activation_bytes_per_sequence(size, sequence_length), 1
    while micro * 2 * per_sequence <= free_bytes and (tokens_per_rank // sequence_length) % (micro * 2) == 0:
        micro *= 2
    return micro
