"""Atomicity: an obligation a sequential semantics cannot see.

The relocated code performs the original's memory operation under LOCK
exactly when the original does (a LOCK prefix, or xchg with memory, which is
implicitly locked)."""

from __future__ import annotations

from ..x86.decode import decode
from ..x86.encoding import iter_code
from ..x86.instruction import Instruction


def atomic(insn: Instruction) -> bool:
    return insn.lock or (insn.opname == "xchg" and insn.memory is not None)


def _relocated_instructions(code: bytes, tramp: int) -> list[Instruction]:
    """The instructions of trampoline code, through the one trampoline walker."""
    out = []
    for piece in iter_code(code, tramp):
        if piece.kind == "insn":
            d = decode(code[piece.offset:piece.offset + piece.length], tramp + piece.offset)
            if isinstance(d, Instruction):
                out.append(d)
    return out


def check_atomicity(decoded: Instruction, code: bytes | None, tramp: int, tracer_ranges) -> str | None:
    """None if the obligation holds, else the refutation's reason."""
    want = atomic(decoded)
    got = 0
    if not want and (code is None or not (b"\xf0" in code or b"\x86" in code or b"\x87" in code)):
        return None  # no LOCK prefix and no xchg opcode byte anywhere: nothing locked on either side
    if code is not None:
        for ins in _relocated_instructions(code, tramp):
            if ins.memory is None or not atomic(ins):
                continue
            t = ins.rip_target
            if t is not None and any(lo <= t < lo + n for lo, n in tracer_ranges):
                continue
            got += 1
    if want and got == 0:
        return "atomicity: the original's memory operation is LOCKed, the relocation's is not (LOCK dropped)"
    if not want and got:
        return "atomicity: the relocation performs a LOCKed memory operation the original does not (LOCK added)"
    if got > 1:
        return "atomicity: the relocation splits the original's locked operation into several"
    return None

