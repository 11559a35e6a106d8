"""Exercise 2.1 around its ranks (which ``ddp_lab`` runs): the function as source they can run, the files through
which they wait for each other, and the one line for each world size."""

from __future__ import annotations

import ast
import dis
import inspect
import json
import math
import sys
import textwrap
import time
from collections import Counter
from pathlib import Path

from ..parallel.failures import LOST_PEER
from .ddp_lab_files import limit_words
from .exercise_cells import NotYet, require
from .exercise_judging import short

# What a rank's side of check_average_gradients watches: every collective the attendee's function starts.
COLLECTIVES = ("all_reduce", "reduce", "broadcast", "all_gather", "all_gather_into_tensor", "reduce_scatter",
               "reduce_scatter_tensor", "all_to_all", "all_to_all_single", "gather", "scatter", "barrier")
# The world sizes the function runs on, in one launch: 3 ranks as two nodes (2 + 1), then node 0's 2 ranks alone.
# No world size typed in, and no LOCAL_WORLD_SIZE, is right on both.
PER_NODE, SECOND_WORLD = (2, 1), 2


def placeholder_body(source: str) -> bool:
    """True when a function's body (or a lambda's) is only ``...`` (after a docstring and comments)."""
    function = next((n for n in ast.walk(ast.parse(source))
                     if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))), None)
    if isinstance(function, ast.Lambda):
        return isinstance(function.body, ast.Constant) and function.body.value is Ellipsis
    return function is not None and all(isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant) and (
        s.value.value is Ellipsis or isinstance(s.value.value, str)) for s in function.body)


def function_source(function, exercise: str) -> tuple[str, str]:
    """(the source the ranks run, the name it defines), padded so that its line numbers are the cell's."""
    hint = "define it with def average_gradients(model): ... in a notebook cell, and run that cell."
    try:
        lines, first = inspect.getsourcelines(function)
    except (OSError, TypeError):
        raise NotYet(f"✗ {exercise}: the source of `average_gradients` cannot be read: the check sends it to the "
                     "ranks.", hint) from None
    source = textwrap.dedent("".join(lines))
    try:
        tree = ast.parse(source)
    except SyntaxError:
        raise NotYet(f"✗ {exercise}: the source of `average_gradients` cannot be read on its own.", hint) from None
    padding = "\n" * max(0, first - 1)
    if function.__name__ != "<lambda>":
        return padding + source, function.__name__
    lambdas = [n for n in ast.walk(tree) if isinstance(n, ast.Lambda)]
    require(len(lambdas) == 1, exercise, "`average_gradients` is a lambda on a line with other lambdas.", hint)
    segment = ast.get_source_segment(source, lambdas[0])
    name = "average_gradients_lambda"
    return padding + "\n" * (lambdas[0].lineno - 1) + f"{name} = {segment}\n", name


def _global_names(code) -> set[str]:
    """The global names ``code`` (and the functions, lambdas and comprehensions inside it) reads."""
    names = {i.argval for i in dis.get_instructions(code) if i.opname in ("LOAD_GLOBAL", "LOAD_NAME")}
    for const in code.co_consts:
        if inspect.iscode(const):
            names |= _global_names(const)
    return names


def _home(value) -> str | None:
    """The module ``value`` can be imported from under its own name in a fresh process (not ``__main__``), or None."""
    module, qualname = getattr(value, "__module__", None), getattr(value, "__qualname__", None)
    if not (isinstance(module, str) and isinstance(qualname, str) and qualname.isidentifier()):
        return None
    top = module.partition(".")[0]
    origin = getattr(sys.modules.get(top), "__file__", None) or ""
    importable = top in sys.stdlib_module_names or "site-packages" in origin or top == __name__.partition(".")[0]
    return module if importable and getattr(sys.modules.get(module), qualname, None) is value else None


def shipped_globals(function, exercise: str, given=("torch", "dist", "nn")) -> str:
    """Import lines for the modules ``function`` reads from its notebook; ``NotYet`` naming a function or variable
    of the notebook it reads, which the ranks do not have."""
    namespace = getattr(function, "__globals__", {})
    lines = []
    # the notebook's names alone: a builtin, or a name defined nowhere, is a NameError the ranks report
    for name in sorted(_global_names(function.__code__) & namespace.keys() - set(given)):
        value = namespace[name]
        if inspect.ismodule(value) and value.__name__ != "__main__":
            lines.append(f"import {value.__name__} as {name}")
        elif home := _home(value):  # imported from a module (from math import sqrt)
            lines.append(f"from {home} import {value.__qualname__} as {name}")
        else:
            kind = "function" if inspect.isroutine(value) or inspect.isclass(value) else "variable"
            counted = isinstance(value, int) and not isinstance(value, bool)  # a count, in an average: the world size
            fix = (f"define `{name}` inside average_gradients (a def inside the def works), or write its code there"
                   if kind == "function" else f"compute `{name}` inside average_gradients"
                   + (" (the world size: dist.get_world_size())" if counted else ""))
            raise NotYet(f"✗ {exercise}: `average_gradients` {'calls' if kind == 'function' else 'uses'} `{name}`, "
                         f"a {kind} of your notebook, which the ranks do not have: they run only the function's own "
                         "source, with torch, dist, nn and the modules it uses.", fix + ".")
    return "".join(f"\ntry:\n    {line}\nexcept ImportError:\n    pass\n" for line in lines)


