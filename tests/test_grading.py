"""longctx.grading: accepts every honest answer, rejects liars, and teaches in its messages."""

import builtins
import math
import multiprocessing
import os
import sys
import threading

import numpy as np
import pytest

from longctx import grading
from longctx.grading import check_array, check_integer, check_number, check_true

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "autograder"))
import checker  # noqa: E402
import plaindata  # noqa: E402

torch = pytest.importorskip("torch")


# ---------------------------------------------------------------- honest answers of every type pass
@pytest.mark.parametrize("answer", [
    2048, 2048.0, np.float64(2048), np.float32(2048), np.int64(2048), np.int32(2048), np.uint16(2048),
    np.array(2048.0), np.array([2048]), torch.tensor(2048.0), torch.tensor([2048]),
    torch.tensor(2048, dtype=torch.int64), torch.tensor([2048.0], requires_grad=True),
    2048 * (1 + 5e-3),
])
def test_honest_numbers_pass(answer):
    assert check_number("x", answer, 2048, answer_kind="function") is None
    assert check_number("x", answer, 2048, answer_kind="value") is None


def test_expected_may_be_numpy_and_tolerances_apply():
    assert check_number("x", 1.0, np.float64(1.0), answer_kind="function") is None
    assert check_number("x", 0.0, 0.0, answer_kind="function") is None
    assert check_number("x", 1e-9, 0.0, answer_kind="function", abs_tol=1e-6) is None
    with pytest.raises(AssertionError):
        check_number("x", 1e-3, 0.0, answer_kind="function", abs_tol=1e-6)
    with pytest.raises(AssertionError):
        check_number("x", 1.02, 1.0, answer_kind="function")  # default rel_tol 1 %
    assert check_number("x", 1.02, 1.0, answer_kind="function", rel_tol=0.05) is None
    assert check_number("x", -3.0, -3.0, answer_kind="function") is None


@pytest.mark.parametrize("answer", [4096, 4096.0, np.int64(4096), np.float32(4096), torch.tensor([4096])])
def test_check_integer_accepts_integral_values(answer):
    assert check_integer("n", answer, 4096, answer_kind="function") is None


def test_check_integer_rejects_fractions_and_big_ints_compare_exactly():
    with pytest.raises(AssertionError, match="not a whole number"):
        check_integer("n", 4096.5, 4096, answer_kind="function")
    with pytest.raises(AssertionError, match="off by one"):
        check_integer("n", 17, 16, answer_kind="function")
    big = 2**60 + 1
    assert check_integer("n", big, big, answer_kind="function") is None
    with pytest.raises(AssertionError):
        check_integer("n", 2**60, big, answer_kind="function")


@pytest.mark.parametrize("answer", [
    [[0, 1, 2], [3, 4, 5]], ((0, 1, 2), (3, 4, 5)), np.arange(6).reshape(2, 3),
    np.arange(6, dtype=np.float32).reshape(2, 3), torch.arange(6.0).reshape(2, 3),
    [np.float64(0), 1, 2.0],
])
def test_check_array_accepts_lists_arrays_tensors(answer):
    expected = np.arange(6).reshape(2, 3)
    if isinstance(answer, list) and len(answer) == 3:
        expected = [0, 1, 2]
    assert check_array("a", answer, expected, answer_kind="function") is None


def test_check_array_shape_and_elements():
    with pytest.raises(AssertionError, match="shape"):
        check_array("a", [1, 2, 3], [[1, 2, 3]], answer_kind="function")
    with pytest.raises(AssertionError, match="(?s)1 of 3 elements.*flat index 2"):
        check_array("a", [1, 2, 30], [1, 2, 3], answer_kind="function")
    with pytest.raises(AssertionError, match="ragged"):
        check_array("a", [[1, 2], [3]], [[1, 2], [3, 4]], answer_kind="function")


def test_check_true():
    assert check_true("c", True, "m") is None
    assert check_true("c", np.bool_(True), "m") is None
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
        check_number("x", liar, 2048, answer_kind="function")


