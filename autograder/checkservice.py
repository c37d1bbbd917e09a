"""The grader's side of checking: one listener per sandbox, one pristine checker child per test cell.

The sandbox's executor announces each test cell on ctl_dir/grader.sock; `CheckService` starts a checker
child (autograder/checker.py, from a fork server preloaded with the instructor's library before any
submission is read) with the instructor's test source, relays the child's plain-data requests to the
student's kernel and its answers back, and keeps the verdict. The kernel never sees the test source.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import threading
import time

import checker
import plaindata

HERE = os.path.dirname(os.path.abspath(__file__))
MAX_LINE_BYTES = 3 * plaindata.MAX_TEXT_BYTES  # one relayed answer, JSON-escaped
CHECKER_MEMORY_BYTES = 2 * 2**30                # per checker child, beyond the preloaded library


class CheckService:
    """Listens on ctl_dir/grader.sock for one sandbox; runs a checker child for each test cell it
    announces."""

    def __init__(self, job, mp_context, limits, checker_cgroup=None):
        self.job, self.ctx, self.limits = job, mp_context, limits
        self.child_limits = {"cgroup_procs": checker_cgroup.procs_files() if checker_cgroup else [],
                             "cpu_s": int(limits.checker_cpu_s), "memory_bytes": CHECKER_MEMORY_BYTES}
        self.path = os.path.join(job.ctl_dir, "grader.sock")
        if os.path.exists(self.path):
            os.remove(self.path)
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        dir_fd = os.open(job.ctl_dir, os.O_RDONLY | os.O_DIRECTORY)
        try:  # a Unix socket path must be < 108 bytes: bind through the folder's descriptor instead
            self.listener.bind(f"/proc/self/fd/{dir_fd}/grader.sock")
        finally:
            os.close(dir_fd)
        os.chmod(self.path, 0o600)
        self.listener.listen(1)
        self.listener.settimeout(0.5)
        self.stop = threading.Event()
        self.check_s = 0.0
        self.check_cpu_s = 0.0
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def close(self):
        self.stop.set()
        self.thread.join(timeout=self.limits.call_timeout_s + 60)
        self.listener.close()

    def _run(self):
        conn = None
        while not self.stop.is_set():
            try:
                conn, _ = self.listener.accept()
                break
            except TimeoutError:
                continue
            except OSError:
                return
        if conn is None:
            return
        conn.settimeout(None)
        reader = conn.makefile("rb")
        try:
            while True:
                line = reader.readline(MAX_LINE_BYTES)
                if not line or not line.endswith(b"\n"):
                    return
                msg = json.loads(line)
                if msg.get("op") == "test" and int(msg.get("cell", -1)) in self.job.test_plans:
                    index = int(msg["cell"])
                    start = time.monotonic()
                    self.job.verdicts[index], cpu_s = self._check(index, conn, reader)
                    self.check_s += time.monotonic() - start
                    self.check_cpu_s += cpu_s
                    conn.sendall(b'{"op": "done"}\n')
                else:
                    return
        except (OSError, ValueError) as exc:
            if not self.stop.is_set():
                self.job.notes.append(f"the link to the sandbox broke ({type(exc).__name__})")
        finally:
            reader.close()
            conn.close()

    def _check(self, index, conn, reader):
        import checker as ck

        spec = dict(self.job.test_plans[index], limits=self.child_limits)
        parent, child = self.ctx.Pipe()
        proc = self.ctx.Process(target=ck.run_check, args=(child, spec), daemon=True)
        proc.start()
        child.close()
        deadline = time.monotonic() + self.limits.test_timeout_s
        verdict, cpu = None, _CpuMeter(proc.pid)
        try:
            while verdict is None:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    verdict = _failed("TestTimeout",
                                      f"the test took longer than {self.limits.test_timeout_s:g} s "
                                      "(the student's functions are slow or never return)")
                    break
                if not parent.poll(min(remaining, 1.0)):
                    cpu.sample()
                    continue
                try:
                    kind, payload = parent.recv()
                except (EOFError, OSError):
                    verdict = self._died(cpu)
                    break
                if kind == "verdict":
                    verdict = payload
                elif kind == "kernel":
                    conn.sendall((json.dumps({"op": "kernel", "text": payload}) + "\n").encode())
                    conn.settimeout(self.limits.call_timeout_s + 30)
                    line = reader.readline(MAX_LINE_BYTES)
                    conn.settimeout(None)
                    if not line.endswith(b"\n"):
                        raise OSError("no answer from the sandbox")
                    text = json.loads(line).get("text")
                    parent.send(text if isinstance(text, str) else "!the sandbox sent no answer")
        finally:
            cpu.sample()
            if proc.is_alive():
                proc.kill()
            proc.join(5)
            parent.close()
        if verdict.get("infra"):
            self.job.notes.append(
                f"grading problem in {spec.get('grade_id')}: {verdict.get('evalue', '')[:300]}")
        return verdict, max(cpu.seconds, float(verdict.get("cpu_s", 0.0) or 0.0))

    def _died(self, cpu):
        """The verdict of a checker child that died without one: its CPU limit, or a grader problem."""
        limit = self.child_limits["cpu_s"]
        if cpu.seconds >= limit - 1.5:
            return _failed("TestCpuLimit", f"checking this test used more than {limit} s of the grader's CPU "
                                           "(the notebook's answers are too expensive to check)")
        return _failed("GraderError", "the checker process stopped unexpectedly", infra=True)


class _CpuMeter:
    """The CPU seconds of a checker child, read from outside (/proc/PID/stat), so that a child killed at its
    CPU limit or its time limit is counted in the timings too (it cannot report its own)."""

    def __init__(self, pid):
        self.path, self.seconds = f"/proc/{pid}/stat", 0.0

    def sample(self):
        try:
            with open(self.path) as fh:
                fields = fh.read().rsplit(")", 1)[1].split()
            self.seconds = max(self.seconds, (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK"))
        except (OSError, IndexError, ValueError):
            pass


def _failed(ename, evalue, infra=False):
    return {"passed": False, "ename": ename, "evalue": evalue, "stdout": "", "infra": infra}


def start_checker_server(root):
    """The fork server every checker child comes from; started before any submission is read.

    The server is a fresh interpreter (`python -c ...`) that does not use the grader's sys.path (CPython
    3.11 sends it but ignores it), and it skips a preload module it cannot import without a word: it gets
    the grader's folder and the course root through PYTHONPATH, so that checker.PRELOAD (this folder's
    modules, the course's own longctx) is really loaded there, once.
    """
    import multiprocessing
    from multiprocessing import forkserver

    if root not in sys.path:
        sys.path.insert(0, root)
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(checker.PRELOAD)
    before = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = os.pathsep.join([HERE, root] + ([before] if before else []))
    try:
        forkserver.ensure_running()
    finally:
        if before is None:
            os.environ.pop("PYTHONPATH", None)
        else:
            os.environ["PYTHONPATH"] = before
    return ctx
