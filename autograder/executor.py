"""Execute one sanitized submission inside the sandbox (started by autograder/sandbox_init.py).

Runs as its own unprivileged uid *inside* the sandbox's namespaces, keeping only CAP_SETUID/SETGID (to
start the kernel as the student's uid, see kernel_launch.py) and CAP_KILL (to stop the processes a cell
leaves behind); no file of the host belongs to that uid. The kernel cannot read or change this process's
control folder /ctl, where the input notebook and the results live. After every code cell its outputs
are appended to /ctl/outputs.jsonl (executor_output.py caps them), so a timeout or a crash keeps the
points earned before it.

Test cells never run here: the grader blanked their source, and at each test cell's place this process
lets the grader check it (grader_link.py), relaying the checker's plain-data requests to the kernel.

/ctl/job.json: {"uid", "gid", "executor_uid", "deadline_s", "cell_timeout_s", "max_cell_output_chars",
                "max_notebook_output_chars", "test_cells", "call_timeout_s", "socket", ...}
/ctl/status.json (written here): {"state", "cells_done", "failed_cell", "detail", "kernel_exit", ...}
"""

import asyncio
import json
import os
import resource
import signal
import sys
import time

sys.path.insert(0, "/opt/grader")
# jsonschema (through nbformat) imports rfc3987_syntax for one format check notebooks never use; that
# import costs ~1.2 s of CPU in every process that reads a notebook. Skip it.
sys.modules.setdefault("rfc3987_syntax", None)

from executor_output import OutputCaps, OutputLog  # noqa: E402
from grader_link import GraderLink  # noqa: E402

CTL = "/ctl"


def write_json_atomic(path, obj):
    tmp = path + ".tmp"
    with open(tmp, "w") as fh:
        json.dump(obj, fh)
    os.replace(tmp, path)


def make_client(nb, job, status):
    import nbformat
    from nbclient import NotebookClient

    caps = OutputCaps(job["max_cell_output_chars"], job["max_notebook_output_chars"], status)

    class CappedClient(NotebookClient):
        """Keeps every output within the caps (executor_output.OutputCaps); no display-id updates."""

        def process_message(self, msg, cell, cell_index):
            content = msg.get("content")
            if isinstance(content, dict) and content.get("transient"):
                msg = dict(msg, content=dict(content, transient=None))
            return super().process_message(msg, cell, cell_index)

        def output(self, outs, msg, display_id, cell_index):
            msg = caps.admit(msg, cell_index, outs, nbformat.v4.new_output)
            return None if msg is None else super().output(outs, msg, None, cell_index)

        async def _async_handle_timeout(self, timeout, cell=None):
            if self.current_index not in status["timeouts"]:
                status["timeouts"].append(self.current_index)
            return await super()._async_handle_timeout(timeout, cell)

    return CappedClient(nb, timeout=int(job["cell_timeout_s"]), kernel_name="lcgrader", allow_errors=True,
                        interrupt_on_timeout=True, record_timing=False, shutdown_kernel="immediate",
                        resources={"metadata": {"path": "/"}}, startup_timeout=120)


