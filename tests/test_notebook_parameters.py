"""Every value papermill may pass a notebook either resolves or is one WorkshopError line with its fix.

The main job and attendees pass parameters with papermill (``-p epochs 3``); the notebooks' first
cell (tagged "parameters") names them, and the cell that defines ``PROFILES`` resolves them with
``wu.pick_settings`` (notebook 05 also with ``wu.resolve_profile`` and ``wu.demo_world``). Nothing
is executed here but that: each notebook's own resolution statements, taken from the notebook
file, run on values hypothesis draws, valid and garbage (negative or huge numbers, text, floats,
NaN, lists, None). The property is two-sided: a draw whose every value is valid resolves to
exactly those values, and a draw with any garbage raises WorkshopError naming a bad parameter,
on one line with a fix; never another exception type.
"""

from __future__ import annotations

import ast
import contextlib
import io
import math
from pathlib import Path

import nbformat
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import workshop_utils as wu
from workshop_utils.system.errors import WorkshopError
from workshop_utils.system.profiles import PROFILE_NAMES

NOTEBOOKS = sorted((Path(__file__).resolve().parent.parent / "notebooks").glob("*.ipynb"))
# Resolved by other cells (resolve_run_dir, load_data), which create folders or read data: not drawn here.
RESOLVED_ELSEWHERE = {"run_dir", "data_root"}
# What each papermill parameter is. A notebook parameter missing here fails the test: say what it is.
SIZES = {"epochs", "batch_size", "train_size", "steps", "max_steps", "memory_cap_mib", "max_mib", "fsdp_steps",
         "timeout_s"}
SWITCHES = {"torch_compile"}
RANKS = {"nproc"}  # demo_world's: 2 or more; only valid values are drawn (garbage: the test at the end)
LARGEST = 2**63 - 1


def _names(node) -> set[str]:
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}


def resolution_of(path: Path):
    """(parameter names, setup code, resolution code) of a notebook, read from its cells."""
    code = [c for c in nbformat.read(path, as_version=4).cells if c.cell_type == "code"]
    first = next(c for c in code if "parameters" in c.metadata.get("tags", []))
    parameters = [t.id for s in ast.parse(first.source).body if isinstance(s, ast.Assign)
                  for t in s.targets if isinstance(t, ast.Name)]
    cell = next(c for c in code if "pick_settings(" in c.source)
    setup, resolution = [], []
    for statement in ast.parse(cell.source).body:
        uses = _names(statement)
        if "wu" in uses or uses & set(parameters) or resolution:
            resolution.append(statement)
            if "pick_settings" in ast.unparse(statement):
                break
        else:
            setup.append(statement)  # PROFILES and the constants it is built from
    compiled = [compile(ast.Module(body=part, type_ignores=[]), f"{path.name}", "exec") for part in (setup, resolution)]
    drawn = [p for p in parameters if p not in RESOLVED_ELSEWHERE]
    return drawn, resolution, *compiled


RESOLUTIONS = {path.name: resolution_of(path) for path in NOTEBOOKS}

GARBAGE = st.one_of(
    st.integers(max_value=0),  # zero and negative counts
    st.integers(min_value=LARGEST + 1, max_value=2**80), st.just(10**5000),  # beyond int64, beyond str()
    st.floats(allow_nan=True, allow_infinity=True).filter(lambda x: not (math.isfinite(x) and x.is_integer())),
    st.floats(min_value=-1e6, max_value=0).map(math.floor).map(float),  # whole floats, but not above 0
    st.text(max_size=12), st.just("64"), st.booleans(), st.lists(st.integers(), max_size=3), st.just(b"8"),
)
VALID = {
    "size": st.one_of(st.integers(1, 10**6), st.integers(10**6, LARGEST), st.integers(1, 512).map(float)),
    "switch": st.booleans(),
    "ranks": st.integers(2, 64),
}


def kind_of(name: str) -> str:
    for kind, names in (("size", SIZES), ("switch", SWITCHES), ("ranks", RANKS)):
        if name in names:
            return kind
    raise AssertionError(f"parameter {name!r} is new: add it to SIZES, SWITCHES or RANKS in this test")


