#!/usr/bin/env bash
# Says whether this machine can run `make grade`'s sandbox, and what to install if not.
# Usage: autograder/check_sandbox.sh [--install]     (--install: apt-get install bubblewrap when missing)
set -u
ok=1
say() { printf '%s\n' "$*"; }
if [ "$(uname -s)" != "Linux" ]; then say "MISSING: Linux (the sandbox uses Linux namespaces)"; exit 1; fi
if [ "$(id -u)" != 0 ]; then
  say "MISSING: root. Run as root (sudo make grade, or the CI container): the sandbox switches each notebook"
  say "         to an unprivileged user and mounts its private view of the filesystem."
  ok=0
fi
if ! command -v bwrap >/dev/null 2>&1; then
  if [ "${1:-}" = "--install" ] && command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
    say "installing bubblewrap ..."
    (apt-get install -y bubblewrap >/dev/null 2>&1 || (apt-get update >/dev/null 2>&1 && apt-get install -y bubblewrap >/dev/null 2>&1)) \
      || say "MISSING: bubblewrap (apt-get install -y bubblewrap failed)"
  fi
fi
if ! command -v bwrap >/dev/null 2>&1; then
  say "MISSING: bubblewrap: apt-get install -y bubblewrap (Debian/Ubuntu) or dnf install bubblewrap"
  ok=0
elif ! bwrap --die-with-parent --unshare-pid --unshare-net --ro-bind / / --proc /proc --dev /dev -- /bin/true 2>/tmp/.bwrap_probe.$$; then
  say "MISSING: permission to create namespaces: $(cat /tmp/.bwrap_probe.$$)"
  say "         (in Docker: --privileged, or --security-opt seccomp=unconfined --cap-add SYS_ADMIN)"
  ok=0
fi
rm -f /tmp/.bwrap_probe.$$
here="$(cd "$(dirname "$0")" && pwd)"
py="$(command -v python3 || command -v python || true)"
if [ -n "$py" ]; then
  cg="$("$py" -c 'import sys; sys.path.insert(0, sys.argv[1]); import cgroups; h = cgroups.detect(); print(h.kind or "-", h.base or h.root, h.problem)' "$here" 2>&1)"
  case "$cg" in
    v1\ *) say "ok: cgroup v1 memory, pids and cpu writable: each notebook gets a total memory, process and CPU limit" ;;
    v2\ *) say "ok: cgroup v2 (delegated cgroup ${cg#v2 }): each notebook gets memory.max, memory.swap.max, pids.max, cpu.max" ;;
    *) say "MISSING: cgroup limits: ${cg#- }"
       say "         (\`make grade\` refuses to grade without them; --allow-no-cgroups grades with per-process limits only)"
       ok=0 ;;
  esac
  if command -v bwrap >/dev/null 2>&1 && command -v unshare >/dev/null 2>&1; then
    # the sandbox's seccomp filter (autograder/seccomp.py) must make `unshare -U` fail inside bwrap
    userns="$("$py" - "$here" <<'EOF' 2>&1
import os, subprocess, sys
sys.path.insert(0, sys.argv[1])
import seccomp
program = seccomp.sandbox_filter()
if program is None:
    print("unknown")
    sys.exit()
r, w = os.pipe()
os.write(w, program)
os.close(w)
probe = subprocess.run(["bwrap", "--die-with-parent", "--unshare-pid", "--ro-bind", "/", "/", "--proc", "/proc",
                        "--dev", "/dev", "--seccomp", str(r), "--", "unshare", "-U", "true"],
                       pass_fds=(r,), capture_output=True)
print("denied" if probe.returncode else "allowed")
EOF
)"
    case "$userns" in
      denied) say "ok: user namespaces are denied inside the sandbox (seccomp)" ;;
      unknown) say "note: no seccomp filter for $(uname -m): user namespaces and key calls are not denied in the sandbox" ;;
      *) say "MISSING: the seccomp filter did not deny user namespaces in the sandbox: $userns"; ok=0 ;;
    esac
  fi
else
  say "note: no python3 to check the cgroups with (the grader checks them itself when it starts)"
fi
if [ $ok = 1 ]; then say "ok: the grading sandbox works here (bubblewrap $(bwrap --version | cut -d' ' -f2))"; exit 0; fi
exit 1
