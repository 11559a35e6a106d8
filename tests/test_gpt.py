"""The GPT workload: its model, its text, its FLOPs, and its path through the one training loop."""

import hashlib
import importlib
import math
import sys

import numpy as np
import pytest
import torch

import workshop_utils as wu
from workshop_utils.spine import text as text_module

# A step of the tiny GPT small enough for unit tests: 4 sequences of 32 tokens.
TINY_RUN = dict(model="gpt", optimizer="adamw", lr=3e-3, weight_decay=0.0, batch_size=4, sequence_length=32,
                eval_batch_size=16, test_size=16, warmup_steps=1, progress=False)


# The learning test's run: 150 steps of 16 sequences of 32 bytes, AdamW with a short warm-up.
LEARN = dict(lr=6e-3, lr_warmup_steps=10, batch_size=16, sequence_length=32, max_steps=150, test_size=128,
             eval_batch_size=64)




def meta_gpt(size: str):
    """The model's shapes without its weights: counting the 124M-parameter GPT costs no memory and no time."""
    with torch.device("meta"):
        return wu.build_model("gpt", size=size)


@pytest.mark.parametrize("size, parameters, non_embedding", [
    ("tiny", 840_960, 791_808),
    ("gpt2-small", 124_448_256, 85_028_352),  # GPT-2 small with the vocabulary padded to 50,304
])
def test_parameter_counts_are_exact(size, parameters, non_embedding):
    model = meta_gpt(size)
    assert wu.count_parameters(model) == parameters  # the tied token table counted once
    assert model.non_embedding_parameters() == non_embedding


def test_tiny_gpt_is_causal_pre_norm_and_tied(monkeypatch):
    torch.manual_seed(0)
    model = wu.build_model("gpt")
    assert model.lm_head.weight is model.wte.weight
    calls = []
    real = torch.nn.functional.scaled_dot_product_attention

    def spy(*args, **kwargs):
        calls.append(kwargs.get("is_causal"))
        return real(*args, **kwargs)

    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", spy)
    tokens = torch.randint(0, 256, (2, 16))
    logits = model(tokens)
    assert logits.shape == (2, 16, 256)
    assert calls == [True] * model.size.layers  # the fused kernel's own mask, no mask tensor
    changed = tokens.clone()
    changed[:, 10] = (changed[:, 10] + 1) % 256
    after = model(changed)
    assert torch.equal(after[:, :10], logits[:, :10]), "a position saw a later token"
    assert not torch.allclose(after[:, 10:], logits[:, 10:])


def test_sizes_and_sequences_are_checked():
    with pytest.raises(wu.WorkshopError, match="Unknown gpt_size 'huge'"):
        wu.build_model("gpt", size="huge")
    with pytest.raises(wu.WorkshopError, match="size='tiny' is for model 'gpt'"):
        wu.build_model("simplecnn", size="tiny")
    with pytest.raises(wu.WorkshopError, match="longer than the model's context of 128"):
        wu.build_model("gpt")(torch.zeros(1, 129, dtype=torch.long))
    with pytest.raises(wu.WorkshopError, match="longer than the tiny GPT's context of 128"):
        wu.validate_config(wu.TrainConfig(model="gpt", sequence_length=129))
    with pytest.raises(wu.WorkshopError, match="sequence_length is for model 'gpt'"):
        wu.validate_config(wu.TrainConfig(sequence_length=64))
    assert wu.TrainConfig(model="gpt", gpt_size="gpt2-small").tokens_per_sequence == 1024
    assert wu.TrainConfig().tokens_per_sequence is None


