"""Plan the relocation of one instruction at A to a trampoline at T.

``make_plan(decoded, tramp)`` returns a frozen ``Plan`` of one of four kinds:

* reject:  no relocation; ``reason`` says why (a ``policy.RULES`` row, or a decode failure);
* copy:    ``trampoline`` holds the instruction verbatim, then a jump back to A+len;
* rewrite: ``trampoline`` holds a re-encoded instruction (new disp32, rel32 branch,
           loop idiom, xbegin target, or a scratch-register sequence), then the exits;
* emulate: ``effects`` is a program (``effects.py``) the probe handler runs instead.

Jumps out of the trampoline use rel32 when the target is within reach of
the jump's own end, and otherwise ``jmp *0(%rip)`` followed by the 8-byte
absolute target (the kinst form).  The planner never truncates: a value
that does not fit is re-planned (scratch register, absolute jump,
emulation) or rejected with "out of range".

Tracer memory: the trampoline bytes (absolute-jump qwords included) and any
save slot are written by the tracer and by nothing else; ``tracer_memory``
lists those ranges.  The checker leaves them out of the memory comparison
and says so.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from enum import Enum

from ..x86.encoding import jump, patch_disp, rel_from
from ..x86.instruction import Decoded, Disagreement, Instruction, Undecodable
from ..x86.registers import GPR64, MASK64, fits_s32, reg_family
from .effects import Address, AddRsp, Branch, Const, Effect, Jump, Let, Load, Push, Reg, Temp, effect_json
from .policy import classify, classify_disagreement
# uprobes' choice and its reason: ax/cx/dx are implicit operands of cmpxchg,
# shifts, mul/div, mulx, pcmpistri and maskmov; si/di/bx are free of those
# except for string instructions, which never have a RIP-relative operand.
#: The addresses a question about bytes alone is asked at: A in kernel text, and T in module space,
#: within rel32 reach of it, where kinst and optprobes place their trampolines.
DEFAULT_AT = 0xFFFFFFFF81234560
DEFAULT_TRAMP = 0xFFFFFFFFC0001000

SCRATCH_CANDIDATES = ("rsi", "rdi", "rbx")


class PlanKind(str, Enum):
    REJECT = "reject"
    COPY = "copy"
    REWRITE = "rewrite"
    EMULATE = "emulate"


@dataclass(frozen=True)
class Plan:
    kind: PlanKind
    rule: str
    reason: str
    address: int
    length: int
    tramp: int
    trampoline: bytes = b""
    effects: tuple[Effect, ...] = ()
    tracer_memory: tuple[tuple[int, int], ...] = ()  # (address, size) written only by the tracer
    scratch: str | None = None
    save_slot: int | None = None

    @property
    def relocatable(self) -> bool:
        return self.kind is not PlanKind.REJECT

    def as_json(self) -> dict:
        return {
            "kind": self.kind.value,
            "rule": self.rule,
            "reason": self.reason,
            "trampoline": self.trampoline.hex() if self.kind in (PlanKind.COPY, PlanKind.REWRITE) else "",
            "effects": [effect_json(e) for e in self.effects],
            "tramp": hex(self.tramp),
            "scratch": self.scratch,
            "save_slot": None if self.save_slot is None else hex(self.save_slot),
            "tracer_memory": [[hex(a), n] for a, n in self.tracer_memory],
        }


@dataclass
class _Builder:
    """Appends pieces at T, keeping their addresses."""

    tramp: int
    code: bytearray = field(default_factory=bytearray)

    @property
    def here(self) -> int:
        return (self.tramp + len(self.code)) & MASK64

    def emit(self, b: bytes) -> None:
        self.code += b

    def jump(self, to: int) -> None:
        self.emit(jump(self.here, to, align_qword=True))


# ---------------------------------------------------------------------------
# Strategies
# ---------------------------------------------------------------------------


def _reject(rule: str, reason: str, a: int, n: int, t: int) -> Plan:
    return Plan(PlanKind.REJECT, rule, reason, a, n, t)


def _with_code(kind: PlanKind, rule: str, reason: str, insn: Instruction, b: _Builder, **kw) -> Plan:
    return Plan(kind, rule, reason, insn.address, insn.length, b.tramp, bytes(b.code),
                tracer_memory=((b.tramp, len(b.code)),) + kw.pop("extra_memory", ()), **kw)


def _copy(insn: Instruction, t: int, rule: str, reason: str, resume: int | None = None) -> Plan:
    b = _Builder(t)
    b.emit(insn.raw)
    b.jump(_resume(insn, resume))
    return _with_code(PlanKind.COPY, rule, reason, insn, b)


def _rip_rewrite(insn: Instruction, t: int, rule: str, reason: str, resume: int | None = None) -> Plan:
    if insn.disp_size != 4:
        return _reject(rule, f"RIP-relative displacement of {insn.disp_size} bytes", insn.address, insn.length, t)
    target = insn.rip_target
    new_end = t + insn.length
    if insn.addrsize:  # EIP-relative: (eip_next + disp) mod 2^32; any disp32 wraps into reach
        d = ((target - new_end) & 0xFFFFFFFF)
        d = d - (1 << 32) if d >> 31 else d
    else:
        d = rel_from(new_end, target)
    if fits_s32(d):
        b = _Builder(t)
        b.emit(patch_disp(insn.raw, insn.disp_offset, d))
        b.jump(_resume(insn, resume))
        return _with_code(PlanKind.REWRITE, rule,
                          f"{reason}: disp {insn.displacement:#x} -> {d:#x}, still addressing {target:#x}", insn, b)
    return _scratch_rewrite(insn, t, rule, reason, target, resume)


def _clear_rex_b(insn: Instruction, raw: bytearray) -> None:
    """Make the ModRM base a plain rbx/rsi/rdi: clear REX.B / set the inverted VEX/EVEX B bit."""
    if insn.rex is not None:
        raw[insn.opcode_offset - 1 - len(insn.vex)] &= ~0x01
    if insn.encoding in ("vex", "xop", "evex") and insn.vex[0] != 0xC5:
        raw[insn.opcode_offset - len(insn.vex) + 1] |= 0x20


def _scratch_rewrite(insn: Instruction, t: int, rule: str, reason: str, target: int,
                     resume: int | None = None) -> Plan:
    used = set(insn.regs_read) | set(insn.regs_written)
    scratch = next((r for r in SCRATCH_CANDIDATES if r not in used), None)
    if scratch is None:
        return _reject("rip-out-of-range",
                       f"out of range: {target:#x} is not within s32 of T={t:#x} and rsi, rdi and rbx are all "
                       f"operands of the instruction, so no scratch register is free", insn.address, insn.length, t)
    num = GPR64.index(scratch)
    raw = bytearray(insn.raw)
    m = raw[insn.modrm_offset]
    raw[insn.modrm_offset] = 0x80 | (m & 0x38) | num  # mod=10 (disp32), rm=scratch
    _clear_rex_b(insn, raw)
    # disp32 keeps the original displacement: scratch holds A+len, the original RIP.
    save = bytes([0x48, 0x89, 0x05 | (num << 3)])
    load_imm = bytes([0x48, 0xB8 | num]) + struct.pack("<Q", insn.end)
    restore = bytes([0x48, 0x8B, 0x05 | (num << 3)])
    b = _Builder(t)
    # Layout: save(7) movabs(10) insn restore(7) jump-back; then the 8-byte slot, 8-aligned.
    back = jump(t + 7 + 10 + len(raw) + 7, _resume(insn, resume), align_qword=True)
    code_len = 7 + 10 + len(raw) + 7 + len(back)
    slot = (t + code_len + 7) & ~7 & MASK64
    b.emit(save + struct.pack("<i", rel_from(t + 7, slot)))
    b.emit(load_imm)
    b.emit(bytes(raw))
    b.emit(restore + struct.pack("<i", rel_from(b.here + 7, slot)))
    b.emit(back)
    return _with_code(PlanKind.REWRITE, "rip-scratch",
                      f"{reason}: {target:#x} is out of s32 reach of T, so the operand goes through %{scratch} "
                      f"(saved to a slot at {slot:#x}, loaded with A+len, restored)", insn, b,
                      scratch=scratch, save_slot=slot, extra_memory=((slot, 8),))


def _cc_nibble(insn: Instruction) -> int:
    op = insn.opcode
    return (op[-1] & 0x0F)


def _branch_rewrite(insn: Instruction, t: int, rule: str, reason: str, resume: int | None = None) -> Plan:
    target = insn.branch_target
    if insn.flow == "conditional_branch":
        d = rel_from(t + 6, target)
        if not fits_s32(d):
            return _emulate(insn, (Branch(insn.condition, target, _resume(insn, resume)),), t, rule,
                            f"{reason}: target {target:#x} out of rel32 reach of T, emulated")
        b = _Builder(t)
        b.emit(bytes([0x0F, 0x80 | _cc_nibble(insn)]) + struct.pack("<i", d))
        b.jump(_resume(insn, resume))
        return _with_code(PlanKind.REWRITE, rule, f"{reason}: j{insn.condition} rel32 -> {target:#x}", insn, b)
    d = rel_from(t + 5, target)
    if not fits_s32(d):
        return _emulate(insn, (Jump(Const(target)),), t, rule, f"{reason}: target {target:#x} out of reach, emulated")
    b = _Builder(t)
    b.emit(b"\xe9" + struct.pack("<i", d))
    return _with_code(PlanKind.REWRITE, rule, f"{reason}: jmp rel32 -> {target:#x}", insn, b)


def _loop_rewrite(insn: Instruction, t: int, rule: str, reason: str, resume: int | None = None) -> Plan:
    target = insn.branch_target
    b = _Builder(t)
    head = insn.raw[:insn.opcode_offset] + insn.opcode
    b.emit(head + b"\x02")  # taken: skip the short jmp below
    to_target = jump(b.here + 2, target, align_qword=True)
    b.emit(bytes([0xEB, len(to_target)]))  # not taken: skip the jump to the target
    b.emit(to_target)
    b.jump(_resume(insn, resume))
    return _with_code(PlanKind.REWRITE, rule, f"{reason}: {insn.opname} -> {target:#x} via a local rel8", insn, b)


def _xbegin_rewrite(insn: Instruction, t: int, rule: str, reason: str, resume: int | None = None) -> Plan:
    target = insn.branch_target
    head = insn.raw[:insn.opcode_offset] + insn.opcode + insn.raw[insn.opcode_offset + 1:insn.imm_offset]
    b = _Builder(t)
    d = rel_from(t + len(head) + 4, target)
    if fits_s32(d):
        b.emit(head + struct.pack("<i", d))
        b.jump(_resume(insn, resume))
    else:
        back = jump(t + len(head) + 4, _resume(insn, resume), align_qword=True)
        b.emit(head + struct.pack("<i", len(back)))
        b.emit(back)
        b.jump(target)
    return _with_code(PlanKind.REWRITE, rule, f"{reason}: abort path -> {target:#x}", insn, b)


def _memory_address(insn: Instruction) -> Address:
    mem = insn.memory
    if mem.base == "rip":
        return Address(disp=insn.rip_target, segment=mem.segment, address_size=mem.address_size)
    return Address(base=reg_family(mem.base) if mem.base else None,
                   index=reg_family(mem.index) if mem.index else None,
                   scale=mem.scale, disp=mem.displacement, segment=mem.segment, address_size=mem.address_size)


def _target_value(insn: Instruction):
    """The target operand of an indirect call/jmp: a register, or a 64-bit load."""
    if insn.memory is None:
        rm = insn.modrm & 7
        if insn.rex is not None and insn.rex & 1:
            rm |= 8
        return Reg(GPR64[rm])
    return Load(_memory_address(insn), 8)


def _resume(insn: Instruction, resume: int | None) -> int:
    """Where the relocation continues after the instruction: A+len, or a block's next relocation."""
    return insn.end if resume is None else resume & MASK64


