"""Benchmark: the GPT's training speed in tokens per second and its MFU, per precision, printed and written to JSON.

    python benchmarks/gpt_throughput.py                                    # gpt2-small at sequence 1024 on a GPU
    python benchmarks/gpt_throughput.py --profile cpu --modes fp32 bf16    # the tiny size, to see the method
    python benchmarks/gpt_throughput.py --no-compile --optimizer-kernels default   # the eager, unfused baseline

Every mode is the same ``TrainConfig(model="gpt", optimizer="adamw")`` with only ``precision``
changed, trained by the one training loop on the same tokens (the Python standard library's own
source, byte-level; ``--data-root`` reads nanoGPT token shards instead) and step budget. MFU is the
achieved rate, FLOPs per token counted by ``torch.utils.flop_counter``, against the device's
data-sheet peak for that precision (unknown on a CPU). Writes <run-dir>/benchmarks/gpt_throughput.json
in the layout every benchmark shares (workshop_utils.system.benchmark), with the environment.

The goal on one H100: bf16, gpt2-small at sequence 1024, at least 45% MFU. Measured on one H100 80GB HBM3
(results/reference/gpu/gpt_mfu/): 38.4% at 16 sequences a step, 41.7% at 64. This is a measurement to read,
not a test: nothing here passes or fails on speed.
"""

from __future__ import annotations

import pandas as pd

import workshop_utils as wu
from workshop_utils.system.benchmark import benchmark_parser, start_benchmark
from workshop_utils.system.errors import exit_on_workshop_error

NAME = "gpt_throughput"
# model size, sequences per step, tokens per sequence, steps (warm-up included), training and validation
# sequences (None: every window of the corpus), peak learning rate of AdamW.
PROFILES = {"gpu": dict(gpt_size="gpt2-small", batch_sequences=16, sequence_tokens=1024, steps=60, warmup_steps=15,
                        train_sequences=None, validation_sequences=64, lr=6e-4, compile=True),
            "cpu": dict(gpt_size="tiny", batch_sequences=8, sequence_tokens=128, steps=8, warmup_steps=2,
                        train_sequences=256, validation_sequences=16, lr=1e-3, compile=False)}


def build_parser():
    parser = benchmark_parser(NAME, __doc__, repeats=1,
                              repeats_help="round-robin passes over the modes (each mode keeps its median run)")
    parser.add_argument("--modes", nargs="+", help="precision modes to measure (default: fp32, tf32 and bf16 on a "
                                                   "GPU; fp32 and bf16 on a CPU, where tf32 is fp32)")
    parser.add_argument("--gpt-size", choices=tuple(wu.GPT_SIZES), help="model size (default: by profile)")
    parser.add_argument("--batch-size", type=int, help="sequences per step (default: by profile)")
    parser.add_argument("--sequence-length", type=int, help="tokens per sequence (default: by profile)")
    parser.add_argument("--steps", type=int, help="optimizer steps per mode, warm-up included (default: by profile)")
    parser.add_argument("--warmup-steps", type=int, help="first steps left out of timing (default: by profile)")
    parser.add_argument("--data-root", help="folder of nanoGPT token shards (default: the standard library's source)")
    parser.add_argument("--compile", dest="compile", action="store_true", default=None,
                        help="torch.compile the model (default: on a GPU; the compiler's wait is warm-up, untimed)")
    parser.add_argument("--no-compile", dest="compile", action="store_false", help="run the model eagerly")
    parser.add_argument("--optimizer-kernels", choices=("default", "foreach", "fused"), default="fused",
                        help="how AdamW's update runs (default: fused, one kernel for every parameter)")
    parser.add_argument("--cpu-emulated-steps", type=int, default=2,
                        help="steps for a mode the CPU emulates (bf16 without native support); 0 skips it")
    return parser


def default_modes(on_cpu: bool) -> list[str]:
    # On a CPU tf32 is plain fp32, and fp16 needs a GradScaler for no gain: the GPU comparison is fp32/tf32/bf16.
    return ["fp32", "bf16"] if on_cpu else ["fp32", "tf32", "bf16"]


