"""Record the committed outputs that nbval compares: the cells marked ``# NBVAL_CHECK_OUTPUT`` in solutions/.

``make test`` runs every solution notebook under ``pytest --nbval-lax``: a cell whose source has the comment
line ``# NBVAL_CHECK_OUTPUT`` must print what its committed output shows (after nbval_sanitize.cfg), and
nbval silently skips a marked cell that has no recorded output. This script records those outputs:

1. copies ``solutions/<id>/<id>.ipynb`` to a temporary folder and executes the copy there, in a kernel of
   this interpreter (as nbval's ``--nbval-current-env``), offline as ``make test`` runs it; a cell that
   raises stops the lesson and nothing is written;
2. then reads the CURRENT ``solutions/<id>/<id>.ipynb`` afresh (others may have edited it meanwhile) and
   writes into it only outputs: each marked cell gets the outputs of the executed cell with the same cell
   id, provided its source is still the one that ran (otherwise that cell is refused: run again); unmarked
   cells lose any outputs they carry (solutions hold outputs only where nbval reads them). Nothing else
   in the file changes. Images (PNG/JPEG, which nbval does not compare) are left out.

The release is unaffected (``nbgrader generate_assignment`` clears outputs; tests/test_release.py checks
it), but run ``python scripts/release.py <id>`` after any change to a solution, as always.

Usage: python scripts/nbval_outputs.py [--dry-run] [--timeout-s S] [LESSON_ID ...]   (default: every lesson)
Exit status 1 if a lesson failed to run or a marked cell was refused.
"""

from __future__ import annotations

import argparse
import copy
import os
import shutil
import subprocess
import sys
import tempfile
import warnings
from pathlib import Path

import nbformat

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))
from release import lesson_ids  # noqa: E402

MARK = "NBVAL_CHECK_OUTPUT"
UNCOMPARED_MIME = ("image/png", "image/jpeg")  # nbval leaves these out of the comparison (without --nbdime)
OFFLINE_ENV = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "PYTHONDONTWRITEBYTECODE": "1"}


def checks_output(cell) -> bool:
    """Does nbval --nbval-lax compare this cell's output? nbval's own reading of markers and tags."""
    from nbval.plugin import find_comment_markers, find_metadata_tags

    if cell.get("cell_type") != "code":
        return False
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        options = dict(find_metadata_tags(cell.get("metadata", {})))
        options.update(find_comment_markers(cell.source))
    return bool(options.get("check", False))


def ends_quietly(source: str) -> bool:
    """Does the cell end with an expression silenced by ';' (``ax.set_title("...");``)?

    nbval runs cells with store_history=False, and IPython then ignores the ';': the value is shown under
    nbval and not in Jupyter, so the recorded output could never match. Such a cell cannot be marked.
    """
    lines = [line.split("#", 1)[0].rstrip() for line in source.splitlines()]
    lines = [line for line in lines if line]
    return bool(lines) and lines[-1].endswith(";")


def notebook_path(lesson: str, root: Path = ROOT) -> Path:
    path = root / "solutions" / lesson / f"{lesson}.ipynb"
    if not path.is_file():
        raise SystemExit(f"no solution notebook {path.relative_to(root)}: lesson ids are "
                         f"{', '.join(lesson_ids(root))}")
    return path


def execute_copy(path: Path, timeout_s: float):
    """Execute a copy of ``path`` in a temporary folder (kernel of this interpreter); returns the executed
    nb."""
    from jupyter_client.manager import KernelManager
    from nbclient import NotebookClient
    from nbval.kernel import CURRENT_ENV_KERNEL_NAME, NbvalKernelspecManager

    os.environ.update(OFFLINE_ENV)
    os.environ["PATH"] = str(Path(sys.executable).parent) + os.pathsep + os.environ.get("PATH", "")
    with tempfile.TemporaryDirectory(prefix="nbval-outputs-") as scratch:
        copied = Path(scratch) / path.name
        shutil.copyfile(path, copied)
        nb = nbformat.read(copied, as_version=4)
        km = KernelManager(kernel_name=CURRENT_ENV_KERNEL_NAME, kernel_spec_manager=NbvalKernelspecManager())
        client = NotebookClient(nb, km=km, timeout=timeout_s, allow_errors=False,
                                resources={"metadata": {"path": scratch}})
        # the kernel's own log (tracebacks come as outputs)
        client.execute(cwd=scratch, stderr=subprocess.DEVNULL)
    return nb


