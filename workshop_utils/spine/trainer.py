"""The one training loop: a ``TrainConfig`` in, a result record out.

The same function runs in a notebook, in ``python -m workshop_utils.train``,
under torchrun on eight GPUs and under srun on many nodes: ``setup_distributed``
says which rank this is, DDP wraps the model when there is more than one, and
rank 0 alone prints and saves. Every optimization of the workshop is one field
of the config, so a learner can switch exactly one thing and measure it.

Images and text go through the same loop: a batch is ``(inputs, targets)`` and the
loss is cross-entropy over every prediction, one per image for the CNNs, one per
position for the GPT (its data are token windows, ``spine/text.py``).

Gradient accumulation is a field too: ``accumulation_steps`` micro-batches per optimizer step, DDP's
all-reduce skipped under ``no_sync()`` for all but the last (``all_reduces`` in the record counts the
buckets each rank sent).

Inside the hot loop nothing waits for the GPU: losses and accuracies are summed
on the device and read once per epoch; step times come from CUDA events read at
the end (see ``timing.StepTimer``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
from collections.abc import Callable
import os
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import socket

try:
    import resource  # Unix only: the process's peak resident memory
except ImportError:
    resource = None

import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.nn.parallel import DistributedDataParallel

from .checkpoint import checkpoint_path, latest_checkpoint, load_checkpoint, prune_checkpoints, save_checkpoint
from .config import TrainConfig, validate_config
from .data import CifarData, mix_seeds, load_data, make_loader
from .distributed import all_reduce_sum, setup_distributed
from ..system.errors import WorkshopError
from .losses import evaluate, forward_loss
from .flops import achieved_tflops, mfu, training_flops_per_sample, training_flops_per_sequence
from ..system.hardware import device_name, environment
from .models import TOKEN_MODELS, build_model, count_parameters, parameter_checksum, unwrap
from .precision import autocast, configure_precision, grad_scaler
from .preemption import handling_signals, stop_requested
from .scalar_log import ScalarLog
from .text import TokenData, bits_per_byte, load_text, make_token_loader
from ..system.results import save_record
from .timing import StepTimer, memory_in_use_mib, peak_memory_mib, phase_ranges, reset_peak_memory
from ..system.progress import progress_bar


def seed_dropout(seed: int, rank: int, step: int) -> None:
    """Dropout draws from a seed that depends only on (seed, rank, step): exact resume, distinct ranks."""
    torch.manual_seed(mix_seeds(seed, rank, step) & 0x7FFF_FFFF_FFFF_FFFF)


class InjectedFailure(RuntimeError):
    """Raised by ``fail_at_step``: a deliberate crash to show recovery."""


STOP_POLL_STEPS = 10  # ranks agree on stopping every N steps: one tiny all-reduce, not one per step


def _to_host_async(tensor: torch.Tensor):
    """Start copying a small tensor to host memory; ``_read_host`` reads it later without stalling the GPU.

    Reading a GPU value (``.item()``) makes the host wait until every kernel queued so far has
    run, which empties the launch queue and understates throughput. Copied asynchronously and
    read some steps later, the value has long arrived and nothing waits.
    """
    tensor = tensor.detach()
    if tensor.device.type != "cuda":
        return tensor.clone(), None
    host = torch.empty(tensor.shape, dtype=tensor.dtype, pin_memory=True)
    host.copy_(tensor, non_blocking=True)
    ready = torch.cuda.Event()
    ready.record()
    return host, ready


def _read_host(pending) -> torch.Tensor:
    host, ready = pending
    if ready is not None:
        ready.synchronize()  # waits for that old copy only, not for the steps queued since
    return host


class _StopPoll:
    """Every rank stops at the same step after a stop signal, without a host sync in the loop.

    Every ``STOP_POLL_STEPS`` steps each rank starts an all-reduce of its "stop requested"
    flag and reads the previous poll's result, which arrived long ago: all ranks read the
    same sum at the same step, so they stop together, one poll interval after the signal.
    A single process needs no agreement and checks its flag directly.
    """

    def __init__(self, device: torch.device, distributed: bool):
        self.device, self.distributed, self.pending = device, distributed, None

    def should_stop(self) -> bool:
        if not self.distributed:
            return stop_requested()
        agreed = self.pending is not None and _read_host(self.pending).item() > 0
        flag = torch.full((1,), float(stop_requested()), device=self.device)  # torch.tensor([...]) would sync
        dist.all_reduce(flag, op=dist.ReduceOp.SUM)
        self.pending = _to_host_async(flag)
        return agreed


@dataclass
class RunResult:
    """What ``train`` returns: the JSON-ready record and the trained (unwrapped) model."""

    record: dict
    model: torch.nn.Module = field(repr=False)

    @property
    def metrics(self) -> dict:
        return self.record["metrics"]

    @property
    def history(self) -> list[dict]:
        return self.record["history"]

    def save(self, run_dir, name: str | None = None) -> Path:
        return save_record(self.record, run_dir, name or self.record["config"]["name"])


def counting_all_reduce(count, bucket):
    """DDP's own all-reduce of one gradient bucket (PyTorch's ``allreduce_hook``), counted in ``count[0]``.

    No annotations: DDP checks a hook's annotations against the types themselves, and this module's
    ``from __future__ import annotations`` would turn them into strings.
    """
    count[0] += 1
    return default_hooks.allreduce_hook(None, bucket)


def _lr_lambda(warmup: int, total: int):
    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        progress = (step - warmup) / max(1, total - warmup)
        return 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))

    return factor


def _restart_count() -> int:
    return int(os.environ.get("TORCHELASTIC_RESTART_COUNT") or os.environ.get("SLURM_RESTART_COUNT") or 0)


def _print_log(pending, total_steps: int) -> None:
    if pending is not None:
        step, loss, lr = pending
        print(f"step {step}/{total_steps}  loss {_read_host(loss).item():.4f}  lr {lr:.4g}", flush=True)


def check_same_data(data: CifarData | TokenData) -> None:
    """Refuse to train when the ranks read different data (one node without CIFAR-10 falls back to synthetic)."""
    mine = (data.fingerprint(), data.source, socket.gethostname(), data.location)
    everyone = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, mine)
    if len({entry[0] for entry in everyone}) > 1:
        seen = sorted({f"{host}: {source} from {location}" for _, source, host, location in everyone})
        raise WorkshopError("The ranks read different data: " + "; ".join(seen) + ".",
                            "give every node the same data (data_root on a shared file system, or stage it "
                            "to each node), or set synthetic=True on all of them.")


@contextlib.contextmanager
def deterministic_kernels(enabled: bool = True):
    """Ask PyTorch for deterministic kernels inside the block; the previous settings come back after it.

    Several fast GPU kernels (cuDNN's backward convolutions, scatter-adds) sum in whatever
    order their threads finish, so two identical runs drift apart by rounding, and over
    thousands of steps the drift grows. Deterministic kernels are often slower. Operations
    with no deterministic version only warn, so a run never fails for asking.
    """
    if not enabled:
        yield
        return
    previous = (torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled(),
                torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark)
    # cuBLAS needs a fixed workspace to be deterministic; it reads this when it creates its handle.
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.use_deterministic_algorithms(True, warn_only=True)
    torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = True, False
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(previous[0], warn_only=previous[1])
        torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = previous[2], previous[3]


def build_optimizer(config: TrainConfig, model: torch.nn.Module) -> torch.optim.Optimizer:
    """SGD with Nesterov momentum, or AdamW with GPT training's betas and no decay on biases and norms."""
    kernels = {"default": {}, "foreach": {"foreach": True}, "fused": {"fused": True}}[config.optimizer_kernels]
    if config.optimizer == "sgd":
        return torch.optim.SGD(model.parameters(), lr=config.lr, momentum=config.momentum,
                               weight_decay=config.weight_decay, nesterov=True, **kernels)
    # Decay pulls weights towards zero; a bias or a norm's gain at zero is no simpler a model, only a broken one.
    matrices = [p for p in model.parameters() if p.dim() >= 2]
    others = [p for p in model.parameters() if p.dim() < 2]
    return torch.optim.AdamW([{"params": matrices, "weight_decay": config.weight_decay},
                              {"params": others, "weight_decay": 0.0}], lr=config.lr, betas=(0.9, 0.95), **kernels)


def _cpu_seconds() -> float:
    """CPU time of this process, all its threads, and of its child processes that ended (DataLoader workers)."""
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


def _check_data_kind(config: TrainConfig, data) -> None:
    wants_text = config.model in TOKEN_MODELS
    if wants_text != isinstance(data, TokenData):
        raise WorkshopError(f"Model {config.model!r} reads {'token ids' if wants_text else 'images'}, but the data "
                            f"passed are {'images' if wants_text else 'tokens'}.",
                            f"pass {'wu.load_text()' if wants_text else 'wu.load_data()'}, or no data at all.")


def train(config: TrainConfig, data: CifarData | TokenData | None = None,
          on_step: Callable[[int], None] | None = None) -> RunResult:
    """Train as ``config`` says, on this process's share of the data; return the record and model.

    ``on_step(step)`` runs after every optimizer step (a profiler's ``step()``, a memory probe).
    """
    validate_config(config)
    with deterministic_kernels(config.deterministic):
        return _train(config, data, on_step)


def _train(config: TrainConfig, data: CifarData | TokenData | None, on_step: Callable[[int], None] | None) -> RunResult:
    run = TrainingRun(config, data)  # the process group, the data, the model, the optimizer, a checkpoint resumed
    epoch = run.step // run.steps_per_epoch
    while run.step < run.total_steps and not run.interrupted:
        sums, first = run.train_epoch(epoch, on_step)
        run.end_epoch(epoch, sums, first)  # evaluation, the epoch's scalars, a checkpoint
        epoch += 1
    return run.result()


class TrainingRun:
    """One call of ``train``: its set-up, what changes from step to step, and the record it ends with."""

    def __init__(self, config: TrainConfig, data: CifarData | TokenData | None):
        self.config, self.started, self.cpu_started = config, time.perf_counter(), _cpu_seconds()
        self.info, self.device = info, device = setup_distributed(config.device)
        self.say = print if info.is_main else (lambda *a, **k: None)
        self.notes = configure_precision(config.precision, device)
        for note in self.notes:
            self.say(f"note: {note}")
        self.text = config.model in TOKEN_MODELS
        self.data = self._data(data)
        self.memory_at_start = memory_in_use_mib(device)
        self.train_loader, self.test_loader = self._loaders()
        self.steps_per_epoch, self.total_steps = self._plan()
        # The run's memory is what it adds from here: the device-resident data set and models
        # still alive from earlier runs in this process are already counted in the baseline.
        reset_peak_memory(device)
        self.memory_before = memory_in_use_mib(device)
        self._build()
        self.step, self.resumed_from = self._resume()
        self.flops_per_sample = (training_flops_per_sequence(self.model, config.tokens_per_sequence) if self.text
                                 else training_flops_per_sample(self.model))
        self._wrap()
        self.timer = StepTimer(device, warmup_steps=config.warmup_steps + (self.resumed_from or 0))
        self.phase = phase_ranges(config.annotate, device)
        self.scalars = ScalarLog(config.tensorboard_dir, info.is_main, config.name)
        self.step_lrs: list[float] = []  # the learning rate of each step, a host value: logging it costs no sync
        self.step_losses, self.history = [], []
        self.capture = config.annotate and device.type == "cuda"
        self.stop_poll = _StopPoll(device, info.distributed) if handling_signals() else None
        self.pending_log = None
        self.hook_peak = 0.0  # the peak memory seen before each on_step call, in MiB
        self.train_peak = self.eval_peak = 0.0  # training's peak and evaluation's, read apart: the record has training's
        self.interrupted = False
        self.bar = progress_bar(total=self.total_steps, initial=self.step, desc=config.name, unit="step",
                                disable=not (config.progress and info.is_main),
                                mininterval=2.0)  # headless logs get a line every 2 s, not every step
        # a step GradScaler skips (an overflow) is no scheduler called out of order: PyTorch's warning says it is
        warnings.filterwarnings("ignore", message=r"Detected call of `lr_scheduler\.step\(\)` before")

    # ---------------------------------------------------------------- set-up

    def _data(self, data):
        config, info = self.config, self.info
        if data is None and self.text:
            data = load_text(config.data_root, quiet=not info.is_main)
        elif data is None:
            # The synthetic set stands in for CIFAR-10, which no seed changes: the run's seed decides the
            # initial weights, the order and the augmentation, never which images there are.
            data = load_data(config.data_root, config.train_size, config.test_size, config.synthetic,
                             quiet=not info.is_main)
        _check_data_kind(config, data)
        if self.text:
            data.check_windows(config.tokens_per_sequence)  # a split without one whole window: one line, no step
        if not self.text and (config.train_size or config.test_size):
            data = data.first(config.train_size, config.test_size)  # the config's sizes hold for images passed in too
        if info.distributed:
            check_same_data(data)
        return data

    def _loaders(self):
        config, info, data = self.config, self.info, self.data
        common = dict(device=self.device, seed=config.seed, rank=info.rank, world_size=info.world_size,
                      channels_last=config.channels_last)
        common.update(num_workers=config.num_workers, pin_memory=config.pin_memory,
                      persistent_workers=config.persistent_workers, prefetch_factor=config.prefetch_factor)
        if self.text:
            sequence = config.tokens_per_sequence
            return (make_token_loader(config.loader, data.train_tokens, sequence, config.batch_size, train=True,
                                      limit=config.train_size, **common),
                    make_token_loader(config.loader, data.val_tokens, sequence, config.eval_batch_size, train=False,
                                      limit=config.test_size, **common))
        return (make_loader(config.loader, data.train_images, data.train_labels, config.batch_size, train=True,
                            **common),
                make_loader(config.loader, data.test_images, data.test_labels, config.eval_batch_size, train=False,
                            **common))

    def _plan(self) -> tuple[int, int]:
        """Optimizer steps per epoch (a last group short of micro-batches is left out) and in all."""
        config, accumulation = self.config, self.config.accumulation_steps
        steps_per_epoch = len(self.train_loader) // accumulation
        if steps_per_epoch == 0:
            if self.text:
                have = f"{self.train_loader.windows} training sequences of {config.tokens_per_sequence} tokens"
                more = "more training text"
            else:
                have, more = f"{len(self.data.train_labels)} training images", "more training images"
            micro = f" x {accumulation} micro-batches" if accumulation > 1 else ""
            raise WorkshopError(
                f"batch_size {config.batch_size}{micro} x {self.info.world_size} process(es) is larger than the "
                f"{have}: not one full step fits.",
                f"use a smaller batch size{' or fewer accumulation steps' if micro else ''} or {more}.",
            )
        total_steps = config.epochs * steps_per_epoch
        return steps_per_epoch, min(total_steps, config.max_steps) if config.max_steps is not None else total_steps

    def _build(self) -> None:
        config = self.config
        torch.manual_seed(config.seed)  # same initial weights on every rank
        model = build_model(config.model, size=config.gpt_size if self.text else None).to(self.device)
        if self.text:
            self.data.check_vocabulary(model.size.vocab)
            model.use_attention(config.attention)
        if config.channels_last:
            model = model.to(memory_format=torch.channels_last)
        self.model = model
        self.optimizer = build_optimizer(config, model)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer,
                                                           _lr_lambda(config.lr_warmup_steps, self.total_steps))
        self.scaler = grad_scaler(config.precision, self.device)

    def _resume(self) -> tuple[int, int | None]:
        config = self.config
        if not config.resume:
            return 0, None
        path = latest_checkpoint(config.checkpoint_dir) if config.resume is True else Path(config.resume)
        if path is None:
            self.say(f"No checkpoint in {config.checkpoint_dir} yet: starting from scratch.")
            return 0, None
        state = load_checkpoint(path, model=self.model, optimizer=self.optimizer, scaler=self.scaler,
                                scheduler=self.scheduler, model_name=config.model)
        self.say(f"Resumed from {path} at step {state['step']}.")
        return state["step"], state["step"]

    def _wrap(self) -> None:
        """DDP around the model when there are several ranks (its all-reduces counted); then torch.compile."""
        config, device = self.config, self.device
        self.eval_model, self.all_reduces = self.model, [0]  # gradient buckets this rank all-reduced
        if self.info.distributed:
            self.eval_model = DistributedDataParallel(self.model, bucket_cap_mb=config.bucket_cap_mb,
                                                      device_ids=[device.index] if device.type == "cuda" else None)
            self.eval_model.register_comm_hook(self.all_reduces, counting_all_reduce)
        # Evaluation uses the uncompiled model: compiled, eval mode and the ragged last batch would recompile.
        if config.compile:
            # Each run compiles afresh. Dynamo's caches outlive a run: the next run in this process (a ladder rung, a
            # sweep point) would recompile with a dynamic batch dimension, slower kernels, and after 8 recompiles of
            # the model's code fall back to eager without a word. Kernels compiled before stay on disk.
            torch._dynamo.reset()
        self.train_model = (torch.compile(self.eval_model, mode=config.compile_mode) if config.compile
                            else self.eval_model)

    def checkpoint(self, epoch_index: int) -> None:
        config = self.config
        if config.checkpoint_dir and self.info.is_main:
            save_checkpoint(checkpoint_path(config.checkpoint_dir, self.step), model=self.model,
                            optimizer=self.optimizer, scaler=self.scaler, scheduler=self.scheduler, step=self.step,
                            epoch=epoch_index, model_name=config.model, extra={"config": dataclasses.asdict(config)})
            prune_checkpoints(config.checkpoint_dir, config.keep_checkpoints)

    # ---------------------------------------------------------------- the loop

    def train_epoch(self, epoch: int, on_step) -> tuple[torch.Tensor, int]:
        """Optimizer steps until the epoch's last full step, the planned total, or a stop; the epoch's sums."""
        self.train_model.train()
        sums = torch.zeros(3, device=self.device, dtype=torch.float64)  # loss sum, correct, samples
        batches = self.train_loader.epoch(epoch, start_batch=(self.step % self.steps_per_epoch)
                                          * self.config.accumulation_steps)
        first = len(self.step_losses)
        self.timer.begin()
        while self.step < self.total_steps:
            if self.capture and self.step == self.timer.warmup_steps:
                torch.cuda.profiler.start()  # nsys --capture-range=cudaProfilerApi records from here
            if self.step == (epoch + 1) * self.steps_per_epoch:
                break  # the epoch's last full group of micro-batches is done
            loss = self.train_step(batches, sums)
            if loss is None:
                break
            if self.after_step(epoch, loss, on_step):
                self.interrupted = True
                break
        batches.close()
        if self.capture and self.step > self.timer.warmup_steps:
            torch.cuda.profiler.stop()  # the capture holds the timed steps only, not the evaluation after them
            self.capture = False
        return sums, first

    def train_step(self, batches, sums: torch.Tensor) -> torch.Tensor | None:
        """One optimizer step over ``accumulation_steps`` micro-batches; its mean loss, or None when data ran out."""
        config, info, phase, step = self.config, self.info, self.phase, self.step
        accumulation, loss = config.accumulation_steps, None
        for micro in range(accumulation):
            waited = time.perf_counter()
            with phase("data"):
                batch = next(batches, None)
            if batch is None:
                return None
            inputs, targets = batch
            # A DataLoader says how long it waited for the batch in host memory (``host_batches``); the copy
            # to the GPU after it is not data time. A device-resident loader's whole call is.
            wait = getattr(self.train_loader, "last_wait_s", None)
            self.timer.add_data_wait(step, wait if wait is not None else time.perf_counter() - waited)
            seed_dropout(config.seed, info.rank, step * accumulation + micro)
            # DDP all-reduces in backward(); under no_sync() the gradients only add up on each rank.
            skip_sync = info.distributed and micro < accumulation - 1 and not config.sync_micro_batches
            with self.eval_model.no_sync() if skip_sync else contextlib.nullcontext():
                with phase("forward"), autocast(config.precision, self.device):
                    micro_loss, correct = forward_loss(self.train_model, inputs, targets, self.text)
                with phase("backward"):
                    if micro == 0:
                        self.optimizer.zero_grad(set_to_none=True)
                    self.scaler.scale(micro_loss / accumulation if accumulation > 1 else micro_loss).backward()
            # A clone: a replayed CUDA graph writes its next outputs where these are.
            micro_loss = micro_loss.detach().clone()
            sums[0] += micro_loss.float() * targets.numel()
            sums[1] += correct
            sums[2] += targets.numel()
            loss = micro_loss if loss is None else loss + micro_loss
        with phase("optimizer"):
            self.step_lrs.append(self.scheduler.get_last_lr()[0])
            self.scaler.step(self.optimizer)
            self.scaler.update()
            self.scheduler.step()
        return loss / accumulation if accumulation > 1 else loss

    def after_step(self, epoch: int, loss: torch.Tensor, on_step) -> bool:
        """Count the step, run the hook, checkpoint and log as configured; True when the run must stop here."""
        config, info = self.config, self.info
        self.step_losses.append(loss)
        self.timer.step_done(self.step)
        self.step += 1
        step = self.step
        self.bar.update(1)
        if on_step is not None:
            # A hook may reset the peak (a per-step memory probe does): keep the run's own peak first.
            self.hook_peak = max(self.hook_peak, peak_memory_mib(self.device)[0])
            on_step(step)
        if config.fail_at_step == step and info.rank == info.world_size - 1 and _restart_count() == 0:
            self.bar.close()
            raise InjectedFailure(f"injected failure on rank {info.rank} at step {step} (--fail-at-step)")
        if config.checkpoint_every and step % config.checkpoint_every == 0:
            self.checkpoint(epoch)
        if config.log_every and step % config.log_every == 0 and info.is_main:
            # Printed one log interval late, so that reading the loss never waits for the GPU.
            _print_log(self.pending_log, self.total_steps)
            self.pending_log = (step, _to_host_async(loss), self.scheduler.get_last_lr()[0])
        if config.stop_after_step == step:
            return True
        if self.stop_poll is not None and step % STOP_POLL_STEPS == 0 and self.stop_poll.should_stop():
            self.say(f"Stop signal received: checkpointing at step {step} and stopping.", flush=True)
            return True
        return False

    def end_epoch(self, epoch: int, sums: torch.Tensor, first: int) -> None:
        """The epoch's training figures, its evaluation (its memory apart from training's), scalars, checkpoint."""
        config, device, step = self.config, self.device, self.step
        self.scalars.training_steps_done(device)  # before the sync and the evaluation below change what the GPU does
        loss_sum, correct, seen = all_reduce_sum(sums).tolist()
        row = {"epoch": epoch + 1, "step": step, "train_loss": loss_sum / max(seen, 1),
               "train_acc": correct / max(seen, 1), "lr": self.scheduler.get_last_lr()[0]}
        _print_log(self.pending_log, self.total_steps)
        self.pending_log = None
        self.train_peak = max(self.train_peak, peak_memory_mib(device)[0])
        reset_peak_memory(device, release=False)
        row["test_loss"], row["test_acc"] = evaluate(self.eval_model, self.test_loader, device, config.precision)
        self.eval_peak = max(self.eval_peak, peak_memory_mib(device)[0])
        reset_peak_memory(device, release=False)
        if self.text:
            row["test_bits_per_byte"] = bits_per_byte(row["test_loss"], self.data.bytes_per_token)
        self.history.append(row)
        steps_done, step_s = self.timer.last_stretch()
        self.scalars.epoch_end(step, row, [n + 1 for n in steps_done], self.step_losses[first:], self.step_lrs[first:],
                               step_s, config.batch_size * config.accumulation_steps * self.info.world_size)
        self.bar.set_postfix(loss=f"{row['train_loss']:.3f}", test_acc=f"{row['test_acc']:.3f}")
        epoch_done = step % self.steps_per_epoch == 0 or step == self.total_steps
        if self.interrupted or (epoch_done and not config.checkpoint_every) or step == self.total_steps:
            self.checkpoint(epoch + 1 if epoch_done else epoch)

    # ---------------------------------------------------------------- the record

    def result(self) -> RunResult:
        self.bar.close()
        self.scalars.close()
        config, info, history = self.config, self.info, self.history
        samples_per_step = config.batch_size * config.accumulation_steps * info.world_size
        timing = self.timer.summary(samples_per_step)
        peak, memory_kind = peak_memory_mib(self.device)
        peak = max(peak, self.hook_peak, self.train_peak)
        throughput = timing["samples_per_s"]
        per_device_tflops = (achieved_tflops(self.flops_per_sample, throughput / info.world_size)
                             if throughput else None)
        name = device_name(self.device)
        last = history[-1] if history else {}
        metrics = {
            **timing,
            "steps": self.step,
            "steps_planned": self.total_steps,
            "epochs_done": len(history),
            "world_size": info.world_size,
            "global_batch_size": samples_per_step,
            "accumulation_steps": config.accumulation_steps,
            "all_reduces": self.all_reduces[0] if info.distributed else None,
            "peak_memory_mib": max(0.0, peak - self.memory_before),
            "memory_kind": f"{memory_kind}, above what was in use before the model was built, training steps only",
            "eval_peak_memory_mib": max(0.0, self.eval_peak - self.memory_before) if history else None,
            "data_on_device_mib": (max(0.0, self.memory_before - self.memory_at_start) if config.loader == "device"
                                   else 0.0),
            "parameters": count_parameters(self.model),
            "flops_per_sample": self.flops_per_sample,
            "tflops_per_device": per_device_tflops,
            "mfu": mfu(per_device_tflops, name, config.precision) if per_device_tflops else None,
            "device_name": name,
            "final_train_loss": last.get("train_loss"),
            "final_test_loss": last.get("test_loss"),
            "final_test_acc": last.get("test_acc"),
            "data_source": self.data.source,
            "param_checksum": parameter_checksum(self.model),
            "resumed_from_step": self.resumed_from,
            "interrupted": self.interrupted,
            "wall_s": time.perf_counter() - self.started,
            # What a job's accounting reports as TotalCPU and MaxRSS, for this run's process (notebook 06's 6.3)
            "cpu_time_s": _cpu_seconds() - self.cpu_started,
            "max_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024 if resource else None,
        }
        if self.text:  # losses are nats per token; the accuracies are next-token accuracies
            sequence = config.tokens_per_sequence
            metrics.update({
                "sequence_length": sequence,
                "tokens_per_step": samples_per_step * sequence,
                "tokens_per_s": throughput * sequence if throughput else None,
                "flops_per_token": self.flops_per_sample / sequence,
                "final_test_bits_per_byte": last.get("test_bits_per_byte"),
                "corpus": self.data.corpus,
            })
        record = {
            "kind": "train",
            "config": dataclasses.asdict(config),
            "metrics": metrics,
            "history": history,
            "step_loss": torch.stack(self.step_losses).float().cpu().tolist() if self.step_losses else [],
            "step_ms": (self.timer.step_times() * 1e3).tolist(),
            "first_step": self.resumed_from or 0,
            "notes": self.notes,
            "environment": environment(self.device),
        }
        return RunResult(record, unwrap(self.train_model))
