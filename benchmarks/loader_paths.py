"""Benchmark: data loading alone, the PIL DataLoader path versus the device-resident path.

    python benchmarks/loader_paths.py                  # sizes from the device found
    python benchmarks/loader_paths.py --profile cpu --repeats 5

No model runs: each path decodes, augments, normalises and delivers batches to the
training device, as ``train`` would receive them. The paths are measured in turns
(repeat 1 of every path, then repeat 2, ...) so a noisy, shared machine slows them
alike, and the ratios are medians over the repeats of one run. Prints a table and
writes a JSON record (with the environment) into a run folder.

Goal from issue 5: on the 2-core CPU, the device-resident path at least 5x the PIL
DataLoader path. Run it on an otherwise idle machine: when other jobs keep more
threads busy than there are cores, every multi-threaded tensor operation waits for a
descheduled thread, the device-resident path (a few large tensor operations per
batch) collapses while the per-image PIL path barely changes. The load average is
printed and recorded for that reason.
"""

from __future__ import annotations

import argparse
import os
import statistics

import pandas as pd

import workshop_utils as wu
from workshop_utils.system.errors import exit_on_workshop_error
from workshop_utils.system.hardware import cpu_cores

PROFILES = {
    "cpu": dict(train_size=4096, batch_size=64, batches=40),  # images, samples per batch, timed batches
    "gpu": dict(train_size=50_000, batch_size=128, batches=200),
}
GOAL_CPU_RATIO = 5.0


@exit_on_workshop_error
def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--profile", default="auto", choices=("auto", "cpu", "gpu"))
    parser.add_argument("--repeats", type=int, default=3, help="measurements per path (median reported)")
    parser.add_argument("--run-dir", help="folder for the JSON record (default: a new runs/<time>-bench/)")
    args = parser.parse_args(argv)
    hp = wu.pick_settings(PROFILES, args.profile)
    data = wu.load_data(train_size=hp["train_size"], test_size=16)
    workers = max(wu.worker_counts((0, 2, 4, 8)))
    paths = {"PIL DataLoader, 0 workers": dict(kind="torch", num_workers=0),
             f"PIL DataLoader, {workers} workers": dict(kind="torch", num_workers=workers, pin_memory=True,
                                                         persistent_workers=False, prefetch_factor=4),
             "device-resident": dict(kind="device")}
    if workers == 0:
        paths.pop(f"PIL DataLoader, {workers} workers")
    measured = {name: [] for name in paths}
    for repeat in range(args.repeats):
        for name, options in paths.items():
            options = dict(options)
            measured[name].append(wu.loader_throughput(options.pop("kind"), data.train_images, data.train_labels,
                                                       hp["batch_size"], max_batches=hp["batches"], **options))
            print(f"repeat {repeat + 1}/{args.repeats}  {name:<28} {measured[name][-1]:>12,.0f} samples/s",
                  flush=True)
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
    if hp["profile"] == "cpu":
        print(f"goal (CPU): >= {GOAL_CPU_RATIO:.0f}x -> {'met' if ratio >= GOAL_CPU_RATIO else 'NOT met'}")
    run_dir = wu.resolve_run_dir(args.run_dir, "bench")
    load = os.getloadavg()  # above the core count, other jobs were competing and ratios are unreliable
    print(f"load average (1, 5, 15 min): {load[0]:.1f}, {load[1]:.1f}, {load[2]:.1f} on {cpu_cores()} cores")
    path = wu.save_record({"kind": "benchmark", "benchmark": "loader_paths", "settings": hp,
                           "samples_per_s": measured, "median_samples_per_s": medians,
                           "ratio_device_vs_pil": ratio,
                           "ratio_device_vs_best_pil": medians["device-resident"] / best_pil,
                           "load_average": load, "environment": wu.environment()}, run_dir, "loader_paths")
    print(f"JSON: {path}")


if __name__ == "__main__":
    main()
