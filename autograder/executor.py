"""Execute one sanitized submission inside the sandbox (started by autograder/sandbox.py).

Runs as root *inside* the sandbox's namespaces, with no access to the course beyond the read-only library;
the notebook's kernel runs as an unprivileged user (see kernel_launch.py), so the kernel cannot read or
change this process's control folder /ctl, where the input notebook and the results live. After every
cell the notebook executed so far is written to /ctl/executed.ipynb, so a timeout or a crash keeps the
points earned before it.

Test cells never run here: the grader blanked their source, and at each test cell's place this process
asks the grader (over the Unix socket /ctl/grader.sock, which the kernel's user cannot reach) to check
it; while the grader's checker runs, this process relays the checker's requests ("describe name",
"call function", "new object", "decide") to the kernel and the kernel's plain-data answers back. The
kernel answers through a small module (plaindata.py's `serve`) installed at each test cell; its answers
are the student's own values only, and each request has a time limit.

/ctl/job.json: {"uid", "gid", "deadline_s", "cell_timeout_s", "max_cell_output_chars", "test_cells",
                "call_timeout_s", "socket", ...}
/ctl/status.json (written here): {"state", "cells_done", "failed_cell", "detail", "kernel_exit", ...}
"""

import asyncio
import json
import os
import shutil
import signal
import sys
import time

# jsonschema (through nbformat) imports rfc3987_syntax for one format check notebooks never use; that
# import costs ~1.2 s of CPU in every process that reads a notebook. Skip it.
sys.modules.setdefault("rfc3987_syntax", None)

CTL = "/ctl"
SERVE_SOURCE = "/opt/grader/plaindata.py"
MIME = "application/x-longctx-reply"
MAX_LINE_BYTES = 40 * 2**20
REQUEST_DIR = "/tmp/.longctx-grader"  # root's, readable by the kernel: long requests go through a file
HOME = "/home/student"
SUBMISSION = "/submission"


def write_json_atomic(path, obj):
    tmp = path + ".tmp"
    with open(tmp, "w") as fh:
        json.dump(obj, fh)
    os.replace(tmp, path)


def prepare_home(uid, gid):
    shutil.copytree(SUBMISSION, HOME, symlinks=True, dirs_exist_ok=True)
    os.chmod(HOME, 0o700)
    for dirpath, dirnames, filenames in os.walk(HOME, topdown=False):  # contents first, then the folder
        for name in filenames + [d for d in dirnames if os.path.islink(os.path.join(dirpath, d))]:
            os.lchown(os.path.join(dirpath, name), uid, gid)
        os.lchown(dirpath, uid, gid)
    os.makedirs("/run/jupyter", mode=0o755, exist_ok=True)
    os.chmod("/run/jupyter", 0o755)


