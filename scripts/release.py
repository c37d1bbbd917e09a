"""Regenerate the released lessons from the nbgrader source notebooks: ``make release``.

``solutions/NN_slug/`` is the only hand-edited copy of a lesson. nbgrader's ``generate_assignment``
strips the solutions and the hidden tests, clears outputs and records checksums of the locked cells;
the result goes to ``lessons/NN_slug/`` and is committed. tests/test_release.py proves that lessons/ is
exactly what this script produces.

Usage: python scripts/release.py [--out DIR] [LESSON_ID ...]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def lesson_ids(root: Path = ROOT) -> list[str]:
    """Every lesson with a source notebook ``solutions/<id>/<id>.ipynb``, in course order."""
    return sorted(p.parent.name for p in (root / "solutions").glob("*/*.ipynb") if p.stem == p.parent.name)


def release(out_dir: Path, lessons: list[str] | None = None, root: Path = ROOT) -> list[Path]:
    """Generate the student version of each lesson into ``out_dir/<id>/``; returns the notebooks written."""
    lessons = lessons or lesson_ids(root)
    env = dict(os.environ)
    # nbgrader runs alembic as a subprocess to create the gradebook: our interpreter's bin/ goes first.
    env["PATH"] = str(Path(sys.executable).parent) + os.pathsep + env.get("PATH", "")
    written = []
    with tempfile.TemporaryDirectory() as scratch:
        for lesson in lessons:
            cmd = [
                sys.executable, "-m", "nbgrader", "generate_assignment", lesson, "--force", "--log-level=ERROR",
                f"--CourseDirectory.root={root}",
                "--CourseDirectory.source_directory=solutions",
                f"--CourseDirectory.release_directory={out_dir}",
                f"--CourseDirectory.db_url=sqlite:///{scratch}/gradebook.db",
            ]
            result = subprocess.run(cmd, cwd=scratch, env=env, capture_output=True, text=True)
            if result.returncode != 0:
                raise RuntimeError(f"nbgrader generate_assignment {lesson} failed:\n{result.stdout}{result.stderr}")
            written.append(out_dir / lesson / f"{lesson}.ipynb")
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "lessons", help="release directory (default lessons/)")
    parser.add_argument("lessons", nargs="*", help="lesson ids (default: every lesson in solutions/)")
    args = parser.parse_args(argv)
    for path in release(args.out.resolve(), args.lessons or None):
        print(f"released {path.relative_to(ROOT) if path.is_relative_to(ROOT) else path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
