"""The numerics helpers of notebook 03 tell the truth about floating-point formats and name the failing layer."""

import math

import pytest
import torch
from torch import nn

import workshop_utils as wu

CPU = torch.device("cpu")


def tiny_model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Flatten(), nn.Linear(12, 16), nn.ReLU(), nn.Linear(16, 10))


def batch(n: int = 8):
    torch.manual_seed(1)
    return torch.randn(n, 3, 2, 2), torch.randint(0, 10, (n,))


def test_format_table_reads_the_ranges_from_finfo():
    table = wu.format_table()
    assert table.loc["fp16", "largest"] == 65504
    assert table.loc["fp16", "smallest normal"] == 2.0**-14
    assert table.loc["fp16", "smallest subnormal"] == 2.0**-24  # the slides' "6e-8"
    assert table.loc["bf16", "largest"] == torch.finfo(torch.float32).max * (1 - 2.0**-8) / (1 - 2.0**-24)
    assert table.loc["bf16", "exponent bits"] == table.loc["fp32", "exponent bits"] == 8
    assert (table.loc["fp16", ["exponent bits", "mantissa bits"]] == [5, 10]).all()
    # The smallest subnormal really is the last number before zero.
    assert torch.tensor(wu.smallest_subnormal(torch.float16)).half().item() > 0
    assert torch.tensor(wu.smallest_subnormal(torch.float16) / 2).half().item() == 0


def test_underflow_table_shows_what_loss_scaling_rescues():
    grads = {"activations": torch.tensor([1e-9, 1e-6, 1e-3, 1.0])}
    table = wu.underflow_table(grads, scales=(1.0, 2.0**16)).set_index("loss scale")
    assert table.loc["2^0", "flushed to zero %"] == 25  # 1e-9 is below fp16's smallest subnormal
    assert table.loc["2^0", "subnormal (imprecise) %"] == 25  # 1e-6 survives, imprecisely
    assert table.loc["2^16", "flushed to zero %"] == 0
    assert table.loc["2^16", "overflowed to inf %"] == 25  # 1.0 * 65536 no longer fits


def test_capture_gradients_collects_every_parameter_and_leaves_the_model_clean():
    model, (images, labels) = tiny_model(), batch()
    grads = wu.capture_gradients(model, images, labels)
    assert grads["parameters"].numel() == wu.count_parameters(model)
    assert grads["activations"].numel() > 0 and (grads["activations"] >= 0).all()
    assert all(p.grad is None for p in model.parameters())
    assert not any(m._forward_hooks for m in model.modules())


def test_clean_pass_has_no_nonfinite():
    model, (images, labels) = tiny_model(), batch()
    assert wu.find_first_nonfinite(model, images, labels, "fp32") is None
    assert wu.find_first_nonfinite(model, images, labels, "bf16") is None


def test_fp16_forward_overflow_is_traced_to_its_layer():
    model, (images, labels) = tiny_model(), batch()
    with torch.no_grad():
        model[1].weight.mul_(1e5)  # activations ~1e5: fine in fp32 and bf16, beyond fp16's 65,504
    found = wu.find_first_nonfinite(model, images, labels, "fp16")
    assert (found.phase, found.layer, found.kind, found.dtype) == ("forward", "1", "Linear", "fp16")
    assert found.inf > 0 and "output of 1 (Linear, fp16)" in str(found)
    assert wu.find_first_nonfinite(model, images, labels, "bf16") is None
    assert all(p.grad is None for p in model.parameters())


def test_too_large_loss_scale_is_traced_to_the_first_layer_in_backward():
    model, (images, labels) = tiny_model(), batch()
    found = wu.find_first_nonfinite(model, images, labels, "fp16", loss_scale=2.0**30)
    assert (found.phase, found.layer) == ("backward", "3")  # the last layer is the first one backward reaches


def test_nonfinite_weights_are_reported_before_running_anything():
    model, (images, labels) = tiny_model(), batch()
    with torch.no_grad():
        model[3].bias[0] = float("nan")
    found = wu.find_first_nonfinite(model, images, labels)
    assert (found.phase, found.layer, found.nan) == ("parameters", "3", 1)


