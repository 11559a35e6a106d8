"""GPT-2 small toward 45% MFU, the changes checked on a CPU: one fused query-key-value layer without biases whose
column split is whole heads, the residual stream in bf16 under bf16 autocast, and loss curves that stay right."""

import copy

import pytest
import torch

import workshop_utils as wu


def _block_inputs(model, tokens, precision=None):
    seen = []
    hooks = [block.register_forward_pre_hook(lambda module, args: seen.append(args[0].dtype)) for block in model.blocks]
    context = torch.autocast("cpu", dtype=precision) if precision else torch.autocast("cpu", enabled=False)
    with context:
        model(tokens, tokens)
    for hook in hooks:
        hook.remove()
    return set(seen)


def test_the_residual_stream_is_bf16_under_bf16_autocast_and_fp32_otherwise():
    model, tokens = wu.build_gpt("tiny"), torch.randint(0, 256, (2, 16))
    assert _block_inputs(model, tokens, torch.bfloat16) == {torch.bfloat16}
    assert _block_inputs(model, tokens) == {torch.float32}
    assert _block_inputs(model, tokens, torch.float16) == {torch.float32}  # fp16's range is too narrow for the stream


@pytest.mark.parametrize("world", [2, 4])
def test_a_column_slice_of_the_fused_layer_is_whole_heads(world):
    """What split_gpt relies on: rank r's rows of qkv and columns of proj compute heads of their own, and the ranks'
    outputs add up to the whole layer's (the all-reduce of RowwiseParallel)."""
    torch.manual_seed(0)
    attention = wu.build_gpt("tiny").blocks[0].attn
    assert attention.qkv.bias is None and not hasattr(attention, "q")
    x = torch.randn(2, 16, attention.qkv.in_features)
    width = attention.proj.in_features
    with torch.no_grad():
        whole = attention(x)
        total = torch.zeros_like(whole)
        for rank in range(world):
            part = copy.deepcopy(attention)
            rows = slice(rank * 3 * width // world, (rank + 1) * 3 * width // world)
            columns = slice(rank * width // world, (rank + 1) * width // world)
            part.qkv.weight = torch.nn.Parameter(attention.qkv.weight[rows])
            part.proj.weight = torch.nn.Parameter(attention.proj.weight[:, columns])
            part.proj.bias = None  # added once, after the sum
            total += part(x)
        total += attention.proj.bias
    assert torch.allclose(total, whole, atol=1e-6)


@pytest.mark.slow
def test_the_loss_falls_alike_with_the_bf16_residual_stream(corpus, one_thread):
    """Rounding the residual stream to bf16 must not change what the model learns on a short run."""
    def curve(precision):
        config = wu.TrainConfig(model="gpt", batch_size=8, sequence_length=64, max_steps=25, warmup_steps=1,
                                optimizer="adamw", lr=3e-3, test_size=16, precision=precision, seed=0, progress=False,
                                device="cpu")
        result = wu.train(config, corpus)
        return result.record["step_loss"], result.metrics["final_test_loss"]

    (fp32, fp32_test), (bf16, bf16_test) = curve("fp32"), curve("bf16")
    for steps in (fp32, bf16):  # from about ln(256) = 5.5 nats at the start to the unigram plateau and below
        assert steps[0] > 5 and sum(steps[-8:]) / 8 < 3.6
    assert fp32_test < 3.4 and abs(bf16_test - fp32_test) < 0.15
    gaps = sorted(abs(a - b) for a, b in zip(fp32, bf16))
    assert gaps[len(gaps) // 2] < 0.15  # step by step, the same curve within bf16's rounding (a spike may differ)
