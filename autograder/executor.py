"""Execute one sanitized submission inside the sandbox (started by autograder/sandbox.py).

Runs as root *inside* the sandbox's namespaces, with no access to the course beyond the read-only library;
the notebook's kernel runs as an unprivileged user (see kernel_launch.py), so the kernel cannot read or
change this process's control folder /ctl, where the input notebook (with the per-cell pass markers) and
the results live. After every cell the notebook executed so far is written to /ctl/executed.ipynb, so a
timeout or a crash keeps the points earned before it.

/ctl/job.json: {"uid", "gid", "deadline_s", "cell_timeout_s", "max_cell_output_chars", "marker_prefix"}
/ctl/status.json (written here): {"state", "cells_done", "failed_cell", "detail", "kernel_exit", ...}
"""

import asyncio
import json
import os
import shutil
import signal
import sys
import time

CTL = "/ctl"
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
    marker = job["marker_prefix"]
    status = {"state": "starting", "cells_done": 0, "failed_cell": None, "detail": "", "kernel_exit": None,
              "truncated_cells": [], "timeouts": []}
    status_path = os.path.join(CTL, "status.json")
    out_path = os.path.join(CTL, "executed.ipynb")
    write_json_atomic(status_path, status)

    prepare_home(job["uid"], job["gid"])
    nb = nbformat.read(os.path.join(CTL, "input.ipynb"), as_version=4)

    class CappedClient(NotebookClient):
        """Keeps at most `cap` characters of stream output per cell, but always the pass markers."""

        def output(self, outs, msg, display_id, cell_index):
            if msg["msg_type"] == "stream":
                used = sum(len(o.get("text", "")) for o in outs if o.get("output_type") == "stream")
                text = msg["content"].get("text", "")
                if used + len(text) > cap:
                    kept = [line for line in text.splitlines(True) if line.startswith(marker)]
                    if cell_index not in status["truncated_cells"]:
                        status["truncated_cells"].append(cell_index)
                        kept.insert(0, f"\n[the grader truncated this cell's output after {cap} characters]\n")
                    if not kept:
                        return None
                    msg = dict(msg, content=dict(msg["content"], text="".join(kept)))
                    if used > 4 * cap and not any(k.startswith(marker) for k in kept):
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
        async with client.async_setup_kernel():
            status["state"] = "running"
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
                try:
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

    try:
        asyncio.run(run())
    except Exception as exc:  # noqa: BLE001  (a crash here is reported, never hidden)
        if status["state"] in ("starting", "running"):
            status.update(state="error", detail=f"{type(exc).__name__}: {exc}"[:2000])
    nbformat.write(nb, out_path + ".tmp")
    os.replace(out_path + ".tmp", out_path)
    status["elapsed_s"] = round(time.monotonic() - start, 2)
    write_json_atomic(status_path, status)


REAP = ("import os as _o\nwhile True:\n    try:\n        _p, _ = _o.waitpid(-1, _o.WNOHANG)\n"
        "    except ChildProcessError:\n        break\n    if _p == 0:\n        break\ndel _o")


async def contain_fork_bomb(client, job, status, index):
    """When a cell leaves at least half the process limit behind, stop those processes and reap them."""
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
    if len(strays) < int(job["max_processes"]) // 2:
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
