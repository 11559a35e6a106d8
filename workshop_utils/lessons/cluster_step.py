"""The GPU step a GPU-cluster prediction starts from, and where that step time came from.

Notebook 02 predicts DDP's efficiency at 64 and 512 GPUs from a step time and the gradients' size.
On a GPU that step is the one just measured. On a CPU it is not: a 200 ms CPU step would hide any
all-reduce and predict near-perfect scaling that no GPU cluster shows. There the step comes from what
the kit measured on a GPU (``results/reference/gpu/``, read by ``system.gpu_records``): notebook 02's
own run at its gpu profile when one is kept, else the GPU check's run of the same model, precision and
loader (at its own batch, which the line names), and only without either from an estimate whose every
input is printed: the run's FLOPs, a data-sheet peak and an assumed MFU.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ..system.gpu_records import best, check_figures, gpu_training_record, short_gpu_name
from ..system.hardware import peak_tflops

# The estimate's stated inputs: a GPU of the data-sheet table, and an MFU assumed, not measured.
ESTIMATE_GPU = "H100 SXM"
ESTIMATE_MFU = 0.05


@dataclass(frozen=True)
class ClusterStep:
    step_s: float  # one optimizer step on one GPU
    grad_bytes: int  # the gradients all-reduced each step (fp32)
    source: str  # one line: measured here, the GPU record it came from, or the estimate and its inputs


def cluster_step(record: dict, records: Path | None = None) -> ClusterStep:
    """The per-GPU step and gradient size for a GPU-cluster prediction from ``record`` (a one-process run).

    ``records``: the GPU records' folder (default: results/reference/gpu/).
    """
    metrics, env, config = record["metrics"], record["environment"], record["config"]
    if env["device_type"] == "cuda":
        return ClusterStep(metrics["step_ms_median"] / 1e3, 4 * metrics["parameters"],
                           f"step measured here on {env['device_name']}")
    gpu = gpu_training_record(f"ddp-{config['name']}", records)
    if gpu is not None:
        step_s, gpu_env, gpu_config = gpu["metrics"]["step_ms_median"] / 1e3, gpu["environment"], gpu["config"]
        return ClusterStep(step_s, 4 * gpu["metrics"]["parameters"],
                           f"GPU step measured on one {short_gpu_name(gpu_env['device_name'])}, "
                           f"{str(gpu_env['date'])[:10]}, by notebook 02's gpu profile ({gpu_config['model']}, "
                           f"{gpu_config['precision']}, batch {gpu_config['batch_size']}): {1e3 * step_s:.2f} ms, "
                           f"not this machine's step")
    same = best(check_figures(records), model=config["model"], precision=config["precision"],
                loader=config.get("loader", "torch"), num_workers=config.get("num_workers", 0))
    if same is not None:
        step_s = same.config["batch_size"] / same.value
        return ClusterStep(step_s, 4 * metrics["parameters"],
                           f"GPU step measured {same.where}, by the GPU check ({same.config['model']}, "
                           f"{same.config['precision']}, batch {same.config['batch_size']} where this run has "
                           f"{config['batch_size']}, {same.value:,.0f} samples/s): {1e3 * step_s:.2f} ms, not this "
                           f"machine's step")
    precision = config["precision"]
    peak = peak_tflops(ESTIMATE_GPU, precision)
    flops = metrics["flops_per_sample"] * config["batch_size"]
    step_s = flops / (peak * 1e12 * ESTIMATE_MFU)
    return ClusterStep(step_s, 4 * metrics["parameters"],
                       f"GPU step estimated, not measured (no GPU record of {config['model']} in {precision} in "
                       f"results/reference/gpu/): {flops / 1e9:.1f} GFLOP per step at an assumed {ESTIMATE_MFU:.0%} "
                       f"MFU of an {ESTIMATE_GPU}'s {precision} data-sheet peak ({peak:g} TFLOP/s) = "
                       f"{1e3 * step_s:.2f} ms; this machine's step ({metrics['step_ms_median']:.0f} ms) predicts "
                       f"only its own link")
