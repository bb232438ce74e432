"""A concrete shadow stack: a near call pushes its return address on it, a near ret pops it and compares
it with the address it returns to (the one popped from the data stack); a mismatch raises #CP (SDM Vol. 1
§18.2; Linux ``arch/x86/kernel/shstk.c`` for user space).

The shadow stack starts with one entry, the qword at RSP (the return address a ret there would pop, as a
consistent machine has it).  ``replay`` returns the first #CP and the shadow stack at the exit; two sides
whose shadow stacks differ at the exit are told apart even without a #CP inside: the next ret of the
probed code raises it (a call turned into push+jmp leaves an entry short, a ret into pop+jmp one over).
"""

from __future__ import annotations

import struct

import iced_x86 as iced

from ..concrete.outcome import MachineState
from .machine_trace import Trace

_CALLS = (iced.FlowControl.CALL, iced.FlowControl.INDIRECT_CALL)
_NEAR_RETURNS = frozenset({iced.Mnemonic.RET})


def initial(state: MachineState) -> tuple[int, ...]:
    rsp = state.registers.get("rsp", 0)
    return (struct.unpack("<Q", bytes(state.memory.get(rsp + k, 0) for k in range(8)))[0],)


def replay(trace: Trace, start: tuple[int, ...]) -> tuple[str | None, tuple[int, ...]]:
    stack = list(start)
    steps = trace.steps
    for i, s in enumerate(steps):
        if s.continuation:
            break
        ins = s.ins
        if ins.flow_control in _CALLS and not (ins.is_call_far or ins.is_call_far_indirect):
            stack.append(s.address + len(s.raw))
        elif ins.flow_control == iced.FlowControl.RETURN and ins.mnemonic in _NEAR_RETURNS:
            target = steps[i + 1].address if i + 1 < len(steps) else trace.exit
            top = stack.pop() if stack else None
            if target is not None and top != target:
                return f"#CP: ret to {target:#x}, shadow stack {'empty' if top is None else hex(top)}", tuple(stack)
    return None, tuple(stack)


def compare(original: Trace, relocated: Trace, state: MachineState) -> str:
    start = initial(state)
    co, so = replay(original, start)
    cr, sr = replay(relocated, start)
    if co != cr:
        return f"shadow stack: original {co or 'no #CP'}; relocation {cr or 'no #CP'}"
    if so != sr:
        show = lambda s: "[" + ", ".join(hex(v) for v in s) + "]"  # noqa: E731
        return f"shadow stack at the exit: original {show(so)}, relocation {show(sr)} (the next ret raises #CP)"
    return ""
