"""Shared test set-up: one import path for the helper modules, the real model loaded once per process.

- `tests/` is on sys.path (pytest's rootdir-relative import puts it there for every test module), so the
  helpers are imported by their plain names: `model_fixtures`, `autograder_helpers`, `lab_browser`. Never
  `tests.model_fixtures`: a second module name is a second cache, and the model would load twice
  (`test_one_import_path_for_helpers` in tests/test_test_setup.py fails if that comes back).
- Fixtures `smollm2`, `smollm2_tokenizer` and `hf_reference` wrap the cached loaders of
  `model_fixtures`; under pytest-xdist each worker process loads them at most once.
- pytest-xdist runs with `--dist loadfile` (pyproject.toml): a module's tests share one worker, so what a
  module builds once for all its tests (a course graded in the sandbox, a server, a JupyterLab and a
  browser, a release) is built once. (`--dist loadgroup` would allow cross-module groups, but with pytest
  9.2 and xdist 3.8.0 its xdist_group marks were not applied: tests of one group ran on both workers.)
- `START_FIRST` sets which modules start first (with `--no-loadscope-reorder` in pyproject.toml; xdist's
  default orders modules by their number of tests). The lessons' grading run (one
  fixture) starts at once on one worker, test_test_setup.py on the other; a worker takes the next module
  when it has at most two tests left, so the other worker takes the browser module, then the hostile run,
  then the solution notebooks (one unit each, 2-70 s), while the grading run goes on. The terminal summary
  (the repository's conftest.py) prints each notebook's and the slowest modules' seconds and each worker's
  busy time, so a module that grew or a worker left idle shows up in every run's log.
"""

from __future__ import annotations

import os
import sys

import pytest

# One BLAS/OpenMP thread per process under xdist: set by the repository's conftest.py (loaded first).
TESTS = os.path.dirname(os.path.abspath(__file__))
if TESTS not in sys.path:
    sys.path.insert(0, TESTS)

import model_fixtures  # noqa: E402

# nbval's items (the repository's conftest.py), one unit per notebook
SOLUTION_NOTEBOOKS = "solutions/*/*.ipynb"
START_FIRST = ("test_lessons_graded.py", "test_test_setup.py", "test_browser.py",
               "test_autograder_hostile.py", "test_autograder_hostile5.py", SOLUTION_NOTEBOOKS,
               "test_gemma3.py", "test_autograder_security.py", "test_server_model.py", "test_rope.py",
               "test_model.py", "test_attention_backends.py", "test_chunked_prefill.py",
               "test_server_clients.py")


def pytest_collection_modifyitems(session, config, items):
    """Stable reorder: the modules of START_FIRST in that order, then every other module as collected."""
    rank = {name: index for index, name in enumerate(START_FIRST)}

    def key(item):
        name = SOLUTION_NOTEBOOKS if item.path.suffix == ".ipynb" else item.path.name
        return rank.get(name, len(rank))

    items.sort(key=key)


@pytest.fixture(scope="session")
def smollm2():
    """Our Llama implementation with SmolLM2-135M-Instruct's weights (longctx.model.weights.load_model)."""
    return model_fixtures.our_model()


@pytest.fixture(scope="session")
def smollm2_tokenizer():
    return model_fixtures.our_tokenizer()


@pytest.fixture(scope="session")
def hf_reference():
    """(transformers LlamaForCausalLM, its tokenizer) read from the same GGUF: the independent reference."""
    return model_fixtures.hf_reference()

