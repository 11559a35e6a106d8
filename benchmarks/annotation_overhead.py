"""Benchmark: what ``TrainConfig.annotate`` (named phases, NVTX ranges) costs per training step.

    python benchmarks/annotation_overhead.py                           # sizes and device from the machine
    python benchmarks/annotation_overhead.py --profile cpu --repeats 5 --run-dir runs/my-run

The same ``TrainConfig`` (SimpleCNN, device-resident loader) is trained with ``annotate``
off and on, nothing else changed, by the one training loop on the same data and step
budget. Off, ``phase_ranges`` hands the loop one shared do-nothing context: not one
profiler or NVTX call per step. On, every step opens four ``torch.profiler.record_function``
ranges (and, on a GPU, four NVTX ranges inside a cudaProfilerApi capture range), with no
profiler or Nsight Systems attached, as a run that forgot to switch it off would.
The two modes are trained round-robin ``--repeats`` times (the order flips every pass) so
a noisy, shared machine slows both alike; each mode keeps its median samples/s and its
median step time. Prints a table and writes <run-dir>/benchmarks/annotation_overhead.json
in the layout every benchmark shares (workshop_utils.system.benchmark), with the
environment; the summary's ``annotate_on_vs_off`` is samples/s on / off (1.0: free).

This is a measurement to read, not a test: nothing here passes or fails on speed. Run it
on an otherwise idle machine; the load average is printed and recorded.
"""

from __future__ import annotations

import os
import statistics

import pandas as pd

import workshop_utils as wu
from workshop_utils.system.benchmark import benchmark_parser, start_benchmark
from workshop_utils.system.errors import exit_on_workshop_error
from workshop_utils.system.hardware import cpu_cores

NAME = "annotation_overhead"
PROFILES = {
    # images (None: all), test images, optimizer steps per run (warm-up included), untimed first steps,
    # samples per step. Small steps on purpose: a per-step cost shows most where a step is short.
    "cpu": dict(train_images=1600, test_images=256, steps=50, warmup_steps=10, batch_samples=32),
    # 300 steps of 128 stay within one epoch of CIFAR-10's 50,000 images
    "gpu": dict(train_images=None, test_images=512, steps=300, warmup_steps=30, batch_samples=128),
}
MODES = {"annotate off": False, "annotate on": True}


def build_parser():
    parser = benchmark_parser(NAME, __doc__, repeats=5,
                              repeats_help="round-robin passes over the two modes (each keeps its median)")
    parser.add_argument("--batch-size", type=int, help="samples per step (default: by profile)")
    parser.add_argument("--steps", type=int, help="optimizer steps per run, warm-up included (default: by profile)")
    parser.add_argument("--warmup-steps", type=int, help="first steps left out of timing (default: by profile)")
    return parser


@exit_on_workshop_error
def main(argv=None):
    run = start_benchmark(build_parser(), argv)
    args = run.args
    hp = run.settings(PROFILES, batch_samples=args.batch_size, steps=args.steps, warmup_steps=args.warmup_steps)
    base = wu.TrainConfig(model="simplecnn", batch_size=hp["batch_samples"], max_steps=hp["steps"],
                          warmup_steps=hp["warmup_steps"], train_size=hp["train_images"],
                          test_size=hp["test_images"], loader="device", device=str(run.device), progress=False)
    data = wu.load_data(base.data_root, base.train_size, base.test_size)
    configs = {mode: base.replace(name=mode.replace(" ", "-"), annotate=on) for mode, on in MODES.items()}
    load = os.getloadavg()  # above the core count, other jobs were competing and the ratio is unreliable
    print(f"load average (1, 5, 15 min): {load[0]:.1f}, {load[1]:.1f}, {load[2]:.1f} on {cpu_cores()} cores")
    measured = {mode: [] for mode in configs}
    with run.progress(run.repeats * len(configs), "annotation off/on") as bar:
        for repeat in range(run.repeats):
            order = list(configs) if repeat % 2 == 0 else list(configs)[::-1]  # neither mode always goes first
            for mode in order:
                bar.set_postfix_str(f"{mode}: {base.max_steps} steps of {base.batch_size}")
                measured[mode].append(wu.train(configs[mode], data).record["metrics"])
                bar.update()
    rows = []
    for mode, metrics in measured.items():
        speeds = [m["samples_per_s"] for m in metrics if m["samples_per_s"]]
        steps_ms = [m["step_ms_median"] for m in metrics if m["step_ms_median"] is not None]
        rows.append({"mode": mode, "annotate": MODES[mode],
                     "samples_per_s": statistics.median(speeds) if speeds else None,
                     "step_ms_median": statistics.median(steps_ms) if steps_ms else None,
                     "samples_per_s_min": min(speeds, default=None), "samples_per_s_max": max(speeds, default=None),
                     "runs": len(metrics)})
    table = pd.DataFrame(rows)
    print()
    print(table.to_string(index=False, float_format=lambda v: f"{v:,.4g}"))
    off, on = (table.set_index("mode").loc[mode] for mode in MODES)
    ratio = on["samples_per_s"] / off["samples_per_s"] if on["samples_per_s"] and off["samples_per_s"] else None
    # the same ratio within each pass, where both modes saw the same moment of the machine
    per_pass = [b["samples_per_s"] / a["samples_per_s"] for a, b in zip(*measured.values())
                if a["samples_per_s"] and b["samples_per_s"]]
    summary = {"annotate_on_vs_off": ratio,
               "annotate_on_vs_off_per_pass_median": statistics.median(per_pass) if per_pass else None,
               "step_ms_median_off": off["step_ms_median"], "step_ms_median_on": on["step_ms_median"],
               "load_average_1_5_15_min": list(load)}
    if ratio is not None:
        print(f"\nannotate on / off: {ratio:.3f}x samples/s (1.0: free; per-pass median "
              f"{summary['annotate_on_vs_off_per_pass_median']:.3f}); median step "
              f"{off['step_ms_median']:.2f} ms off, {on['step_ms_median']:.2f} ms on")
    path = run.write({**hp, "model": base.model, "loader": base.loader, "precision": base.precision,
                      "modes": list(MODES)}, table, summary)
    print(f"JSON: {path}")
    return path


if __name__ == "__main__":
    main()
