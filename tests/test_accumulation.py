"""Gradient accumulation: micro-batches that add up to one optimizer step, and DDP's all-reduces they save.

``accumulation_steps`` micro-batches of ``batch_size`` make one step; under DDP, ``no_sync()`` skips the
all-reduce of every micro-batch but the last, which sends the sum of them all. The record counts the gradient
buckets each rank all-reduced (``all_reduces``), so the saving is a number, not a claim.

Notebook 02's launches in the main job (no_sync() against an all-reduce every micro-batch, and the overlap
measurement) are checked on that run's records in tests/test_notebooks.py; the launches here are those no
notebook makes.
"""

import math
import re
from types import SimpleNamespace

import pytest
import torch

import workshop_utils as wu

# The tiny GPT on short windows of the standard library's source; SGD, whose update is linear in the gradient,
# so that equal gradients give equal weights to rounding.
RUN = dict(model="gpt", optimizer="sgd", lr=0.05, weight_decay=0.0, sequence_length=32, loader="device",
           eval_batch_size=16, test_size=16, warmup_steps=1, progress=False)




def test_two_micro_batches_of_four_are_one_batch_of_eight(corpus, one_thread):
    whole = wu.train(wu.TrainConfig(batch_size=8, max_steps=3, **RUN), corpus)
    split = wu.train(wu.TrainConfig(batch_size=4, accumulation_steps=2, max_steps=3, **RUN), corpus)
    assert wu.max_parameter_difference(whole.model, split.model) < 1e-5
    assert split.record["step_loss"] == pytest.approx(whole.record["step_loss"], rel=1e-5)
    m = split.metrics
    assert (m["global_batch_size"], m["tokens_per_step"], m["accumulation_steps"]) == (8, 8 * 32, 2)
    assert m["all_reduces"] is None, "one process all-reduces nothing"


def test_an_epoch_is_counted_in_whole_groups_of_micro_batches(corpus, one_thread):
    # 26 windows: 6 micro-batches of 4, so 2 steps of 3 micro-batches an epoch; the 2 windows left are unused.
    config = wu.TrainConfig(batch_size=4, accumulation_steps=3, epochs=2, train_size=26, **RUN)
    result = wu.train(config, corpus)
    assert result.metrics["steps"] == 4 and [row["step"] for row in result.record["history"]] == [2, 4]


def test_too_few_micro_batches_for_one_step_is_one_line(corpus):
    config = wu.TrainConfig(batch_size=4, accumulation_steps=8, train_size=20, **RUN)
    with pytest.raises(wu.WorkshopError, match="x 8 micro-batches .* not one full step fits"):
        wu.train(config, corpus)


@pytest.mark.parametrize("value", [0, -1.0, math.inf])
def test_a_bucket_size_that_cannot_be_is_one_line(value):
    with pytest.raises(wu.WorkshopError, match="bucket_cap_mb must be a positive number"):
        wu.validate_config(wu.TrainConfig(bucket_cap_mb=value))


@pytest.mark.slow
def test_an_accumulating_run_resumes_bit_identical(tmp_path, corpus, one_thread):
    config = wu.TrainConfig(batch_size=4, accumulation_steps=2, epochs=2, max_steps=5, train_size=24,
                            checkpoint_dir=str(tmp_path / "ck"), **RUN)  # 3 steps an epoch: the resume crosses one
    whole = wu.train(config.replace(checkpoint_dir=str(tmp_path / "whole")), corpus)
    wu.train(config.replace(stop_after_step=2), corpus)
    second = wu.train(config.replace(resume=True), corpus)
    assert second.metrics["param_checksum"] == whole.metrics["param_checksum"]
    assert second.record["step_loss"] == whole.record["step_loss"][2:]


@pytest.mark.slow
def test_smaller_buckets_mean_more_all_reduces():
    common = dict(RUN, batch_size=4, max_steps=2, train_size=32, threads=1, echo=False)
    common.pop("progress")
    counts = {cap: wu.launch_training(2, bucket_cap_mb=cap, **common).record["metrics"]["all_reduces"]
              for cap in (0.25, 25.0)}
    assert counts[0.25] > counts[25.0] >= 2  # 3.4 MB of fp32 gradients: at least one bucket a step


def _overlap_row(exposed, p25, p75, communication=10.0, buckets=2):
    return SimpleNamespace(bucket_cap_mb=25.0, buckets=buckets, compute_ms=40.0, communication_ms=communication,
                           overlapped_ms=40.0 + exposed, exposed_ms=exposed, exposed_p25_ms=p25, exposed_p75_ms=p75)


@pytest.mark.parametrize("row, says", [
    (_overlap_row(4.0, 3.0, 5.0, buckets=1), "one bucket is full only when the backward pass ends, so nothing can "
                                             "overlap; both together took +4.0 ms over the backward pass alone"),
    (_overlap_row(0.5, -1.0, 2.0), "the +0.5 ms between the backward pass alone and both together is within this "
                                   "machine's noise (middle half -1.0 to +2.0 ms), no exposed time measurable here"),
    (_overlap_row(4.0, 3.0, 5.0), "4.0 ms exposed (middle half +3.0 to +5.0 ms), so 60% of the communication was hidden"),
    (_overlap_row(15.0, 12.0, 18.0), "more than the all-reduces alone take: running beside the backward pass, they "
                                     "slowed it down"),
    (_overlap_row(-3.0, -4.0, -2.0), "together faster than the backward pass alone"),
])
def test_each_overlap_verdict_claims_no_more_than_its_spread(row, says):
    assert says in wu.overlap_sentence(row)


@pytest.mark.parametrize("options, says", [
    (dict(bucket_caps=[0]), "each must be positive"),
    (dict(repeats=0), "each must be positive"),
    (dict(size="huge"), "huge"),
    (dict(sequence=10_000), "longer than the tiny GPT's context"),
])
def test_overlap_options_that_cannot_be_are_one_line_before_any_rank_waits(options, says):
    with pytest.raises(wu.WorkshopError, match=re.escape(says)):
        wu.measure_overlap(**options)
