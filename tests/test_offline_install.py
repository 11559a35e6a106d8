"""The offline install: `make wheelhouse` on a login node, `make install-offline` on a node without internet.

Both targets run on a copy of the checkout in tmp_path, and pip can reach no index (any index URL
points at a closed local port), so nothing is downloaded:

- wheelhouse with WITH_TORCH=no: the requirement list comes from the kit's own wheel, and torch and
  torchvision are left out. The dependencies are stand-in wheels (a name and a version, no code)
  served from a local folder.
- install-offline with SYSTEM_SITE_PACKAGES=yes, on a node whose image already holds PyTorch: the
  image's site-packages is this environment's packages (torch included, the kit left out), and the
  wheel folder holds nothing but the build backend, so the install works only if every dependency
  is reused from the image.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

tomllib = pytest.importorskip("tomllib", reason="reading pyproject.toml needs Python 3.11+")

REPO = Path(__file__).resolve().parent.parent
# Any index pip would ask is a closed port, and it gives up at once: an install that needs one fails.
NO_INDEX = {"PIP_INDEX_URL": "http://127.0.0.1:9/simple", "PIP_EXTRA_INDEX_URL": "", "PIP_RETRIES": "0",
            "PIP_TIMEOUT": "2", "PIP_NO_INPUT": "1", "PIP_DISABLE_PIP_VERSION_CHECK": "1"}

pytestmark = pytest.mark.skipif(shutil.which("make") is None, reason="make not installed")


def _checkout_copy(dst: Path) -> Path:
    dst.mkdir()
    for name in ("Makefile", "pyproject.toml", "README.md"):
        shutil.copy(REPO / name, dst / name)
    shutil.copytree(REPO / "workshop_utils", dst / "workshop_utils", ignore=shutil.ignore_patterns("__pycache__"))
    return dst


def _normal(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _requirement_name(requirement: str) -> str:
    return _normal(re.split(r"[\s\[<>=!~;(]", requirement, maxsplit=1)[0])


def _write_wheel(folder: Path, name: str, version: str, files: dict[str, bytes], metadata: str = "") -> Path:
    stem = f"{re.sub(r'[-_.]+', '_', name)}-{version}"
    info = f"{stem}.dist-info"
    files = {**files, f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n{metadata}".encode(),
             f"{info}/WHEEL": b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"}
    files[f"{info}/RECORD"] = "".join(f"{path},,\n" for path in [*files, f"{info}/RECORD"]).encode()
    path = folder / f"{stem}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as wheel:
        for arcname, data in files.items():
            wheel.writestr(arcname, data)
    return path


def _wheel_of_installed(name: str, folder: Path) -> Path:
    """A wheel of a package installed here (setuptools, the build backend), since no index may be asked."""
    dist = importlib.metadata.distribution(name)
    files = {}
    for file in dist.files or []:
        parts = file.parts
        if ".." in parts or "__pycache__" in parts or (parts[0].endswith(".dist-info") and parts[-1] in (
                "RECORD", "WHEEL", "METADATA", "INSTALLER", "REQUESTED", "direct_url.json")):
            continue  # written fresh by _write_wheel, or the traces of an installer
        files[file.as_posix()] = Path(dist.locate_file(file)).read_bytes()
    metadata = "".join(f"{key}: {value}\n" for key, value in dist.metadata.items() if key not in ("Name", "Version"))
    return _write_wheel(folder, dist.metadata["Name"], dist.version, files, metadata)


def _kit_requirements(extras: set[str], skip: set[str]) -> set[str]:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    wanted, optional = list(project["dependencies"]), project.get("optional-dependencies", {})
    pending = set(extras)
    while pending:
        for requirement in optional.get(pending.pop(), []):
            if _requirement_name(requirement) == "workshop-utils":
                pending |= set(re.findall(r"\[([^]]*)\]", requirement)[0].split(",")) - extras
                extras |= pending
            else:
                wanted.append(requirement)
    return {_requirement_name(r) for r in wanted} - skip


def _run(command: list[str], cwd: Path, env: dict, timeout: int = 300) -> subprocess.CompletedProcess:
    proc = subprocess.run(command, cwd=cwd, env={**os.environ, **env}, capture_output=True, text=True,
                          timeout=timeout)
    assert proc.returncode == 0, f"{' '.join(command)} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc


@pytest.mark.slow
def test_wheelhouse_for_an_image_with_pytorch_holds_only_what_the_image_lacks(tmp_path):
    """A node image with PyTorch lacked webdataset and braceexpand alone, yet the folder held every dependency but
    PyTorch (73 MB), more than a short GPU slot may carry with the kit (64 MiB)."""
    checkout = _checkout_copy(tmp_path / "checkout")
    index = tmp_path / "stand-in-index"
    index.mkdir()
    _wheel_of_installed("setuptools", index)  # builds the kit's own wheel
    expected = _kit_requirements(set(), skip=set())
    assert {"torch", "torchvision", "numpy", "webdataset"} <= expected
    for name in expected:  # webdataset needs braceexpand, as the real one does
        _write_wheel(index, name, "99.0", {}, "Requires-Dist: braceexpand\n" if name == "webdataset" else "")
    _write_wheel(index, "braceexpand", "99.0", {})
    login = {**NO_INDEX, "PIP_NO_INDEX": "1", "PIP_FIND_LINKS": str(index)}  # the login node's index
    image = tmp_path / "image"
    subprocess.run([getattr(sys, "_base_executable", sys.executable), "-m", "venv", str(image)], check=True)

    def wheelhouse(folder: str) -> set[str]:
        _run(["make", "wheelhouse", f"PYTHON={sys.executable}", f"WHEELHOUSE={folder}", "WITH_TORCH=no", "EXTRAS=none",
              f"IMAGE_PYTHON={image / 'bin' / 'python'}", f"PY_VERSION={sys.version_info.major}.{sys.version_info.minor}"],
             checkout, login)
        return {_normal(p.name.split("-")[0]) for p in (checkout / folder).glob("*.whl")}

    # An image with nothing of the kit's: every requirement but PyTorch, with what they need.
    assert wheelhouse("bare") == (expected - {"torch", "torchvision"}) | {"braceexpand", "setuptools", "workshop-utils"}
    # An image with PyTorch and everything else but webdataset: webdataset and braceexpand, the build backend, the kit.
    image_has = sorted((expected - {"webdataset"}) | {"setuptools"})
    _run([str(image / "bin" / "python"), "-m", "pip", "install", "--isolated", "--no-index", "--find-links", str(index),
          *image_has], tmp_path, {**NO_INDEX, "PIP_CONFIG_FILE": os.devnull})  # the image's own choice: no site pins
    assert wheelhouse("lacking") == {"webdataset", "braceexpand", "setuptools", "workshop-utils"}


@pytest.mark.slow
def test_install_offline_reuses_the_pytorch_of_the_node_image(tmp_path):
    checkout = _checkout_copy(tmp_path / "checkout")
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    _wheel_of_installed("setuptools", wheels)  # the build backend of the editable install: nothing else

    # The image: a site folder with everything installed here, torch included, but not the kit.
    here = Path(sysconfig.get_paths()["purelib"])
    image = tmp_path / "image-site-packages"
    image.mkdir()
    for entry in here.iterdir():
        if not re.match(r"(__editable__[._])?workshop_utils", entry.name):
            (image / entry.name).symlink_to(entry)
    base_python = getattr(sys, "_base_executable", sys.executable)
    node = tmp_path / "node-venv"
    subprocess.run([base_python, "-m", "venv", "--without-pip", "--system-site-packages", str(node)], check=True)
    node_site = Path(subprocess.run([node / "bin" / "python", "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                                    capture_output=True, text=True, check=True).stdout.strip())
    (node_site / "zz-image.pth").write_text(f"import site; site.addsitedir({str(image)!r})\n")

    _run(["make", "install-offline", f"PYTHON={base_python}", f"VENV={node}", f"WHEELHOUSE={wheels}",
          "SYSTEM_SITE_PACKAGES=yes"], checkout, NO_INDEX)

    assert (node / ".installed-stamp").exists(), "make run / make test would install again"
    probe = ("import json, torch, workshop_utils; "
             "print(json.dumps({'kit': workshop_utils.__file__, 'torch': torch.__file__}))")
    found = json.loads(subprocess.run([node / "bin" / "python", "-c", probe], capture_output=True, text=True,
                                      check=True, cwd=tmp_path).stdout)
    assert Path(found["kit"]).is_relative_to(checkout), "the checkout is installed editable"
    assert Path(found["torch"]).is_relative_to(image), "the image's PyTorch is reused"
    assert not [p.name for p in node_site.iterdir() if p.name.startswith(("torch", "numpy", "nvidia"))]
    kernel = json.loads((node / "share" / "jupyter" / "kernels" / "python3" / "kernel.json").read_text())
    assert Path(kernel["argv"][0]).parent == node / "bin", "the notebooks' kernel runs the node's environment"


def test_install_offline_without_a_wheel_folder_says_what_to_run(tmp_path):
    checkout = _checkout_copy(tmp_path / "checkout")
    proc = subprocess.run(["make", "--no-print-directory", "install-offline", "WHEELHOUSE=missing",
                           f"VENV={tmp_path / 'venv'}"], cwd=checkout, capture_output=True, text=True)
    assert proc.returncode != 0 and "error: no wheel folder missing/. Fix: run make wheelhouse" in proc.stderr
    assert not (tmp_path / "venv").exists()


@pytest.mark.slow
def test_install_offline_on_an_image_whose_python_is_itself_a_virtual_environment(tmp_path):
    """A GPU node's image had PyTorch in /opt/torch/.venv, its python3 that environment's: a venv made with
    --system-site-packages from it saw the base Python's packages only, and pip found no torch (seen on the node)."""
    if sys.prefix == sys.base_prefix:
        pytest.skip("the tests run outside a virtual environment here")
    checkout = _checkout_copy(tmp_path / "checkout")
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    _wheel_of_installed("setuptools", wheels)
    node = tmp_path / "node-venv"
    proc = _run(["make", "install-offline", f"PYTHON={sys.executable}", f"VENV={node}", f"WHEELHOUSE={wheels}",
                 "SYSTEM_SITE_PACKAGES=yes", "EXTRAS=none"], checkout, NO_INDEX)
    assert "its packages are visible" in proc.stdout
    probe = "import json, torch, workshop_utils; print(json.dumps([workshop_utils.__file__, torch.__file__]))"
    kit, torch_file = json.loads(subprocess.run([node / "bin" / "python", "-c", probe], capture_output=True,
                                                text=True, check=True, cwd=tmp_path).stdout)
    assert Path(kit).is_relative_to(checkout) and Path(torch_file).is_relative_to(sys.prefix)
    # addsitedir, not a folder a line: the .pth files in the image's folders (its editable installs) are processed too
    pth = next(node.glob("lib/python3*/site-packages/_image_site_packages.pth")).read_text().splitlines()
    assert pth and all(line.startswith("import site; site.addsitedir(") for line in pth)
    image_pth = sorted(Path(sysconfig.get_paths()["purelib"]).glob("*.pth"))
    processed = subprocess.run([node / "bin" / "python", "-c", "import sys; print(sorted(sys.modules))"],
                               capture_output=True, text=True, check=True, cwd=tmp_path).stdout
    finders = [p.read_text().split()[1].rstrip(";") for p in image_pth if p.read_text().startswith("import __editable__")]
    assert all(finder in processed for finder in finders), "the image's own .pth files were not processed"
