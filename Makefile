# Two commands: `make demo` (serve the embedded `tiny` model and run a map-reduce graph through
# it) and `make test` (the whole suite; .ci/run calls exactly this).
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip

.PHONY: install demo test lint lock clean

# torch==2.13.0 first, from its own line: on a CPU machine pip takes the local CPU wheel, and
# the rest then finds torch satisfied instead of pulling a CUDA build.
$(VENV)/.installed: pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q torch==2.13.0
	$(PIP) install -q -c constraints.txt -e '.[dev]'
	touch $@

install: $(VENV)/.installed

demo: install
	$(PY) -m eclectus demo

# Two pytest-xdist workers (CI has 2 cores; much of the suite waits on servers and sockets);
# --dist loadfile keeps a file on one worker, so its module-scoped engines start once.
test: install
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	TRITON_INTERPRET=1 $(PY) -m pytest -q -x --timeout=900 --durations=25 -n 2 --dist loadfile

lint: install
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

# After upgrading a dependency in .venv and passing `make test`: pin what was tested.
lock:
	{ sed -n '1,3p' constraints.txt; $(PIP) freeze --exclude-editable | grep -v '^torch=='; } > constraints.txt.new
	mv constraints.txt.new constraints.txt

clean:
	rm -rf $(VENV) *.egg-info .pytest_cache .ruff_cache .hypothesis