def test_overshoot_leaves_the_original_model_alone():
    model, (images, labels) = tiny_model(), batch()
    before = wu.parameter_checksum(model)
    broken = wu.overshoot(model, images, labels, lr=1e4)
    assert wu.parameter_checksum(model) == before
    assert wu.max_parameter_difference(model, broken) > 1


def test_autocast_dtypes_reads_the_dtypes_of_a_real_forward_pass():
    model, (images, labels) = tiny_model(), batch()
    table = wu.autocast_dtypes(model, images, labels, "bf16", CPU).set_index("layer")
    assert table.loc["1", "input"] == "fp32" and table.loc["1", "output"] == "bf16"
    assert table.loc["1", "weights"] == "fp32"  # master weights stay fp32
    assert table.loc["loss", "output"] == "fp32"
    summary = wu.dtype_summary(table.reset_index())
    assert summary.loc["Linear", "layers"] == 2
    assert set(wu.autocast_dtypes(model, images, labels, "fp32", CPU)["output"]) == {"fp32"}


def test_grad_scaler_trace_backs_off_on_overflow_and_grows_after_clean_steps():
    model, (images, labels) = tiny_model(), batch()
    batches = [(images, labels)] * 12
    trace = wu.grad_scaler_trace(model, batches, CPU, init_scale=2.0**24, growth_interval=2)
    first = trace.iloc[0]
    assert first["next scale"] == first["scale"] / 2 and first["event"].startswith("overflow")
    assert trace["event"].str.startswith("grew").any()
    clean = trace[trace["event"] == ""].iloc[0]
    assert clean["next scale"] == clean["scale"]


def test_skipped_step_leaves_the_weights_untouched():
    model, (images, labels) = tiny_model(), batch()
    before = wu.parameter_checksum(model)
    trace = wu.grad_scaler_trace(model, [(images, labels)], CPU, init_scale=2.0**60)
    assert trace.loc[0, "event"].startswith("overflow")
    assert wu.parameter_checksum(model) == before


@pytest.mark.parametrize("call", [
    lambda m, x, y: wu.autocast_dtypes(m, x, y, "fp61", CPU),
    lambda m, x, y: wu.find_first_nonfinite(m, x, y, "half"),
])
def test_unknown_mode_is_one_clear_error(call):
    model, (images, labels) = tiny_model(), batch()
    with pytest.raises(wu.WorkshopError, match="Unknown precision .* use one of 'fp32', 'tf32', 'fp16', 'bf16'"):
        call(model, images, labels)


def test_fp8_off_an_fp8_gpu_says_why_it_is_skipped():
    assert "cpu" in wu.fp8_support(CPU)
    with pytest.raises(wu.WorkshopError, match="FP8 .* Fix: skip the FP8 measurement"):
        wu.fp8_matmul_benchmark(CPU)


def test_training_batches_cycles_over_epochs():
    data = wu.make_synthetic_cifar(40, 8)
    batches = wu.training_batches(data, 16, CPU, steps=5)  # 2 batches per epoch, so 3 epochs
    assert len(batches) == 5 and all(x.shape == (16, 3, 32, 32) and x.dtype == torch.float32 for x, _ in batches)
    with pytest.raises(wu.WorkshopError, match="larger than the 40 training images"):
        wu.training_batches(data, 64, CPU, steps=1)


def test_gradient_histogram_marks_fp16_limits():
    fig = wu.plot_gradient_magnitudes({"parameters": torch.tensor([1e-9, 1e-4, 1e-2])})
    labels = [line.get_label() for line in fig.axes[0].get_lines()]
    assert any("smallest subnormal 6e-08" in label for label in labels)
    assert any("largest 6.6e+04" in label for label in labels)


def test_bf16_and_fp32_ranges_are_the_known_powers_of_two():
    table = wu.format_table()
    assert table.loc["bf16", "smallest subnormal"] == 2.0**-133  # 2^-126 smallest normal, 7 fraction bits
    assert table.loc["bf16", "smallest normal"] == table.loc["fp32", "smallest normal"] == 2.0**-126
    assert table.loc["fp32", "smallest subnormal"] == 2.0**-149
    assert table.loc["bf16", "eps (gap above 1)"] == 2.0**-7 and table.loc["fp16", "eps (gap above 1)"] == 2.0**-10
    assert (table.loc["bf16", ["exponent bits", "mantissa bits"]] == [8, 7]).all()
    assert table.loc["fp32", "largest"] == (2 - 2.0**-23) * 2.0**127
    assert table["bits"].to_dict() == {"fp32": 32, "fp16": 16, "bf16": 16}