@pytest.mark.parametrize("size, per_token", [("tiny", 5_701_632), ("gpt2-small", 854_654_976)])
def test_counted_flops_per_token_match_the_closed_form(size, per_token):
    """``torch.utils.flop_counter`` against 6·N + 12·layers·width·sequence, per token of a training step.

    N here: every parameter but the position table, i.e. the non-embedding parameters plus the
    token table, which tied is also the output layer's weight and costs a matmul of 2·width·vocab
    FLOPs a token forward (PaLM's appendix B and nanoGPT's MFU count it; Kaplan et al.'s
    non-embedding N alone would leave it out, a quarter of gpt2-small's FLOPs). The counter counts
    matrix products only, so N's biases and LayerNorm gains (0.7% of tiny's FLOPs, 0.09% of
    gpt2-small's) are the whole difference: exact once they are taken out, within 1% with them in.
    ``per_token`` at the full context (128, 1024) is the figure a run's MFU rests on.
    """
    model = meta_gpt(size)
    shape = model.size
    sequence = shape.context
    counted = wu.training_flops_per_sequence(model, sequence) / sequence
    assert counted == per_token
    table = shape.vocab * shape.width
    n = model.non_embedding_parameters() + table
    not_matmul = sum(p.numel() for p in model.parameters() if p.dim() < 2)  # biases and norm gains
    assert counted == wu.flops_per_token_closed_form(shape, sequence, n - not_matmul)
    assert counted == pytest.approx(wu.flops_per_token_closed_form(shape, sequence, n), rel=0.01)
    # Non-embedding N alone misses the output layer's 6·width·vocab (less the uncounted biases and gains).
    kaplan = wu.flops_per_token_closed_form(shape, sequence, model.non_embedding_parameters())
    assert counted - kaplan == 6 * (table - not_matmul)


def test_stdlib_corpus_is_fixed_fingerprinted_bytes(corpus):
    files = text_module.stdlib_files()
    raw = b"".join(p.read_bytes() for p in files)
    info = corpus.corpus
    assert info["sha256"] == hashlib.sha256(raw).hexdigest() and info["bytes"] == len(raw)
    assert info["python"] == "%d.%d.%d" % sys.version_info[:3] and info["files"] == len(files)
    assert len(raw) > 1_000_000, "megabytes of text, not a toy"
    tokens = np.concatenate([corpus.train_tokens, corpus.val_tokens])
    assert tokens.dtype == np.uint16 and tokens.max() < 256
    assert tokens.tobytes() == np.frombuffer(raw, np.uint8).astype(np.uint16).tobytes()
    assert len(corpus.val_tokens) == int(len(raw) * text_module.VAL_FRACTION)
    assert not any({"test", "tests"} & set(p.parts) for p in files)
    assert wu.load_text(quiet=True).fingerprint() == corpus.fingerprint()