def smallest_of(notebook: str) -> dict:
    """{setting: its least value} from the notebook's own ``at_least=`` in its pick_settings call, if any."""
    _, statements, setup, _ = RESOLUTIONS[notebook]
    calls = [node for statement in statements for node in ast.walk(statement)
             if isinstance(node, ast.Call) and "pick_settings" in ast.unparse(node.func)]
    given_ = [k.value for c in calls for k in c.keywords if k.arg == "at_least"]
    space = {"wu": wu}
    exec(setup, space)
    return {name: least for g in given_ for name, (least, _why) in eval(compile(ast.Expression(g), notebook, "eval"),
                                                                            space).items()}


def valid(name: str, value, smallest: dict | None = None) -> bool:
    if name == "profile":  # None is no profile: the parameters cell says "auto", "cpu" or "gpu"
        return value in ("auto", "cpu") or (value == "gpu" and torch.cuda.is_available())
    if value is None:
        return True
    kind = kind_of(name)
    if kind == "switch":
        return isinstance(value, bool)
    if isinstance(value, float) and math.isfinite(value) and value.is_integer():
        value = int(value)
    least = (smallest or {}).get(name, 2 if kind == "ranks" else 1)
    return isinstance(value, int) and not isinstance(value, bool) and least <= value <= LARGEST


def draw_parameters(data, names: list[str]) -> dict:
    drawn = {}
    for name in names:
        if name == "profile":
            strategy = st.one_of(st.sampled_from(PROFILE_NAMES), st.just("gpu"), st.none(), st.text(max_size=8),
                                 st.integers(), st.floats())
        elif kind_of(name) == "ranks":
            strategy = st.one_of(st.none(), VALID["ranks"])
        else:
            strategy = st.one_of(st.none(), VALID[kind_of(name)], GARBAGE)
        drawn[name] = data.draw(strategy, label=name)
    return drawn


def resolve(notebook: str, drawn: dict) -> dict:
    """Run the notebook's setup and resolution statements on the drawn values; return its namespace."""
    _, _, setup, resolution = RESOLUTIONS[notebook]
    space = {"wu": wu}
    exec(setup, space)
    space.update(drawn)
    with contextlib.redirect_stdout(io.StringIO()):  # pick_settings prints the settings it chose
        exec(resolution, space)
    return space


@pytest.mark.parametrize("notebook", sorted(RESOLUTIONS))
def test_every_drawn_parameter_resolves_or_is_a_one_line_workshop_error(notebook):
    names, statements, _, _ = RESOLUTIONS[notebook]
    assert "profile" in names and len(names) >= 3, names
    consumed = set().union(*(_names(s) for s in statements))
    assert set(names) <= consumed, f"parameters the resolution never reads: {set(names) - consumed}"
    smallest = smallest_of(notebook)

    @settings(max_examples=200, deadline=None, derandomize=True, database=None,
              suppress_health_check=[HealthCheck.too_slow])
    @given(data=st.data())
    def check(data):
        drawn = draw_parameters(data, names)
        bad = [name for name, value in drawn.items() if not valid(name, value, smallest)]
        try:
            space = resolve(notebook, drawn)
        except WorkshopError as err:
            message = str(err)
            assert bad, f"valid parameters refused: {drawn} -> {message}"
            assert "\n" not in message and err.fix and message.endswith(f"Fix: {err.fix}"), message
            assert any(f"{name}=" in message or (name == "profile" and "profile" in message.lower())
                       for name in bad), f"{message!r} names none of the bad parameters {bad}"
            return
        # Any other exception type propagates and fails the test, with the draw that caused it.
        assert not bad, f"garbage accepted: {({name: drawn[name] for name in bad})}"
        hp = space["hp"]
        assert hp["profile"] in ("cpu", "gpu")
        for name, value in drawn.items():
            if name in hp and name != "profile":
                expected = space["PROFILES"][hp["profile"]][name] if value is None else value
                assert hp[name] == expected and type(hp[name]) is type(expected) or \
                    (isinstance(expected, float) and hp[name] == int(expected) and type(hp[name]) is int), \
                    (name, value, hp[name])

    check()


