"""Start the notebook kernel inside the sandbox as an unprivileged user with resource limits.

Called by the executor (root inside the sandbox) through the `lcgrader` kernelspec:
    python kernel_launch.py CONNECTION_FILE
It hands the connection file to the sandbox user, sets the limits from /ctl/job.json, drops to that
user (losing every capability) and replaces itself with ipykernel.
"""

import json
import os
import resource
import sys


def main():
    connection_file = sys.argv[1]
    job = json.load(open("/ctl/job.json"))
    uid, gid = int(job["uid"]), int(job["gid"])
    os.chown(connection_file, uid, gid)
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
    os.setgroups([])
    os.setgid(gid)
    os.setuid(uid)
    if os.geteuid() == 0 or os.getuid() == 0:
        raise SystemExit("kernel_launch: could not drop root")
    os.chdir("/home/student")
    os.execv(sys.executable, [sys.executable, "-m", "ipykernel_launcher", "-f", connection_file])


if __name__ == "__main__":
    main()
