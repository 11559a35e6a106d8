"""Every notebook sizes itself from the hardware: a small CPU profile, a full GPU profile.

A notebook keeps its sizes in a ``PROFILES`` dict ({"cpu": {...}, "gpu": {...}})
where the reader can see them; ``pick_settings`` chooses one and applies the
papermill parameters that override it.
"""

from __future__ import annotations

import torch

from .errors import WorkshopError, choose

PROFILE_NAMES = ("auto", "cpu", "gpu")


def resolve_profile(profile: str = "auto") -> str:
    """"auto" becomes "gpu" when a CUDA GPU is visible, else "cpu"."""
    choose(profile, PROFILE_NAMES, "profile")
    if profile == "auto":
        return "gpu" if torch.cuda.is_available() else "cpu"
    if profile == "gpu" and not torch.cuda.is_available():
        raise WorkshopError("The 'gpu' profile was asked for, but PyTorch sees no CUDA GPU.",
                            "use profile='auto' or 'cpu' on this machine.")
    return profile


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