def watched(op: str, original, started: list[str], log: Path, unwaited: list):
    """``original``, the collective ``op``, logging each call first: a rank that then hangs still shows its calls."""
    def call(*args, **kwargs):
        started.append(op)
        with open(log, "a") as file:
            file.write(op + "\n")
        work = original(*args, **kwargs)
        return None if work is None else Awaited(work, unwaited)
    return call


class Awaited:
    """An asynchronous collective's work, in ``unwaited`` until ``wait()`` or ``get_future()`` is called on it."""

    def __init__(self, work, unwaited: list):
        self.work, self._unwaited = work, unwaited
        unwaited.append(self)

    def __getattr__(self, name):  # wait and get_future take it out of ``unwaited``
        if name in ("wait", "get_future"):
            self._unwaited[:] = [w for w in self._unwaited if w is not self]
        return getattr(self.work, name)


def compared(mine, ddp, own) -> dict:
    """The largest gaps of ``mine`` to DDP's and to this rank's ``own``, and ``mine`` as a multiple of DDP's."""
    import torch

    scale = max(float(t.abs().max()) for t in ddp)
    if any(t is None or t.shape != s.shape for t, s in zip(mine, ddp)):  # ``own`` has DDP's shapes: the same model
        return {"scale": scale, "to_ddp": math.inf, "to_own": math.inf, "ratio": None, "residual": None}

    def gap(other) -> float:
        return max(float((t.float() - s.float()).abs().max()) for t, s in zip(mine, other))

    flat_mine = torch.cat([t.detach().float().flatten() for t in mine])
    flat_ddp = torch.cat([t.detach().float().flatten() for t in ddp])
    ratio = float(flat_mine @ flat_ddp / (flat_ddp @ flat_ddp))  # mine = ratio x DDP's, when proportional
    return {"scale": scale, "to_ddp": gap(ddp), "to_own": gap(own), "ratio": ratio,
            "residual": float((flat_mine - ratio * flat_ddp).norm() / flat_ddp.norm())}


def started_calls(folder: Path, rank: int) -> list[str]:
    return (path.read_text().split() if (path := folder / f"rank{rank}.calls").exists() else [])


def _record(folder: Path, rank: int, ending: str = "json") -> dict | None:
    return json.loads(path.read_text()) if (path := folder / f"rank{rank}.{ending}").exists() else None


def wait_for_ranks(folder: Path, rank: int, world_size: int, mine: list[str], limit_s: float) -> str | None:
    """After this rank's function returned: None once every rank's did with the same calls, else why not ("mismatch",
    "peer failed", "timeout"). A collective only some ranks started would otherwise pair with the next ones."""
    deadline = time.time() + limit_s
    while True:
        done = {r: _record(folder, r, "done") for r in range(world_size) if (folder / f"rank{r}.done").exists()}
        if len(done) == world_size:
            return None if all(d["calls"] == mine for d in done.values()) else "mismatch"
        # A peer writes .done before its error, so one read with an error and still without .done has stopped:
        # ``done`` alone may be older than the error it would excuse.
        if any(((_record(folder, r) or {}).get("error") or (_record(folder, r) or {}).get("stopped"))
               and not (folder / f"rank{r}.done").exists() for r in range(world_size) if r != rank and r not in done):
            return "peer failed"
        if any(len(started_calls(folder, r)) > len(mine) for r in range(world_size) if r not in done):
            return "mismatch"
        if time.time() > deadline:
            return "timeout"
        time.sleep(0.02)


def _collective_summary(calls: dict[int, list[str]]) -> str:
    """Who started which collectives: "rank 0: 4 all_reduce; ranks 1, 2: none"."""
    groups: dict[str, list[int]] = {}
    for rank in sorted(calls):
        groups.setdefault(", ".join(f"{n} {op}" for op, n in Counter(calls[rank]).items()) or "none", []).append(rank)
    return "; ".join(f"rank{'s' * (len(r) > 1)} {', '.join(map(str, r))}: {text}" for text, r in groups.items())


