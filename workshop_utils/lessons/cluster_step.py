"""The GPU step a GPU-cluster prediction starts from, and where that step time came from.

Notebook 02 predicts DDP's efficiency at 64 and 512 GPUs from a step time and the gradients' size.
On a GPU that step is the one just measured. On a CPU it is not: a 200 ms CPU step would hide any
all-reduce and predict near-perfect scaling that no GPU cluster shows. There the step comes from the
kit's own GPU reference run of the same notebook when one is recorded (results/reference/gpu/), and
otherwise from an estimate whose every input is printed: the run's FLOPs, a data-sheet peak and an
assumed MFU.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from ..system.hardware import peak_tflops
from .numerics import GPU_REFERENCE

# The estimate's stated inputs: a GPU of the data-sheet table, and an MFU assumed, not measured.
ESTIMATE_GPU = "H100 SXM"
ESTIMATE_MFU = 0.05


@dataclass(frozen=True)
class ClusterStep:
    step_s: float  # one optimizer step on one GPU
    grad_bytes: int  # the gradients all-reduced each step (fp32)
    source: str  # one line: measured here, the reference run, or the estimate and its inputs


def cluster_step(record: dict, reference: Path | None = None) -> ClusterStep:
    """The per-GPU step and gradient size for a GPU-cluster prediction from ``record`` (a one-process run).

    ``reference`` is the GPU reference record to prefer on a CPU (default: the one of the same name
    under results/reference/gpu/results/, when it exists).
    """
    metrics, env = record["metrics"], record["environment"]
    if env["device_type"] == "cuda":
        return ClusterStep(metrics["step_ms_median"] / 1e3, 4 * metrics["parameters"],
                           f"step measured here on {env['device_name']}")
    path = reference or GPU_REFERENCE / f"ddp-{record['config']['name']}.json"
    try:
        gpu = json.loads(Path(path).read_text())
        step_s, parameters = gpu["metrics"]["step_ms_median"] / 1e3, gpu["metrics"]["parameters"]
        return ClusterStep(step_s, 4 * parameters,
                           f"GPU step from the kit's reference run ({gpu['environment']['device_name']}, "
                           f"{gpu['environment']['date'][:10]}, {gpu['config']['model']}, batch "
                           f"{gpu['config']['batch_size']}): {1e3 * step_s:.2f} ms, not this machine's step")
    except (OSError, KeyError, TypeError, ValueError):
        pass
    precision = record["config"]["precision"]
    peak = peak_tflops(ESTIMATE_GPU, precision)
    flops = metrics["flops_per_sample"] * record["config"]["batch_size"]
    step_s = flops / (peak * 1e12 * ESTIMATE_MFU)
    return ClusterStep(step_s, 4 * metrics["parameters"],
                       f"GPU step estimated, not measured (no GPU reference run recorded): {flops / 1e9:.1f} GFLOP "
                       f"per step at an assumed {ESTIMATE_MFU:.0%} MFU of an {ESTIMATE_GPU}'s {precision} data-sheet "
                       f"peak ({peak:g} TFLOP/s) = {1e3 * step_s:.2f} ms; this machine's step "
                       f"({metrics['step_ms_median']:.0f} ms) predicts only its own link")