def _emulate(insn: Instruction, effects: tuple[Effect, ...], t: int, rule: str, reason: str) -> Plan:
    return Plan(PlanKind.EMULATE, rule, reason, insn.address, insn.length, t, effects=effects)


def _emulate_call(insn: Instruction, t: int, rule: str, reason: str, resume: int | None = None) -> Plan:
    if insn.branch_target is not None and insn.flow == "call":
        prog = (Push(Const(insn.end)), Jump(Const(insn.branch_target)))
    else:
        prog = (Let("target", _target_value(insn)), Push(Const(insn.end)), Jump(Temp("target")))
    return _emulate(insn, prog, t, rule, reason)


def _emulate_jmp(insn: Instruction, t: int, rule: str, reason: str, resume: int | None = None) -> Plan:
    return _emulate(insn, (Jump(_target_value(insn)),), t, rule, reason)


def _emulate_ret(insn: Instruction, t: int, rule: str, reason: str, resume: int | None = None) -> Plan:
    extra = int.from_bytes(insn.raw[insn.imm_offset:insn.imm_offset + insn.imm_size], "little") if insn.imm_size else 0
    prog = (Let("target", Load(Address(base="rsp"), 8)), AddRsp(8 + extra), Jump(Temp("target")))
    return _emulate(insn, prog, t, rule, reason)


