"""``TrainConfig``: every knob of a training run, with the one check of its values.

Each field carries its own help text (with units), its allowed values (the very
tables the code checks against) and its group in ``--help``: the command line
``python -m workshop_utils.train`` generates one flag per field from them, so a
new field is a new flag without anyone retyping it. ``validate_config`` is the
one check, whoever builds the config: a notebook, ``train()``, the command line.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import numbers
import re
import typing
from dataclasses import dataclass, field

from ..system.errors import WorkshopError, choose
from ..system.hardware import PRECISIONS
from ..system.results import check_output_path
from .data import LOADERS
from .gpt import ATTENTION, GPT_SIZES
from .models import MODELS, TOKEN_MODELS

DEVICES = ("cuda", "cpu")  # None: a GPU per local rank when there are GPUs, else the CPU
# What users type, and what str(torch.device) gives back: "cuda:1" names one GPU of several.
DEVICE_FORM = re.compile(r"cpu|cuda(:(0|[1-9][0-9]*))?")
OPTIMIZER_KERNELS = ("default", "foreach", "fused")  # PyTorch's choice; one kernel per group; one for all
COMPILE_MODES = ("default", "reduce-overhead", "max-autotune")  # reduce-overhead replays CUDA graphs
OPTIMIZERS = ("sgd", "adamw")  # SGD with Nesterov momentum (the CNNs); AdamW (what transformers are trained with)

# Groups of --help, in this order.
WHAT, HOW_MUCH, OPTIMIZER, DATA, SPEED, STATE, OUTPUT = GROUPS = (
    "what to train", "how much", "optimizer", "data", "speed",
    "checkpoints and failures", "output")


@dataclass(frozen=True)
class Setting:
    """What a field means to a person: help, allowed values, and how the command line spells it."""

    help: str  # with units
    group: str  # one of GROUPS
    choices: tuple | None = None  # the allowed strings (the table the code checks against)
    minimum: int | None = None  # whole-number fields: the smallest allowed value
    maximum: int | None = None
    words: dict = field(default_factory=dict)  # command-line words for values: {"auto": None}
    aliases: tuple[str, ...] = ()  # more flags besides --field-name
    metavar: str | None = None


def setting(default, help: str, group: str, **more):
    """A field with its default, help and rules side by side: written once, read by --help and by the check."""
    return field(default=default, metadata={"setting": Setting(help, group, **more)})


@dataclass
class TrainConfig:
    """Everything that defines a training run; every field is also a flag of ``python -m workshop_utils.train``."""

    name: str = setting("run", "label of the result record and the progress bar", WHAT)
    model: str = setting("simplecnn", "network", WHAT, choices=MODELS)
    gpt_size: str = setting("tiny", "size of model gpt: tiny (840,960 parameters, for CPUs) or gpt2-small "
                                    "(124,448,256: GPT-2 small, to fill a GPU)", WHAT, choices=tuple(GPT_SIZES))
    sequence_length: int | None = setting(None, "tokens per training sequence, model gpt only (default: the size's "
                                                "context, 128 tiny, 1024 gpt2-small; at most that)", WHAT, minimum=1)
    precision: str = setting("fp32", "fp32 (TF32 off), tf32, fp16 (+ GradScaler) or bf16", WHAT, choices=PRECISIONS)
    batch_size: int = setting(128, "samples per process per forward and backward pass (per optimizer step unless "
                                   "accumulation_steps is above 1)", HOW_MUCH, minimum=1)
    accumulation_steps: int = setting(1, "micro-batches of batch_size each process adds up before one optimizer step: "
                                         "the global batch is batch_size x accumulation_steps x processes",
                                      HOW_MUCH, minimum=1)
    epochs: int = setting(1, "passes over the training set", HOW_MUCH, minimum=1)
    max_steps: int | None = setting(None, "optimizer steps in total; caps --epochs (default: what the epochs take)",
                                    HOW_MUCH, minimum=1, aliases=("--steps",))
    optimizer: str = setting("sgd", "sgd: SGD with Nesterov momentum; adamw: AdamW, betas (0.9, 0.95), no decay "
                                    "on biases and norms (GPT training's choice)", OPTIMIZER, choices=OPTIMIZERS)
    lr: float = setting(0.05, "peak learning rate (sgd 0.05; adamw takes about 1e-3)", OPTIMIZER)
    momentum: float = setting(0.9, "SGD momentum, above 0 and below 1", OPTIMIZER)
    weight_decay: float = setting(5e-4, "L2 penalty on the weights (sgd), decoupled weight decay (adamw); 0 or more",
                                  OPTIMIZER)
    lr_warmup_steps: int = setting(0, "steps of linear learning-rate warm-up before the cosine decay", OPTIMIZER,
                                   minimum=0)
    loader: str = setting("torch", "torch: DataLoader + PIL transforms; device: the data set resident on the device",
                          DATA, choices=LOADERS)
    num_workers: int = setting(0, "DataLoader worker processes (torch loader only)", DATA, minimum=0)
    pin_memory: bool = setting(False, "page-locked host buffers for faster, async copies (torch loader, GPU only)",
                               DATA)
    persistent_workers: bool = setting(False, "keep workers alive between epochs (torch loader)", DATA)
    prefetch_factor: int | None = setting(None, "batches each worker loads ahead (torch loader; default: PyTorch's)",
                                          DATA, minimum=1)
    channels_last: bool = setting(False, "NHWC memory layout, what tensor-core convolutions prefer (images only)",
                                  SPEED)
    attention: str = setting("fused", "model gpt: fused (scaled_dot_product_attention, PyTorch's flash or "
                                      "memory-efficient kernel) or math (matmul, mask, softmax, matmul, the attention "
                                      "matrix stored)", SPEED, choices=ATTENTION)
    compile: bool = setting(False, "torch.compile the model", SPEED)
    compile_mode: str = setting("default", "torch.compile mode: reduce-overhead replays CUDA graphs (one launch per "
                                           "step), max-autotune also searches kernels (minutes)", SPEED,
                                choices=COMPILE_MODES)
    optimizer_kernels: str = setting("default", "how the SGD update runs: default (PyTorch's choice), foreach (a few "
                                                "kernels for all tensors) or fused (one kernel)", OPTIMIZER,
                                     choices=OPTIMIZER_KERNELS)
    deterministic: bool = setting(False, "deterministic GPU kernels where PyTorch has them: exact resume, "
                                         "some speed lost", SPEED)
    sync_micro_batches: bool = setting(False, "with accumulation under DDP, all-reduce after every micro-batch (off: "
                                              "no_sync() skips all but the last one's; the same gradients, fewer "
                                              "all-reduces)", SPEED)
    bucket_cap_mb: float = setting(25.0, "DDP's gradient bucket size in MiB (PyTorch's default, 25): larger buckets "
                                         "mean fewer all-reduces that start later in the backward pass", SPEED)
    warmup_steps: int = setting(5, "first steps left out of timing (autotuning, compilation, allocator)", SPEED,
                                minimum=0)
    eval_batch_size: int = setting(512, "samples per evaluation batch", HOW_MUCH, minimum=1)
    seed: int = setting(0, "same seed, same run", HOW_MUCH, minimum=0, maximum=2**63 - 1)
    data_root: str | None = setting(None, "folder holding CIFAR-10 (default: $WORKSHOP_DATA, then ./data); for "
                                          "model gpt, train.bin and val.bin uint16 token shards, nanoGPT's layout "
                                          "(default: the Python standard library's source as bytes)", DATA,
                                    metavar="DIR")
    train_size: int | None = setting(None, "use the first N training images, or sequences for model gpt "
                                           "(default: all)", DATA, minimum=1)
    test_size: int | None = setting(None, "use the first N test images, or validation sequences for model gpt "
                                          "(default: all)", DATA, minimum=1)
    synthetic: bool | str = setting("auto", "train on the synthetic stand-in for CIFAR-10: yes (True; the flag alone), "
                                            "no (False: missing data is an error) or auto (only when no CIFAR-10 "
                                            "is found)", DATA, words={"auto": "auto", "yes": True, "no": False})
    device: str | None = setting(None, "auto: one GPU per local rank when there are GPUs, else the CPU; cuda: "
                                       "the same on the GPU or an error; cuda:N: GPU N (one process only); cpu",
                                 SPEED, words={"auto": None}, metavar="{auto,cpu,cuda,cuda:N}")
    checkpoint_dir: str | None = setting(None, "folder where rank 0 writes checkpoints (default: none written)", STATE,
                                         metavar="DIR")
    checkpoint_every: int | None = setting(None, "steps between checkpoints (default: at each epoch's end)", STATE,
                                           minimum=1)
    keep_checkpoints: int | None = setting(2, "newest checkpoints kept; all: keep every one", STATE, minimum=1,
                                           words={"all": None})
    resume: bool | str = setting(False, "alone: from the newest checkpoint in --checkpoint-dir (if any); "
                                        "with PATH: from that checkpoint file", STATE, metavar="PATH")
    stop_after_step: int | None = setting(None, "stop cleanly (checkpoint first) after step N: a rehearsed "
                                                "interruption", STATE, minimum=1)
    fail_at_step: int | None = setting(None, "the last rank crashes at step N on the first attempt "
                                             "(fault-tolerance demo)", STATE, minimum=1)
    progress: bool = setting(True, "tqdm progress bar on rank 0", OUTPUT)
    log_every: int | None = setting(None, "rank 0 prints one line every N steps (for logs and streamed output)",
                                    OUTPUT, minimum=1)
    tensorboard_dir: str | None = setting(None, "folder where rank 0 writes TensorBoard scalars once per epoch: loss, "
                                                "accuracy, learning rate, step time, samples/s, GPU utilisation "
                                                "(default: none written)", OUTPUT, metavar="DIR")
    annotate: bool = setting(False, "name each step's phases (data, forward, backward, optimizer) for torch.profiler, "
                                    "and on a GPU as NVTX ranges inside a cudaProfilerApi capture range for Nsight "
                                    "Systems (off: not one extra call per step)", OUTPUT)

    def replace(self, **changes) -> "TrainConfig":
        return dataclasses.replace(self, **changes)

    @property
    def tokens_per_sequence(self) -> int | None:
        """The GPT's sequence length as trained (the field, else the size's context); None for image models."""
        if self.model not in TOKEN_MODELS:
            return None
        return self.sequence_length or GPT_SIZES[self.gpt_size].context


def setting_of(f: dataclasses.Field) -> Setting:
    return f.metadata["setting"]


@functools.cache
def field_types() -> dict[str, tuple[type, ...]]:
    """Each field's allowed types, read from its annotation: ``int | None`` -> (int, NoneType)."""
    return {name: typing.get_args(hint) or (hint,) for name, hint in typing.get_type_hints(TrainConfig).items()}