def test_lying_subclasses_are_read_at_their_real_value():
    with pytest.raises(AssertionError, match="got 0"):
        check_number("x", LyingFloat(0.0), 2048, answer_kind="function")
    # an honest value inside a subclass is still an honest value
    assert check_number("x", LyingFloat(2048.0), 2048, answer_kind="function") is None
    with pytest.raises(AssertionError):
        check_integer("n", LyingInt(7), 4096, answer_kind="function")
    assert check_integer("n", LyingInt(4096), 4096, answer_kind="function") is None


def test_tensor_subclass_and_list_subclass_are_not_trusted():
    t = torch.tensor([0.0]).as_subclass(LyingTensor)
    with pytest.raises(AssertionError):
        check_number("x", t, 2048, answer_kind="function")
    with pytest.raises(AssertionError):
        check_array("a", LyingList([9, 9]), [0, 1, 2], answer_kind="function")


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
            _outcome(check_number, "x", 1.0, 2048, answer_kind="function"),
            _outcome(check_array, "a", [9.0, 9.0], [1.0, 2.0], answer_kind="function"),
            _outcome(check_integer, "n", 1, 2, answer_kind="function"),
            _outcome(check_number, "x", 2048.0, 2048, answer_kind="function"),
            _outcome(check_array, "a", [1.0, 2.0], [1.0, 2.0], answer_kind="function"),
        ]
    finally:
        for name, value in saved.items():
            setattr(builtins, name, value)
    assert outcomes == ["failed", "failed", "failed", None, None]


def test_fresh_copy_undoes_a_patched_module(monkeypatch):
    """The grader reloads grading.py from its file before each test cell (see autograder/)."""
    import importlib.util

    monkeypatch.setattr(grading, "check_number", lambda *a, **k: None)
    spec = importlib.util.spec_from_file_location("longctx.grading", grading.__file__)
    fresh = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(fresh)
    with pytest.raises(AssertionError):
        fresh.check_number("x", 1.0, 2.0, answer_kind="value")


def test_grading_imports_nothing_but_itself():
    """No numpy, torch, engine or model: the package imports only its own modules (and functools)."""
    import pathlib

    for path in pathlib.Path(grading.__file__).parent.glob("*.py"):
        src = path.read_text()
        imports = [line.strip() for line in src.splitlines() if line.strip().startswith(("import ", "from "))]
        assert all(line.startswith("from longctx.grading") or line == "import functools"
                   for line in imports), (path.name, imports)
        assert "longctx.engine" not in src and "longctx.model" not in src


# ---------------------------------------------------------------- messages teach
@pytest.mark.parametrize("got, expected, needle", [
    (2e9, 2**31, "GiB and GB"),
    (2048e3, 2048, "factor of (about )?1000"),
    (2048e9, 2048, r"10\^9"),
    (4096.0, 2048, "causal"),
    (1024.0, 2048, "too small by a factor of 2|about 2x too small"),
    (-2048.0, 2048, "sign"),
    (2048 * 8, 2048, "bits vs bytes"),
])
@pytest.mark.parametrize("answer_kind", ["function", "value"])
def test_messages_name_the_likely_mistake(got, expected, needle, answer_kind):
    with pytest.raises(AssertionError, match=needle):
        check_number("KV cache", got, expected, answer_kind=answer_kind, unit="bytes")