def main():
    import nbformat
    from nbclient import NotebookClient
    from nbclient.exceptions import CellTimeoutError, DeadKernelError

    job = json.load(open(os.path.join(CTL, "job.json")))
    start = time.monotonic()
    deadline = start + float(job["deadline_s"])
    cap = int(job["max_cell_output_chars"])
    test_cells = set(job.get("test_cells", []))
    status = {"state": "starting", "cells_done": 0, "failed_cell": None, "detail": "", "kernel_exit": None,
              "truncated_cells": [], "timeouts": []}
    status_path = os.path.join(CTL, "status.json")
    out_path = os.path.join(CTL, "executed.ipynb")
    write_json_atomic(status_path, status)

    prepare_home(job["uid"], job["gid"])
    nb = nbformat.read(os.path.join(CTL, "input.ipynb"), as_version=4)

    class CappedClient(NotebookClient):
        """Keeps at most `cap` characters of output per cell (streams, displays, errors alike)."""

        def output(self, outs, msg, display_id, cell_index):
            kind = msg["msg_type"]
            if kind in ("stream", "display_data", "execute_result", "error", "update_display_data"):
                used = sum(output_size(o) for o in outs)
                size = message_size(msg)
                if used + size > cap:
                    if cell_index not in status["truncated_cells"]:
                        status["truncated_cells"].append(cell_index)
                        note = f"\n[the grader truncated this cell's output after {cap} characters]\n"
                        outs.append(nbformat.v4.new_output("stream", name="stdout", text=note))
                    if kind == "error":  # keep that the cell failed, without its (huge) text
                        content = msg["content"]
                        msg = dict(msg, content={"ename": str(content.get("ename", "Error"))[:200],
                                                 "evalue": str(content.get("evalue", ""))[:2000],
                                                 "traceback": []})
                    else:
                        return None
            return super().output(outs, msg, display_id, cell_index)

        async def _async_handle_timeout(self, timeout, cell=None):
            if self.current_index not in status["timeouts"]:
                status["timeouts"].append(self.current_index)
            return await super()._async_handle_timeout(timeout, cell)

    client = CappedClient(nb, timeout=int(job["cell_timeout_s"]), kernel_name="lcgrader", allow_errors=True,
                          interrupt_on_timeout=True, record_timing=False, shutdown_kernel="immediate",
                          resources={"metadata": {"path": "/"}}, startup_timeout=120)

    def kernel_exit():
        try:
            proc = client.km.provisioner.process
            return proc.poll() if proc is not None else None
        except Exception:  # noqa: BLE001
            return None

    async def run():
        grader = await GraderLink.connect(job) if test_cells else None
        t_kernel = time.monotonic()
        status.update(cells_s=0.0, tests_s=0.0)
        async with client.async_setup_kernel():
            status["state"] = "running"
            status["kernel_start_s"] = round(time.monotonic() - t_kernel, 3)
            status["kernel_start_cpu_s"] = process_cpu_s(client)
            for index, cell in enumerate(nb.cells):
                if cell.cell_type != "code":
                    continue
                remaining = deadline - time.monotonic()
                if remaining <= 1:
                    status.update(state="timeout", failed_cell=index,
                                  detail=f"the notebook used up its {job['deadline_s']} s time limit")
                    return
                client.timeout = int(min(float(job["cell_timeout_s"]), remaining))
                client.current_index = index
                t_cell = time.monotonic()
                cpu_before = process_cpu_s(client) if index in test_cells else 0.0
                try:
                    if index in test_cells:
                        await grader.check(client, index, deadline)
                    else:
                        await client.async_execute_cell(cell, index, execution_count=None)
                except CellTimeoutError:
                    if index not in status["timeouts"]:
                        status["timeouts"].append(index)
                except DeadKernelError:
                    code = kernel_exit()
                    status.update(state="kernel_died", failed_cell=index, kernel_exit=code,
                                  detail=describe_exit(code))
                    return
                finally:
                    key = "tests_s" if index in test_cells else "cells_s"
                    status[key] = round(status[key] + time.monotonic() - t_cell, 3)
                    if index in test_cells:  # the kernel's CPU spent answering the checker
                        status["answers_cpu_s"] = round(status.get("answers_cpu_s", 0.0) + process_cpu_s(client)
                                                        - cpu_before, 3)
                    status["cells_done"] = index + 1
                    nbformat.write(nb, out_path + ".tmp")
                    os.replace(out_path + ".tmp", out_path)
                    write_json_atomic(status_path, status)
                await contain_fork_bomb(client, job, status, index)
                if not await client.km.is_alive():
                    code = kernel_exit()
                    status.update(state="kernel_died", failed_cell=index, kernel_exit=code,
                                  detail=describe_exit(code))
                    return
            status["state"] = "finished"
            if grader is not None:
                await grader.send({"op": "finished"})

    try:
        asyncio.run(run())
    except Exception as exc:  # noqa: BLE001  (a crash here is reported, never hidden)
        if status["state"] in ("starting", "running"):
            status.update(state="error", detail=f"{type(exc).__name__}: {exc}"[:2000])
    nbformat.write(nb, out_path + ".tmp")
    os.replace(out_path + ".tmp", out_path)
    status["elapsed_s"] = round(time.monotonic() - start, 2)
    import resource
    own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    status["executor_cpu_s"] = round(own.ru_utime + own.ru_stime, 3)       # this process, from its start
    status["kernel_cpu_s"] = round(kids.ru_utime + kids.ru_stime, 3)       # the kernel (start + cells + answers)
    write_json_atomic(status_path, status)