def recordable(outputs) -> list:
    """The executed outputs as they are committed: without the image data nbval does not compare, and with
    consecutive pieces of one stream joined (how they were flushed varies; nbval joins them too)."""
    kept = []
    for output in copy.deepcopy(outputs):
        if (output.get("output_type") == "stream" and kept and kept[-1].get("output_type") == "stream"
                and kept[-1].get("name") == output.get("name")):
            kept[-1]["text"] += output["text"]
            continue
        if output.get("output_type") in ("display_data", "execute_result"):
            for mime in UNCOMPARED_MIME:
                output.get("data", {}).pop(mime, None)
                output.get("metadata", {}).pop(mime, None)
            if not output.get("data"):
                continue
        kept.append(output)
    return kept


def merge_outputs(current, executed) -> tuple[list[str], list[str]]:
    """Write the executed marked cells' outputs into ``current`` (in place), matched by cell id.

    Returns (changes, refusals): what was changed, and the marked cells left as they were because the cell
    is not in the executed copy or its source differs from the one that ran.
    """
    ran = {cell.get("id"): cell for cell in executed.cells if cell.cell_type == "code"}
    changes, refusals = [], []
    for index, cell in enumerate(current.cells):
        if cell.cell_type != "code":
            continue
        where = f"cell {index} (id {cell.get('id')})"
        if not checks_output(cell):
            if cell.get("outputs") or cell.get("execution_count") is not None:
                cell.outputs, cell.execution_count = [], None
                changes.append(f"{where}: outputs cleared (not marked {MARK})")
            continue
        if ends_quietly(cell.source):
            refusals.append(f"{where}: ends with ';' (nbval shows the value it hides): assign it instead")
            continue
        done = ran.get(cell.get("id"))
        if done is None or done.source != cell.source:
            refusals.append(
                f"{where}: {'not in the executed copy' if done is None else 'source changed while it ran'}")
            continue
        outputs = recordable(done.outputs)
        if not outputs:
            refusals.append(f"{where}: marked {MARK} but prints nothing nbval compares")
            continue
        if outputs != cell.get("outputs") or cell.get("execution_count") != done.execution_count:
            cell.outputs, cell.execution_count = outputs, done.execution_count
            changes.append(f"{where}: output recorded")
    return changes, refusals


def write_atomically(nb, path: Path) -> None:
    handle, temp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.stem}-", suffix=".ipynb")
    os.close(handle)
    try:
        nbformat.write(nb, temp)
        os.replace(temp, path)
    finally:
        if os.path.exists(temp):
            os.unlink(temp)


def record(lesson: str, *, dry_run: bool = False, timeout_s: float = 600, root: Path = ROOT) -> bool:
    """Execute one lesson's copy and record its marked cells' outputs; True when nothing was refused."""
    path = notebook_path(lesson, root)
    try:
        executed = execute_copy(path, timeout_s)
    except Exception as exc:  # a cell raised or timed out: record nothing from a broken run
        print(f"{lesson}: the copy did not run to its end, nothing written:\n{str(exc)[-3000:]}")
        return False
    current = nbformat.read(path, as_version=4)  # read afresh, just before writing
    marked = sum(checks_output(cell) for cell in current.cells)
    changes, refusals = merge_outputs(current, executed)
    if changes and not dry_run:
        write_atomically(current, path)
    verb = "would change" if dry_run else "changed"
    print(f"{lesson}: {marked} marked cell(s); {len(changes)} {verb}; {len(refusals)} refused")
    for line in changes + [f"REFUSED {r}" for r in refusals]:
        print(f"  {line}")
    return not refusals


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("lessons", nargs="*", help="lesson ids (default: every lesson in solutions/)")
    parser.add_argument("--dry-run", action="store_true", help="execute and report, write nothing")
    parser.add_argument("--timeout-s", type=float, default=600, help="limit per cell (default 600)")
    args = parser.parse_args(argv)
    lessons = args.lessons or lesson_ids()
    for lesson in lessons:
        notebook_path(lesson)  # every id checked before anything runs
    ok = [record(lesson, dry_run=args.dry_run, timeout_s=args.timeout_s) for lesson in lessons]
    return 0 if all(ok) else 1


if __name__ == "__main__":
    raise SystemExit(main())