@exit_on_workshop_error
def main(argv=None):
    run = start_benchmark(build_parser(), argv)
    args = run.args
    modes = args.modes or default_modes(run.device.type == "cpu")
    for mode in modes:
        wu.check_precision(mode, run.device)  # an impossible mode fails now, not after the others ran
    hp = run.settings(PROFILES, gpt_size=args.gpt_size, batch_sequences=args.batch_size,
                      sequence_tokens=args.sequence_length, steps=args.steps, warmup_steps=args.warmup_steps,
                      compile=args.compile)
    base = wu.TrainConfig(model="gpt", gpt_size=hp["gpt_size"], sequence_length=hp["sequence_tokens"],
                          batch_size=hp["batch_sequences"], max_steps=hp["steps"], warmup_steps=hp["warmup_steps"],
                          train_size=hp["train_sequences"], test_size=hp["validation_sequences"],
                          optimizer="adamw", lr=hp["lr"], weight_decay=0.1, lr_warmup_steps=hp["warmup_steps"],
                          optimizer_kernels=args.optimizer_kernels, compile=hp["compile"], loader="device",
                          data_root=args.data_root, device=str(run.device), progress=False)
    data = wu.load_text(args.data_root)
    configs = wu.precision_configs(base, modes, cpu_emulated_steps=args.cpu_emulated_steps)
    runs = {config.name: [] for config in configs}
    with run.progress(run.repeats * len(configs), "gpt precision modes") as bar:
        for _ in range(run.repeats):
            for config in configs:
                bar.set_postfix_str(f"{config.name}: {config.max_steps} steps of {config.batch_size} sequences")
                runs[config.name].append(wu.train(config, data))
                bar.update()
    rows = []
    for config in configs:
        m = wu.median_run(runs[config.name], lambda run: run.metrics["tokens_per_s"]).metrics
        rows.append({"precision": config.precision, "steps": m["steps"], "timed_steps": m["timed_steps"],
                     "tokens_per_s": m["tokens_per_s"], "step_ms_median": m["step_ms_median"],
                     "tflops_per_device": m["tflops_per_device"], "mfu": m["mfu"],
                     "peak_memory_mib": m["peak_memory_mib"], "final_train_loss_nats": m["final_train_loss"]})
    first = runs[configs[0].name][0].metrics
    print(f"gpt {hp['gpt_size']} ({first['parameters']:,} parameters), {hp['batch_sequences']} x "
          f"{hp['sequence_tokens']} tokens per step, {first['flops_per_token'] / 1e6:,.1f} MFLOP per token, "
          f"{'compiled' if hp['compile'] else 'eager'}, AdamW {args.optimizer_kernels}; corpus: {data.describe()}")
    table = pd.DataFrame(rows)
    print(table.to_string(index=False, float_format=lambda v: f"{v:,.3g}"))
    unknown = [row["precision"] for row in rows if row["mfu"] is None]
    if unknown:
        print(f"MFU unknown for {', '.join(unknown)}: no data-sheet peak for {first['device_name']} in that precision.")
    by_mode = {row["precision"]: row for row in rows}
    summary = {"parameters": first["parameters"], "flops_per_token": first["flops_per_token"],
               "tokens_per_step": first["tokens_per_step"]}
    for mode, row in by_mode.items():
        summary[f"{mode}_tokens_per_s"] = row["tokens_per_s"]
        summary[f"{mode}_mfu"] = row["mfu"]
    if by_mode.get("bf16", {}).get("tokens_per_s") and by_mode.get("fp32", {}).get("tokens_per_s"):
        summary["bf16_vs_fp32"] = by_mode["bf16"]["tokens_per_s"] / by_mode["fp32"]["tokens_per_s"]
    settings = {**hp, "modes": modes, "optimizer_kernels": args.optimizer_kernels,
                "cpu_emulated_steps": args.cpu_emulated_steps, "corpus": data.describe()}
    path = run.write(settings, table, summary)
    print(f"Written to {path}")
    return path


if __name__ == "__main__":
    main()
