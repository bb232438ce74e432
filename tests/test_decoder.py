"""The cross-checked decoder: the decoder-facts corpus, and invariants over random bytes."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from relocverify.corpus import runner as corpus
from relocverify.x86.decode import decode
from relocverify.x86.decoders.known_bugs import KNOWN_DECODER_BUGS
from relocverify.x86.layout import MAX_INSN, layout
from relocverify.x86.instruction import Disagreement, Instruction, Undecodable
from relocverify.x86.layout import LEGACY_PREFIXES

MASK64 = 0xFFFFFFFFFFFFFFFF
A = 0xFFFFFFFF81234560
FACTS_PATH = Path(__file__).resolve().parent.parent / "corpora" / "decoder_facts.toml"
FACTS = corpus.load([FACTS_PATH])

any_address = st.integers(0, MASK64)


def _signed(v: int, bits: int) -> int:
    v &= (1 << bits) - 1
    return v - (1 << bits) if v >> (bits - 1) else v


# ---------------------------------------------------------------------------
# The decoder-facts corpus
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("entry", FACTS, ids=lambda e: e.id)
def test_decoder_facts(entry):
    result = corpus.run_entry(entry, prove=False)
    assert result.ok, corpus.render_result(result)


def test_every_known_decoder_bug_has_a_fact():
    noted = {e.get("note") for e in FACTS}
    assert {b.name for b in KNOWN_DECODER_BUGS} <= noted


@pytest.mark.parametrize("hx", ["0f01e8", "f30f01fe", "f20f01ff", "c4e27849c0"])
def test_capstone_gaps_are_decoded_by_iced(hx):
    d = decode(bytes.fromhex(hx), A)
    assert isinstance(d, Instruction) and d.length == len(hx) // 2
    assert d.notes and d.notes[0].startswith("capstone-missing-insn")
    assert [a.decoder for a in d.answers] == ["capstone", "iced"] and d.answers[0].length is None


# ---------------------------------------------------------------------------
# Invariants
# ---------------------------------------------------------------------------


def check_instruction(d: Instruction, raw: bytes) -> None:
    assert 1 <= d.length == len(d.raw) <= MAX_INSN
    assert raw.startswith(d.raw)
    for off, size in ((d.disp_offset, d.disp_size), (d.imm_offset, d.imm_size), (d.imm2_offset, d.imm2_size)):
        assert size in (0, 1, 2, 4, 8)
        assert size == 0 or d.opcode_offset < off and off + size <= d.length
    if d.disp_size and d.imm_size:
        assert d.disp_offset + d.disp_size <= d.imm_offset, "the immediate comes after the displacement"
    # the legacy prefixes, in order; a REX among them (ignored by the CPU) is not one of them
    head = bytes(b for b in d.raw[:d.opcode_offset - len(d.vex)] if not 0x40 <= b <= 0x4F)
    assert head == d.prefixes and all(p in LEGACY_PREFIXES for p in d.prefixes)
    assert d.opcode_offset < d.length and d.raw[d.opcode_offset:d.opcode_offset + len(d.opcode)] == d.opcode
    if d.modrm_offset is not None:
        assert d.opcode_offset < d.modrm_offset < d.length
    if d.rip_relative:
        assert d.disp_size == 4 and d.rip_target is not None
        mask = 0xFFFFFFFF if d.addrsize else MASK64
        assert d.rip_target == (d.end + d.displacement) & mask
    if d.branch_target is not None:
        assert 0 <= d.branch_target <= MASK64
        if d.flow in ("unconditional_branch", "conditional_branch", "call") and d.imm_size in (1, 4):
            rel = _signed(int.from_bytes(d.raw[d.imm_offset:d.imm_offset + d.imm_size], "little"), 8 * d.imm_size)
            assert d.branch_target == (d.end + rel) & MASK64, "branch targets are sign-extended and masked"
    for b in (0xF0, 0xF2, 0xF3):
        if d.raw[:1] == bytes([b]):
            assert b in d.prefixes, f"{b:#x} at the start of {d.raw.hex()} is not in .prefixes"


@settings(max_examples=3000, deadline=None)
@given(raw=st.binary(max_size=15), address=any_address)
@example(raw=b"", address=0)
@example(raw=b"\xf0", address=A)
@example(raw=b"\x0f\xb9", address=A)
@example(raw=b"\xe9\x00\x00\x00\x80", address=MASK64 - 2)
def test_decode_never_raises(raw, address):
    d = decode(raw, address)
    assert isinstance(d, (Instruction, Undecodable, Disagreement))
    assert d.address == address & MASK64
    if isinstance(d, Instruction):
        check_instruction(d, raw)
    else:
        assert d.reason and len(d.raw) <= max(len(raw), 1)


@settings(max_examples=500, deadline=None)
@given(raw=st.binary(min_size=1, max_size=15), address=any_address)
def test_decode_is_deterministic_and_ignores_trailing_bytes(raw, address):
    d = decode(raw, address)
    again = decode(raw + b"\x90\xcc", address)
    if isinstance(d, Instruction) and len(raw) < MAX_INSN:
        assert isinstance(again, Instruction) and again.raw == d.raw
    assert decode(raw, address) == d


LOCKABLE_RIP = ["ff0500000000", "480fb10d10000000", "480fc10510000000", "8305100000000001",
                "800d1000000001", "48871d10000000", "0fc70d10000000", "480fab0510000000"]


@pytest.mark.parametrize("hx", LOCKABLE_RIP)
def test_lock_prefix_is_part_of_the_instruction(hx):
    rest = bytes.fromhex(hx)
    plain = decode(rest, A)
    locked = decode(b"\xf0" + rest, A)
    assert isinstance(plain, Instruction) and isinstance(locked, Instruction)
    assert locked.length == plain.length + 1 and locked.prefixes == b"\xf0" and locked.lock
    assert locked.opname == plain.opname
    assert (locked.disp_offset, locked.disp_size) == (plain.disp_offset + 1, 4)
    assert locked.rip_target == plain.rip_target + 1


@settings(max_examples=1500, deadline=None)
@given(prefix=st.sampled_from([b"\xf0", b"\xf2", b"\xf3"]), rest=st.binary(min_size=1, max_size=14),
       address=any_address)
@example(prefix=b"\xf3", rest=b"\xc3", address=A)
@example(prefix=b"\xf0", rest=bytes.fromhex("ff0500000000"), address=A)
def test_prefix_is_never_a_one_byte_instruction(prefix, rest, address):
    """LOCK/REP/REPNE + instruction decodes as one longer instruction or not at all, never as the prefix alone."""
    d = decode(prefix + rest, address)
    if isinstance(d, Instruction):
        assert d.length > 1 and d.prefixes[:1] == prefix
    inner = decode(rest, address)
    if prefix in (b"\xf3", b"\xf2") and isinstance(d, Instruction) and isinstance(inner, Instruction) \
            and inner.opname in ("ret", "movsb", "movsq", "stosb", "stosq", "scasb", "cmpsb", "lodsb"):
        assert d.length == inner.length + 1 and d.opname == inner.opname


def test_rep_ret_is_two_bytes():
    d = decode(b"\xf3\xc3", A)
    assert isinstance(d, Instruction) and d.length == 2 and d.rep and d.opname == "ret"


@pytest.mark.parametrize("hx, opcode, prefix", [("41 2e 74 10", "74", 0x2E), ("40 64 70 00", "70", 0x64),
                                                 ("48 66 8b 05 10 00 00 00", "8b", 0x66),
                                                 ("40 f0 ff 05 00 00 00 00", "ff", 0xF0)])
def test_rex_before_a_legacy_prefix_is_ignored(hx, opcode, prefix):
    """A REX byte counts only right before the opcode (SDM 2.2.1); one followed by a legacy
    prefix is ignored.  decoders.layout took such a REX for the REX and the next prefix for the opcode."""
    raw = bytes.fromhex(hx.replace(" ", ""))
    d = decode(raw, A)
    assert isinstance(d, Instruction)
    assert d.opcode.hex()[-2:] == opcode, f"opcode {d.opcode.hex()} at offset {d.opcode_offset}"
    assert prefix in d.prefixes
    assert d.rex is None
    lay = layout(raw)
    assert lay.opcode.hex()[-2:] == opcode


def test_undecodable_and_disagreement_are_values():
    u = decode(b"\xff", A)
    assert isinstance(u, Undecodable) and u.length == 1
    g = decode(bytes.fromhex("0fff00"), A)
    assert isinstance(g, Disagreement) and {a.length for a in g.answers} == {2, 3}


@settings(max_examples=400, deadline=None)
@given(st.binary(min_size=1, max_size=15), st.binary(min_size=15, max_size=15), st.integers(0, (1 << 64) - 1))
def test_field_values_do_not_change_the_decode_structure(raw, other, address):
    """What the engine's instance keys rest on (engine.keys): instances whose bytes differ only
    in displacement and immediate values decode to the same length, field offsets, operation and
    encoding, and the two decoders agree or disagree alike; only the representative is decoded."""
    first = decode(raw, address)
    if not isinstance(first, Instruction):
        return
    b = bytearray(first.raw)
    for k in range(len(b)):
        if field_k(first, k):
            b[k] = other[k]
    again = decode(bytes(b), address)
    assert type(again) is type(first)
    if isinstance(again, Instruction):
        fields = ("length", "disp_offset", "disp_size", "imm_offset", "imm_size", "opname", "encoding", "prefixes",
                  "modrm_offset", "sib_offset", "rip_relative", "flow", "notes")
        assert [getattr(again, f) for f in fields] == [getattr(first, f) for f in fields]


def field_k(d: Instruction, k: int) -> bool:
    return (d.disp_size and d.disp_offset <= k < d.disp_offset + d.disp_size) or \
        (d.imm_size and d.imm_offset <= k < d.imm_offset + d.imm_size) or \
        (d.imm2_size and d.imm2_offset <= k < d.imm2_offset + d.imm2_size)


@pytest.mark.slow
def test_field_values_do_not_change_the_decode_structure_on_real_kernel_instructions():
    """The same property over a sample of the real kernel: instances that differ only in their
    displacement and immediate bytes decode alike (length, offsets, operation, agreement)."""
    import random

    from relocverify.image.fetch import fetch
    from relocverify.image.functions import find_functions, iter_instruction_spans
    from relocverify.image.loader import load_image

    fields = ("length", "disp_offset", "disp_size", "imm_offset", "imm_size", "opname", "encoding", "prefixes",
              "modrm_offset", "sib_offset", "rip_relative", "flow", "notes")
    image = load_image(fetch("debian-6.1-cloud").vmlinux)
    functions = random.Random(3).sample(find_functions(image), 2000)
    first: dict[bytes, tuple] = {}
    checked = 0
    for f in functions:
        for at, raw in iter_instruction_spans(image, f):
            d = decode(raw, at)
            if not isinstance(d, Instruction) or not (d.disp_size or d.imm_size):
                continue
            b = bytearray(raw)
            for k in range(len(b)):
                if field_k(d, k):
                    b[k] = 0
            facts = tuple(getattr(d, name) for name in fields)
            if first.setdefault(bytes(b), facts) != facts:
                raise AssertionError(f"{raw.hex()} at {at:#x}: {facts} vs {first[bytes(b)]}")
            checked += 1
    assert checked > 20_000


LLVM_MC = shutil.which("llvm-mc")


@pytest.mark.skipif(LLVM_MC is None, reason="llvm-mc is not installed (Debian package llvm)")
def test_amd_only_encodings_are_reconciled_not_rejected():
    """corpora/amd_only.s (FMA4, XOP, TBM, SSE4a, 3DNow!, SVM ...), assembled by llvm-mc: fewer than 0.5%
    end as 'decoders disagree' (the is4 register byte of W=1 forms, capstone's missing AMD opcodes)."""
    source = Path(__file__).resolve().parent.parent / "corpora" / "amd_only.s"
    attrs = "-mattr=+fma4,+xop,+tbm,+sse4a,+3dnow,+3dnowa,+clzero,+mwaitx,+prfchw,+lzcnt,+popcnt,+rdpid,+wbnoinvd"
    out = subprocess.run([LLVM_MC, "-triple=x86_64", "-show-encoding", attrs, str(source)], capture_output=True,
                         text=True, check=True).stdout
    encodings = [bytes(int(x, 16) for x in e.split(",")) for e in re.findall(r"# encoding: \[(.*?)\]", out)]
    assert len(encodings) > 450
    rejected = [raw.hex() for raw in encodings if isinstance(decode(raw, 0xFFFFFFFF81000000), Disagreement)]
    assert len(rejected) < 0.005 * len(encodings), rejected[:10]
