import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))  # tests/helpers.py

# The suite never submits to a real cluster: run on a login node, the main job's notebook 06 would
# otherwise send jobs to the site's Slurm. The one test that wants Slurm starts its own and says so.
os.environ.setdefault("WORKSHOP_SLURM", "off")


@pytest.fixture
def tiny_data():
    from workshop_utils import make_synthetic_cifar

    return make_synthetic_cifar(256, 128, seed=0)
