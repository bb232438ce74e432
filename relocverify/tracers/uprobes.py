"""uprobes on x86-64, as written in arch/x86/kernel/uprobes.c (arch_uprobe_analyze_insn and what
it sets up).  6.1 and 6.12 make the same decisions (the file differs in the uretprobe syscall
trampoline and shadow stacks only); the two models differ in the kernel decoder they decode with.

For an instruction at A, its XOL slot at T:

1. ``uprobe_init_insn``: refused when ``insn_decode`` fails (-ENOEXEC), on an es/cs/ds/ss or
   lock prefix (``is_prefix_bad``), on mov ss / pop ss (``insn_masking_exception``), and when
   the first opcode byte is not in ``good_insns_64`` and (two-byte opcodes) the second is not in
   ``good_2byte_insns`` (-ENOTSUPP).  The tables are copied below from the source.
2. ``branch_setup_xol_ops``: jmp rel8/rel32, call rel32, jcc rel8/rel32 and (prefixed) nop are
   emulated by ``branch_emulate_op`` (a 66 prefix is refused, -ENOTSUPP); ``push_setup_xol_ops``:
   ``push reg`` (50-57, or 41 50-57) is emulated by ``push_emulate_op``.
3. everything else is single-stepped in the slot (``default_xol_ops``), after
   ``riprel_analyze`` turned a RIP-relative operand into ``disp(%scratch)`` (ModRM "10 reg
   scratch", REX.B cleared, VEX3/EVEX byte 1 |= 0x60), the scratch being si, else di, else bx
   (whichever the ModRM reg and VEX.vvvv fields do not name), saved before the step, loaded with
   A+len (``riprel_pre_xol``) and restored after (``riprel_post_xol``).  After the step,
   ``default_post_xol_op`` adds A - T to ip (UPROBE_FIX_IP), or for an indirect call pops the
   slot's return address and pushes A+len (UPROBE_FIX_CALL); rets and indirect jmps leave ip.

How that is written for the proof: the slot plus UPROBE_FIX_IP is the instruction followed by
``jmp A+len`` (a relative branch the step may take, loop or jrcxz, as code whose exits are the
original's); the scratch sequence as code (save, movabs A+len, the rewritten instruction,
restore, the jump back; the save slot is tracer memory), laid out as relocverify's own scratch
plan so that identical choices share a proof; UPROBE_FIX_CALL, and an indirect jmp through a
RIP-relative operand (which leaves the slot before the restore runs in code), as effects.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from ..proof.machine_model import USER
from ..plan.effects import Address, Branch, Const, Jump, Let, Load, Push, Reg, Temp
from ..x86.encoding import jump
from ..x86.instruction import Instruction
from ..x86.registers import GPR64, MASK64, reg_family
from . import linux_facts as lf
from .kprobes import JCC
from .model import NO_CONTEXT, Answer, Cite, Context, Emulate, Refuse, Relocate, Unmodelled, jump_back

UPROBES = "arch/x86/kernel/uprobes.c"


#: good_insns_64, row by row as in the source (W(0x00, ...) .. W(0xf0, ...)).
GOOD_INSNS_64 = lf.opcode_table([
    "1 1 1 1 1 1 0 0 1 1 1 1 1 1 0 1", "1 1 1 1 1 1 0 0 1 1 1 1 1 1 0 0",
    "1 1 1 1 1 1 1 0 1 1 1 1 1 1 1 0", "1 1 1 1 1 1 1 0 1 1 1 1 1 1 1 0",
    "1 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1", "1 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1",
    "0 0 0 1 1 1 1 1 1 1 1 1 0 0 0 0", "1 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1",
    "1 1 0 1 1 1 1 1 1 1 1 1 1 1 1 1", "1 1 1 1 1 1 1 1 1 1 0 1 1 1 1 1",
    "1 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1", "1 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1",
    "1 1 1 1 1 1 1 1 1 1 1 1 0 0 0 0", "1 1 1 1 0 0 0 1 1 1 1 1 1 1 1 1",
    "1 1 1 1 0 0 0 0 1 1 0 1 0 0 0 0", "1 0 1 1 0 1 1 1 1 1 0 0 1 1 1 1",
])

#: good_2byte_insns (for 64-bit and 32-bit apps).
GOOD_2BYTE = lf.opcode_table([
    "0 0 1 1 1 0 0 0 0 0 1 0 1 1 1 1", "1 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1",
    "1 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1", "0 1 1 1 0 0 1 0 1 1 1 1 1 1 1 1",
    "1 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1", "1 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1",
    "1 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1", "1 1 1 1 1 1 1 1 0 0 1 1 1 1 1 1",
    "1 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1", "1 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1",
    "1 1 1 1 1 1 1 1 1 1 1 1 1 1 0 1", "1 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1",
    "1 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1", "1 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1",
    "1 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1", "1 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1",
])

#: is_prefix_bad: INAT_PFX_ES, CS, DS, SS and LOCK.
BAD_PREFIXES = frozenset({0x26, 0x2E, 0x3E, 0x36, 0xF0})

#: riprel_analyze's fixup flags by scratch register number.
SCRATCH = {6: "UPROBE_FIX_RIP_SI", 7: "UPROBE_FIX_RIP_DI", 3: "UPROBE_FIX_RIP_BX"}


@dataclass(frozen=True)
class UprobesSource:
    version: str
    decoder: str
    source: str


class Uprobes:
    machine = USER  # uprobes probe user code: their relocations run at CPL 3
    needs_boundary = False

    def __init__(self, src: UprobesSource):
        self.src = src
        self.name = f"uprobes@{src.version}"
        self.decoder = f"linux-insn@{src.decoder}"
        self.source = src.source

    def site_refusal(self, context: Context) -> Refuse | None:
        return None  # uprobes has no address blacklist: any user text can be probed

    # -- uprobe_init_insn -----------------------------------------------------------------------
    def init_insn(self, d, stream: bytes) -> Refuse | None:
        cite = Cite(UPROBES, "uprobe_init_insn")
        if not d.ok:
            return Refuse(f"-ENOEXEC: insn_decode fails ({d.ret})", cite)
        if any(p in BAD_PREFIXES for p in lf.legacy_prefixes(d, stream)):
            return Refuse("-ENOTSUPP: is_prefix_bad (es, cs, ds, ss or lock prefix)", Cite(UPROBES, "is_prefix_bad"))
        op = d.opcode
        if op[:1] == b"\x17" or (op[:1] == b"\x8e" and d.modrm is not None and (d.modrm >> 3) & 7 == 2):
            return Refuse("-ENOTSUPP: insn_masking_exception (mov ss / pop ss)", cite)
        if op[0] in GOOD_INSNS_64:
            return None
        if len(op) == 2 and op[1] in GOOD_2BYTE:
            return None
        return Refuse(f"-ENOTSUPP: opcode {op.hex()} not in good_insns_64/good_2byte_insns", cite)

    def answer(self, insn: Instruction, tramp: int, context: Context = NO_CONTEXT) -> Answer:
        stream = context.bytes_at(insn)
        d = lf.insn_of(self.src.decoder, stream)
        refused = self.init_insn(d, stream)
        if refused is not None:
            return refused
        a, n = insn.address, d.length
        nxt = (a + n) & MASK64
        branch = self.branch_answer(d, stream, a, nxt)
        if branch is not None:
            return branch
        push = self.push_answer(d, stream, nxt)
        if push is not None:
            return push
        return self._default(insn, d, stream, tramp, a, nxt)

    def branch_answer(self, d, stream, a, nxt) -> Answer | None:
        """branch_setup_xol_ops / branch_emulate_op."""
        op = d.opcode
        opc1 = op[0]
        cite = Cite(UPROBES, "branch_emulate_op", "branch_setup_xol_ops")
        if opc1 == 0x90:  # prefix* + nop: "same as jmp with .offs = 0", no 66 check (goto setup)
            return Emulate((Jump(Const(nxt)),), Cite(UPROBES, "branch_setup_xol_ops",
                                                    "case 0x90: prefix* + nop; same as jmp with .offs = 0"))
        if opc1 in (0xEB, 0xE9, 0xE8):
            pass
        elif opc1 == 0x0F:
            if len(op) != 2 or not 0x70 <= (op[1] - 0x10) & 0xFF <= 0x7F:
                return None
            opc1 = op[1] - 0x10
        elif not 0x70 <= opc1 <= 0x7F:
            return None
        if 0x66 in lf.legacy_prefixes(d, stream):
            return Refuse("-ENOTSUPP: a branch with a 66 prefix", Cite(UPROBES, "branch_setup_xol_ops"))
        offs = d.imm_value if d.imm is not None else 0
        target = (nxt + offs) & MASK64
        if opc1 == 0xE8:
            return Emulate((Push(Const(nxt)), Jump(Const(target))), cite)
        if opc1 in (0xEB, 0xE9):
            return Emulate((Jump(Const(target)),), cite)
        return Emulate((Branch(JCC[opc1 & 0xF], target, nxt),), Cite(UPROBES, "check_jmp_cond", "CASE_COND"))

    def push_answer(self, d, stream, nxt) -> Answer | None:
        """push_setup_xol_ops / push_emulate_op."""
        opc1 = d.opcode[0]
        if not 0x50 <= opc1 <= 0x57 or d.length > 2:
            return None
        reg = opc1 - 0x50
        if d.length == 2:
            if d.rex != 1 or lf.rex_byte(d, stream) != 0x41:
                return None
            reg += 8
        return Emulate((Push(Reg(GPR64[reg])), Jump(Const(nxt))), Cite(UPROBES, "push_emulate_op"))

    def _default(self, insn: Instruction, d, stream, tramp, a, nxt) -> Answer:
        """arch_uprobe_analyze_insn's fixups, riprel_analyze, default_post_xol_op."""
        raw = stream[:d.length]
        opc1 = d.opcode[0]
        reg = (d.modrm >> 3) & 7 if d.modrm is not None else None
        fix = "ip"
        if opc1 in (0xC3, 0xCB, 0xC2, 0xCA, 0xEA):
            fix = "none"
        elif opc1 == 0x9A:
            fix = "call"
        elif opc1 == 0xFF and reg in (2, 3):
            fix = "call"
        elif opc1 == 0xFF and reg in (4, 5):
            fix = "none"
        riprel = opc1 not in (0x9D, 0xC3, 0xCB, 0xC2, 0xCA, 0xEA, 0x9A) and "rip_relative" in d.flags
        cite = Cite(UPROBES, "default_post_xol_op", {"ip": "UPROBE_FIX_IP: regs->ip += vaddr - xol_vaddr",
                                                    "call": "UPROBE_FIX_CALL: pop, push vaddr + ilen",
                                                    "none": "ip is correct"}[fix])
        if fix == "call":
            if opc1 != 0xFF or reg != 2:
                return Unmodelled("a far call single-stepped with UPROBE_FIX_CALL: the effects language has no far "
                                  "call", cite)
            return Emulate((Let("target", _operand(insn, d, stream, nxt)), Push(Const(nxt)), Jump(Temp("target"))),
                           cite)
        if fix == "none" and riprel:  # jmp *disp(%rip): leaves the slot, the scratch restored after
            return Emulate((Jump(_operand(insn, d, stream, nxt)),), cite)
        if riprel:
            return self._scratch(d, raw, tramp, nxt)
        if fix == "ip" and insn.branch_target is not None and insn.flow == "conditional_branch":
            code = _relative_exits(raw, insn, tramp, nxt)
            if code is None:
                return Unmodelled(f"{insn.opname} single-stepped with UPROBE_FIX_IP: its exits cannot be written "
                                  f"as code here", cite)
            return Relocate(code, raw, "UPROBE_FIX_IP: every exit ip += A - T", cite)
        return Relocate(jump_back(tramp, raw, nxt), raw, cite.note, cite)

    def riprel(self, d, raw: bytes) -> tuple[bytes, int]:
        """riprel_analyze: the rewritten instruction and the scratch register's number (6 si, 7 di, 3 bx)."""
        b = bytearray(raw)
        if d.rex:
            b[d.emulate_prefix + d.prefixes] &= 0xFE
        if d.vex >= 3:
            b[d.emulate_prefix + d.prefixes + d.rex + 1] |= 0x60
        reg = (d.modrm >> 3) & 7
        reg2 = 0xFF
        if d.vex:
            reg2 = raw[d.emulate_prefix + d.prefixes + d.rex + 2] if d.vex >= 3 else 0xFF
            if d.vex == 2:  # insn->vex_prefix.bytes[2] of a 2-byte VEX is 0
                reg2 = 0
        reg2 = ((reg2 >> 3) & 7) ^ 7
        scratch = 6 if reg != 6 and reg2 != 6 else 7 if reg != 7 and reg2 != 7 else 3
        b[d.modrm_offset] = 0x80 | (reg << 3) | scratch
        return bytes(b), scratch

    def _scratch(self, d, raw: bytes, tramp: int, nxt: int) -> Answer:
        """riprel_analyze's rewrite and riprel_pre_xol/riprel_post_xol's save, load and restore."""
        b, scratch = self.riprel(d, raw)
        save = bytes([0x48, 0x89, 0x05 | (scratch << 3)])
        load = bytes([0x48, 0xB8 | scratch]) + struct.pack("<Q", nxt)
        restore = bytes([0x48, 0x8B, 0x05 | (scratch << 3)])
        t = tramp
        back = jump(t + 7 + 10 + len(b) + 7, nxt)
        code_len = 7 + 10 + len(b) + 7 + len(back)
        slot = (t + code_len + 7) & ~7 & MASK64
        code = (save + struct.pack("<i", slot - (t + 7)) + load + bytes(b) + restore
                + struct.pack("<i", slot - (t + 17 + len(b) + 7)) + back)
        return Relocate(code, bytes(b), f"{SCRATCH[scratch]}: %{GPR64[scratch]} saved, loaded with A+len, restored; "
                        "UPROBE_FIX_IP", Cite(UPROBES, "riprel_analyze/riprel_pre_xol/riprel_post_xol"),
                        tracer_memory=((slot, 8),))


