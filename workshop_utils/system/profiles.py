"""Every notebook sizes itself from the hardware: a small CPU profile, a full GPU profile.

A notebook keeps its sizes in a ``PROFILES`` dict ({"cpu": {...}, "gpu": {...}})
where the reader can see them; ``pick_settings`` chooses one and applies the
papermill parameters that override it.

"auto" means: what ``$WORKSHOP_PROFILE`` says when it is set, else "gpu" when a
CUDA GPU is visible, else "cpu". The test suite sets the variable to "cpu"
(conftest.py), so notebooks executed by tests never run the full GPU profile
unless someone asks for it.
"""

from __future__ import annotations

import ast
import json
import math
import numbers
import os
from pathlib import Path

import torch

from .errors import WorkshopError, choose
from .server import fit_to_server

PROFILE_NAMES = ("auto", "cpu", "gpu")
PROFILE_VARIABLE = "WORKSHOP_PROFILE"

# Wall time one notebook may take, start to end, in seconds. The gpu figure is the workshop's
# promise: every notebook runs live in a session on one H100-class GPU. The cpu profile gets the
# same so that a laptop or CI run is held to it too. The main job flags a notebook over its
# budget; the pre-flight (run_notebooks --check) stops it there.
TIME_BUDGET_S = {"cpu": 300, "gpu": 300}


def _shown(value, limit: int = 60) -> str:
    """``repr(value)`` on one short line, for an error message."""
    try:
        text = " ".join(repr(value).split())
    except Exception:  # e.g. an int of more than 4300 digits, which Python will not turn into text
        text = f"<a {type(value).__name__}" + (f" of {value.bit_length()} bits>" if isinstance(value, int) else ">")
    return text if len(text) <= limit else text[:limit - 3] + "..."


def profile_choice(profile: str = "auto") -> tuple[str, str]:
    """The concrete profile ("cpu" or "gpu") for ``profile``, and why it was chosen, in words."""
    if not isinstance(profile, str):
        raise WorkshopError(f"profile={_shown(profile)} is not a profile name.",
                            f"use one of {', '.join(repr(p) for p in PROFILE_NAMES)}.")
    choose(profile, PROFILE_NAMES, "profile")
    reason, by_variable = "asked for", False
    if profile == "auto":
        wanted = os.environ.get(PROFILE_VARIABLE, "").strip()
        if wanted and wanted != "auto":
            if wanted not in ("cpu", "gpu"):
                raise WorkshopError(f"{PROFILE_VARIABLE}={wanted!r} is not a profile.",
                                    f"set {PROFILE_VARIABLE} to 'cpu', 'gpu' or 'auto', or unset it.")
            profile, reason, by_variable = wanted, f"auto, set by {PROFILE_VARIABLE}={wanted}", True
        elif torch.cuda.is_available():
            profile, reason = "gpu", "auto: a CUDA GPU is visible"
        else:
            profile, reason = "cpu", "auto: no CUDA GPU is visible"
    if profile == "gpu" and not torch.cuda.is_available():
        if by_variable:
            raise WorkshopError(f"{PROFILE_VARIABLE}=gpu asks for the 'gpu' profile, but PyTorch sees no CUDA GPU.",
                                f"unset {PROFILE_VARIABLE} or set it to 'cpu' on this machine.")
        raise WorkshopError("The 'gpu' profile was asked for, but PyTorch sees no CUDA GPU.",
                            "use profile='auto' or 'cpu' on this machine.")
    return profile, reason


def resolve_profile(profile: str = "auto") -> str:
    """"auto" becomes $WORKSHOP_PROFILE when set, else "gpu" when a CUDA GPU is visible, else "cpu"."""
    return profile_choice(profile)[0]


# What a profile needs of its server rather than a size: pick_settings checks them against this server's limits
# (system/server.py) before any work, and the main job's measured peaks hold them true (tests/test_notebooks.py).
NEEDS = ("memory_gib", "gpu_memory_gib")

# The largest whole number torch and numpy hold (int64): a setting beyond it fails deep inside them.
LARGEST_WHOLE = 2**63 - 1
# Counts that may be 0 even where no profile uses 0: warm-up steps (none) and loader worker processes.
_ZERO_IS_A_COUNT = ("warmup", "num_workers")


