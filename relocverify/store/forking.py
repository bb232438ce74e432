"""SQLite on threads of our own, and ``fork``.

A run forks its workers and its SMT helper from a process in which threads of ours may be inside SQLite:
the proof cache written behind the workers (``engine.phases.harvest.Behind``), the store's checkpoint and merges behind
(``store._Checkpoint``, ``store._Merger``).  SQLite keeps process-wide mutexes (its memory accounting takes one
around every allocation); a child forked while another thread holds one inherits it held, and the child's
first SQLite call waits for ever.  A whole-kernel run's jump-probe workers, forked while the last merge's
checkpoint ran, hung so in their first ``ProofCache`` connect.

Each such thread does its SQLite work inside ``sqlite_work()``; before every fork of this process
(``os.register_at_fork``: multiprocessing's too) the forking thread waits until no thread is inside, and keeps
any from entering until the child is made.  The child starts with no thread inside (it has none of them).
"""

from __future__ import annotations

import os
import threading
from contextlib import contextmanager


class _State:
    def __init__(self):
        self.cond = threading.Condition()
        self.inside = 0  # threads inside sqlite_work()
        self.forking = False  # a fork is being made: nobody enters


_STATE = _State()


@contextmanager
def sqlite_work():
    """Mark the calling thread as inside SQLite for the block: no fork of this process happens meanwhile (so
    the block itself must not fork, or start a process: its fork would wait for it)."""
    state = _STATE
    with state.cond:
        while state.forking:
            state.cond.wait()
        state.inside += 1
    try:
        yield
    finally:
        with state.cond:
            state.inside -= 1
            state.cond.notify_all()


def _before_fork() -> None:
    state = _STATE
    state.cond.acquire()
    state.forking = True
    while state.inside:
        state.cond.wait()
    # the condition's lock stays held through the fork: nobody can enter until after it


def _after_fork_in_parent() -> None:
    state = _STATE
    state.forking = False
    state.cond.notify_all()
    state.cond.release()


def _after_fork_in_child() -> None:
    global _STATE
    _STATE = _State()  # the parent's threads are not here; its lock, held, is not used again


os.register_at_fork(before=_before_fork, after_in_parent=_after_fork_in_parent,
                    after_in_child=_after_fork_in_child)
