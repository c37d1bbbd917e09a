"""Linux capabilities for the sandbox's uid switches (used inside the sandbox only; standard library).

Python has no capset(2): this module calls it through ctypes. `become(uid, keep)` turns a root process
into `uid` keeping only the capabilities `keep` (effective, permitted, inheritable and ambient, so that
they survive the exec of the next program); `drop_all()` empties every set; `held()` reads them back
from /proc/self/status so that callers can check what they hold instead of trusting the calls.
"""

import ctypes
import os

CAP_CHOWN, CAP_KILL, CAP_SETGID, CAP_SETUID = 0, 5, 6, 7
_PR_SET_KEEPCAPS, _PR_CAP_AMBIENT, _AMBIENT_RAISE, _AMBIENT_CLEAR_ALL = 8, 47, 2, 4
_VERSION_3 = 0x20080522
_libc = ctypes.CDLL(None, use_errno=True)


class _Header(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _Data(ctypes.Structure):
    _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32),
                ("inheritable", ctypes.c_uint32)]


def _check(result, what):
    if result != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def _capset(caps):
    mask = sum(1 << c for c in caps)
    data = (_Data * 2)()
    data[0].effective = data[0].permitted = data[0].inheritable = mask
    _check(_libc.capset(ctypes.byref(_Header(_VERSION_3, 0)), data), "capset")


def become(uid: int, keep=()):
    """setuid to `uid` (and its gid) keeping exactly the capabilities `keep`, also across exec."""
    _check(_libc.prctl(_PR_SET_KEEPCAPS, 1, 0, 0, 0), "prctl(PR_SET_KEEPCAPS)")
    os.setgroups([])
    os.setresgid(uid, uid, uid)
    os.setresuid(uid, uid, uid)
    _capset(keep)
    for cap in keep:
        _check(_libc.prctl(_PR_CAP_AMBIENT, _AMBIENT_RAISE, cap, 0, 0), "prctl(PR_CAP_AMBIENT_RAISE)")


def drop_all():
    """No capability left in any set (a uid change from a non-zero uid keeps them otherwise)."""
    _check(_libc.prctl(_PR_CAP_AMBIENT, _AMBIENT_CLEAR_ALL, 0, 0, 0), "prctl(PR_CAP_AMBIENT_CLEAR_ALL)")
    _capset(())


def held() -> dict:
    """{"CapEff": int, "CapPrm": int, "CapInh": int, "CapAmb": int, "Uid": [real, effective, saved, fs]}."""
    out = {}
    with open("/proc/self/status") as fh:
        for line in fh:
            key, _, value = line.partition(":")
            if key in ("CapEff", "CapPrm", "CapInh", "CapAmb"):
                out[key] = int(value.strip(), 16)
            elif key == "Uid":
                out[key] = [int(v) for v in value.split()]
    return out
