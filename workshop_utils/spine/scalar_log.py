"""TensorBoard scalars of a training run, written by rank 0 once per epoch.

``tensorboard --logdir <run folder>/tensorboard`` then shows loss, accuracy, learning rate,
step time, samples/s and (on a GPU with NVML) utilisation, run beside run. NVML's utilisation
covers only its last sampling period (1/6 s to 1 s, by GPU): it is read as the epoch's training
steps end, before evaluation and before the loop waits for the GPU, and its name says so. Nothing here reads
a value off the GPU inside the hot loop: per-step losses stay on the device until the epoch's
end, where the loop synchronises anyway to sum its accuracy, and step times come from the
step timer's marks.
"""

from __future__ import annotations

import sys
import threading

import torch

from ..system.results import check_output_path, no_room


def _quiet_about_a_full_disk(previous):
    """threading.excepthook that leaves out TensorBoard's writer thread failing for a full disk: the training loop
    says that in one line (ScalarLog.stop) and goes on, where the thread's traceback would only alarm."""
    def hook(args):
        if type(args.thread).__name__ == "_AsyncWriterThread" and no_room(args.exc_value, ".", "") is not None:
            return
        previous(args)

    hook.quiet_about_a_full_disk = True
    return hook


class ScalarLog:
    """Scalars for TensorBoard under ``folder``; does nothing without a folder or off rank 0."""

    # What the utilisation scalar covers, in its name: read at the end of training, not of evaluation.
    UTILISATION = "device/gpu_utilisation_percent_last_training_second"

    def __init__(self, folder: str | None, is_main: bool, run_name: str):
        self.writer = None
        self.utilisation = None  # NVML's reading as the epoch's training steps ended
        self.folder = folder
        if folder and is_main:
            from torch.utils.tensorboard import SummaryWriter  # needs the tensorboard package: imported on use

            if not getattr(threading.excepthook, "quiet_about_a_full_disk", False):
                threading.excepthook = _quiet_about_a_full_disk(threading.excepthook)
            # One subfolder per run name: TensorBoard draws the runs of one folder as lines side by side.
            try:
                self.writer = SummaryWriter(str(check_output_path(folder, what="tensorboard_dir", folder=True)
                                                / run_name))
            except OSError as err:
                self.stop(err, "at the start")

    def stop(self, err: OSError, when: str) -> None:
        """A full disk ends the TensorBoard scalars, not the training run: one line says so, the run goes on."""
        failure = no_room(err, self.folder, "TensorBoard's scalars in",
                          "free space there, or point tensorboard_dir at another disk.")
        if failure is None:
            raise err
        writer, self.writer = self.writer, None
        if writer is not None:
            try:
                writer.close()
            except OSError:
                pass
        print(f"warning: {failure.problem} TensorBoard logging stopped {when}; the training goes on and its result "
              f"is kept. Fix: {failure.fix}", file=sys.stderr, flush=True)

    def training_steps_done(self, device: torch.device) -> None:
        """Read the GPU's utilisation now, while the epoch's training steps may still be running on it."""
        self.utilisation = None
        if self.writer is None or device.type != "cuda":
            return
        try:
            self.utilisation = torch.cuda.utilization(device)
        except Exception:  # no NVML on this node: the other scalars still matter
            pass

    def epoch_end(self, step: int, row: dict, steps: list[int], losses: list[torch.Tensor], lrs: list[float],
                  step_s: list[float], samples_per_step: int) -> None:
        """Per-step loss, learning rate and step time of the epoch just ended; its accuracy and losses."""
        if self.writer is None:
            return
        try:
            self._write_epoch(step, row, steps, losses, lrs, step_s, samples_per_step)
        except OSError as err:
            self.stop(err, f"at step {step}")

    def _write_epoch(self, step, row, steps, losses, lrs, step_s, samples_per_step) -> None:
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
        if self.utilisation is not None:
            add(self.UTILISATION, self.utilisation, step)
        self.writer.flush()

    def close(self) -> None:
        if self.writer is not None:
            try:
                self.writer.close()
            except OSError as err:
                self.stop(err, "at the end")
