"""Indirect-branch tracking (IBT) at CPL 0: an indirect jmp or call must land on ``endbr64``, else #CP.

The Debian 6.12 kernel sets ``MSR_IA32_S_CET = CET_ENDBR_EN`` without ``CET_NO_TRACK_EN``, so every
indirect near jmp and call is tracked, ``notrack`` (0x3e) or not (SDM Vol. 1 §18.3; Linux
``arch/x86/kernel/cet.c``).  ``first_violation`` walks a trace: the instruction after each indirect jmp or
call must be ``f3 0f 1e fa``.  A target outside the side's own code (A+len, a branch target, the pad) is
code this judge does not have: it counts as not ``endbr64``, as it is for most instructions of a kernel.
Returns are the shadow stack's business (``shadow_stack``), and far transfers are not traced.
"""

from __future__ import annotations

import iced_x86 as iced

from .machine_trace import ENDBR64, Trace

_TRACKED = (iced.FlowControl.INDIRECT_BRANCH, iced.FlowControl.INDIRECT_CALL)


def first_violation(trace: Trace, region: tuple[int, int], name: str) -> str | None:
    """The first indirect branch of ``trace`` that does not land on endbr64, as '#CP: ...', or None."""
    steps = trace.steps
    lo, n = region
    for i, s in enumerate(steps):
        if s.continuation:
            break
        ins = s.ins
        if ins.flow_control not in _TRACKED or ins.is_jmp_far_indirect or ins.is_call_far_indirect:
            continue
        nxt = steps[i + 1] if i + 1 < len(steps) else None
        target = nxt.address if nxt is not None else trace.exit
        if target is None:
            return None  # it faulted reading its target
        own = nxt is not None and not nxt.continuation
        if own and nxt.raw == ENDBR64:
            continue
        where = f"{name}+{target - lo:#x}" if lo <= target < lo + n else f"{target:#x}"
        kind = "call" if ins.flow_control == iced.FlowControl.INDIRECT_CALL else "jmp"
        return f"#CP: an indirect {kind} to {where}, not endbr64"
    return None


def compare(original: Trace, relocated: Trace, at: int, tramp: int, length: int, reloc_length: int) -> str:
    vo = first_violation(original, (at, length), "A")
    vr = first_violation(relocated, (tramp, reloc_length), "T")
    if vo != vr:
        return f"IBT: original {vo or 'no #CP'}; relocation {vr or 'no #CP'}"
    return ""
