"""Repository-wide pytest set-up: nbval runs the solution notebooks (and nothing else) next to tests/.

pyproject.toml's addopts turn nbval on for every run (`--nbval-lax --nbval-current-env`, testpaths
`tests` and `solutions`): each code cell of `solutions/<id>/<id>.ipynb` is a test item; it must run
without error, and a cell marked `# NBVAL_CHECK_OUTPUT` must print what its committed output shows
(after the regexes of nbval_sanitize.cfg; `python scripts/nbval_outputs.py LESSON` records them). This
file, always loaded because it sits in the rootdir:

- collects notebooks only as `solutions/<id>/<id>.ipynb` (never lessons/, autograder/ or a scratch copy);
- marks every notebook cell `slow` and `notebooks` (so `make test-fast` deselects them);
- uses nbval_sanitize.cfg unless `--nbval-sanitize-with` names another file;
- starts each notebook's kernel in a fresh temporary folder instead of the notebook's own, so a relative
  write cannot land in solutions/ (and from there, through `make release`, in lessons/);
- starts each kernel with Python's warnings shown (PYTHONWARNINGS=default, as the grading run does) and
  fails a narrative cell (neither exercise nor test) that writes to stderr: tests/test_lessons_graded.py
  leaves the heavy narrative cells no exercise reads to this run;
- names the failing cell by its cell id and nbgrader grade_id too (nbval counts code cells only), and
  prints each notebook's total time at the end, beside `--durations`.

It also gives every process of a run one BLAS/OpenMP thread under pytest-xdist (see tests/conftest.py).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections import defaultdict
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent
SANITIZE = ROOT / "nbval_sanitize.cfg"

# Two xdist workers on two cores, plus the grading sandbox's and nbval's kernels: a BLAS/OpenMP pool of one
# thread per process (set before torch is imported; subprocesses, kernels and JupyterLab inherit it). More
# threads than cores make OpenMP's spinning workers steal each other's time.
if os.environ.get("PYTEST_XDIST_WORKER"):
    for _name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        os.environ.setdefault(_name, "1")


def is_solution_notebook(path: Path) -> bool:
    """True for `ROOT/solutions/<id>/<id>.ipynb`, the only notebooks nbval may run."""
    path = Path(path).resolve()
    return (path.suffix == ".ipynb" and path.parent.parent == ROOT / "solutions"
            and path.stem == path.parent.name)


def _nbval_on(config) -> bool:
    return bool(getattr(config.option, "nbval_lax", False) or getattr(config.option, "nbval", False))


def pytest_ignore_collect(collection_path, config):
    if collection_path.suffix == ".ipynb" and not is_solution_notebook(collection_path):
        return True
    return None


def pytest_configure(config):
    if not _nbval_on(config):
        return
    if config.option.nbval_sanitize_with is None:
        config.option.nbval_sanitize_with = str(SANITIZE)
    _start_kernels_in_scratch_folders()


def _start_kernels_in_scratch_folders():
    """nbval starts a notebook's kernel in the notebook's folder; start it in a temporary one instead."""
    from nbval import plugin

    if getattr(plugin.RunningKernel, "scratch_folders", False):
        return
    base = plugin.RunningKernel

    class ScratchFolderKernel(base):
        scratch_folders = True

        def __init__(self, kernel_name, cwd=None, startup_timeout=60):
            self.scratch_dir = tempfile.mkdtemp(prefix="nbval-kernel-")
            # Python's warnings shown in the kernel, as the grading run shows them (grade.py
            # --python-warnings default): a warning in a narrative cell is what a learner sees as a failure.
            before = os.environ.get("PYTHONWARNINGS")
            os.environ["PYTHONWARNINGS"] = "default"
            try:
                super().__init__(kernel_name, cwd=self.scratch_dir, startup_timeout=startup_timeout)
            finally:
                if before is None:
                    os.environ.pop("PYTHONWARNINGS", None)
                else:
                    os.environ["PYTHONWARNINGS"] = before

        def stop(self):
            try:
                super().stop()
            finally:
                shutil.rmtree(self.scratch_dir, ignore_errors=True)

    plugin.RunningKernel = ScratchFolderKernel


def _notebook_cell(item):
    """(notebook path, nbformat cell) of an nbval item, or None for any other test item."""
    cell = getattr(item, "cell", None)
    if cell is None or not str(item.path).endswith(".ipynb"):
        return None
    return item.path, cell


def pytest_itemcollected(item):
    if _notebook_cell(item):
        if not is_solution_notebook(item.path):  # named on the command line: directories are filtered above
            raise pytest.UsageError(
                f"nbval runs the solution notebooks only (solutions/<id>/<id>.ipynb), not {item.path}: "
                "lessons/ is generated by `make release` (unanswered, no outputs) and autograder/ holds "
                "submissions")
        item.add_marker(pytest.mark.slow)
        item.add_marker(pytest.mark.notebooks)


def is_narrative_cell(cell) -> bool:
    """A code cell that is neither an exercise (nbgrader solution) nor a test (nbgrader grade)."""
    meta = cell.get("metadata", {}).get("nbgrader", {})
    return not (meta.get("solution") or meta.get("grade"))


def _stderr_of_narrative_cell(item) -> str:
    """What a narrative notebook cell wrote to stderr in nbval's run ('' for any other item)."""
    found = _notebook_cell(item)
    if not found or not is_narrative_cell(found[1]):
        return ""
    return "".join(o.get("text", "") for o in getattr(item, "test_outputs", None) or []
                   if o.get("output_type") == "stream" and o.get("name") == "stderr")


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    report = yield
    if call.when == "call" and report.passed and (stderr := _stderr_of_narrative_cell(item)):
        # nbval checks that a cell runs; a lesson's narrative cell must also run silently on stderr (a
        # warning included): tests/test_lessons_graded.py leaves the heavy ones to this run
        report.outcome = "failed"
        report.longrepr = f"a narrative cell wrote to stderr (warnings are shown):\n{stderr[:1000]}"
    found = _notebook_cell(item)
    if found and report.failed:
        path, cell = found
        grade_id = cell.get("metadata", {}).get("nbgrader", {}).get("grade_id", "-")
        first = next((line for line in cell.source.splitlines() if line.strip()), "")
        report.sections.append(("notebook cell", (
            f"{path.relative_to(ROOT) if path.is_relative_to(ROOT) else path}: code cell {item.cell_num} "
            f"(cell id {cell.get('id', '-')}, nbgrader grade_id {grade_id}), first line: {first[:100]}")))
    return report


