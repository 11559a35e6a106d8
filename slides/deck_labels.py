"""Words and numbers as a reader on a slide wants them: human names instead of code names, units spelled out.

The records name things the way the code does (``simplecnn``, ``all_reduce``, ``2^8``, ``bucket_cap_mb``); a
slide says "SimpleCNN", "all-reduce", "256" and "bucket size (MiB)". ``human`` turns a recorded label into the
words a chart or a table shows; the ``fmt_*`` functions write numbers with their unit and no exponent notation
("0.30 ms", not "303 us" or "3.0e-04 s").
"""

from __future__ import annotations

import math
import re

# Code names that the records use as labels, and what a slide calls them.
NAMES = {
    "simplecnn": "SimpleCNN", "resnet18": "ResNet-18", "gpt": "GPT", "gpt tiny": "GPT tiny",
    "all_reduce": "all-reduce", "all_gather": "all-gather", "reduce_scatter": "reduce-scatter",
    "channels_last": "channels-last", "no_sync": "no_sync()",
    "BF16 autocast": "bf16 autocast",
}

# Code names a chart or table must never show as they are (the tests check every chart's text against these).
CODE_NAMES = ("simplecnn", "resnet18", "all_reduce", "all_gather", "reduce_scatter", "channels_last",
              "samples_per_s", "tokens_per_s", "bucket_cap_mb", "world_size", "step_ms", "num_workers",
              "pin_memory", "peak_memory_mib", "vs_small_files", "vs_baseline", "data_wait_fraction")

SUPERSCRIPT = str.maketrans("0123456789-", "⁰¹²³⁴⁵⁶⁷⁸⁹⁻")


def human(label) -> str:
    """A recorded label as a slide shows it: known code names replaced, ``2^16`` written out, underscores gone."""
    text = str(label)
    if text in NAMES:
        return NAMES[text]
    for code, words in NAMES.items():
        if "_" in code:
            text = re.sub(rf"\b{re.escape(code)}\b", words, text)
    text = re.sub(r"\b(simplecnn|resnet18)\b", lambda m: NAMES[m.group(1)], text, flags=re.I)
    text = re.sub(r"\b2\^(\d+)\b", lambda m: f"{2 ** int(m.group(1)):,}", text)
    text = re.sub(r"^(\d+)x batch$", r"\1× batch", text)
    return re.sub(r"(?<=[a-z])_(?=[a-z])", " ", text)


def power_of_two(label) -> str:
    """``2^8`` -> "2⁸"; anything else unchanged."""
    match = re.fullmatch(r"\s*2\^(-?\d+)\s*", str(label))
    return f"2{match.group(1).translate(SUPERSCRIPT)}" if match else str(label)


def fmt_count(value, digits: int = 0) -> str:
    """A number with thousands separators: 14783.6 -> "14,784"."""
    return f"{float(value):,.{digits}f}"


def fmt_sig(value, significant: int = 3) -> str:
    """A number to ``significant`` digits without exponent notation: 0.000401 -> "0.0004", 97.18 -> "97.2"."""
    number = float(value)
    if number == 0 or not math.isfinite(number):
        return "0" if number == 0 else "–"
    if abs(number) >= 10 ** (significant - 1):
        return f"{number:,.0f}"
    decimals = max(0, significant - 1 - math.floor(math.log10(abs(number))))
    text = f"{number:.{decimals}f}"
    return text.rstrip("0").rstrip(".") if "." in text else text


def fmt_ms(milliseconds: float) -> str:
    """A duration given in ms, in ms unless it is a second or more: 0.303 -> "0.30 ms", 1520 -> "1.52 s"."""
    ms = float(milliseconds)
    if abs(ms) >= 1000:
        return f"{ms / 1000:.3g} s"
    if abs(ms) >= 100:
        return f"{ms:.0f} ms"
    if abs(ms) >= 10:
        return f"{ms:.1f} ms"
    return f"{ms:.2f} ms"


