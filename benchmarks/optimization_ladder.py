"""Benchmark: the optimization ladder of notebook 04, measured in one run.

    python benchmarks/optimization_ladder.py                           # sizes and device from the machine
    python benchmarks/optimization_ladder.py --profile cpu --no-compile --run-dir runs/my-run

Each rung is one more switch of ``TrainConfig`` on top of the rungs before it
(``workshop_utils.lessons.sweeps.ladder_rungs``), trained with the one training loop for
the same number of steps. The rungs are trained round-robin ``--repeats`` times and
each keeps its median run, so a busy shared machine slows all rungs alike; every ratio comes
with the range of its per-pass values, and one whose range includes 1 reads "no measurable
change" (a rung whose settings equal the rung's below is not trained again). Prints the
cumulative table and writes <run-dir>/benchmarks/optimization_ladder.json in the layout
every benchmark shares (workshop_utils.system.benchmark), with the environment; every
training run's full record goes to <run-dir>/results/. Then every rung is profiled for a few
steps (``profile_rungs``, off with --no-breakdown): the split of a step into data, forward,
backward, optimizer and the rest (on a GPU: the GPU idle, waiting for the host), with operators,
kernels and host syncs per step, says what bounds each rung; it goes into the same JSON under
``tables.breakdown`` and its traces into <run-dir>/traces/.

Goals from issue 5, on one H100-class GPU: the top rung >= 10x the baseline on the
same GPU, and >= 150,000 SimpleCNN training samples/s; and, wherever a rung compiles, at most
60 s of compiler wait before its first timed step (its ``warmup_s``).
"""

from __future__ import annotations

import os

import workshop_utils as wu
from workshop_utils.system.benchmark import benchmark_parser, start_benchmark
from workshop_utils.system.errors import exit_on_workshop_error
from workshop_utils.system.hardware import cpu_cores

NAME = "optimization_ladder"
PROFILES = {
    # images (None: all), test images, optimizer steps per rung, untimed first steps, samples per step
    # (notebook 01's baseline batch), steps of each rung kept by the profiler for the breakdown
    "cpu": dict(train_images=4096, test_images=512, steps=40, warmup_steps=8, batch_samples=64, profiled_steps=3),
    # 300 steps keep the whole benchmark (3 passes over 9 rungs, compile included) within a few minutes.
    "gpu": dict(train_images=None, test_images=512, steps=300, warmup_steps=30, batch_samples=128, profiled_steps=5),
}
BASELINE = dict(model="simplecnn", precision="fp32", loader="torch", num_workers=2)  # notebook 01, gpu profile
GOALS_GPU = {"vs_baseline": 10.0, "samples_per_s": 150_000}


def build_parser():
    parser = benchmark_parser(NAME, __doc__, repeats=3,
                              repeats_help="round-robin passes over the rungs (each rung keeps its median run)")
    parser.add_argument("--no-compile", action="store_true", help="leave out the torch.compile rung")
    parser.add_argument("--baseline-workers", type=int, help="num_workers of the baseline (default 2, or 0 on CPU)")
    parser.add_argument("--no-breakdown", dest="breakdown", action="store_false",
                        help="leave out what bounds each rung: every rung profiled for a few steps, split into "
                             "data, forward, backward, optimizer and the rest, with launches and host syncs per step")
    return parser


