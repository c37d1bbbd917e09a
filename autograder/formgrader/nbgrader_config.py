"""nbgrader configuration for the formgrader (grading written answers by hand): the course's own
configuration (autograder/nbgrader_config.py), and the formgrader's view of a submission sanitized.

nbgrader's formgrader (JupyterLab's Nbgrader > Formgrader panel) reads `nbgrader_config.py` from the
folder the Jupyter server starts in; autograder/formgrade.sh starts it here, on the repository root:

    cd autograder/formgrader && ../../.venv/bin/jupyter lab --ServerApp.root_dir=../..

The formgrader renders the autograded notebook as HTML in the instructor's browser: a student's Markdown
(`<script>`, `<img onerror=...>`) and HTML or JavaScript outputs would run there. SafeFormgrader shows
them as text, as in the feedback (autograder/feedback_safety.py), within the same page caps; code is
highlighted by the course configuration's bounded filter (autograder/highlighting.py: the lessons' lexer,
20,000 characters a cell, 2 s a page), since the page is rendered inside the instructor's Jupyter server,
which answers nothing else meanwhile.
"""

import os

c = get_config()  # noqa: F821  (provided by traitlets when it loads this file)
load_subconfig("nbgrader_config.py", path=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # noqa: F821

from feedback_safety import SafeFormgrader  # noqa: E402  (importable once the course configuration ran)

c.HTMLExporter.preprocessors = [SafeFormgrader]
