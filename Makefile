# The two commands of the README. Both create .venv and install the package on first use.
#   make run   executes every notebook in notebooks/ into a new runs/<timestamp>/ folder and writes its report
#   make test  runs the whole test suite
#   make slides builds the instructor's decks (HTML and PDF) from the newest run folder
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp

.PHONY: run test slides install clean-venv

install: $(STAMP)

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check -e '.[test]'
	$(PY) -m ipykernel install --sys-prefix --name python3 --display-name "Python 3 (workshop)" >/dev/null
	touch $(STAMP)

# Marp CLI, pinned by slides/package-lock.json. Without npm the slide tests skip and say why.
SLIDES_DEPS := slides/node_modules/.package-lock.json
$(SLIDES_DEPS): slides/package-lock.json
	@if command -v npm >/dev/null; then npm ci --prefix slides --no-audit --no-fund --loglevel=error; \
	else echo "npm not found: slides cannot be built and their tests will be skipped"; fi

run: $(STAMP)
	$(PY) -m workshop_utils.run_notebooks

test: $(STAMP) $(SLIDES_DEPS)
	$(PY) -m pytest

slides: $(STAMP) $(SLIDES_DEPS)
	$(PY) slides/build.py

clean-venv:
	rm -rf $(VENV)
