"""The grader's handle on the bookkeeping worker (autograder/bookkeeper.py): one task at a time, each with a
time limit; a worker that overruns is stopped and the next task starts a fresh one."""

from __future__ import annotations

import json
import os
import queue
import subprocess
import sys
import threading

HERE = os.path.dirname(os.path.abspath(__file__))


class Bookkeeper:
    """nbgrader's autograde / feedback / export in a worker process, each task with a time limit."""

    def __init__(self, root, work):
        self.root, self.work, self.proc = root, work, None
        self._replies = queue.Queue()
        self._lock = threading.Lock()

    def _start(self):
        env = dict(os.environ, PYTHONWARNINGS="ignore")
        self.proc = subprocess.Popen([sys.executable, os.path.join(HERE, "bookkeeper.py"), self.root,
                                      self.work],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                     env=env, text=True, encoding="utf-8", errors="replace")
        self._replies = queue.Queue()
        threading.Thread(target=self._read, args=(self.proc, self._replies), daemon=True).start()
        ready = self._get(120)
        if not ready or not ready.get("ready"):
            raise RuntimeError("the bookkeeping worker did not start")

    @staticmethod
    def _read(proc, replies):
        for line in proc.stdout:
            try:
                replies.put(json.loads(line))
            except ValueError:
                continue
        replies.put(None)

    def _get(self, timeout):
        try:
            return self._replies.get(timeout=timeout)
        except queue.Empty:
            return None

    def ask(self, task, timeout):
        """The worker's answer, or {"ok": False, "error": ...} after `timeout` s (the worker is then
        restarted)."""
        with self._lock:
            return self._ask(task, timeout)

    def _ask(self, task, timeout):
        if self.proc is None or self.proc.poll() is not None:
            self._start()
        try:
            self.proc.stdin.write(json.dumps(task, ensure_ascii=True) + "\n")
            self.proc.stdin.flush()
        except OSError:
            self.close()
            return {"ok": False, "error": "the bookkeeping worker stopped"}
        reply = self._get(timeout)
        if reply is None:
            self.close()
            return {"ok": False, "error": f"took longer than {timeout:g} s (stopped)"}
        return reply

    def close(self):
        if self.proc is not None:
            try:
                self.proc.stdin.close()
                self.proc.wait(timeout=5)
            except (OSError, subprocess.TimeoutExpired):
                pass
            try:
                self.proc.kill()
            except OSError:
                pass
            self.proc.wait(timeout=30)
            self.proc = None
