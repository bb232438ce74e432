"""The DTrace pid provider's fasttrap on amd64, as written in
sys/cddl/contrib/opensolaris/uts/intel/dtrace/fasttrap_isa.c (freebsd/freebsd-src at 039ea811636f):
``fasttrap_tracepoint_init`` sorts the instruction into a tracepoint type, ``fasttrap_pid_probe``
emulates it or runs it from the thread's scratch space.

Types (``fasttrap_tracepoint_init``): JCC (70-7f, 0f 80-8f), LOOP (e0-e2), JCXZ (e3), CALL (e8,
ff /2), JMP (e9, eb, ff /4), RET (c3), RET16 (c2), PUSHL_EBP (55 with no prefix), NOP (90 without
REX.B), refused: int3 (cc) and int (cd), two segment prefixes.  Everything else is COMMON: copied
to the scratch space and followed by ``jmp *0(%rip); .quad A+len``; a RIP-relative ModRM operand
becomes ``disp(%rax)`` (``disp(%rcx)`` when the ModRM reg field is 0; r8/r9 under REX.B), the
register loaded with A+len by the kernel and restored by a ``movq $old, %reg`` the scratch code
carries after the instruction.  Written as code here with the old value in a tracer-owned slot
(save, movabs A+len, the instruction, restore, the jump back), as known_bugs.toml writes it.

Emulations as the effects language: JCC, JMP, CALL, RET, RET16, PUSHL_EBP and NOP exactly; LOOP
(``cx = rp->r_rcx--; taken = cx != 0``: tested before the decrement) as code, as kprobes' is.
The indirect CALL/JMP operand is what ``fasttrap_tracepoint_init`` decoded: for a SIB with mod 0
and a base other than 5 it reads a disp32 (``sz = mod == 1 ? 1 : 4``) that the instruction does
not have, from the bytes after it.
"""

from __future__ import annotations

import struct

from ..proof.machine_model import USER
from ..plan.effects import Address, AddRsp, Branch, Const, Jump, Let, Load, Push, Reg, Temp
from ..x86.encoding import ABS_JUMP
from ..x86.instruction import Instruction
from ..x86.registers import GPR64, MASK64
from .kprobes import JCC, loop_code
from .model import NO_CONTEXT, Answer, Cite, Context, Emulate, Refuse, Relocate, Unmodelled, signed

FASTTRAP = "sys/cddl/contrib/opensolaris/uts/intel/dtrace/fasttrap_isa.c"
_SEGMENTS = {0x36: "ss", 0x65: "gs", 0x64: "fs", 0x26: "es", 0x3E: "ds", 0x2E: "cs"}
_OTHER_PREFIXES = frozenset({0x66, 0x67, 0xF0, 0xF3, 0xF2})