def _whole_number_rule(s: Setting) -> str:
    if s.maximum is not None:
        return f"a whole number from {s.minimum} to {s.maximum}"
    return "a positive whole number" if s.minimum == 1 else f"a whole number, {s.minimum} or more"


def _check_field(name: str, value, s: Setting, types: tuple[type, ...]) -> None:
    if value is None and type(None) in types:
        return
    if bool in types and str in types:  # "on", "off", or a string: a path, or one of the words
        if isinstance(value, bool):
            return
        if s.words:
            choose(value, tuple(s.words.values()), name)
        elif not isinstance(value, str) or not value:
            raise WorkshopError(f"{name} must be True, False or a path, got {value!r}.", f"set {name} to one of those.")
    elif bool in types:
        if not isinstance(value, bool):
            raise WorkshopError(f"{name} must be True or False, got {value!r}.", f"set {name} to True or False.")
    elif int in types:
        low, high = s.minimum, s.maximum
        # Integral takes numpy's integers too; bool is one to Python, but batch_size=True is a mistake, not a 1
        if (not isinstance(value, numbers.Integral) or isinstance(value, bool) or (low is not None and value < low)
                or (high is not None and value > high)):
            raise WorkshopError(f"{name} must be {_whole_number_rule(s)}, got {value!r}.",
                                f"set {name} to {low} or more." if high is None else f"set {name} to {low}..{high}.")
    elif float in types:
        if not isinstance(value, numbers.Real) or isinstance(value, bool):
            raise WorkshopError(f"{name} must be a number, got {value!r}.", f"set {name} to a number.")
    elif s.choices is not None:
        choose(value, (*s.choices, None) if type(None) in types else s.choices, name)
    elif not isinstance(value, str):
        raise WorkshopError(f"{name} must be a string, got {value!r}.", f"set {name} to a string.")


