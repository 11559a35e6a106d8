"""One throughput per configuration: when two slides show the same training setup at different speeds, say why.

The notebooks train the same configuration more than once: SimpleCNN in fp32 at batch 64 is notebook 01's
baseline, the first rung of the ladder, batch 64 of the batch sweep, the loader sweep's first row and one
process of the DDP runs. Each run measures its own samples/s, and on a 2-core CPU they differ by a quarter. A
reader who sees 422 samples/s on one slide and 318 on another deserves the reason on the slide.

``Configurations`` groups every training record by what was trained (model, precision, batch, loader, ...,
processes: ``config_key``) and names one record per group as its reference number: notebook 01's run, else, of the
records the decks show (a section's newest copy), the longest of the newest folder. Whenever a deck shows the
throughput of another record of the group that rounds to a different number, ``reason`` writes the sentence the
slide shows beside it: another device, another number of CPU threads per process, or a separate shorter run with
the spread of all runs of the configuration. Every quote is kept (``Quote``), so the tests can check that each
configuration has one number or a reason.
"""

from __future__ import annotations

from dataclasses import dataclass

from deck_labels import device_words, fmt_count, human

CONFIG_FIELDS = ("model", "gpt_size", "sequence_length", "precision", "batch_size", "accumulation_steps",
                 "optimizer", "loader", "num_workers", "pin_memory", "channels_last", "attention", "compile",
                 "compile_mode", "optimizer_kernels", "sync_micro_batches", "bucket_cap_mb")
# Columns and metrics holding a throughput, and its unit.
THROUGHPUT = {"samples_per_s": "samples/s", "samples/s": "samples/s", "tokens_per_s": "tokens/s",
              "tokens/s": "tokens/s"}
REFERENCE_RUNS = ("baseline", "gpt")  # notebook 01's long runs: the number a configuration is known by


def config_key(record: dict) -> tuple | None:
    """What a training record trained, as a tuple; None for a record that is no training run."""
    if not isinstance(record, dict) or record.get("kind") != "train" or not isinstance(record.get("config"), dict):
        return None
    config = record["config"]
    return tuple(config.get(f) for f in CONFIG_FIELDS) + ((record.get("metrics") or {}).get("world_size") or 1,)


def describe(key: tuple) -> str:
    """A configuration in words: "SimpleCNN, fp32, batch 64, DataLoader with 0 workers, 1 process"."""
    c = dict(zip((*CONFIG_FIELDS, "world_size"), key))
    model = human(c["model"]) + (f" {c['gpt_size']}" if c["model"] == "gpt" and c.get("gpt_size") else "")
    parts = [model, str(c["precision"]), f"batch {c['batch_size']}"]
    if (c.get("accumulation_steps") or 1) > 1:
        parts.append(f"{c['accumulation_steps']} micro-batches")
    parts.append("data on the device" if c["loader"] == "device" else f"DataLoader with {c['num_workers']} workers")
    if c.get("channels_last"):
        parts.append("channels-last")
    if c.get("compile"):
        parts.append("compiled")
    if c.get("optimizer_kernels") not in (None, "default"):
        parts.append(f"{c['optimizer_kernels']} optimizer")
    world = c["world_size"]
    parts.append(f"{world} process{'es' if world != 1 else ''}")
    return ", ".join(parts)


def throughput(record: dict) -> tuple[float | None, str]:
    """A training record's samples/s (tokens/s for a GPT) and its unit."""
    metrics = record.get("metrics") or {}
    for key in (("tokens_per_s", "samples_per_s") if (record.get("config") or {}).get("model") == "gpt"
                else ("samples_per_s", "tokens_per_s")):
        if isinstance(metrics.get(key), (int, float)):
            return float(metrics[key]), THROUGHPUT[key]
    return None, ""


def shown(value: float) -> str:
    """A throughput as the tables and charts round it."""
    return fmt_count(value)


@dataclass
class Quote:
    """One throughput a deck shows for a training configuration."""

    deck: str
    key: tuple
    record: str
    shown: str
    unit: str
    reason: str | None  # None: it is the configuration's reference number, or rounds to it


def _close(a: float, b: float) -> bool:
    """Equal up to the rounding of a section's table (four decimals)."""
    return abs(a - b) <= max(1e-3, 1e-6 * abs(b))


def _threads(env: dict):
    return env.get("cpu_threads")


def _same_machine(a: dict, b: dict) -> bool:
    return all(a.get(k) == b.get(k) for k in ("device_type", "device_name", "hostname", "cpu_cores"))


@dataclass
class Entry:
    """One training record as one folder holds it."""

    name: str
    record: dict
    source: object  # deck_results.Source
    rank: int  # the folder's place, newest first

    @property
    def key(self) -> tuple:
        return config_key(self.record)

    @property
    def value(self) -> float:
        return throughput(self.record)[0]

    @property
    def env(self) -> dict:
        return self.record.get("environment") or self.source.environment or {}

    @property
    def steps(self):
        return (self.record.get("metrics") or {}).get("timed_steps")


