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

import os

import torch

from .errors import WorkshopError, choose

PROFILE_NAMES = ("auto", "cpu", "gpu")
PROFILE_VARIABLE = "WORKSHOP_PROFILE"

# Wall time one notebook may take, start to end, in seconds. The gpu figure is the workshop's
# promise: every notebook runs live in a session on one H100-class GPU. The cpu profile gets the
# same so that a laptop or CI run is held to it too. The main job flags a notebook over its
# budget; the pre-flight (run_notebooks --check) stops it there.
TIME_BUDGET_S = {"cpu": 300, "gpu": 300}


def profile_choice(profile: str = "auto") -> tuple[str, str]:
    """The concrete profile ("cpu" or "gpu") for ``profile``, and why it was chosen, in words."""
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


def pick_settings(profiles: dict[str, dict], profile: str = "auto", **overrides) -> dict:
    """The chosen profile's settings, with every override that is not None applied on top."""
    name = resolve_profile(profile)
    settings = dict(profiles[name])
    unknown = sorted(set(overrides) - set(settings))
    if unknown:
        raise WorkshopError(f"Unknown setting(s) {unknown} for this notebook.", f"use some of {sorted(settings)}.")
    settings.update({k: v for k, v in overrides.items() if v is not None})
    settings["profile"] = name
    print(f"Profile {name!r}: " + ", ".join(f"{k}={v}" for k, v in settings.items() if k != "profile"))
    return settings
