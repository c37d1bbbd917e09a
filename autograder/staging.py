"""Staging for `make grade`: find the submissions and copy each one's notebook into the grader's work area.

Only the notebook (and files the lesson itself ships beside it) is copied: nothing else a student puts in
the folder reaches the sandbox, autograded/ or feedback/. Nothing here trusts the submission: names,
links, hard links, counts, sizes, the notebook's JSON
(lone surrogates, invalid nbformat, more cells than the lesson allows) and `timestamp.txt` are all
bounded, replaced or dropped, and every problem becomes a note in that student's report instead of an
exception that stops the run. A student folder whose name cannot be a student id (a leading dash,
spaces, non-ASCII, over 100 characters) is graded under a safe alias (`<letters>-alias-<hash>`, a form
no folder may take, recorded in .work/aliases.json so that it stays the folder's from run to run) that
the report and the summary show next to the folder's name, quoted (`shown`); nothing is skipped without
a line in the summary (20 per student folder, then a count).

The notebook's check (`validate_entry`, in a limited child) keeps only what grading uses (cells' type,
id, source and nbgrader keys; the lesson's kernelspec and language_info) and writes the notebook in the
form nbformat writes it, the form its 20 MiB limit was measured in: nothing downstream grows past it.
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
# the grader's aliases for folders whose name cannot be an id; a folder named like this is refused
ALIAS_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.@+-]*-alias-[0-9a-f]{8,64}")
ALIASES_FILE = "aliases.json"      # {folder name (hex of its bytes): alias}, kept across runs in .work/
# what a cell's nbgrader metadata may hold before the lesson's roles are restored (cellroles.py)
NBGRADER_KEYS = ("grade", "grade_id", "locked", "points", "schema_version", "solution", "task", "checksum",
                 "cell_type")
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


def shown(name, limit=60) -> str:
    """A student-controlled name for the terminal table and the reports: quoted with ascii() (so no
    character reads as another: U+2215 is not '/'), runs of spaces collapsed (so it cannot pad itself
    into a line of its own on a wrapping terminal), cut at `limit` characters."""
    text = ascii(str(name).encode("utf-8", "surrogateescape").decode("utf-8", "replace"))
    text = re.sub(r" {2,}", " ", text)
    return text if len(text) <= limit else text[: limit - 4] + "...'"


def is_alias_form(name: str) -> bool:
    """Whether `name` has the grader's aliases' form (`<letters>-alias-<hex>`): no folder may take it."""
    return ALIAS_RE.fullmatch(name) is not None


def _alias_parts(name: str):
    folded = unicodedata.normalize("NFKD", name.encode("utf-8", "replace").decode("utf-8"))
    base = re.sub(r"[^A-Za-z0-9_.@+-]+", "_", folded.encode("ascii", "ignore").decode())
    base = re.sub(r"^[^A-Za-z0-9]+", "", base)[:60].rstrip("_.-@+") or "student"
    return base, hashlib.sha256(name.encode("utf-8", "surrogateescape")).hexdigest()


def safe_alias(name: str, taken) -> str:
    """A student id for a folder name that cannot be one: ASCII letters of the name, `-alias-`, a hash of
    it. A folder named in that form is refused (discover), so an alias is never a folder's own id."""
    base, digest = _alias_parts(name)
    for n in (8, 16, 64):
        alias = f"{base}-alias-{digest[:n]}"
        if alias not in taken:
            return alias
    raise RuntimeError(f"no free alias for {clean(ascii(name))}")


def legacy_aliases(root, known_ids) -> dict:
    """{folder name: alias} for the folders an older grader aliased as `<letters>-<hash>` (before aliases
    had a form of their own and were recorded), found among `known_ids` (the gradebook's students): the
    first run with an alias map keeps those folders' rows and hand-graded scores."""
    base_dir = os.path.join(root, "autograder", "submitted")
    try:
        with os.scandir(base_dir) as it:
            names = [e.name for e in itertools.islice(it, MAX_SUBMISSION_ENTRIES)]
    except OSError:
        return {}
    found = {}
    for name in names:
        if is_student_id(name) or name.startswith("."):
            continue
        base, digest = _alias_parts(name)
        old = [f"{base}-{digest[:n]}" for n in (8, 16, 64) if f"{base}-{digest[:n]}" in known_ids]
        if old:
            found[name] = old[0]
    return found