def gradients_failure(folder: Path, nproc: int, exercise: str) -> NotYet | None:
    """The one line for a function that did not end in a comparison on every rank: its error, a time limit, or
    different calls; None when the ranks failed elsewhere."""
    records = {r: _record(folder, r) for r in range(nproc) if (folder / f"rank{r}.json").exists()}
    errors = sorted((r for r in records.values() if r.get("error")), key=lambda r: r["time"])
    first = next((r for r in errors if not LOST_PEER.search(r["error"])), None)
    calls = {r: started_calls(folder, r) for r in range(nproc)}
    stopped = {r.get("stopped") for r in records.values()}
    if first is None and "timeout" in stopped:
        timed = next(r for r in records.values() if r.get("stopped") == "timeout")
        limit = limit_words(timed["limit_s"], timed["startup_s"])
        late = [r for r in range(nproc) if not (folder / f"rank{r}.done").exists()]
        behind = [r for r in late if len(calls[r]) == min(len(calls[k]) for k in late)]  # the fewest calls
        ranks = f"rank{'s' * (len(behind) > 1)} {', '.join(map(str, behind))}"
        return NotYet(f"✗ {exercise}: stopped at the time limit of {limit}: {ranks} had not returned from your "
                      f"function ({_collective_summary(calls)}).",
                      f"find what {ranks} waited for: a loop that never ends, a sleep or input(), or a collective "
                      "only some ranks make (`if dist.get_rank() == 1:`); the function should take milliseconds.")
    if first is None and ("mismatch" in stopped or len({tuple(c) for c in calls.values()}) > 1):
        return NotYet(f"✗ {exercise}: the ranks made different collective calls ({_collective_summary(calls)}): a "
                      "collective completes only when every rank makes it, so a rank waited for the others forever.",
                      "make the same calls on every rank, in the same order: no dist.all_reduce inside "
                      "`if dist.get_rank() == 0:`.")
    first = first or (errors[0] if errors else None)
    if first is None:
        return None
    where = f" on line {first['line']} (`{short(first['code'], 80)}`)" if first.get("line") else ""
    others = [str(r) for r in sorted(records) if r != first["rank"] and records[r].get("error")]
    return NotYet(f"✗ {exercise}: your function raised {first['error']} on rank {first['rank']}{where}"
                  + (f"; rank(s) {', '.join(others)} failed too, or lost their connection to it" if others else ""),
                  "fix that line: on the ranks your function has torch, dist, nn and the modules it imports, not "
                  "the notebook's other names; return from it (sys.exit ends the rank's process).")


def judge_comparison(results: list[dict], world: int, exercise: str) -> dict:
    """The facts of a pass, or ``NotYet`` saying what the gradients are: the sum divided by what, each rank's own,
    or how far from DDP's."""
    worst = {key: max(math.inf if r[key] is None else r[key] for r in results)  # JSON keeps no inf: None
             for key in ("to_ddp", "to_own")}
    calls, unwaited = results[0]["calls"], max(r.get("unwaited", 0) for r in results)
    require(not unwaited, exercise, f"{unwaited} of your collective calls ran with async_op=True, and nothing waited "
            "for the work it returns: p.grad was used while its all-reduce may still have been running.",
            "keep the work each call returns and call .wait() on it before using p.grad (or leave async_op out).")
    if worst["to_ddp"] > 1e-5 * max(1.0, max(r["scale"] for r in results)):
        require(bool(calls), exercise, "your function made no collective call: every rank kept its own gradients.",
                "all-reduce each parameter's .grad: dist.all_reduce(p.grad), then divide by dist.get_world_size().")
        fix = "divide the all-reduced p.grad by dist.get_world_size() (WORLD_SIZE), which counts every node's ranks."
        divisors = [world / r["ratio"] if (r.get("ratio") or 0) > 0 and r.get("residual") is not None
                    and r["residual"] < 1e-4 else math.nan for r in results]
        if not any(math.isnan(d) or abs(d - round(d)) >= 1e-3 for d in divisors):
            nodes = sorted({(r["node"], round(d)) for r, d in zip(results, divisors)})
            by = str(nodes[0][1]) if len({d for _, d in nodes}) == 1 else \
                ", ".join(f"{d} on node {node}" for node, d in nodes)
            raise NotYet(f"✗ {exercise}: your gradients are the sum over the {world} ranks"
                         + (f", {world}x DDP's." if by == "1" else f" divided by {by}, where DDP divides by {world}."),
                         fix)
        raise NotYet(f"✗ {exercise}: your gradients differ from DDP's by up to {worst['to_ddp']:.2g} on {world} ranks"
                     + (": they are still each rank's own." if worst["to_own"] <= 1e-6 else "."),
                     "every parameter's gradient, summed over the ranks in place (dist.all_reduce(p.grad)), divided "
                     "by the world size.")
    return {"calls_made": calls, "ddp_buckets": results[0]["ddp_buckets"], "max_difference": worst["to_ddp"]}
