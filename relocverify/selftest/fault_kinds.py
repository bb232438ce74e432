"""Which fault, not only whether one: the first fault of each side on states made to fault, by vector, the
page-fault error code's W bit and the faulting address (``machine_trace`` models them).

Two kinds of state, both from a placed state where nothing faults:

* the page of the original's first access is not present: the original's read-modify-write faults as a
  write (W=1), a relocation that loads first faults as a read (W=0);
* a register that forms one of the original's addresses is moved so the address is non-canonical
  (``machine_states.non_canonical``): through SS (rsp, rbp, the stack of push and pop) that is #SS, a
  user process's SIGBUS; through any other register #GP, SIGSEGV.

This CPU's own answer to the second (the signal) is ``fault_signals``'; this judge sees the first at any
privilege level and address, the kernel's included.
"""

from __future__ import annotations

from ..concrete.outcome import MachineState
from .machine_states import non_canonical
from .machine_trace import PAGE, Fault, Side, Trace, run_trace


def _key(f: Fault | None):
    if f is None:
        return None
    return (f.vector, f.address, f.write) if f.vector == "#PF" else (f.vector,)


def _show(t: Trace) -> str:
    return t.fault.describe() if t.fault else "no fault"


def _first_access(t: Trace) -> int | None:
    for s in t.steps:
        if s.accesses:
            return s.accesses[0].address
    return None


def faulting_states(original: Side, state: MachineState, orig: bytes, at: int) -> list[tuple[str, MachineState,
                                                                                           frozenset[int]]]:
    """(what, state, absent pages) for each faulting variant of ``state``."""
    out = [("a non-canonical address", s, frozenset()) for s in non_canonical(orig, at, state)]
    base = run_trace(original, state)
    first = _first_access(base) if base.fault is None and base.limit is None else None
    if first is not None:
        out.append((f"the page at {first & ~(PAGE - 1):#x} not present", state, frozenset({first & ~(PAGE - 1)})))
    return out


def compare(original: Side, relocated: Side, states: list[MachineState], orig: bytes, at: int) \
        -> tuple[str, MachineState | None]:
    for state in states:
        for what, s, absent in faulting_states(original, state, orig, at):
            to = run_trace(original, s, absent=absent)
            tr = run_trace(relocated, s, absent=absent)
            if to.limit or tr.limit:
                continue
            if _key(to.fault) != _key(tr.fault):
                return f"first fault with {what}: original {_show(to)}, relocation {_show(tr)}", s
    return "", None
