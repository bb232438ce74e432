"""Worker processes of the multiprocessing pools (the selftest, form validation, the gate's samples and
answers): each starts with SIGTERM's default action.

A pool forked from a process where the command line made SIGTERM raise ``KeyboardInterrupt`` (``cli.main``)
gave its workers that handler too; ``Pool.terminate`` (every ``with Pool(...)`` block ends with it) sends
SIGTERM, and a worker that caught the exception, or took it while another worker held the task queue's lock,
went on waiting for a task that never came: the parent's ``join`` waited for ever (seen once in CI, in the
selftest).  With the default action the kernel ends the worker wherever it is.

A worker also ends with its parent (``die_with_parent``): a parent killed with SIGKILL runs no cleanup, and
its workers went on running for good (issue 44)."""

from __future__ import annotations

import ctypes
import os
import signal

_PR_SET_PDEATHSIG = 1


def alive(pid: int) -> bool:
    """Whether process ``pid`` exists (one of another user's counts: it cannot be signalled, but it is there)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def die_with_parent() -> None:
    """The kernel sends this process SIGKILL when its parent ends, however the parent ends (Linux
    ``prctl(PR_SET_PDEATHSIG)``); if the parent is gone already, this process ends now."""
    parent = os.getppid()
    try:
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):  # not Linux: the worker outlives a killed parent, as before
        return
    if os.getppid() != parent:
        os._exit(1)


def pool_worker() -> None:
    """A pool's ``initializer``: SIGTERM ends this worker, and so does its parent's end."""
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    die_with_parent()
