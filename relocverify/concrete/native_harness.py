"""The machine code that runs one instruction on the host CPU between a load and a store of every register.

``harness(raw, ctx)`` returns ``(page, offset)``: the bytes of one code
page whose start is a function with no arguments (System V ABI), and the
offset of ``raw`` in it (``INSN_OFFSET``).  ``ctx`` is the fixed address
of a context block laid out as the ``IN_``/``OUT_``/``HOST_`` offsets
below.  Page layout: the prologue at 0 (ending in a jmp to the
instruction), the instruction at ``INSN_OFFSET`` followed by a jmp to the
epilogue at ``FALL_OFFSET``, the "taken" epilogue at ``TAKEN_OFFSET``
(sets the context's ``TAKEN`` word, then joins the other); every other
byte is int3.  A branch's target gets a landing pad (``landing_pad``)
that jumps to the taken epilogue.  The function

1. pushes the callee-saved registers, saves the host rsp and MXCSR in the block;
2. loads xmm0-15, MXCSR, RFLAGS (popfq) and the 16 GPRs, rsp and rax last;
3. runs ``raw``, which falls through to the next byte;
4. stores rax with an absolute ``mov`` (flags untouched), then the other
   GPRs, switches back to the host stack, stores RFLAGS (pushfq) and
   MXCSR, then xmm0-15;
5. restores the host MXCSR, clears DF (the ABI requires it), pops the
   callee-saved registers and returns.

Nothing between popfq and pushfq changes RFLAGS except ``raw``.  The
harness does not touch the x87 state, the mask registers, or the upper
halves of the ymm registers: instructions that read them are refused by
``native.refusal``.
"""

from __future__ import annotations

import struct

from ..x86.registers import GPR64

# Context block: offsets of each field (bytes).
IN_GPR, IN_RFLAGS, IN_MXCSR, IN_XMM = 0x000, 0x080, 0x088, 0x100
OUT_GPR, OUT_RFLAGS, OUT_MXCSR, OUT_XMM = 0x200, 0x280, 0x288, 0x300
HOST_RSP, HOST_MXCSR, TAKEN = 0x400, 0x408, 0x40C
CONTEXT_SIZE = 0x410
PAGE = 0x1000
INSN_OFFSET, FALL_OFFSET, TAKEN_OFFSET = 0x400, 0x800, 0xA00
PAD_WINDOW = (0x180, 0x7F0)  # offsets where a near landing pad may go (neither prologue nor epilogues)
_EPILOGUE_HEAD = 20  # mov [moffs64],rax; movabs rax,ctx

_CALLEE_SAVED = (3, 5, 12, 13, 14, 15)  # rbx rbp r12 r13 r14 r15


def _rex(w: int, reg: int, base: int = 0) -> bytes:
    rex = 0x40 | (w << 3) | ((reg >> 3) << 2) | (base >> 3)
    return bytes([rex]) if rex != 0x40 else b""


def _rax_disp(opcode: bytes, reg: int, disp: int, w: int = 1, prefix: bytes = b"") -> bytes:
    """``opcode reg, [rax + disp32]`` (ModRM mod=10, rm=rax)."""
    return prefix + _rex(w, reg) + opcode + bytes([0x80 | ((reg & 7) << 3)]) + struct.pack("<i", disp)


def _push(reg: int) -> bytes:
    return _rex(0, 0, reg) + bytes([0x50 + (reg & 7)])


def _pop(reg: int) -> bytes:
    return _rex(0, 0, reg) + bytes([0x58 + (reg & 7)])


def _prologue(ctx: int) -> bytes:
    code = b"".join(_push(r) for r in _CALLEE_SAVED)
    code += b"\x48\xb8" + struct.pack("<Q", ctx)  # movabs rax, ctx
    code += _rax_disp(b"\x89", 4, HOST_RSP)  # mov [rax+HOST_RSP], rsp
    code += _rax_disp(b"\x0f\xae", 3, HOST_MXCSR, w=0)  # stmxcsr
    for i in range(16):  # movdqu xmm_i, [rax+IN_XMM+16i]
        code += _rax_disp(b"\x0f\x6f", i, IN_XMM + 16 * i, w=0, prefix=b"\xf3")
    code += _rax_disp(b"\x0f\xae", 2, IN_MXCSR, w=0)  # ldmxcsr
    code += _rax_disp(b"\xff", 6, IN_RFLAGS, w=0)  # push qword [rax+IN_RFLAGS]
    code += b"\x9d"  # popfq
    for reg in range(1, 16):
        if reg != 4:
            code += _rax_disp(b"\x8b", reg, IN_GPR + 8 * reg)
    code += _rax_disp(b"\x8b", 4, IN_GPR + 8 * 4)  # rsp
    code += _rax_disp(b"\x8b", 0, IN_GPR)  # rax last
    return code


