"""Benchmark: the four precision modes side by side, printed and written to JSON.

    python benchmarks/precision_modes.py                              # ResNet-18, sized for the machine
    python benchmarks/precision_modes.py --model simplecnn --steps 20 --out /tmp/modes.json

Every mode is the same ``TrainConfig`` with only ``precision`` changed, trained by
the one training loop on the same data and step budget. The goal on an H100-class
GPU: bf16 with channels_last at least 2x tf32 and 3x strict fp32 on ResNet-18.
This is a measurement to read, not a test: nothing here passes or fails on speed.
"""

from __future__ import annotations

import argparse
import json
from datetime import datetime
from pathlib import Path

import torch

import workshop_utils as wu
from workshop_utils.system.errors import exit_on_workshop_error
from workshop_utils.system.results import runs_root

# samples per step, steps (warm-up included), images, learning rate: on a CPU only enough to show the method
SIZES = {"gpu": dict(batch_size=256, steps=120, warmup_steps=10, train_size=None, test_size=10_000, lr=0.1),
         "cpu": dict(batch_size=16, steps=6, warmup_steps=2, train_size=512, test_size=256, lr=0.01)}
# Emulated float16 convolutions make one ResNet-18 step take over a minute on a CPU: left out unless asked for.
CPU_DEFAULT_SKIPS = {("resnet18", "fp16")}


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="resnet18", choices=wu.MODELS)
    parser.add_argument("--modes", nargs="+", help="precision modes to measure (default: all four)")
    parser.add_argument("--batch-size", type=int, help="samples per step (default: by device)")
    parser.add_argument("--steps", type=int, help="optimizer steps per mode, warm-up included (default: by device)")
    parser.add_argument("--warmup-steps", type=int, help="first steps left out of timing (default: by device)")
    parser.add_argument("--train-size", type=int, help="training images (default: all on a GPU, 512 on a CPU)")
    parser.add_argument("--no-channels-last", dest="channels_last", action="store_false",
                        help="keep the NCHW layout (default: channels_last, what tensor cores prefer)")
    parser.add_argument("--cpu-fp16-steps", type=int, default=2,
                        help="steps for fp16 on a CPU, where float16 is emulated and takes seconds per step")
    parser.add_argument("--out", help="JSON file to write "
                        "(default: runs/<time>-precision-benchmark/precision_modes.json)")
    return parser.parse_args(argv)


@exit_on_workshop_error
def main(argv=None) -> Path:
    args = parse_args(argv)
    on_gpu = torch.cuda.is_available()
    if args.modes is None:
        args.modes = [m for m in wu.PRECISIONS if on_gpu or (args.model, m) not in CPU_DEFAULT_SKIPS]
        if len(args.modes) < len(wu.PRECISIONS):
            print(f"note: on a CPU, {args.model} in fp16 is left out (emulated, minutes per step); "
                  "name it in --modes to run it anyway.")
    for mode in args.modes:
        wu.check_precision(mode, wu.pick_device())  # an impossible mode fails now, not after the others ran
    sizes = SIZES["gpu" if on_gpu else "cpu"]
    base = wu.TrainConfig(model=args.model, batch_size=args.batch_size or sizes["batch_size"],
                          max_steps=args.steps or sizes["steps"],
                          warmup_steps=sizes["warmup_steps"] if args.warmup_steps is None else args.warmup_steps,
                          train_size=args.train_size or sizes["train_size"], test_size=sizes["test_size"],
                          lr=sizes["lr"], loader="device",
                          channels_last=args.channels_last, progress=False)
    data = wu.load_data(base.data_root, base.train_size, base.test_size)
    records = []
    for config in wu.precision_configs(base, args.modes, cpu_fp16_steps=args.cpu_fp16_steps):
        print(f"--- {config.name}: {config.max_steps} steps of {config.batch_size}", flush=True)
        records.append(wu.train(config, data).record)
    table = wu.mode_table(records)
    print(table.to_string(index=False, float_format=lambda v: f"{v:,.3g}"))
    default = runs_root() / f"{datetime.now():%Y%m%d-%H%M%S}-precision-benchmark" / "precision_modes.json"
    out = Path(args.out) if args.out else default
    out.parent.mkdir(parents=True, exist_ok=True)
    summary = {"kind": "precision_benchmark", "model": args.model, "channels_last": args.channels_last,
               "modes": json.loads(table.to_json(orient="records")), "environment": wu.environment()}
    out.write_text(json.dumps(summary, indent=2))
    print(f"Written to {out}")
    return out


if __name__ == "__main__":
    main()