class Configurations:
    """Every training record of every folder, grouped by configuration; the newest folder's copy of a name is the
    one a ``{{value name ...}}`` shows, and a table row is matched to the record of its own folder."""

    def __init__(self, results):
        self.entries: list[Entry] = []
        for rank, source in enumerate(results.sources):
            for name, record in source.records.items():
                if config_key(record) is not None and throughput(record)[0] is not None:
                    self.entries.append(Entry(name, record, source, rank))
        self.newest: dict[str, Entry] = {}
        for entry in self.entries:
            self.newest.setdefault(entry.name, entry)
        # What the decks can show: notebook 01's runs (quoted by value) and the rows of each section's newest copy.
        self.shown = [self.newest[name] for name in REFERENCE_RUNS if name in self.newest]
        sections: dict[str, object] = {}
        for source in results.sources:
            for name, record in source.records.items():
                if record.get("kind") == "section":
                    sections.setdefault(name, source)
        for name, source in sections.items():
            for row in source.records[name].get("table") or []:
                match = self._match_entry(row, source) if isinstance(row, dict) else None
                if match is not None and match not in self.shown:
                    self.shown.append(match)

    @property
    def records(self) -> dict[str, tuple[dict, object]]:
        """The newest record of each name, with its folder."""
        return {name: (e.record, e.source) for name, e in self.newest.items()}

    def key(self, name: str) -> tuple | None:
        return self.newest[name].key if name in self.newest else None

    def reference_entry(self, key: tuple) -> Entry:
        """The record a configuration is known by: notebook 01's run, else the longest run with seed 0 of the
        newest folder that trained it (among the newest copy of each name, else among every copy)."""
        def rank(entry):
            return (entry.name not in REFERENCE_RUNS, entry.rank, (entry.record["config"].get("seed") or 0) != 0,
                    -(entry.steps or 0), entry.name)
        candidates = ([e for e in self.shown if e.key == key] or [e for e in self.newest.values() if e.key == key]
                      or [e for e in self.entries if e.key == key])
        return min(candidates, key=rank)

    def reference(self, key: tuple) -> str:
        return self.reference_entry(key).name

    def entry(self, name: str, source=None) -> Entry | None:
        """Record ``name`` as ``source`` holds it (else its newest copy)."""
        return next((e for e in self.entries if e.name == name and e.source is source), self.newest.get(name))

    def _match_entry(self, row: dict, source) -> Entry | None:
        value = next((row[k] for k in THROUGHPUT if isinstance(row.get(k), (int, float))), None)
        if value is None or isinstance(value, bool):
            return None
        return next((e for e in self.entries if e.source is source and _close(e.value, float(value))), None)

    def match(self, row: dict, source) -> str | None:
        """The training record a table row shows the throughput of: the record of the row's own folder with that
        throughput (a section's table copies its records' numbers)."""
        entry = self._match_entry(row, source)
        return entry.name if entry else None

    def quote(self, deck: str, name: str, source=None) -> Quote | None:
        """The quote of record ``name``'s throughput (as ``source`` holds it) on a slide of ``deck``, with the
        reason it needs, if any."""
        entry = self.entry(name, source)
        if entry is None:
            return None
        return Quote(deck, entry.key, name, shown(entry.value), throughput(entry.record)[1], self.reason(name, source))

    def reason(self, name: str, source=None) -> str | None:
        """Why record ``name`` (as ``source`` holds it) shows another number than its configuration's reference;
        None when it does not."""
        entry = self.entry(name, source)
        key = entry.key
        ref = self.reference_entry(key)
        unit = throughput(entry.record)[1]
        if entry is ref or shown(entry.value) == shown(ref.value):
            return None
        env, ref_env = entry.env, ref.env
        who = {"baseline": "notebook 01's baseline", "gpt": "notebook 01's GPT run"}.get(
            ref.name, f"the run recorded as {ref.name}")
        short = {"baseline": "the baseline", "gpt": "that run"}.get(ref.name, "that run")
        head = (f"Same configuration as {who} ({describe(key)}): {shown(entry.value)} {unit} here, "
                f"{shown(ref.value)} there ({ref.steps} timed steps).")
        if not _same_machine(env, ref_env):
            return f"{head} Measured on {device_words(env)}, {short} on {device_words(ref_env)}."
        if _threads(env) != _threads(ref_env):
            cores = env.get("cpu_cores")
            plural = "s" if _threads(env) != 1 else ""
            return (f"{head} This run had {_threads(env)} CPU thread{plural} per process, {short} "
                    f"{_threads(ref_env)}" + (f", on the same {cores} cores." if cores else "."))
        peers = [e.value for e in self.entries
                 if e.key == key and _same_machine(e.env, env) and _threads(e.env) == _threads(env)]
        cores = env.get("cpu_cores")
        machine = f"this {cores}-core CPU" if env.get("device_type") == "cpu" and cores else "this machine"
        what = "A separate, shorter run" if (entry.steps or 0) < (ref.steps or 0) else "A separate run"
        where = f", in {entry.source.label}" if entry.source is not ref.source else ""
        return (f"{head} {what} ({entry.steps} timed steps{where}): runs of this configuration on "
                f"{machine} measured {shown(min(peers))}–{shown(max(peers))} {unit}, so compare it within its own "
                "table, not across slides.")
