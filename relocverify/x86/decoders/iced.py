"""iced-x86 behind ``protocol.DetailDecoder``: lengths, field offsets,
operands, flow control and the registers an instruction reads and writes (its
``InstructionInfoFactory`` lists the implicit operands completely) for the
pipeline (``IcedAdapter.detail``); the gate's ``Facts`` (``decode_many``); and
``sweep_into``, the gate's linear sweep of an image, which keeps the sweep's
own decode as iced-x86's ``Facts``."""

from __future__ import annotations

import iced_x86

from ..instruction import DecoderAnswer, MemoryOperand
from ..layout import layout
from ..registers import MASK64, reg_family
from .protocol import Detail, Facts, error

_ICED_REG = {v: k.lower() for k, v in vars(iced_x86.Register).items() if k.isupper() and isinstance(v, int)}
_ICED_MNEMONIC = {v: k.lower() for k, v in vars(iced_x86.Mnemonic).items() if k.isupper() and isinstance(v, int)}
_ICED_CC = {v: k.lower() for k, v in vars(iced_x86.ConditionCode).items() if k.isupper() and isinstance(v, int)}
_ICED_FLOW = {v: k.lower() for k, v in vars(iced_x86.FlowControl).items() if k.isupper() and isinstance(v, int)}
_READS = {1, 2, 5, 6}  # READ, COND_READ, READ_WRITE, READ_COND_WRITE
_WRITES = {3, 4, 5, 6}  # WRITE, COND_WRITE, READ_WRITE, READ_COND_WRITE

FORMATTER = iced_x86.Formatter(iced_x86.FormatterSyntax.GAS)
_INFO = iced_x86.InstructionInfoFactory()


class IcedAdapter:
    """iced-x86 behind ``protocol.DetailDecoder``."""

    name = "iced"
    fields = frozenset({"length", "disp", "imm", "target"})
    details = frozenset(Detail._fields)

    def version(self) -> str:
        return version()

    def decode_many(self, items):
        return [gate_facts(raw, address) for address, raw in items]

    def detail(self, raw: bytes, address: int) -> Detail | None:
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
        text = FORMATTER.format(ins)
        mnemonic, _, op_str = text.partition(" ")
        flow = _ICED_FLOW.get(ins.flow_control, "next")
        target = None
        if flow in ("unconditional_branch", "conditional_branch", "call", "xbegin_xabort_xend") \
                and ins.near_branch_target:
            target = ins.near_branch_target & MASK64
        if flow == "xbegin_xabort_xend" and not ins.mnemonic == iced_x86.Mnemonic.XBEGIN:
            target = None
        answer = DecoderAnswer(
            "iced",
            ins.len,
            co.displacement_offset if co.has_displacement else 0,
            co.displacement_size if co.has_displacement else 0,
            co.immediate_offset if co.has_immediate else 0,
            co.immediate_size if co.has_immediate else 0,
            text,
        )
        return Detail(
            answer=answer,
            mnemonic=mnemonic,
            op_str=op_str.strip(),
            reads=frozenset(reads),
            writes=frozenset(writes),
            opname=_ICED_MNEMONIC.get(ins.mnemonic, mnemonic),
            condition=None if ins.condition_code == 0 else _ICED_CC[ins.condition_code],
            far=bool(ins.is_call_far or ins.is_call_far_indirect or ins.is_jmp_far or ins.is_jmp_far_indirect
                     or _ICED_MNEMONIC.get(ins.mnemonic) == "retf"),
            flow=flow,
            branch_target=target,
            memory=_iced_memory(ins, raw, co, info),
            privileged=bool(ins.is_privileged),
            imm2=(co.immediate_offset2, co.immediate_size2) if co.has_immediate2 else (0, 0),
        )


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


def version() -> str:
    return getattr(iced_x86, "__version__", "1.21.0")


# --- the gate's Facts ------------------------------------------------------------

_GATE_BRANCH_FLOW = frozenset({iced_x86.FlowControl.UNCONDITIONAL_BRANCH, iced_x86.FlowControl.CONDITIONAL_BRANCH,
                               iced_x86.FlowControl.CALL})


def gate_facts(raw: bytes, address: int):
    """iced-x86's answer as a ``protocol.Facts``; xbegin's target counts as a branch target."""
    dec = iced_x86.Decoder(64, raw, ip=address)
    ins = dec.decode()
    if ins.is_invalid or dec.last_error != 0:
        return error(f"iced: {_ICED_ERRORS.get(dec.last_error, 'invalid instruction')}")
    return _sweep_fact(dec, ins, address)


_NEAR_BRANCH_KINDS = frozenset({iced_x86.OpKind.NEAR_BRANCH16, iced_x86.OpKind.NEAR_BRANCH32,
                                iced_x86.OpKind.NEAR_BRANCH64})
_ICED_ERRORS = {1: "invalid instruction", 2: "no more bytes (truncated instruction)"}


def sweep_into(data: bytes, ip: int, samples: dict, facts: dict) -> int:
    """Sweep ``data`` at ``ip`` linearly, counting each instruction's bytes into
    ``samples`` (bytes -> [first address, occurrences]); returns how many.

    The spans are exactly ``image.functions.iter_instruction_spans``'s (the
    same decoder, the same loop: the decoder's position is ``position``).
    For each new valid string, ``facts`` gets ``gate_facts(raw, address)``
    computed from the sweep's own decode, which is sound because iced-x86
    decodes an instruction from its own bytes alone.  An invalid span gets
    none (``gate_facts`` on its bytes alone may say why differently)."""
    decoder = iced_x86.Decoder(64, data, ip=ip)
    decode_out = decoder.decode_out
    ins = iced_x86.Instruction()
    get = samples.get
    position = count = 0
    size = len(data)
    while position < size:
        decode_out(ins)
        end = position + ins.len
        raw = data[position:end]
        seen = get(raw)
        if seen is None:
            address = ip + position
            samples[raw] = [address, 1]
            if not ins.is_invalid:
                facts[raw] = _sweep_fact(decoder, ins, address)
        else:
            seen[1] += 1
        position = end
        count += 1
    return count


def _sweep_fact(decoder, ins, address: int):
    co = decoder.get_constant_offsets(ins)
    target = None
    if (ins.flow_control in _GATE_BRANCH_FLOW or ins.mnemonic == _XBEGIN) and ins.op0_kind in _NEAR_BRANCH_KINDS:
        target = (ins.near_branch_target - address) & MASK64
    # Facts' own __new__ is a Python function (its defaults): built as a tuple, it costs a third
    return _new(Facts, (ins.len, None, co.displacement_offset if co.has_displacement else None, co.displacement_size,
                        co.immediate_offset if co.has_immediate else None, co.immediate_size, target, None,
                        _REPORTED_ALL))


_XBEGIN = iced_x86.Mnemonic.XBEGIN
_REPORTED_ALL = Facts().unreported
_new = tuple.__new__
