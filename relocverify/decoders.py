"""Decode bytes at an address into an ``Instruction``, cross-checked.

capstone (5.0.x) is the primary decoder: it gives the mnemonic and operand
text.  iced-x86 decodes the same bytes independently, and the two must
agree on the length and on the positions and sizes of the displacement and
the immediate.  A third, structural view of the encoding (prefixes, REX,
VEX/EVEX, opcode, ModRM, SIB) comes from ``layout``, written here from the
SDM's encoding rules, and must agree with both.

When the decoders disagree, the outcome is a ``Disagreement`` value
carrying every answer, unless the difference matches a row of
``KNOWN_DECODER_BUGS``: a documented capstone defect, resolved in favour of
iced-x86 with the row's reason recorded in ``Instruction.notes``.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import lru_cache
from typing import Callable

import capstone
import iced_x86

from .instruction import (
    LEGACY_PREFIXES,
    DecoderAnswer,
    Decoded,
    Disagreement,
    Instruction,
    MemoryOperand,
    Undecodable,
)

MAX_INSN = 15
MASK64 = 0xFFFFFFFFFFFFFFFF

# ---------------------------------------------------------------------------
# The structural layout of an encoding
# ---------------------------------------------------------------------------

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


# ---------------------------------------------------------------------------
# iced-x86
# ---------------------------------------------------------------------------

_ICED_REG = {v: k.lower() for k, v in vars(iced_x86.Register).items() if k.isupper() and isinstance(v, int)}
_ICED_MNEMONIC = {v: k.lower() for k, v in vars(iced_x86.Mnemonic).items() if k.isupper() and isinstance(v, int)}
_ICED_CC = {v: k.lower() for k, v in vars(iced_x86.ConditionCode).items() if k.isupper() and isinstance(v, int)}
_ICED_FLOW = {v: k.lower() for k, v in vars(iced_x86.FlowControl).items() if k.isupper() and isinstance(v, int)}
_READS = {1, 2, 5, 6}  # READ, COND_READ, READ_WRITE, READ_COND_WRITE
_WRITES = {3, 4, 5, 6}  # WRITE, COND_WRITE, READ_WRITE, READ_COND_WRITE

_GPR_FAMILY: dict[str, str] = {}
for _fam, _names in {
    "rax": "al ah ax eax rax", "rbx": "bl bh bx ebx rbx", "rcx": "cl ch cx ecx rcx", "rdx": "dl dh dx edx rdx",
    "rsi": "sil si esi rsi", "rdi": "dil di edi rdi", "rsp": "spl sp esp rsp", "rbp": "bpl bp ebp rbp",
    "rip": "ip eip rip",
}.items():
    for _nm in _names.split():
        _GPR_FAMILY[_nm] = _fam
for _k in range(8, 16):
    for _suf in ("b", "w", "d", ""):
        _GPR_FAMILY[f"r{_k}{_suf}"] = f"r{_k}"
    _GPR_FAMILY[f"r{_k}l"] = f"r{_k}"


def reg_family(name: str) -> str:
    """'eax' -> 'rax', 'r11d' -> 'r11'; other registers keep their name."""
    return _GPR_FAMILY.get(name, name)


_FORMATTER = iced_x86.Formatter(iced_x86.FormatterSyntax.GAS)
_INFO = iced_x86.InstructionInfoFactory()


@dataclass(frozen=True)
class _IcedFacts:
    answer: DecoderAnswer
    flow: str
    branch_target: int | None
    memory: MemoryOperand | None
    reads: frozenset[str]
    writes: frozenset[str]
    privileged: bool
    imm2: tuple[int, int]
    mnemonic: str
    op_str: str
    opname: str
    condition: str | None
    far: bool


def _iced(raw: bytes, address: int) -> _IcedFacts | None:
    dec = iced_x86.Decoder(64, raw, ip=address)
    ins = dec.decode()
    if ins.is_invalid or dec.last_error != 0:
        return None
    co = dec.get_constant_offsets(ins)
    info = _INFO.info(ins)
    reads, writes = set(), set()
    for r in info.used_registers():
        name = reg_family(_ICED_REG.get(r.register, str(r.register)))
        if r.access in _READS:
            reads.add(name)
        if r.access in _WRITES:
            writes.add(name)
    if ins.rflags_read:
        reads.add("rflags")
    if ins.rflags_modified:
        writes.add("rflags")
    text = _FORMATTER.format(ins)
    mnemonic, _, op_str = text.partition(" ")
    flow = _ICED_FLOW.get(ins.flow_control, "next")
    target = None
    if flow in ("unconditional_branch", "conditional_branch", "call", "xbegin_xabort_xend") and ins.near_branch_target:
        target = ins.near_branch_target & MASK64
    if flow == "xbegin_xabort_xend" and not ins.mnemonic == iced_x86.Mnemonic.XBEGIN:
        target = None
    memory = _iced_memory(ins, raw, co, info)
    answer = DecoderAnswer(
        "iced",
        ins.len,
        co.displacement_offset if co.has_displacement else 0,
        co.displacement_size if co.has_displacement else 0,
        co.immediate_offset if co.has_immediate else 0,
        co.immediate_size if co.has_immediate else 0,
        text,
    )
    imm2 = (co.immediate_offset2, co.immediate_size2) if co.has_immediate2 else (0, 0)
    return _IcedFacts(answer, flow, target, memory, frozenset(reads), frozenset(writes),
                      bool(ins.is_privileged), imm2, mnemonic, op_str.strip(),
                      _ICED_MNEMONIC.get(ins.mnemonic, mnemonic),
                      None if ins.condition_code == 0 else _ICED_CC[ins.condition_code],
                      bool(ins.is_call_far or ins.is_call_far_indirect or ins.is_jmp_far or ins.is_jmp_far_indirect
                           or _ICED_MNEMONIC.get(ins.mnemonic) == "retf"))


def _iced_memory(ins, raw: bytes, co, info) -> MemoryOperand | None:
    kinds = [ins.op_kind(k) for k in range(ins.op_count)]
    if iced_x86.OpKind.MEMORY not in kinds:
        return None
    base = _ICED_REG.get(ins.memory_base) if ins.memory_base else None
    index = _ICED_REG.get(ins.memory_index) if ins.memory_index else None
    if co.has_displacement:
        disp = int.from_bytes(raw[co.displacement_offset:co.displacement_offset + co.displacement_size], "little", signed=True)
    else:
        disp = 0
    lay = layout(raw[:ins.len])
    seg = None
    for p in lay.prefixes if lay else b"":
        seg = {0x64: "fs", 0x65: "gs"}.get(p, seg)
    size = _MEMSIZE.get(ins.memory_size, 0)
    addr_size = 32 if lay is not None and 0x67 in lay.prefixes else 64
    base_name = "rip" if base in ("rip", "eip") else base
    return MemoryOperand(base_name, index, ins.memory_index_scale if index else 1, disp, seg, size, addr_size)


_MEMSIZE = {
    getattr(iced_x86.MemorySize, k): v
    for k, v in {"UINT8": 1, "INT8": 1, "UINT16": 2, "INT16": 2, "UINT32": 4, "INT32": 4, "UINT64": 8, "INT64": 8,
                 "QWORD_OFFSET": 8, "DWORD_OFFSET": 4, "WORD_OFFSET": 2}.items()
    if hasattr(iced_x86.MemorySize, k)
}

# ---------------------------------------------------------------------------
# capstone
# ---------------------------------------------------------------------------

_CS = capstone.Cs(capstone.CS_ARCH_X86, capstone.CS_MODE_64)
_CS.syntax = capstone.CS_OPT_SYNTAX_ATT
_CS.detail = True


@dataclass(frozen=True)
class _CapstoneFacts:
    answer: DecoderAnswer
    mnemonic: str
    op_str: str
    reads: frozenset[str]
    writes: frozenset[str]


def _capstone(raw: bytes, address: int) -> _CapstoneFacts | None:
    try:
        ins = next(_CS.disasm(raw, address, 1), None)
    except capstone.CsError:
        return None
    if ins is None:
        return None
    # Registers come from iced-x86's InstructionInfoFactory, which lists the
    # implicit operands completely; capstone's regs_access() would only add
    # a second C call per decode (a third of capstone's cost here).
    reads = writes = frozenset()
    answer = DecoderAnswer("capstone", ins.size, ins.disp_offset, ins.disp_size, ins.imm_offset, ins.imm_size,
                           f"{ins.mnemonic} {ins.op_str}".strip())
    return _CapstoneFacts(answer, ins.mnemonic, ins.op_str, reads, writes)


# ---------------------------------------------------------------------------
# Known decoder bugs: a disagreement matching a row is resolved, with the reason
# ---------------------------------------------------------------------------


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
    "uiret clui stui testui senduipi hreset wrmsrns rdmsrlist wrmsrlist".split()
)


def _cs_missing(raw: bytes, cs: DecoderAnswer | None, ic: DecoderAnswer) -> bool:
    return cs is None and ic.text.split(" ")[0] in _CS_UNSUPPORTED


KNOWN_DECODER_BUGS: tuple[KnownBug, ...] = (
    KnownBug("capstone-66-rip-disp", _cs_short_disp,
             "capstone 5 reports disp_size=2 when the operand size is 16 bits (0x66, or VEX/EVEX pp=01); "
             "64-bit mode has no 2-byte displacement, it is 4 bytes (capstone #1640, #2077, #2613): iced-x86's offsets used"),
    KnownBug("capstone-ud1-modrm", _cs_ud1,
             "capstone 5 decodes ud1 (0f b9 /r) without its ModRM byte (capstone #2149): iced-x86's length used"),
    KnownBug("capstone-missing-insn", _cs_missing,
             "capstone 5 cannot decode this instruction (serialize, rmpadjust, pvalidate, tilerelease, ...): "
             "iced-x86's decode used"),
)


def _agree(cs: DecoderAnswer, ic: DecoderAnswer, imm2: tuple[int, int]) -> bool:
    """Same length, displacement and immediate.  For two-immediate forms
    (enter, extrq/insertq) capstone reports the second immediate: accepted."""
    if (cs.length, cs.disp_offset, cs.disp_size) != (ic.length, ic.disp_offset, ic.disp_size):
        return False
    return (cs.imm_offset, cs.imm_size) in ((ic.imm_offset, ic.imm_size), imm2)


# ---------------------------------------------------------------------------
# The one entry point
# ---------------------------------------------------------------------------


def decode(raw: bytes, address: int) -> Decoded:
    """Decode the first instruction of ``raw`` at ``address``.

    ``raw`` may hold more bytes than the instruction; the record keeps only
    the instruction's own bytes.  Never raises for any byte string.
    """
    raw = bytes(raw[:MAX_INSN])
    address &= MASK64
    return _decode_cached(raw, address)


@lru_cache(maxsize=8192)
def _decode_cached(raw: bytes, address: int) -> Decoded:
    ic = _iced(raw, address)
    cs = _capstone(raw, address)
    answers = tuple(a.answer for a in (cs, ic) if a is not None)
    if ic is None and cs is None:
        return Undecodable(address, raw[:1], "no decoder could decode these bytes",
                           (DecoderAnswer("capstone", None), DecoderAnswer("iced", None)))
    if ic is None:
        return Disagreement(address, raw[:cs.answer.length],
                            "capstone decodes these bytes but iced-x86 finds them invalid",
                            (cs.answer, DecoderAnswer("iced", None)))
    notes: tuple[str, ...] = ()
    if cs is None or not _agree(cs.answer, ic.answer, ic.imm2):
        bug = next((b for b in KNOWN_DECODER_BUGS if b.matches(raw, cs and cs.answer, ic.answer)), None)
        if bug is None:
            what = "capstone cannot decode these bytes" if cs is None else "capstone and iced-x86 disagree"
            length = ic.answer.length
            answers = answers if cs is not None else (DecoderAnswer("capstone", None), ic.answer)
            return Disagreement(address, raw[:length], what, answers)
        notes = (f"{bug.name}: {bug.reason}",)
        if cs is None:
            answers = (DecoderAnswer("capstone", None), ic.answer)
    ins_raw = raw[:ic.answer.length]
    lay = layout(ins_raw)
    if lay is None:
        return Undecodable(address, ins_raw, "the encoding's structure could not be parsed")
    mem = ic.memory
    use_cs_text = cs is not None and not notes
    reads = ic.reads | (cs.reads if cs else frozenset())
    writes = ic.writes | (cs.writes if cs else frozenset())
    return Instruction(
        address=address,
        raw=ins_raw,
        mnemonic=cs.mnemonic if use_cs_text else ic.mnemonic,
        op_str=cs.op_str if use_cs_text else ic.op_str,
        opname=ic.opname,
        condition=ic.condition,
        far=ic.far,
        prefixes=lay.prefixes,
        rex=lay.rex,
        vex=lay.vex,
        encoding=lay.encoding,
        opcode_offset=lay.opcode_offset,
        opcode=lay.opcode,
        modrm_offset=lay.modrm_offset,
        sib_offset=lay.sib_offset,
        disp_offset=ic.answer.disp_offset,
        disp_size=ic.answer.disp_size,
        imm_offset=ic.answer.imm_offset,
        imm_size=ic.answer.imm_size,
        imm2_offset=ic.imm2[0],
        imm2_size=ic.imm2[1],
        rip_relative=mem is not None and mem.base == "rip",
        flow=ic.flow,
        branch_target=ic.branch_target,
        memory=mem,
        regs_read=tuple(sorted(reads)),
        regs_written=tuple(sorted(writes)),
        privileged=ic.privileged,
        answers=answers,
        notes=notes,
    )


def decoder_versions() -> dict[str, str]:
    """Versions of every decoder whose answers feed a decode (part of the proof-cache key)."""
    return {"capstone": capstone.__version__, "iced": getattr(iced_x86, "__version__", "1.21.0")}


def rebase(decoded: Decoded, address: int) -> Decoded:
    """The same decode at another address.

    Only address-derived facts change: the address itself and a relative
    branch's target (address + length + rel, masked); RIP-relative operands
    are carried as their encoded displacement and resolved from ``address``
    on use.  Used by the batch to decode each distinct byte string once.
    """
    address &= MASK64
    if decoded.address == address:
        return decoded
    if not isinstance(decoded, Instruction):
        return replace(decoded, address=address)
    new = object.__new__(Instruction)  # a field-for-field copy: dataclasses.replace is 20x slower here
    new.__dict__.update(decoded.__dict__)
    object.__setattr__(new, "address", address)
    target = decoded.branch_target
    if target is not None:
        new_target = (target - decoded.address + address) & MASK64
        object.__setattr__(new, "op_str", decoded.op_str.replace(f"{target:#x}", f"{new_target:#x}"))
        object.__setattr__(new, "branch_target", new_target)
    return new


_CS_LITE = capstone.Cs(capstone.CS_ARCH_X86, capstone.CS_MODE_64)
_CS_LITE.syntax = capstone.CS_OPT_SYNTAX_ATT


def field_shape(raw: bytes) -> bytes | None:
    """``raw`` with its displacement and relative-branch bytes zeroed, or None
    if it has neither (or is invalid).

    Two encodings with the same shape have the same length, prefixes,
    opcode, ModRM/SIB and field positions, and the same decode facts but for
    the field values themselves: x86 lengths and offsets do not depend on a
    displacement or a branch offset.  (Other immediates stay in the shape: a
    shift by 0 writes no flags, so their values can matter.)"""
    dec = iced_x86.Decoder(64, raw)
    ins = dec.decode()
    if ins.is_invalid or ins.len != len(raw):
        return None
    co = dec.get_constant_offsets(ins)
    rel = co.has_immediate and ins.flow_control in _REL_FLOWS and ins.near_branch_target != 0 or \
        co.has_immediate and ins.is_jcx_short or co.has_immediate and ins.is_loop or co.has_immediate and ins.is_loopcc
    if not (co.has_displacement or rel):
        return None
    b = bytearray(raw)
    if co.has_displacement:
        b[co.displacement_offset:co.displacement_offset + co.displacement_size] = bytes(co.displacement_size)
    if rel:
        b[co.immediate_offset:co.immediate_offset + co.immediate_size] = bytes(co.immediate_size)
    return bytes(b)


_REL_FLOWS = (iced_x86.FlowControl.UNCONDITIONAL_BRANCH, iced_x86.FlowControl.CONDITIONAL_BRANCH,
              iced_x86.FlowControl.CALL, iced_x86.FlowControl.XBEGIN_XABORT_XEND)


def with_fields(shape: Instruction, raw: bytes, address: int) -> Instruction | None:
    """The decode of ``raw`` at ``address`` from the decode of another encoding of the same shape.

    Only the field-derived facts change: the bytes, the displacement, a
    relative branch's target and the text.  Both decoders still check the
    new bytes: iced-x86 and capstone (its lite mode) must each decode
    exactly ``len(raw)`` bytes, and iced gives the branch target.  None if
    they do not (the caller then decodes in full)."""
    if len(raw) != shape.length:
        return None
    dec = iced_x86.Decoder(64, raw, ip=address)
    ins = dec.decode()
    if ins.is_invalid or ins.len != len(raw):
        return None
    lite = next(_CS_LITE.disasm_lite(raw, address, 1), None)
    if shape.notes:  # a known capstone defect: the text is iced-x86's, as in decode()
        mnemonic, _, op_str = _FORMATTER.format(ins).partition(" ")
        lite = (address, len(raw) if lite is None else lite[1], mnemonic, op_str.strip())
    if lite is None or (lite[1] != len(raw) and not shape.notes):
        return None
    new = object.__new__(Instruction)
    new.__dict__.update(shape.__dict__)
    object.__setattr__(new, "raw", raw)
    object.__setattr__(new, "address", address & MASK64)
    object.__setattr__(new, "mnemonic", lite[2])
    object.__setattr__(new, "op_str", lite[3])
    if shape.branch_target is not None:
        object.__setattr__(new, "branch_target", ins.near_branch_target & MASK64)
    if shape.memory is not None and shape.disp_size:
        disp = int.from_bytes(raw[shape.disp_offset:shape.disp_offset + shape.disp_size], "little", signed=True)
        object.__setattr__(new, "memory", replace(shape.memory, displacement=disp))
    return new
