"""What a check reads from the notebook besides the answer: its inputs (``flops``, ``usage``, ``budget_gib``). In a
notebook that watches them (``watch_exercise_inputs``), each input's value as the last cell that set no answer left
it is noted, and a check names in one line an input changed since (``flops = flops / 1e12``, through an alias)
instead of judging the answer against it. Values decide what changed; code only whether a cell set an answer."""

import dataclasses
import numbers
import weakref
from collections.abc import Mapping

from ..system.errors import ipython_shell
from ..parallel.comm_model import LINKS
from .answer_values import show
from .exercise_cells import NotYet, notebook_cell, stores

# check -> (the names its answer's cell sets, the notebook's values it reads, the values the exercise gives)
CHECKS = {
    "check_achieved_tflops": (("achieved_tflops",), ("flops", "samples_per_s"), {}),
    "check_mfu": (("mfu",), ("achieved_tflops", "matmul_tflops", "flops", "samples_per_s"), {}),
    "check_flops_per_token": (("gpt_flops_per_token",), ("n_gpt", "gpt_size", "gpt_flops"), {}),
    "check_ddp_efficiency": (("efficiency_64",), ("step_s", "grad_bytes"), {}),
    "check_micro_batch_plan": (("micro_batch", "accumulation"),
                               ("plan_size", "plan_sequence", "target_tokens", "plan_ranks", "free_bytes"), {}),
    "check_lost_fraction": (("lost_fraction",), ("activation_grads", "grads"), {}),
    "check_safe_loss_scale": (("safe_scale",), ("grads",), {}),
    "check_loader_choice": (("loader_choice",), ("loader_sweep", "baseline"), {}),
    "check_batch_memory": (("mib_per_sample", "largest_batch"), ("limit_mib", "batch_sweep", "fitted"), {}),
    "check_next_fix": (("biggest_phase", "step_speedup"), ("breakdown",), {}),
    "check_fewest_gpus": (("zero3_gpus", "zero1_gpus"), ("param_bytes", "grad_bytes", "optimizer_bytes"),
                          {"parameters": 7e9, "budget_gib": 35}),
    "check_fsdp_traffic": (("ddp_s", "fsdp_s"), (), {"parameters": 7e9, "n_bytes": 1.4e10, "world_size": 64,
                                                     "ndr_link": LINKS["ib_ndr"]}),
    "check_microbatches": (("microbatches",), (), {"stages": 8, "target": 0.10}),
    "check_array_sweep": (("sweep_lines", "array"), (), {"learning_rates": (0.01, 0.03, 0.1)}),
    "check_job_usage": (("cpu_efficiency", "time_share", "gpu_hours", "next_time_limit_s", "next_memory_mib"),
                        ("usage",), {}),
}
WATCHED = sorted({name for _, inputs, _ in CHECKS.values() for name in inputs})
# an input -> the answers of the checks that read it: a cell that sets one of them does not set the input anew (1.1's
# answer, achieved_tflops, is 1.3's input: the cell of 1.1 sets it, the cell of 1.3 changes it)
READ_BY = {name: {answer for answers, inputs, _ in CHECKS.values() if name in inputs for answer in answers}
           for name in WATCHED}
GONE = ("gone",)  # what a key that was there and is no more is compared as
KEPT_VALUES = 50  # the values each input was set to, the latest
LARGE_TENSOR = 1_000_000  # elements of a tensor in the host's memory
_summed: dict[int, tuple] = {}  # id of a large host tensor -> (a weak reference to it, its version, its sums)


@dataclasses.dataclass
class _Notes:
    """One watched notebook: each input's (place in ``_ih``, value) per cell that set it; each as before this cell."""
    set: dict[str, list[tuple[int, object]]] = dataclasses.field(default_factory=dict)
    last: dict[str, object] = dataclasses.field(default_factory=dict)


_watched: dict[int, _Notes] = {}  # id of a watched notebook's namespace -> its notes


def _number(value: float):
    return "nan" if value != value else value  # NaN, which equals nothing, compared as what it is


def _tensor_sums(value, torch) -> tuple:
    """A tensor's sum and sum of magnitudes, in float64. A large one in the host's memory, summed before every cell,
    would cost more than the cell: its sums are kept until its count of in-place writes (``_version``) moves."""
    large = value.numel() > LARGE_TENSOR and value.device.type == "cpu"
    kept = _summed.get(id(value)) if large else None
    if kept and kept[0]() is value and kept[1] == value._version:
        return kept[2]
    tensor = value.detach()
    sums = tuple(_number(float(total)) for total in (tensor.sum(dtype=torch.float64),
                                                     tensor.abs().sum(dtype=torch.float64)))
    if large:
        for key in [key for key, (ref, _, _) in _summed.items() if ref() is None]:
            del _summed[key]
        _summed[id(value)] = (weakref.ref(value), value._version, sums)
    return sums