@exit_on_workshop_error
def main(argv=None):
    run = start_benchmark(build_parser(), argv)
    args = run.args
    hp = run.settings(PROFILES)
    data = wu.load_data(train_size=hp["train_images"], test_size=hp["test_images"])
    workers = max(wu.worker_counts((0, 2, 4, 8)))
    baseline = dict(BASELINE, num_workers=args.baseline_workers if args.baseline_workers is not None
                    else (2 if run.profile == "gpu" else 0))
    base = wu.TrainConfig(**baseline, batch_size=hp["batch_samples"], max_steps=hp["steps"],
                          warmup_steps=hp["warmup_steps"], device=str(run.device), progress=False)
    tuned = dict(num_workers=workers, pin_memory=True, persistent_workers=workers > 0,
                 prefetch_factor=4 if workers else None)
    rungs = wu.ladder_rungs(tuned, compile=not args.no_compile, device=run.device, base=base)
    run_dir = run.folder()
    load = os.getloadavg()  # above the core count, other jobs were competing and ratios are unreliable
    print(f"load average (1, 5, 15 min): {load[0]:.1f}, {load[1]:.1f}, {load[2]:.1f} on {cpu_cores()} cores")
    table = wu.climb_ladder(base, data, rungs, run_dir=run_dir, repeats=run.repeats, progress=True)
    print()
    print(table.to_markdown(index=False, floatfmt=",.3g"))
    print(table.attrs["stated_peak"])
    top = table.dropna(subset=["samples_per_s"]).iloc[-1]  # the highest rung that applies here
    print(f"\ntop rung ({top['rung']}): {top['samples_per_s']:,.0f} samples/s, against the baseline: "
          f"{wu.speedup_text(top)}")
    best = table.loc[table["samples_per_s"].idxmax()]
    print(f"fastest rung ({best['rung']}): {best['samples_per_s']:,.0f} samples/s, against the baseline: "
          f"{wu.speedup_text(best)}")
    # top_vs_baseline is null where the passes disagree on the direction: no speed-up was measured
    summary = {"top_vs_baseline": top["vs_baseline"], "top_vs_baseline_min": top["vs_baseline_min"],
               "top_vs_baseline_max": top["vs_baseline_max"], "top_samples_per_s": top["samples_per_s"],
               "baseline": baseline, "load_average_1_5_15_min": list(load),
               "stated_peak": table.attrs["stated_peak"]}
    if run.profile == "gpu":
        for key, goal in GOALS_GPU.items():
            summary[f"goal_{key}_met"] = bool(top[key] >= goal)
            shown = wu.speedup_text(top) if key == "vs_baseline" else f"{top[key]:,.1f}"
            print(f"goal {key} >= {goal:,}: {'met' if top[key] >= goal else 'NOT met'} ({shown})")
    # The compiled rungs' warm-up (compilation, autotuning, graph capture), of each rung's kept run: later passes
    # may find the kernels in the on-disk cache, so the first pass's wait can be longer.
    summary["compile_wait_s"] = wu.compile_wait_s(table)
    if summary["compile_wait_s"] is not None:
        longest = wu.EXPECTED["compile wait"].ranges[run.profile][1]  # the longest a live demo should wait
        met = summary["compile_wait_s"] <= longest
        summary["goal_compile_wait_s_met"] = met
        print(f"compile wait (slowest compiled rung's warm-up): {summary['compile_wait_s']:.0f} s, goal <= "
              f"{longest:g} s: {'met' if met else 'NOT met'}")
    tables = {}
    if args.breakdown:
        # Why each rung is as fast as it is: the profiler's split of a step (a profiled step runs slower than a
        # timed one, so read the shares, not the totals).
        breakdown = wu.profile_rungs(base, data, rungs, run_dir, active=hp["profiled_steps"])
        print("\nwhat bounds each rung (ms per profiled step; on a GPU, kernel time by launching phase):")
        print(breakdown.to_markdown(index=False, floatfmt=",.3g"))
        parts = [c for c in breakdown.columns if c.endswith("_ms") and c != "step_ms"]
        last = breakdown.iloc[-1]
        biggest = max(parts, key=lambda part: last[part])
        summary["top_rung_biggest_part"] = biggest.removesuffix("_ms")
        summary["top_rung_biggest_part_share"] = last[biggest] / last["step_ms"]
        print(f"top rung: {summary['top_rung_biggest_part']} takes {summary['top_rung_biggest_part_share']:.0%} "
              "of a profiled step")
        tables["breakdown"] = breakdown
    path = run.write({**hp, "compile_rung": not args.no_compile, "baseline_workers": baseline["num_workers"]},
                     table, summary, tables=tables)
    print(f"JSON: {path}")
    return path


if __name__ == "__main__":
    main()