def check_device(device: str | None) -> None:
    """Refuse a device string ``TrainConfig.device`` cannot mean: None, cpu, cuda or cuda:N."""
    if device is not None and not (isinstance(device, str) and DEVICE_FORM.fullmatch(device)):
        raise WorkshopError(f"device must be 'cpu', 'cuda', 'cuda:N' (N a GPU index) or None (auto), got {device!r}.",
                            "set device='cuda' for this rank's GPU, 'cuda:1' for GPU 1, or 'cpu'.")


def validate_config(config: TrainConfig) -> TrainConfig:
    """Refuse a config that cannot run, with one line naming the value and its fix; return it unchanged.

    Called by ``train()`` and by the command line before any rank waits for another or any data
    loads; the same rules hold for every entry, read from the fields' settings.
    """
    types = field_types()
    for f in dataclasses.fields(config):
        _check_field(f.name, getattr(config, f.name), setting_of(f), types[f.name])
    if not (config.lr > 0 and math.isfinite(config.lr)):
        raise WorkshopError(f"lr must be a positive number, got {config.lr!r}.", "try lr=0.05.")
    if not 0 < config.momentum < 1:
        # 0 is not allowed either: Nesterov momentum needs some momentum
        raise WorkshopError(f"momentum must be above 0 and below 1, got {config.momentum!r}.", "try momentum=0.9.")
    if not (config.weight_decay >= 0 and math.isfinite(config.weight_decay)):
        raise WorkshopError(f"weight_decay must be 0 or more, got {config.weight_decay!r}.", "try weight_decay=5e-4.")
    if not (config.bucket_cap_mb > 0 and math.isfinite(config.bucket_cap_mb)):
        raise WorkshopError(f"bucket_cap_mb must be a positive number of MiB, got {config.bucket_cap_mb!r}.",
                            "try bucket_cap_mb=25 (PyTorch's default).")
    check_device(config.device)
    if config.model in TOKEN_MODELS:
        context = GPT_SIZES[config.gpt_size].context
        if config.sequence_length is not None and config.sequence_length > context:
            raise WorkshopError(f"sequence_length {config.sequence_length} is longer than the {config.gpt_size} "
                                f"GPT's context of {context} tokens.",
                                f"set sequence_length to {context} or less, or pick a larger gpt_size.")
    elif config.sequence_length is not None:
        raise WorkshopError(f"sequence_length is for model 'gpt'; model {config.model!r} reads images.",
                            "leave sequence_length unset, or set model='gpt'.")
    elif config.attention != "fused":
        raise WorkshopError(f"attention={config.attention!r} is for model 'gpt'; model {config.model!r} has no "
                            "attention.", "leave attention unset, or set model='gpt'.")
    if (config.resume or config.stop_after_step) and not config.checkpoint_dir:
        raise WorkshopError("resume and stop_after_step need somewhere to keep checkpoints.",
                            "set checkpoint_dir as well.")
    if config.checkpoint_dir:
        check_output_path(config.checkpoint_dir, folder=True, what="checkpoint_dir")
    if config.tensorboard_dir:
        check_output_path(config.tensorboard_dir, folder=True, what="tensorboard_dir")
    return config
