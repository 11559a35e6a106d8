"""What a section's measured numbers mean, in sentences written from those numbers (``{{section key explain="yes"}}``).

A slide's lesson can be about a machine the kit did not measure on. The storage-layout section is the case in
point: on one machine with the files in its page cache, shards read slower than small files, the opposite of
what happens on a parallel file system. The slide then says what was measured, why it came out that way, and
the lesson for a parallel file system, marked as not measured here. ``NOTES`` maps a section key to a function
of its record that returns those paragraphs (HTML); a section it cannot explain (rows missing) gets none.
"""

from __future__ import annotations

from deck_labels import fmt_count


def _row(rows: list[dict], layout: str) -> dict | None:
    return next((r for r in rows if isinstance(r, dict) and r.get("layout") == layout), None)


def io_note(record: dict) -> list[str]:
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


def checkpoint_note(record: dict) -> list[str]:
    """The blocking save against the asynchronous one: what was measured, and when asynchronous saving gains."""
    from workshop_utils.parallel.dist_checkpoint import stall_summary

    rows = [row for row in record.get("table") or [] if isinstance(row, dict)]
    if not any(row.get("mode") == "async" for row in rows):
        return []
    return [stall_summary({"rows": rows})]


NOTES = {"io": io_note, "beyond-checkpoint": checkpoint_note}
