# Two commands do the whole set-up on a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.relaxc-installed

.PHONY: demo test conformance clean

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[test]'
	touch $(STAMP)

# Compile the bundled ResNet-50 for this CPU, run it on a random input, print report and latency.
demo: $(STAMP)
	$(VENV)/bin/relaxc run onnx:resnet50 --repeat 10 --report

test: $(STAMP)
	$(PY) -m pytest -q tests

# The full ONNX backend node conformance run (about half an hour on 2 cores).
conformance: $(STAMP)
	$(PY) -m tests.conformance --all

clean:
	rm -rf $(VENV) build *.egg-info
