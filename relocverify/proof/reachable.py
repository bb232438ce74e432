"""The instructions of relocated code that can run: control flow followed, not swept.

``reachable(code, base)`` starts at ``base`` and follows every way control
can go inside ``[base, base+len(code))``: the fall-through, the target of a
direct branch, call, loop or xbegin, and the target an absolute
``jmp *0(%rip)`` reads from the qword after it.  Each instruction is decoded
(by iced-x86, which follows the hardware) from the byte control lands on, so
a jump into the middle of another instruction yields the instruction the CPU
runs there, not the one a linear sweep would list.  Every check that looks at
relocated instructions one by one (the form table, atomicity, hazards,
re-execution) reads this list.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from functools import lru_cache

import iced_x86 as iced

from ..x86.encoding import ABS_JUMP
from ..x86.registers import MASK64

_STOP = frozenset({iced.FlowControl.UNCONDITIONAL_BRANCH, iced.FlowControl.INDIRECT_BRANCH,
                   iced.FlowControl.RETURN, iced.FlowControl.INTERRUPT, iced.FlowControl.EXCEPTION})
_DIRECT = frozenset({iced.FlowControl.UNCONDITIONAL_BRANCH, iced.FlowControl.CONDITIONAL_BRANCH,
                     iced.FlowControl.CALL, iced.FlowControl.XBEGIN_XABORT_XEND})
MAX_INSTRUCTIONS = 512


@dataclass(frozen=True)
class Reachable:
    """The reachable instructions in address order, as (address, bytes); ``problem`` says why the
    walk cannot vouch for the code (None: every reachable byte decodes and stays inside it)."""

    instructions: tuple[tuple[int, bytes], ...]
    problem: str | None = None


def reachable(code: bytes, base: int) -> Reachable:
    """The walk of ``code`` at ``base``.  The last few are remembered: one relocation's walk is read by
    admission, atomicity, the machine model and its one-step test in turn (a ``Reachable`` is frozen)."""
    return _reachable(bytes(code), base)


@lru_cache(maxsize=64)
def _reachable(code: bytes, base: int) -> Reachable:
    end = base + len(code)
    seen: dict[int, bytes] = {}
    work = [base]
    while work:
        pc = work.pop()
        if pc in seen or not base <= pc < end:
            continue
        if len(seen) >= MAX_INSTRUCTIONS:
            return Reachable(tuple(sorted(seen.items())), "more reachable instructions than the walk follows")
        off = pc - base
        ins = iced.Decoder(64, code[off:off + 15], ip=pc & MASK64).decode()
        if ins.is_invalid:
            return Reachable(tuple(sorted(seen.items())),
                             f"the byte at T+{off:#x} that control can reach does not decode as an instruction "
                             f"on the CPU (#UD, or longer than 15 bytes)")
        if off + ins.len > len(code):
            return Reachable(tuple(sorted(seen.items())), f"the instruction at T+{off:#x} runs past the relocated code")
        raw = code[off:off + ins.len]
        seen[pc] = raw
        fc = ins.flow_control
        if fc not in _STOP:
            work.append(pc + ins.len)
        if fc in _DIRECT and ins.op_count and ins.op0_kind in (iced.OpKind.NEAR_BRANCH16, iced.OpKind.NEAR_BRANCH32,
                                                                iced.OpKind.NEAR_BRANCH64):
            work.append(ins.near_branch_target)
        if raw == ABS_JUMP and off + len(raw) + 8 <= len(code):
            work.append(struct.unpack_from("<Q", code, off + len(raw))[0])
    return Reachable(tuple(sorted(seen.items())))
