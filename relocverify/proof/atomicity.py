"""Atomicity: an obligation a sequential semantics cannot see.

The relocated code performs the original's memory operation under LOCK
exactly when the original does (a LOCK prefix, or xchg with memory, which is
implicitly locked)."""

from __future__ import annotations

from ..x86.decode import decode
from ..x86.instruction import Instruction
from ..x86.layout import layout
from .forms import facts
from .reachable import reachable


def atomic(insn: Instruction) -> bool:
    return insn.lock or (insn.opname == "xchg" and insn.memory is not None)


def _relocated_instructions(code: bytes, tramp: int) -> list[Instruction]:
    """The instructions of trampoline code that can run, each decoded where control lands on it
    (``proof.reachable``: a jump into the middle of an instruction runs what starts there)."""
    out = []
    for address, raw in reachable(code, tramp).instructions:
        d = decode(raw, address)
        if isinstance(d, Instruction):
            out.append(d)
    return out


def _none_locked(code: bytes, tramp: int) -> bool:
    """True when no instruction the relocation can run is ``atomic``, found without decoding each with both
    decoders (9% of a kernel's relocations hold a 0xf0, 0x86 or 0x87 byte, nearly all in a displacement or the
    jump back's offset): each is one instruction on iced-x86 (``forms.facts``, kept by its shape), without 0xF0
    among its legacy prefixes (``layout``, from which ``Instruction.lock`` reads them) and not an xchg with a
    memory operand (its facts' ``locked`` hazard: iced's LOCK prefix, or the xchg mnemonic with an operand of kind
    memory, from which ``Instruction.opname`` and ``memory`` are read).  False when any is, or may be: the
    caller then decodes them all."""
    walk = reachable(code, tramp)
    if walk.problem is not None:
        return False
    for _, raw in walk.instructions:
        f = facts(raw)
        lay = layout(raw)
        if f is None or f.hazards.locked or lay is None or 0xF0 in lay.prefixes:
            return False
    return True


def _in_tracer(ins: Instruction, tracer_ranges) -> bool:
    t = ins.rip_target
    return t is not None and any(lo <= t < lo + n for lo, n in tracer_ranges)


def _same_access(orig: Instruction, reloc: Instruction) -> bool:
    """The same locked operation on the same operand: the same operation and operand size, and the
    same memory operand (a RIP-relative one re-aimed at the same address, or one through a scratch
    register, whose address the sequential obligation then checks)."""
    if reloc.opname != orig.opname or reloc.memory is None or orig.memory is None:
        return False
    if reloc.memory.size != orig.memory.size:
        return False
    if orig.rip_relative:
        return reloc.rip_target == orig.rip_target or (reloc.memory.base not in ("rip", None))
    om, rm = orig.memory, reloc.memory
    if (om.base, om.index, om.scale, om.displacement, om.segment) == \
            (rm.base, rm.index, rm.scale, rm.displacement, rm.segment):
        return True
    # Through a scratch register (``xchg %ax,4(%r11,%rdx,2)`` for ``4(%rcx,%rdx,2)``, r11 a copy of
    # rcx): the same segment override, and the address is the sequential obligation's to check, as for
    # a RIP-relative operand re-aimed through a register above.
    return om.segment == rm.segment and rm.base not in ("rip", None)


def check_atomicity(decoded: Instruction, code: bytes | None, tramp: int, tracer_ranges) -> str | None:
    """None if the obligation holds, else the refutation's reason.

    Each locked (LOCK-prefixed, or xchg with memory) access of the original must correspond to a
    locked access of the relocation with the same operation, size and operand; locked accesses to
    tracer memory do not count, and the relocation may lock nothing else."""
    want = atomic(decoded)
    if not want and (code is None or not (b"\xf0" in code or b"\x86" in code or b"\x87" in code)):
        return None  # no LOCK prefix and no xchg opcode byte anywhere: nothing locked on either side
    if not want and _none_locked(code, tramp):
        return None  # such a byte, but in no instruction's prefixes and in no xchg with memory
    locked = [] if code is None else [ins for ins in _relocated_instructions(code, tramp)
                                      if ins.memory is not None and atomic(ins) and not _in_tracer(ins, tracer_ranges)]
    if want and not locked:
        return "atomicity: the original's memory operation is LOCKed, the relocation's is not (LOCK dropped)"
    if not want and locked:
        return "atomicity: the relocation performs a LOCKed memory operation the original does not (LOCK added)"
    if len(locked) > 1:
        return "atomicity: the relocation splits the original's locked operation into several"
    if want and not _same_access(decoded, locked[0]):
        return (f"atomicity: the original's locked {decoded.opname} has no locked counterpart in the relocation "
                f"(its locked {locked[0].opname} is another operation or operand)")
    return None
