"""capstone 5 behind ``protocol.DetailDecoder``: the primary decoder's length,
field offsets and AT&T text for the pipeline (``CapstoneAdapter.detail``), and
the gate's ``Facts`` read straight from capstone's C structs (``decode_many``)."""

from __future__ import annotations

import ctypes
import struct

import capstone
from capstone import _cs, _cs_detail, _cs_insn, x86_const
from capstone.x86 import CsX86, CsX86Encoding, X86Op, X86OpValue

from ..instruction import DecoderAnswer
from .protocol import Detail, Facts, error

_CS = capstone.Cs(capstone.CS_ARCH_X86, capstone.CS_MODE_64)
_CS.syntax = capstone.CS_OPT_SYNTAX_ATT
_CS.detail = True


def version() -> str:
    return capstone.__version__


# --- the gate's Facts, from cs_disasm's buffer ---------------------------------

_CS_GATE = capstone.Cs(capstone.CS_ARCH_X86, capstone.CS_MODE_64)
_CS_GATE.detail = True
_GATE_INSN = ctypes.POINTER(_cs_insn)()
_BRANCH_IDS = frozenset(v for k, v in vars(x86_const).items()
                        if k.startswith("X86_INS_J") or k in ("X86_INS_CALL", "X86_INS_LOOP", "X86_INS_LOOPE",
                                                              "X86_INS_LOOPNE", "X86_INS_XBEGIN"))


def gate_facts(raw: bytes, address: int):
    """capstone's answer as a ``protocol.Facts`` (branch targets masked to 64 bits).

    Reads the same ``cs_insn``/``cs_x86`` C structs the Python binding's
    ``CsInsn`` reads, straight from ``cs_disasm``'s buffer: the binding's
    per-instruction copy and operand lists cost three times the decode."""
    n = _cs.cs_disasm(_CS_GATE.csh, raw, len(raw), address, 1, ctypes.byref(_GATE_INSN))
    if not n:
        return error("capstone: invalid instruction")
    try:
        ins = _GATE_INSN[0]
        x86 = ins.detail.contents.arch.x86
        enc = x86.encoding
        target = None
        if ins.id in _BRANCH_IDS and x86.op_count == 1 and x86.operands[0].type == x86_const.X86_OP_IMM:
            target = (x86.operands[0].imm - address) & 0xFFFFFFFFFFFFFFFF
        return Facts(ins.size, None,
                     enc.disp_offset if enc.disp_size else None, enc.disp_size,
                     enc.imm_offset if enc.imm_size else None, enc.imm_size, target)
    finally:
        _cs.cs_free(_GATE_INSN, n)


_BATCH = 512


def gate_facts_many(items) -> list:
    """``gate_facts`` for each ``(address, raw)``, decoding many per ``cs_disasm`` call.

    The strings are laid end to end and capstone sweeps them in one call;
    an instruction is taken only where it starts at its string's first byte
    and ends at its last, so capstone read exactly that string (its answer
    is then the one ``gate_facts`` gives: same bytes, and the branch target
    kept relative).  The string where the sweep stops or desynchronises is
    decoded alone by ``gate_facts`` and the sweep resumes after it; after
    ``_MAX_RESUMES`` such stops in a batch (fuzzed bytes) the rest go one by one."""
    out: list = []
    for start in range(0, len(items), _BATCH):
        batch = items[start:start + _BATCH]
        k = resumes = 0
        while k < len(batch):
            if resumes > _MAX_RESUMES:
                out += [gate_facts(raw, address) for address, raw in batch[k:]]
                break
            done = _sweep_batch(batch[k:])
            out += done
            k += len(done)
            if k < len(batch):
                out.append(gate_facts(batch[k][1], batch[k][0]))
                k += 1
                resumes += 1
    return out


_MAX_RESUMES = 8


def _packed(fields: list[tuple[int, str]], size: int) -> struct.Struct:
    """A ``struct`` reading ``fields`` ((offset, format code), in offset order) out of ``size`` bytes."""
    fmt, at = "=", 0
    for offset, code in fields:
        fmt += "x" * (offset - at) + code
        at = offset + struct.calcsize("=" + code)
    return struct.Struct(fmt + "x" * (size - at))


def _layout() -> tuple[struct.Struct, int, struct.Struct]:
    """Where the gate's fields lie in ``cs_insn`` and ``cs_detail``, from the binding's own ctypes
    definitions: (the struct of an instruction's id, address, size and detail pointer; where in the
    detail the x86 fields start; the struct of operand count, operand 0's type and immediate, and the
    encoding's displacement and immediate offsets and sizes)."""
    insn = _packed([(_cs_insn.id.offset, "I"), (_cs_insn.address.offset, "Q"), (_cs_insn.size.offset, "H"),
                    (_cs_insn.detail.offset, "Q")], ctypes.sizeof(_cs_insn))
    x86 = _cs_detail.arch.offset
    base = x86 + CsX86.op_count.offset
    op0 = x86 + CsX86.operands.offset
    enc = x86 + CsX86.encoding.offset
    fields = [(x86 + CsX86.op_count.offset, "B"), (op0 + X86Op.type.offset, "I"),
              (op0 + X86Op.value.offset + X86OpValue.imm.offset, "q"),
              (enc + CsX86Encoding.disp_offset.offset, "B"), (enc + CsX86Encoding.disp_size.offset, "B"),
              (enc + CsX86Encoding.imm_offset.offset, "B"), (enc + CsX86Encoding.imm_size.offset, "B")]
    end = enc + CsX86Encoding.imm_size.offset + 1
    return insn, base, _packed([(o - base, c) for o, c in fields], end - base)


