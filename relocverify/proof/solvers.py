"""Claripy solvers with a time limit, in a process ready for them.

z3 starts a thread for the first check with a time limit in a process and keeps it for the later ones; a
system that refuses it that thread (a limit on processes or threads: ``ulimit -u``, a cgroup's ``pids.max``)
makes z3 abort the whole process, with no line to say why.  ``timed_solver`` first starts (and ends) a
Python thread, which such a system refuses with the exception the command line names
(``processes.refused``), then has z3 make its thread on a trivial check; once z3 has it, no check needs
another.  Once per process: a forked child is another, and z3 forgets its threads at the fork.

``unsatisfiable`` answers the common question first: most checks of a kernel show that no input satisfies
their constraints (no difference, no exposure), and a fresh claripy solver costs about 9 ms before its first
answer (claripy asks z3 for the description of every parameter to set a time limit, then z3 builds a solver
and its tactics), where a check in a scope of one kept solver costs a few hundred µs.  Only an answer of
unsat is taken from it; a model (sat) or a timeout (unknown) is asked of a claripy solver, as before.

This module imports claripy alone (no lifter), so a module that only needs a solver stays light."""

from __future__ import annotations

import os
import threading
from functools import lru_cache

import claripy
import z3


def timed_solver(timeout_ms: int) -> claripy.Solver:
    """A claripy solver with a time limit, in a process ready for it (``_timer_ready``)."""
    _timer_ready(os.getpid())
    return claripy.Solver(timeout=timeout_ms)


def unsatisfiable(constraints, timeout_ms: int) -> bool:
    """Whether z3 shows that no input satisfies ``constraints`` (claripy booleans), within ``timeout_ms``: checked
    in a scope of its own (push, check, pop) on this thread's kept solver, in claripy's z3 context for the thread.
    False for sat and for unknown alike: the caller asks a claripy solver then (``timed_solver``)."""
    exprs = claripy.backends.z3.convert_list(list(constraints))
    context = next((e.ctx for e in exprs if isinstance(e, z3.AstRef)), None)
    if context is None:  # no expression (none, or Python booleans only): claripy's to answer
        return False
    _timer_ready(os.getpid())
    solver = _kept_solver(os.getpid(), threading.get_ident(), context)
    solver.push()
    try:
        solver.set("timeout", timeout_ms)
        solver.add(*exprs)
        return solver.check() == z3.unsat
    except z3.Z3Exception:  # whatever z3 refuses here, claripy meets and reports as before
        return False
    finally:
        solver.pop()


@lru_cache(maxsize=8)
def _kept_solver(pid: int, thread: int, context: z3.Context) -> z3.Solver:
    """One solver per process, thread and z3 context (claripy's z3 backend keeps a context per thread; a
    forked child is another process, whose solver is its own)."""
    return z3.Solver(ctx=context)


@lru_cache(maxsize=None)
def _timer_ready(pid: int) -> None:
    """This process made ready for z3's timed checks (the module doc), once per process id."""
    probe = threading.Thread(target=int, name="relocverify-thread-room")
    probe.start()
    probe.join()
    solver = claripy.Solver(timeout=60_000)
    solver.add(claripy.BVS("ready", 8) == 1)
    solver.satisfiable()
