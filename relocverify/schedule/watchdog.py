"""A watchdog for work that may hang: ``with watchdog(seconds):`` raises ``ProofTimeout`` when it outlives its time.

A proof runs under one in a worker (``engine.pipeline``), an SMT check under one in the SMT helper
(``smt_helper``): the solver gets the timeout, and a SIGALRM ``WATCHDOG_MARGIN_S`` later stops anything
else that hangs, so a run always goes on.
"""

from __future__ import annotations

import ctypes
import signal
import threading

WATCHDOG_MARGIN_S = 0.5


class ProofTimeout(Exception):
    """Raised by ``watchdog`` when the work under it outlives its time."""


def _alarm(signum, frame):
    raise ProofTimeout()


_KEPT = object()  # a watchdog that installed no handler, so restores none
_OWN_ALARM = [False]  # SIGALRM is this process's own (``own_alarm``): a watchdog only arms and disarms the timer


def own_alarm() -> None:
    """Take SIGALRM for the watchdog for the rest of this process's life: a worker process of the
    engine's pool, which runs nothing else.  Each proof's watchdog then only arms and disarms the
    timer (two system calls); installing and restoring the handler around every proof cost a
    tenth of the proof phase, in the enum conversions of ``signal.signal``."""
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGALRM, _alarm)
        _OWN_ALARM[0] = True


class watchdog:
    """``with watchdog(seconds):`` raises ``ProofTimeout`` in this thread after ``seconds``: SIGALRM in
    the main thread (local workers); in another thread (a Dask worker runs tasks in a thread pool), an
    asynchronous exception set from a timer thread.  Both land between Python bytecodes, so neither
    stops a hang inside native code; z3's own timeout covers the solver."""

    __slots__ = ("seconds", "old", "timer", "tid")

    def __init__(self, seconds: float):
        self.seconds = seconds
        self.old = _KEPT
        self.timer = None

    def __enter__(self):
        if threading.current_thread() is threading.main_thread():
            if not _OWN_ALARM[0]:
                self.old = signal.signal(signal.SIGALRM, _alarm)
            signal.setitimer(signal.ITIMER_REAL, self.seconds)
            return self
        self.tid = threading.get_ident()
        raise_in = ctypes.pythonapi.PyThreadState_SetAsyncExc
        tid = self.tid
        self.timer = threading.Timer(self.seconds,
                                     lambda: raise_in(ctypes.c_ulong(tid), ctypes.py_object(ProofTimeout)))
        self.timer.daemon = True
        self.timer.start()
        return self

    def __exit__(self, *exc) -> bool:
        if self.timer is None:
            signal.setitimer(signal.ITIMER_REAL, 0)
            if self.old is not _KEPT:
                signal.signal(signal.SIGALRM, self.old)
            return False
        self.timer.cancel()
        self.timer.join()
        ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(self.tid), None)  # one set late, not yet raised: withdrawn
        return False
