# Two commands: `make demo` (serve the embedded `tiny` model and run a map-reduce graph through
# it) and `make test` (the whole suite; .ci/run calls exactly this).
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip

.PHONY: install demo test lint clean

# torch==2.13.0 first, from its own line: on a CPU machine pip takes the local CPU wheel, and
# the rest then finds torch satisfied instead of pulling a CUDA build.
$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q torch==2.13.0
	$(PIP) install -q -e '.[dev]'
	touch $@

install: $(VENV)/.installed

demo: install
	$(PY) -m eclectus demo

test: install
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	TRITON_INTERPRET=1 $(PY) -m pytest -q -x --timeout=900

lint: install
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

clean:
	rm -rf $(VENV) *.egg-info .pytest_cache .ruff_cache .hypothesis
