"""Benchmark: the four precision modes side by side, printed and written to JSON.

    python benchmarks/precision_modes.py                               # ResNet-18, sized for the machine
    python benchmarks/precision_modes.py --profile cpu --model simplecnn --steps 20 --run-dir runs/my-run
    python benchmarks/precision_modes.py --batch-sweep 32 64 128 256 512          # and each mode per batch size

Every mode is the same ``TrainConfig`` with only ``precision`` changed, trained by
the one training loop on the same data and step budget. With ``--repeats`` > 1 the
modes are trained round-robin and each keeps its median run. Writes
<run-dir>/benchmarks/precision_modes.json in the layout every benchmark shares
(workshop_utils.system.benchmark), with the environment. The goal on an H100-class
GPU: bf16 with channels_last at least 2x tf32 and 3x strict fp32 on ResNet-18.
This is a measurement to read, not a test: nothing here passes or fails on speed.

The modes are compared at one batch size (``batch_samples``, printed in the header). A small
batch hides the tensor-core gain (launches and Python, not arithmetic, fill its steps), so the
gpu profile also trains every mode at batch sizes 128 to 2048 (``--batch-sweep B1 B2 ...`` picks
others, ``--no-batch-sweep`` none); that table goes into the same JSON under ``tables.batch_sweep``
and its chart beside it (precision_modes_batch_sweep.png).
"""

from __future__ import annotations

import workshop_utils as wu
from workshop_utils.system.benchmark import benchmark_parser, start_benchmark
from workshop_utils.system.errors import exit_on_workshop_error, positive_int

NAME = "precision_modes"
# samples per step, steps (warm-up included), images, learning rate, batch sizes swept (empty: no sweep);
# on a CPU only enough to show the method.
# The gpu comparison batch is 1024: at small batches kernel launches, not arithmetic, fill a ResNet-18 step
# and hide what 16-bit tensor cores gain; the sweep shows on each GPU where that gain sets in.
PROFILES = {"gpu": dict(batch_samples=1024, steps=120, warmup_steps=10, train_images=None, test_images=10_000,
                        lr=0.1, batch_sweep_samples=(128, 256, 512, 1024, 2048)),
            "cpu": dict(batch_samples=16, steps=6, warmup_steps=2, train_images=512, test_images=256, lr=0.01,
                        batch_sweep_samples=())}
# Emulated float16 convolutions make one ResNet-18 step take over a minute on a CPU: left out unless asked for.
CPU_DEFAULT_SKIPS = {("resnet18", "fp16")}


def build_parser():
    parser = benchmark_parser(NAME, __doc__, repeats=1,
                              repeats_help="round-robin passes over the modes (each mode keeps its median run)")
    parser.add_argument("--model", default="resnet18", choices=wu.MODELS)
    parser.add_argument("--modes", nargs="+", help="precision modes to measure (default: all four)")
    parser.add_argument("--batch-size", type=int, help="samples per step (default: by profile)")
    parser.add_argument("--steps", type=int, help="optimizer steps per mode, warm-up included (default: by profile)")
    parser.add_argument("--warmup-steps", type=int, help="first steps left out of timing (default: by profile)")
    parser.add_argument("--train-size", type=int, help="training images (default: all on a GPU, 512 on a CPU)")
    parser.add_argument("--no-channels-last", dest="channels_last", action="store_false",
                        help="keep the NCHW layout (default: channels_last, what tensor cores prefer)")
    parser.add_argument("--cpu-emulated-steps", "--cpu-fp16-steps", dest="cpu_emulated_steps", type=int, default=2,
                        help="steps for a mode the CPU emulates (fp16, bf16 without native support): seconds per "
                             "step there; 0 skips it")
    parser.add_argument("--batch-sweep", nargs="+", type=positive_int, metavar="B",
                        help="also train every mode at each of these batch sizes, same steps (one pass; "
                             "default: 128 256 512 1024 2048 in the gpu profile, none in the cpu one)")
    parser.add_argument("--no-batch-sweep", dest="batch_sweep", action="store_const", const=(),
                        help="compare the modes at one batch only")
    return parser


