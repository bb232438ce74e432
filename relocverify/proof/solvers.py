"""Claripy solvers with a time limit, in a process ready for them.

z3 starts a thread for the first check with a time limit in a process and keeps it for the later ones; a
system that refuses it that thread (a limit on processes or threads: ``ulimit -u``, a cgroup's ``pids.max``)
makes z3 abort the whole process, with no line to say why.  ``timed_solver`` first starts (and ends) a
Python thread, which such a system refuses with the exception the command line names
(``processes.refused``), then has z3 make its thread on a trivial check; once z3 has it, no check needs
another.  Once per process: a forked child is another, and z3 forgets its threads at the fork.

This module imports claripy alone (no lifter), so a module that only needs a solver stays light."""

from __future__ import annotations

import os
import threading
from functools import lru_cache

import claripy


def timed_solver(timeout_ms: int) -> claripy.Solver:
    """A claripy solver with a time limit, in a process ready for it (``_timer_ready``)."""
    _timer_ready(os.getpid())
    return claripy.Solver(timeout=timeout_ms)


@lru_cache(maxsize=None)
def _timer_ready(pid: int) -> None:
    """This process made ready for z3's timed checks (the module doc), once per process id."""
    probe = threading.Thread(target=int, name="relocverify-thread-room")
    probe.start()
    probe.join()
    solver = claripy.Solver(timeout=60_000)
    solver.add(claripy.BVS("ready", 8) == 1)
    solver.satisfiable()
