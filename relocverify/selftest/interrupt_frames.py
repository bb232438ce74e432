"""Interrupts between the relocation's instructions: the frame the machine writes below RSP at a boundary.

An interrupt or exception taken at CPL 0 pushes its frame on the current stack, from RSP aligned down to 16
bytes (SDM Vol. 3 §6.14.2), and Linux's entry code pushes ``pt_regs`` and calls on under it before it
switches stacks (``arch/x86/entry/entry_64.S``); only NMI, #DB, #MC and #DF switch to an IST stack first.
The kernel has no red zone.  At CPL 3 a signal handled between two instructions gets its frame below the
128-byte red zone (System V ABI §3.2.2; Linux ``get_sigframe``).  ``frame`` writes random bytes where
those land: ``KERNEL_FRAME`` bytes under the aligned RSP, or ``SIGNAL_FRAME`` bytes under RSP-128.

``compare`` runs the relocation with the frame written at each boundary between two of its instructions at
which the machine can take an interrupt (CPL 0: IF set and no sti/mov ss shadow; CPL 3: no mov ss shadow),
and tells it apart when its exit, fault, registers (GPRs, xmm, RFLAGS' status flags and DF) or live memory
differ both from the run with the same frame written before the relocation and from the one with it
written after: the original is one instruction, and an interrupt can come only before or after it (the
relocation is equivalent to it on every state, the ones a frame leaves behind included).  Memory below
the final RSP is dead (CPL 3: below the red zone) and not compared.
"""

from __future__ import annotations

import random
from typing import Callable

from ..concrete.outcome import MachineState
from ..x86.registers import MASK64
from .machine_trace import COMPARED, IF, Side, Trace, run_trace
from .traps import shadows

KERNEL_FRAME = 256
SIGNAL_FRAME = 1024
RED_ZONE = 128
DEAD = 0x10000  # how far below the final RSP memory counts as the dead part of the stack
RFLAGS_COMPARED = 0x8D5 | 0x400


def frame(kernel: bool, rng: random.Random) -> Callable[[int], tuple[int, bytes]]:
    size = KERNEL_FRAME if kernel else SIGNAL_FRAME
    data = rng.randbytes(size)

    def write(rsp: int) -> tuple[int, bytes]:
        top = (rsp & ~15) if kernel else ((rsp - RED_ZONE) & ~15)
        return (top - size) & MASK64, data

    return write


def boundaries(trace: Trace, kernel: bool) -> list[int]:
    """The indices k of the relocation's own instructions (k >= 1) before which an interrupt can come."""
    own = trace.own_steps()
    return [k for k in range(1, len(own))
            if not shadows(own[k - 1], kernel) and (not kernel or own[k].rflags & IF)]


def _live(t: Trace, state: MachineState, kernel: bool) -> dict[int, int]:
    """The bytes ``t`` wrote outside the dead part of the stack (below the final RSP, or its red zone)."""
    limit = (t.registers.get("rsp", 0) - (0 if kernel else RED_ZONE)) & MASK64
    return {a: v for a, v in t.memory.items() if not 0 < (limit - a) & MASK64 <= DEAD}


def difference(base: Trace, hit: Trace, state: MachineState, kernel: bool) -> str:
    if (base.exit, base.fault) != (hit.exit, hit.fault):
        return (f"exit {base.exit and hex(base.exit)} / {base.fault}, with the interrupt "
                f"{hit.exit and hex(hit.exit)} / {hit.fault}")
    for name in COMPARED:
        a, b = base.registers.get(name, 0), hit.registers.get(name, 0)
        if name == "rflags":
            a, b = a & RFLAGS_COMPARED, b & RFLAGS_COMPARED
        if a != b:
            return f"{name}: {a:#x}, with the interrupt {b:#x}"
    lb, lh = _live(base, state, kernel), _live(hit, state, kernel)
    for a in sorted(set(lb) | set(lh)):
        before = state.memory.get(a, 0)
        if lb.get(a, before) != lh.get(a, before):
            return f"memory at {a:#x}: {lb.get(a, before):#04x}, with the interrupt {lh.get(a, before):#04x}"
    return ""


def compare(relocated: Side, tramp: int, states: list[MachineState], kernel: bool, rng: random.Random) \
        -> tuple[str, MachineState | None]:
    write = frame(kernel, rng)
    for state in states:
        base = run_trace(relocated, state)
        if base.limit or base.fault:
            continue  # a faulting relocation is the fault judges' to compare
        own = base.own_steps()
        inside = boundaries(base, kernel)
        if not inside:
            continue
        before = run_trace(relocated, state, interrupt=(0, write))
        after = run_trace(relocated, state, interrupt=(len(own), write))
        for k in inside:
            hit = run_trace(relocated, state, interrupt=(k, write))
            how = difference(before, hit, state, kernel) and difference(after, hit, state, kernel)
            if how:
                where = "an interrupt" if kernel else "a signal"
                return (f"{where} before T+{own[k].address - tramp:#x} (frame below rsp={own[k].rsp:#x}), against "
                        f"one after the relocation: {how}"), state
    return "", None
