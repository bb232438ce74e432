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

Both decoders are asked through the one decoder protocol
(``decoders.protocol.DetailDecoder.detail``): ``PRIMARY`` and
``CROSS_CHECK`` are the same adapter objects the decoder gate judges.
"""

from __future__ import annotations

from functools import lru_cache

from .decoders.capstone import CapstoneAdapter
from .decoders.iced import IcedAdapter
from .decoders.known_bugs import KNOWN_DECODER_BUGS, agree
from .decoders.protocol import DetailDecoder
from .instruction import Decoded, DecoderAnswer, Disagreement, Instruction, Undecodable
from .layout import MAX_INSN, layout
from .registers import MASK64

#: The primary decoder: the mnemonic and operand text.
PRIMARY: DetailDecoder = CapstoneAdapter()
#: The cross-checking decoder: length and field positions agreed with ``PRIMARY``;
#: operation name, flow, branch target, memory operand and registers from it alone.
CROSS_CHECK: DetailDecoder = IcedAdapter()
#: Their answers when they cannot decode the bytes.
NO_PRIMARY = DecoderAnswer(PRIMARY.name, None)
NO_CROSS_CHECK = DecoderAnswer(CROSS_CHECK.name, None)

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
    ic = CROSS_CHECK.detail(raw, address)
    cs = PRIMARY.detail(raw, address)
    answers = tuple(a.answer for a in (cs, ic) if a is not None)
    if ic is None and cs is None:
        return Undecodable(address, raw[:1], "no decoder could decode these bytes",
                           (NO_PRIMARY, NO_CROSS_CHECK))
    if ic is None:
        return Disagreement(address, raw[:cs.answer.length],
                            "capstone decodes these bytes but iced-x86 finds them invalid",
                            (cs.answer, NO_CROSS_CHECK))
    notes: tuple[str, ...] = ()
    if cs is None or not agree(cs.answer, ic.answer, ic.imm2):
        bug = next((b for b in KNOWN_DECODER_BUGS if b.matches(raw, cs and cs.answer, ic.answer)), None)
        if bug is None:
            what = "capstone cannot decode these bytes" if cs is None else "capstone and iced-x86 disagree"
            length = ic.answer.length
            answers = answers if cs is not None else (NO_PRIMARY, ic.answer)
            return Disagreement(address, raw[:length], what, answers)
        notes = (f"{bug.name}: {bug.reason}",)
        if cs is None:
            answers = (NO_PRIMARY, ic.answer)
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
    return {PRIMARY.name: PRIMARY.version(), CROSS_CHECK.name: CROSS_CHECK.version()}
