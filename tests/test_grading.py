"""longctx.grading: accepts every honest answer, rejects liars, and teaches in its messages."""

import builtins
import math

import numpy as np
import pytest

from longctx import grading
from longctx.grading import check_array, check_integer, check_number, check_true

torch = pytest.importorskip("torch")


# ---------------------------------------------------------------- honest answers of every type pass
@pytest.mark.parametrize("answer", [
    2048, 2048.0, np.float64(2048), np.float32(2048), np.int64(2048), np.int32(2048), np.uint16(2048),
    np.array(2048.0), np.array([2048]), torch.tensor(2048.0), torch.tensor([2048]),
    torch.tensor(2048, dtype=torch.int64), torch.tensor([2048.0], requires_grad=True),
    2048 * (1 + 5e-3),
])
def test_honest_numbers_pass(answer):
    assert check_number("x", answer, 2048) is True


def test_expected_may_be_numpy_and_tolerances_apply():
    assert check_number("x", 1.0, np.float64(1.0))
    assert check_number("x", 0.0, 0.0)
    assert check_number("x", 1e-9, 0.0, abs_tol=1e-6)
    with pytest.raises(AssertionError):
        check_number("x", 1e-3, 0.0, abs_tol=1e-6)
    with pytest.raises(AssertionError):
        check_number("x", 1.02, 1.0)  # default rel_tol 1 %
    assert check_number("x", 1.02, 1.0, rel_tol=0.05)
    assert check_number("x", -3.0, -3.0)


@pytest.mark.parametrize("answer", [4096, 4096.0, np.int64(4096), np.float32(4096), torch.tensor([4096])])
def test_check_integer_accepts_integral_values(answer):
    assert check_integer("n", answer, 4096)


def test_check_integer_rejects_fractions_and_big_ints_compare_exactly():
    with pytest.raises(AssertionError, match="not a whole number"):
        check_integer("n", 4096.5, 4096)
    with pytest.raises(AssertionError, match="off by one"):
        check_integer("n", 17, 16)
    big = 2**60 + 1
    assert check_integer("n", big, big)
    with pytest.raises(AssertionError):
        check_integer("n", 2**60, big)


@pytest.mark.parametrize("answer", [
    [[0, 1, 2], [3, 4, 5]], ((0, 1, 2), (3, 4, 5)), np.arange(6).reshape(2, 3),
    np.arange(6, dtype=np.float32).reshape(2, 3), torch.arange(6.0).reshape(2, 3),
    [np.float64(0), 1, 2.0],
])
def test_check_array_accepts_lists_arrays_tensors(answer):
    expected = np.arange(6).reshape(2, 3)
    if isinstance(answer, list) and len(answer) == 3:
        expected = [0, 1, 2]
    assert check_array("a", answer, expected)


def test_check_array_shape_and_elements():
    with pytest.raises(AssertionError, match="shape"):
        check_array("a", [1, 2, 3], [[1, 2, 3]])
    with pytest.raises(AssertionError, match="(?s)1 of 3 elements.*flat index 2"):
        check_array("a", [1, 2, 30], [1, 2, 3])
    with pytest.raises(AssertionError, match="ragged"):
        check_array("a", [[1, 2], [3]], [[1, 2], [3, 4]])


def test_check_true():
    assert check_true("c", True, "m")
    assert check_true("c", np.bool_(True), "m")
    with pytest.raises(AssertionError, match="c: the cache must shrink"):
        check_true("c", False, "the cache must shrink")
    with pytest.raises(AssertionError):
        check_true("c", 1, "must be a real bool")


# ---------------------------------------------------------------- hostile answers earn nothing
class AlwaysEqual:
    def __eq__(self, other):
        return True

    def __ne__(self, other):
        return False

    def __float__(self):
        return 2048.0

    def __index__(self):
        return 2048

    __hash__ = object.__hash__


class LyingFloat(float):
    """Stores 0.0 but claims to be whatever it is compared with."""

    def __eq__(self, other):
        return True

    def __float__(self):
        return 2048.0

    def __sub__(self, other):
        return 0.0

    def __rsub__(self, other):
        return 0.0

    def __abs__(self):
        return 0.0

    def __lt__(self, other):
        return True

    def __le__(self, other):
        return True

    __hash__ = float.__hash__


class LyingInt(int):
    def __eq__(self, other):
        return True

    def __int__(self):
        return 4096

    def __index__(self):
        return 4096

    __hash__ = int.__hash__


class LyingList(list):
    def __len__(self):
        return 3

    def __iter__(self):
        return iter([0, 1, 2])


