"""The sandbox's seccomp filter: no key management calls, no new user namespaces.

1. **Keys.** Linux keeps a keyring per uid (`@u`, `@us`, persistent keyrings) that outlives the processes
   of that uid, and the grader reuses uids from one submission to the next: a key one student's code adds
   would be readable by the next student graded under the same uid. Nothing a notebook needs uses keys, so
   `add_key`, `request_key` and `keyctl` fail with EPERM.
2. **User namespaces.** Inside a new user namespace an unprivileged process is uid 0 with every
   capability over the namespaces it creates: AF_PACKET rings, netfilter tables and other kernel memory
   that no cgroup of the sandbox is charged for (one process could take gigabytes of the host's memory),
   and a far larger kernel attack surface. `unshare` and `clone` with CLONE_NEWUSER fail with EPERM.
   `clone3` passes its flags in memory a classic BPF filter cannot read, so it fails with ENOSYS: glibc
   (2.34+) and every runtime then fall back to `clone`, whose flags the filter does see. Without a user
   namespace an unprivileged process cannot create any other namespace (that needs CAP_SYS_ADMIN, which
   the sandbox's processes lack), so this closes them all. bubblewrap's own `--disable-userns` needs the
   sandbox itself to be a user namespace (`--unshare-user`), which would take the grader's uid switches
   away; the filter does the same job for a sandbox started by root.

The filter is a classic BPF program (what `bwrap --seccomp FD` loads, in the layout of libseccomp's
`seccomp_export_bpf`), built here without libseccomp: it checks the architecture first, so the 32-bit and
x32 entry points cannot go around it, and reads only the low 32 bits of the flags argument (little-endian
machines only: CLONE_NEWUSER is bit 28).
"""

from __future__ import annotations

import platform
import struct

# struct seccomp_data: int nr (offset 0), __u32 arch (offset 4), __u64 ip (8), __u64 args[6] (16)
_LD_W_ABS, _JEQ_K, _JGE_K, _JSET_K, _RET_K = 0x20, 0x15, 0x35, 0x45, 0x06
_ALLOW, _ERRNO = 0x7FFF0000, 0x00050000
_EPERM, _ENOSYS = 1, 38
_ARG0_LOW = 16
CLONE_NEWUSER = 0x10000000
# machine -> (AUDIT_ARCH_*, syscall numbers, first number of a foreign ABI or None)
_ARCHES = {
    "x86_64": (0xC000003E, {"add_key": 248, "request_key": 249, "keyctl": 250, "clone": 56, "unshare": 272,
                            "clone3": 435}, 0x40000000),   # x32 numbers start at 0x40000000
    "aarch64": (0xC00000B7, {"add_key": 217, "request_key": 218, "keyctl": 219, "clone": 220, "unshare": 97,
                             "clone3": 435}, None),
}
DENIED = ("add_key", "request_key", "keyctl")           # always EPERM
FLAG_CHECKED = ("unshare", "clone")                      # EPERM when the flags ask for a new user namespace
UNSUPPORTED = ("clone3",)                                # ENOSYS: callers fall back to clone


def _op(code, k, jt=0, jf=0):
    return struct.pack("=HBBI", code, jt, jf, k)


def _assemble(items) -> bytes:
    """items: (code, k, jump-if-true label or None, jump-if-false label or None) or ("label", name).
    A jump's offset counts from the next instruction; labels only ever lie ahead."""
    where, n = {}, 0
    for item in items:
        if item[0] == "label":
            where[item[1]] = n
        else:
            n += 1
    out, n = [], 0
    for item in items:
        if item[0] == "label":
            continue
        code, k, jt, jf = item
        out.append(_op(code, k, where[jt] - n - 1 if jt else 0, where[jf] - n - 1 if jf else 0))
        n += 1
    return b"".join(out)


def unprotected_here(machine: str | None = None,
                     userns_limit: str = "/proc/sys/user/max_user_namespaces") -> str | None:
    """Why grading is unsafe on this machine for want of the filter (None: it is safe). Where the filter
    is not built for the architecture, grading needs the host to allow no user namespaces at all."""
    machine = machine or platform.machine()
    if machine in _ARCHES:
        return None
    try:
        with open(userns_limit) as f:
            if f.read().strip() == "0":
                return None
    except OSError:
        pass
    return (f"the sandbox's seccomp filter is built for {' and '.join(_ARCHES)}, not {machine}: without it a "
            "notebook could create user namespaces (kernel memory no cgroup counts) and reach keyrings; "
            "`sysctl user.max_user_namespaces=0` on this host makes grading safe (autograder/README.md)")


def sandbox_filter(machine: str | None = None) -> bytes | None:
    """The BPF program (bytes) for this machine, or None where the architecture is not known here."""
    arch = _ARCHES.get(machine or platform.machine())
    if arch is None:
        return None
    audit_arch, nr, foreign = arch
    items = [(_LD_W_ABS, 4, None, None), (_JEQ_K, audit_arch, None, "deny"), (_LD_W_ABS, 0, None, None)]
    if foreign is not None:
        items.append((_JGE_K, foreign, "deny", None))
    items += [(_JEQ_K, nr[name], "deny", None) for name in DENIED]
    items += [(_JEQ_K, nr[name], "enosys", None) for name in UNSUPPORTED]
    items += [(_JEQ_K, nr[name], "flags", None) for name in FLAG_CHECKED]
    items += [(_RET_K, _ALLOW, None, None),
              ("label", "flags"), (_LD_W_ABS, _ARG0_LOW, None, None), (_JSET_K, CLONE_NEWUSER, "deny", None),
              (_RET_K, _ALLOW, None, None),
              ("label", "enosys"), (_RET_K, _ERRNO | _ENOSYS, None, None),
              ("label", "deny"), (_RET_K, _ERRNO | _EPERM, None, None)]
    return _assemble(items)
