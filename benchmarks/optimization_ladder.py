"""Benchmark: the optimization ladder of notebook 04, measured in one run.

    python benchmarks/optimization_ladder.py              # sizes from the device found
    python benchmarks/optimization_ladder.py --profile cpu --no-compile

Each rung is one more switch of ``TrainConfig`` on top of the rungs before it
(``workshop_utils.lessons.sweeps.ladder_rungs``), trained with the one training loop for
the same number of steps. The rungs are trained round-robin ``--repeats`` times and
each keeps its median run, so a busy shared machine slows all rungs alike. Prints the
cumulative table and writes a JSON record (with the environment) into a run folder.

Goals from issue 5, on one H100-class GPU: the top rung >= 10x the baseline on the
same GPU, and >= 150,000 SimpleCNN training samples/s.
"""

from __future__ import annotations

import argparse
import os

import workshop_utils as wu
from workshop_utils.system.errors import exit_on_workshop_error
from workshop_utils.system.hardware import cpu_cores

PROFILES = {
    # images, optimizer steps per rung, untimed first steps, samples per step (notebook 01's baseline batch)
    "cpu": dict(train_size=4096, max_steps=40, warmup_steps=8, batch_size=64),
    # 300 steps keep the whole benchmark (3 passes over 6 rungs, compile included) within a few minutes.
    "gpu": dict(train_size=None, max_steps=300, warmup_steps=30, batch_size=128),
}
BASELINE = dict(model="simplecnn", precision="fp32", loader="torch", num_workers=2)  # notebook 01, gpu profile
GOALS_GPU = {"vs_baseline": 10.0, "samples_per_s": 150_000}


@exit_on_workshop_error
def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--profile", default="auto", choices=("auto", "cpu", "gpu"))
    parser.add_argument("--no-compile", action="store_true", help="leave out the torch.compile rung")
    parser.add_argument("--repeats", type=int, default=3, help="round-robin passes over the rungs (median kept)")
    parser.add_argument("--baseline-workers", type=int, help="num_workers of the baseline (default 2, or 0 on CPU)")
    parser.add_argument("--run-dir", help="folder for the records (default: a new runs/<time>-bench/)")
    args = parser.parse_args(argv)
    hp = wu.pick_settings(PROFILES, args.profile)
    data = wu.load_data(train_size=hp["train_size"], test_size=512)
    workers = max(wu.worker_counts((0, 2, 4, 8)))
    baseline = dict(BASELINE, num_workers=args.baseline_workers if args.baseline_workers is not None
                    else (2 if hp["profile"] == "gpu" else 0))
    base = wu.TrainConfig(**baseline, batch_size=hp["batch_size"], max_steps=hp["max_steps"],
                          warmup_steps=hp["warmup_steps"], progress=False)
    tuned = dict(num_workers=workers, pin_memory=True, persistent_workers=workers > 0,
                 prefetch_factor=4 if workers else None)
    rungs = wu.ladder_rungs(tuned, compile=not args.no_compile)
    run_dir = wu.resolve_run_dir(args.run_dir, "bench")
    load = os.getloadavg()  # above the core count, other jobs were competing and ratios are unreliable
    print(f"load average (1, 5, 15 min): {load[0]:.1f}, {load[1]:.1f}, {load[2]:.1f} on {cpu_cores()} cores")
    table = wu.climb_ladder(base, data, rungs, run_dir=run_dir, repeats=args.repeats)
    print()
    print(table.to_markdown(index=False, floatfmt=",.3g"))
    top = table.iloc[-1]
    print(f"\ntop rung ({top['rung']}): {top['samples_per_s']:,.0f} samples/s, {top['vs_baseline']:.1f}x the baseline")
    best = table.loc[table["samples_per_s"].idxmax()]
    print(f"fastest rung ({best['rung']}): {best['samples_per_s']:,.0f} samples/s, {best['vs_baseline']:.1f}x")
    if hp["profile"] == "gpu":
        for key, goal in GOALS_GPU.items():
            print(f"goal {key} >= {goal:,}: {'met' if top[key] >= goal else 'NOT met'} ({top[key]:,.1f})")
    path = wu.save_record({"kind": "benchmark", "benchmark": "optimization_ladder", "settings": hp,
                           "repeats": args.repeats,
                           "baseline": baseline, "table": table.to_dict("records"),
                           "top_vs_baseline": top["vs_baseline"], "top_samples_per_s": top["samples_per_s"],
                           "load_average": load, "environment": wu.environment()}, run_dir, "optimization_ladder")
    print(f"JSON: {path}")


if __name__ == "__main__":
    main()