class LyingTensor(torch.Tensor):
    def item(self):
        return 2048.0


@pytest.mark.parametrize("liar", [AlwaysEqual(), LyingFloat(0.0), "2048", b"2048", None, [2048], True,
                                  np.bool_(True), float("nan"), float("inf"), 1 + 0j, np.array([1.0, 2.0]),
                                  torch.tensor([2048.0, 0.0])])
def test_hostile_or_wrong_objects_fail(liar):
    with pytest.raises(AssertionError):
        check_number("x", liar, 2048)


def test_lying_subclasses_are_read_at_their_real_value():
    with pytest.raises(AssertionError, match="got 0"):
        check_number("x", LyingFloat(0.0), 2048)
    # an honest value inside a subclass is still an honest value
    assert check_number("x", LyingFloat(2048.0), 2048)
    with pytest.raises(AssertionError):
        check_integer("n", LyingInt(7), 4096)
    assert check_integer("n", LyingInt(4096), 4096)


def test_tensor_subclass_and_list_subclass_are_not_trusted():
    t = torch.tensor([0.0]).as_subclass(LyingTensor)
    with pytest.raises(AssertionError):
        check_number("x", t, 2048)
    with pytest.raises(AssertionError):
        check_array("a", LyingList([9, 9]), [0, 1, 2])


def _outcome(fn, *args, **kwargs):
    try:
        return fn(*args, **kwargs)
    except AssertionError:
        return "failed"


def test_monkey_patched_helpers_do_not_matter(monkeypatch):
    monkeypatch.setattr(np, "isclose", lambda *a, **k: True)
    monkeypatch.setattr(np, "allclose", lambda *a, **k: True)
    monkeypatch.setattr(math, "isclose", lambda *a, **k: True)
    monkeypatch.setattr(torch, "allclose", lambda *a, **k: True)
    saved = {name: getattr(builtins, name) for name in ("abs", "float", "int", "range", "isinstance", "len")}
    try:  # patch builtins only around the calls: pytest itself needs them
        builtins.abs = lambda x: 0
        builtins.float = lambda x: 2048.0
        builtins.int = lambda x: 2048
        builtins.range = lambda *a: []
        builtins.isinstance = lambda *a: True
        outcomes = [
            _outcome(check_number, "x", 1.0, 2048),
            _outcome(check_array, "a", [9.0, 9.0], [1.0, 2.0]),
            _outcome(check_integer, "n", 1, 2),
            _outcome(check_number, "x", 2048.0, 2048),
            _outcome(check_array, "a", [1.0, 2.0], [1.0, 2.0]),
        ]
    finally:
        for name, value in saved.items():
            setattr(builtins, name, value)
    assert outcomes == ["failed", "failed", "failed", True, True]


def test_fresh_copy_undoes_a_patched_module(monkeypatch):
    """The grader reloads grading.py from its file before each test cell (see autograder/)."""
    import importlib.util

    monkeypatch.setattr(grading, "check_number", lambda *a, **k: True)
    spec = importlib.util.spec_from_file_location("longctx.grading", grading.__file__)
    fresh = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(fresh)
    with pytest.raises(AssertionError):
        fresh.check_number("x", 1.0, 2.0)


def test_grading_imports_no_numpy_or_torch_at_top():
    src = open(grading.__file__).read()
    top = [line for line in src.splitlines() if line.startswith(("import ", "from "))]
    assert top == [], top
    assert "longctx.engine" not in src and "longctx.model" not in src


# ---------------------------------------------------------------- messages teach
@pytest.mark.parametrize("got, expected, needle", [
    (2e9, 2**31, "GiB and GB"),
    (2048e3, 2048, "factor of 1000"),
    (2048e9, 2048, r"10\^9"),
    (4096.0, 2048, "causal"),
    (1024.0, 2048, "too small by a factor of 2"),
    (-2048.0, 2048, "sign"),
    (2048 * 8, 2048, "bits vs bytes"),
])
def test_messages_name_the_likely_mistake(got, expected, needle):
    with pytest.raises(AssertionError, match=needle):
        check_number("KV cache", got, expected, unit="bytes")


def test_message_has_name_values_units_ratio_and_hint():
    with pytest.raises(AssertionError) as info:
        check_number("TTFT", 0.5, 0.25, unit="s", hint="prefill is the whole prompt")
    text = str(info.value)
    for part in ("TTFT", "0.5 s", "0.25 s", "2x", "+100%", "prefill is the whole prompt"):
        assert part in text, (part, text)