def fingerprint(value):
    """What is compared of a value: a number as a number (5 == 5.0), a tensor or an array by its shape and sums, a
    table column by column, a mapping key by key, anything else by its repr."""
    try:
        if value is None or isinstance(value, (bool, str)):
            return value
        if isinstance(value, numbers.Real):
            return _number(float(value))
        if isinstance(value, Mapping):
            return {key: fingerprint(item) for key, item in value.items()}
        if isinstance(value, (list, tuple)):
            return tuple(fingerprint(item) for item in value)
        module = type(value).__module__.split(".")[0]
        if module in ("torch", "numpy") and getattr(value, "ndim", None) == 0:
            return _number(float(value))  # a tensor's one number, the same as that number
        if module == "torch" and hasattr(value, "detach"):
            import torch  # loaded already: the value is one of its tensors

            return ("array", tuple(value.shape), *_tensor_sums(value, torch))
        if module == "numpy" and hasattr(value, "shape"):
            return ("array", value.shape, _number(float(value.sum(dtype=float))), _number(float(abs(value).sum())))
        if module == "pandas":
            import pandas as pd

            columns = value.items() if isinstance(value, pd.DataFrame) else [("", value)]
            numeric = pd.api.types.is_numeric_dtype  # the same numbers in another type are the same column
            return {name: ("column", int(pd.util.hash_pandas_object(column.astype(float) if numeric(column) else
                                                                    column, index=True).sum()))
                    for name, column in columns}
        return ("object", repr(value)[:2000])
    except Exception:  # noqa: BLE001 - a value nothing can read is never called changed
        return ("unreadable", id(value))


def _difference(before, now, path: str):
    """(where, before, now) for the first value that changed; keys and columns added since are no change."""
    if isinstance(before, dict) and isinstance(now, dict):
        for key, item in before.items():
            where = f"{path}[{key!r}]"
            found = (where, item, GONE) if key not in now else _difference(item, now[key], where)
            if found:
                return found
        return None
    unreadable = any(isinstance(value, tuple) and value[:1] == ("unreadable",) for value in (before, now))
    return None if before == now or unreadable else (path, before, now)


def _shown(value) -> str:
    if value is GONE:
        return "no such key"
    return f"{value:.15g}" if isinstance(value, float) else repr(value) if isinstance(value, str) else "other values"


def _given(value) -> str:
    """A given value as a notebook writes it: a number, a link of the kit's table by its key, else its repr."""
    if isinstance(value, numbers.Real) and not isinstance(value, bool):
        return f"{value:g}"
    key = next((key for key, link in LINKS.items() if link == value), None)
    return f'wu.LINKS["{key}"]' if key else show(value)


def watch_exercise_inputs() -> bool:
    """In IPython: note the checks' inputs before every cell runs, so that a check can name one a cell changed; outside
    IPython it does nothing (False)."""
    shell = ipython_shell()
    if shell is None:
        return False
    if id(shell.user_ns) not in _watched:
        notes = _watched[id(shell.user_ns)] = _Notes()
        shell.events.register("pre_run_cell", lambda *_: _note(shell.user_ns, notes))
    return True


def _note(namespace: dict, notes: _Notes) -> None:
    """Before a cell runs: what the cell before it changed is as the notebook set it, unless that cell set an answer."""
    history = namespace.get("_ih") or []
    stored = stores(history[-1] if history else "")
    now = {name: fingerprint(namespace[name]) for name in WATCHED if name in namespace}
    for name, value in now.items():
        changed = name not in notes.last or _difference(notes.last[name], value, name)
        if name not in notes.set or changed and not READ_BY[name] & stored:
            notes.set[name] = [*notes.set.get(name, [])[-KEPT_VALUES + 1:], (len(history) - 1, value)]
    notes.last = now


def inputs_kept(exercise: str, check: str) -> None:
    """One line when an input ``check`` reads is not as the notebook set it, or one the exercise gives is changed."""
    answers, inputs, given = CHECKS[check]
    answer_cell, _, namespace = notebook_cell(answers)
    notes = _watched.get(id(namespace))
    if notes is None:
        return
    for name, value in given.items():
        found = name in namespace and _difference(fingerprint(value), fingerprint(namespace[name]), name)
        if found:
            text, held = _given(value), namespace[name]
            held = _given(held) if _given(held).startswith("wu.") else show(held)  # as Python shows it
            raise NotYet(f"✗ {exercise}: `{name}` = {held}, not the {text} the exercise gives: the check would judge "
                         f"your answer against it.", f"give `{name}` the exercise's value, {text}, in the cell above "
                         "your answer, and run the cells again from there.")
    for name in (name for name in inputs if name in namespace):
        # as set before the answer's cell: what a cell changed after it, even one that set no answer, is a change
        then = [value for cell, value in notes.set.get(name, []) if answer_cell is None or cell < answer_cell][-1:]
        found = then and _difference(then[0], fingerprint(namespace[name]), name)
        if found:
            where, was, now = found
            values = f" ({_shown(was)} then, {_shown(now)} now)" if isinstance(was, (float, str)) else ""
            raise NotYet(f"✗ {exercise}: `{where}` is not what the notebook set it to{values}: the check reads it as "
                         "given, and would judge your answer against the changed value.", f"run the cells again "
                         f"from the one that sets `{name}`, then your answer's; put what you compute from `{name}` "
                         "under a new name instead of changing it.")
