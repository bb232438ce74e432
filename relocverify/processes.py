"""Worker processes of the multiprocessing pools (the selftest, form validation, the gate's samples and
answers): each starts with SIGTERM's default action.

A pool forked from a process where the command line made SIGTERM raise ``KeyboardInterrupt`` (``cli.main``)
gave its workers that handler too; ``Pool.terminate`` (every ``with Pool(...)`` block ends with it) sends
SIGTERM, and a worker that caught the exception, or took it while another worker held the task queue's lock,
went on waiting for a task that never came: the parent's ``join`` waited for ever (seen once in CI, in the
selftest).  With the default action the kernel ends the worker wherever it is."""

from __future__ import annotations

import signal


def pool_worker() -> None:
    """A pool's ``initializer``: SIGTERM ends this worker."""
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