def _operand(insn: Instruction, d, stream: bytes, nxt: int):
    """The ModRM operand of ff /2 or ff /4 as a value (a RIP-relative one through A+len + disp)."""
    if d.modrm >> 6 == 3:
        r = (d.modrm & 7) | (8 if lf.rex_byte(d, stream) & 1 else 0)
        return Reg(GPR64[r])
    mem = insn.memory
    if mem.base == "rip":
        return Load(Address(disp=insn.rip_target, segment=mem.segment, address_size=mem.address_size), 8)

    return Load(Address(base=reg_family(mem.base) if mem.base else None,
                        index=reg_family(mem.index) if mem.index else None, scale=mem.scale,
                        disp=mem.displacement, segment=mem.segment, address_size=mem.address_size), 8)


def _relative_exits(raw: bytes, insn: Instruction, t: int, nxt: int) -> bytes | None:
    """A loop/jrcxz single-stepped at T with ip += A - T after: its taken exit is the original's
    target.  As code: the instruction with rel8 = 2 (taken: skip the short jmp), ``jmp +5``,
    ``jmp target``, ``jmp A+len``."""
    if insn.imm_size != 1 or insn.imm_offset != len(raw) - 1:
        return None
    d = (insn.branch_target - (t + len(raw) + 2 + 5)) & MASK64
    d = d - (1 << 64) if d >> 63 else d
    if not -(1 << 31) <= d < 1 << 31:
        return None
    body = raw[:-1] + b"\x02" + b"\xeb\x05" + b"\xe9" + struct.pack("<i", d)
    return jump_back(t, body, nxt)


