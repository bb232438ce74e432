"""The cyclic garbage collector, out of the way of bulk phases.

CPython runs a collection every 700 net allocations of container objects, and
a full one each time the survivors have grown by a quarter: a phase that
builds a million tuples, lists and dictionary entries which all live on
(the gate's sweep of a kernel: a sample list and a ``Facts`` per distinct
string) spends a third of its time walking them.  Those structures hold no
reference cycles, so nothing is lost by not looking for any while they are
built; ``paused`` turns the collector off for a phase and back on after it
(it stays off if it was off).

Turned back on, the collector would walk everything the phase built at its
next full pass (0.4 s after a kernel's gate sweep), so what exists then is
first moved out of its view (``gc.freeze``): those objects are still freed
by reference counting when no longer used, only a reference cycle among them
would never be collected, and a bulk phase builds none.
"""

from __future__ import annotations

import gc
from contextlib import contextmanager
from typing import Iterator


@contextmanager
def paused() -> Iterator[None]:
    """The collector off for the ``with`` block."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        gc.freeze()
        if was:
            gc.enable()