def process_cpu_s(client):
    """CPU seconds the kernel process has used so far (user + system), from /proc."""
    try:
        with open(f"/proc/{client.km.provisioner.process.pid}/stat") as fh:
            fields = fh.read().rsplit(")", 1)[1].split()
        return round((int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK"), 3)
    except (OSError, AttributeError, ValueError, IndexError):
        return 0.0


def output_size(out):
    kind = out.get("output_type")
    if kind == "stream":
        return len(out.get("text", ""))
    if kind == "error":
        return len(str(out.get("evalue", ""))) + sum(len(str(line)) for line in out.get("traceback", []))
    return sum(len(v) if isinstance(v, str) else len(json.dumps(v)) for v in out.get("data", {}).values())


def message_size(msg):
    content = msg.get("content", {})
    if msg["msg_type"] == "stream":
        return len(content.get("text", ""))
    if msg["msg_type"] == "error":
        return len(str(content.get("evalue", ""))) + sum(len(str(line)) for line in content.get("traceback", []))
    data = content.get("data", {})
    return sum(len(v) if isinstance(v, str) else len(json.dumps(v)) for v in data.values()) if isinstance(data, dict) else 0


class GraderLink:
    """The executor's side of the grader's socket: announces test cells and relays checker requests."""

    def __init__(self, reader, writer, job):
        self.reader, self.writer = reader, writer
        self.call_timeout_s = float(job.get("call_timeout_s", 20))
        with open(SERVE_SOURCE) as fh:
            self.serve_source = fh.read()

    @classmethod
    async def connect(cls, job):
        reader, writer = await asyncio.open_unix_connection(job["socket"], limit=MAX_LINE_BYTES)
        return cls(reader, writer, job)

    async def send(self, obj):
        self.writer.write((json.dumps(obj) + "\n").encode())
        await self.writer.drain()

    async def check(self, client, index, deadline):
        """Let the grader check test cell `index`, answering its questions with the kernel's data."""
        await self.send({"op": "test", "cell": index})
        installed = await self.kernel(client, "import sys as _lcg_s, types as _lcg_t\n"
                                      "_lcg_m = _lcg_t.ModuleType('_lcg_serve')\n"
                                      f"exec({self.serve_source!r}, _lcg_m.__dict__)\n"
                                      "_lcg_s.modules['_lcg_serve'] = _lcg_m\n"
                                      "del _lcg_s, _lcg_t, _lcg_m", expect_reply=False)
        while True:
            line = await asyncio.wait_for(self.reader.readline(), timeout=max(5.0, deadline - time.monotonic() + 60))
            if not line:
                raise ConnectionError("the grader closed the connection")
            request = json.loads(line)
            if request.get("op") == "done":
                await self.kernel(client, "import sys as _lcg_s\n_lcg_s.modules.pop('_lcg_serve', None)\n"
                                  "del _lcg_s", expect_reply=False)
                return
            if installed is not True:
                reply = "!the notebook's kernel could not load the grader's answering code " + str(installed)
            elif not await client.km.is_alive():
                reply = "!the notebook's kernel is not running any more"
            else:
                reply = await self.kernel(client, self.request_code(request["text"]))
            await self.send({"text": reply})

    def request_code(self, text):
        """The kernel's code for one request: the request inline when short, else read from a file."""
        if len(text) < 2000:
            return f"__import__('sys').modules['_lcg_serve'].serve({text!r})"
        os.makedirs(REQUEST_DIR, mode=0o755, exist_ok=True)
        path = os.path.join(REQUEST_DIR, "request.json")
        with open(path + ".tmp", "w", encoding="utf-8") as fh:
            fh.write(text)
        os.chmod(path + ".tmp", 0o644)
        os.replace(path + ".tmp", path)
        return f"__import__('sys').modules['_lcg_serve'].serve_file({path!r})"

    async def kernel(self, client, code, expect_reply=True):
        """Run `code` silently in the kernel; return the last reply it displayed (or "!problem")."""
        replies, size = [], [0]

        def hook(msg):
            if msg["msg_type"] == "display_data":
                data = msg["content"].get("data", {})
                text = data.get(MIME) if isinstance(data, dict) else None
                if isinstance(text, str):
                    size[0] += len(text)
                    if size[0] <= MAX_LINE_BYTES // 2:
                        replies.append(text)
            elif msg["msg_type"] == "error" and not expect_reply:
                replies.append("error: " + str(msg["content"].get("ename", ""))[:100])

        try:
            reply = await client.kc.execute_interactive(code, silent=True, store_history=False, allow_stdin=False,
                                                        stop_on_error=False, timeout=self.call_timeout_s,
                                                        output_hook=hook)
        except TimeoutError:
            try:
                await client.km.interrupt_kernel()
            except Exception:  # noqa: BLE001
                pass
            return f"!the student's code did not answer within {self.call_timeout_s:g} s (it was interrupted)"
        if not expect_reply:
            return True if reply.get("content", {}).get("status") == "ok" else (replies[-1] if replies else "")
        if size[0] > MAX_LINE_BYTES // 2:
            return "!the notebook's answer was too large"
        if not replies:
            return "!the notebook's kernel gave no answer"
        return replies[-1]


REAP = ("import os as _o\nwhile True:\n    try:\n        _o.waitpid(-1, 0)\n"
        "    except ChildProcessError:\n        break\ndel _o")


async def contain_fork_bomb(client, job, status, index):
    """When a cell leaves many processes behind (1/16 of the limit, at least 8), stop them and reap them."""
    uid = int(job["uid"])
    try:
        kernel_pid = client.km.provisioner.process.pid
    except Exception:  # noqa: BLE001
        return
    strays = []
    for name in os.listdir("/proc"):
        if name.isdigit() and int(name) != kernel_pid:
            try:
                if os.stat(f"/proc/{name}").st_uid == uid:
                    strays.append(int(name))
            except OSError:
                continue
    if len(strays) < max(8, int(job["max_processes"]) // 16):
        return
    for pid in strays:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    status.setdefault("process_limit_cells", []).append(index)
    try:
        await client.kc.execute_interactive(REAP, silent=True, store_history=False, timeout=30,
                                            output_hook=lambda msg: None)
    except Exception:  # noqa: BLE001
        pass


def describe_exit(code):
    if code is None:
        return "the kernel stopped responding"
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        extra = " (out of memory or a resource limit?)" if -code == signal.SIGKILL else ""
        return f"the kernel was killed by {name}{extra}"
    return f"the kernel process exited with status {code} (os._exit or a crash)"


if __name__ == "__main__":
    sys.exit(main())
