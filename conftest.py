"""Test-wide settings, also seen by the notebooks the main job executes (their kernels inherit the environment)."""

import os
import tempfile


def pytest_configure(config):
    # Results of test runs go to a throw-away folder, never into the checkout's runs/.
    os.environ.setdefault("WORKSHOP_RUNS", tempfile.mkdtemp(prefix="workshop-test-runs-"))
    # Tests must not pick up a developer's real CIFAR-10 unless they ask for it.
    os.environ.pop("WORKSHOP_DATA", None)
    os.environ.setdefault("MPLBACKEND", "Agg")
    # A notebook's profile "auto" means cpu inside the tests, even on a GPU node: the full gpu profile
    # is the main job's and the pre-flight's, not the test suite's. WORKSHOP_PROFILE=gpu make test asks for it.
    os.environ.setdefault("WORKSHOP_PROFILE", "cpu")
