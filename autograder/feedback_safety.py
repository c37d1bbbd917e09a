"""Make a graded notebook safe to render as feedback HTML (used by nbgrader's GenerateFeedback).

A student controls the text of their answer cells, the cells they add, and every output their code
produced. Rendered as HTML, any of those could carry `<script>`, `<img onerror=...>`, `javascript:`
links, SVG with scripts, or `Javascript()` outputs into the browser of whoever opens the feedback.
`SafeFeedback` keeps only what renders as escaped text or inert images:

- code-cell outputs: streams and errors (escaped text), and from displays only `text/plain`, `image/png`
  and `image/jpeg` (checked to be base64); HTML, SVG, JavaScript, Markdown, LaTeX and widget outputs are
  replaced by their plain-text form; output metadata is dropped;
- Markdown that is not the lesson's own text (answers, added or edited cells: anything whose text is
  not a Markdown cell of solutions/<lesson>/<lesson>.ipynb) is shown as a fenced code block (its text,
  escaped), and cell attachments are dropped;
- ANSI escape codes are removed from long texts, every text is capped (MAX_TEXT_CHARS) and so is a
  page's student text in all (MAX_PAGE_TEXT_CHARS: later outputs are replaced by one line that says so),
  so rendering takes linear time and a bounded page;
- cell metadata is reduced to what nbgrader's feedback needs, grade ids are made safe, and the notebook's
  kernelspec and language_info are the lesson's (solutions/), never the student's; code is highlighted
  with the lessons' lexer, bounded in size and time (autograder/highlighting.py, registered as nbconvert's
  `highlight_code` filter in autograder/nbgrader_config.py).

The lesson's own Markdown (exactly the instructor's text) is kept as is. A written answer that awaits
manual grading (`PendingGrades` marks it) says so above the student's text, since nbgrader's feedback
template would show its score as 0.

`SafeFormgrader` does the same for the formgrader's view of a submission (it renders the autograded
notebook with nbconvert's HTMLExporter, student Markdown and outputs as HTML, in the instructor's
browser); autograder/formgrader/nbgrader_config.py registers it.
"""

import json
import os
import re

import highlighting
from nbconvert.preprocessors import Preprocessor
from nbgrader.preprocessors import GetGrades
from traitlets import Bool

