# Two commands do the whole set-up on a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.relaxc-installed

.PHONY: demo test conformance clean

# ROCm code generation links TVM's bitcode with the ROCm device libraries: Debian's
# rocm-device-libs unless a ROCm install has them (needs root; else the ROCm tests say what is missing).
ROCM_BITCODE := $(firstword $(wildcard /opt/rocm/amdgcn/bitcode/ocml.bc /usr/lib/x86_64-linux-gnu/amdgcn/bitcode/ocml.bc))

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[test]'
	$(if $(ROCM_BITCODE),,-(apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq rocm-device-libs) >/dev/null)
	touch $(STAMP)

# Compile the bundled ResNet-50 for this CPU, run it on a random input, print report and latency.
demo: $(STAMP)
	$(VENV)/bin/relaxc run onnx:resnet50 --repeat 10 --report

# Two test processes share the cores (20 minutes on 2 cores instead of 27; a file's tests stay in
# one, for its fixtures); the tests that time code against a bound or a peer run alone afterwards.
test: $(STAMP)
	$(PY) -m pytest -q --durations=20 -n 2 --dist loadfile -m "not timing" tests
	$(PY) -m pytest -q --durations=5 -m timing tests

# The full ONNX backend node conformance run (about a minute on 2 cores; docs/conformance.md).
conformance: $(STAMP)
	$(PY) -m tests.conformance --all

clean:
	rm -rf $(VENV) build *.egg-info
