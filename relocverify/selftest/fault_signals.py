"""This CPU's signals on the machine's edge states: which fault a user process sees, exactly.

Both sides run on the CPU (``concrete.cpu.run_on_cpu``) from states that make the machine's faults
happen: an address made non-canonical through each register that forms one (#SS is SIGBUS, #GP is
SIGSEGV) and, at a user site, RFLAGS.AC set (Linux sets CR0.AM: a misaligned access at CPL 3 is #AC,
SIGBUS), with the original's accesses aligned as placed and moved off alignment.  The killing signals
must be the same signal (the CPU judge's own comparison, ``judgement.difference``, accepts SIGBUS for
SIGSEGV, since it asks only whether some #GP could explain both); when neither side faults, the outcomes
are compared as the CPU judge compares them.

With AC set, every data access of the harness that follows counts too: the landing pad at an exit,
``jmp *0(%rip)`` and its qword, would raise #AC itself when the exit is not 8-aligned past its 6 bytes.
So each exit gets a forwarder, ``jmp rel32`` to a pad whose qword is aligned (``forwarded``); the
forwarder touches no register, flag or memory, and the pad's address is mapped back to the exit.
A kernel candidate runs as its user-space twin (``kernel_twin``), without the AC states (alignment
checking applies at CPL 3 only).
"""

from __future__ import annotations

import random
import struct

from ..concrete import cpu
from ..concrete.outcome import MachineState, Outcome
from .judgement import difference, programs
from .kernel_twin import twin
from .machine_states import kernel, misaligned, non_canonical, with_ac
from .operators import Candidate

FORWARD = 0x3000  # how far past an exit its aligned pad lies (its own page, in rel32 reach)


def forwarded(program: cpu.Program) -> tuple[cpu.Program, dict[int, int]]:
    """``program`` with each exit's landing pad moved to an address whose qword is 8-aligned, reached by a
    ``jmp rel32`` at the exit; and the map from the new pads back to the exits."""
    code, exits, back = list(program.code), [], {}
    for k, e in enumerate(program.exits):
        pad = ((e + FORWARD) & ~0xFFF) + 64 * k + 2  # +6 for jmp *0(%rip): the qword at a multiple of 8
        code.append((e, b"\xe9" + struct.pack("<i", pad - (e + 5))))
        exits.append(pad)
        back[pad] = e
    return cpu.Program(tuple(code), program.entry, tuple(exits), program.data), back


def variants(c: Candidate, states: list[MachineState], rng: random.Random, user: bool) -> list[MachineState]:
    """Every state with AC set (at a user site), then the first one with its accesses moved off alignment
    and one per register made non-canonical: which signal these raise depends on the register and the
    instruction, not on the values, and each fault costs the CPU judge a new child process."""
    out = [with_ac(s) for s in states] if user else []
    moved = misaligned(c.orig, c.at, states[0], rng) if user else None
    if moved is not None:
        out.append(with_ac(moved))
    return out + non_canonical(c.orig, c.at, states[0])


def _mapped(o: Outcome, back: dict[int, int]) -> Outcome:
    return Outcome(o.registers, back.get(o.next_rip, o.next_rip), o.writes, o.fault)


def compare(c: Candidate, states: list[MachineState], rng: random.Random) -> tuple[str, MachineState | None]:
    t = twin(c)
    if t is None:
        return "", None
    runs = variants(t, states, rng, user=not kernel(c.at))
    if not runs:
        return "", None
    try:
        (orig_p, back_o), (reloc_p, back_r) = (forwarded(p) for p in programs(t))
        orig_p.check()
        reloc_p.check()
    except ValueError:
        return "", None  # not runnable here (the CPU judge says so for the candidate itself)
    outs_o = cpu.run_on_cpu(orig_p, runs)
    outs_r = cpu.run_on_cpu(reloc_p, runs)
    tracer = ((t.tramp, len(t.reloc)),) + tuple(t.tracer_memory)
    for state, o, r in zip(runs, outs_o, outs_r):
        if o.fault != r.fault:
            return f"signal: original {o.fault or 'none'}, relocation {r.fault or 'none'}", state
        how = difference(_mapped(o, back_o), _mapped(r, back_r), tracer)
        if how:
            return how, state
    return "", None
