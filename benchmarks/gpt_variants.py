"""Benchmark: GPT-2 small's tokens/s and MFU, each change to the model measured against the one before it, in one
command (``make gpu-variants``).

    python benchmarks/gpt_variants.py                    # on a GPU: gpt2-small, bf16, compiled, 16 x 1,024 tokens
    python benchmarks/gpt_variants.py --profile cpu      # the tiny GPT, eager: the method, not a GPU's speed

The rungs, in this order, each one change on top of the rung before it:

  0. before: queries, keys and values in three layers with biases, the residual stream in fp32 under autocast,
     the right-token count by argmax (the model as it was before these changes)
  1. fused qkv: one query-key-value layer without biases, its rows head by head (``spine.gpt.CausalSelfAttention``)
  2. bf16 residual: the residual stream in bf16 under bf16 autocast (``GPT.logits``)
  3. max count: the right-token count as a comparison with the row's maximum, not an argmax (``GPT.forward``);
     this is the kit's model
  4. 4x sequences: the kit's model with four times the sequences a step
  5. after a profiler session with CUPTI torn down (``TEARDOWN_CUPTI=1``, what the kit sets): rung 4 again
  6. after a profiler session that leaves CUPTI attached (``TEARDOWN_CUPTI=0``): rung 4 again; last, since
     nothing undoes it in this process

Rungs 0 to 2 undo the later changes by patching this process's copy of the model (``undo``), nothing else.
``vs_previous`` is each rung's tokens/s over the rung before it, ``vs_first`` over rung 0: ratios within this one
command only. A faster GPU (an H200's bandwidth) lifts every rung alike; no rung may claim it. The goal: 45% MFU
on one H100 and 50% on one H200 for the kit's model (rung 3, or rung 4 with more sequences a step). A rung that
would start with less than a minute of ``--budget-s`` left (on a CPU: of any) is not run, and the table says so.
This is a measurement to read, not a test: nothing here passes or fails on speed.
"""

from __future__ import annotations

import contextlib
import math
import os
import time

import pandas as pd
import torch
import torch.nn.functional as F
from torch import nn

import workshop_utils as wu
from workshop_utils.spine import gpt as gpt_module
from workshop_utils.spine import trainer as trainer_module
from workshop_utils.gpu_check.context import REFERENCE_FOLDER, slug
from workshop_utils.system.benchmark import benchmark_parser, read_benchmark, start_benchmark
from workshop_utils.system.errors import exit_on_workshop_error
from workshop_utils.system.results import repo_root, write_json

NAME = "gpt_variants"
PROFILES = {"gpu": dict(gpt_size="gpt2-small", batch_sequences=16, sequence_tokens=1024, steps=40, warmup_steps=15,
                        validation_sequences=8, lr=6e-4, compile=True, budget_s=420),
            "cpu": dict(gpt_size="tiny", batch_sequences=8, sequence_tokens=128, steps=8, warmup_steps=2,
                        validation_sequences=8, lr=1e-3, compile=False, budget_s=1800)}
RUNGS = ("before", "fused qkv", "bf16 residual", "max count", "4x sequences",
         "after a profiler session, CUPTI torn down", "after a profiler session, CUPTI left attached")


