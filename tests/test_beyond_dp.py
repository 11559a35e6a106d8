"""Notebook 05's claims as tests: collectives, ZeRO arithmetic, FSDP, tensor and pipeline parallelism,
activation checkpointing and distributed checkpoints, on gloo ranks started by torchrun.

The parts the notebook launches in the main job (the collectives shown and timed, DDP against FSDP, tensor
parallelism on two ranks, the GPT sharded and split, the checkpoint round trip) are checked on that run's records
in tests/test_notebooks.py; the launches here are the ones no notebook makes: three ranks, a GPU node's CPU ranks,
a time limit, bad options."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch
import torch.distributed as dist

import workshop_utils as wu
from workshop_utils import parallel_demos
from workshop_utils.parallel import collectives
from workshop_utils.parallel import pipeline
from workshop_utils.parallel.comm_model import Link, ring_all_reduce_s
from workshop_utils.system.errors import WorkshopError

DEMO = dict(nproc=2, device="cpu", echo=False, timeout_s=300)


@pytest.fixture
def one_rank_group():
    """A process group of this test process alone (gloo): enough to call the helpers directly."""
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


def test_zero_stages_shard_adams_sixteen_bytes_per_parameter():
    n, p = 1_000_000, 4
    table = wu.zero_memory_table(n, p, "fp32").set_index("strategy").total_gib * 2**30
    assert table["DDP (replicated)"] == pytest.approx(16 * n)
    assert table["ZeRO-1 (optimizer state sharded)"] == pytest.approx((4 + 4 + 8 / p) * n)
    assert table["ZeRO-2 (+ gradients sharded)"] == pytest.approx((4 + (4 + 8) / p) * n)
    assert table["ZeRO-3 / FSDP (+ parameters sharded)"] == pytest.approx(16 * n / p)
    mixed = wu.zero_memory_table(n, p, "mixed")
    assert mixed.total_gib.iloc[0] * 2**30 == pytest.approx(16 * n)  # 2 + 2 + 12, as in the ZeRO paper
    with pytest.raises(WorkshopError, match="Unknown precision"):
        wu.zero_memory_table(n, p, "fp8")


def test_ring_all_gather_and_reduce_scatter_cost_half_an_all_reduce():
    link = Link("test", bandwidth_gbps=10.0, latency_us=20.0, source="made up")
    full = ring_all_reduce_s(2**24, 8, link)
    assert wu.ring_time_s("all_reduce", 2**24, 8, link) == full
    assert wu.ring_time_s("all_gather", 2**24, 8, link) == pytest.approx(full / 2)
    assert wu.ring_time_s("reduce_scatter", 2**24, 8, link) == pytest.approx(full / 2)
    assert wu.ring_time_s("broadcast", 2**24, 8, link) is None


def test_bubble_formula():
    assert wu.bubble_fraction(2, 1) == pytest.approx(0.5)
    assert wu.bubble_fraction(4, 4) == pytest.approx(3 / 7)
    assert wu.bubble_fraction(1, 8) == 0


def test_the_timed_call_only_communicates_into_buffers_allocated_before_it(one_rank_group):
    for name in wu.COLLECTIVES:
        op = collectives.Collective(name, torch.arange(4, dtype=torch.float32))
        buffers = {key: value.data_ptr() for key, value in vars(op).items() if torch.is_tensor(value)}
        op.refill()
        op()
        op()  # twice: an in-place collective must not need a fresh copy between rounds
        assert {key: value.data_ptr() for key, value in vars(op).items() if torch.is_tensor(value)} == buffers, name
        assert op.result().tolist() == [0.0, 1.0, 2.0, 3.0], name  # one rank: every collective returns its input
    with pytest.raises(WorkshopError, match="Unknown collective"):
        collectives.Collective("all_to_all", torch.zeros(4))


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine where allocating on a GPU fails")
@pytest.mark.parametrize("helper", [
    lambda: wu.show_collectives(),
    lambda: wu.time_collectives([4096], repeats=1),
    lambda: wu.measure_bubble([1], batch=4, width=8, layers_per_stage=1, repeats=1),
    lambda: wu.check_tensor_parallel(batch=2, features=4, hidden=8),
], ids=["show_collectives", "time_collectives", "measure_bubble", "check_tensor_parallel"])
def test_helpers_called_without_a_device_use_the_process_groups(one_rank_group, monkeypatch, helper):
    helper()  # gloo: CPU tensors, and it works
    # Under NCCL the same call must put its tensors on this rank's GPU; here that attempt fails.
    monkeypatch.setattr(dist, "get_backend", lambda group=None: "nccl")
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    with pytest.raises((RuntimeError, AssertionError), match="(?i)cuda|nvidia|driver"):
        helper()


@pytest.mark.slow
def test_tensor_parallel_runs_on_a_world_size_that_divides_nothing():
    record = wu.launch_demo("tensor-parallel", batch=16, features=64, hidden=256, **{**DEMO, "nproc": 3})
    assert record["asked"] == {"features": 64, "hidden": 256} and record["rounded_up"]
    assert (record["features"], record["hidden"]) == (66, 258)  # the next multiples of 3
    for row in record["rows"]:
        assert row["world_size"] == 3 and row["max_abs_difference"] <= 1e-5 * row["scale"], row["split"]
    assert record["rows"][0]["output_shape"] == [16, 258] and record["rows"][1]["output_shape"] == [16, 66]


def test_a_split_that_does_not_divide_says_how_to_fix_it(one_rank_group, monkeypatch):
    monkeypatch.setattr(dist, "get_world_size", lambda group=None: 3)
    with pytest.raises(WorkshopError, match="does not split into 3 equal parts"):
        wu.ColumnParallelLinear(torch.nn.Linear(4, 8))


def test_tensor_parallelism_needs_whole_heads_on_every_rank():
    from workshop_utils.parallel.gpt_parallel import why_not_split

    small = wu.GPT_SIZES["gpt2-small"]
    assert why_not_split(small, 4) is None and why_not_split(small, 6) is None
    assert "12 heads" in why_not_split(small, 8)  # eight GPUs: the other strategies run, this one is skipped
    with pytest.raises(WorkshopError, match="divides the head count"):
        wu.split_gpt(wu.build_model("gpt"), _FakeMesh(3))


class _FakeMesh:
    def __init__(self, ranks: int):
        self.ranks = ranks

    def size(self) -> int:
        return self.ranks


@pytest.mark.slow
def test_activation_checkpointing_per_gpt_block_keeps_gradients_and_cuts_memory():
    result = wu.measure_gpt_recompute(batch=4, sequence=64, steps=1)
    assert result["gradient_max_abs_difference"] == 0.0
    # Stored: four blocks' attention and MLP activations; recomputed: their inputs and one block's.
    assert 0.15 < result["memory_ratio"] < 0.6
    again = wu.measure_gpt_recompute(batch=4, sequence=64, steps=1)
    assert again["table"].peak_memory_mib.tolist() == result["table"].peak_memory_mib.tolist()


def test_a_gpt_that_recomputes_its_blocks_computes_the_same_logits():
    torch.manual_seed(0)
    model = wu.build_model("gpt")
    tokens = torch.randint(0, 256, (2, 16))
    stored = model(tokens)
    model.recompute_blocks = True
    assert torch.equal(model(tokens), stored)


@pytest.mark.slow
def test_pipeline_gradients_equal_the_unsplit_model_and_the_bubble_is_measured():
    # Three stages: the middle one receives and sends in both directions, and checks its own gradients.
    record = wu.launch_demo("pipeline", microbatch_counts=[1, 4], batch=64, width=64, layers_per_stage=1,
                            repeats=1, **{**DEMO, "nproc": 3})
    assert record["gradient_max_abs_difference"] < 1e-5
    table = wu.bubble_table(record)
    assert list(table.bubble_formula) == [pytest.approx(2 / 3), pytest.approx(1 / 3)]
    assert table.bubble_measured.between(0, 1).all()
    timeline = record["timelines"]["4"]
    assert {(r["stage"], r["pass"]) for r in timeline} == {(s, p) for s in (0, 1, 2) for p in "FB"}
    assert sum(r["pass"] == "F" for r in timeline) == 3 * 4  # every stage runs every micro-batch forward
    assert all(0 <= r["start"] <= r["end"] for r in timeline)


def test_the_pipeline_gradient_check_catches_a_wrong_gradient():
    full = pipeline.build_full_model(2, 1, 8)
    stage = pipeline.stage_of(full, 1, 2)
    inputs, labels = torch.randn(4, 8), torch.arange(4)
    torch.nn.functional.cross_entropy(full(inputs), labels).backward()
    right = [p.grad.clone() for p in stage.parameters()]
    assert pipeline.gradient_difference(right, [p.grad for p in stage.parameters()]) == 0.0
    wrong = [g.clone() for g in right]
    wrong[-1][0] += 0.5
    assert pipeline.gradient_difference(wrong, [p.grad for p in stage.parameters()]) == pytest.approx(0.5)
    with pytest.raises(WorkshopError, match="parameter for parameter"):
        pipeline.gradient_difference(right, [p.grad for p in pipeline.stage_of(full, 0, 2).parameters()])


def test_micro_batches_that_do_not_divide_the_batch_are_refused_in_one_line(one_rank_group):
    with pytest.raises(WorkshopError, match="does not split into"):
        wu.measure_bubble([3], batch=64, width=8)


@pytest.mark.slow
def test_activation_checkpointing_keeps_gradients_and_cuts_memory():
    result = wu.measure_recompute(width=128, depth=6, tokens=2048, steps=1)
    assert result["gradient_max_abs_difference"] == 0.0
    # Tensor memory, counted tensor by tensor on a CPU: the same on every run, however busy the machine.
    # Stored: six blocks' activations; recomputed: their inputs plus one block's, about 0.3 of it.
    assert 0.15 < result["memory_ratio"] < 0.5
    again = wu.measure_recompute(width=128, depth=6, tokens=2048, steps=1)
    assert again["table"].peak_memory_mib.tolist() == result["table"].peak_memory_mib.tolist()


def test_loading_a_folder_that_is_not_a_checkpoint_says_so(tmp_path):
    with pytest.raises(WorkshopError, match="not a distributed checkpoint"):
        wu.load_into_one_process(tmp_path, wu.build_model("simplecnn"))


def test_bad_demo_options_are_refused_before_any_process_starts():
    with pytest.raises(WorkshopError, match="cannot take these options"):
        wu.launch_demo("pipeline", micro_batches=[1, 2])
    with pytest.raises(WorkshopError, match="Unknown part"):
        wu.launch_demo("zero-bubble")
    with pytest.raises(WorkshopError, match="Unknown device"):
        wu.launch_demo("pipeline", device="gpu")
    with pytest.raises(WorkshopError, match="time limit"):
        wu.launch_demo("pipeline", timeout_s=None)


def test_a_part_that_outlives_its_time_limit_is_stopped_with_one_line():
    # Starting torchrun and its ranks alone takes longer than this limit.
    with pytest.raises(WorkshopError, match=r"'collectives-show' on 2 cpu ranks: The job ran longer than 1 s"):
        wu.launch_demo("collectives-show", **{**DEMO, "timeout_s": 1})


# Loaded by every Python process of the job through PYTHONPATH: torch.cuda answers as on a GPU node
# (unless CUDA_VISIBLE_DEVICES hides the GPUs), and anything that would initialise CUDA fails.
FAKE_GPU_NODE = """
import os