_INSN, _DETAIL_AT, _DETAIL = _layout()
_SHAPES: dict[tuple, Facts] = {}  # a non-branch answer's (size, disp, imm) -> its one Facts


def _sweep_batch(items) -> list:
    """Facts for the leading strings capstone's one sweep decodes exactly.

    The instructions are read as bytes, one ``string_at`` for the whole ``cs_insn`` array and one per
    instruction for the x86 part of its detail, and unpacked by ``struct``: walking the same fields
    through ctypes attributes (about ten objects made per instruction) cost three times as much."""
    blob = b"".join(raw for _, raw in items)
    facts: list = []
    insn = ctypes.POINTER(_cs_insn)()
    n = _cs.cs_disasm(_CS_GATE.csh, blob, len(blob), 0, 0, ctypes.byref(insn))
    try:
        m = min(n, len(items))
        if not m:
            return facts
        offset = 0
        string_at, detail, span, shapes = ctypes.string_at, _DETAIL.unpack, _DETAIL.size, _SHAPES
        for (iid, address, size, at), (_, raw) in zip(_INSN.iter_unpack(string_at(insn, m * _INSN.size)), items):
            if address != offset or size != len(raw):
                break
            ops, op0_type, imm, d_off, d_size, i_off, i_size = detail(string_at(at + _DETAIL_AT, span))
            if iid in _BRANCH_IDS and ops == 1 and op0_type == x86_const.X86_OP_IMM:
                facts.append(Facts(size, None, d_off if d_size else None, d_size, i_off if i_size else None,
                                   i_size, (imm - offset) & 0xFFFFFFFFFFFFFFFF))
            else:
                shape = (size, None, d_off if d_size else None, d_size, i_off if i_size else None, i_size)
                f = shapes.get(shape)
                if f is None:
                    f = shapes[shape] = Facts(*shape)
                facts.append(f)
            offset += size
    finally:
        if n:
            _cs.cs_free(insn, n)
    return facts


# --- the pipeline's detail, from the same buffer ----------------------------------

_DETAIL_INSN = ctypes.POINTER(_cs_insn)()
_TEXT = _packed([(_cs_insn.size.offset, "H"), (_cs_insn.mnemonic.offset, f"{_cs_insn.mnemonic.size}s"),
                 (_cs_insn.op_str.offset, f"{_cs_insn.op_str.size}s"), (_cs_insn.detail.offset, "Q")],
                _cs_insn.detail.offset + 8)
_ENC = CsX86Encoding
_ENCODING_AT = _cs_detail.arch.offset + CsX86.encoding.offset + _ENC.disp_offset.offset  # in the detail
_ENCODING = _packed([(f.offset - _ENC.disp_offset.offset, "B")
                     for f in (_ENC.disp_offset, _ENC.disp_size, _ENC.imm_offset, _ENC.imm_size)],
                    _ENC.imm_size.offset - _ENC.disp_offset.offset + 1)


class CapstoneAdapter:
    """capstone 5 behind ``protocol.DetailDecoder``."""

    name = "capstone"
    fields = frozenset({"length", "disp", "imm", "target"})
    #: Registers come from iced-x86's InstructionInfoFactory, which lists the
    #: implicit operands completely; capstone's regs_access() would only add
    #: a second C call per decode (a third of capstone's cost here).
    details = frozenset({"answer", "mnemonic", "op_str"})

    def version(self) -> str:
        return version()

    def decode_many(self, items):
        return gate_facts_many(list(items))

    def detail(self, raw: bytes, address: int) -> Detail | None:
        """The binding's ``CsInsn`` fields, read as ``gate_facts`` reads them: straight from ``cs_disasm``'s
        buffer (the binding's copy of the instruction and its attribute lookups took 16.8 µs a call, this
        7.2 µs); ``tests/test_decoder_protocol.py`` compares the two on random and real bytes."""
        n = _cs.cs_disasm(_CS.csh, raw, len(raw), address, 1, ctypes.byref(_DETAIL_INSN))
        if not n:
            return None
        try:
            size, mnemonic, op_str, at = _TEXT.unpack(ctypes.string_at(_DETAIL_INSN, _TEXT.size))
            d_off, d_size, i_off, i_size = _ENCODING.unpack(ctypes.string_at(at + _ENCODING_AT, _ENCODING.size))
        finally:
            _cs.cs_free(_DETAIL_INSN, n)
        mnemonic = mnemonic.partition(b"\0")[0].decode("ascii")
        op_str = op_str.partition(b"\0")[0].decode("ascii")
        answer = DecoderAnswer("capstone", size, d_off, d_size, i_off, i_size, f"{mnemonic} {op_str}".strip())
        return Detail(answer, mnemonic, op_str)
