"""Traps and shadows that act on the next instruction: where each side's single-step traps fire and where
interrupts are held off, mapped between the sides (T <-> A).

The machine's rules (SDM Vol. 3 §17.3.1.4 and §6.8.3, Vol. 2 POPF, STI, MOV):

* a single-step trap follows an instruction that started with RFLAGS.TF set; so a popf (or iret) that
  sets TF traps after the *next* instruction;
* a mov to SS (or pop ss) holds off interrupts and debug traps for the next boundary: a trap due there
  waits one more instruction;
* sti that sets IF (it was clear) holds off interrupts for the next boundary;
* at CPL 3 IF is the kernel's (popf cannot change it there), so only the mov ss shadow counts.

A side's boundaries are labelled as the original's instruction stream sees them: ``at the exit`` (A+len,
or wherever control left), ``after the exit's instruction`` (the continuation, the instruction at A+len
that ``machine_trace`` runs), and ``inside`` (between two instructions of the relocation).  ``events``
lists the traps by label and whether interrupts may be taken at the exit and after its instruction;
``compare`` is '' when both sides have the same events.
"""

from __future__ import annotations

import iced_x86 as iced

from .machine_trace import IF, TF, Step, Trace

_SS = iced.Register.SS


def loads_ss(step: Step) -> bool:
    ins = step.ins
    return ins.mnemonic in (iced.Mnemonic.MOV, iced.Mnemonic.POP) and ins.op_count >= 1 \
        and ins.op0_kind == iced.OpKind.REGISTER and ins.op0_register == _SS


def shadows(step: Step, kernel: bool) -> bool:
    """Whether the boundary after ``step`` holds off interrupts."""
    if loads_ss(step):
        return True
    return kernel and step.ins.mnemonic == iced.Mnemonic.STI and not step.rflags & IF


def _labels(trace: Trace) -> list[str]:
    out = []
    steps = trace.steps
    for i, s in enumerate(steps):
        if s.continuation:
            out.append("after the exit's instruction")
        elif i + 1 < len(steps) and steps[i + 1].continuation or i + 1 == len(steps):
            out.append("at the exit")
        else:
            out.append("inside")
    return out


def events(trace: Trace, kernel: bool) -> tuple[tuple[str, ...], tuple[tuple[str, bool], ...]]:
    """(labels of the boundaries a single-step trap fires at, (label, interrupts allowed) at the exit and
    after its instruction)."""
    labels = _labels(trace)
    steps = trace.steps
    traps, windows = [], []
    pending = False
    for i, s in enumerate(steps):
        pending = pending or bool(s.rflags & TF)
        held = loads_ss(s)
        if pending and not held:
            traps.append(labels[i])
            pending = False
        if labels[i] != "inside":
            flags = steps[i + 1].rflags if i + 1 < len(steps) else trace.registers.get("rflags", 0)
            allowed = not shadows(s, kernel) and (bool(flags & IF) or not kernel)
            windows.append((labels[i], allowed))
    return tuple(traps), tuple(windows)


def compare(original: Trace, relocated: Trace, kernel: bool) -> str:
    to, wo = events(original, kernel)
    tr, wr = events(relocated, kernel)
    if to != tr:
        return f"single-step traps: original {', '.join(to) or 'none'}; relocation {', '.join(tr) or 'none'}"
    if wo != wr:
        show = lambda w: ", ".join(f"{'open' if a else 'held off'} {lab}" for lab, a in w)  # noqa: E731
        return f"interrupt windows: original {show(wo)}; relocation {show(wr)}"
    return ""
