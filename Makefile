# The commands of the README. Each creates .venv and installs the package on first use.
#   make run        executes every notebook in notebooks/ into a new runs/<timestamp>/ folder and writes its report
#   make test       runs the whole test suite, the full tier CI runs: every notebook executed once (36 min on 2 cores: results/reference/RUN.md)
#   make test-fast  the edit-test loop: unit tests only, no notebook, torchrun, Slurm or slides
#   make test-loaded  the notebook tier with every core busy with other work beside it (a busy CI runner)
#   make slides     builds the instructor's decks (HTML and PDF) from the newest run folder
# Compute nodes without internet (docs/offline-install.md):
#   make wheelhouse PY_VERSION=3.12   on a login node: every wheel the kit needs, into wheelhouse/
#   make install-offline              on the node: .venv from wheelhouse/ alone; then make run / make test
#   make gpu-check                    on a GPU node: every GPU-only path once, in at most 5 minutes
#   make gpu-run                      on a GPU node: the GPU check and every notebook's gpu profile, in at most 8 minutes
# A class on the portal:
#   make classroom N=4                N attendees at once on a real JupyterHub, each server limited (docs/portal.md)
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp
# The kernel the notebooks name (their kernelspec), also what docs/portal.md registers on a portal.
KERNEL := hpc-dl-workshop

.PHONY: run test test-fast test-loaded test-every-row slides install clean-venv wheelhouse install-offline

install: $(STAMP)

# A .venv that install-offline made is made again the same way when pyproject.toml changes (a git pull): from the
# wheel folder, with the settings it recorded (the image's packages included), never from the internet.
# (Through a variable: a recipe line naming $$(MAKE) itself would run even under make -n.)
OFFLINE_SETTINGS := $(VENV)/.offline-install
OFFLINE_AGAIN = $(MAKE) --no-print-directory install-offline
$(STAMP): pyproject.toml
	@if [ -f $(OFFLINE_SETTINGS) ]; then \
		echo "$(VENV) was installed offline: installing it again from the wheel folder ($$(cat $(OFFLINE_SETTINGS)))"; \
		$(OFFLINE_AGAIN) $$(cat $(OFFLINE_SETTINGS)); \
	else \
		$(PYTHON) -m venv $(VENV) && \
		$(PY) -m pip install --quiet --disable-pip-version-check -e '.[test]' && \
		$(PY) -m ipykernel install --sys-prefix --name python3 --display-name "Python 3 (workshop)" >/dev/null && \
		$(PY) -m ipykernel install --sys-prefix --name $(KERNEL) --display-name "HPC DL workshop" >/dev/null && \
		touch $(STAMP); \
	fi

# Marp CLI, pinned by slides/package-lock.json. Without npm the slide tests skip and say why.
SLIDES_DEPS := slides/node_modules/.package-lock.json
$(SLIDES_DEPS): slides/package-lock.json
	@if command -v npm >/dev/null; then npm ci --prefix slides --no-audit --no-fund --loglevel=error; \
	else echo "npm not found: slides cannot be built and their tests will be skipped"; fi

# JupyterHub's proxy for the portal test and the portal recipe, pinned by portal/package-lock.json.
PORTAL_DEPS := portal/node_modules/.package-lock.json
$(PORTAL_DEPS): portal/package-lock.json
	@if command -v npm >/dev/null; then npm ci --prefix portal --no-audit --no-fund --loglevel=error; \
	else echo "npm not found: the portal test will be skipped"; fi

run: $(STAMP)
	$(PY) -m workshop_utils.run_notebooks

# Its time, outcomes and slowest tests go to runs/test-suite-<stamp>.json for the measurements page
# (python -m workshop_utils.reference --tests FILE).
test: $(STAMP) $(SLIDES_DEPS) $(PORTAL_DEPS)
	@mkdir -p runs
	$(PY) -m pytest --suite-record runs/test-suite-$$(date -u +%Y%m%d-%H%M%S).json

