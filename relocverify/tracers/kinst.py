"""FreeBSD kinst (DTrace instruction-level tracing), as written in sys/cddl/dev/kinst/amd64/kinst_isa.c
(freebsd/freebsd-src at 05a10284623c).

What kinst does with the instruction at A, trampoline at T (``kinst_make_probe``,
``kinst_instr_dissect``, ``kinst_invop``, ``kinst_trampoline_populate``):

* ``popf`` and ``sti`` (one byte) are skipped: they may enable interrupts (kinst_make_probe);
* ``jrcxz`` (e3) is refused: EINVAL, no rel32 form (kinst_instr_dissect);
* calls (e8, 9a, ff /2, ff /3) are emulated in ``kinst_invop``: the return address A+len is
  stored in the slot dtrace_invop_start reserves (a push), and rip is the target, computed from
  what ``kinst_instr_dissect`` decoded: reg1 (base), reg2 (SIB index, even when it is 4, "no
  index"), scale, and a disp read only for mod 1 and 2 (bug 6 of known_bugs.toml);
* everything else is copied to the trampoline followed by ``jmp *0(%rip); .quad A+len``; a
  RIP-relative ModRM operand and the rel32 of ``jcc``/``jmp`` get the new displacement
  ``(uint32_t)(A + disp - T)`` with no range check (kinst_riprel_disp); ``jcc rel8`` becomes
  ``0f 8x rel32`` and ``jmp rel8`` becomes ``e9 rel32`` (``tinstlen`` 6 and 5, which ignores
  any prefix in front of the opcode).

Not modelled: the function filter of kinst_make_probe (a function must start with ``push %rbp``:
a FreeBSD prologue convention that would exclude nearly every Linux function, so the audit
applies the instruction-level decisions only and says so).  kinst's decoder is dtrace_disx86;
the model uses the project's cross-checked decode in its place (the fields it reads, ModRM and
SIB positions and the length, are the ones our decoders agree on).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from ..proof.machine_model import KERNEL_WITHOUT_IBT
from ..plan.effects import Address, Const, Jump, Let, Load, Push, Reg, Temp
from ..x86.encoding import ABS_JUMP
from ..x86.instruction import Instruction
from ..x86.registers import GPR64, MASK64
from .model import NO_CONTEXT, Answer, Cite, Context, Emulate, Refuse, Relocate, signed

KINST = "sys/cddl/dev/kinst/amd64/kinst_isa.c"
#: kinst_instr_dissect's prefix loop: groups 1-4 and REX (the last REX is kept)
_PREFIXES = frozenset([0xF0, 0xF1, 0xF2, 0xF3, 0x26, 0x2E, 0x36, 0x3E, 0x64, 0x65, 0x66, 0x67]
                      + list(range(0x40, 0x50)))


@dataclass(frozen=True)
class KinstSource:
    version: str
    source: str
    emulate_calls: bool = True  # calls are emulated in kinst_invop (before: copied with the rel32 re-aimed)
    calls_cite: str = f"{KINST} kinst_instr_dissect: case 0xe8, 0x9a: KINST_F_CALL | KINST_F_DIRECT_CALL"


class Kinst:
    decoder = None
    #: FreeBSD amd64 enforces no kernel IBT: kinst's absolute jumps back (``jmp *0(%rip)``) are proved under
    #: that precondition (``proof.machine_model``, row ibt-kernel-off), not refused as on an IBT kernel.
    machine = KERNEL_WITHOUT_IBT

    def __init__(self, src: KinstSource):
        self.src = src
        self.name = "kinst" if src.version == "" else f"kinst@{src.version}"
        self.source = src.source

    def site_refusal(self, context: Context) -> Refuse | None:
        return None  # kinst_excluded() names FreeBSD functions; nothing applies to a Linux image

    def answer(self, insn: Instruction, tramp: int, context: Context = NO_CONTEXT) -> Answer:
        raw = insn.raw
        a, n = insn.address, insn.length
        if n == 1 and raw[0] in (0x9D, 0xFB):
            return Refuse("popf/sti may enable interrupts: skipped", Cite(KINST, "kinst_make_probe",
                                                                        "KINST_POPF || KINST_STI"))
        rex, i = 0, 0
        while i < n and raw[i] in _PREFIXES:
            if 0x40 <= raw[i] <= 0x4F:
                rex = raw[i]
            i += 1
        if i >= n:
            return Refuse("EINVAL: only prefixes", Cite(KINST, "kinst_instr_dissect"))
        op = raw[i]
        cite = Cite(KINST, "kinst_instr_dissect")
        if op == 0xE3:
            return Refuse("EINVAL: jrcxz has no rel32 form", cite)
        call = direct = jmp = riprel = mod_direct = False
        disp, dispoff = 0, -1
        if op == 0x0F and i + 1 < n and 0x80 <= raw[i + 1] <= 0x8F:
            jmp = riprel = True
            dispoff = i + 2
            disp = signed(int.from_bytes(raw[dispoff:dispoff + 4], "little"), 4)
        elif 0x70 <= op <= 0x7F or op == 0xEB:
            jmp = riprel = True
            dispoff = i + 1
            disp = signed(raw[dispoff], 1)
        elif op == 0xE9:
            jmp = riprel = True
            dispoff = i + 1
            disp = signed(int.from_bytes(raw[dispoff:dispoff + 4], "little"), 4)
        elif op in (0xE8, 0x9A):
            if self.src.emulate_calls:
                call = direct = True
            else:
                jmp = riprel = True  # the old behaviour: re-aimed like a jmp rel32
            dispoff = i + 1
            disp = signed(int.from_bytes(raw[dispoff:dispoff + 4], "little"), 4)
        elif op == 0xFF and insn.modrm_offset is not None:
            reg = (raw[insn.modrm_offset] >> 3) & 7
            if reg in (2, 3):
                call = True
            elif reg in (4, 5):
                jmp = True
        reg1 = reg2 = -1
        scale = 0
        if insn.modrm_offset is not None and not (call and direct):
            rmi = insn.modrm_offset
            modrm = raw[rmi]
            mod, rm = modrm >> 6, modrm & 7
            if mod == 0 and rm == 5:
                riprel = True
                dispoff = rmi + 1
                disp = signed(int.from_bytes(raw[dispoff:dispoff + 4], "little"), 4)
            elif call:
                havesib = mod != 3 and rm == 4
                dispoff = rmi + (2 if havesib else 1)
                if mod == 1:
                    disp = signed(raw[dispoff], 1)
                elif mod == 2:
                    disp = signed(int.from_bytes(raw[dispoff:dispoff + 4], "little"), 4)
                elif mod == 3:
                    mod_direct = True
                if havesib:
                    sib = raw[rmi + 1]
                    if sib & 7 != 5:
                        reg1 = (sib & 7) | ((rex & 1) << 3)
                    scale = sib >> 6
                    reg2 = ((sib >> 3) & 7) | (((rex >> 1) & 1) << 3)
                else:
                    reg1 = rm | ((rex & 1) << 3)
        if call:
            return self._invop_call(a, n, direct, disp, reg1, reg2, scale, mod_direct)
        return self._trampoline(insn, tramp, i, op, jmp, riprel, dispoff, disp)

    def _invop_call(self, a, n, direct, disp, reg1, reg2, scale, mod_direct) -> Answer:
        cite = Cite(KINST, "kinst_invop", "KINST_F_CALL: *(uintptr_t *)scratch = retaddr; tf_rip = target")
        ret = Push(Const((a + n) & MASK64))
        if direct:
            return Emulate((ret, Jump(Const((a + disp + n) & MASK64))), cite)
        if reg1 == -1 and reg2 == -1:  # rip-relative: rval = tf_rip + instlen (tf_rip was decremented to A)
            base = Address(disp=(a + n + disp) & MASK64)
            value = Load(base, 8) if not mod_direct else Const((a + n + disp) & MASK64)
            return Emulate((Let("target", value), ret, Jump(Temp("target"))), cite)
        b = GPR64[reg1] if reg1 != -1 else None
        x = GPR64[reg2] if reg2 != -1 else None
        if mod_direct:  # rval + disp, disp 0: the register itself (reg2 is -1)
            return Emulate((Let("target", Reg(b)), ret, Jump(Temp("target"))), cite)
        address = Address(base=b, index=x, scale=1 << scale, disp=disp)  # rval = reg1 + (reg2 << scale)
        return Emulate((Let("target", Load(address, 8)), ret, Jump(Temp("target"))), cite)

    def _trampoline(self, insn: Instruction, tramp: int, opcidx: int, op: int, jmp: bool, riprel: bool,
                    dispoff: int, disp: int) -> Answer:
        raw = insn.raw
        a, ilen = insn.address, insn.length
        cite = Cite(KINST, "kinst_trampoline_populate", "template, re-aimed disp, jmp *0(%rip); .quad A+len")
        tinstlen = ilen
        if riprel:
            if not jmp or op in (0x0F, 0xE9, 0xFF, 0xE8, 0x9A):
                template = bytearray(raw[:dispoff] + bytes(4) + raw[dispoff + 4:])
            elif op == 0xEB:
                template = bytearray(raw[:opcidx] + b"\xe9" + bytes(4))
                tinstlen, disp = 5, disp - 3
                dispoff = opcidx + 1
            else:  # 70..7f
                template = bytearray(raw[:opcidx] + bytes([0x0F, op + 0x10]) + bytes(4))
                tinstlen, disp = 6, disp - 4
                dispoff = opcidx + 2
            new = (a + disp - tramp) & 0xFFFFFFFF  # kinst_riprel_disp: (uint32_t)(patchpoint + disp - dst)
            template[dispoff:dispoff + 4] = struct.pack("<I", new)
        else:
            template = bytearray(raw)
        # tramp[ilen..]: the jump back is written at tinstlen, over whatever the template had there
        code = bytearray(template[:tinstlen]) + ABS_JUMP + struct.pack("<Q", (a + ilen) & MASK64)
        return Relocate(bytes(code), bytes(code), "none: the trampoline jumps back to A+len itself", cite)


MODEL = Kinst(KinstSource("", f"freebsd/freebsd-src 05a10284623c {KINST}"))
