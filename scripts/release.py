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
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def lesson_ids(root: Path = ROOT) -> list[str]:
    """Every lesson with a source notebook ``solutions/<id>/<id>.ipynb``, in course order."""
    return sorted(p.parent.name for p in (root / "solutions").glob("*/*.ipynb") if p.stem == p.parent.name)


def release(out_dir: Path, lessons: list[str] | None = None, root: Path = ROOT) -> list[Path]:
    """Generate the student version of each lesson into ``out_dir/<id>/``; returns the notebooks written.

    One process for every lesson: nbgrader's API, configured as ``nbgrader generate_assignment --force``
    with ``solutions/`` as the source folder and a scratch gradebook (an nbgrader start-up per lesson cost
    about 9 s each on two cores).
    """
    from nbgrader.apps import NbGraderAPI
    from nbgrader.coursedir import CourseDirectory
    from traitlets.config import Config

    lessons = lessons or lesson_ids(root)
    # nbgrader runs alembic as a subprocess to create the gradebook: our interpreter's bin/ goes first.
    os.environ["PATH"] = str(Path(sys.executable).parent) + os.pathsep + os.environ.get("PATH", "")
    written = []
    with tempfile.TemporaryDirectory() as scratch:
        config = Config()
        config.CourseDirectory.root = str(root)
        config.CourseDirectory.source_directory = "solutions"
        config.CourseDirectory.release_directory = str(out_dir)
        config.CourseDirectory.db_url = f"sqlite:///{scratch}/gradebook.db"
        config.Application.log_level = "ERROR"
        api = NbGraderAPI(coursedir=CourseDirectory(config=config), config=config)
        for lesson in lessons:
            result = api.generate_assignment(lesson, force=True, create=True)
            if not result["success"]:
                raise RuntimeError(f"nbgrader generate_assignment {lesson} failed:\n"
                                   f"{result.get('error') or ''}{result.get('log') or ''}")
            written.append(out_dir / lesson / f"{lesson}.ipynb")
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "lessons",
                        help="release directory (default lessons/)")
    parser.add_argument("lessons", nargs="*", help="lesson ids (default: every lesson in solutions/)")
    args = parser.parse_args(argv)
    for path in release(args.out.resolve(), args.lessons or None):
        print(f"released {path.relative_to(ROOT) if path.is_relative_to(ROOT) else path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
