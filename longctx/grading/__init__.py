"""Checks used by the notebooks' test cells, with messages that teach without handing out the answer.

    check_number(name, answer, expected, *, answer_kind, rel_tol=1e-2, abs_tol=0.0, unit="", hint="")
    check_integer(name, answer, expected, *, answer_kind, hint="")
    check_array(name, answer, expected, *, answer_kind, rel_tol=1e-2, abs_tol=0.0, unit="", hint="")
    check_true(name, condition, message)

Each returns None when the answer passes, so a passing test cell displays nothing, and raises
AssertionError with a message when it does not.

**What a failure message shows: `answer_kind`** (required; a check without it raises TypeError).

- ``answer_kind="value"``: the checked name is itself the answer (``mlp_weight_mib``, a number the learner
  derives). A failure never reveals the expected value to within the tolerance: not directly, not as an
  exact ratio, not as an exact offset. It says the answer, the unit, the direction, a coarse factor
  ("too large, by 10 % to 50 %", "about 2x too small", "roughly 1000x too large", for integers "by 1 to
  3") and the classic slip of that factor ("about 1000x: a unit slip?"). The words come from cutting the
  number line, for the learner's answer, into regions that depend only on the answer and the tolerance,
  each at least six tolerance widths wide (an integer region: at least three integers); a narrower region
  is merged with a neighbour and named more coarsely, down to the direction alone (_coarse.py).
  Arithmetic on a message's numbers (answer x factor, answer + offset, a percentage) therefore cannot
  recover the expected value: whatever it lands on, expected values more than the tolerance away give
  the very same message. (An answer exactly a coarse factor off does land on the expected value when
  divided by that factor: that is the slip the message names, and undoing it is the fix.)
- ``answer_kind="function"``: the answer is what the learner's function returned on inputs the test chose
  (``tensor_bytes((2, 3), 4)``). The message shows everything: the answer, the expected value, their
  ratio and offset, the slip hint. Hidden tests call the function on other inputs, so the expected result
  on the visible ones gives nothing away.

The test author's `hint` is shown as written: for a value answer it must not quote the expected value
either (tests/test_grading_policy.py checks the lessons' hints). `check_true` has no expected value; its
message is the test's own words.

**Reading answers.** Every check converts the learner's answer to plain Python numbers *itself* and
compares those, so an object that overrides ``__eq__``, ``__float__`` or ``__abs__`` earns nothing. It
never calls a helper a notebook could monkey-patch (``numpy.isclose``, ``math.isclose``,
``torch.allclose``, builtins such as ``abs`` or ``float``): the pass/fail decision uses only methods of the
built-in ``int`` and ``float`` types, which Python does not let anyone change. Accepted answers: ``int``,
``float`` (and their subclasses, read through the built-in type so a lying subclass is read at its real
value), numpy scalars and 0-d / one-element arrays, one-element torch tensors. Rejected with a clear
message: ``bool``, ``None``, strings, NaN / infinity, any other object. The package imports neither numpy
nor torch (see _plain.py).

In `make lab` these checks run in the learner's own kernel and teach. In `make grade` a test cell never
runs in the student's kernel: it runs in a separate, pristine checker process that has this package from
the instructor's library and receives only plain data from the notebook (values, results of calling the
student's functions); see autograder/README.md. The defensive conversions still matter there: numpy
scalars and arrays arrive as numpy values and must be read exactly.
"""

from longctx.grading.checks import ANSWER_KINDS, check_array, check_integer, check_number, check_true

__all__ = ["ANSWER_KINDS", "check_number", "check_integer", "check_array", "check_true"]
