"""The structural layout of an x86-64 encoding: prefixes, REX, VEX/EVEX/XOP,
opcode, ModRM and SIB, written from the SDM's encoding rules (Vol. 2,
chapter 2 and appendix A), independent of any decoder library.

``layout(raw)`` is the third view the decoder cross-check compares with
capstone and iced-x86, and the planner's source for where the opcode and
ModRM bytes are when it re-encodes an instruction.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

MAX_INSN = 15
LEGACY_PREFIXES = frozenset(b"\xf0\xf2\xf3\x2e\x36\x3e\x26\x64\x65\x66\x67")

# One-byte opcodes that take a ModRM byte (SDM Vol. 2, Table A-2).
_MODRM_1 = frozenset(
    [x for base in range(0x00, 0x40, 8) for x in range(base, base + 4)]
    + [0x62, 0x63, 0x69, 0x6B]
    + list(range(0x80, 0x90))
    + [0xC0, 0xC1, 0xC4, 0xC5, 0xC6, 0xC7, 0xD0, 0xD1, 0xD2, 0xD3]
    + list(range(0xD8, 0xE0))
    + [0xF6, 0xF7, 0xFE, 0xFF]
)
# Two-byte (0F xx) opcodes WITHOUT a ModRM byte (Table A-3).  0F B9 (ud1)
# has one, although capstone 5 decodes it without (capstone #2149).
_NO_MODRM_0F = frozenset(
    [0x05, 0x06, 0x07, 0x08, 0x09, 0x0B, 0x0E, 0x30, 0x31, 0x32, 0x33, 0x34, 0x35, 0x37, 0x77, 0xA0, 0xA1, 0xA2, 0xA8, 0xA9, 0xAA]
    + list(range(0x80, 0x90))
    + list(range(0xC8, 0xD0))
)


@dataclass(frozen=True)
class Layout:
    prefixes: bytes
    rex: int | None
    vex: bytes
    encoding: str
    opcode_offset: int
    opcode: bytes
    modrm_offset: int | None
    sib_offset: int | None


def layout(raw: bytes) -> Layout | None:
    """Split an encoding into its parts.  None if the bytes end too early."""
    return _layout(bytes(raw))


@lru_cache(maxsize=1 << 16)
def _layout(raw: bytes) -> Layout | None:
    """``layout``, remembered: a decode reads an instruction's layout twice (its memory operand's
    segment and size, and the record), and the gate and the planner ask again."""
    i, n = 0, len(raw)
    rex = None
    legacy = bytearray()
    # Legacy prefixes and REX bytes may interleave; a REX counts only when it
    # immediately precedes the opcode (SDM 2.2.1): one followed by a legacy
    # prefix is ignored by the hardware.
    while i < n and i < MAX_INSN and (raw[i] in LEGACY_PREFIXES or 0x40 <= raw[i] <= 0x4F):
        if 0x40 <= raw[i] <= 0x4F:
            rex = raw[i]
        else:
            rex = None
            legacy.append(raw[i])
        i += 1
    prefixes = bytes(legacy)
    if i >= n:
        return None
    b = raw[i]
    vex, encoding = b"", "legacy"
    if b in (0xC4, 0xC5, 0x62) or (b == 0x8F and i + 1 < n and (raw[i + 1] & 0x1F) >= 8):
        size = {0xC4: 3, 0xC5: 2, 0x62: 4, 0x8F: 3}[b]
        if i + size >= n:
            return None
        vex = bytes(raw[i:i + size])
        encoding = {0xC4: "vex", 0xC5: "vex", 0x62: "evex", 0x8F: "xop"}[b]
        i += size
        opcode = bytes(raw[i:i + 1])
        op_off = i
        i += 1
        has_modrm = not (encoding == "vex" and opcode == b"\x77")  # vzeroupper/vzeroall
    else:
        op_off = i
        if b == 0x0F and i + 1 < n:
            b2 = raw[i + 1]
            if b2 in (0x38, 0x3A) and i + 2 < n:
                opcode = bytes(raw[i:i + 3])
                has_modrm = True
            elif b2 == 0x0F:
                opcode, encoding, has_modrm = b"\x0f\x0f", "3dnow", True
            else:
                opcode = bytes(raw[i:i + 2])
                has_modrm = b2 not in _NO_MODRM_0F
        else:
            opcode = bytes(raw[i:i + 1])
            has_modrm = b in _MODRM_1
        i += len(opcode)
    modrm_off = sib_off = None
    if has_modrm and i < n:
        modrm_off = i
        m = raw[i]
        if (m >> 6) != 3 and (m & 7) == 4:
            sib_off = i + 1
    return Layout(prefixes, rex, vex, encoding, op_off, opcode, modrm_off, sib_off)

