"""Encoding helpers shared by the planner, the checker and the renderers.

The one trampoline form that is not plain instructions is the kinst-style
absolute jump, ``jmp *0(%rip)`` followed by the 8-byte target
(``ABS_JUMP``): ``iter_code`` is the one walker that knows it, so every
reader of a trampoline (disassembly, atomicity, address fields) sees the
qword as data, not as instructions.
"""

from __future__ import annotations

import struct
from typing import Iterator, NamedTuple

import iced_x86

from .registers import MASK64, fits_s32, signed64

ABS_JUMP = b"\xff\x25\x00\x00\x00\x00"  # jmp *0(%rip): the target is the qword that follows
ABS_JUMP_LEN = len(ABS_JUMP) + 8


def rel_from(end: int, target: int) -> int:
    """The displacement from an instruction ending at ``end`` to ``target``, as a signed 64-bit delta."""
    return signed64(target - end)


def jump(at: int, to: int, align_qword: bool = False) -> bytes:
    """``jmp rel32`` if ``to`` is in reach from ``at``, else ``jmp *0(%rip); .quad to``.  With
    ``align_qword``, NOPs before the absolute jump put its qword on an 8-byte boundary: in user space with
    RFLAGS.AC set, the jump's misaligned load would raise #AC where the original raised nothing
    (``proof.machine_model``, row alignment-check).  The tracers' own models (``tracers/``) keep the
    unaligned form their tracers emit."""
    d = rel_from(at + 5, to)
    if fits_s32(d):
        return b"\xe9" + struct.pack("<i", d)
    pad = -(at + len(ABS_JUMP)) % 8 if align_qword else 0
    return b"\x90" * pad + ABS_JUMP + struct.pack("<Q", to & MASK64)


def patch_disp(raw: bytes, off: int, disp: int) -> bytes:
    """``raw`` with the 4-byte field at ``off`` replaced by ``disp``."""
    return raw[:off] + struct.pack("<i", disp) + raw[off + 4:]


class CodePiece(NamedTuple):
    """One piece of trampoline code: an instruction, the qword of an absolute
    jump, or a byte iced-x86 cannot decode."""

    offset: int
    length: int
    kind: str  # 'insn' | 'qword' | 'invalid'


def iter_code(code: bytes, base: int) -> Iterator[CodePiece]:
    """Walk ``code`` (placed at ``base``) piece by piece, in order.

    Instructions are delimited by iced-x86; the 8 bytes after each
    ``jmp *0(%rip)`` are one ``qword`` piece (a truncated one is
    ``invalid``); an undecodable byte is one ``invalid`` piece."""
    dec = iced_x86.Decoder(64, code, ip=base & MASK64)
    ins = iced_x86.Instruction()
    off = 0
    while off < len(code):
        dec.position = off
        dec.ip = (base + off) & MASK64
        dec.decode_out(ins)
        if ins.is_invalid:
            yield CodePiece(off, 1, "invalid")
            off += 1
            continue
        yield CodePiece(off, ins.len, "insn")
        off += ins.len
        if code[off - ins.len:off] == ABS_JUMP:
            n = min(8, len(code) - off)
            yield CodePiece(off, n, "qword" if n == 8 else "invalid")
            off += n
