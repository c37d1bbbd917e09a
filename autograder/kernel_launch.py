"""Start the notebook kernel inside the sandbox as the student's uid, with no capabilities and resource
limits.

Called by the executor (its own uid, with CAP_SETUID/SETGID/KILL) through the `lcgrader` kernelspec:
    python kernel_launch.py CONNECTION_FILE
It lets the student's uid read the connection file, sets the limits from /ctl/job.json, drops to that
uid, empties every capability set (a uid change from a non-root uid would keep them), checks that
nothing is left and replaces itself with ipykernel.
"""

import json
import os
import resource
import signal
import sys

sys.path.insert(0, "/opt/grader")
import caps  # noqa: E402


def main():
    connection_file = sys.argv[1]
    with open("/ctl/job.json") as fh:
        job = json.load(fh)
    uid = int(job["uid"])
    os.chmod(connection_file, 0o644)  # in /run/jupyter, which only the executor's uid may write
    limits = {
        resource.RLIMIT_AS: int(job["memory_bytes"]),
        resource.RLIMIT_NPROC: int(job["max_processes"]),
        resource.RLIMIT_FSIZE: int(job["max_file_bytes"]),
        resource.RLIMIT_CPU: int(job.get("cpu_s", 3600)),
        resource.RLIMIT_CORE: 0,
        resource.RLIMIT_NOFILE: 1024,
    }
    for which, value in limits.items():
        resource.setrlimit(which, (value, value))
    signal.signal(signal.SIGXFSZ, signal.SIG_DFL)
    caps.become(uid)
    caps.drop_all()
    held = caps.held()
    if held["Uid"] != [uid] * 4 or any(held[k] for k in ("CapEff", "CapPrm", "CapInh", "CapAmb")):
        raise SystemExit(f"kernel_launch: could not drop to uid {uid} without capabilities ({held})")
    os.chdir("/home/student")
    os.execv(sys.executable, [sys.executable, "-m", "ipykernel_launcher", "-f", connection_file])


if __name__ == "__main__":
    main()
