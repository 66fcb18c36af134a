# The two commands the README promises on a fresh machine:
#   make demo   - set up .venv, generate a Kinetics-like dataset, run the main job on it
#   make test   - set up .venv and run the test suite (what CI runs)
# TORCH_SPEC defaults to the CPU wheel these machines carry; on a GPU host pass
# e.g. TORCH_SPEC=torch and DALI_EXTRA=cuda12 to match the driver.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
TORCH_SPEC ?= torch==2.13.0
DALI_EXTRA ?= cuda13
DEMO_DIR ?= demo_out

.PHONY: venv demo test clean

venv: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q "$(TORCH_SPEC)"
	$(PY) -m pip install -q -e ".[test,bench,demo,$(DALI_EXTRA)]"
	touch $@

demo: venv
	$(VENV)/bin/daliload demo --out $(DEMO_DIR)

test: venv
	$(PY) -m pytest -q

clean:
	rm -rf $(VENV) $(DEMO_DIR)