class NotebookRun:
    """One run of the notebook in `job`: its cells in order (test cells checked through the grader's link),
    `status` kept current in the control folder after every cell."""

    def __init__(self, job, nb, client, status, outputs, status_path):
        self.job, self.nb, self.client, self.status, self.outputs = job, nb, client, status, outputs
        self.status_path, self.test_cells = status_path, set(job.get("test_cells", []))
        self.deadline = time.monotonic() + float(job["deadline_s"])

    def kernel_exit(self):
        try:
            proc = self.client.km.provisioner.process
            return proc.poll() if proc is not None else None
        except Exception:  # noqa: BLE001
            return None

    def died(self, index):
        code = self.kernel_exit()
        self.status.update(state="kernel_died", failed_cell=index, kernel_exit=code,
                           detail=describe_exit(code))

    async def run(self):
        client, status = self.client, self.status
        grader = await GraderLink.connect(self.job) if self.test_cells else None
        t_kernel = time.monotonic()
        status.update(cells_s=0.0, tests_s=0.0)
        async with client.async_setup_kernel():
            status["state"] = "running"
            status["kernel_start_s"] = round(time.monotonic() - t_kernel, 3)
            status["kernel_start_cpu_s"] = process_cpu_s(client)
            for index, cell in enumerate(self.nb.cells):
                if cell.cell_type == "code" and not await self.cell(index, cell, grader):
                    return
            status["state"] = "finished"
            if grader is not None:
                await grader.send({"op": "finished"})

    async def cell(self, index, cell, grader) -> bool:
        """Run (or check) one code cell; False when the run must stop (time used up, the kernel died)."""
        from nbclient.exceptions import CellTimeoutError, DeadKernelError

        client, status, job = self.client, self.status, self.job
        remaining = self.deadline - time.monotonic()
        if remaining <= 1:
            status.update(state="timeout", failed_cell=index,
                          detail=f"the notebook used up its {job['deadline_s']} s time limit")
            return False
        client.timeout = int(min(float(job["cell_timeout_s"]), remaining))
        client.current_index = index
        t_cell, is_test = time.monotonic(), index in self.test_cells
        cpu_before = process_cpu_s(client) if is_test else 0.0
        try:
            if is_test:
                await grader.check(client, index, self.deadline)
            else:
                await client.async_execute_cell(cell, index, execution_count=None)
        except CellTimeoutError:
            if index not in status["timeouts"]:
                status["timeouts"].append(index)
        except DeadKernelError:
            self.died(index)
            return False
        finally:
            key = "tests_s" if is_test else "cells_s"
            status[key] = round(status[key] + time.monotonic() - t_cell, 3)
            if is_test:  # the kernel's CPU spent answering the checker
                status["answers_cpu_s"] = round(status.get("answers_cpu_s", 0.0) + process_cpu_s(client)
                                                - cpu_before, 3)
            status["cells_done"] = index + 1
            if not is_test:
                self.outputs.append(index, cell)
            write_json_atomic(self.status_path, status)
        await contain_fork_bomb(client, job, status, index)
        if not await client.km.is_alive():
            self.died(index)
            return False
        return True


def main():
    import nbformat

    with open(os.path.join(CTL, "job.json")) as fh:
        job = json.load(fh)
    start = time.monotonic()
    status = {"state": "starting", "cells_done": 0, "failed_cell": None, "detail": "", "kernel_exit": None,
              "truncated_cells": [], "timeouts": [], "output_cut_at": None}
    status_path = os.path.join(CTL, "status.json")
    write_json_atomic(status_path, status)
    nb = nbformat.read(os.path.join(CTL, "input.ipynb"), as_version=4)
    outputs = OutputLog(os.path.join(CTL, "outputs.jsonl"), len(nb.cells))
    run = NotebookRun(job, nb, make_client(nb, job, status), status, outputs, status_path)
    try:
        asyncio.run(run.run())
    except Exception as exc:  # noqa: BLE001  (a crash here is reported, never hidden)
        if status["state"] in ("starting", "running"):
            status.update(state="error", detail=f"{type(exc).__name__}: {exc}"[:2000])
    status["elapsed_s"] = round(time.monotonic() - start, 2)
    own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    status["executor_cpu_s"] = round(own.ru_utime + own.ru_stime, 3)       # this process, from its start
    status["executor_max_rss_kib"] = own.ru_maxrss
    # the kernel (start + cells + answers)
    status["kernel_cpu_s"] = round(kids.ru_utime + kids.ru_stime, 3)
    write_json_atomic(status_path, status)


def process_cpu_s(client):
    """CPU seconds the kernel process has used so far (user + system), from /proc."""
    try:
        with open(f"/proc/{client.km.provisioner.process.pid}/stat") as fh:
            fields = fh.read().rsplit(")", 1)[1].split()
        return round((int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK"), 3)
    except (OSError, AttributeError, ValueError, IndexError):
        return 0.0


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
