"""Small builders shared by the tests."""

from __future__ import annotations

import pickle
from pathlib import Path

import numpy as np

from workshop_utils.spine.data import FOLDER, TEST_FILES, TRAIN_FILES, md5sum


def write_fake_cifar(root: Path, per_file: int = 20, seed: int = 0) -> dict[str, str]:
    """Write tiny files in torchvision's CIFAR-10 on-disk format; return their MD5s."""
    folder = Path(root) / FOLDER
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    for i, name in enumerate(TRAIN_FILES + TEST_FILES):
        entry = {
            "batch_label": f"fake batch {i}",
            "labels": rng.integers(0, 10, per_file).tolist(),
            "data": rng.integers(0, 256, (per_file, 3072), dtype=np.uint8),
            "filenames": [f"img_{i}_{j}.png" for j in range(per_file)],
        }
        with open(folder / name, "wb") as f:
            pickle.dump(entry, f, protocol=2)  # the original files are Python 2 pickles
    with open(folder / "batches.meta", "wb") as f:
        pickle.dump({"label_names": ["airplane"] * 10, "num_cases_per_batch": per_file}, f, protocol=2)
    return {p.name: md5sum(p) for p in folder.iterdir()}


# The lowest test accuracy a compared run may end at in the cpu profile (chance is 10%): every such run's
# recorded seeds, on both kinds of CPU, sit at least ACCURACY_MARGIN_POINTS above it
# (tests/test_expectations.py reads results/reference/benchmarks/accuracy_spread*.json for that).
ACCURACY_FLOOR_PCT = 20
# One run's test accuracy on 512 images moves by about 2 points from sampling alone (binomial, p = 0.3).
ACCURACY_MARGIN_POINTS = 3

# 8 steps (2 epochs) on 2 gloo ranks, global batch 16, on CPU processes also on a GPU machine: conftest's
# two_rank_run, the uninterrupted run that test_ddp and test_faults compare with.
TWO_RANK_RUN = dict(model="simplecnn", batch_size=8, steps=8, epochs=2, train_size=64, test_size=16, seed=0,
                    warmup_steps=0, device="cpu")

# The tests stop a notebook at this many times its budget: a guard against hangs, not a verdict on speed. On a
# 2-core runner shared with other work, notebook 03 (100 s idle) once took over 600 s (twice its budget).
HANG_LIMIT_FACTOR = 4


def load_slides_build():
    """slides/build.py as module ``slides_build`` (slides/ is not a package), loaded once for every test file."""
    import importlib.util
    import sys

    if "slides_build" in sys.modules:
        return sys.modules["slides_build"]
    path = Path(__file__).resolve().parents[1] / "slides" / "build.py"
    spec = importlib.util.spec_from_file_location("slides_build", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules["slides_build"] = module
    spec.loader.exec_module(module)
    return module
