"""The models of the workshop: two image classifiers and a GPT.

* ``SimpleCNN`` (2,474,506 parameters): small enough that on a fast GPU the
  data pipeline, not the maths, limits speed: the perfect patient for profiling.
* ``resnet18`` for CIFAR (11,173,962 parameters): torchvision's ResNet-18 with a
  3x3 stem and no max-pool, so 32x32 images are not shrunk away in the first
  layer. Heavy enough in convolutions for mixed precision to show its worth.
* ``gpt``: a GPT-2-style decoder sized by name (``gpt.GPT_SIZES``: ``tiny``,
  840,960 parameters, for CPUs; ``gpt2-small``, 124,448,256, to fill a GPU).
"""

from __future__ import annotations

import torch
from torch import nn

from ..system.errors import WorkshopError, choose
from .gpt import build_gpt

MODELS = ("simplecnn", "resnet18", "gpt")
TOKEN_MODELS = ("gpt",)  # models that read token ids and predict the next token at every position


def _block(c_in: int, c_out: int) -> nn.Sequential:
    return nn.Sequential(
        nn.Conv2d(c_in, c_out, kernel_size=3, padding=1),
        nn.BatchNorm2d(c_out),
        nn.ReLU(inplace=True),
        nn.MaxPool2d(2),
    )


class SimpleCNN(nn.Module):
    """Three conv blocks (3->64->128->256, each halving the image) and a two-layer classifier."""

    def __init__(self, num_classes: int = 10):
        super().__init__()
        self.features = nn.Sequential(_block(3, 64), _block(64, 128), _block(128, 256))
        self.classifier = nn.Sequential(
            nn.Flatten(),
            nn.Linear(256 * 4 * 4, 512),
            nn.ReLU(inplace=True),
            nn.Dropout(0.5),
            nn.Linear(512, num_classes),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.features(x))


def resnet18_cifar(num_classes: int = 10) -> nn.Module:
    from torchvision.models import resnet18  # here, not at the top: torchvision takes ~2 s to import

    model = resnet18(weights=None, num_classes=num_classes)
    model.conv1 = nn.Conv2d(3, 64, kernel_size=3, stride=1, padding=1, bias=False)
    model.maxpool = nn.Identity()
    return model


def build_model(name: str, num_classes: int = 10, size: str | None = None) -> nn.Module:
    """A fresh model; ``size`` names the GPT's size (default ``tiny``), for the GPT only."""
    choose(name, MODELS, "model")
    if name == "gpt":
        return build_gpt(size or "tiny")
    if size is not None:
        raise WorkshopError(f"Model {name!r} comes in one size; size={size!r} is for model 'gpt'.",
                            "leave size unset.")
    return SimpleCNN(num_classes) if name == "simplecnn" else resnet18_cifar(num_classes)


def count_parameters(model: nn.Module) -> int:
    """Trainable parameters (what the optimizer updates and DDP all-reduces)."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


def unwrap(model: nn.Module) -> nn.Module:
    """The plain model inside DDP/DataParallel and torch.compile wrappers."""
    while True:
        if hasattr(model, "_orig_mod"):
            model = model._orig_mod
        elif isinstance(model, (nn.parallel.DistributedDataParallel, nn.DataParallel)):
            model = model.module
        else:
            return model


def parameter_checksum(model: nn.Module, buffers: bool = True) -> str:
    """A short fingerprint of every parameter (and buffer): equal checksums mean equal models, bit for bit."""
    model = unwrap(model)
    return state_checksum(model.state_dict() if buffers else dict(model.named_parameters()))


def state_checksum(state: dict) -> str:
    """``parameter_checksum`` of a state dict (e.g. one gathered from a sharded model)."""
    import hashlib

    digest = hashlib.sha256()
    for name, tensor in sorted(state.items()):
        digest.update(name.encode())
        digest.update(tensor.detach().cpu().contiguous().numpy().tobytes())
    return digest.hexdigest()[:16]


def max_parameter_difference(a: nn.Module, b: nn.Module) -> float:
    """Largest absolute difference between matching parameters and buffers of two models."""
    sa, sb = unwrap(a).state_dict(), unwrap(b).state_dict()
    if sa.keys() != sb.keys():
        raise ValueError("the two models have different parameter names")
    return max(((sa[k].detach().cpu().double() - sb[k].detach().cpu().double()).abs().max().item()
                for k in sa if sa[k].numel()), default=0.0)
