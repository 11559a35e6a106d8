"""Benchmark: how far the notebooks' test accuracies move from seed to seed, printed and written to JSON.

    python benchmarks/accuracy_spread.py --profile cpu                   # 5 seeds of every compared run
    ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 python benchmarks/accuracy_spread.py --profile cpu

Every run whose accuracy a notebook compares, or a test holds to a threshold, is trained again with
seeds 0, 1, ... (``--repeats`` of them), with the sizes read from the notebook's own ``PROFILES``:
notebook 01's baseline, notebook 02's one-process run, notebook 03's modes that run full length on
this CPU, and every rung of notebook 04's ladder. The seed moves the initial weights, the shuffle and
the augmentation, never the data set. The second command above repeats it with PyTorch's and oneDNN's
AVX2 kernels on any x86 CPU: another CPU computes in another order, which moves a short run as much as
a seed does. Thresholds in the tests and the what-you-should-see ranges are set from these spreads
(results/reference/benchmarks/). Accuracy does not depend on speed, so a busy machine changes nothing here.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

import workshop_utils as wu
from workshop_utils.system.benchmark import benchmark_parser, start_benchmark
from workshop_utils.system.errors import WorkshopError, exit_on_workshop_error

NAME = "accuracy_spread"
NOTEBOOKS = Path(__file__).resolve().parent.parent / "notebooks"


def _profile(stem: str, profile: str) -> dict:
    return wu.notebook_profiles(NOTEBOOKS / f"{stem}.ipynb")[profile]


def cases(profile: str, device: str) -> list[tuple[str, wu.TrainConfig, tuple]]:
    """(case, config, data sizes) for every compared run, as the notebooks build them."""
    found = []
    nb01 = _profile("01_single_gpu_baseline", profile)
    found.append(("01 baseline", wu.TrainConfig(name="baseline", model="simplecnn", precision="fp32", loader="torch",
                                                epochs=nb01["epochs"], batch_size=nb01["batch_size"],
                                                num_workers=nb01["num_workers"], device=device),
                  (nb01["train_size"], nb01["test_size"])))
    nb02 = _profile("02_multi_gpu_ddp", profile)
    found.append(("02 one process", wu.TrainConfig(name="strong-1", model=nb02["model"], precision=nb02["precision"],
                                                   loader=nb02["loader"], batch_size=nb02["batch_size"],
                                                   max_steps=nb02["steps"], lr=nb02["lr"],
                                                   lr_warmup_steps=nb02["lr_warmup_steps"], device=device),
                  (nb02["train_size"], nb02["test_size"])))
    nb03 = _profile("03_mixed_precision", profile)
    base03 = wu.TrainConfig(batch_size=nb03["batch_size"], epochs=nb03["epochs"], max_steps=nb03["max_steps"],
                            lr=nb03["lr"], lr_warmup_steps=nb03["lr_warmup_steps"], channels_last=nb03["channels_last"],
                            loader="device", warmup_steps=2, test_size=nb03["test_size"], device=device)
    for config in wu.precision_plan(base03, nb03["modes"]):
        if config.max_steps == base03.max_steps and config.precision != "tf32":  # tf32 is fp32 on a CPU
            found.append((f"03 {config.name}", config, (nb03["train_size"], nb03["test_size"])))
    nb04 = _profile("04_profiling_optimization", profile)
    base04 = wu.TrainConfig(name="baseline", precision="fp32", loader="torch", batch_size=nb04["batch_size"],
                            num_workers=nb04["num_workers"], max_steps=nb04["ladder_steps"],
                            warmup_steps=nb04["warmup_steps"], device=device)
    # The tuned loader's worker count changes speed only: every sample is shuffled and augmented from its seed.
    rungs = wu.ladder_rungs(dict(num_workers=0), compile=False, base=base04, device=device,
                            batch_factor=nb04["ladder_batch_factor"], lr_warmup_steps=nb04["ladder_lr_warmup"])
    previous = None
    for config in wu.rung_configs(base04, rungs):
        # a rung that changes nothing but speed here (the tuned loader without workers) would repeat its neighbour
        if config is not None and (previous is None or config.replace(name=previous.name) != previous):
            found.append((f"04 {config.name}", config, (nb04["train_size"], nb04["test_size"])))
        previous = config if config is not None else previous
    return found


def build_parser():
    parser = benchmark_parser(NAME, __doc__, repeats=5, repeats_help="seeds per run (0, 1, ...)")
    parser.add_argument("--only", nargs="+", metavar="PREFIX", help="cases whose name starts so (e.g. '04')")
    return parser


@exit_on_workshop_error
def main(argv=None):
    run = start_benchmark(build_parser(), argv)
    chosen = [c for c in cases(run.profile, run.device.type)
              if not run.args.only or c[0].startswith(tuple(run.args.only))]
    if not chosen:
        raise WorkshopError(f"No run's name starts with {' or '.join(map(repr, run.args.only))}.",
                            "use --only 01, 02, 03 or 04 (the notebook numbers), or leave it out.")
    data_sets = {}
    rows = []
    bar = run.progress(len(chosen) * run.repeats, "seeded runs")
    for case, config, sizes in chosen:
        if sizes not in data_sets:
            data_sets[sizes] = wu.load_data(None, *sizes)
        for seed in range(run.repeats):
            bar.set_postfix_str(f"{case}, seed {seed}")
            result = wu.train(config.replace(seed=seed, progress=False), data_sets[sizes])
            rows.append({"case": case, "seed": seed, "steps": result.metrics["steps"], "batch_size": config.batch_size,
                         "precision": config.precision, "test_acc_pct": 100 * result.metrics["final_test_acc"]})
            bar.update()
    bar.close()
    table = pd.DataFrame(rows)
    spread = (table.groupby("case", sort=False)["test_acc_pct"].agg(["min", "mean", "max", "std"]).reset_index()
              .rename(columns={"min": "min_pct", "mean": "mean_pct", "max": "max_pct", "std": "sd_points"}))
    print(spread.to_markdown(index=False, floatfmt=".1f"))
    env = wu.environment(run.device)
    summary = {"cpu_capability": env["cpu_capability"], "lowest_pct": float(table["test_acc_pct"].min()),
               "lowest_case": table.loc[table["test_acc_pct"].idxmin(), "case"],
               "data_source": data_sets[next(iter(data_sets))].source}
    path = run.write({"seeds": run.repeats, "data_seed": 0}, table, summary, tables={"spread": spread})
    print(f"JSON: {path}")
    return path


if __name__ == "__main__":
    main()