_NOTEBOOK_SECONDS: dict[str, float] = defaultdict(float)
# test module (or notebook) -> setup + call + teardown
_MODULE_SECONDS: dict[str, float] = defaultdict(float)
_WORKER_SECONDS: dict[str, float] = defaultdict(float)   # xdist worker -> seconds of tests it ran


def pytest_runtest_logreport(report):
    path, sep, _ = report.nodeid.partition(".ipynb::")
    if sep:
        _NOTEBOOK_SECONDS[path + ".ipynb"] += report.duration
    _MODULE_SECONDS[report.nodeid.partition("::")[0]] += report.duration
    worker = getattr(getattr(report, "node", None), "gateway", None)
    _WORKER_SECONDS[getattr(worker, "id", "main")] += report.duration


def pytest_terminal_summary(terminalreporter):
    """Where the run's time went, so that a regression is visible: notebooks, the slowest modules, workers."""
    write = terminalreporter.write_line
    if _NOTEBOOK_SECONDS:
        terminalreporter.section("nbval: seconds per solution notebook (kernel start and every cell)")
        for path, seconds in sorted(_NOTEBOOK_SECONDS.items(), key=lambda kv: -kv[1]):
            write(f"{seconds:8.1f} s  {path}")
        write(f"{sum(_NOTEBOOK_SECONDS.values()):8.1f} s  in all")
    if _MODULE_SECONDS:
        terminalreporter.section("seconds per test module (the 15 slowest; setup, call and teardown)")
        for path, seconds in sorted(_MODULE_SECONDS.items(), key=lambda kv: -kv[1])[:15]:
            write(f"{seconds:8.1f} s  {path}")
        busy = ", ".join(f"{name} {seconds:.0f} s" for name, seconds in sorted(_WORKER_SECONDS.items()))
        write(f"busy per worker: {busy} (the wall time is the busiest worker's plus its idle gaps)")