@exit_on_workshop_error
def main(argv=None):
    run = start_benchmark(build_parser(), argv)
    args = run.args
    on_cpu = run.device.type == "cpu"
    if args.modes is None:
        args.modes = [m for m in wu.PRECISIONS if not on_cpu or (args.model, m) not in CPU_DEFAULT_SKIPS]
        if len(args.modes) < len(wu.PRECISIONS):
            print(f"note: on a CPU, {args.model} in fp16 is left out (emulated, minutes per step); "
                  "name it in --modes to run it anyway.")
    for mode in args.modes:
        wu.check_precision(mode, run.device)  # an impossible mode fails now, not after the others ran
    hp = run.settings(PROFILES, batch_samples=args.batch_size, steps=args.steps, warmup_steps=args.warmup_steps,
                      train_images=args.train_size)
    profile_sweep = hp.pop("batch_sweep_samples")
    batch_sweep = sorted(set(profile_sweep if args.batch_sweep is None else args.batch_sweep))
    base = wu.TrainConfig(model=args.model, batch_size=hp["batch_samples"], max_steps=hp["steps"],
                          warmup_steps=hp["warmup_steps"], train_size=hp["train_images"],
                          test_size=hp["test_images"], lr=hp["lr"], loader="device", channels_last=args.channels_last,
                          device=str(run.device), progress=False)
    data = wu.load_data(base.data_root, base.train_size, base.test_size)
    configs = wu.precision_configs(base, args.modes, cpu_emulated_steps=args.cpu_emulated_steps)
    runs = {config.name: [] for config in configs}
    with run.progress(run.repeats * len(configs), "precision modes") as bar:
        for repeat in range(run.repeats):
            for config in configs:
                bar.set_postfix_str(f"{config.name}: {config.max_steps} steps of {config.batch_size}")
                runs[config.name].append(wu.train(config, data).record)
                bar.update()
    # each mode's median run by throughput (the only run when --repeats is 1)
    records = [wu.median_run(measured, lambda r: r["metrics"]["samples_per_s"]) for measured in runs.values()]
    table = wu.mode_table(records)
    print(f"{args.model}: modes compared at batch {hp['batch_samples']} ({hp['steps']} steps, "
          f"{hp['warmup_steps']} of them untimed warm-up)")
    print(table.to_string(index=False, float_format=lambda v: f"{v:,.3g}"))
    settings = {**hp, "model": args.model, "channels_last": args.channels_last, "modes": args.modes,
                "cpu_emulated_steps": args.cpu_emulated_steps}
    summary = {"modes_compared_at_batch_samples": hp["batch_samples"]}
    by_mode = table.set_index("precision")["samples/s"]
    for fast, slow in (("bf16", "fp32"), ("bf16", "tf32")):
        if fast in by_mode and slow in by_mode and by_mode[fast] and by_mode[slow]:
            summary[f"{fast}_vs_{slow}"] = by_mode[fast] / by_mode[slow]
    tables = {}
    if batch_sweep:
        settings["batch_sweep_samples"] = batch_sweep
        sweep = wu.precision_batch_sweep(base, data, args.modes, batch_sweep, steps=hp["steps"],
                                         warmup_steps=hp["warmup_steps"], cpu_emulated_steps=args.cpu_emulated_steps)
        print(f"{args.model}: every mode at batch sizes {', '.join(map(str, settings['batch_sweep_samples']))}")
        print(sweep.drop(columns=["detail"], errors="ignore").to_string(index=False,
                                                                       float_format=lambda v: f"{v:,.3g}"))
        for fast, slow in (("bf16", "fp32"), ("bf16", "tf32")):
            for size, gain in wu.speedup_by_batch(sweep, fast, slow).items():
                summary[f"{fast}_vs_{slow}_at_batch_{size}"] = gain
        tables["batch_sweep"] = sweep
    path = run.write(settings, table, summary, tables=tables)
    if batch_sweep:
        import matplotlib.pyplot as plt

        figure = wu.plot_precision_batch_sweep(sweep, title=f"{args.model}: throughput by precision and batch size")
        chart = path.with_name(f"{NAME}_batch_sweep.png")  # beside the JSON
        figure.savefig(chart, dpi=120, bbox_inches="tight")
        plt.close(figure)
        print(f"Chart: {chart}")
    print(f"Written to {path}")
    return path


if __name__ == "__main__":
    main()
