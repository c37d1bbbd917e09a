"""A seccomp filter for the sandbox: the kernel's key management calls fail with EPERM.

Linux keeps a keyring per uid (`@u`, `@us`, persistent keyrings) that outlives the processes of that uid,
and the grader reuses uids from one submission to the next: a key one student's code adds would be
readable by the next student graded under the same uid. Nothing a notebook needs uses keys, so the
sandbox denies `add_key`, `request_key` and `keyctl` outright. The filter is a classic BPF program (what
`bwrap --seccomp FD` loads, in the layout of libseccomp's `seccomp_export_bpf`), built here without
libseccomp: it checks the architecture first, so the 32-bit and x32 entry points cannot go around it.
"""

from __future__ import annotations

import platform
import struct

# struct seccomp_data: int nr (offset 0), __u32 arch (offset 4)
_LD_W_ABS, _JEQ_K, _JGE_K, _RET_K = 0x20, 0x15, 0x35, 0x06
_ALLOW, _ERRNO = 0x7FFF0000, 0x00050000
_EPERM = 1
# machine -> (AUDIT_ARCH_*, the key syscalls' numbers, first number of a foreign ABI or None)
_ARCHES = {
    "x86_64": (0xC000003E, (248, 249, 250), 0x40000000),   # add_key, request_key, keyctl; x32 above
    "aarch64": (0xC00000B7, (217, 218, 219), None),
}
DENIED = ("add_key", "request_key", "keyctl")


def _op(code, k, jt=0, jf=0):
    return struct.pack("=HBBI", code, jt, jf, k)


def key_syscalls_filter(machine: str | None = None) -> bytes | None:
    """The BPF program (bytes) for this machine, or None where the architecture is not known here.

    0: A = arch; 1: another arch -> deny; 2: A = nr; 3 .. 2+n: a denied number (or a foreign ABI) -> deny;
    3+n: allow; 4+n: deny (EPERM). A jump's offset counts from the next instruction.
    """
    arch = _ARCHES.get(machine or platform.machine())
    if arch is None:
        return None
    audit_arch, numbers, foreign = arch
    checks = ([(_JGE_K, foreign)] if foreign is not None else []) + [(_JEQ_K, n) for n in numbers]
    deny = 4 + len(checks)
    prog = [_op(_LD_W_ABS, 4), _op(_JEQ_K, audit_arch, 0, deny - 2), _op(_LD_W_ABS, 0)]
    for i, (code, k) in enumerate(checks):
        prog.append(_op(code, k, deny - (3 + i) - 1, 0))
    prog += [_op(_RET_K, _ALLOW), _op(_RET_K, _ERRNO | _EPERM)]
    return b"".join(prog)