@pytest.mark.parametrize("answer_kind, got, generic_words", [
    ("function", 4, "query heads vs KV heads"),   # 8 tokens short of 12: a ratio of 3, read as GQA
    ("value", 12_000, "unit slip"),                # 1000x: the coarse message's unit slip
])
def test_the_exercises_own_hint_comes_before_a_generic_slip(answer_kind, got, generic_words):
    # the test's own hint knows the exercise and is shown first; the generic guess follows as a second one
    with pytest.raises(AssertionError) as info:
        check_integer("token budget", got, 12, answer_kind=answer_kind,
                      hint="the chunk is the budget less the decodes")
    text = str(info.value)
    own, generic = text.find("the chunk is the budget less the decodes"), text.find(generic_words)
    assert 0 <= own < generic, text
    assert "If that is not it, a common slip of this size" in text
    with pytest.raises(AssertionError) as info:   # without a hint of its own, the generic one is the hint
        check_integer("token budget", got, 12, answer_kind=answer_kind)
    assert "Hint: " in str(info.value) and "If that is not it" not in str(info.value)


def test_function_message_has_name_values_units_ratio_and_hint():
    with pytest.raises(AssertionError) as info:
        check_number("TTFT", 0.5, 0.25, answer_kind="function", unit="s", hint="prefill is the whole prompt")
    text = str(info.value)
    for part in ("TTFT", "0.5 s", "0.25 s", "2x", "+100%", "prefill is the whole prompt"):
        assert part in text, (part, text)


def test_value_message_has_name_answer_unit_direction_factor_and_hint_but_not_the_expected_value():
    with pytest.raises(AssertionError) as info:
        check_number("TTFT", 0.5, 0.25, answer_kind="value", unit="s", hint="prefill is the whole prompt")
    text = str(info.value)
    for part in ("TTFT", "0.5 s", "about 2x too large", "factor of 2", "prefill is the whole prompt"):
        assert part in text, (part, text)
    assert "0.25" not in text and "expected" not in text and "+100" not in text, text


# ---------------------------------------------------------------- the plain-data boundary of `make grade`

@pytest.mark.parametrize("value", [None, True, 0, -7, 2**80, 1.5, "héllo", [1, [2.5, None]], (1, "a"),
                                   {256: 0.031, "k": [1, 2], (1, 2): None},
                                   np.arange(6, dtype=np.int32).reshape(2, 3),
                                   np.float32(1.25), np.int64(7), np.bool_(True), [math.inf, -math.inf]])
def test_plain_data_round_trip_keeps_types(value):
    back = plaindata.decode(plaindata.loads(plaindata.dumps(plaindata.encode(value))))
    if isinstance(value, np.ndarray):
        assert back.dtype == value.dtype and back.shape == value.shape and (back == value).all()
    else:
        assert back == value and type(back) is type(value)


def test_plain_data_nan_and_tensors():
    assert math.isnan(plaindata.decode(plaindata.encode(float("nan"))))
    torch = pytest.importorskip("torch")
    back = plaindata.decode(plaindata.encode(torch.tensor([1.5, 2.5])))
    assert isinstance(back, np.ndarray) and back.tolist() == [1.5, 2.5]


class _Liar(int):
    def __eq__(self, other):
        return True

    __hash__ = int.__hash__


@pytest.mark.parametrize("value, words", [(object(), "answer is a object"), (_Liar(3), "_Liar"),
                                          ([1, lambda: 0], r"answer\[1\] is a function"),
                                         ({object(): 1}, "key"),
                                          (np.array(["a"]), "dtype"), ([0] * 3_000_000, "values")])
def test_plain_data_refuses_objects_with_a_clear_message(value, words):
    with pytest.raises(plaindata.NotPlainData, match=words):
        plaindata.encode(value, "answer")


@pytest.mark.parametrize("text", ['{"$": "x", "v": 1}', '[1, 2]', '{"a": 1}',
                                  '{"$": "nd", "dtype": "object", "shape": [1], "v": [1]}', 'NaN',
                                  '{"$": "nd", "dtype": "int8", "shape": [2], "v": [1]}',
                                  '{"$": "d", "v": [[{"$": "l", "v": []}, 1]]}'])
def test_plain_data_decoding_is_strict(text):
    with pytest.raises(ValueError):
        plaindata.decode(plaindata.loads(text))


