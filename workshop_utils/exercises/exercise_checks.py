"""Every check of notebooks 01-05 from one place, and the GPT's two (1.4, 2.4). Where the exercise's data cannot tell
a mistake from the right answer, the attendee writes a function and the check also runs it where they differ."""

import dataclasses

from ..spine.gpt import GPTSize, activation_bytes_per_sequence, flops_per_token_closed_form, largest_micro_batch
from ..system.display import format_number
from .beyond_dp_checks import check_fewest_gpus, check_fsdp_traffic, check_microbatches, fewest_gpus
from .exercise_cells import passed, require
from .exercise_judging import KitDefect, attendee_function, called, checked, count, number, verdict
from .fp16_checks import check_amp_step, check_lost_fraction, check_safe_loss_scale
from .measurement_checks import check_batch_memory, check_loader_choice, check_next_fix, constructed_loader_sweep
from .tflops_checks import check_achieved_tflops, check_matmul_tflops, check_mfu

__all__ = ["KitDefect", "check_achieved_tflops", "check_amp_step", "check_batch_memory", "check_fewest_gpus",
           "check_flops_per_token", "check_fsdp_traffic", "check_loader_choice", "check_lost_fraction",
           "check_matmul_tflops", "check_mfu", "check_micro_batch_plan", "check_microbatches", "check_next_fix",
           "check_safe_loss_scale", "constructed_loader_sweep", "fewest_gpus"]

# Exercise 1.4's second configuration: sequence, width and context all differ (in the cpu profile all are 128).
SECOND_GPT = (2_345_678, 3, 96, 200)  # parameters, layers, width, sequence: the function's order


@checked
def check_flops_per_token(gpt_flops_per_token, parameters: int, size: GPTSize, sequence_length: int,
                          counted: float, exercise: str = "Exercise 1.4") -> bool:
    """6·N + 12·L·d·T with the mistakes the notebook names; then at ``SECOND_GPT``, where they would be misnamed."""
    attendee_function(gpt_flops_per_token, exercise, "gpt_flops_per_token", "parameters, layers, width, sequence")
    N, L, d, T = parameters, size.layers, size.width, sequence_length
    formula = flops_per_token_closed_form(size, T, N)
    mistakes = [
        (6 * (N - size.context * d) + 12 * L * d * T, "that leaves the position table out (nanoGPT's convention); "
         "this exercise's N is every trainable parameter.", "use the parameters as they are."),
        (6 * N + 6 * L * d * T, "that halves attention for the causal mask; the formula counts all of it, as every "
         "MFU convention does.", "use 12 x layers x width x sequence."),
        (counted, "that is the counter's measurement, not the formula.",
         "write 6 x parameters + 12 x layers x width x sequence."),
    ]
    for where, (N, L, d, T) in ((exercise, (N, L, d, T)),
                                (f"{exercise}: at a second configuration the check tries", SECOND_GPT)):
        right = flops_per_token_closed_form(dataclasses.replace(size, layers=L, width=d), T, N)
        value = number(called(gpt_flops_per_token, where, "gpt_flops_per_token", N, L, d, T), where,
                       "gpt_flops_per_token", "one number, FLOPs per token", returned_by="gpt_flops_per_token")
        verdict(value, right, where, "gpt_flops_per_token(...)", mistakes, "FLOPs per token = 6 x parameters + 12 x "
                "layers x width x sequence, from the function's arguments.",
                inputs=f"6 x {N:,} parameters + 12 x {L} layers x width {d} x {T} tokens")
        # the second configuration's one mistake: the first's number again
        mistakes = [(value, "the same number as at the exercise's sizes: your function reads the notebook's variables, "
                     "not its arguments.", "compute from `parameters`, `layers`, `width` and `sequence`.")]
    return passed(exercise, f"{formula / 1e6:.2f} MFLOP per token by the formula; the counter measured "
                            f"{counted / 1e6:.2f} on the model itself")


def gib(n_bytes: float) -> str:
    return format_number(round(n_bytes / 2**30, 1))


@checked
def check_micro_batch_plan(micro_batch, accumulation, size: GPTSize, sequence_length: int, target_tokens: int,
                           ranks: int, free_bytes: float, exercise: str = "Exercise 2.4") -> bool:
    micro = count(micro_batch, exercise, "micro_batch", "a whole number of sequences")
    steps = count(accumulation, exercise, "accumulation", "a whole number of micro-batches")
    require(micro >= 1 and steps >= 1, exercise, f"`micro_batch` = {micro}, `accumulation` = {steps}: at least one "
            "of each is needed.", "count from 1.")
    per_sequence = activation_bytes_per_sequence(size, sequence_length)
    kept, free = gib(micro * per_sequence), gib(free_bytes)
    require(micro * per_sequence <= free_bytes, exercise, f"{format_number(micro)} sequences keep {kept} GiB ("
            f"{gib(micro * activation_bytes_per_sequence(size, sequence_length, logits=False))} in the blocks, the "
            f"loss's logits the rest); {free} GiB are free.",
            "count per_sequence as the cell above does, logits included, and take fewer sequences per micro-batch.")
    tokens = micro * steps * ranks * sequence_length
    require(tokens == target_tokens, exercise, f"{micro} x {steps} x {ranks} ranks x {sequence_length} tokens is "
            f"{tokens:,} tokens a step, not {target_tokens:,}.", "global batch = micro-batch x accumulation x ranks "
                                                                 "x sequence.")
    require(micro >= largest_micro_batch(size, sequence_length, free_bytes, target_tokens // ranks), exercise,
            f"{'1 sequence fits' if micro == 1 else f'{micro} sequences fit'}, but so does a larger power of two "
            "that divides the batch: fewer, larger micro-batches keep the GPU busier for the same global batch.",
            "double the micro-batch while it fits and still divides the batch.")
    return passed(exercise, f"{micro} sequences x {steps} accumulation steps x {ranks} ranks = {tokens:,} tokens; "
                            f"{kept} of {free} GiB of activations and logits")
