"""Staging for `make grade`: find the submissions and copy each one's notebook into the grader's work area.

Only the notebook (and files the lesson itself ships beside it) is copied: nothing else a student puts in
the folder reaches the sandbox, autograded/ or feedback/. Nothing here trusts the submission: names,
links, hard links, counts, sizes, the notebook's JSON
(lone surrogates, invalid nbformat, more cells than the lesson allows) and `timestamp.txt` are all
bounded, replaced or dropped, and every problem becomes a note in that student's report instead of an
exception that stops the run. A student folder whose name cannot be a student id (a leading dash,
spaces, non-ASCII, over 100 characters) is graded under a safe alias that the report and the summary
show next to the folder's name; nothing is skipped without a line in the summary.
"""

from __future__ import annotations

import hashlib
import itertools
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
MAX_SUBMISSION_ENTRIES = 10_000    # entries of a lesson folder read at most
MAX_NOTES = 20                     # notes about ignored files, then one line with how many more
# always used with fullmatch: `$` in a `match` would let a final newline through ("alice\n")
ID_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.@+-]{0,99}")
SAFE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.@+ -]{0,199}")
TIMESTAMP_NOTE = ("ignored timestamp.txt: the submission time is never taken from the student's files "
                  "(grades.csv has no submission time for it)")
# control characters (C0, DEL, C1), line and paragraph separators, bidi embeddings, overrides and
# isolates, zero-width characters and the byte-order mark: whatever could forge or hide a line
UNSAFE_CHARS = re.compile("[\x00-\x1f\x7f-\x9f\u061c\u200b-\u200f\u2028-\u202e\u2060-\u2069\ufeff]")
_SHORT_ESCAPES = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def is_student_id(name) -> bool:
    return isinstance(name, str) and ID_RE.fullmatch(name) is not None


def _escape(match) -> str:
    char = match.group()
    return _SHORT_ESCAPES.get(char) or (f"\\x{ord(char):02x}" if ord(char) < 0x100 else f"\\u{ord(char):04x}")


def clean(text) -> str:
    """One line of text safe to print or write: lone surrogates replaced; control characters, line breaks,
    bidi overrides and invisible characters written as escapes (`\\n`, `\\u202e`), so a student's string can
    neither start a line of its own nor reorder what a terminal or an editor shows."""
    text = str(text).encode("utf-8", "replace").decode("utf-8")
    return UNSAFE_CHARS.sub(_escape, text)


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
    taken = {n for n in names if is_student_id(n)}
    for folder in names:
        sdir = os.path.join(base, folder)
        shown = clean(folder)[:120]
        if not os.path.isdir(sdir) and not os.path.islink(sdir):
            continue  # a stray file, not a submission
        student = folder if is_student_id(folder) else safe_alias(folder, taken)
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


def lesson_files(root, lesson) -> list[str]:
    """The files a lesson declares: the regular files it ships in solutions/<lesson>/ (its notebook first)."""
    folder = os.path.join(root, "solutions", lesson)
    extra = sorted(n for n in (os.listdir(folder) if os.path.isdir(folder) else [])
                   if n != f"{lesson}.ipynb" and SAFE_NAME.fullmatch(n)
                   and os.path.isfile(os.path.join(folder, n))
                   and not os.path.islink(os.path.join(folder, n)))
    return [f"{lesson}.ipynb"] + extra


def stage(root, work, folder, student, lesson):
    """Copy the submission's notebook (and files the lesson declares) into the staging area; (folder, notes).

    Nothing else of the submission is copied, so nothing else reaches the sandbox, autograded/ or
    feedback/. A declared file is copied only when it is a regular file with one link and a bounded
    size, opened with O_NOFOLLOW; every other entry gets a note (at most MAX_NOTES, then a count).
    """
    src = os.path.join(root, "autograder", "submitted", folder, lesson)
    dst = os.path.join(work, "staged", student, lesson)
    shutil.rmtree(dst, ignore_errors=True)
    os.makedirs(dst)
    wanted = lesson_files(root, lesson)
    notes, total = [], 0
    try:
        with os.scandir(src) as it:
            names = sorted(entry.name for entry in itertools.islice(it, MAX_SUBMISSION_ENTRIES))
    except OSError as exc:
        return dst, [f"could not read the submission's folder: {exc.strerror}"]
    ignored = [n for n in names if n not in wanted]
    for name in ignored[:MAX_NOTES]:
        notes.append(TIMESTAMP_NOTE if name == "timestamp.txt" else
                     f"ignored {clean(ascii(name))[:200]}: only the notebook (and files the lesson ships) is "
                     "graded")
    if len(ignored) > MAX_NOTES:
        notes.append(f"ignored {len(ignored) - MAX_NOTES} more files and folders")
    for name in (n for n in wanted if n in names):
        why = _copy_plain(os.path.join(src, name), os.path.join(dst, name), MAX_SUBMISSION_BYTES - total)
        if isinstance(why, str):
            notes.append(f"ignored {clean(ascii(name))[:200]}: {why}")
        else:
            total += why
    return dst, notes


def _copy_plain(src, dst, room):
    """Copy one regular file (bytes copied), or say why not (links and hard links are never followed)."""
    try:
        st = os.lstat(src)
    except OSError as exc:
        return f"cannot read it ({exc.strerror})"
    if not stat.S_ISREG(st.st_mode):
        return "not a regular file (links are not followed)"
    if st.st_nlink > 1:
        return "a hard link (it may point at a file outside the submission)"
    if st.st_size > min(MAX_NOTEBOOK_BYTES, room):
        return f"too large ({st.st_size} bytes)"
    fd = os.open(src, os.O_RDONLY | os.O_NOFOLLOW)
    with os.fdopen(fd, "rb") as fin, open(dst, "wb") as fout:
        shutil.copyfileobj(fin, fout, 1 << 20)
    return st.st_size


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
        raise ValueError(f"the notebook has {len(cells):,} cells, more than the {max_cells} this lesson "
                         "allows (twice the released lesson's)")
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
