"""Documented decoder defects.  A disagreement between capstone and iced-x86
that matches a row is resolved in iced-x86's favour, and the row's reason
is recorded in the instruction's notes (sources in docs/references.md)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from ..instruction import DecoderAnswer
from ..layout import layout

@dataclass(frozen=True)
class KnownBug:
    name: str
    matches: Callable[[bytes, DecoderAnswer | None, DecoderAnswer], bool]
    reason: str


def _cs_short_disp(raw: bytes, cs: DecoderAnswer | None, ic: DecoderAnswer) -> bool:
    # 64-bit mode has no 2-byte displacements (SDM 2.2.1.3): capstone derives
    # the size from the operand size (a 0x66 prefix, or VEX/EVEX pp=01).
    return (cs is not None and cs.length == ic.length and cs.disp_size == 2 and ic.disp_size == 4
            and cs.disp_offset == ic.disp_offset)


def _cs_ud1(raw: bytes, cs: DecoderAnswer | None, ic: DecoderAnswer) -> bool:
    lay = layout(raw[:ic.length])
    return (lay is not None and lay.opcode == b"\x0f\xb9" and cs is not None
            and cs.length == lay.opcode_offset + 2 and ic.length > cs.length)


_CS_UNSUPPORTED = frozenset(
    "serialize rmpadjust pvalidate tilerelease rmpupdate psmash xsusldtrk xresldtrk enqcmd enqcmds "
    "uiret clui stui testui senduipi hreset wrmsrns rdmsrlist wrmsrlist invlpgb tlbsync".split()
)


def _cs_missing(raw: bytes, cs: DecoderAnswer | None, ic: DecoderAnswer) -> bool:
    return cs is None and ic.text.split(" ")[0] in _CS_UNSUPPORTED


def _is4_byte(raw: bytes, cs: DecoderAnswer | None, ic: DecoderAnswer) -> bool:
    """A four-operand VEX/XOP form whose last byte is an is4 register selector (bits 7:4): the register is
    the third operand when VEX.W=1 puts the memory operand last (FMA4, XOP vpcmov/vpperm), else the fourth."""
    if cs is None or cs.length != ic.length or (cs.disp_offset, cs.disp_size) != (ic.disp_offset, ic.disp_size):
        return False
    if ic.imm_size or cs.imm_size != 1 or cs.imm_offset != ic.length - 1:
        return False
    import iced_x86

    ins = iced_x86.Decoder(64, raw[:ic.length]).decode()
    return (ins.encoding in (iced_x86.EncodingKind.VEX, iced_x86.EncodingKind.XOP) and ins.op_count >= 4
            and iced_x86.OpKind.REGISTER in (ins.op_kind(2), ins.op_kind(3)))


KNOWN_DECODER_BUGS: tuple[KnownBug, ...] = (
    KnownBug("capstone-66-rip-disp", _cs_short_disp,
             "capstone 5 reports disp_size=2 when the operand size is 16 bits (0x66, or VEX/EVEX pp=01); "
             "64-bit mode has no 2-byte displacement, it is 4 bytes (capstone #1640, #2077, #2613): iced-x86's offsets used"),
    KnownBug("capstone-ud1-modrm", _cs_ud1,
             "capstone 5 decodes ud1 (0f b9 /r) without its ModRM byte (capstone #2149): iced-x86's length used"),
    KnownBug("capstone-missing-insn", _cs_missing,
             "capstone 5 cannot decode this instruction (serialize, rmpadjust, pvalidate, tilerelease, ...): "
             "iced-x86's decode used"),
    KnownBug("is4-register-byte", _is4_byte,
             "a convention, not a defect: the last byte of a four-operand VEX/XOP form (blendv, FMA4, XOP) "
             "names a register in bits 7:4 (is4); capstone counts it as an 8-bit immediate, iced-x86 as "
             "part of that operand: the same encoding, iced-x86's offsets used"),
)


def agree(cs: DecoderAnswer, ic: DecoderAnswer, imm2: tuple[int, int]) -> bool:
    """Same length, displacement and immediate.  For two-immediate forms
    (enter, extrq/insertq) capstone reports the second immediate: accepted."""
    if (cs.length, cs.disp_offset, cs.disp_size) != (ic.length, ic.disp_offset, ic.disp_size):
        return False
    return (cs.imm_offset, cs.imm_size) in ((ic.imm_offset, ic.imm_size), imm2)

