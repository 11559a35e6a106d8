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
import torch.nn.functional as F
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.nn.parallel import DistributedDataParallel

from .checkpoint import checkpoint_path, latest_checkpoint, load_checkpoint, prune_checkpoints, save_checkpoint
from .config import TrainConfig, validate_config
from .data import CifarData, mix_seeds, load_data, make_loader
from .distributed import all_reduce_sum, setup_distributed
from ..system.errors import WorkshopError
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
    started, cpu_started = time.perf_counter(), _cpu_seconds()
    info, device = setup_distributed(config.device)
    say = print if info.is_main else (lambda *a, **k: None)
    notes = configure_precision(config.precision, device)
    for note in notes:
        say(f"note: {note}")
    text = config.model in TOKEN_MODELS
    if data is None and text:
        data = load_text(config.data_root, quiet=not info.is_main)
    elif data is None:
        # The synthetic set stands in for CIFAR-10, which no seed changes: the run's seed decides the
        # initial weights, the order and the augmentation, never which images there are.
        data = load_data(config.data_root, config.train_size, config.test_size, config.synthetic,
                         quiet=not info.is_main)
    _check_data_kind(config, data)
    if text:
        data.check_windows(config.tokens_per_sequence)  # a split without one whole window: one line, before any step
    if not text and (config.train_size or config.test_size):
        data = data.first(config.train_size, config.test_size)  # the config's sizes hold for images passed in too
    if info.distributed:
        check_same_data(data)
    memory_at_start = memory_in_use_mib(device)

    common = dict(device=device, seed=config.seed, rank=info.rank, world_size=info.world_size,
                  channels_last=config.channels_last)
    dataloader_options = dict(num_workers=config.num_workers, pin_memory=config.pin_memory,
                              persistent_workers=config.persistent_workers, prefetch_factor=config.prefetch_factor)
    sequence = config.tokens_per_sequence
    if text:
        train_loader = make_token_loader(config.loader, data.train_tokens, sequence, config.batch_size, train=True,
                                         limit=config.train_size, **common, **dataloader_options)
        test_loader = make_token_loader(config.loader, data.val_tokens, sequence, config.eval_batch_size,
                                        train=False, limit=config.test_size, **common, **dataloader_options)
        have, more = f"{train_loader.windows} training sequences of {sequence} tokens", "more training text"
    else:
        train_loader = make_loader(config.loader, data.train_images, data.train_labels, config.batch_size,
                                   train=True, **common, **dataloader_options)
        test_loader = make_loader(config.loader, data.test_images, data.test_labels, config.eval_batch_size,
                                  train=False, **common, **dataloader_options)
        have, more = f"{len(data.train_labels)} training images", "more training images"
    accumulation = config.accumulation_steps
    steps_per_epoch = len(train_loader) // accumulation  # a last group short of micro-batches is left out
    if steps_per_epoch == 0:
        micro = f" x {accumulation} micro-batches" if accumulation > 1 else ""
        raise WorkshopError(
            f"batch_size {config.batch_size}{micro} x {info.world_size} process(es) is larger than the "
            f"{have}: not one full step fits.",
            f"use a smaller batch size{' or fewer accumulation steps' if micro else ''} or {more}.",
        )
    total_steps = config.epochs * steps_per_epoch
    if config.max_steps is not None:
        total_steps = min(total_steps, config.max_steps)

    # The run's memory is what it adds from here: the device-resident data set and models
    # still alive from earlier runs in this process are already counted in the baseline.
    reset_peak_memory(device)
    memory_before = memory_in_use_mib(device)
    torch.manual_seed(config.seed)  # same initial weights on every rank
    model = build_model(config.model, size=config.gpt_size if text else None).to(device)
    if text:
        data.check_vocabulary(model.size.vocab)
        model.use_attention(config.attention)
    if config.channels_last:
        model = model.to(memory_format=torch.channels_last)
    optimizer = build_optimizer(config, model)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, _lr_lambda(config.lr_warmup_steps, total_steps))
    scaler = grad_scaler(config.precision, device)

    step, resumed_from = 0, None
    if config.resume:
        path = latest_checkpoint(config.checkpoint_dir) if config.resume is True else Path(config.resume)
        if path is not None:
            state = load_checkpoint(path, model=model, optimizer=optimizer, scaler=scaler, scheduler=scheduler,
                                    model_name=config.model)
            step = resumed_from = state["step"]
            say(f"Resumed from {path} at step {step}.")
        else:
            say(f"No checkpoint in {config.checkpoint_dir} yet: starting from scratch.")

    flops_per_sample = training_flops_per_sequence(model, sequence) if text else training_flops_per_sample(model)
    eval_model = model
    all_reduces = [0]  # gradient buckets this rank all-reduced
    if info.distributed:
        eval_model = DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None,
                                             bucket_cap_mb=config.bucket_cap_mb)
        eval_model.register_comm_hook(all_reduces, counting_all_reduce)
    # Evaluation uses the uncompiled model: compiled, eval mode and the ragged last batch would recompile.
    if config.compile:
        # Each run compiles afresh. Dynamo's caches outlive a run: the next run in this process (a ladder rung, a
        # sweep point) would recompile with a dynamic batch dimension, slower kernels, and after 8 recompiles of
        # the model's code fall back to eager without a word. Kernels compiled before stay on disk.
        torch._dynamo.reset()
    train_model = torch.compile(eval_model, mode=config.compile_mode) if config.compile else eval_model

    def checkpoint(epoch_index: int) -> None:
        if config.checkpoint_dir and info.is_main:
            save_checkpoint(checkpoint_path(config.checkpoint_dir, step), model=model, optimizer=optimizer,
                            scaler=scaler, scheduler=scheduler, step=step, epoch=epoch_index,
                            model_name=config.model, extra={"config": dataclasses.asdict(config)})
            prune_checkpoints(config.checkpoint_dir, config.keep_checkpoints)

    timer = StepTimer(device, warmup_steps=config.warmup_steps + (resumed_from or 0))
    phase = phase_ranges(config.annotate, device)
    scalars = ScalarLog(config.tensorboard_dir, info.is_main, config.name)
    step_lrs: list[float] = []  # the learning rate of each step, a host value: logging it costs no sync
    capture = config.annotate and device.type == "cuda"
    stop_poll = _StopPoll(device, info.distributed) if handling_signals() else None
    pending_log = None
    hook_peak = 0.0  # the peak memory seen before each on_step call, in MiB
    train_peak = eval_peak = 0.0  # training steps' peak and evaluation's, read apart: the record reports training's
    step_losses, history = [], []
    interrupted = False
    bar = progress_bar(total=total_steps, initial=step, desc=config.name, unit="step",
                       disable=not (config.progress and info.is_main),
                       mininterval=2.0)  # headless logs get a line every 2 s, not every step
    warnings.filterwarnings("ignore", message="Detected call of `lr_scheduler.step()` before")
    epoch = step // steps_per_epoch
    while step < total_steps and not interrupted:
        train_model.train()
        sums = torch.zeros(3, device=device, dtype=torch.float64)  # loss sum, correct, samples
        batches = train_loader.epoch(epoch, start_batch=(step % steps_per_epoch) * accumulation)
        epoch_first = len(step_losses)
        timer.begin()
        while step < total_steps:
            if capture and step == timer.warmup_steps:
                torch.cuda.profiler.start()  # nsys --capture-range=cudaProfilerApi records from here
            if step == (epoch + 1) * steps_per_epoch:
                break  # the epoch's last full group of micro-batches is done
            loss = None
            for micro in range(accumulation):
                waited = time.perf_counter()
                with phase("data"):
                    batch = next(batches, None)
                if batch is None:
                    break
                inputs, targets = batch
                # A DataLoader says how long it waited for the batch in host memory (``host_batches``); the copy
                # to the GPU after it is not data time. A device-resident loader's whole call is.
                wait = getattr(train_loader, "last_wait_s", None)
                timer.add_data_wait(step, wait if wait is not None else time.perf_counter() - waited)
                seed_dropout(config.seed, info.rank, step * accumulation + micro)
                # DDP all-reduces in backward(); under no_sync() the gradients only add up on each rank.
                skip_sync = info.distributed and micro < accumulation - 1 and not config.sync_micro_batches
                with eval_model.no_sync() if skip_sync else contextlib.nullcontext():
                    with phase("forward"), autocast(config.precision, device):
                        micro_loss, correct = forward_loss(train_model, inputs, targets, text)
                    with phase("backward"):
                        if micro == 0:
                            optimizer.zero_grad(set_to_none=True)
                        scaler.scale(micro_loss / accumulation if accumulation > 1 else micro_loss).backward()
                # A clone: a replayed CUDA graph writes its next outputs where these are.
                micro_loss = micro_loss.detach().clone()
                sums[0] += micro_loss.float() * targets.numel()
                sums[1] += correct
                sums[2] += targets.numel()
                loss = micro_loss if loss is None else loss + micro_loss
            if batch is None:
                break
            with phase("optimizer"):
                step_lrs.append(scheduler.get_last_lr()[0])
                scaler.step(optimizer)
                scaler.update()
                scheduler.step()
            loss = loss / accumulation if accumulation > 1 else loss
            step_losses.append(loss)
            timer.step_done(step)
            step += 1
            bar.update(1)
            if on_step is not None:
                # A hook may reset the peak (a per-step memory probe does): keep the run's own peak first.
                hook_peak = max(hook_peak, peak_memory_mib(device)[0])
                on_step(step)
            if config.fail_at_step == step and info.rank == info.world_size - 1 and _restart_count() == 0:
                bar.close()
                raise InjectedFailure(f"injected failure on rank {info.rank} at step {step} (--fail-at-step)")
            if config.checkpoint_every and step % config.checkpoint_every == 0:
                checkpoint(epoch)
            if config.log_every and step % config.log_every == 0 and info.is_main:
                # Printed one log interval late, so that reading the loss never waits for the GPU.
                _print_log(pending_log, total_steps)
                pending_log = (step, _to_host_async(loss), scheduler.get_last_lr()[0])
            if config.stop_after_step == step:
                interrupted = True
                break
            if stop_poll is not None and step % STOP_POLL_STEPS == 0 and stop_poll.should_stop():
                say(f"Stop signal received: checkpointing at step {step} and stopping.", flush=True)
                interrupted = True
                break
        batches.close()
        if capture and step > timer.warmup_steps:
            torch.cuda.profiler.stop()  # the capture holds the timed steps only, not the evaluation after them
            capture = False
        scalars.training_steps_done(device)  # before the sync and the evaluation below change what the GPU does
        loss_sum, correct, seen = all_reduce_sum(sums).tolist()
        row = {"epoch": epoch + 1, "step": step, "train_loss": loss_sum / max(seen, 1),
               "train_acc": correct / max(seen, 1), "lr": scheduler.get_last_lr()[0]}
        _print_log(pending_log, total_steps)
        pending_log = None
        train_peak = max(train_peak, peak_memory_mib(device)[0])
        reset_peak_memory(device)
        row["test_loss"], row["test_acc"] = evaluate(eval_model, test_loader, device, config.precision)
        eval_peak = max(eval_peak, peak_memory_mib(device)[0])
        reset_peak_memory(device)
        if text:
            row["test_bits_per_byte"] = bits_per_byte(row["test_loss"], data.bytes_per_token)
        history.append(row)
        steps_done, step_s = timer.last_stretch()
        scalars.epoch_end(step, row, [n + 1 for n in steps_done], step_losses[epoch_first:], step_lrs[epoch_first:],
                          step_s, config.batch_size * accumulation * info.world_size)
        bar.set_postfix(loss=f"{row['train_loss']:.3f}", test_acc=f"{row['test_acc']:.3f}")
        epoch_done = step % steps_per_epoch == 0 or step == total_steps
        if interrupted or (epoch_done and not config.checkpoint_every) or step == total_steps:
            checkpoint(epoch + 1 if epoch_done else epoch)
        epoch += 1
    bar.close()
    scalars.close()

    samples_per_step = config.batch_size * accumulation * info.world_size
    timing = timer.summary(samples_per_step)
    peak, memory_kind = peak_memory_mib(device)
    peak = max(peak, hook_peak, train_peak)
    memory = max(0.0, peak - memory_before)
    throughput = timing["samples_per_s"]
    per_device_tflops = (achieved_tflops(flops_per_sample, throughput / info.world_size)
                         if throughput else None)
    name = device_name(device)
    metrics = {
        **timing,
        "steps": step,
        "steps_planned": total_steps,
        "epochs_done": len(history),
        "world_size": info.world_size,
        "global_batch_size": samples_per_step,
        "accumulation_steps": accumulation,
        "all_reduces": all_reduces[0] if info.distributed else None,
        "peak_memory_mib": memory,
        "memory_kind": f"{memory_kind}, above what was in use before the model was built, training steps only",
        "eval_peak_memory_mib": max(0.0, eval_peak - memory_before) if history else None,
        "data_on_device_mib": max(0.0, memory_before - memory_at_start) if config.loader == "device" else 0.0,
        "parameters": count_parameters(model),
        "flops_per_sample": flops_per_sample,
        "tflops_per_device": per_device_tflops,
        "mfu": mfu(per_device_tflops, name, config.precision) if per_device_tflops else None,
        "device_name": name,
        "final_train_loss": history[-1]["train_loss"] if history else None,
        "final_test_loss": history[-1]["test_loss"] if history else None,
        "final_test_acc": history[-1]["test_acc"] if history else None,
        "data_source": data.source,
        "param_checksum": parameter_checksum(model),
        "resumed_from_step": resumed_from,
        "interrupted": interrupted,
        "wall_s": time.perf_counter() - started,
        # What a job's accounting reports as TotalCPU and MaxRSS, for this run's process (notebook 06's Exercise 6.3)
        "cpu_time_s": _cpu_seconds() - cpu_started,
        "max_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024 if resource else None,
    }
    if text:  # losses are nats per token; the accuracies are next-token accuracies
        metrics.update({
            "sequence_length": sequence,
            "tokens_per_step": samples_per_step * sequence,
            "tokens_per_s": throughput * sequence if throughput else None,
            "flops_per_token": flops_per_sample / sequence,
            "final_test_bits_per_byte": history[-1]["test_bits_per_byte"] if history else None,
            "corpus": data.corpus,
        })
    record = {
        "kind": "train",
        "config": dataclasses.asdict(config),
        "metrics": metrics,
        "history": history,
        "step_loss": torch.stack(step_losses).float().cpu().tolist() if step_losses else [],
        "step_ms": (timer.step_times() * 1e3).tolist(),
        "first_step": resumed_from or 0,
        "notes": notes,
        "environment": environment(device),
    }
    return RunResult(record, unwrap(train_model))