class Fasttrap:
    decoder = None
    machine = USER  # DTrace's pid provider probes user code: its relocations run at CPL 3
    needs_boundary = False
    name = "fasttrap"
    source = f"freebsd/freebsd-src 039ea811636f {FASTTRAP}"

    def site_refusal(self, context: Context) -> Refuse | None:
        return None

    def reads_past(self, raw: bytes) -> bool:
        """Whether the answer depends on the bytes after the instruction (the SIB disp32 misread)."""
        return self._sib_misread(raw)[0]

    def _prefixes(self, raw: bytes):
        start, segment = 0, None
        while start < len(raw) and (raw[start] in _SEGMENTS or raw[start] in _OTHER_PREFIXES):
            if raw[start] in _SEGMENTS:
                if segment is not None:
                    return None, None, None
                segment = _SEGMENTS[raw[start]]
            start += 1
        rex = 0
        if start < len(raw) and raw[start] & 0xF0 == 0x40:
            rex = raw[start]
            start += 1
        return start, segment, rex

    def _sib_misread(self, raw: bytes):
        start, _, _ = self._prefixes(raw)
        if start is None or start + 2 >= len(raw) or raw[start] != 0xFF:
            return False, start
        modrm = raw[start + 1]
        mod, reg, rm = modrm >> 6, (modrm >> 3) & 7, modrm & 7
        return (reg in (2, 4) and mod == 0 and rm == 4 and raw[start + 2] & 7 != 5), start

    def answer(self, insn: Instruction, tramp: int, context: Context = NO_CONTEXT) -> Answer:
        raw = insn.raw
        stream = context.bytes_at(insn)
        a, n = insn.address, insn.length
        nxt = (a + n) & MASK64
        start, segment, rex = self._prefixes(raw)
        init = Cite(FASTTRAP, "fasttrap_tracepoint_init")
        probe = lambda note: Cite(FASTTRAP, "fasttrap_pid_probe", note)  # noqa: E731
        if start is None:
            return Refuse("-1: two segment prefixes", init)
        if start >= n:
            return Refuse("-1: only prefixes", init)
        op = raw[start]
        if op == 0x0F and start + 1 < n and 0x80 <= raw[start + 1] <= 0x8F:
            dest = (nxt + signed(int.from_bytes(raw[start + 2:start + 6], "little"), 4)) & MASK64
            return Emulate((Branch(JCC[raw[start + 1] & 0xF], dest, nxt),), probe("FASTTRAP_T_JCC"))
        if op == 0xFF and start + 1 < n and (raw[start + 1] >> 3) & 7 in (2, 4):
            return self._group5(raw, stream, start, segment, rex, a, nxt, probe)
        if op == 0xC3:
            return Emulate((Let("target", Load(Address(base="rsp"), 8)), AddRsp(8), Jump(Temp("target"))),
                           probe("FASTTRAP_T_RET"))
        if op == 0xC2:
            extra = int.from_bytes(raw[start + 1:start + 3], "little")
            return Emulate((Let("target", Load(Address(base="rsp"), 8)), AddRsp(8 + extra), Jump(Temp("target"))),
                           probe("FASTTRAP_T_RET16: addr += tp->ftt_dest"))
        if 0x70 <= op <= 0x7F:
            dest = (nxt + signed(raw[start + 1], 1)) & MASK64
            return Emulate((Branch(JCC[op & 0xF], dest, nxt),), probe("FASTTRAP_T_JCC"))
        if op in (0xE0, 0xE1, 0xE2, 0xE3):
            dest = (nxt + signed(raw[start + 1], 1)) & MASK64
            kind = {0xE0: 0, 0xE1: 1, 0xE2: 2, 0xE3: 3}[op]
            code = loop_code(kind, dest, nxt, tramp, True)
            cite = probe("FASTTRAP_T_LOOP: cx = rp->r_rcx--; taken = cx != 0" if op != 0xE3 else
                         "FASTTRAP_T_JCXZ: cx == 0")
            if code is None:
                return Unmodelled("the loop target is out of rel32 reach of T, where it is written as code", cite)
            return Relocate(code, b"", "emulated in fasttrap_pid_probe, written as code", cite)
        if op == 0xE8:
            dest = (nxt + signed(int.from_bytes(raw[start + 1:start + 5], "little"), 4)) & MASK64
            return Emulate((Push(Const(nxt)), Jump(Const(dest))), probe("FASTTRAP_T_CALL, ftt_code 0"))
        if op in (0xE9, 0xEB):
            rel = signed(int.from_bytes(raw[start + 1:start + 5], "little"), 4) if op == 0xE9 else signed(
                raw[start + 1], 1)
            return Emulate((Jump(Const((nxt + rel) & MASK64)),), probe("FASTTRAP_T_JMP, ftt_code 0"))
        if op == 0x55 and start == 0:
            return Emulate((Push(Reg("rbp")), Jump(Const(nxt))), probe("FASTTRAP_T_PUSHL_EBP"))
        if op == 0x90 and not rex & 1:
            return Emulate((Jump(Const(nxt)),), probe("FASTTRAP_T_NOP"))
        if op in (0xCC, 0xCD):
            return Refuse("-1: int3/int: shared with debuggers, or the trap may redirect the thread", init)
        return self._common(insn, raw, rex, tramp, nxt)

    def _group5(self, raw, stream, start, segment, rex, a, nxt, probe) -> Answer:
        modrm = raw[start + 1]
        mod, reg, rm = modrm >> 6, (modrm >> 3) & 7, modrm & 7
        call = reg == 2
        cite = probe(f"FASTTRAP_T_{'CALL' if call else 'JMP'}, ftt_code {2 if mod == 3 else 1}")
        if mod == 3:
            target = Reg(GPR64[rm | ((rex & 1) << 3)])
        else:
            base = index = None
            scale = 1
            if rm == 4:
                sib = raw[start + 2]
                idx, b = (sib >> 3) & 7, sib & 7
                scale = 1 << (sib >> 6)
                index = None if idx == 4 else GPR64[idx | (((rex >> 1) & 1) << 3)]
                base = None if mod == 0 and b == 5 else GPR64[b | ((rex & 1) << 3)]
                i, sz = 3, 1 if mod == 1 else 4
            elif mod == 0 and rm == 5:
                base, i, sz = "rip", 2, 4
            else:
                base = GPR64[rm | ((rex & 1) << 3)]
                i, sz = 2, 1 if mod == 1 else 4 if mod == 2 else 0
            src = stream if len(stream) >= start + i + sz else raw
            disp = signed(int.from_bytes(src[start + i:start + i + sz], "little"), sz) if sz else 0
            if segment is not None:
                return Unmodelled(f"a {segment}: operand: fasttrap_do_seg takes the base from the descriptor "
                                  f"table, which the effects language does not model", cite)
            if base == "rip":  # rp->r_rip was set to pc + size before the emulation
                address = Address(disp=(nxt + disp) & MASK64)
            else:
                address = Address(base=base, index=index, scale=scale if index else 1, disp=disp)
            target = Load(address, 8)
        if call:
            return Emulate((Let("target", target), Push(Const(nxt)), Jump(Temp("target"))), cite)
        return Emulate((Jump(target),), cite)

    def _common(self, insn: Instruction, raw: bytes, rex: int, tramp: int, nxt: int) -> Answer:
        tail = ABS_JUMP + struct.pack("<Q", nxt)
        cite = Cite(FASTTRAP, "fasttrap_pid_probe", "FASTTRAP_T_COMMON: scratch space, jmp *0(%rip); .quad pc+size")
        rmi = insn.modrm_offset
        if rmi is None or raw[rmi] >> 6 != 0 or raw[rmi] & 7 != 5:
            return Relocate(raw + tail, raw + tail, "none: the scratch code jumps back itself", cite)
        reg = (raw[rmi] >> 3) & 7
        scratch = (0 if reg != 0 else 1) | (8 if rex & 1 else 0)  # RIP_1: rax (r8), RIP_2: rcx (r9)
        b = bytearray(raw)
        b[rmi] = 0x80 | (reg << 3) | (scratch & 7)
        r, hi = scratch & 7, 0x4C if scratch & 8 else 0x48
        save = bytes([hi, 0x89, 0x05 | (r << 3)])
        load = bytes([0x49 if scratch & 8 else 0x48, 0xB8 | r]) + struct.pack("<Q", nxt)
        restore = bytes([hi, 0x8B, 0x05 | (r << 3)])
        body_len = 7 + 10 + len(b) + 7 + len(tail)
        slot = (tramp + body_len + 7) & ~7 & MASK64
        code = (save + struct.pack("<i", slot - (tramp + 7)) + load + bytes(b) + restore
                + struct.pack("<i", slot - (tramp + 17 + len(b) + 7)) + tail)
        return Relocate(code, bytes(b) + b"\x48\xb8" + bytes(8) + tail,
                        f"ripmode: %{GPR64[scratch]} = pc + size before, movq $old, %{GPR64[scratch]} after",
                        Cite(FASTTRAP, "fasttrap_tracepoint_init/fasttrap_pid_probe", "ftt_ripmode RIP_1/RIP_2"),
                        tracer_memory=((slot, 8),))


MODEL = Fasttrap()