# The tests marked neither slow nor notebook (pyproject.toml lists the markers).
test-fast: $(STAMP)
	$(PY) -m pytest -m "not slow and not notebook"

# Every row of Exercise 6.1's answer tables judged by its simulated job too (make test simulates a sample of the
# rows and judges the rest by what no run shows): bash runs each script in its own namespaces.
test-every-row: $(STAMP)
	WORKSHOP_EVERY_ROW=1 $(PY) -m pytest tests/test_slurm_exercise_answers.py tests/test_slurm_exercise_answers_2.py \
		tests/test_slurm_exercise_answers_3.py tests/test_slurm_exercise_answers_4.py \
		tests/test_slurm.py::test_exercise_61_names_each_mistake_in_one_line_before_the_queue

# The notebook tier with one CPU burner per core beside it (a busy shared runner): verdicts must not change.
test-loaded: $(STAMP)
	$(PY) tests/under_load.py -- $(PY) -m pytest -m notebook

slides: $(STAMP) $(SLIDES_DEPS)
	$(PY) slides/build.py

clean-venv:
	rm -rf $(VENV)

# ---------------------------------------------------------------- offline install
# WHEELHOUSE: the wheel folder, on a file system both the login node and the compute nodes see.
# PY_VERSION, PLATFORM: the compute node's Python (e.g. 3.12) and, when it differs from the login
#   node's, its platform tag (e.g. manylinux_2_28_aarch64); empty means this machine's.
# WITH_TORCH=no: the node's image already holds PyTorch; install-offline with SYSTEM_SITE_PACKAGES=yes reuses it.
#   The folder then holds only what that image lacks, as pip decides against IMAGE_PYTHON (the image's python3:
#   run make on a login node with the same image, or name it; default PYTHON). Measured for Python 3.12, EXTRAS=none:
#   1.4 MB (1.38 MiB) for an image that lacks only webdataset and braceexpand (with setuptools and the kit's own
#   wheel), 77 MB (73 MiB) for an image with nothing but PyTorch.
# EXTRAS: test (what make test needs, the default), notebooks (make run only) or none (the package alone: make gpu-check).
WHEELHOUSE ?= wheelhouse
PY_VERSION ?=
PLATFORM ?=
WITH_TORCH ?= yes
EXTRAS ?= test
SYSTEM_SITE_PACKAGES ?= no
IMAGE_PYTHON ?= $(PYTHON)
comma := ,
SKIP_PACKAGES = $(if $(filter no,$(WITH_TORCH)),torch$(comma)torchvision)

# The kit's dependencies, read from its own wheel's metadata (pyproject.toml is the one list), with the
# extras asked for expanded and the packages to skip left out: one requirement a line.
define REQUIREMENTS_PY
import pathlib, re, sys, zipfile
folder, extras, skip = pathlib.Path(sys.argv[1]), set(sys.argv[2].split(",")), set(sys.argv[3].split(","))
wheel = max(folder.glob("workshop_utils-*.whl"), key=lambda p: p.stat().st_mtime)
with zipfile.ZipFile(wheel) as z:
    meta = z.read(next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))).decode()
reqs = [line.split(":", 1)[1].strip() for line in meta.splitlines() if line.startswith("Requires-Dist:")]
name = lambda r: re.split(r"[\s\[<>=!~;(]", r, maxsplit=1)[0].lower().replace("_", "-")
extra = lambda r: (re.findall(r"extra\s*==\s*.([\w.-]+)", r) or [None])[0]
for _ in reqs:
    extras |= {e for r in reqs if name(r) == "workshop-utils" and extra(r) in extras for e in re.findall(r"\[([^]]*)\]", r)[0].split(",")}
for r in reqs:
    if name(r) != "workshop-utils" and name(r) not in skip and extra(r) in extras | {None}:
        print(re.sub(r"\s*;\s*extra\s*==\s*.[\w.-]+.\s*$$", "", r))
print("setuptools>=64")
endef
export REQUIREMENTS_PY

