"""Admission: may the semantics be trusted for this original and this relocation?

A proof from ``proof.semantics`` says what VEX's model of the two sides
does.  Before it counts as a proof of what the CPU does, every instruction
that can run on either side (the originals, and the relocation's reachable
instructions, ``proof.reachable``) must pass the checks below, one
mechanism per way the model can be wrong.  The same checks apply to both
sides: nothing is exempt for being on the relocated side.

1. **Decodes on the CPU, the same on every vendor.**  Each instruction must
   be one valid instruction to iced-x86 (which follows the hardware: at most
   15 bytes, a REX before a legacy prefix ignored, invalid encodings
   invalid), and Intel and AMD must read it alike (``forms.InsnFacts.
   vendor_split``); otherwise ``unknown``: the proof would be of one reading.
2. **No feature the original does not need.**  The relocation may use no
   CPUID feature beyond the original's (and the x86-64 baseline): on a CPU
   without it, it raises #UD where the original runs.
3. **Hazards outside the IR match.**  The sequence of fence kinds, LOCKed
   operations, non-temporal accesses, cache-line flushes, alignment
   requirements and zmm upper-bit zeroing must be the original's, in order
   (VEX lifts every fence to one ``MBE``, a non-temporal store to a plain
   store).  A relocation that drops or weakens an ordering the original has
   is ``refuted`` (``memory-model``: a concurrent observer tells them apart,
   SDM Vol. 3 §9.2; no sequential replay can); any other mismatch ``unknown``.
4. **Only validated forms** (``form_table``, default deny): every
   instruction's form must have been run on a CPU against the semantics.
   An ``exact`` form may appear anywhere.  A ``loose`` form, or an original
   with a loose reason the lifter checks find (``lifter_checks``), is trusted
   only as an original that the relocation *re-executes*: the same
   operation on the same register operands and immediates (a memory operand
   may be re-encoded), with nothing around it but ``exact`` moves and jumps
   that write no flag and none of its outputs; and only if it does not
   transfer control (a branch's target is exactly what a loose model could
   get wrong).  A form without a row, or ``failed``, is never trusted.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import iced_x86

from ..x86.instruction import Instruction
from ..x86.registers import reg_family
from . import form_table
from .forms import InsnFacts, extra_features, facts
from .lifter_checks import loose_reasons
from .reachable import reachable

#: Instructions a re-executing relocation may put around the original: moves to and from its own
#: slots, the scratch load, jumps and NOPs (none writes a flag).
MOVES = frozenset({"mov", "movabs", "jmp", "nop"})
_WRITES = {3, 4, 5, 6}
_INFO = iced_x86.InstructionInfoFactory()
_REG_NAME = {v: k.lower() for k, v in vars(iced_x86.Register).items() if k.isupper() and isinstance(v, int)}


@dataclass(frozen=True)
class Admission:
    """``trusted``: a proof by the semantics may be accepted.  Otherwise ``reason`` says why not;
    ``refutation`` is set when the mismatch is itself a difference (an ordering dropped or weakened);
    ``unvalidated`` when an instruction's semantics was never validated (a byte-identical copy of such an
    original is ``opaque``, not ``unknown``)."""

    trusted: bool
    reason: str = ""
    refutation: str | None = None
    unvalidated: bool = False


TRUSTED = Admission(True)


def _iced(raw: bytes, address: int):
    return iced_x86.Decoder(64, raw, ip=address).decode()


def _written(ins) -> set[str]:
    return {reg_family(_REG_NAME.get(r.register, "")) for r in _INFO.info(ins).used_registers()
            if r.access in _WRITES}


def same_operation(a, b) -> bool:
    """Same iced code, the same register operands and immediates; memory operands may differ in their
    encoding (a RIP-relative displacement re-aimed, a scratch base register)."""
    if a.code != b.code or a.op_count != b.op_count:
        return False
    for k in range(a.op_count):
        ka, kb = a.op_kind(k), b.op_kind(k)
        if ka != kb:
            return False
        if ka == iced_x86.OpKind.REGISTER and a.op_register(k) != b.op_register(k):
            return False
        if ka in (iced_x86.OpKind.IMMEDIATE8, iced_x86.OpKind.IMMEDIATE16, iced_x86.OpKind.IMMEDIATE32,
                  iced_x86.OpKind.IMMEDIATE64, iced_x86.OpKind.IMMEDIATE8TO16, iced_x86.OpKind.IMMEDIATE8TO32,
                  iced_x86.OpKind.IMMEDIATE8TO64, iced_x86.OpKind.IMMEDIATE32TO64, iced_x86.OpKind.IMMEDIATE8_2ND) \
                and a.immediate(k) != b.immediate(k):
            return False
    return True


def _used(ins) -> set[str]:
    return {reg_family(_REG_NAME.get(r.register, "")) for r in _INFO.info(ins).used_registers()} - {""}


def _address_registers(ins) -> set[str]:
    return {reg_family(_REG_NAME.get(r, "")) for r in (ins.memory_base, ins.memory_index)
            if r not in (iced_x86.Register.NONE, iced_x86.Register.RIP)} if any(
        ins.op_kind(k) == iced_x86.OpKind.MEMORY for k in range(ins.op_count)) else set()


def reexecution(original: Instruction, code: bytes | None, tramp: int) -> int | None:
    """The address at which the relocated ``code`` re-executes ``original``'s operation, or None.

    The relocation's reachable instructions, straight-line in address order, must be that one X (the
    same operation on the same register operands and immediates, ``same_operation``) and otherwise
    only moves and jumps (``MOVES``) that write no flag; before X they may write only the base or
    index register of X's re-encoded memory operand, and only one the original does not use at all
    (so every input the CPU reads for X is the original's, whatever VEX thinks X reads); after X,
    no output of the original (so every output the CPU computes survives, whatever VEX thinks X
    writes)."""
    if code is None:
        return None
    walk = reachable(code, tramp)
    if walk.problem is not None:
        return None
    orig = _iced(original.raw, original.address)
    outputs, used = _written(orig), _used(orig)
    chosen = None
    for address, raw in walk.instructions:
        ins = _iced(raw, address)
        if chosen is None and same_operation(orig, ins):
            chosen = (address, ins)
            break
    if chosen is None:
        return None
    at, again = chosen
    scratch = _address_registers(again) - used
    for address, raw in walk.instructions:
        if address == at:
            continue
        ins = _iced(raw, address)
        f = facts(raw)
        if f is None or f.mnemonic not in MOVES or ins.rflags_modified:
            return None
        if f.flow != "next" and ins.op_count and ins.op0_kind in (iced_x86.OpKind.NEAR_BRANCH32,
                                                                 iced_x86.OpKind.NEAR_BRANCH64, iced_x86.OpKind.NEAR_BRANCH16) \
                and tramp <= ins.near_branch_target < tramp + len(code) and ins.near_branch_target <= address:
            return None  # a jump backwards: "before" and "after" would not be program order
        written = _written(ins)
        if address < at and written - scratch:
            return None
        if address > at and written & outputs:
            return None
    return at


def reexecutes(original: Instruction, code: bytes | None, tramp: int) -> bool:
    return reexecution(original, code, tramp) is not None


def _signature(fs: Sequence[InsnFacts]) -> list[tuple]:
    return [(f.hazards, f.align, f.align_legacy, f.zeroes_upper) for f in fs
            if f.hazards or f.align or f.zeroes_upper]


def _describe(sig: list[tuple]) -> str:
    parts = []
    for hazards, align, _, upper in sig:
        bits = [hazards.describe()] if hazards else []
        bits += [f"aligned {align}"] if align else []
        bits += [f"zeroes zmm{list(upper)} upper"] if upper else []
        parts.append(" ".join(bits))
    return "[" + "; ".join(parts) + "]" if parts else "[none]"


def _weaker(orig: list[tuple], reloc: list[tuple]) -> bool:
    """The relocation lacks an ordering guarantee the original has: a fence gone or of another kind, a
    store made non-temporal, a cache flush gone (LOCK is atomicity's obligation)."""
    fo = [h.fence for h, *_ in orig if h.fence]
    fr = [h.fence for h, *_ in reloc if h.fence]
    nt = sum(h.nontemporal for h, *_ in reloc) > sum(h.nontemporal for h, *_ in orig)
    flush = [h.cache for h, *_ in orig if h.cache] != [h.cache for h, *_ in reloc if h.cache]
    return fo != fr and not (len(fr) > len(fo) and all(f in fr for f in fo)) or nt or flush


def status(f: InsnFacts, insn: Instruction | None = None) -> tuple[str | None, str]:
    """(status, reason): 'exact', 'loose' or None (never trusted), with the reason for the latter two."""
    row = form_table.load().row(f.form)
    if row is None:
        why = "x87/MMX state (FSW exception flags, ES, B, the 80-bit stack) that VEX does not have" if f.x87 else \
            "no CPU validation of this form"
        return None, f"its form ({f.form.split(' |')[0]}) is not in the CPU-validated table: {why}"
    if row.status == "failed":
        return None, f"its form ({f.form.split(' |')[0]}) failed CPU validation: {row.loose[0] if row.loose else '?'}"
    static = loose_reasons(insn) if insn is not None else ()
    if row.status == "loose" or static:
        what = static[0] if static else f"differs from the CPU in {', '.join(row.loose)} (CPU validation)"
        return "loose", what
    return "exact", ""


def _relocated_facts(code: bytes, tramp: int) -> tuple[list[tuple[int, InsnFacts]], str | None]:
    walk = reachable(code, tramp)
    if walk.problem is not None:
        return [], walk.problem
    out = []
    for address, raw in walk.instructions:
        f = facts(raw)
        if f is None:
            return [], f"T+{address - tramp:#x} does not decode as one instruction on the CPU"
        if f.vendor_split:
            return [], f"the relocation's instruction at T+{address - tramp:#x} decodes differently by vendor: {f.vendor_split}"
        out.append((address, f))
    return out, None


def admit(originals: Sequence[Instruction], pieces: Sequence[tuple[bytes | None, int]]) -> Admission:
    """Admission of originals[i] relocated as pieces[i] = (code, address) (code None: an emulation).

    One instruction and its trampoline is ``admit([insn], [(code, tramp)])``; a jump probe's block
    passes each instruction with its piece of the trampoline."""
    ofacts = []
    for insn in originals:
        f = facts(insn.raw)
        if f is None:
            return Admission(False, f"the CPU does not decode {insn.raw.hex()} as one instruction")
        if f.vendor_split:
            return Admission(False, f"the original decodes differently by vendor: {f.vendor_split}")
        ofacts.append(f)
    rfacts: list[list[tuple[int, InsnFacts]]] = []
    for code, base in pieces:
        if code is None:
            rfacts.append([])
            continue
        fs, problem = _relocated_facts(code, base)
        if problem is not None:
            return Admission(False, problem)
        rfacts.append(fs)
    every_r = [f for fs in rfacts for _, f in fs]
    extra = extra_features(frozenset().union(*(f.features for f in ofacts)),
                           frozenset().union(*(f.features for f in every_r)) if every_r else frozenset())
    if extra:
        return Admission(False, f"the relocation needs CPUID features the original does not ({', '.join(sorted(extra))}): "
                         f"#UD on a CPU without them")
    so, sr = _signature(ofacts), _signature(every_r)
    if so != sr:
        why = f"the hazards outside VEX's IR differ: original {_describe(so)}, relocation {_describe(sr)}"
        return Admission(False, why, refutation=why if _weaker(so, sr) else None)
    for i, (insn, f) in enumerate(zip(originals, ofacts)):
        code, base = pieces[i]
        ostatus, oreason = status(f, insn)
        name = "the original" if len(originals) == 1 else f"instruction {i} ({insn.text})"
        if ostatus is None:
            return Admission(False, f"not proved: {name}: {oreason}", unvalidated=True)
        if code is None and ostatus != "exact":
            return Admission(False, f"not proved: {name} {oreason}, and an emulation does not re-execute it, "
                             f"so VEX's values for it are not the CPU's")
        again = reexecution(insn, code, base) if ostatus == "loose" and f.flow == "next" else None
        if ostatus == "loose" and again is None:
            return Admission(False, f"not proved: {name} {oreason}, and the relocation does not re-execute it, "
                             f"so VEX's values for it are not the CPU's")
        for address, rf in rfacts[i]:
            rstatus, rreason = status(rf)
            if address == again:
                if rstatus is None:
                    return Admission(False, f"not proved: the relocation's re-execution at T+{address - base:#x}: {rreason}",
                                     unvalidated=True)
                continue
            if rstatus != "exact":
                return Admission(False, f"not proved: the relocation's instruction at T+{address - base:#x} "
                                 f"({rf.mnemonic}){': ' + rreason if rstatus is None else ' ' + rreason + ', and it is not a re-execution of the original'}",
                                 unvalidated=rstatus is None)
    return TRUSTED