def fmt_bytes(n_bytes: float) -> str:
    """A size in bytes with a binary unit: 4096 -> "4 KiB", 16777216 -> "16 MiB"."""
    value = float(n_bytes)
    for unit in ("bytes", "KiB", "MiB", "GiB", "TiB"):
        if abs(value) < 1024 or unit == "TiB":
            return f"{fmt_sig(value, 3)} {unit}"
        value /= 1024
    return f"{value} TiB"  # not reached


def fmt_pct(share: float, digits: int | None = None) -> str:
    """A share (0.25) as a percentage: "25%"; small shares keep two significant digits ("0.017%")."""
    pct = 100 * float(share)
    if digits is not None:
        return f"{pct:.{digits}f}%"
    return f"{fmt_sig(pct, 2 if abs(pct) < 10 else 3)}%"


def fmt_ratio(value: float) -> str:
    """A ratio as "2.98×"."""
    return f"{float(value):.2f}×"


def device_words(env: dict) -> str:
    """The device of a record's environment in words: "x86_64 (cpu, 2 cores)", "NVIDIA H100 (cuda)"."""
    if not env:
        return "an unrecorded device"
    kind = env.get("device_type", "?")
    cores = env.get("cpu_cores")
    extra = f", {cores} cores" if kind == "cpu" and cores else ""
    return f"{env.get('device_name', '?')} ({kind}{extra})"


_CAP_IN_TEXT = re.compile(r"\ba cap of ([\d,.]+) MiB")
_OVER_CAP = re.compile(r"over the ([\d,.]+) MiB memory cap")


def table_rows(record: dict) -> list[dict]:
    """A record's table rows. A run that a memory cap stopped says "over the N MiB memory cap at batch B"; a record
    written before the kit said so (its status "out of memory at batch B", its text "a cap of N MiB") is read the
    same way: a cap standing in for the limit is never shown as memory running out."""
    rows = [row for row in record.get("table") or [] if isinstance(row, dict)]
    cap = _CAP_IN_TEXT.search(str(record.get("text", "")))
    if cap is None:
        return rows
    return [{**row, "status": f"over the {cap.group(1)} MiB memory cap" + str(row["status"])[len("out of memory"):]}
            if str(row.get("status", "")).startswith("out of memory") else row for row in rows]


def memory_stop_label(status) -> str | None:
    """The short label of a row memory stopped: "out of memory" (the device's) or "over the N MiB cap"; None else."""
    text = str(status)
    cap = _OVER_CAP.match(text)
    if cap:
        return f"over the {cap.group(1)} MiB cap"
    return "out of memory" if text.startswith("out of memory") else None


GPT_SIZES = {"tiny": "the tiny GPT", "gpt2-small": "GPT-2 small"}


def config_words(record: dict) -> str:
    """What a training record ran, in words from its own config: "the tiny GPT, 16 × 128 tokens a step, 40 steps,
    fp32" or "SimpleCNN, batch 64, 3 epochs, fp32"; "" for a record that holds no training config."""
    config, metrics = record.get("config") or {}, record.get("metrics") or {}
    if not config:  # not a training record: what ran is in its notebook's section
        return ""
    model = config.get("model")
    if model == "gpt":
        parts = [GPT_SIZES.get(config.get("gpt_size"), f"GPT {config.get('gpt_size', '')}".strip())]
        if config.get("batch_size") and config.get("sequence_length"):
            parts.append(f"{config['batch_size']} × {config['sequence_length']} tokens a step")
    else:
        parts = [human(model or "model")]
        if config.get("batch_size"):
            parts.append(f"batch {config['batch_size']}")
    if (config.get("accumulation_steps") or 1) > 1:
        parts.append(f"{config['accumulation_steps']} micro-batches a step")
    steps = config.get("max_steps") or metrics.get("steps")
    if steps:
        parts.append(f"{steps:,} steps")
    elif config.get("epochs"):
        parts.append(f"{config['epochs']} epoch{'s' if config['epochs'] != 1 else ''}")
    if config.get("precision"):
        parts.append(str(config["precision"]))
    return ", ".join(parts)
