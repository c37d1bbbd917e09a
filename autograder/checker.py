"""Run one test cell in a pristine checker process that gets only plain data from the student's kernel.

The grader (autograder/grade.py) starts a multiprocessing fork server before any submission is read,
with this module and the instructor's `longctx` preloaded from the course root; each graded test cell
runs in a fresh child of that server (`run_check`). The child executes the instructor's test-cell
source from `solutions/` (hidden tests included) in a new namespace where:

- names the lesson binds only by `import` statements (`specs`, `flops`, `memory`, ...) are imported
  here, from the instructor's library;
- names the student's kernel defines are fetched from the kernel as plain data (see plaindata.py):
  values arrive decoded; functions become `StudentFunction` proxies (each call sends plain-data
  arguments to the kernel, which calls the student's function and sends back a plain-data result);
  classes become `StudentClass` proxies whose instances offer `decide(state)` (lesson 02's scheduler,
  evaluated in the kernel by `longctx.lessons.policy_state.decide`);
- anything else (a figure, an engine, a custom object) fails the test with "X is not plain data".

The child never sees the student's objects, only their plain-data answers, so nothing the notebook does
in its own interpreter (patched modules, hooks, lying tensors, input transformers) can change a check,
its expected values or its verdict. The verdict goes back to the grader over a multiprocessing pipe.
"""

from __future__ import annotations

import builtins
import io
import sys
import time
import traceback
import warnings

import cgroups
import plaindata
from checkplan import free_names, lesson_bindings, plan  # noqa: F401  (the grader plans with checker.plan)

MAX_CAPTURED_CHARS = 20_000


# ----------------------------------------------------------------------------- the checker child
class KernelError(Exception):
    """The student's code raised an exception in their kernel (reported with its own name)."""

    def __init__(self, ename, evalue):
        super().__init__(f"{ename}: {evalue}")
        self.ename, self.evalue = ename, evalue


class _Channel:
    """Requests to the student's kernel, relayed by the grader; replies are decoded strictly."""

    def __init__(self, conn):
        self.conn = conn
        self.calls = 0

    def ask(self, request):
        self.calls += 1
        self.conn.send(("kernel", plaindata.dumps(request)))
        text = self.conn.recv()
        if type(text) is not str:
            raise RuntimeError("the grader relayed an unexpected reply")
        if text.startswith("!"):  # a problem the executor or the grader saw (timeout, dead kernel, size)
            raise KernelError("StudentCodeError", text[1:])
        try:
            reply = plaindata.loads(text)
            if type(reply) is not dict or type(reply.get("ok")) is not bool:
                raise ValueError("not a reply object")
        except Exception as exc:  # noqa: BLE001
            raise KernelError("StudentCodeError", f"the notebook's kernel sent a malformed answer ({exc})") \
                from None
        if not reply["ok"]:
            if "notplain" in reply:
                raise NotPlainDataError(str(reply["notplain"])[:2000])
            raise KernelError(_identifier(reply.get("ename")), str(reply.get("evalue", ""))[:2000])
        return reply

    def value(self, reply, what):
        try:
            return plaindata.decode(reply.get("value"))
        except Exception as exc:  # noqa: BLE001
            raise NotPlainDataError(f"{what}: the kernel sent malformed data ({exc})") from None


class NotPlainDataError(Exception):
    """A value the test needs is not plain data (so the checker cannot receive it)."""


def _identifier(name):
    name = str(name or "Error")[:80]
    return name if name.isidentifier() else "Error"


def _args_text(args, kwargs):
    parts = [repr(a) for a in args] + [f"{k}={v!r}" for k, v in kwargs.items()]
    text = ", ".join(parts)
    return text if len(text) <= 200 else text[:200] + "..."


class StudentFunction:
    """Stands for a function defined in the student's notebook: calls it there on plain data."""

    def __init__(self, channel, name, ref=None):
        self._channel, self._name, self._ref = channel, name, ref

    def __call__(self, *args, **kwargs):
        what = f"{self._name}({_args_text(args, kwargs)})"
        try:
            request = {"op": "call", "args": plaindata.encode(list(args), "argument"),
                       "kwargs": plaindata.encode(dict(kwargs), "argument"),
                       "what": f"what {self._name} returned"}
        except plaindata.NotPlainData as exc:  # a test that passes objects: a lesson bug, said plainly
            raise TypeError(
                f"the test passes {exc} to {self._name}; tests may pass only plain data") from None
        request["name"] = self._name
        reply = self._channel.ask(request)
        return self._channel.value(reply, what)

    def __repr__(self):
        return f"<the student's {self._name}>"