def test_checker_plan_asks_the_kernel_only_for_notebook_names():
    test = ("from longctx.grading import check_number\nfor t in (1, 2):\n"
            "    check_number('x', f(t), g(t), answer_kind='function')\n"
            "check_number('y', answer, memory.kv(specs.get_model('m')), answer_kind='value')\n"
            "local = 3\nprint(local, len([1]))")
    lesson = ["from longctx import memory, specs\nimport numpy as np", "def f(t):\n    return t",
              "answer = 4", "g = lambda t: t"]
    plan = checker.plan(test, lesson)
    assert plan == {"imports": ["from longctx import memory", "from longctx import specs"],
                    "kernel_names": ["answer", "f", "g"]}


class _FakeKernel(threading.Thread):
    """Answers a checker's requests like the kernel's plaindata.serve, from a dict of 'notebook' names."""

    def __init__(self, conn, names):
        super().__init__(daemon=True)
        self.conn, self.names, self.seen = conn, names, []

    def run(self):
        while True:
            try:
                kind, payload = self.conn.recv()
            except EOFError:
                return
            if kind == "verdict":
                self.verdict = payload
                return
            request = plaindata.loads(payload)
            self.seen.append(request)
            value = self.names.get(request.get("name"))
            if request["op"] == "describe":
                if request["name"] not in self.names:
                    reply = {"ok": True, "kind": "missing"}
                elif callable(value):
                    reply = {"ok": True, "kind": "function"}
                else:
                    try:
                        reply = {"ok": True, "kind": "value", "value": plaindata.encode(value)}
                    except plaindata.NotPlainData as exc:
                        reply = {"ok": True, "kind": "other", "type": type(value).__name__, "why": str(exc)}
            else:
                result = value(*plaindata.decode(request["args"]), **plaindata.decode(request["kwargs"]))
                reply = {"ok": True, "value": plaindata.encode(result)}
            self.conn.send(plaindata.dumps(reply))


def _check(source, names, lesson=()):
    ours, theirs = multiprocessing.Pipe()
    kernel = _FakeKernel(ours, names)
    kernel.start()
    spec = dict(checker.plan(source, list(lesson)), source=source, grade_id="t")
    saved = sys.stdout, sys.stderr
    try:
        checker.run_check(theirs, spec)
    finally:
        sys.stdout, sys.stderr = saved
    kernel.join(10)
    return kernel.verdict, kernel.seen


TEST = ("from longctx.grading import check_number, check_integer\n"
        "check_number('kv(3)', kv(3), 6, answer_kind='function')\n"
        "check_integer('answer', answer, 42, answer_kind='value')\n"
        "### BEGIN HIDDEN TESTS\ncheck_number('kv(1000)', kv(1000), 2000, answer_kind='function')\n"
        "### END HIDDEN TESTS")


def test_checker_passes_right_answers_and_never_sends_the_test_source():
    verdict, seen = _check(TEST, {"kv": lambda n: 2 * n, "answer": np.int64(42)})
    assert verdict["passed"], verdict
    assert all("check_" not in plaindata.dumps(r) and "HIDDEN" not in plaindata.dumps(r) for r in seen)
    assert {r["op"] for r in seen} == {"describe", "call"}


@pytest.mark.parametrize("names, ename, words", [
    ({"kv": lambda n: 2 * n + 1, "answer": 42}, "AssertionError", "kv(3)"),
    ({"kv": lambda n: 2 * n, "answer": 41}, "AssertionError", "too small, by 1 to 3"),
    ({"kv": lambda n: 2 * n}, "NameError", "answer"),
    ({"kv": lambda n: 2 * n, "answer": object()}, "NotPlainData", "`answer` is not plain data"),
    ({"kv": lambda n: 2 * n if n < 100 else 0, "answer": 42}, "AssertionError", "kv(1000)"),
])
def test_checker_fails_wrong_missing_and_non_plain_answers(names, ename, words):
    verdict, _ = _check(TEST, names)
    assert not verdict["passed"] and verdict["ename"] == ename and words in verdict["evalue"], verdict