# Of the requirements in $(2), those $(1) (the image's Python) would have to install, as name==version: pip resolves
# them against what that Python has (a dry run: nothing is installed), so its dependencies come along only if missing.
define MISSING_PY
import json, os, subprocess, sys
python, requirements = sys.argv[1], sys.argv[2]
done = subprocess.run([*python.split(), "-m", "pip", "install", "--dry-run", "--quiet", "--only-binary=:all:",
                       "--disable-pip-version-check", "--report", "-", "-r", requirements], capture_output=True, text=True,
                      env={**os.environ, "PIP_BREAK_SYSTEM_PACKAGES": "1"})  # a dry run changes no system Python
if done.returncode:
    sys.exit(f"error: {python} -m pip could not resolve {requirements}: {done.stderr.strip().splitlines()[-1:]}. "
             "Fix: name the node image's Python with IMAGE_PYTHON=..., one with pip and an index to ask.")
for item in json.loads(done.stdout)["install"]:
    print(f"{item['metadata']['name']}=={item['metadata']['version']}")
print("setuptools>=64")  # the editable install's build backend, fetched into its isolated build environment
endef
export MISSING_PY

# The site-packages of $(PYTHON) when it runs inside a virtual environment, written as a .pth file into the new one:
# site.addsitedir lines, so that the .pth files inside those folders are processed too (plain folder lines are not).
define PARENT_SITE_PY
import pathlib, site, subprocess, sys
if sys.prefix != sys.base_prefix:
    target = subprocess.run([sys.argv[1] + "/bin/python", "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                            capture_output=True, text=True, check=True).stdout.strip()
    pathlib.Path(target, "_image_site_packages.pth").write_text(
        "".join(f"import site; site.addsitedir({folder!r})\n" for folder in site.getsitepackages()))
    print("The image's Python is a virtual environment: its packages are visible from " + sys.argv[1])
endef
export PARENT_SITE_PY

wheelhouse:
	@mkdir -p $(WHEELHOUSE)
	$(PYTHON) -m pip wheel --quiet --disable-pip-version-check --no-deps --wheel-dir $(WHEELHOUSE) .
	$(PYTHON) -c "$$REQUIREMENTS_PY" $(WHEELHOUSE) $(EXTRAS) "$(SKIP_PACKAGES)" > $(WHEELHOUSE)/requirements.txt
	$(if $(SKIP_PACKAGES),$(PYTHON) -c "$$MISSING_PY" "$(IMAGE_PYTHON)" $(WHEELHOUSE)/requirements.txt > $(WHEELHOUSE)/missing.txt \
		&& echo "What $(IMAGE_PYTHON) lacks of the kit's requirements:" && cat $(WHEELHOUSE)/missing.txt)
	@echo "Downloading wheels for Python $(or $(PY_VERSION),of this machine) on $(or $(PLATFORM),this machine's platform)$(if $(SKIP_PACKAGES), without $(SKIP_PACKAGES) or what $(IMAGE_PYTHON) has) into $(WHEELHOUSE)/"
	$(PYTHON) -m pip download --disable-pip-version-check --only-binary=:all: --dest $(WHEELHOUSE) \
		$(if $(PY_VERSION),--python-version $(PY_VERSION)) $(if $(PLATFORM),--platform $(PLATFORM)) \
		$(if $(SKIP_PACKAGES),--no-deps -r $(WHEELHOUSE)/missing.txt,-r $(WHEELHOUSE)/requirements.txt)
	@du -sh $(WHEELHOUSE) | sed 's/\t.*/ in the wheel folder/'
	@echo "Done: copy or keep $(WHEELHOUSE)/ next to this checkout, then on the compute node: make install-offline$(if $(SKIP_PACKAGES), SYSTEM_SITE_PACKAGES=yes)"

# Never reaches for the network: pip sees only $(WHEELHOUSE). The checkout is installed editable, as
# make install does, so the main job, the notebooks' kernels and the tests all run the same code.
install-offline:
	@test -d $(WHEELHOUSE) || { echo "error: no wheel folder $(WHEELHOUSE)/. Fix: run make wheelhouse on a login node first (docs/offline-install.md)." >&2; exit 2; }
	$(PYTHON) -m venv $(if $(filter yes,$(SYSTEM_SITE_PACKAGES)),--system-site-packages) $(VENV)
	@# An image whose python3 is itself a virtual environment (PyTorch in /opt/<x>/.venv) keeps its packages
	@# there, which --system-site-packages does not reach: a .pth file in the new environment names them.
	$(if $(filter yes,$(SYSTEM_SITE_PACKAGES)),$(PYTHON) -c "$$PARENT_SITE_PY" $(VENV))
	$(PY) -m pip install --quiet --disable-pip-version-check --no-index --find-links $(WHEELHOUSE) -e '.$(if $(filter-out none,$(EXTRAS)),[$(EXTRAS)])'
	@# EXTRAS=none (the GPU check's wheels) brings no Jupyter: no kernel to register then.
	if $(PY) -c 'import ipykernel' 2>/dev/null; then \
		$(PY) -m ipykernel install --sys-prefix --name python3 --display-name "Python 3 (workshop)" >/dev/null && \
		$(PY) -m ipykernel install --sys-prefix --name $(KERNEL) --display-name "HPC DL workshop" >/dev/null; fi
	echo "WHEELHOUSE=$(WHEELHOUSE) SYSTEM_SITE_PACKAGES=$(SYSTEM_SITE_PACKAGES) EXTRAS=$(EXTRAS) PYTHON=$(PYTHON)" > $(OFFLINE_SETTINGS)
	touch $(STAMP)

# ---------------------------------------------------------------- the GPU check and the GPU run
# gpu-check: every GPU-only code path once, small, within 5 minutes on one GPU (python -m workshop_utils.gpu_check --help).
# gpu-run: those paths, the two-GPU paths' code in process groups of one, then notebooks 01-05 end to end at their gpu
#   profile, within 8 minutes on one H100 (the notebooks' share is an estimate until measured); --reference keeps the
#   record in results/reference/gpu/. gpu-variants: GPT-2 small's throughput, each change against the previous one.
# On a GPU node without internet, from wheels made beforehand on a machine with the node's image:
#   make wheelhouse WITH_TORCH=no EXTRAS=none PY_VERSION=3.12 IMAGE_PYTHON=/path/to/the/image/python3   (1.4 MB)
#   make install-offline SYSTEM_SITE_PACKAGES=yes EXTRAS=none && make gpu-run
.PHONY: gpu-check gpu-run gpu-variants
gpu-check: $(STAMP)
	$(PY) -m workshop_utils.gpu_check $(GPU_CHECK_FLAGS)

gpu-run: $(STAMP)
	$(PY) -m workshop_utils.gpu_check --notebooks --reference $(GPU_CHECK_FLAGS)

gpu-variants: $(STAMP)
	$(PY) benchmarks/gpt_variants.py --profile gpu --reference $(GPU_VARIANTS_FLAGS)

# ---------------------------------------------------------------- attendees' notebooks
# The copies attendees get: each exercise's solution replaced by its placeholder, outputs cleared,
# written to notebooks/attendee/ (git ignores it). The committed notebooks keep the solutions.
.PHONY: attendee
attendee: $(STAMP)
	$(PY) -c 'from workshop_utils.handout import write_attendee_notebooks as w; w("notebooks", "notebooks/attendee")'

# ---------------------------------------------------------------- a class on the portal
# N attendees at once on a real JupyterHub (the portal recipe), each server in a cgroup with a CPU quota and a
# memory limit where this machine allows it (root): notebook 01 and the DDP lab's launch, through real kernels.
# Its record goes to results/reference/classroom/ (docs/portal.md).
N ?= 4
CLASSROOM_FLAGS ?= --cpus 1 --memory 3
.PHONY: classroom
classroom: $(STAMP) $(PORTAL_DEPS)
	$(PY) -m workshop_utils.classroom --attendees $(N) $(CLASSROOM_FLAGS) --record results/reference/classroom
