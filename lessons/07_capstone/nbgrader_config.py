"""Your side of nbgrader, for this lesson's folder: `nbgrader validate <lesson>.ipynb`, run in this folder,
reads this file. It gives each cell the grader's time limit (120 s a cell; nbgrader's own default, 30 s,
interrupts this course's longer cells before they finish)."""

c = get_config()  # noqa: F821  (provided by traitlets when nbgrader loads this file)
c.Execute.timeout = 120
c.Execute.interrupt_on_timeout = True
