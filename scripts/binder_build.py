"""The environment of ``scripts/binder_check.py`` as repo2docker builds it (its steps 1-4, module docstring
there): binder/runtime.txt's Python, binder/requirements.txt without the index lines these machines cannot
reach, the repository copy (``BUILT_FROM``: the commit it was taken from), postBuild, and the image's
``longctx doctor`` checks.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BINDER = ROOT / "binder"
BUILT_FROM = "unknown"  # the commit the repository copy was taken from (set by copy_repository)


def runtime_python_version(binder_dir: Path = BINDER) -> str:
    """The Python version binder/runtime.txt asks for ("python-3.11" -> "3.11")."""
    text = (binder_dir / "runtime.txt").read_text().strip()
    match = re.fullmatch(r"python-(\d+\.\d+)", text)
    if not match:
        raise ValueError(f"binder/runtime.txt should read python-X.Y, not {text!r}")
    return match.group(1)


def local_requirements(text: str) -> str:
    """binder/requirements.txt without the index lines these machines cannot reach (DESIGN.md §7)."""
    kept = [line for line in text.splitlines()
            if not re.match(r"^\s*(--extra-index-url|--index-url|-i)\b", line)]
    return "\n".join(kept) + "\n"


def find_python(version: str) -> str:
    """An interpreter of `version`: python3.11 on PATH, or this one when it is that version."""
    if f"{sys.version_info.major}.{sys.version_info.minor}" == version:
        return _base_python()
    found = shutil.which(f"python{version}")
    if found:
        return found
    raise SystemExit(f"binder/runtime.txt asks for Python {version}: no python{version} on PATH")


def _base_python() -> str:
    """The interpreter this virtual environment was made from (a fresh venv must not nest in ours)."""
    candidate = Path(sys.base_prefix) / "bin" / f"python{sys.version_info.major}.{sys.version_info.minor}"
    return str(candidate) if candidate.exists() else sys.executable


def copy_repository(dest: Path, working_tree: bool = False) -> None:
    """The repository as Binder clones it: the files of the last commit (``git archive HEAD``); with
    `working_tree`, the working tree's files that git tracks or would track (uncommitted work included)."""
    if dest.exists():
        shutil.rmtree(dest)
    dest.mkdir(parents=True)
    global BUILT_FROM
    if not working_tree:
        BUILT_FROM = _commit("HEAD")
        archive = subprocess.run(["git", "archive", "--format=tar", BUILT_FROM.split()[0]], cwd=ROOT,
                                 capture_output=True, check=True).stdout
        subprocess.run(["tar", "-x", "-C", str(dest)], input=archive, check=True)
        return
    BUILT_FROM = f"the working tree on {_commit('HEAD')}"
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                            capture_output=True, check=True).stdout
    for rel in filter(None, listed.decode().split("\0")):
        src = ROOT / rel
        if not src.is_file():  # deleted in the working tree
            continue
        target = dest / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src, target)


def _run(cmd, log, **kwargs) -> float:
    start = time.perf_counter()
    with open(log, "a") as fh:
        fh.write(f"\n$ {' '.join(map(str, cmd))}\n")
        fh.flush()
        done = subprocess.run(cmd, stdout=fh, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, **kwargs)
    if done.returncode:
        raise SystemExit(f"failed ({done.returncode}): {' '.join(map(str, cmd))}\nsee {log}")
    return time.perf_counter() - start


@dataclass
class BinderEnv:
    workdir: Path
    repo: Path
    home: Path
    env: Path

    @property
    def python(self) -> str:
        return str(self.env / "bin" / "python")

    def environ(self) -> dict:
        """The image's environment: the Python environment first on PATH, the notebook user's home."""
        # The machine's own package set-up (pip's wheel folders, certificates, proxies) stays: Binder's
        # build machines have theirs. Nothing of the course's .venv leaks in.
        keep = {k: v for k, v in os.environ.items() if k in ("LANG", "LC_ALL", "TERM", "TZ") or k.startswith(
            ("PIP_", "SSL_CERT", "REQUESTS_CA", "HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY", "http_proxy",
             "https_proxy", "no_proxy"))}
        return {**keep, "HOME": str(self.home), "USER": "jovyan",
                "PATH": f"{self.env / 'bin'}:/usr/local/bin:/usr/bin:/bin", "PYTHONUNBUFFERED": "1",
                "SHELL": "/bin/bash",
                "JUPYTER_RUNTIME_DIR": str(self.home / ".local/share/jupyter/runtime")}


def build(workdir: Path, reuse: bool, log: Path, working_tree: bool = False) -> tuple[BinderEnv, dict]:
    """Steps 1-3: the environment, the repository copy, postBuild. Returns the env and step timings."""
    be = BinderEnv(workdir, workdir / "repo", workdir / "home", workdir / "env")
    timings = {}
    version = runtime_python_version()
    if reuse and (be.env / "bin" / "python").exists():
        copy_repository(be.repo, working_tree)
        timings["environment_s"] = 0.0
    else:
        for path in (be.env, be.home):
            shutil.rmtree(path, ignore_errors=True)
        be.home.mkdir(parents=True)
        python = find_python(version)
        timings["environment_s"] = _run([python, "-m", "venv", str(be.env)], log)
        copy_repository(be.repo, working_tree)
        reqs = workdir / "requirements-local.txt"
        reqs.write_text(local_requirements((be.repo / "binder" / "requirements.txt").read_text()))
        timings["environment_s"] += _run([be.python, "-m", "pip", "install", "--no-cache-dir",
                                          "--disable-pip-version-check", "-r", str(reqs)], log,
                                         env=be.environ(), cwd=be.repo)
    timings["postbuild_s"] = _run(["bash", "./binder/postBuild"], log, env=be.environ(), cwd=be.repo)
    return be, timings


def doctor(be: BinderEnv) -> dict:
    """Step 4: `python -m longctx doctor --json` in the image: the model and its cache must be there."""
    out = subprocess.run([be.python, "-m", "longctx", "doctor", "--json"], env=be.environ(), cwd=be.repo,
                         capture_output=True, text=True, timeout=300)
    try:
        return {c["name"]: c for c in json.loads(out.stdout)}
    except (ValueError, KeyError, TypeError):
        return {"doctor": {"name": "doctor", "ok": False, "detail": (out.stdout + out.stderr)[-500:]}}


def _commit(ref: str = "HEAD") -> str:
    done = subprocess.run(["git", "log", "-1", "--format=%h %cd", "--date=format:%Y-%m-%d %H:%M", ref],
                          cwd=ROOT, capture_output=True, text=True)
    return done.stdout.strip() or "unknown"
