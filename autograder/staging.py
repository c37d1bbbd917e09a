"""Staging for `make grade`: find the submissions and copy each one's plain files into the grader's work area.

Nothing here trusts the submission: names, links, hard links, depth, counts, sizes and the notebook's
JSON (lone surrogates, invalid nbformat) are all bounded or replaced, and every problem becomes a note in
that student's report instead of an exception that stops the run.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import stat

MAX_NOTEBOOK_BYTES = 20 * 2**20
MAX_SUBMISSION_BYTES = 100 * 2**20
MAX_DEPTH = 12
MAX_ENTRIES = 2_000
ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.@+-]{0,99}$")
SAFE_NAME = re.compile(r"^[^\x00-\x1f\x7f/\\]{1,200}$")


def clean(text) -> str:
    """Text safe to print and to write as UTF-8 (lone surrogates and control characters replaced)."""
    text = str(text).encode("utf-8", "replace").decode("utf-8")
    return re.sub(r"[\x00-\x08\x0b-\x1f\x7f]", "?", text)



def discover(root, lessons_filter, students_filter, solutions):
    base = os.path.join(root, "autograder", "submitted")
    found, skipped = [], []
    if not os.path.isdir(base):
        return found, skipped
    for student in sorted(os.listdir(base)):
        sdir = os.path.join(base, student)
        if not os.path.isdir(sdir) or os.path.islink(sdir) or (students_filter and student not in students_filter):
            continue
        if not ID_RE.match(student):
            skipped.append((clean(ascii(student)), "*", "student folder name has unusual characters"))
            continue
        try:
            lessons = sorted(os.listdir(sdir))
        except OSError as exc:
            skipped.append((student, "*", f"cannot list the folder ({exc.strerror})"))
            continue
        for lesson in lessons:
            ldir = os.path.join(sdir, lesson)
            if not os.path.isdir(ldir) or os.path.islink(ldir) or (lessons_filter and lesson not in lessons_filter):
                continue
            if lesson not in solutions:
                skipped.append((student, clean(ascii(lesson))[:60], "no such lesson in solutions/"))
                continue
            found.append((student, lesson))
    return found, skipped


def stage(root, work, student, lesson):
    """Copy regular files only into the staging area; returns (folder, notes).

    Iterative and bounded (depth, number of entries, bytes): links, hard links, devices, odd names and
    deep or huge trees are skipped with a note, never followed.
    """
    src = os.path.join(root, "autograder", "submitted", student, lesson)
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


def read_notebook(path):
    """nbformat node of a submitted notebook: bounded size, lone surrogates replaced, validated."""
    import nbformat

    if os.path.getsize(path) > MAX_NOTEBOOK_BYTES:
        raise ValueError("the notebook is larger than 20 MiB")
    with open(path, "rb") as fh:
        raw = fh.read(MAX_NOTEBOOK_BYTES + 1).decode("utf-8", "replace")
    data = _clean_strings(json.loads(raw))
    nb = nbformat.reads(json.dumps(data), as_version=4)
    nbformat.validate(nb)
    return nb
