"""capstone 5: the primary decoder's length, field offsets and AT&T text."""

from __future__ import annotations

from dataclasses import dataclass

import capstone

from ..instruction import DecoderAnswer

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


def facts(raw: bytes, address: int) -> _CapstoneFacts | None:
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


def version() -> str:
    return capstone.__version__
