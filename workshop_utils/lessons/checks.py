"""Readable summaries of a run, and the "what you should see" checks.

The checks compare a run with what a healthy run looks like and say, in plain
words, what to do when a number is off. They never fail a notebook: a slow
shared node is information, not an error.
"""

from __future__ import annotations

import pandas as pd

SIMPLECNN_PARAMETERS = 2_474_506


def _fmt(value, spec: str) -> str:
    return "unknown" if value is None else format(value, spec)


def summary_table(record: dict) -> pd.DataFrame:
    """The headline figures of one training run, with units."""
    m, c = record["metrics"], record["config"]
    rows = [
        ("device", m["device_name"], ""),
        ("model / precision", f"{c['model']} / {c['precision']}", ""),
        ("loader", f"{c['loader']} (workers={c['num_workers']}, pin_memory={c['pin_memory']})", ""),
        ("processes x batch", f"{m['world_size']} x {c['batch_size']}", "samples per step"),
        ("steps (timed)", f"{m['steps']} ({m['timed_steps']})", "first warm-up steps not timed"),
        ("throughput", _fmt(m["samples_per_s"], ",.0f"), "samples/s"),
        ("step time median / p90", f"{_fmt(m['step_ms_median'], '.1f')} / {_fmt(m['step_ms_p90'], '.1f')}", "ms"),
        ("waiting for data", _fmt(m["data_wait_fraction"] and 100 * m["data_wait_fraction"], ".1f"), "% of step time"),
        ("peak memory", _fmt(m["peak_memory_mib"], ",.0f"), f"MiB, {m['memory_kind']}"),
        ("training FLOPs per sample", _fmt(m["flops_per_sample"] / 1e6, ",.1f"), "MFLOP (torch.utils.flop_counter)"),
        ("achieved", _fmt(m["tflops_per_device"], ".3f"), "TFLOP/s per device"),
        ("MFU", _fmt(m["mfu"] and 100 * m["mfu"], ".2f"), "% of the device's peak (unknown if not in the table)"),
        ("final test accuracy", _fmt(m["final_test_acc"] and 100 * m["final_test_acc"], ".1f"), f"% on {m['data_source']}"),
        ("wall time", _fmt(m["wall_s"], ".1f"), "s, including evaluation and start-up"),
    ]
    return pd.DataFrame(rows, columns=["metric", "value", "unit"]).set_index("metric")


def check_baseline(record: dict, expected_parameters: int = SIMPLECNN_PARAMETERS) -> pd.DataFrame:
    """Healthy-run checks for a training record: each row says ok or what to look at."""
    m = record["metrics"]
    checks = []

    def add(name: str, ok: bool, detail: str, fix: str = "") -> None:
        checks.append({"check": name, "result": "ok" if ok else "LOOK", "detail": detail if ok else f"{detail} {fix}"})

    add("parameter count", m["parameters"] == expected_parameters,
        f"{m['parameters']:,} trainable parameters (expected {expected_parameters:,}).",
        "The model definition differs from the workshop's.")
    losses = record["step_loss"]
    head, tail = losses[: max(1, len(losses) // 10)], losses[-max(1, len(losses) // 10):]
    learning = bool(losses) and sum(tail) / len(tail) < 0.8 * sum(head) / len(head)
    add("loss goes down", learning, f"mean loss {sum(head) / max(len(head), 1):.3f} at the start, "
        f"{sum(tail) / max(len(tail), 1):.3f} at the end.",
        "Lower the learning rate, or train longer.")
    acc = m["final_test_acc"] or 0.0
    add("accuracy above chance", acc >= 0.3, f"test accuracy {100 * acc:.1f}% (chance is 10%).",
        "Train for more epochs; with real CIFAR-10 expect 60-75% after a few epochs.")
    if m["step_ms_median"]:
        spread = m["step_ms_p90"] / m["step_ms_median"]
        add("steady step time", spread < 1.5, f"p90 step is {spread:.2f}x the median.",
            "Steps stall now and then: data loading, other jobs on the node, or thermal throttling.")
    wait = m["data_wait_fraction"]
    if wait is not None:
        add("data keeps up", wait < 0.2, f"{100 * wait:.0f}% of step time spent waiting for the next batch.",
            "The input pipeline is the bottleneck: more num_workers, pin_memory, or loader='device' (notebook 04).")
    if m["mfu"] is not None:
        add("GPU is busy", m["mfu"] > 0.05, f"MFU {100 * m['mfu']:.1f}% of peak.",
            "Expected for a model this small in fp32: notebooks 03 and 04 raise it.")
    if m["data_source"] == "synthetic":
        checks.append({"check": "real data", "result": "LOOK",
                       "detail": "Synthetic stand-in used: accuracies are not CIFAR-10 accuracies (see the banner)."})
    return pd.DataFrame(checks).set_index("check")