def check_setting(name: str, value, defaults: list, profile: str | None = None):
    """``value`` as the setting ``name`` whose profile values are ``defaults``; a WorkshopError if it cannot be.

    The profiles' values say what kind of setting it is: True/False (a switch), a whole number (a count
    or size: at least 1, or 0 where a profile uses 0 or it is a warm-up or worker count), any other
    number (e.g. a learning rate: finite and above 0), or text. Settings of other kinds (tuples, dicts)
    and those no profile sets are passed through. A whole-valued float (3.0) becomes the int 3.
    """
    known = [d for d in defaults if d is not None]
    if not known:
        return value
    example = known[0]  # the chosen profile's value comes first in ``defaults``
    fix_tail = f"or None to take the {profile + ' ' if profile else ''}profile's value."
    if all(isinstance(d, bool) for d in known):
        if not isinstance(value, bool):
            raise WorkshopError(f"{name}={_shown(value)} is not True or False.",
                                f"pass {name}=True or {name}=False, {fix_tail}")
        return value
    if all(isinstance(d, int) and not isinstance(d, bool) for d in known):
        lowest = 0 if (0 in known or any(word in name for word in _ZERO_IS_A_COUNT)) else 1
        if isinstance(value, float) and math.isfinite(value) and value.is_integer():
            value = int(value)
        if isinstance(value, numbers.Integral) and not isinstance(value, bool):
            value = int(value)  # a numpy integer too
        if isinstance(value, bool) or not isinstance(value, int):
            raise WorkshopError(f"{name}={_shown(value)} is not a whole number.",
                                f"pass a whole number such as {name}={example}, {fix_tail}")
        if not lowest <= value <= LARGEST_WHOLE:
            limit = f"at least {lowest}" if value < lowest else f"at most {LARGEST_WHOLE} (2**63 - 1)"
            raise WorkshopError(f"{name}={_shown(value)} is out of range: it must be {limit}.",
                                f"pass e.g. {name}={example}, {fix_tail}")
        return value
    if all(isinstance(d, (int, float)) and not isinstance(d, bool) for d in known):
        lowest_ok = 0 in known
        if isinstance(value, bool) or not isinstance(value, numbers.Real):
            raise WorkshopError(f"{name}={_shown(value)} is not a number.", f"pass e.g. {name}={example}, {fix_tail}")
        try:
            number = float(value)
        except OverflowError:  # an int beyond any float
            number = math.inf
        if not (math.isfinite(number) and (number >= 0 if lowest_ok else number > 0)):
            raise WorkshopError(f"{name}={_shown(value)} is out of range: it must be a finite number "
                                f"{'of at least 0' if lowest_ok else 'above 0'}.",
                                f"pass e.g. {name}={example}, {fix_tail}")
        return value
    if all(isinstance(d, str) for d in known) and not isinstance(value, str):
        raise WorkshopError(f"{name}={_shown(value)} is not text.", f"pass e.g. {name}={example!r}, {fix_tail}")
    return value


def pick_settings(profiles: dict[str, dict], profile: str = "auto", *, at_least: dict | None = None,
                  **overrides) -> dict:
    """The chosen profile's settings, with every override that is not None applied on top.

    An override is checked against what the profiles hold for it (see ``check_setting``): a negative
    epoch count, a batch size of "64" or 2.5, or a switch set to 1 is a WorkshopError naming it.
    ``at_least`` maps a setting to (the smallest value the notebook's sections work with, why), e.g.
    ``{"epochs": (2, "section 7 resumes from the checkpoint before the last")}``: a smaller override stops
    here in one line instead of failing minutes later in the section that needs it.
    Then the process is sized to its server (``fit_to_server``: PyTorch's threads, one line on what the
    server has), and a server below the profile's ``memory_gib`` or ``gpu_memory_gib`` stops here in one line.
    """
    name = resolve_profile(profile)
    settings = dict(profiles[name])
    unknown = sorted(set(overrides) - set(settings))
    if unknown:
        raise WorkshopError(f"Unknown setting(s) {unknown} for this notebook.", f"use some of {sorted(settings)}.")
    for key, value in overrides.items():
        if value is not None:
            defaults = [settings.get(key), *(p.get(key) for other, p in profiles.items() if other != name)]
            settings[key] = check_setting(key, value, defaults, name)
            smallest, why = (at_least or {}).get(key, (None, ""))
            if smallest is not None and settings[key] < smallest:
                raise WorkshopError(f"{key}={_shown(value)} is too small for this notebook: {why}, so it needs "
                                    f"{key}={smallest} or more.", f"pass {key}={smallest} or more, or None to take "
                                    f"the {name} profile's value ({profiles[name][key]}).")
    settings["profile"] = name
    print(f"Profile {name!r}: " + ", ".join(f"{k}={v}" for k, v in settings.items() if k not in ("profile", *NEEDS)))
    fit_to_server(*(settings.get(key) for key in NEEDS), what=f"This notebook's {name} profile")
    return settings


def notebook_profiles(notebook: str | os.PathLike) -> dict[str, dict]:
    """A notebook's ``PROFILES = {...}`` sizes, read from its source without running it.

    Benchmarks and tests that repeat a notebook's runs take their sizes from here, so the two never drift.
    The literal may use ``dict(...)`` calls and names the same cell sets to literals before it.
    """
    path = Path(notebook)
    cells = json.loads(path.read_text())["cells"]
    for cell in cells:
        if cell["cell_type"] != "code":
            continue
        source = "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]
        try:
            tree = ast.parse(source)
        except SyntaxError:  # a cell with IPython magic: PROFILES is never in one
            continue
        constants = {"__builtins__": {"dict": dict}}  # literal names the cell sets before PROFILES (ALL_MODES)
        for node in tree.body:
            names = [t.id for t in getattr(node, "targets", []) if isinstance(t, ast.Name)]
            if "PROFILES" in names:
                return eval(compile(ast.Expression(node.value), str(path), "eval"), constants)
            if isinstance(node, ast.Assign) and names:
                try:
                    constants.update(dict.fromkeys(names, ast.literal_eval(node.value)))
                except ValueError:
                    pass
    raise WorkshopError(f"{path.name} has no PROFILES = {{...}} cell.", "add one, or name the notebook that has it.")