def test_underflow_table_counts_each_outcome_at_each_scale():
    # One value per fp16 outcome at scale 1: 2^-26 is below half the smallest subnormal (2^-24), so it flushes;
    # 2^-20 is subnormal (under 2^-14); 1.0 is normal; 2^15 * 3 = 98,304 is beyond 65,504. Zeros are not counted.
    grads = {"g": torch.tensor([0.0, 2.0**-26, 2.0**-20, 1.0, 3 * 2.0**15], dtype=torch.float64)}
    table = wu.underflow_table(grads, scales=(1.0, 2.0**4, 2.0**12)).set_index("loss scale")
    assert table["values"].tolist() == [4, 4, 4]
    assert table.loc["2^0", ["flushed to zero %", "subnormal (imprecise) %", "overflowed to inf %"]].tolist() \
        == [25, 25, 25]
    # x16: 2^-22 is now subnormal (no flush), 2^-16 still subnormal, 16 normal, the big one still inf.
    assert table.loc["2^4", ["flushed to zero %", "subnormal (imprecise) %", "overflowed to inf %"]].tolist() \
        == [0, 50, 25]
    # x4096: 2^-14 and 2^-8 are both normal now; 4096 fits; 3 * 2^27 overflows.
    assert table.loc["2^12", ["flushed to zero %", "subnormal (imprecise) %", "overflowed to inf %"]].tolist() \
        == [0, 0, 25]
    # The same values cast to bf16 (fp32's range): nothing flushes or overflows at scale 1.
    bf16 = wu.underflow_table(grads, scales=(1.0,), dtype=torch.bfloat16).iloc[0]
    assert (bf16["flushed to zero %"], bf16["subnormal (imprecise) %"], bf16["overflowed to inf %"]) == (0, 0, 0)
    tiny = wu.underflow_table({"g": torch.tensor([2.0**-135, 2.0**-133, 2.0**-127, 1.0], dtype=torch.float64)},
                              scales=(1.0,), dtype=torch.bfloat16).iloc[0]
    assert (tiny["flushed to zero %"], tiny["subnormal (imprecise) %"]) == (25, 50)  # 2^-133 is the last one


def test_an_overflow_in_a_weights_own_gradient_is_found():
    """A weight's gradient sums over the batch and can overflow where no layer output's gradient does:
    notebook 03 printed 'None' under a sentence saying the scale overflows (its parameters' gradients did)."""
    import torch.nn as nn

    model = nn.Sequential(nn.Linear(64, 10))
    images = torch.full((512, 64), 100.0)
    labels = torch.arange(512) % 10
    found = wu.find_first_nonfinite(model, images, labels, "fp32", loss_scale=1e38)
    assert found is not None and found.phase == "backward" and found.layer == "0.weight"
    assert found.kind == "parameter gradient"
    assert wu.find_first_nonfinite(model, images, labels, "fp32", loss_scale=1.0) is None
    assert all(p.grad is None for p in model.parameters())


def test_the_gradient_chart_marks_as_zero_only_what_rounds_to_zero():
    """fp16 rounds to nearest: values above half the smallest subnormal round up to it, not down to 0."""
    grads = {"parameters": torch.tensor([2.0**-26, 2.0**-24.5, 1e-3])}
    figure = wu.plot_gradient_magnitudes(grads)
    band = [p for p in figure.axes[0].patches if p.get_label().startswith("becomes 0")][0]
    right_edge = band.get_x() + band.get_width() if hasattr(band, "get_width") else max(x for x, _ in band.get_xy())
    assert right_edge == pytest.approx(math.log10(2.0**-25))
    assert torch.tensor(2.0**-24.5).half().item() == 2.0**-24  # what the band's edge stands for
    assert torch.tensor(2.0**-25.5).half().item() == 0.0
