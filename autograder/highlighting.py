"""Syntax highlighting of code cells in the feedback and the formgrader, bounded in size and time.

nbconvert's HTMLExporter highlights every code cell with the lexer named by the notebook's own
`language_info`: the student's, in a submission. Pygments has hundreds of lexers, dozens of them
super-linear on some input (IPython's on runs of blank lines: 4,000 of them take seconds, 12,000 most of a
minute), and the formgrader renders inside the instructor's Jupyter server, which answers nothing else
meanwhile. So `BoundedHighlight` replaces nbconvert's `highlight_code` filter (autograder/nbgrader_config.py,
for the feedback and the formgrader alike):

- the lexer is the course's, from the lessons' own `language_info` in solutions/ (never the notebook's,
  nor a cell's `magics_language`); lessons that disagree or name no lexer get plain text;
- a source longer than MAX_HIGHLIGHT_CHARS is shown as plain (escaped) text;
- a page spends at most PAGE_HIGHLIGHT_S seconds highlighting (`new_page()` starts a page's budget: the
  feedback's preprocessor calls it); the lexer's tokens are timed as they come, and once the budget is
  spent the rest of the source, and every later cell of the page, is plain text.
"""

from __future__ import annotations

import glob
import json
import os
import time
from html import escape

MAX_HIGHLIGHT_CHARS = 20_000
PAGE_HIGHLIGHT_S = 2.0
_PAGE = {"left_s": 0.0}


def new_page(budget_s: float = PAGE_HIGHLIGHT_S):
    """Start a page's highlighting budget (the feedback's and formgrader's preprocessor calls it)."""
    _PAGE["left_s"] = budget_s


def course_lexer(root: str) -> str:
    """The Pygments lexer the lessons name in their `language_info` (solutions/*/*.ipynb), or "text"
    when they name none or disagree."""
    names = set()
    for path in glob.glob(os.path.join(root, "solutions", "*", "*.ipynb")):
        try:
            with open(path, encoding="utf-8") as fh:
                info = json.load(fh).get("metadata", {}).get("language_info", {})
        except (OSError, ValueError, AttributeError):
            continue
        name = info.get("pygments_lexer") or info.get("name") if isinstance(info, dict) else None
        if isinstance(name, str):
            names.add(name)
    return names.pop() if len(names) == 1 else "text"


class BoundedHighlight:
    """nbconvert's `highlight_code` filter, with the course's lexer and a bound on size and time."""

    def __init__(self, lexer_name: str):
        from pygments.lexers import get_lexer_by_name
        from pygments.util import ClassNotFound

        try:
            self.lexer = get_lexer_by_name(lexer_name)
        except ClassNotFound:
            self.lexer, lexer_name = None, "text"
        self.name = escape(lexer_name)

    def __call__(self, source, language=None, metadata=None):
        """HTML of `source`; `language` and `metadata` (the notebook's and the cell's) are ignored."""
        from pygments import format as render
        from pygments.formatters import HtmlFormatter

        source = str(source).strip() or " "
        formatter = HtmlFormatter(cssclass=f" highlight hl-{self.name}")
        return render(self._tokens(source + "\n"), formatter)

    def _tokens(self, source):
        from pygments.token import Text

        if self.lexer is None or len(source) > MAX_HIGHLIGHT_CHARS or _PAGE["left_s"] <= 0:
            yield Text, source
            return
        start = time.monotonic()
        deadline = start + _PAGE["left_s"]
        end = 0
        try:
            for pos, kind, value in self.lexer.get_tokens_unprocessed(source):
                if time.monotonic() > deadline:
                    _PAGE["left_s"] = 0.0
                    yield Text, source[pos:]
                    return
                end = pos + len(value)
                yield kind, value
            if end < len(source):
                yield Text, source[end:]
        finally:
            _PAGE["left_s"] = max(0.0, _PAGE["left_s"] - (time.monotonic() - start))
