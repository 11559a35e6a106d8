"""What a GPU-check path is and what it is given: its record (``GpuPath``), its device and folder
(``Context``), and the two ways it ends other than with a line of what it measured (``Skip``, ``Failed``).

Every path module builds on this one, and this one on nothing of the check's, so a new path needs
only this to be written.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch

from ..system.hardware import peak_tflops


# Where the GPU records are kept, each with its environment (``--reference``).
REFERENCE_FOLDER = Path("results") / "reference" / "gpu"


def slug(text: str) -> str:
    """``NVIDIA H100 80GB HBM3`` as a file name's part: ``nvidia-h100-80gb-hbm3``."""
    return "-".join("".join(c if c.isalnum() else " " for c in text.lower()).split())


class Skip(Exception):
    """The path cannot run here (a missing package or tool, no GPU in a rehearsal): said, not failed."""


class Failed(Exception):
    """The path ran, and what it produced is wrong."""


@dataclass
class Context:
    """What every path is given: the device, a folder for its files, and the sizes to use."""

    device: torch.device
    folder: Path
    _cache: dict = field(default_factory=dict)

    @property
    def on_gpu(self) -> bool:
        return self.device.type == "cuda"

    def need_gpu(self, what: str) -> None:
        if not self.on_gpu:
            raise Skip(f"{what} needs a GPU")

    @property
    def gpt_size(self) -> str:
        """GPT-2 small on a GPU (the gpu profile's size); the tiny GPT in a CPU rehearsal."""
        return "gpt2-small" if self.on_gpu else "tiny"

    @property
    def sequence(self) -> int:
        return 1024 if self.on_gpu else 128

    def images(self):
        """A small synthetic CIFAR-10 stand-in (the node need not hold the data set), loaded once."""
        if "images" not in self._cache:
            from ..spine.data import load_data

            self._cache["images"] = load_data(train_size=2048, test_size=256, synthetic=True, quiet=True)
        return self._cache["images"]

    def text(self):
        if "text" not in self._cache:
            from ..spine.text import load_text

            self._cache["text"] = load_text(quiet=True)
        return self._cache["text"]

    def config(self, **changes):
        """A short training run on this device, no progress bar; ``changes`` on top."""
        from ..spine.config import TrainConfig

        base = dict(device=str(self.device), max_steps=6, warmup_steps=2, batch_size=128, progress=False,
                    test_size=256, train_size=2048, synthetic=True)
        if changes.get("model") == "gpt":
            base.update(gpt_size=self.gpt_size, sequence_length=self.sequence, batch_size=8, optimizer="adamw",
                        lr=6e-4, train_size=None, test_size=8, synthetic="auto")
        return TrainConfig(**{**base, **changes})

    def train(self, **changes):
        from ..spine.trainer import train

        config = self.config(**changes)
        data = self.text() if config.model == "gpt" else self.images()
        return train(config, data)


@dataclass(frozen=True)
class GpuPath:
    """One GPU-only code path: its name, what is checked, the CUDA branches it runs, and how."""

    name: str
    what: str
    covers: tuple[str, ...]  # "module:function" (package-relative) of every CUDA branch it runs
    run: Callable[[Context], str]  # returns one line of what it measured; raises Skip or Failed
    gpus: int = 1
    least_s: float = 5  # not started with less than this left of the budget


def finite_loss(result, what: str) -> float:
    loss = result.metrics["final_train_loss"]
    if loss is None or not math.isfinite(loss):
        raise Failed(f"{what}: the training loss is {loss}")
    return loss


def sane_rate(tflops: float | None, name: str, precision: str, what: str) -> None:
    """A rate above the data sheet's peak means the clock measured queueing, not the GPU."""
    peak = peak_tflops(name, precision)
    if tflops is not None and peak is not None and tflops > 1.05 * peak:
        raise Failed(f"{what}: {tflops:.0f} TFLOP/s is above {name}'s {precision} peak of {peak:.0f}")