def load_aliases(work) -> dict:
    """{folder name: alias} recorded by earlier runs (work/aliases.json; {} when there is none)."""
    try:
        with open(os.path.join(work, ALIASES_FILE), encoding="utf-8") as fh:
            data = json.load(fh)
        return {os.fsdecode(bytes.fromhex(k)): v for k, v in data.items() if is_student_id(v)}
    except FileNotFoundError:
        return {}
    except (OSError, ValueError, TypeError, AttributeError) as exc:
        raise RuntimeError(f"cannot read the alias map autograder/.work/{ALIASES_FILE} ({clean(exc)[:200]}): "
                           "the aliased folders' rows and hand-graded scores depend on it; restore it, or "
                           "remove it to give those folders new aliases") from exc


def save_aliases(work, aliases: dict):
    """Record {folder name: alias} in the grader's work folder (atomically), for the next runs."""
    path = os.path.join(work, ALIASES_FILE)
    with open(path + ".tmp", "w", encoding="utf-8") as fh:
        json.dump({os.fsencode(k).hex(): v for k, v in sorted(aliases.items())}, fh, indent=0)
    os.replace(path + ".tmp", path)


class _Skipped(list):
    """Skipped folders: at most MAX_NOTES listed per student folder (or for the hidden and refused ones
    together), then one line with how many more."""

    def __init__(self):
        super().__init__()
        self.counts = {}

    def add(self, student, lesson, why, key=None):
        key = student if key is None else key
        n = self.counts[key] = self.counts.get(key, 0) + 1
        if n <= MAX_NOTES:
            self.append((student, lesson, why))

    def close(self):
        for key, n in self.counts.items():
            if n > MAX_NOTES:
                who = key if key != "." else "(hidden or refused folders)"
                self.append((who, "*", f"{n - MAX_NOTES:,} more folders skipped (not listed)"))
        return list(self)


def discover(root, lessons_filter, students_filter, solutions, aliases=None):
    """([(student id, folder name, lesson)], [(shown name, lesson, why)], {folder name: student id}).

    `aliases`: {folder name: alias} recorded by earlier runs, updated in place with the new ones. A folder
    keeps its alias from run to run; a folder named in the aliases' form (`-alias-` and a hash) or like
    an alias recorded for another folder is refused, so it never takes over that folder's row and
    hand-graded scores. Skipped folders are listed MAX_NOTES at a time per student folder, then counted.
    """
    aliases = {} if aliases is None else aliases
    base = os.path.join(root, "autograder", "submitted")
    found, skipped, ids = [], _Skipped(), {}
    if not os.path.isdir(base):
        return found, [], ids
    with os.scandir(base) as it:
        names = sorted(entry.name for entry in itertools.islice(it, MAX_SUBMISSION_ENTRIES))
    recorded = set(aliases.values())
    taken = {n for n in names if is_student_id(n)} | recorded
    for folder in names:
        sdir = os.path.join(base, folder)
        if not os.path.isdir(sdir) and not os.path.islink(sdir):
            continue  # a stray file, not a submission
        refused = ("a hidden folder (not graded)" if folder.startswith(".") else
                   "named like the grader's alias of another folder (not graded: rename the folder)"
                   if is_student_id(folder) and (is_alias_form(folder) or folder in recorded) else "")
        if refused:
            if not students_filter or folder in students_filter:
                skipped.add(shown(folder), "*", refused, key=".")
            continue
        student = folder if is_student_id(folder) else aliases.get(folder) or safe_alias(folder, taken)
        if student != folder:
            aliases[folder] = student
        taken.add(student)
        if students_filter and student not in students_filter and folder not in students_filter:
            continue
        ids[folder] = student
        if os.path.islink(sdir):
            skipped.add(student, "*", "the student folder is a symbolic link (not followed)")
            continue
        try:
            with os.scandir(sdir) as it:
                lessons = sorted(entry.name for entry in itertools.islice(it, MAX_SUBMISSION_ENTRIES))
        except OSError as exc:
            skipped.add(student, "*", f"cannot list the folder ({exc.strerror})")
            continue
        for lesson in lessons:
            ldir = os.path.join(sdir, lesson)
            if lessons_filter and lesson not in lessons_filter:
                continue
            if os.path.islink(ldir) or not os.path.isdir(ldir):
                if os.path.islink(ldir):
                    skipped.add(student, shown(lesson), "a symbolic link (not followed)")
                continue
            if lesson not in solutions:
                skipped.add(student, shown(lesson), "no such lesson in solutions/")
                continue
            found.append((student, folder, lesson))
    return found, skipped.close(), ids


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


