"""Death with the parent: a process asks the kernel for a signal when its parent ends (Linux's
``PR_SET_PDEATHSIG``), so that it cannot outlive the process that owns it, however that one
ends (a SIGKILL, the kernel's OOM killer). The embedded server's processes and the process
pool's children use it.

The signal comes when the *thread* that forked the process ends, not the whole parent: fork
from a thread that lives as long as the parent (or from a process with one thread).
"""

from __future__ import annotations

import ctypes
import sys
from collections.abc import Callable
from typing import Final

_PR_SET_PDEATHSIG: Final = 1


def _load_prctl() -> Callable[..., int] | None:
    if not sys.platform.startswith("linux"):
        return None  # no parent-death signal elsewhere
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        function: Callable[..., int] = libc.prctl
    except (OSError, AttributeError):
        return None
    return function


# Resolved at import, in the parent: a freshly forked child should do as little as possible
# (no dlopen/dlsym) before it runs what it was forked for.
_PRCTL: Final = _load_prctl()


def set_parent_death_signal(signal_number: int) -> bool:
    """Have the kernel send this process ``signal_number`` when its parent ends; False where
    the platform has no such request (not Linux). Raises ``OSError`` when the kernel refuses.

    The parent may have ended before the call: the caller compares ``os.getppid()`` with the
    parent it had, after the call."""
    if _PRCTL is None:
        return False
    number = ctypes.c_ulong(signal_number)
    zero = ctypes.c_ulong(0)
    if _PRCTL(_PR_SET_PDEATHSIG, number, zero, zero, zero) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")
    return True
