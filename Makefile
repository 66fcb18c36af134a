# The two commands the README promises on a fresh machine:
#   make demo   - set up .venv, generate a Kinetics-like dataset, run the main job on it
#   make test   - set up .venv, add the benchmark peers, lint (ruff, import contracts), build the docs site
#                 (strict) and run the test suite (what CI runs)
#   make bench  - set up .venv, add the optional peers, run the CPU benchmark (minutes)
# TORCH_SPEC defaults to the CPU wheel these machines carry; on a GPU host pass
# e.g. TORCH_SPEC=torch and DALI_EXTRA=cuda12 to match the driver.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
TORCH_SPEC ?= torch==2.13.0
DALI_EXTRA ?= cuda13
DEMO_DIR ?= demo_out
# Extra options for `python -m benchmarks` (see --help), e.g. BENCH_ARGS="--device cuda".
BENCH_ARGS ?= --device cpu

.PHONY: venv peers demo lint docs test bench clean

venv: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q "$(TORCH_SPEC)"
	$(PY) -m pip install -q -e ".[test,bench,demo,$(DALI_EXTRA)]"
	touch $@

demo: venv
	$(VENV)/bin/daliload demo --out $(DEMO_DIR)

# ruff (settings in pyproject.toml) and the import contracts that keep the layers
# ([tool.importlinter] in pyproject.toml, shown in docs/architecture.md "Layers").
lint: venv
	$(VENV)/bin/ruff check .
	$(VENV)/bin/lint-imports

# The documentation site (mkdocs.yml over docs/), strict: a broken link or anchor, a page left out of the nav
# or a nav entry with no page fails. It is written to site/, which is not committed.
docs: venv
	$(VENV)/bin/mkdocs build --strict -d site

# The peers are installed for the tests too: tests/test_bench_outputs.py checks that every loader of the
# benchmark table delivers the same clips, and a peer that is missing is a skip there, not a check.
test: lint docs peers
	$(PY) -m pytest -q

# The peers install without their dependencies, so torch is never replaced: torchcodec
# 0.13.0 is the newest wheel that imports beside a CPU torch 2.13, and it needs
# FFmpeg's shared libraries from the system (installed here with apt-get when run as root,
# as CI runs). A peer that does not install or import is listed in the benchmark results
# with the reason, and is a skip with the reason in the tests; nothing stops.
peers: venv
	-$(PY) -m pip install -q --no-deps torchcodec==0.13.0
	-$(PY) -m pip install -q --no-deps decord==0.6.0
	-$(PY) -m pip install -q --no-deps spdl==0.8.0 spdl_io==0.8.0 spdl_core==0.8.0
	@if ldconfig -p 2>/dev/null | grep -q libavcodec; then \
		echo "FFmpeg shared libraries found (torchcodec needs them)"; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
		apt-get install -y -q ffmpeg || { apt-get update -q && apt-get install -y -q ffmpeg; } \
			|| echo "apt-get install ffmpeg failed: torchcodec will be listed as unavailable"; \
	else \
		echo "no FFmpeg shared libraries, and not root with apt-get to install them:" \
			"torchcodec will be listed as unavailable (install ffmpeg to include it)"; \
	fi

bench: peers
	$(PY) -m benchmarks $(BENCH_ARGS)
	$(PY) -m benchmarks.bench_repeated

clean:
	rm -rf $(VENV) $(DEMO_DIR)
