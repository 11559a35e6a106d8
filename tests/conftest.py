import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))  # tests/helpers.py


@pytest.fixture
def tiny_data():
    from workshop_utils import make_synthetic_cifar

    return make_synthetic_cifar(256, 128, seed=0)