_STRATEGIES = {
    "copy": _copy,
    "rip-rewrite": _rip_rewrite,
    "branch-rewrite": _branch_rewrite,
    "loop-rewrite": _loop_rewrite,
    "xbegin-rewrite": _xbegin_rewrite,
    "emulate-call": _emulate_call,
    "emulate-jmp": _emulate_jmp,
    "emulate-ret": _emulate_ret,
}


TRAMPOLINE_MAX = 72  # the longest trampoline any strategy builds, save slot and qword alignment included


def _overlaps(a: int, n: int, t: int) -> bool:
    return (t - a) & MASK64 < n or (a - t) & MASK64 < TRAMPOLINE_MAX


def make_plan(decoded: Decoded, tramp: int, rules=None, resume: int | None = None) -> Plan:
    """Plan the relocation of ``decoded`` (at its own address) to ``tramp``, by the policy table
    ``rules`` (``policy.POLICIES``; the kernel's by default).

    ``resume`` is where the relocation continues after the instruction (A+len when None): a block
    plan (``plan.block``) links each instruction to the next one's relocation.  It replaces every
    continuation, never a value the instruction computes from A+len (an emulated call's return
    address, a scratch register's stand-in for RIP)."""
    tramp &= MASK64
    if isinstance(decoded, Undecodable):
        return _reject("undecodable", f"undecodable: {decoded.reason}", decoded.address, decoded.length, tramp)
    if isinstance(decoded, Disagreement):
        agreed = classify_disagreement(decoded.answers) if rules is None else classify_disagreement(decoded.answers, rules)
        if agreed is not None:
            rule, why = agreed
            return _reject(rule.name, f"{rule.reason} ({why})", decoded.address, decoded.length, tramp)
        return _reject("decoder-disagreement", f"decoders disagree: {decoded.reason}", decoded.address,
                       decoded.length, tramp)
    if _overlaps(decoded.address, decoded.length, tramp):
        return _reject("tramp-overlap", f"the trampoline at {tramp:#x} overlaps the instruction it relocates",
                       decoded.address, decoded.length, tramp)
    rule = classify(decoded) if rules is None else classify(decoded, rules)
    if rule.strategy == "reject":
        return _reject(rule.name, rule.reason, decoded.address, decoded.length, tramp)
    return _STRATEGIES[rule.strategy](decoded, tramp, rule.name, rule.reason, resume)
