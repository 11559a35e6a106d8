# The two commands of the README. Both create .venv and install the package on first use.
#   make run   executes every notebook in notebooks/ into a new runs/<timestamp>/ folder and writes its report
#   make test  runs the whole test suite
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp

.PHONY: run test install clean-venv

install: $(STAMP)

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check -e '.[test]'
	$(PY) -m ipykernel install --sys-prefix --name python3 --display-name "Python 3 (workshop)" >/dev/null
	touch $(STAMP)

run: $(STAMP)
	$(PY) -m workshop_utils.run_notebooks

test: $(STAMP)
	$(PY) -m pytest

clean-venv:
	rm -rf $(VENV)
