"""Worker processes of the multiprocessing pools (the selftest, form validation, the gate's samples and
answers): each starts with SIGTERM's default action.

A pool forked from a process where the command line made SIGTERM raise ``KeyboardInterrupt`` (``cli.main``)
gave its workers that handler too; ``Pool.terminate`` (every ``with Pool(...)`` block ends with it) sends
SIGTERM, and a worker that caught the exception, or took it while another worker held the task queue's lock,
went on waiting for a task that never came: the parent's ``join`` waited for ever (seen once in CI, in the
selftest).  With the default action the kernel ends the worker wherever it is.

A worker also ends with its parent (``die_with_parent``): a parent killed with SIGKILL runs no cleanup, and
its workers went on running for good (issue 44).  Not with ``prctl(PR_SET_PDEATHSIG)``: its signal comes
when the parent *thread* that forked the worker ends, and a pool forks the workers that replace those past
``maxtasksperchild`` from its worker-handler thread, which ends in ``terminate``; those workers were
killed there, one of them holding the task queue's lock, and ``terminate`` waited for that lock for ever
(the 20,000-pair selftest hung after its last candidate).  A thread in the worker watches its parent
process instead."""

from __future__ import annotations

import os
import signal
import threading
import time


def alive(pid: int) -> bool:
    """Whether process ``pid`` exists (one of another user's counts: it cannot be signalled, but it is there)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def die_with_parent(period: float = 0.25) -> None:
    """This process ends (``os._exit``) within ``period`` seconds of its parent process's end, however the
    parent ends: a daemon thread compares ``os.getppid()`` with the parent's (a child whose parent ends is
    given to another)."""
    parent = os.getppid()

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(period)
        os._exit(1)

    threading.Thread(target=watch, name="die-with-parent", daemon=True).start()


def pool_worker() -> None:
    """A pool's ``initializer``: SIGTERM ends this worker, and so does its parent's end."""
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    die_with_parent()
