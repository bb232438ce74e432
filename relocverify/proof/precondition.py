"""The vacuity check: a precondition must admit the original's runs before a proof under it means anything.

The obligation assumes tracer memory is private: no access of the original
touches it (``smt.private_tracer_memory``).  Ranges whose union covers the
whole address space (two halves, each acceptable alone), or the one address
a RIP-relative operand reads, make that assumption false for every state,
and from a false assumption anything is ``proved``.  ``check_tracer_memory``
refuses such input before any proof, as an ``InputError`` (exit 2):

1. each range is canonical (it neither starts nor ends in, nor spans, the
   non-canonical hole) and at least one byte;
2. their union is bounded (``MAX_TRACER_MEMORY``: a tracer's private memory is
   a few pages of trampolines and save slots, not a share of the address space);
3. no range overlaps the original instruction's own bytes;
4. a *witness* exists: the solver finds a state in which the original runs
   and none of its accesses touches tracer memory, and unicorn, running the
   original from that state, completes without writing into it.
"""

from __future__ import annotations

from ..concrete.outcome import MachineState
from ..errors import InputError
from ..x86.instruction import Instruction
from ..x86.registers import MASK64, is_canonical
from .solvers import timed_solver

MAX_TRACER_MEMORY = 1 << 24  # 16 MiB


def _overlaps(a: int, n: int, b: int, m: int) -> bool:
    return a < b + m and b < a + n


def check_tracer_memory(decoded: Instruction, tramp: int, code_length: int,
                        ranges: tuple[tuple[int, int], ...]) -> None:
    """Raise InputError if ``ranges`` (tracer memory besides the relocated code) make the obligation's
    precondition unsatisfiable or near-empty for ``decoded``; see the module doc."""
    total = 0
    for lo, n in ranges:
        if n < 1:
            raise InputError(f"tracer memory {lo:#x}:{n}: a range needs at least one byte")
        hi = lo + n - 1
        if hi > MASK64 or not is_canonical(lo) or not is_canonical(hi) or (lo >> 47) != (hi >> 47):
            raise InputError(f"tracer memory {lo:#x}:{n:#x} is not canonical memory (it starts, ends or runs "
                             f"through the non-canonical hole): no tracer can own it")
        total += n
    if total > MAX_TRACER_MEMORY:
        raise InputError(f"tracer memory totals {total:#x} bytes, more than {MAX_TRACER_MEMORY:#x}: a "
                         f"precondition that large leaves the original almost no state to run in, so a proof "
                         f"under it would be vacuous; name the tracer's own pages only")
    for lo, n in ranges:
        if _overlaps(lo, n, decoded.address, decoded.length):
            raise InputError(f"tracer memory {lo:#x}:{n:#x} overlaps the original instruction at "
                             f"{decoded.address:#x}: the tracer cannot own the code it probes")
    if ranges:
        _witness(decoded, tramp, code_length, ranges)


def _witness(decoded: Instruction, tramp: int, code_length: int, ranges) -> None:
    from ..concrete.machine import run_original
    from . import semantics as S
    from .smt import model_state, private_tracer_memory

    world = S.World({}, ((tramp, code_length),) + tuple(ranges))
    try:
        orig = S.execute_original(world, decoded.raw, decoded.address)
    except S.Gap:
        return  # no semantics to ask: the bounds above are all that can be checked
    solver = timed_solver(10_000)
    for c in world.constraints() + private_tracer_memory(world, orig):
        solver.add(c)
    if not solver.satisfiable():
        raise InputError(f"no state lets {decoded.text} at {decoded.address:#x} run without touching the tracer "
                         f"memory given: the precondition is unsatisfiable, and any relocation would be 'proved' "
                         f"under it (the ranges cover every address it can access)")
    regs, mem = model_state(world, solver)
    state = MachineState(dict(regs), dict(mem))
    out = run_original(decoded.raw, decoded.address, state)
    touched = [a for a in out.writes if any(lo <= a < lo + n for lo, n in ranges)]
    if touched:
        raise InputError(f"the witness state for the precondition writes tracer memory at {touched[0]:#x} on "
                         f"unicorn: the ranges given are not private to the tracer")