def _epilogue(ctx: int) -> bytes:
    code = b"\x48\xa3" + struct.pack("<Q", ctx + OUT_GPR)  # mov [ctx+OUT_GPR], rax
    code += b"\x48\xb8" + struct.pack("<Q", ctx)
    for reg in range(1, 16):
        code += _rax_disp(b"\x89", reg, OUT_GPR + 8 * reg)
    code += _rax_disp(b"\x8b", 4, HOST_RSP)  # back on the host stack
    code += b"\x9c" + b"\x59"  # pushfq; pop rcx
    code += _rax_disp(b"\x89", 1, OUT_RFLAGS)
    code += _rax_disp(b"\x0f\xae", 3, OUT_MXCSR, w=0)  # stmxcsr
    for i in range(16):  # movdqu [rax+OUT_XMM+16i], xmm_i
        code += _rax_disp(b"\x0f\x7f", i, OUT_XMM + 16 * i, w=0, prefix=b"\xf3")
    code += _rax_disp(b"\x0f\xae", 2, HOST_MXCSR, w=0)  # ldmxcsr host
    code += b"\xfc"  # cld
    code += b"".join(_pop(r) for r in reversed(_CALLEE_SAVED))
    return code + b"\xc3"


def _jmp(source: int, target: int) -> bytes:
    """jmp rel32 from offset ``source`` to offset ``target`` of the page."""
    return b"\xe9" + struct.pack("<i", target - (source + 5))


def harness(raw: bytes, ctx: int) -> tuple[bytes, int]:
    """The code page around ``raw`` and the offset of ``raw`` in it."""
    page = bytearray(b"\xcc" * PAGE)
    prologue = _prologue(ctx)
    prologue += _jmp(len(prologue), INSN_OFFSET)
    page[:len(prologue)] = prologue
    end = INSN_OFFSET + len(raw)
    page[INSN_OFFSET:end + 5] = bytes(raw) + _jmp(end, FALL_OFFSET)
    epilogue = _epilogue(ctx)
    page[FALL_OFFSET:FALL_OFFSET + len(epilogue)] = epilogue
    taken = epilogue[:_EPILOGUE_HEAD] + b"\xc7\x80" + struct.pack("<iI", TAKEN, 1)  # mov dword [rax+TAKEN], 1
    taken += _jmp(TAKEN_OFFSET + len(taken), FALL_OFFSET + _EPILOGUE_HEAD)
    page[TAKEN_OFFSET:TAKEN_OFFSET + len(taken)] = taken
    assert len(prologue) <= PAD_WINDOW[0] and FALL_OFFSET + len(epilogue) <= TAKEN_OFFSET
    return bytes(page), INSN_OFFSET


def landing_pad(target: int, code_page: int) -> bytes:
    """Bytes for ``target`` that jump to the taken epilogue without touching a register or a flag."""
    if code_page <= target < code_page + PAGE:
        return _jmp(target - code_page, TAKEN_OFFSET)
    return b"\xff\x25\x00\x00\x00\x00" + struct.pack("<Q", code_page + TAKEN_OFFSET)  # jmp *0(%rip)


def pack_inputs(registers: dict[str, int]) -> bytes:
    """The input half of the context block (IN_GPR .. IN_XMM+256)."""
    block = bytearray(OUT_GPR)
    for i, name in enumerate(GPR64):
        struct.pack_into("<Q", block, IN_GPR + 8 * i, registers.get(name, 0) & (2**64 - 1))
    struct.pack_into("<Q", block, IN_RFLAGS, registers["rflags"])
    struct.pack_into("<I", block, IN_MXCSR, registers["mxcsr"])
    for i in range(16):
        block[IN_XMM + 16 * i:IN_XMM + 16 * i + 16] = (registers.get(f"xmm{i}", 0) & (2**128 - 1)).to_bytes(16, "little")
    return bytes(block)


def unpack_outputs(block: bytes) -> dict[str, int]:
    """The registers stored by the epilogue, from the whole context block."""
    regs = {name: struct.unpack_from("<Q", block, OUT_GPR + 8 * i)[0] for i, name in enumerate(GPR64)}
    regs["rflags"] = struct.unpack_from("<Q", block, OUT_RFLAGS)[0]
    regs["mxcsr"] = struct.unpack_from("<I", block, OUT_MXCSR)[0]
    for i in range(16):
        regs[f"xmm{i}"] = int.from_bytes(block[OUT_XMM + 16 * i:OUT_XMM + 16 * i + 16], "little")
    return regs
