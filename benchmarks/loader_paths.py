"""Benchmark: data loading alone, the PIL DataLoader path versus the device-resident path.

    python benchmarks/loader_paths.py                                  # sizes and device from the machine
    python benchmarks/loader_paths.py --profile cpu --repeats 5 --run-dir runs/my-run

No model runs: each path decodes, augments, normalises and delivers batches to the
training device, as ``train`` would receive them. The paths are measured in turns
(repeat 1 of every path, then repeat 2, ...) so a noisy, shared machine slows them
alike, and the ratios are medians over the repeats of one run. Prints a table and
writes <run-dir>/benchmarks/loader_paths.json in the layout every benchmark shares
(workshop_utils.system.benchmark), with the environment.

Goal from issue 5: on the 2-core CPU, the device-resident path at least 5x the PIL
DataLoader path. Run it on an otherwise idle machine: when other jobs keep more
threads busy than there are cores, every multi-threaded tensor operation waits for a
descheduled thread, the device-resident path (a few large tensor operations per
batch) collapses while the per-image PIL path barely changes. The load average is
printed and recorded for that reason.
"""

from __future__ import annotations

import os
import statistics

import pandas as pd

import workshop_utils as wu
from workshop_utils.system.benchmark import benchmark_parser, start_benchmark
from workshop_utils.system.errors import exit_on_workshop_error
from workshop_utils.system.hardware import cpu_cores

NAME = "loader_paths"
PROFILES = {  # images in the data set, samples per batch, timed batches per measurement (after 2 untimed)
    "cpu": dict(train_images=4096, batch_samples=64, timed_batches=40),
    "gpu": dict(train_images=50_000, batch_samples=128, timed_batches=200),
}
GOAL_CPU_RATIO = 5.0


def build_parser():
    return benchmark_parser(NAME, __doc__, repeats=3, repeats_help="measurements per path (median reported)")


@exit_on_workshop_error
def main(argv=None):
    run = start_benchmark(build_parser(), argv)
    hp = run.settings(PROFILES)
    data = wu.load_data(train_size=hp["train_images"], test_size=16)
    workers = max(wu.worker_counts((0, 2, 4, 8)))
    paths = {"PIL DataLoader, 0 workers": dict(kind="torch", num_workers=0),
             f"PIL DataLoader, {workers} workers": dict(kind="torch", num_workers=workers, pin_memory=True,
                                                         persistent_workers=False, prefetch_factor=4),
             "device-resident": dict(kind="device")}
    if workers == 0:
        paths.pop(f"PIL DataLoader, {workers} workers")
    measured = {name: [] for name in paths}
    with run.progress(run.repeats * len(paths), "loader measurements", unit="pass") as bar:
        for repeat in range(run.repeats):
            for name, options in paths.items():
                options = dict(options)
                measured[name].append(wu.loader_throughput(options.pop("kind"), data.train_images,
                                                           data.train_labels, hp["batch_samples"], device=run.device,
                                                           max_batches=hp["timed_batches"], **options))
                bar.write(f"repeat {repeat + 1}/{run.repeats}  {name:<28} {measured[name][-1]:>12,.0f} samples/s")
                bar.update()
    medians = {name: statistics.median(values) for name, values in measured.items()}
    reference = medians["PIL DataLoader, 0 workers"]
    table = pd.DataFrame({"path": list(medians), "samples_per_s": list(medians.values()),
                          "vs_pil_0_workers": [v / reference for v in medians.values()]})
    print()
    print(table.to_markdown(index=False, floatfmt=",.2f"))
    ratio = medians["device-resident"] / reference
    best_pil = max(v for k, v in medians.items() if k.startswith("PIL"))
    print(f"\ndevice-resident / PIL DataLoader (0 workers): {ratio:.1f}x; "
          f"/ best PIL setting: {medians['device-resident'] / best_pil:.1f}x  (cores: {cpu_cores()})")
    summary = {"ratio_device_vs_pil": ratio, "ratio_device_vs_best_pil": medians["device-resident"] / best_pil,
               "samples_per_s_each_repeat": measured}
    if run.profile == "cpu":
        summary["goal_cpu_ratio_met"] = ratio >= GOAL_CPU_RATIO
        print(f"goal (CPU): >= {GOAL_CPU_RATIO:.0f}x -> {'met' if ratio >= GOAL_CPU_RATIO else 'NOT met'}")
    load = os.getloadavg()  # above the core count, other jobs were competing and ratios are unreliable
    summary["load_average_1_5_15_min"] = list(load)
    print(f"load average (1, 5, 15 min): {load[0]:.1f}, {load[1]:.1f}, {load[2]:.1f} on {cpu_cores()} cores")
    path = run.write({**hp, "workers": workers, "warmup_batches": 2}, table, summary)
    print(f"JSON: {path}")
    return path


if __name__ == "__main__":
    main()
