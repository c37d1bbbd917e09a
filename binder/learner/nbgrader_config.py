"""The learner's nbgrader settings for the Validate button: `make lab` and Binder put this folder on
JUPYTER_CONFIG_PATH, where the button's validator looks. Each cell gets the grader's time limit (120 s a
cell; nbgrader's own default, 30 s, interrupts the course's longer cells before they finish). Each lesson
folder carries the same settings for `nbgrader validate` run from a terminal there."""

c = get_config()  # noqa: F821  (provided by traitlets when nbgrader loads this file)
c.Execute.timeout = 120
c.Execute.interrupt_on_timeout = True
