"""kprobes (int3 probes) on x86-64, as written in arch/x86/kernel/kprobes/core.c.

One model for every version: ``KprobesSource`` says, per version, how the few decisions
that changed are made (each field cites the code or the commit that changed it);
``kprobes_6_1`` and ``kprobes_6_12`` (and ``history``) are instances.

What the model does with an instruction at A, slot at T (``arch_prepare_kprobe``):

1. site refusals, before anything is decoded (``SITE_RULES``: ``check_kprobe_address_safe``
   in kernel/kprobes.c and ``alternatives_text_reserved``);
2. ``can_probe``: A must be a boundary of ``insn_decode_kernel``'s walk from the function's
   start (``Context.boundary``); 6.12 also refuses INT and UD (``is_exception_insn``);
3. ``__copy_instruction``: refuses an emulate prefix, an ``int3`` opcode, and the exception
   masking instructions (``mov ss``, ``pop ss``); a RIP-relative displacement becomes
   ``A + disp - T`` and is refused when that does not fit in s32;
4. ``prepare_emulation``: the instructions kprobes emulates in the int3 handler, as effects
   (``emulation``), or refused (far call/jmp, iret, VMX, indirect call/jmp through memory);
5. everything else is single-stepped in the slot: the slot holds the instruction and an
   ``int3`` (``prepare_singlestep``; boosting needs ``!CONFIG_PREEMPTION``, and Debian kernels
   have PREEMPT_DYNAMIC, so the slot ends in int3), and ``resume_singlestep`` sets
   ``regs->ip += (A - T) - INT3_INSN_SIZE``: ip T+len+1 becomes A+len.  The composition the
   proof judges is the instruction followed by ``jmp A+len``.  Interrupts are disabled during
   the step and IF restored after: IF is not in the proof's comparison.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from ..plan.effects import Address, AddRsp, Branch, Const, Jump, Let, Load, Push, Reg, Temp
from ..x86.instruction import Instruction
from ..x86.registers import GPR64, MASK64, fits_s32
from . import linux_facts as lf
from .model import (NO_CONTEXT, Answer, Cite, Context, Emulate, Refuse, Relocate, SiteRule, Unmodelled,
                    jump_back, refuse_sites, signed)

CORE = "arch/x86/kernel/kprobes/core.c"
KPROBES_C = "kernel/kprobes.c"
TEXT_PATCHING = "arch/x86/include/asm/text-patching.h"

#: int3_emulate_jcc's condition codes, cc = opcode & 0xf (text-patching.h jcc_mask and the SF^OF rows).
JCC = ("o", "no", "b", "ae", "e", "ne", "be", "a", "s", "ns", "p", "np", "l", "ge", "le", "g")

#: kernel/kprobes.c check_kprobe_address_safe, and arch_prepare_kprobe: where kprobes refuses by address.
SITE_RULES = (
    SiteRule("kprobe_blacklist", "-EINVAL: within_kprobe_blacklist (NOKPROBE_SYMBOL)",
             Cite(KPROBES_C, "check_kprobe_address_safe", "within_kprobe_blacklist")),
    SiteRule("kprobes_text", "-EINVAL: within_kprobe_blacklist (__kprobes_text)",
             Cite(KPROBES_C, "populate_kprobe_blacklist", "kprobe_add_area_blacklist(__kprobes_text_start...)")),
    SiteRule("noinstr", "-EINVAL: within_kprobe_blacklist (.noinstr.text)",
             Cite(KPROBES_C, "populate_kprobe_blacklist", "kprobe_add_area_blacklist(__noinstr_text_start...)")),
    SiteRule("entry", "-EINVAL: within_kprobe_blacklist (__entry_text)",
             Cite(CORE, "arch_populate_kprobe_blacklist", "kprobe_add_area_blacklist(__entry_text_start...)")),
    SiteRule("fentry", "ftrace location: probed through ftrace (KPROBE_FLAG_FTRACE), nothing is relocated",
             Cite(KPROBES_C, "check_ftrace_location")),
    SiteRule("jump_label", "-EINVAL: jump_label_text_reserved",
             Cite(KPROBES_C, "check_kprobe_address_safe", "jump_label_text_reserved")),
    SiteRule("static_call", "-EINVAL: static_call_text_reserved",
             Cite(KPROBES_C, "check_kprobe_address_safe", "static_call_text_reserved")),
    SiteRule("bug", "-EINVAL: find_bug (a BUG/WARN site)", Cite(KPROBES_C, "check_kprobe_address_safe", "find_bug")),
)


#: twobyte_is_boostable (core.c), row by row as in the source; the same in 6.1 and 6.12.
TWOBYTE_BOOSTABLE = lf.opcode_table([
    "0 0 1 1 0 0 1 0 1 1 0 0 0 0 0 0", "0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 1",
    "1 1 1 1 0 0 0 0 0 0 0 0 0 0 0 0", "0 1 0 0 0 0 0 0 0 0 0 0 0 0 0 0",
    "1 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1", "0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0",
    "1 1 1 1 1 1 1 1 1 1 1 1 0 0 1 1", "0 0 0 0 1 1 1 1 0 0 0 0 0 0 1 1",
    "0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0", "1 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1",
    "1 1 0 1 1 1 0 0 1 1 0 1 1 1 0 1", "1 1 1 1 1 1 1 1 0 0 0 1 1 1 1 1",
    "1 1 0 0 0 0 0 0 1 1 1 1 1 1 1 1", "0 1 1 1 0 1 0 0 1 1 0 1 1 1 0 1",
    "0 1 1 0 0 1 0 0 1 1 0 1 1 1 0 1", "0 1 1 1 0 1 0 0 1 1 1 0 1 1 1 0",
])
#: can_boost's "... are not boostable" cases (both versions).
_NOT_BOOSTABLE = frozenset([0x62, 0x9A, 0xD6, 0xEB, 0xE8, 0xE9] + list(range(0x70, 0x80)) + [0xCC, 0xCD, 0xCE]
                           + list(range(0xD8, 0xE0)) + list(range(0xE0, 0xE4)) + list(range(0xF0, 0xF5)))
#: 6.1 refuses these groups whole; 6.12 decides them by the ModRM reg field.
_GROUPS = frozenset([0xC0, 0xC1, 0xD0, 0xD1, 0xD2, 0xD3, 0xF6, 0xF7, 0xFE])


@dataclass(frozen=True)
class KprobesSource:
    """The decisions that differ between kprobes versions, each with where it comes from."""

    version: str
    decoder: str  # the linux-insn source the model decodes with: '6.1' or '6.12'
    source: str  # the source the model was written from
    rel8_signed: bool  # prepare_emulation reads a jcc rel8 as signed
    rel8_cite: str
    jle_or: bool  # int3_emulate_jcc: jle/jg test ZF *or* SF!=OF (fixed by 8924779df820)
    jle_cite: str
    call_indirect_len: bool  # kprobe_emulate_call_indirect pushes ip + insn length (not ip + 5)
    call_indirect_cite: str
    refuse_exception_insns: bool  # can_probe refuses INT and UD (is_exception_insn)
    exception_cite: str
    loop_test_before_decrement: bool = True  # kprobe_emulate_loop: match = (cx--) != 0
    loop_cite: str = f"{CORE} kprobe_emulate_loop: match = ((*(u64 *)&regs->cx)--) != 0"
    boost_groups: bool = False  # can_boost decides Grp2/3/4/5 by ModRM reg (6.12), else only ff /4 boosts
    ret_imm_ignored: bool = True  # c2/ca share kprobe_emulate_ret, which pops 8 bytes only
    ret_cite: str = f"{CORE} prepare_emulation: case 0xc2, 0xc3, 0xca, 0xcb -> kprobe_emulate_ret -> int3_emulate_ret"


class Kprobes:
    """The kprobes model for one ``KprobesSource``."""

    needs_boundary = True  # can_probe walks the function with insn_decode_kernel

    def __init__(self, src: KprobesSource):
        self.src = src
        self.name = f"kprobes@{src.version}"
        self.decoder = f"linux-insn@{src.decoder}"
        self.source = src.source

    def site_refusal(self, context: Context) -> Refuse | None:
        return refuse_sites(SITE_RULES, context)

    def answer(self, insn: Instruction, tramp: int, context: Context = NO_CONTEXT) -> Answer:
        site = self.site_refusal(context)
        if site is not None:
            return site
        if context.boundary is False:
            return Refuse("-EILSEQ: can_probe: not an instruction boundary of insn_decode_kernel's walk "
                          "from the function's start", Cite(CORE, "can_probe"))
        stream = context.bytes_at(insn)
        d = lf.insn_of(self.src.decoder, stream)
        if not d.ok:
            return Refuse(f"-EINVAL: insn_decode_kernel fails ({d.ret})", Cite(CORE, "__copy_instruction"))
        op = d.opcode
        if self.src.refuse_exception_insns and _exception_insn(op):
            return Refuse("-EILSEQ: can_probe: INT and UD are not kprobed (is_exception_insn)",
                          Cite(CORE, "can_probe", self.src.exception_cite))
        raw = self.copied(d, stream, insn.address, tramp)
        if isinstance(raw, Refuse):
            return raw
        emulated = self.emulation(d, stream, insn.address, tramp)
        if emulated is not None:
            return emulated
        end = (insn.address + d.length) & MASK64
        return Relocate(jump_back(tramp, raw, end), raw + b"\xcc",
                        "int3 at T+len traps; resume_singlestep: regs->ip += (A - T) - 1, i.e. ip = A+len",
                        Cite(CORE, "prepare_singlestep/resume_singlestep",
                             "copied by __copy_instruction, single-stepped in the slot"))

    # -- can_boost and __copy_instruction -------------------------------------------------------
    def can_boost(self, d, stream: bytes) -> bool:
        """can_boost for the bytes (its exception-table test is the audit's ``extable`` site kind)."""
        if len(d.opcode) == 2:
            return d.opcode[1] in TWOBYTE_BOOSTABLE
        if len(d.opcode) != 1:
            return False
        prefixes = lf.legacy_prefixes(d, stream)
        if 0x2E in prefixes or 0x67 in prefixes:  # CS override, address-size override
            return False
        op = d.opcode[0]
        reg = (d.modrm >> 3) & 7 if d.modrm is not None else 0
        if op in _NOT_BOOSTABLE or (not self.src.boost_groups and op in _GROUPS):
            return False
        if op in (0xC0, 0xC1, 0xD0, 0xD1, 0xD2, 0xD3):
            return reg != 6
        if op in (0xF6, 0xF7):
            return reg != 1
        if op == 0xFE:
            return reg in (0, 1)
        if op == 0xFF:
            return reg in ((0, 1, 4) if self.src.boost_groups else (4,))
        return True

    def copied(self, d, stream: bytes, a: int, tramp: int) -> bytes | Refuse:
        """What ``__copy_instruction`` writes for the decoded ``d`` at ``a`` into a slot at ``tramp``,
        or its refusal (it returns 0): an emulate prefix, an ``int3``, the exception masking
        instructions, a RIP-relative displacement out of s32 reach.  optprobes' block copy calls
        the same function for every instruction it copies."""
        if "emulate_prefix" in d.flags:
            return Refuse("-EINVAL: a force-emulate prefixed instruction", Cite(CORE, "__copy_instruction"))
        op = d.opcode
        if op[:1] == b"\xcc":
            return Refuse("-EINVAL: int3: another subsystem's breakpoint", Cite(CORE, "__copy_instruction"))
        if op[:1] == b"\x17" or (op[:1] == b"\x8e" and d.modrm is not None and (d.modrm >> 3) & 7 == 2):
            return Refuse("-EINVAL: insn_masking_exception (mov ss / pop ss)", Cite(CORE, "__copy_instruction"))
        raw = self.copy_instruction(d, stream, a, tramp)
        if raw is None:
            newdisp = (a + d.disp_value - tramp) & MASK64
            return Refuse(f"-EINVAL: new displacement does not fit into s32 ({newdisp:x})",
                          Cite(CORE, "__copy_instruction", "(s64)(s32)newdisp != newdisp"))
        return raw

    def copy_instruction(self, d, stream: bytes, a: int, tramp: int) -> bytes | None:
        """__copy_instruction's bytes for the slot at ``tramp`` (the displacement fixup), None when refused."""
        raw = stream[:d.length]
        if "rip_relative" in d.flags and d.disp is not None:
            newdisp = a + d.disp_value - tramp
            newdisp = newdisp - (1 << 64) if newdisp >= 1 << 63 else newdisp
            if not fits_s32(newdisp):
                return None
            off = d.disp[0]
            raw = raw[:off] + struct.pack("<i", newdisp) + raw[off + 4:]
        return raw

    # -- prepare_emulation -------------------------------------------------------------------
    def emulation(self, d, stream: bytes, a: int, tramp: int) -> Answer | None:
        """prepare_emulation's switch: an emulation, a refusal, or None (single-stepped)."""
        op0 = d.opcode[0]
        n = d.length
        nxt = (a + n) & MASK64
        cite = lambda fn: Cite(CORE, fn, "prepare_emulation")  # noqa: E731
        imm = d.imm_value if d.imm is not None else 0
        isize = d.imm[1] if d.imm is not None else 0
        if op0 in (0xFA, 0xFB, 0x9C, 0x9D):
            return Unmodelled("kprobe_emulate_ifmodifiers changes IF or pushes/pops the flags register, which the "
                              "effects language cannot express", cite("kprobe_emulate_ifmodifiers"))
        if op0 in (0xC2, 0xC3, 0xCA, 0xCB):
            pop = 8 if self.src.ret_imm_ignored or op0 in (0xC3, 0xCB) else 8 + (imm & 0xFFFF)
            return Emulate((Let("target", Load(Address(base="rsp"), 8)), AddRsp(pop), Jump(Temp("target"))),
                           Cite(CORE, "kprobe_emulate_ret", self.src.ret_cite))
        if op0 in (0x9A, 0xEA, 0xCC, 0xCF):
            return Refuse("-EOPNOTSUPP: far call/jmp absolute, int3 or iret", cite("prepare_emulation"))
        if op0 == 0xE8:
            rel = signed(imm, 2) if isize == 2 else signed(imm, 4)
            # int3_emulate_call pushes regs->ip - INT3_INSN_SIZE + CALL_INSN_SIZE: A + 5
            return Emulate((Push(Const((a + 5) & MASK64)), Jump(Const((nxt + rel) & MASK64))),
                           Cite(CORE, "kprobe_emulate_call", "int3_emulate_call pushes ip - 1 + CALL_INSN_SIZE"))
        if op0 in (0xEB, 0xE9):
            rel = signed(imm, 1) if isize == 1 else signed(imm, 2) if isize == 2 else signed(imm, 4)
            return Emulate((Jump(Const((nxt + rel) & MASK64)),), cite("kprobe_emulate_jmp"))
        if 0x70 <= op0 <= 0x7F:
            byte = stream[d.imm[0]] if d.imm is not None else 0
            rel = signed(byte, 1) if self.src.rel8_signed else byte
            return self._jcc(op0 & 0xF, nxt, rel, tramp, Cite(CORE, "kprobe_emulate_jcc", self.src.rel8_cite))
        if op0 == 0x0F and len(d.opcode) > 1:
            op1 = d.opcode[1]
            if op1 & 0xF0 == 0x80:
                rel = signed(imm, 2) if isize == 2 else signed(imm, 4)
                return self._jcc(op1 & 0xF, nxt, rel, tramp, cite("kprobe_emulate_jcc"))
            if op1 == 0x01 and d.modrm is not None and (d.modrm >> 3) & 7 == 0 and d.modrm >> 6 == 3:
                return Refuse("-EOPNOTSUPP: VM extensions", cite("prepare_emulation"))
            return None
        if 0xE0 <= op0 <= 0xE3:
            return self._loop(op0 & 3, d.addr_bytes * 8, nxt, signed(imm, 1), tramp)
        if op0 == 0xFF and d.modrm is not None:
            reg = (d.modrm >> 3) & 7
            if reg not in (2, 3, 4, 5):
                return None
            if reg in (3, 5):
                return Refuse("-EOPNOTSUPP: far call/jmp indirect", cite("prepare_emulation"))
            if d.addr_bytes != 8:
                return Refuse("-EOPNOTSUPP: address size is not 8 (Don't support different size)",
                              cite("prepare_emulation"))
            if d.modrm >> 6 != 3:
                return Refuse("-EOPNOTSUPP: indirect call/jmp through memory (TODO: support memory addressing)",
                              cite("prepare_emulation"))
            r = (d.modrm & 7) | (8 if lf.rex_byte(d, stream) & 1 else 0)
            if reg == 4:
                return Emulate((Jump(Reg(GPR64[r])),), cite("kprobe_emulate_jmp_indirect"))
            ret = nxt if self.src.call_indirect_len else (a + 5) & MASK64
            return Emulate((Let("target", Reg(GPR64[r])), Push(Const(ret)), Jump(Temp("target"))),
                           Cite(CORE, "kprobe_emulate_call_indirect", self.src.call_indirect_cite))
        return None

    def _jcc(self, cc: int, nxt: int, rel: int, tramp: int, cite: Cite) -> Answer:
        target = (nxt + rel) & MASK64
        if cc >= 0xE and not self.src.jle_or:
            code = _and_le_code(cc, target, nxt, tramp)
            if code is None:
                return Unmodelled("the buggy jle/jg target is out of rel32 reach of T, where it is written as code",
                                  cite)
            return Relocate(code, b"\xcc", "emulated in the int3 handler; match = (SF != OF) && ZF, written as code "
                            "(the effects language's conditions are the SDM's)",
                            Cite(TEXT_PATCHING, "int3_emulate_jcc", self.src.jle_cite))
        return Emulate((Branch(JCC[cc], target, nxt),), cite)

    def _loop(self, kind: int, asize: int, nxt: int, rel: int, tramp: int) -> Answer:
        target = (nxt + rel) & MASK64
        cite = Cite(CORE, "kprobe_emulate_loop", self.src.loop_cite)
        if asize != 64:
            return Unmodelled(f"{asize}-bit loop counter: the written form is for rcx only", cite)
        code = loop_code(kind, target, nxt, tramp, self.src.loop_test_before_decrement)
        if code is None:
            return Unmodelled("the loop target is out of rel32 reach of T, where the emulation is written as code",
                              cite)
        return Relocate(code, b"\xcc", "emulated in the int3 handler, written as code (the effects language has "
                        "no counter register)", cite)


def _exception_insn(op: bytes) -> bool:
    """6.12 is_exception_insn: UD0/UD1/UD2, INT3, INT n, INTO, INT1."""
    if op[:1] == b"\x0f":
        return op[1:2] in (b"\xff", b"\xb9", b"\x0b")
    return op[:1] in (b"\xcc", b"\xcd", b"\xce", b"\xf1")


def _rel32(at_end: int, target: int) -> bytes | None:
    d = (target - at_end) & MASK64
    d = d - (1 << 64) if d >> 63 else d
    return struct.pack("<i", d) if fits_s32(d) else None


def _and_le_code(cc: int, target: int, nxt: int, t: int) -> bytes | None:
    """The pre-fix jle/jg (match = (SF != OF) && ZF, inverted for jg) as code at T, as in
    known_bugs.toml bug1: jle: ``jne T+8; jl target; jmp A+len``; jg: ``jne target; jge target; jmp A+len``."""
    if cc == 0xE:
        jl = _rel32(t + 8, target)
        return None if jl is None else jump_back(t, b"\x75\x06\x0f\x8c" + jl, nxt)
    jne, jge = _rel32(t + 6, target), _rel32(t + 12, target)
    return None if jne is None or jge is None else jump_back(t, b"\x0f\x85" + jne + b"\x0f\x8d" + jge, nxt)


_LEA_DEC_RCX = b"\x48\x8d\x49\xff"  # lea -1(%rcx),%rcx: decrements without touching the flags, as loop does


def loop_code(kind: int, target: int, nxt: int, t: int, test_before_decrement: bool) -> bytes | None:
    """kprobe_emulate_loop as code at T.  kind = opcode & 3: 0 loopne, 1 loope, 2 loop, 3 jrcxz.

    loop*: ``match = (rcx--) != 0`` (tested before the decrement) when ``test_before_decrement``,
    then ``&& !ZF`` (loopne) or ``&& ZF`` (loope); jrcxz: ``match = rcx == 0``."""
    if kind == 3:  # jrcxz rel8: e3 02 skips "eb 05" to the jump to the target
        to_target = _rel32(t + 9, target)
        return None if to_target is None else jump_back(t, b"\xe3\x02\xeb\x05\xe9" + to_target, nxt)
    cond = {0: b"\x74", 1: b"\x75"}.get(kind, b"")  # loopne: ZF=1 fails; loope: ZF=0 fails
    if test_before_decrement:
        head_len = 2 + (2 if cond else 0) + 4 + 5
        to_target = _rel32(t + head_len, target)
        if to_target is None:
            return None
        skip = head_len - 2
        body = b"\xe3" + bytes([skip])
        if cond:
            body += cond + bytes([skip - 2])
        body += _LEA_DEC_RCX + b"\xe9" + to_target + _LEA_DEC_RCX
        return jump_back(t, body, nxt)
    # decrement first (the SDM): lea; jrcxz L; [cond L]; jmp target; L: jmp A+len
    head_len = 4 + 2 + (2 if cond else 0) + 5
    to_target = _rel32(t + head_len, target)
    if to_target is None:
        return None
    body = _LEA_DEC_RCX + b"\xe3" + bytes([head_len - 6])
    if cond:
        body += cond + bytes([head_len - 8])
    return jump_back(t, body + b"\xe9" + to_target, nxt)