class ThreeLayers(nn.Module):
    """Rung 0's attention: queries, keys and values from three layers with biases, as the model had them."""

    def __init__(self, width: int, heads: int, layers: int):
        super().__init__()
        self.head_width, self.fused = width // heads, True
        self.q, self.k, self.v = (nn.Linear(width, width) for _ in range(3))
        self.proj = nn.Linear(width, width)
        for layer in (self.q, self.k, self.v, self.proj):  # GPT-2's init, the projection's scaled with depth
            nn.init.normal_(layer.weight, std=0.02 / (math.sqrt(2 * layers) if layer is self.proj else 1))
            nn.init.zeros_(layer.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, length, _ = x.shape
        q, k, v = (layer(x).view(batch, length, -1, self.head_width).transpose(1, 2) for layer in (self.q, self.k, self.v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(y.transpose(1, 2).reshape(batch, length, -1))


def _argmax_forward(self, tokens, targets=None):
    """Rungs 0 to 2's loss and count: the count by an argmax over the vocabulary."""
    logits = self.logits(tokens)
    if targets is None:
        return logits
    loss = F.cross_entropy(logits.flatten(0, -2).float(), targets.flatten())
    return loss, (logits.detach().argmax(-1) == targets).sum()


@contextlib.contextmanager
def undo(rung: str):
    """This process's model as it is at ``rung``: the changes after it undone, restored on leaving."""
    index = RUNGS.index(rung)
    build, forward, bf16 = trainer_module.build_model, gpt_module.GPT.forward, gpt_module.bf16_autocast
    if index < 1:
        def three_layer_model(name, size=None, **options):
            model = build(name, size=size, **options)
            for block in model.blocks:
                block.attn = ThreeLayers(model.size.width, model.size.heads, model.size.layers)
            return model

        trainer_module.build_model = three_layer_model
    if index < 2:
        gpt_module.bf16_autocast = lambda device_type: False
    if index < 3:
        gpt_module.GPT.forward = _argmax_forward
    try:
        yield
    finally:
        trainer_module.build_model, gpt_module.GPT.forward, gpt_module.bf16_autocast = build, forward, bf16


def profiler_session(device: torch.device, teardown: bool) -> None:
    """A short torch.profiler session, as notebook 04 and the GPU check run before timing (CUPTI on a GPU)."""
    os.environ["TEARDOWN_CUPTI"] = "1" if teardown else "0"  # read by Kineto when the session ends
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    x = torch.randn(1024, 1024, device=device)
    with profile(activities=activities):
        for _ in range(5):
            x = (x @ x).tanh()
        float(x.sum())
    os.environ["TEARDOWN_CUPTI"] = "1"


def build_parser():
    parser = benchmark_parser(NAME, __doc__, repeats=1, repeats_help="ignored: each rung runs once, in order")
    parser.add_argument("--steps", type=int, help="optimizer steps per rung, warm-up included (default: by profile)")
    parser.add_argument("--warmup-steps", type=int, help="first steps left out of timing (default: by profile)")
    parser.add_argument("--batch-size", type=int, help="sequences per step of rungs 0-3 (default: by profile)")
    parser.add_argument("--budget-s", type=float, help="seconds for every rung together (default: by profile)")
    parser.add_argument("--rungs", nargs="+", choices=RUNGS, metavar="RUNG",
                        help=f"run only these (default: all, in order): {', '.join(RUNGS)}")
    parser.add_argument("--reference", action="store_true",
                        help="also keep the result in results/reference/gpu/gpt_mfu/ (GPU and date in its name)")
    return parser


def rung_config(base, rung: str, hp: dict):
    batch = hp["batch_sequences"] * (4 if RUNGS.index(rung) >= 4 else 1)
    return base.replace(name=f"gpt-variants-{RUNGS.index(rung)}", batch_size=batch)


@exit_on_workshop_error
def main(argv=None):
    run = start_benchmark(build_parser(), argv)
    args = run.args
    hp = run.settings(PROFILES, steps=args.steps, warmup_steps=args.warmup_steps, batch_sequences=args.batch_size,
                      budget_s=args.budget_s)
    precision = "bf16"
    wu.check_precision(precision, run.device)
    base = wu.TrainConfig(model="gpt", gpt_size=hp["gpt_size"], sequence_length=hp["sequence_tokens"],
                          batch_size=hp["batch_sequences"], max_steps=hp["steps"], warmup_steps=hp["warmup_steps"],
                          test_size=hp["validation_sequences"], optimizer="adamw", lr=hp["lr"], weight_decay=0.1,
                          lr_warmup_steps=hp["warmup_steps"], precision=precision, compile=hp["compile"],
                          optimizer_kernels="fused" if run.device.type == "cuda" else "default", loader="device",
                          device=str(run.device), progress=False)
    data = wu.load_text()
    wanted = args.rungs or list(RUNGS)
    least = 60 if run.device.type == "cuda" else 0
    started, rows, previous, first = time.monotonic(), [], None, None
    for rung in [r for r in RUNGS if r in wanted]:
        left = hp["budget_s"] - (time.monotonic() - started)
        row = {"rung": RUNGS.index(rung), "change": rung}
        if left < least or left <= 0:
            rows.append({**row, "note": f"not run: {left:.0f} s of the {hp['budget_s']:.0f} s budget left"})
            print(rows[-1]["note"] + f" ({rung})", flush=True)
            continue
        if rung.startswith("after a profiler session"):
            profiler_session(run.device, teardown="torn down" in rung)
        config = rung_config(base, rung, hp)
        began = time.monotonic()
        with undo(rung):
            m = wu.train(config, data).metrics
        row.update(sequences=config.batch_size, parameters=m["parameters"], tokens_per_s=m["tokens_per_s"],
                   mfu=m["mfu"], step_ms_median=m["step_ms_median"], step_ms_p25=m.get("step_ms_p25"),
                   step_ms_p75=m.get("step_ms_p75"), peak_memory_mib=m["peak_memory_mib"], warmup_s=m["warmup_s"],
                   final_train_loss=m["final_train_loss"], seconds=time.monotonic() - began,
                   vs_previous=m["tokens_per_s"] / previous if previous else None,
                   vs_first=m["tokens_per_s"] / first if first else None, note="")
        previous, first = m["tokens_per_s"], first or m["tokens_per_s"]
        rows.append(row)
        print(f"{row['rung']} {rung}: {m['tokens_per_s']:,.0f} tokens/s"
              + (f", MFU {m['mfu']:.1%}" if m["mfu"] is not None else "")
              + (f", x{row['vs_previous']:.3f} the rung before" if row["vs_previous"] else ""), flush=True)
    table = pd.DataFrame(rows)
    shown = [c for c in ("rung", "change", "sequences", "tokens_per_s", "mfu", "vs_previous", "vs_first",
                         "step_ms_median", "peak_memory_mib", "warmup_s", "note") if c in table]
    print(table[shown].to_string(index=False, float_format=lambda v: f"{v:,.4g}"))
    measured = [r for r in rows if r.get("tokens_per_s")]
    kit = next((r for r in measured if r["change"] == "max count"), None)
    best = max((r for r in measured if r["rung"] <= 4), key=lambda r: r["mfu"] or 0, default=None)
    summary = {"kit_model_tokens_per_s": kit and kit["tokens_per_s"], "kit_model_mfu": kit and kit["mfu"],
               "best_mfu": best and best["mfu"], "best_rung": best and best["change"],
               "changes_vs_before": kit["tokens_per_s"] / measured[0]["tokens_per_s"]
               if kit and measured[0]["change"] == "before" else None}
    path = run.write({**hp, "precision": precision, "rungs": [r for r in RUNGS if r in wanted],
                      "corpus": data.describe()}, table, summary)
    print(f"Written to {path}")
    if args.reference and run.profile == "gpu":
        record = read_benchmark(path)
        kept = (repo_root() or path.parents[2]) / REFERENCE_FOLDER / "gpt_mfu" / \
            f"{NAME}-{slug(record['environment']['device_name'])}-{record['created'][:10]}.json"
        print(f"Kept as {write_json(record, kept)}")
    return path


if __name__ == "__main__":
    main()