def test_nanogpt_shards_are_read_back_and_windowed(tmp_path):
    train = np.arange(1000, dtype=np.uint16) * 50  # ids above 255: BPE-like, up to 49,950
    val = np.arange(300, dtype=np.uint16)
    train.tofile(tmp_path / "train.bin")  # exactly how nanoGPT's prepare.py writes them
    wu.write_token_shard(tmp_path / "val.bin", val)
    data = wu.load_text(tmp_path, quiet=True)
    assert isinstance(data.train_tokens, np.memmap)
    assert np.array_equal(data.train_tokens, train) and np.array_equal(data.val_tokens, val)
    assert data.max_token() == 49_950 and data.bytes_per_token is None
    assert data.corpus["sha256_of"] == "whole files" and data.fingerprint() != wu.load_text(quiet=True).fingerprint()
    elsewhere = tmp_path / "mounted" / "elsewhere"  # the same shards at another path, as on another node
    elsewhere.mkdir(parents=True)
    for name in ("train.bin", "val.bin"):
        (elsewhere / name).write_bytes((tmp_path / name).read_bytes())
    assert wu.load_text(elsewhere, quiet=True).fingerprint() == data.fingerprint()
    batches = {}
    for kind in ("torch", "device"):
        loader = wu.make_token_loader(kind, data.train_tokens, 10, 4, torch.device("cpu"), train=True, seed=3)
        assert len(loader) == 999 // 10 // 4
        batches[kind] = list(loader.epoch(1, start_batch=2))
    for (x, y), (dx, dy) in zip(*batches.values()):
        assert torch.equal(x, dx) and torch.equal(y, dy), "the two loaders give the same windows"
        assert x.dtype == torch.long and x.shape == (4, 10)
        assert torch.equal(y[:, :-1], x[:, 1:]) and torch.equal(x % 50, torch.zeros_like(x))
        assert torch.equal((x[:, 0] // 50) % 10, torch.zeros(4, dtype=torch.long)), "windows start at i*T"


def test_bad_shards_are_one_error(tmp_path):
    with pytest.raises(wu.WorkshopError, match="No token shard .*train.bin.*Fix: put train.bin and val.bin"):
        wu.load_text(tmp_path)
    (tmp_path / "train.bin").write_bytes(b"abc")
    (tmp_path / "val.bin").write_bytes(b"abcd")
    with pytest.raises(wu.WorkshopError, match="holds 3 bytes: not a run of uint16"):
        wu.load_text(tmp_path)


def test_shards_beyond_the_models_vocabulary_are_refused_before_training(tmp_path):
    wu.write_token_shard(tmp_path / "train.bin", np.arange(4000) % 300)
    wu.write_token_shard(tmp_path / "val.bin", np.arange(400) % 300)
    with pytest.raises(wu.WorkshopError, match="reach 299, but the model's vocabulary has 256 entries"):
        wu.train(wu.TrainConfig(data_root=str(tmp_path), max_steps=1, **TINY_RUN))


def test_images_for_the_gpt_or_text_for_a_cnn_are_refused(corpus, tiny_data):
    with pytest.raises(wu.WorkshopError, match="Model 'gpt' reads token ids, but the data passed are images"):
        wu.train(wu.TrainConfig(max_steps=1, **TINY_RUN), tiny_data)
    with pytest.raises(wu.WorkshopError, match="Model 'simplecnn' reads images"):
        wu.train(wu.TrainConfig(max_steps=1, progress=False), corpus)


def test_loss_units():
    uniform = np.repeat(np.arange(256), 4)
    assert wu.unigram_entropy(uniform) == pytest.approx(math.log(256))
    assert wu.bits_per_byte(math.log(256), 1.0) == pytest.approx(8.0)
    assert wu.bits_per_byte(math.log(256), 4.0) == pytest.approx(2.0)  # four bytes a token
    assert wu.bits_per_byte(1.0, None) is None  # BPE shards: bytes per token unknown


def test_gpt_flags_parse():
    entry = importlib.import_module("workshop_utils.train")  # the command, not wu.train the function
    args = entry.build_parser().parse_args(["--model", "gpt", "--gpt-size", "gpt2-small", "--sequence-length",
                                            "512", "--optimizer", "adamw", "--lr", "6e-4"])
    config = entry.config_from_args(args, 1)
    assert (config.model, config.gpt_size, config.sequence_length, config.optimizer) == (
        "gpt", "gpt2-small", 512, "adamw")


def test_a_gpt_run_records_tokens_flops_and_corpus(corpus, one_thread):
    result = wu.train(wu.TrainConfig(max_steps=3, **TINY_RUN), corpus)
    m = result.metrics
    assert m["steps"] == 3 and m["timed_steps"] == 2 and m["parameters"] == 840_960
    assert m["tokens_per_s"] == pytest.approx(m["samples_per_s"] * 32) and m["tokens_per_step"] == 4 * 32
    assert m["flops_per_token"] * 32 == m["flops_per_sample"] == wu.training_flops_per_sequence(result.model, 32)
    assert m["corpus"] == corpus.corpus and m["data_source"] == "python-stdlib"
    assert m["final_test_bits_per_byte"] == pytest.approx(m["final_test_loss"] / math.log(2))
    assert len(result.record["step_loss"]) == 3 and all(map(math.isfinite, result.record["step_loss"]))
    torch.manual_seed(0)  # the weights train() starts from
    assert wu.max_parameter_difference(wu.build_model("gpt"), result.model) > 1e-4, "AdamW steps changed nothing"


def test_adamw_leaves_biases_and_norms_undecayed():
    model = wu.build_model("gpt")
    optimizer = wu.build_optimizer(wu.TrainConfig(model="gpt", optimizer="adamw", weight_decay=0.1), model)
    decayed, undecayed = optimizer.param_groups
    assert decayed["weight_decay"] == 0.1 and undecayed["weight_decay"] == 0.0
    assert all(p.dim() == 2 for p in decayed["params"]) and all(p.dim() == 1 for p in undecayed["params"])
    assert len(decayed["params"]) + len(undecayed["params"]) == len(list(model.parameters()))


@pytest.mark.slow
@pytest.mark.parametrize("loader", ["torch", "device"])
def test_interrupted_and_resumed_gpt_run_ends_bit_identical(tmp_path, corpus, loader, one_thread):
    config = wu.TrainConfig(loader=loader, epochs=2, max_steps=8, train_size=24, checkpoint_dir=str(tmp_path / "ck"),
                            **TINY_RUN)  # 24 sequences: 6 steps an epoch, so the run crosses an epoch
    whole = wu.train(config.replace(checkpoint_dir=str(tmp_path / "whole")), corpus)
    first = wu.train(config.replace(stop_after_step=3), corpus)  # stops mid-epoch 1
    assert first.metrics["interrupted"] and first.metrics["steps"] == 3
    second = wu.train(config.replace(resume=True), corpus)
    assert second.metrics["resumed_from_step"] == 3 and second.metrics["steps"] == whole.metrics["steps"] == 8
    assert second.metrics["param_checksum"] == whole.metrics["param_checksum"]
    assert second.record["step_loss"] == whole.record["step_loss"][3:]


@pytest.mark.slow
def test_tiny_gpt_learns_below_the_unigram_entropy(corpus, one_thread):
    """A few hundred CPU steps at most: validation loss falls clearly below what token frequencies alone give.

    The unigram entropy is the loss of the best model that ignores context; falling below it means
    the model reads the text before each byte.
    """
    unigram = wu.unigram_entropy(corpus.train_tokens)
    result = wu.train(wu.TrainConfig(**{**TINY_RUN, **LEARN}), corpus)
    validation = result.metrics["final_test_loss"]
    assert result.metrics["steps"] == LEARN["max_steps"]
    assert validation < 0.9 * unigram, (validation, unigram)
    assert result.metrics["final_test_bits_per_byte"] < 0.9 * unigram / math.log(2)


def test_the_unfused_attention_computes_what_the_fused_kernel_does():
    """attention="math" writes out q·kᵀ, the causal mask, softmax and ·v: the same logits and gradients."""
    torch.manual_seed(0)
    fused = wu.build_model("gpt")
    written_out = wu.build_model("gpt")
    written_out.load_state_dict(fused.state_dict())
    written_out.use_attention("math")
    tokens = torch.randint(0, 256, (2, 48))
    for model in (fused, written_out):
        model(tokens).logsumexp(-1).mean().backward()
    assert torch.allclose(fused(tokens), written_out(tokens), atol=1e-5)
    worst = max((a.grad - b.grad).abs().max().item() for a, b in zip(fused.parameters(), written_out.parameters()))
    assert worst < 1e-5
    with pytest.raises(wu.WorkshopError, match="attention"):
        fused.use_attention("flash")


def test_the_attention_switch_reaches_the_model_and_is_for_the_gpt_only(corpus, one_thread):
    result = wu.train(wu.TrainConfig(max_steps=2, attention="math", **TINY_RUN), corpus)
    assert result.record["config"]["attention"] == "math"
    assert not any(block.attn.fused for block in result.model.blocks)
    with pytest.raises(wu.WorkshopError, match="attention='math' is for model 'gpt'"):
        wu.train(wu.TrainConfig(model="simplecnn", attention="math", max_steps=1))


def test_the_first_windows_are_the_loaders_first_windows_as_one_batch(corpus):
    from workshop_utils.spine.text import TokenWindows

    inputs, targets = wu.first_windows(corpus.train_tokens, 32, 3)
    windows = TokenWindows(corpus.train_tokens, 32, 3)
    for i in range(3):
        assert torch.equal(inputs[i], windows[i][0]) and torch.equal(targets[i], windows[i][1])
    with pytest.raises(wu.WorkshopError, match="fewer than 3 windows"):
        wu.first_windows(corpus.train_tokens[:64], 32, 3)
