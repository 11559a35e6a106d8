"""TensorBoard scalars of a training run, written by rank 0 once per epoch.

``tensorboard --logdir <run folder>/tensorboard`` then shows loss, accuracy, learning rate,
step time, samples/s and (on a GPU with NVML) utilisation, run beside run. Nothing here reads
a value off the GPU inside the hot loop: per-step losses stay on the device until the epoch's
end, where the loop synchronises anyway to sum its accuracy, and step times come from the
step timer's marks.
"""

from __future__ import annotations

import torch

from ..system.results import check_output_path


class ScalarLog:
    """Scalars for TensorBoard under ``folder``; does nothing without a folder or off rank 0."""

    def __init__(self, folder: str | None, is_main: bool, run_name: str):
        self.writer = None
        if folder and is_main:
            from torch.utils.tensorboard import SummaryWriter  # needs the tensorboard package: imported on use

            # One subfolder per run name: TensorBoard draws the runs of one folder as lines side by side.
            self.writer = SummaryWriter(str(check_output_path(folder, what="tensorboard_dir", folder=True)
                                            / run_name))

    def epoch_end(self, step: int, row: dict, steps: list[int], losses: list[torch.Tensor], lrs: list[float],
                  step_s: list[float], samples_per_step: int, device: torch.device) -> None:
        """Per-step loss, learning rate and step time of the epoch just ended; its accuracy and losses."""
        if self.writer is None:
            return
        add = self.writer.add_scalar
        host_losses = torch.stack(losses).float().cpu().tolist() if losses else []
        for number, loss, lr in zip(steps, host_losses, lrs):
            add("train/loss_per_step", loss, number)
            add("train/learning_rate", lr, number)
        for number, seconds in zip(steps, step_s):
            add("speed/step_ms", 1e3 * seconds, number)
            if seconds > 0:
                add("speed/samples_per_s", samples_per_step / seconds, number)
        for key in ("train_loss", "train_acc", "test_loss", "test_acc"):
            add(f"epoch/{key}", row[key], step)
        if device.type == "cuda":
            try:
                add("device/gpu_utilisation_percent", torch.cuda.utilization(device), step)
            except Exception:  # no NVML on this node: the other scalars still matter
                pass
        self.writer.flush()

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