@pytest.mark.parametrize("overrides, message", [
    (dict(epochs=-3), "epochs=-3 is out of range: it must be at least 1. Fix: pass e.g. epochs=3, or None to take "
                      "the cpu profile's value."),
    (dict(epochs=0), "epochs=0 is out of range: it must be at least 1."),
    (dict(batch_size="64"), "batch_size='64' is not a whole number. Fix: pass a whole number such as batch_size=64"),
    (dict(batch_size=2.5), "batch_size=2.5 is not a whole number."),
    (dict(train_size=float("nan")), "train_size=nan is not a whole number."),
    (dict(train_size=2**63), "train_size=9223372036854775808 is out of range: it must be at most"),
    (dict(epochs=True), "epochs=True is not a whole number."),
    (dict(epochs=10**5000), "epochs=<a int of 16610 bits> is out of range"),
])
def test_garbage_sizes_name_the_parameter_and_the_fix(overrides, message):
    profiles = {"cpu": dict(epochs=3, batch_size=64, train_size=2048), "gpu": dict(epochs=6, batch_size=128,
                                                                                  train_size=None)}
    with pytest.raises(WorkshopError) as caught:
        wu.pick_settings(profiles, "cpu", **overrides)
    assert str(caught.value).startswith(message) and "\n" not in str(caught.value)


def test_a_notebook_that_needs_a_least_value_refuses_a_smaller_one_before_any_work_and_says_why():
    assert smallest_of("01_single_gpu_baseline.ipynb") == {"epochs": 2}  # its resume section needs two checkpoints
    with pytest.raises(WorkshopError) as caught:
        resolve("01_single_gpu_baseline.ipynb", {"profile": "cpu", "epochs": 1, "batch_size": None,
                                                 "train_size": None})
    assert str(caught.value) == ("epochs=1 is too small for this notebook: section 7 resumes from the checkpoint "
                                 "before the last, so it needs epochs=2 or more. Fix: pass epochs=2 or more, or None "
                                 "to take the cpu profile's value (3).")
    assert resolve("01_single_gpu_baseline.ipynb", {"profile": "cpu", "epochs": 2, "batch_size": None,
                                                    "train_size": None})["hp"]["epochs"] == 2


def test_valid_overrides_keep_their_meaning(capsys):
    profiles = {"cpu": dict(epochs=3, warmup_steps=2, lr=0.01, compile=False, loader="torch"),
                "gpu": dict(epochs=6, warmup_steps=10, lr=0.1, compile=True, loader="device")}
    hp = wu.pick_settings(profiles, "cpu", epochs=5.0, warmup_steps=0, lr=1, compile=True, loader="device")
    assert hp == dict(epochs=5, warmup_steps=0, lr=1, compile=True, loader="device", profile="cpu")
    assert type(hp["epochs"]) is int  # a whole float from papermill's command line becomes an int
    for bad in (dict(lr=0), dict(lr=float("inf")), dict(compile=1), dict(loader=3), dict(warmup_steps=-1)):
        with pytest.raises(WorkshopError, match=f"^{next(iter(bad))}="):
            wu.pick_settings(profiles, "cpu", **bad)


@pytest.mark.parametrize("profile", [None, 3, ["cpu"], "CPU", "gpu-large"])
def test_a_profile_that_is_not_a_name_is_one_line(profile):
    with pytest.raises(WorkshopError, match=r"^(profile=|Unknown profile).*Fix: use one of 'auto', 'cpu', 'gpu'"):
        wu.resolve_profile(profile)


@pytest.mark.parametrize("call", [lambda: wu.resolve_run_dir(5, "x"), lambda: wu.demo_world("four"),
                                  lambda: wu.demo_world(2.5)], ids=["run_dir=5", "nproc='four'", "nproc=2.5"])
def test_run_dir_and_nproc_garbage_is_a_workshop_error(call):
    with pytest.raises(WorkshopError):
        call()
