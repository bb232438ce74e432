"""One decoder protocol: every decoder (capstone, iced-x86, VEX, objdump, an external command, the
kernel's own ``insn_decode``) is one class behind ``protocol.Decoder``, and the pipeline's cross-checked
decode asks capstone and iced-x86 through the same objects (``protocol.DetailDecoder.detail``).
Real decoders only."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from relocverify.corpus import runner as corpus
from relocverify.x86 import decode as pipeline
from relocverify.x86.decode import decode, decoder_versions
from relocverify.x86.decoders.adapters import NAMES, get_adapter
from relocverify.x86.decoders.capstone import CapstoneAdapter
from relocverify.x86.decoders.external import ExternalAdapter
from relocverify.x86.decoders.iced import IcedAdapter
from relocverify.x86.decoders.objdump import ObjdumpAdapter
from relocverify.x86.decoders.protocol import FIELDS, Adapter, Decoder, Detail, DetailDecoder, Facts
from relocverify.x86.decoders.vex import VexAdapter
from relocverify.x86.instruction import Instruction

ROOT = Path(__file__).resolve().parent.parent
A = 0xFFFFFFFF81234560
ICED_CMD = f"{sys.executable} {Path(__file__).resolve().parent / 'gate_decoders' / 'iced_decoder.py'}"
FACTS = corpus.load([ROOT / "corpora" / "decoder_facts.toml", ROOT / "corpora" / "instructions.toml"])

#: Instructions every decoder decodes alike, on the fields it reports.
COMMON = [bytes.fromhex(h) for h in (
    "55",                    # push %rbp
    "f0ff0510000000",        # lock incl 0x10(%rip): disp 3:4
    "813d1000000078563412",  # cmpl $imm32, disp(%rip): the immediate after the displacement
    "e810000000",            # call rel32
    "7410",                  # je rel8
    "488b4508",              # mov 8(%rbp), %rax
    "c3",                    # ret
)]
#: Byte strings some decoder cannot decode: an answer, never an exception.
ODD = [bytes.fromhex(h) for h in ("ffff", "0f", "c4", "06", "f0")]


def _linux_insn():
    """The kernel's decoder built from Debian's linux-source-6.1 (``tests/test_linux_insn.py``'s way)."""
    from conftest import ensure_linux_source

    ensure_linux_source("6.1")
    return get_adapter("linux-insn@6.1")


@pytest.fixture(scope="module")
def linux_insn():
    return _linux_insn()


@pytest.fixture(scope="module")
def decoders():
    """Every decoder; the kernel's only where its source can be had here (its own test says why not)."""
    found = [CapstoneAdapter(), IcedAdapter(), VexAdapter(), ObjdumpAdapter(), ExternalAdapter(ICED_CMD)]
    try:
        found.append(_linux_insn())
    except pytest.skip.Exception:
        pass
    return found


# ------------------------------------------------------------------ the protocol


def test_every_decoder_is_one_class_behind_the_protocol(decoders):
    assert Adapter is Decoder
    assert {d.name for d in decoders} >= set(NAMES) | {"external"}
    for d in decoders:
        assert isinstance(d, Decoder), d.name
        assert isinstance(d.version(), str) and d.version(), d.name
        assert d.fields and d.fields <= set(FIELDS), d.name
        answers = d.decode_many([(A + 16 * i, raw) for i, raw in enumerate(COMMON + ODD)])
        assert len(answers) == len(COMMON + ODD) and all(type(f) is Facts for f in answers), d.name
        assert d.decode_many([]) == [], d.name


def test_the_kernels_decoder_is_behind_the_protocol(linux_insn):
    assert isinstance(linux_insn, Decoder) and not isinstance(linux_insn, DetailDecoder)
    assert linux_insn.version().startswith("6.1.")


def test_the_registry_gives_the_classes_the_pipeline_uses():
    for name in NAMES:
        assert isinstance(get_adapter(name), Decoder)
    assert type(get_adapter("capstone")) is type(pipeline.PRIMARY) is CapstoneAdapter
    assert type(get_adapter("iced")) is type(pipeline.CROSS_CHECK) is IcedAdapter
    assert decoder_versions() == {d.name: d.version() for d in (pipeline.PRIMARY, pipeline.CROSS_CHECK)}


def test_every_decoder_answers_common_instructions_as_iced_does_on_the_fields_it_reports(decoders):
    items = [(A + 32 * i, raw) for i, raw in enumerate(COMMON)]
    iced = IcedAdapter().decode_many(items)
    for d in decoders:
        for (address, raw), mine, theirs in zip(items, d.decode_many(items), iced):
            assert mine.ok, (d.name, raw.hex(), mine)
            for field in sorted((d.fields - mine.unreported) & {"length", "disp", "imm", "target"}):
                assert mine.field(field) == theirs.field(field), (d.name, raw.hex(), field)


def test_only_capstone_and_iced_give_the_pipelines_detail(decoders):
    assert [d.name for d in decoders if isinstance(d, DetailDecoder)] == ["capstone", "iced"]
    for d in decoders[:2]:
        assert {"answer", "mnemonic", "op_str"} <= d.details <= set(Detail._fields)


@pytest.mark.parametrize("decoder", [CapstoneAdapter(), IcedAdapter()], ids=lambda d: d.name)
def test_detail_and_decode_many_of_one_class_tell_one_story(decoder):
    """The pipeline's answer and the gate's, from the same object, agree on length and field positions;
    a field outside ``details`` holds its default; bytes it cannot decode are None, never a raise."""
    for entry in FACTS:
        raw, address = entry.raw, entry.at
        detail, facts = decoder.detail(raw, address), decoder.decode_many([(address, raw)])[0]
        if detail is None:
            assert not facts.ok, (entry.id, facts)
            continue
        assert type(detail) is Detail and detail.answer.decoder == decoder.name
        assert facts.ok and facts.length == detail.answer.length, entry.id
        assert (facts.disp_size, facts.imm_size) == (detail.answer.disp_size, detail.answer.imm_size), entry.id
        if facts.disp_size:
            assert facts.disp_offset == detail.answer.disp_offset, entry.id
        if facts.imm_size:
            assert facts.imm_offset == detail.answer.imm_offset, entry.id
        if "branch_target" in decoder.details and facts.target_delta is not None:
            assert detail.branch_target == facts.target(address), entry.id
        for name in set(Detail._fields) - decoder.details:
            assert getattr(detail, name) == Detail._field_defaults[name], (entry.id, name)
    for raw in ODD:
        decoder.detail(raw, A)


# ------------------------------------------------------------------ the pipeline goes through them


def _through_the_adapters(raw: bytes, address: int) -> None:
    out = decode(raw, address)
    cs, ic = pipeline.PRIMARY.detail(raw[:15], address), pipeline.CROSS_CHECK.detail(raw[:15], address)
    if out.answers:  # none only when the layout parser, not a decoder, gave up
        assert out.answers == (cs.answer if cs else pipeline.NO_PRIMARY,
                               ic.answer if ic else pipeline.NO_CROSS_CHECK), raw.hex()
    if not isinstance(out, Instruction):
        return
    assert out.length == ic.answer.length
    assert (out.opname, out.condition, out.far, out.flow, out.branch_target, out.memory, out.privileged) == (
        ic.opname, ic.condition, ic.far, ic.flow, ic.branch_target, ic.memory, ic.privileged)
    assert (out.disp_offset, out.disp_size, out.imm_offset, out.imm_size) == (
        ic.answer.disp_offset, ic.answer.disp_size, ic.answer.imm_offset, ic.answer.imm_size)
    assert (out.imm2_offset, out.imm2_size) == ic.imm2
    assert set(out.regs_read) == ic.reads | (cs.reads if cs else frozenset())
    assert set(out.regs_written) == ic.writes | (cs.writes if cs else frozenset())
    text = cs if cs is not None and not out.notes else ic
    assert (out.mnemonic, out.op_str) == (text.mnemonic, text.op_str)


@pytest.mark.parametrize("entry", FACTS, ids=lambda e: e.id)
def test_decode_is_the_adapters_answers_cross_checked(entry):
    _through_the_adapters(entry.raw, entry.at)


@settings(max_examples=300, deadline=None)
@given(raw=st.binary(min_size=1, max_size=15), address=st.integers(0, 2**64 - 1))
def test_decode_is_the_adapters_answers_on_any_bytes(raw, address):
    _through_the_adapters(raw, address)


def _capstone_through_the_binding(raw: bytes, address: int) -> Detail | None:
    """What ``CapstoneAdapter.detail`` answered through capstone's Python binding (``Cs.disasm``, ``CsInsn``)
    before it read cs_disasm's buffer itself."""
    import capstone

    from relocverify.x86.decoders.capstone import _CS
    from relocverify.x86.instruction import DecoderAnswer

    try:
        ins = next(_CS.disasm(raw, address, 1), None)
    except capstone.CsError:
        return None
    if ins is None:
        return None
    answer = DecoderAnswer("capstone", ins.size, ins.disp_offset, ins.disp_size, ins.imm_offset, ins.imm_size,
                           f"{ins.mnemonic} {ins.op_str}".strip())
    return Detail(answer, ins.mnemonic, ins.op_str)


@settings(max_examples=2000, deadline=None)
@given(raw=st.binary(min_size=1, max_size=15), address=st.integers(0, 2**64 - 1))
def test_capstones_detail_read_from_its_buffer_is_the_bindings(raw, address):
    assert CapstoneAdapter().detail(raw, address) == _capstone_through_the_binding(raw, address)


@pytest.mark.parametrize("entry", FACTS, ids=lambda e: e.id)
def test_capstones_detail_read_from_its_buffer_is_the_bindings_on_the_corpus(entry):
    assert CapstoneAdapter().detail(entry.raw, entry.at) == _capstone_through_the_binding(entry.raw, entry.at)
