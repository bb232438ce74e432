"""The machine's judgement of a candidate the CPU judge (``selftest.judgement``) found alike: does the
relocation behave as the original in the machine it runs in?

``judge_machine(candidate, n, rng)`` asks, in order, and returns the first difference:

1. for a candidate at a kernel site, the CPU judge on its user-space twin (``kernel_twin``): the CPU
   cannot run kernel addresses, so this is where such a candidate's values are judged;
2. the CPU on the machine's edge states (``fault_signals``): non-canonical addresses by register (SIGBUS
   for #SS, SIGSEGV for #GP), RFLAGS.AC with aligned and misaligned accesses at CPL 3 (#AC);
3. the machine monitor on unicorn (``machine_trace``), both sides run with the instruction after the exit
   (``traps``: single-step traps and interrupt shadows, T <-> A), ``indirect_branches`` (IBT, CPL 0) and
   ``shadow_stack``; then ``fault_kinds`` (the first fault's vector, W bit and address, with a page absent
   or an address non-canonical) and ``interrupt_frames`` (a frame written at each boundary of the
   relocation).

None of these calls the checker or reads its machine model (``proof.machine_model``): they are the
machine as the manuals and this CPU describe it.  The states are ``machine_states.placed`` (``n // 3``,
at least 2), with TF set in a popped qword for the traps; the interrupt frames run the first two with
either RSP residue.  Concurrency candidates are the memory-model table's alone.
"""

from __future__ import annotations

import random

import iced_x86 as iced

from ..concrete.outcome import MachineState
from . import fault_kinds, fault_signals, indirect_branches, interrupt_frames, shadow_stack, traps
from .judgement import Judgement, judge
from .kernel_twin import twin
from .machine_states import kernel, other_residue, placed, popped_tf
from .machine_trace import run_trace, sides
from .operators import Candidate


_POPS = frozenset({iced.Mnemonic.POPF, iced.Mnemonic.POPFQ, iced.Mnemonic.POPFD, iced.Mnemonic.IRET,
                   iced.Mnemonic.IRETQ, iced.Mnemonic.IRETD})


def _found(how: str, state: MachineState | None, runs: int) -> Judgement:
    return Judgement(True, how, state, runs)


def _monitored(c: Candidate, states: list[MachineState]) -> tuple[str, MachineState | None]:
    """traps, IBT and the shadow stack, on traces that run on into the exit's instruction."""
    original, relocated = sides(c.orig, c.at, c.reloc, c.tramp, continuation=True)
    after = frozenset(a for a, code in original.code[1:])
    cpl0 = kernel(c.at)
    for state in states:
        to = run_trace(original, state, continuation=after)
        tr = run_trace(relocated, state, continuation=after)
        if to.limit or tr.limit:
            continue
        how = traps.compare(to, tr, cpl0) or shadow_stack.compare(to, tr, state)
        if not how and cpl0:
            how = indirect_branches.compare(to, tr, c.at, c.tramp, len(c.orig), len(c.reloc))
        if how:
            return how, state
    return "", None


def _pops_flags(c: Candidate) -> bool:
    """Either side has a popf or iret (a linear sweep: enough to decide whether TF states are worth it)."""
    return any(ins.mnemonic in _POPS for code, at in ((c.orig, c.at), (c.reloc, c.tramp))
               for ins in iced.Decoder(64, code, ip=at))


def judge_machine(c: Candidate, n: int = 12, rng: random.Random | None = None) -> Judgement:
    """See the module doc."""
    rng = rng or random.Random(0)
    if c.concurrency:
        return Judgement(False, "", None, 0)
    if kernel(c.at):
        t = twin(c)
        if t is not None:
            j = judge(t, n, rng)
            if j.differs:
                return _found(f"(user-space twin) {j.how}", j.state, j.runs)
    states = placed(c.orig, c.at, max(2, n // 3), rng)
    if not states:
        return Judgement(False, "no state places the original's accesses", None, 0)
    how, state = fault_signals.compare(c, states, rng)
    if how:
        return _found(f"on this CPU: {how}", state, len(states))
    how, state = _monitored(c, states + ([popped_tf(s) for s in states] if _pops_flags(c) else []))
    if how:
        return _found(how, state, len(states))
    original, relocated = sides(c.orig, c.at, c.reloc, c.tramp)
    how, state = fault_kinds.compare(original, relocated, states, c.orig, c.at)
    if how:
        return _found(how, state, len(states))
    few = states[:2]  # the frame's effect depends on RSP's alignment more than on values
    how, state = interrupt_frames.compare(relocated, c.tramp, few + [other_residue(s) for s in few], kernel(c.at), rng)
    if how:
        return _found(how, state, len(states))
    return Judgement(False, "", None, len(states))