import torch


def _hidden():
    return os.environ.get("CUDA_VISIBLE_DEVICES") == ""


def _initialise(*args, **kwargs):
    raise RuntimeError("a CPU rank initialised CUDA")


torch.cuda.is_available = lambda: not _hidden()
torch.cuda.device_count = lambda: 0 if _hidden() else 1
torch.cuda._lazy_init = _initialise
torch.cuda.init = _initialise
"""


@pytest.mark.slow
def test_cpu_ranks_on_a_gpu_node_never_initialise_cuda(tmp_path, monkeypatch):
    fake = tmp_path / "fake-gpu-node"
    fake.mkdir()
    (fake / "sitecustomize.py").write_text(FAKE_GPU_NODE)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(fake), os.environ.get("PYTHONPATH")])))
    # The checkpoint part covers the most: FSDP's device mesh, DCP's writer and async staging, environment().
    record = wu.launch_demo("checkpoint", folder=str(tmp_path / "dcp"), batch_size=8, round_trip_steps=1,
                            stall_steps=1, every=1, **DEMO)
    assert record["device"] == "cpu"
    assert record["environment"]["device_type"] == "cpu" and record["environment"]["gpus"] == []


def test_hiding_the_gpus_must_come_before_cuda_starts(monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    with pytest.raises(WorkshopError, match="already initialised"):
        parallel_demos.hide_gpus()
    assert "CUDA_VISIBLE_DEVICES" not in os.environ
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: False)
    parallel_demos.hide_gpus()
    assert os.environ["CUDA_VISIBLE_DEVICES"] == ""


@pytest.mark.parametrize("args,message", [
    (["pipeline", "--options", "{not json"], "not valid JSON"),
    (["pipeline", "--options", "[1, 2]"], "must be a JSON object"),
])
def test_option_mistakes_are_one_line_and_exit_2(args, message, capsys):
    # Refused before any process group is set up: the command's own main(), called in this process.
    with pytest.raises(SystemExit) as exited:
        parallel_demos.main(args)
    said = capsys.readouterr().err
    assert exited.value.code == 2 and said.startswith("error: ") and message in said and said.count("\n") == 1


@pytest.mark.slow
def test_a_part_started_without_torchrun_is_one_line_and_exit_2():
    result = subprocess.run([sys.executable, "-m", "workshop_utils.parallel_demos", "pipeline"], capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 2 and result.stderr.startswith("error: ")
    assert "needs two or more processes" in result.stderr and "Traceback" not in result.stderr