def _kept_nbgrader(meta):
    """The nbgrader keys a cell may carry (flat values only); RestoreCellRoles then sets the lesson's."""
    if not isinstance(meta, dict):
        return None
    kept = {k: v for k, v in meta.items() if k in NBGRADER_KEYS and
            (v is None or isinstance(v, (bool, int, float)) or (isinstance(v, str) and len(v) <= 1000))}
    return kept or None


def _kept_cell(cell):
    """A cell with only what grading uses: type, id, source, its nbgrader keys. Other metadata,
    attachments and outputs (the sandbox makes the outputs) are dropped, whatever their size or depth."""
    if not isinstance(cell, dict):
        return cell  # nbformat's validation says what is wrong
    kept = {k: cell[k] for k in ("cell_type", "id", "source") if k in cell}
    nbg = _kept_nbgrader((cell.get("metadata") or {}).get("nbgrader") if isinstance(cell.get("metadata"),
                                                                                 dict) else None)
    kept["metadata"] = {"nbgrader": nbg} if nbg else {}
    if cell.get("cell_type") == "code":
        kept.update(execution_count=None, outputs=[])
    return kept


def read_notebook(path, max_cells=None, lesson_metadata=None):
    """nbformat node of a submitted notebook: bounded size and cells, only the parts grading uses (cells'
    type, id, source and nbgrader keys; the lesson's kernelspec and language_info), lone surrogates
    replaced, validated."""
    import nbformat

    if os.path.getsize(path) > MAX_NOTEBOOK_BYTES:
        raise ValueError("the notebook is larger than 20 MiB")
    with open(path, "rb") as fh:
        raw = fh.read(MAX_NOTEBOOK_BYTES + 1).decode("utf-8", "replace")
    data = json.loads(raw)
    if not isinstance(data, dict):
        raise ValueError("the notebook is not a JSON object")
    cells = data.get("cells")
    if max_cells is not None and isinstance(cells, list) and len(cells) > max_cells:
        raise ValueError(f"the notebook has {len(cells):,} cells, more than the {max_cells} this lesson "
                         "allows (twice the released lesson's)")
    minor = data.get("nbformat_minor")
    kept = {"nbformat": data.get("nbformat"), "nbformat_minor": minor if isinstance(minor, int) else 5,
            "metadata": dict(lesson_metadata or {}),
            "cells": [_kept_cell(c) for c in cells] if isinstance(cells, list) else cells}
    del data, raw
    nb = nbformat.reads(json.dumps(_clean_strings(kept)), as_version=4)
    nbformat.validate(nb)
    return nb


def written_form(nb) -> bytes:
    """The notebook as nbformat writes it (indented, text split in lines): what staging, preparation and
    nbgrader's autograde write, and what the 20 MiB limit applies to."""
    import nbformat

    return nbformat.writes(nb).encode("utf-8")


def validate_entry(conn, path, max_cells, limits, lesson_metadata=None):
    """A validator child's entry point (limited, with a time limit in the parent): writes the notebook back
    clean and valid, in the form it was measured in (at most MAX_NOTEBOOK_BYTES as nbformat writes it),
    and sends ("" or the reason it cannot be used, its CPU seconds)."""
    import time

    import cgroups

    try:
        cgroups.limit_process(limits)
        data = written_form(read_notebook(path, max_cells, lesson_metadata))
        if len(data) > MAX_NOTEBOOK_BYTES:
            raise ValueError(f"the notebook takes {len(data):,} bytes as the grader writes it (indented, "
                             "one line per line of text), more than 20 MiB")
        with open(path, "wb") as fh:
            fh.write(data)
        reason = ""
    except BaseException as exc:  # noqa: BLE001  (MemoryError included: the reason goes to the report)
        reason = f"{type(exc).__name__}: {clean(exc)[:200]}"
    conn.send((reason, time.process_time()))
    conn.close()
