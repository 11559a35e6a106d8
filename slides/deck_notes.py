"""What a section's measured numbers mean, in sentences written from those numbers (``{{section key explain="yes"}}``).

A slide's lesson can be about a machine the kit did not measure on. The storage-layout section is the case in
point: on one machine with the files in its page cache, shards read slower than small files, the opposite of
what happens on a parallel file system. The slide then says what was measured, why it came out that way, and
the lesson for a parallel file system, marked as not measured here. ``NOTES`` maps a section key to a function
of its record (and of a lookup of the other records of the section's folder, by name) that returns those
paragraphs (HTML); a section it cannot explain (rows missing) gets none.
"""

from __future__ import annotations

from html import escape

from deck_labels import fmt_count


def _row(rows: list[dict], layout: str) -> dict | None:
    return next((r for r in rows if isinstance(r, dict) and r.get("layout") == layout), None)


def io_note(record: dict, lookup=None) -> list[str]:
    """Small files against shards: what was measured, why (the page cache), and what a parallel file system does."""
    rows = record.get("table") or []
    small, shards = _row(rows, "small files"), _row(rows, "shards")
    try:
        files, shard_files = int(small["files"]), int(shards["files"])
        small_rate, shard_rate = float(small["samples_per_s"]), float(shards["samples_per_s"])
        small_mib, shard_mib = float(small["mib_on_disk"]), float(shards["mib_on_disk"])
    except (TypeError, KeyError, ValueError):
        return []
    ratio = shard_rate / small_rate
    measured = (f"<strong>Measured here</strong>: shards {ratio:.2f}× as fast as small files ({fmt_count(shard_rate)} "
                f"against {fmt_count(small_rate)} images/s). ")
    if ratio < 1:
        measured += (f"The {fmt_count(files)} files sat in this one machine's OS page cache: an open cost no request "
                     "to a metadata server, so shards had nothing to save, only the extra work of reading "
                     f"{shard_mib:.1f} MiB of tar against {small_mib:.1f} MiB of files.")
    else:
        measured += (f"Even with every file in the OS page cache of one machine, {fmt_count(files)} opens cost more "
                     f"than {fmt_count(shard_files)}.")
    lesson = (f"<strong>On a parallel file system</strong> (not measured here) each open is a request to a metadata "
              f"server that every job shares: {fmt_count(files)} opens per pass on every rank, against "
              f"{fmt_count(shard_files)} for the shards, make small files slow at scale. Use shards, or stage the "
              "data on node-local disk.")
    return [measured, lesson]


def checkpoint_note(record: dict, lookup=None) -> list[str]:
    """The blocking save against the asynchronous one: what was measured, and when asynchronous saving gains."""
    from workshop_utils.parallel.dist_checkpoint import stall_summary

    rows = [row for row in record.get("table") or [] if isinstance(row, dict)]
    if not any(row.get("mode") == "async" for row in rows):
        return []
    return [stall_summary({"rows": rows})]


def precision_gpt_note(record: dict, lookup=None) -> list[str]:
    """Each 16-bit mode's test loss on the GPT against fp32's, beside fp32's own seed-to-seed spread (the second fp32
    run's record, from the section's folder): inside it the format made no measurable difference. The speed is the
    table's, with the spread of the configuration's runs beside it where the decks show another (deck_quotes)."""
    rows = {row.get("precision"): row for row in record.get("table") or [] if isinstance(row, dict)}
    seed = (lookup or (lambda name: None))("gpt-fp32-seed1") or {}
    try:
        fp32 = float(rows["fp32"]["test loss (nats/token)"])
        spread = abs(float(seed["metrics"]["final_test_loss"]) - fp32)
    except (KeyError, TypeError, ValueError):
        return []
    said = []
    for mode, row in rows.items():
        if mode == "fp32":
            continue
        if row.get("note"):
            said.append(f"{escape(str(mode))}: {escape(str(row['note']))}.")
            continue
        try:
            gap = float(row["test loss (nats/token)"]) - fp32
        except (KeyError, TypeError, ValueError):
            continue
        verdict = ("inside fp32's own seed-to-seed spread of " if abs(gap) <= spread else
                   "outside fp32's own seed-to-seed spread of ")
        said.append(f"<strong>{escape(str(mode))}</strong>: test loss {gap:+.3f} nats/token against fp32's, {verdict}"
                    f"{spread:.3f} (fp32 trained again with another seed)"
                    + (": no measurable effect of the format on the loss." if abs(gap) <= spread else "."))
    return [" ".join(said)] if said else []


def gpt_time_estimate(tokens: str = "524288", batch: str = "", gpus: str = "1", steps: str = "1000",
                      folder=None) -> str:
    """How long a GPT-2 small job of ``steps`` steps of ``tokens`` tokens takes on ``gpus`` GPUs, estimated from the
    tokens/s the kit's GPU records measured on one GPU (those at ``batch`` sequences a pass, when given), and said
    to be an estimate; or that no rate was measured to estimate it from."""
    from workshop_utils.system import gpu_records

    runs = [f for f in gpu_records.gpt_throughput_figures(folder)
            if not batch or str(f.config.get("batch_size")) == str(batch)]
    if not runs:
        return ("no GPU run of GPT-2 small at this size is recorded in this kit yet (results/reference/gpu/), so "
                "there is no measured rate to estimate the job's time from")
    rates = sorted(float(f.config["tokens_per_s"]) for f in runs)
    tokens_n, gpus_n, steps_n = int(tokens), int(gpus), int(steps)
    minutes = [steps_n * tokens_n / (gpus_n * rate) / 60 for rate in (rates[-1], rates[0])]
    sizes = sorted({f"{f.config.get('batch_size')} × {fmt_count(f.config.get('sequence_length') or 0)}" for f in runs})
    places = "; ".join(sorted({f.where for f in runs}))
    measured = (f"{fmt_count(rates[0])}" if len(rates) == 1 else f"{fmt_count(rates[0])} to {fmt_count(rates[-1])}")
    span = (f"{minutes[0]:.0f}" if round(minutes[0]) == round(minutes[1]) else
            f"{minutes[0]:.0f} to {minutes[1]:.0f}")
    return (f"estimated, not measured, from one GPU's {measured} tokens/s ({places}, {', '.join(sizes)} tokens a "
            f"pass): {steps_n:,} steps of {tokens_n:,} tokens take {span} minutes on {gpus_n} GPU"
            f"{'s' if gpus_n != 1 else ''} scaling perfectly, plus start-up and compilation (results/reference/gpu/)")


NOTES = {"io": io_note, "beyond-checkpoint": checkpoint_note, "precision-gpt": precision_gpt_note}
