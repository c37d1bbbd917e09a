"""The sandbox's first process (root, with CAP_SETUID/SETGID/CHOWN/KILL only): set up, then become the
executor.

    python /opt/grader/sandbox_init.py            (bwrap's command, see autograder/sandbox_command.py)

1. Copy the submission (/submission, read-only) into the student's home (a tmpfs) owned by the
   kernel's uid; make /run/jupyter and /run/lcg (the checker's requests) owned by the executor's uid,
   which the kernel's uid can read but not write; give /ctl (the run's control folder, grader-made) to
   the executor's uid. No student code has run yet, so nothing here can meet a planted link.
2. Limit the executor (soft RLIMIT_AS and RLIMIT_FSIZE: the kernel may raise them back to its own hard
   limits, the executor never does), become the executor's uid keeping only CAP_SETUID/SETGID (to start
   the kernel as the student) and CAP_KILL (to stop its processes), and exec executor.py.

The executor's uid owns no file of the host: even a write or chmod that followed a link could not change
a device node, a /proc/sys entry or anything but the run's own control folder.
"""

import json
import os
import resource
import shutil
import sys

sys.path.insert(0, "/opt/grader")
import caps  # noqa: E402

HOME = "/home/student"
SUBMISSION = "/submission"


def prepare_home(uid, gid):
    shutil.copytree(SUBMISSION, HOME, symlinks=True, dirs_exist_ok=True)
    os.chmod(HOME, 0o700)
    for dirpath, dirnames, filenames in os.walk(HOME, topdown=False):  # contents first, then the folder
        for name in filenames + [d for d in dirnames if os.path.islink(os.path.join(dirpath, d))]:
            os.lchown(os.path.join(dirpath, name), uid, gid)
        os.lchown(dirpath, uid, gid)


def give_tree(top, uid):
    for dirpath, dirnames, filenames in os.walk(top):
        for name in dirnames + filenames:
            os.lchown(os.path.join(dirpath, name), uid, uid)
    os.lchown(top, uid, uid)


def main():
    with open("/ctl/job.json") as fh:
        job = json.load(fh)
    executor_uid = int(job["executor_uid"])
    prepare_home(int(job["uid"]), int(job["gid"]))
    for folder in ("/run/jupyter", "/run/lcg"):
        os.mkdir(folder, 0o755)
        os.chmod(folder, 0o755)
        os.chown(folder, executor_uid, executor_uid)
    give_tree("/ctl", executor_uid)
    for which, key in ((resource.RLIMIT_AS, "executor_memory_bytes"),
                       (resource.RLIMIT_FSIZE, "executor_file_bytes")):
        _, hard = resource.getrlimit(which)
        soft = int(job[key]) if hard == resource.RLIM_INFINITY else min(int(job[key]), hard)
        resource.setrlimit(which, (soft, hard))
    caps.become(executor_uid, keep=(caps.CAP_SETUID, caps.CAP_SETGID, caps.CAP_KILL))
    if caps.held()["Uid"] != [executor_uid] * 4:
        raise SystemExit("sandbox_init: could not switch to the executor's uid")
    os.execv(sys.executable, [sys.executable, "/opt/grader/executor.py"])


if __name__ == "__main__":
    main()