class StudentObject:
    """An instance living in the student's kernel; lesson 02's scheduler answers `decide(state)`.

    Its attributes are the keyword arguments the test itself passed to the constructor (e.g.
    `token_budget`): the checker's own values, never read back from the student's object.
    """

    def __init__(self, channel, name, ref, init_kwargs=None):
        self._channel, self._name, self._ref = channel, name, ref
        self._init_kwargs = dict(init_kwargs or {})

    def __getattr__(self, attr):
        if attr.startswith("_") or attr not in self.__dict__.get("_init_kwargs", {}):
            raise AttributeError(f"the checker's stand-in for {self.__dict__.get('_name', '?')} has no "
                                 f"attribute {attr!r} (only decide(state) and the constructor's keyword "
                                 "arguments)")
        return self._init_kwargs[attr]

    def decide(self, state):
        try:
            encoded = plaindata.encode(state, "state")
        except plaindata.NotPlainData as exc:
            raise TypeError(f"the test passes {exc} to {self._name}.decide") from None
        reply = self._channel.ask({"op": "decide", "ref": self._ref, "state": encoded})
        return self._channel.value(reply, f"{self._name}.decide(...)")

    def __repr__(self):
        return f"<the student's {self._name} instance>"


class StudentClass:
    """Stands for a class defined in the student's notebook: instantiates it there."""

    def __init__(self, channel, name):
        self._channel, self._name = channel, name

    def __call__(self, *args, **kwargs):
        try:
            request = {"op": "new", "name": self._name, "args": plaindata.encode(list(args), "argument"),
                       "kwargs": plaindata.encode(dict(kwargs), "argument")}
        except plaindata.NotPlainData as exc:
            raise TypeError(
                f"the test passes {exc} to {self._name}(); tests may pass only plain data") from None
        reply = self._channel.ask(request)
        if type(reply.get("ref")) is not int:
            raise KernelError("StudentCodeError", f"{self._name}(...) did not create an object")
        return StudentObject(self._channel, self._name, reply["ref"], kwargs)

    def __repr__(self):
        return f"<the student's class {self._name}>"


def _resolve(channel, name, namespace):
    reply = channel.ask({"op": "describe", "name": name})
    kind = reply.get("kind")
    if kind == "missing":
        return
    if kind == "function":
        namespace[name] = StudentFunction(channel, name)
    elif kind == "class":
        namespace[name] = StudentClass(channel, name)
    elif kind == "value":
        namespace[name] = channel.value(reply, name)
    else:
        why = str(reply.get("why") or "")[:300]
        raise NotPlainDataError(f"`{name}` is not plain data (a {str(reply.get('type', '?'))[:100]}"
                                + (f"; {why}" if why and "not plain data" not in why else "")
                                + "): a test can only read numbers, strings, booleans, None, lists, tuples, "
                                "dicts and numpy arrays from the notebook")


def _cap(text):
    return text if len(text) <= MAX_CAPTURED_CHARS else text[:MAX_CAPTURED_CHARS] + "\n[... output cut ...]\n"


def run_check(conn, spec):
    """Child entry point: run spec["source"] with spec["imports"] and kernel names; send the verdict."""
    cgroups.limit_process(spec.get("limits"))
    out = io.StringIO()
    sys.stdout = sys.stderr = out
    warnings.simplefilter("ignore")
    channel = _Channel(conn)
    namespace = {"__name__": "__main__", "__builtins__": builtins}
    verdict = {"passed": False, "ename": "", "evalue": "", "stdout": "", "calls": 0, "infra": False}
    start = time.monotonic()
    try:
        for stmt in spec["imports"]:
            try:
                exec(compile(stmt, "<lesson import>", "exec"), namespace)  # noqa: S102 (instructor's code)
            except Exception as exc:  # noqa: BLE001
                verdict["infra"] = True
                raise RuntimeError(f"the checker could not run the lesson's `{stmt}`: {exc}") from None
        for name in spec["kernel_names"]:
            _resolve(channel, name, namespace)
        code = compile(spec["source"], f"<test {spec.get('grade_id', '?')}>", "exec")
        exec(code, namespace)  # noqa: S102  (the instructor's test cell, from solutions/)
        verdict["passed"] = True
    except KernelError as exc:
        verdict.update(ename=exc.ename, evalue=exc.evalue)
    except NotPlainDataError as exc:
        verdict.update(ename="NotPlainData", evalue=str(exc))
    except BaseException as exc:  # noqa: BLE001  (AssertionError from a check, NameError, ...)
        verdict.update(ename=type(exc).__name__, evalue=str(exc)[:4000])
        if not isinstance(exc, (AssertionError, NameError, TypeError, ValueError)):
            verdict["trace"] = traceback.format_exc(limit=-3)[-1500:]
    verdict["stdout"] = _cap(out.getvalue())
    verdict["calls"] = channel.calls
    verdict["elapsed_s"] = round(time.monotonic() - start, 3)
    verdict["cpu_s"] = round(time.process_time(), 3)  # this forked child's own CPU
    conn.send(("verdict", verdict))
    conn.close()


# What the fork server imports once, before any student data exists, so that each child starts warm
# ("pipeline": what grade.py imports, which each child runs again at its start; "forkwarm", last:
# freezes the garbage collector's view of all of it, see forkwarm.py).
PRELOAD = ["checker", "staging", "pipeline", "bookkeeper_client", "numpy", "longctx.grading", "longctx.specs",
           "longctx.memory", "longctx.flops", "longctx.roofline", "longctx.lessons.stall",
           "longctx.lessons.policy_checks", "forkwarm"]
