"""Staging for `make grade`: find the submissions and copy each one's plain files into the grader's work area.

Nothing here trusts the submission: names, links, hard links, depth, counts, sizes, the notebook's JSON
(lone surrogates, invalid nbformat, more cells than the lesson allows) and `timestamp.txt` are all
bounded, replaced or dropped, and every problem becomes a note in that student's report instead of an
exception that stops the run. A student folder whose name cannot be a student id (a leading dash,
spaces, non-ASCII, over 100 characters) is graded under a safe alias that the report and the summary
show next to the folder's name; nothing is skipped without a line in the summary.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import stat
import sys
import unicodedata

# jsonschema (through nbformat) imports rfc3987_syntax for one format check notebooks never use; that
# import costs ~1.2 s of CPU in every process that reads a notebook. Skip it.
sys.modules.setdefault("rfc3987_syntax", None)

MAX_NOTEBOOK_BYTES = 20 * 2**20
MAX_SUBMISSION_BYTES = 100 * 2**20
MAX_DEPTH = 12
MAX_ENTRIES = 2_000
ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.@+-]{0,99}$")
SAFE_NAME = re.compile(r"^[^\x00-\x1f\x7f/\\]{1,200}$")
TIMESTAMP_NOTE = ("ignored timestamp.txt: the submission time is never taken from the student's files "
                  "(grades.csv has no submission time for it)")


def clean(text) -> str:
    """Text safe to print and to write as UTF-8 (lone surrogates and control characters replaced)."""
    text = str(text).encode("utf-8", "replace").decode("utf-8")
    return re.sub(r"[\x00-\x08\x0b-\x1f\x7f]", "?", text)


def safe_alias(name: str, taken) -> str:
    """A student id for a folder name that cannot be one: ASCII letters of the name plus a hash of it."""
    folded = unicodedata.normalize("NFKD", name.encode("utf-8", "replace").decode("utf-8"))
    base = re.sub(r"[^A-Za-z0-9_.@+-]+", "_", folded.encode("ascii", "ignore").decode())
    base = re.sub(r"^[^A-Za-z0-9]+", "", base)[:60].rstrip("_.-@+") or "student"
    digest = hashlib.sha256(name.encode("utf-8", "surrogateescape")).hexdigest()
    for n in (8, 16, 64):
        alias = f"{base}-{digest[:n]}"
        if alias not in taken:
            return alias
    raise RuntimeError(f"no free alias for {clean(ascii(name))}")


def discover(root, lessons_filter, students_filter, solutions):
    """([(student id, folder name, lesson)], [(shown name, lesson, why)], {folder name: student id})."""
    base = os.path.join(root, "autograder", "submitted")
    found, skipped, ids = [], [], {}
    if not os.path.isdir(base):
        return found, skipped, ids
    names = sorted(os.listdir(base))
    taken = {n for n in names if ID_RE.match(n)}
    for folder in names:
        sdir = os.path.join(base, folder)
        shown = clean(folder)[:120]
        if not os.path.isdir(sdir) and not os.path.islink(sdir):
            continue  # a stray file, not a submission
        student = folder if ID_RE.match(folder) else safe_alias(folder, taken)
        taken.add(student)
        if students_filter and student not in students_filter and folder not in students_filter:
            continue
        if folder.startswith("."):
            skipped.append((shown, "*", "a hidden folder (not graded)"))
            continue
        ids[folder] = student
        if os.path.islink(sdir):
            skipped.append((student, "*", "the student folder is a symbolic link (not followed)"))
            continue
        try:
            lessons = sorted(os.listdir(sdir))
        except OSError as exc:
            skipped.append((student, "*", f"cannot list the folder ({exc.strerror})"))
            continue
        for lesson in lessons:
            ldir = os.path.join(sdir, lesson)
            if lessons_filter and lesson not in lessons_filter:
                continue
            if os.path.islink(ldir) or not os.path.isdir(ldir):
                if os.path.islink(ldir):
                    skipped.append((student, clean(lesson)[:60], "a symbolic link (not followed)"))
                continue
            if lesson not in solutions:
                skipped.append((student, clean(lesson)[:60], "no such lesson in solutions/"))
                continue
            found.append((student, folder, lesson))
    return found, skipped, ids


def stage(root, work, folder, student, lesson):
    """Copy regular files only into the staging area; returns (folder, notes).

    Iterative and bounded (depth, number of entries, bytes): links, hard links, devices, odd names and
    deep or huge trees are skipped with a note, never followed; timestamp.txt is dropped.
    """
    src = os.path.join(root, "autograder", "submitted", folder, lesson)
    dst = os.path.join(work, "staged", student, lesson)
    shutil.rmtree(dst, ignore_errors=True)
    os.makedirs(dst)
    notes, total, seen = [], 0, 0
    stack = [("", 0)]
    while stack:
        rel, depth = stack.pop()
        try:
            with os.scandir(os.path.join(src, rel)) as it:
                entries = sorted(it, key=lambda e: e.name)
        except OSError as exc:
            notes.append(f"could not read folder {clean(ascii(rel))}: {exc.strerror}")
            continue
        for entry in entries:
            seen += 1
            name_rel = os.path.join(rel, entry.name)
            shown = clean(ascii(name_rel))[:200]
            if seen > MAX_ENTRIES:
                notes.append(f"ignored everything after {MAX_ENTRIES} files and folders")
                return dst, notes
            if not SAFE_NAME.match(entry.name) or entry.name.startswith(".") or \
                    entry.name.encode("utf-8", "surrogateescape") != entry.name.encode("utf-8", "replace"):
                notes.append(f"ignored {shown}: hidden or unusual file name")
                continue
            if name_rel == "timestamp.txt":
                notes.append(TIMESTAMP_NOTE)
                continue
            st = entry.stat(follow_symlinks=False)
            if stat.S_ISDIR(st.st_mode):
                if depth + 1 >= MAX_DEPTH:
                    notes.append(f"ignored {shown}: folders nested deeper than {MAX_DEPTH} levels")
                    continue
                os.makedirs(os.path.join(dst, name_rel), exist_ok=True)
                stack.append((name_rel, depth + 1))
                continue
            if not stat.S_ISREG(st.st_mode):
                notes.append(f"ignored {shown}: not a regular file (links are not followed)")
                continue
            if st.st_nlink > 1:
                notes.append(f"ignored {shown}: a hard link (it may point at a file outside the submission)")
                continue
            total += st.st_size
            if st.st_size > MAX_NOTEBOOK_BYTES or total > MAX_SUBMISSION_BYTES:
                notes.append(f"ignored {shown}: too large ({st.st_size} bytes)")
                continue
            fd = os.open(os.path.join(src, name_rel), os.O_RDONLY | os.O_NOFOLLOW)
            with os.fdopen(fd, "rb") as fin, open(os.path.join(dst, name_rel), "wb") as fout:
                shutil.copyfileobj(fin, fout, 1 << 20)
    return dst, notes


def _clean_strings(obj):
    if isinstance(obj, str):
        return obj.encode("utf-8", "replace").decode("utf-8")
    if isinstance(obj, list):
        return [_clean_strings(x) for x in obj]
    if isinstance(obj, dict):
        return {_clean_strings(k): _clean_strings(v) for k, v in obj.items()}
    return obj


def read_notebook(path, max_cells=None):
    """nbformat node of a submitted notebook: bounded size and cells, lone surrogates replaced, validated."""
    import nbformat

    if os.path.getsize(path) > MAX_NOTEBOOK_BYTES:
        raise ValueError("the notebook is larger than 20 MiB")
    with open(path, "rb") as fh:
        raw = fh.read(MAX_NOTEBOOK_BYTES + 1).decode("utf-8", "replace")
    data = json.loads(raw)
    cells = data.get("cells") if isinstance(data, dict) else None
    if max_cells is not None and isinstance(cells, list) and len(cells) > max_cells:
        raise ValueError(f"the notebook has {len(cells):,} cells, more than the {max_cells} this lesson allows "
                         "(twice the released lesson's)")
    nb = nbformat.reads(json.dumps(_clean_strings(data)), as_version=4)
    nbformat.validate(nb)
    return nb


def validate_entry(conn, path, max_cells, limits):
    """A validator child's entry point (limited, with a time limit in the parent): writes the notebook back
    clean and valid, and sends ("" or the reason it cannot be used, its CPU seconds)."""
    import time

    import cgroups
    import nbformat

    try:
        cgroups.limit_process(limits)
        nbformat.write(read_notebook(path, max_cells), path)
        reason = ""
    except BaseException as exc:  # noqa: BLE001  (MemoryError included: the reason goes to the report)
        reason = f"{type(exc).__name__}: {clean(exc)[:200]}"
    conn.send((reason, time.process_time()))
    conn.close()
