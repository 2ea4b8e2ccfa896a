PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

export PYTEST_QT_API := pyside6
export PYQTGRAPH_QT_LIB := PySide6

.PHONY: run test bench gpu-check package clean

# build-time only, never a runtime dependency
PYINSTALLER := pyinstaller==6.22.3

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[test]'
	touch $(STAMP)

run: $(STAMP)
	$(BIN)/python -m app --example burn-book

# optional: a real X server for tests/app/test_window_geometry.py (offscreen when this cannot install it)
XVFB_PACKAGES := xvfb libxcb-cursor0 libxcb-icccm4 libxcb-keysyms1

test: $(STAMP)
	-@command -v Xvfb >/dev/null 2>&1 || { command -v apt-get >/dev/null 2>&1 && [ "$$(id -u)" = 0 ] \
		&& timeout 300 apt-get update -qq >/dev/null 2>&1 \
		&& DEBIAN_FRONTEND=noninteractive timeout 300 apt-get install -y -qq $(XVFB_PACKAGES) >/dev/null 2>&1; } \
		|| echo "Xvfb not installed: the window-geometry test runs offscreen"
	QT_QPA_PLATFORM=offscreen $(BIN)/python -m pytest -q -p no:cacheprovider

# PyTorch CPU is a benchmark-only peer (never a dependency); without it the peer columns say so.
# On an Intel CPU the engine's side runs with the `mkl` extra (MKL for its one-thread products,
# as PyTorch's products are MKL's); the report's machine section says which BLAS it measured.
# The language-model rows (LoRA step, generation, first forward) run their peer, PyTorch +
# transformers + peft, in a venv of its own (.venv-peers, never Ember's), or in the Python that
# EMBER_ORACLE_PYTHON names.
PEERS := .venv-peers
bench: $(STAMP)
	$(BIN)/python -m pip install -q torch==2.13.0 || echo "PyTorch not installed: its peer columns stay empty"
	if grep -q GenuineIntel /proc/cpuinfo 2>/dev/null; then $(BIN)/python -m pip install -q -e '.[test,mkl]' \
		|| echo "mkl not installed: every product is OpenBLAS's"; fi
	if [ -z "$$EMBER_ORACLE_PYTHON" ]; then \
		{ test -x $(PEERS)/bin/python || $(PY) -m venv $(PEERS); } \
		&& $(PEERS)/bin/python -m pip install -q torch==2.13.0 transformers peft \
		|| echo "transformers / peft not installed: the language-model rows have no peer"; fi
	EMBER_ORACLE_PYTHON="$${EMBER_ORACLE_PYTHON:-$(CURDIR)/$(PEERS)/bin/python}" $(BIN)/python benchmarks/run_all.py

# On a machine with an NVIDIA GPU: the cuda extra, the CUDA-marked tests and the GPU rows of the
# benchmarks, written to benchmarks/RESULTS-gpu.md in under 8 minutes (exit 3 without a GPU).
gpu-check:
	PY=$(PY) VENV=$(VENV) bash benchmarks/gpu_check.sh

package: $(STAMP)
	$(BIN)/python -m pip install -q $(PYINSTALLER)
	QT_QPA_PLATFORM=offscreen $(BIN)/python packaging/render_icons.py --check
	$(BIN)/pyinstaller --noconfirm --clean --distpath dist --workpath build/pyinstaller packaging/ember.spec
	QT_QPA_PLATFORM=offscreen $(BIN)/python packaging/smoke.py dist/ember

clean:
	rm -rf $(VENV) $(PEERS) build dist *.egg-info