SAFE_ID = re.compile(r"[^A-Za-z0-9_.-]")
ANSI = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]|\x1b[@-_]|[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")
BASE64 = re.compile(r"^[A-Za-z0-9+/=\s]*$")
MAX_TEXT_CHARS = 50_000
MAX_IMAGE_CHARS = 4_000_000
MAX_PAGE_TEXT_CHARS = 4_000_000   # the student's text and outputs on one page, images included
PAGE_FULL_NOTE = "[... this page shows no more output: it reached its size limit ...]\n"
PENDING_NOTE = "**Not graded yet:** this answer awaits manual grading; the score shown here is not final."


def clean_text(text, limit=MAX_TEXT_CHARS):
    if not isinstance(text, str):
        text = "".join(str(t) for t in text) if isinstance(text, list) else str(text)
    text = text.encode("utf-8", "replace").decode("utf-8")
    if len(text) > 2_000:
        text = ANSI.sub("", text[: limit * 4])
    if len(text) > limit:
        text = text[:limit] + "\n[... cut for the feedback page ...]"
    return text


def _safe_output(out):
    kind = out.get("output_type")
    if kind == "stream":
        return {"output_type": "stream", "name": "stdout" if out.get("name") != "stderr" else "stderr",
                "text": clean_text(out.get("text", ""))}
    if kind == "error":
        return {"output_type": "error", "ename": clean_text(out.get("ename", "Error"), 200),
                "evalue": clean_text(out.get("evalue", ""), 4000),
                "traceback": [clean_text(line, 4000) for line in list(out.get("traceback", []))[:200]]}
    if kind in ("display_data", "execute_result"):
        data = out.get("data", {}) if isinstance(out.get("data"), dict) else {}
        safe = {}
        for mime in ("image/png", "image/jpeg"):
            value = data.get(mime)
            if isinstance(value, str) and len(value) <= MAX_IMAGE_CHARS and BASE64.match(value):
                safe[mime] = value
        text = data.get("text/plain")
        if text is not None:
            safe["text/plain"] = clean_text(text)
        elif not safe and data:
            safe["text/plain"] = "[an output of type " + ", ".join(sorted(str(m)[:60] for m in data)) + \
                                 " is not shown in the feedback]"
        if not safe:
            return None
        new = {"output_type": kind, "data": safe, "metadata": {}}
        if kind == "execute_result":
            new["execution_count"] = None
        return new
    return None


def _page_outputs(outputs, budget):
    """The safe outputs of a cell while the page's text budget lasts, then one line that says so."""
    kept = []
    for out in outputs:
        if budget[0] <= 0:
            kept.append({"output_type": "stream", "name": "stdout", "text": PAGE_FULL_NOTE})
            break
        safe = _safe_output(out)
        if safe is not None:
            budget[0] -= len(json.dumps(safe))
            kept.append(safe)
    return kept


def _fence(text):
    longest = max([len(m) for m in re.findall(r"`+|~+", text)] + [2])
    fence = "`" * (longest + 1)
    return f"{fence}text\n{text}\n{fence}"


def lesson_source(root, lesson):
    """(the Markdown texts, the kernelspec and language_info) of the instructor's source notebook
    (trusted), or (an empty set, {})."""
    path = os.path.join(root, "solutions", lesson, f"{lesson}.ipynb")
    try:
        with open(path, encoding="utf-8") as fh:
            data = json.load(fh)
        cells, meta = data.get("cells", []), data.get("metadata", {})
    except (OSError, ValueError, AttributeError):
        return set(), {}
    texts = set()
    for cell in cells:
        if cell.get("cell_type") == "markdown":
            src = cell.get("source", "")
            texts.add("".join(src) if isinstance(src, list) else src)
    return texts, {k: meta[k] for k in ("kernelspec", "language_info") if isinstance(meta.get(k), dict)}


class SafeFeedback(Preprocessor):
    """Strip everything from a graded notebook that a browser would execute (see the module docstring)."""

    enabled = Bool(True, help="nbconvert runs a preprocessor only when it is enabled").tag(config=True)

    def preprocess(self, nb, resources):
        from nbformat import from_dict

        try:
            root = (self.config.CourseDirectory.root
                    or os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        except AttributeError:
            root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        lesson = str(resources.get("nbgrader", {}).get("assignment") or resources.get("assignment_id") or "")
        trusted, lesson_meta = lesson_source(str(root), lesson) if re.fullmatch(r"[A-Za-z0-9_.-]+", lesson) \
            else (set(), {})
        highlighting.new_page()
        nb.metadata = from_dict(lesson_meta)  # the lesson's language, never the student's
        budget = [MAX_PAGE_TEXT_CHARS]
        for cell in nb.cells:
            nbg = cell.get("metadata", {}).get("nbgrader", {})
            if nbg:
                nbg = dict(nbg)
                if "grade_id" in nbg:
                    nbg["grade_id"] = SAFE_ID.sub("_", str(nbg["grade_id"]))[:100]
            cell.metadata = from_dict({"nbgrader": nbg} if nbg else {})
            cell.pop("attachments", None)
            pending = nbg.get("pending") is True
            if cell.cell_type == "markdown":
                if cell.source not in trusted:
                    cell.source = _fence(clean_text(cell.source, min(MAX_TEXT_CHARS, max(2_000, budget[0]))))
                    budget[0] -= len(cell.source)
                if pending:
                    cell.source = PENDING_NOTE + "\n\n" + cell.source
            elif cell.cell_type == "code":
                cell.source = clean_text(cell.source, min(MAX_TEXT_CHARS, max(2_000, budget[0])))
                budget[0] -= len(cell.source)
                outputs = _page_outputs(cell.get("outputs", []), budget)
                if pending:
                    outputs.append({"output_type": "stream", "name": "stdout", "text": PENDING_NOTE + "\n"})
                cell.outputs = [from_dict(o) for o in outputs if o is not None]
            else:  # raw cells are rendered verbatim by some templates
                cell.cell_type = "markdown"
                cell.source = _fence(clean_text(cell.source, min(MAX_TEXT_CHARS, max(2_000, budget[0]))))
                budget[0] -= len(cell.source)
        return nb, resources


class PendingGrades(GetGrades):
    """nbgrader's GetGrades, and `pending: True` in the metadata of a cell that has no score yet (neither
    automatic nor manual: a written answer awaiting manual grading)."""

    def _get_score(self, cell, resources):
        super()._get_score(cell, resources)
        grade = self.gradebook.find_grade(cell.metadata["nbgrader"]["grade_id"], self.notebook_id,
                                          self.assignment_id, self.student_id)
        cell.metadata.nbgrader["pending"] = grade.auto_score is None and grade.manual_score is None


class SafeFormgrader(SafeFeedback):
    """SafeFeedback for the formgrader's view of a submission. It is registered as an HTMLExporter
    preprocessor, so it also runs in nbgrader's own converters: there (their resources have "nbgrader")
    it does nothing, since generate_feedback runs SafeFeedback itself after GetGrades."""

    def preprocess(self, nb, resources):
        if "nbgrader" in resources:
            return nb, resources
        return super().preprocess(nb, resources)
