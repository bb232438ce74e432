"""proof.lifted: the native walk of libVEX's block (proof/irsb_walk.c) against the reference.

The reference is ``canonical.canon_block`` and ``canonical.ir_facts`` over the objects ``pyvex.lift``
builds (through ``lift.lift``).  For every block, both must give the same size, the same lifter-check
facts and the same canonical form, or raise the same exception with the same message at the same
point, with the same exit targets resolved before it (a resolver that raises, a qword folded)."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from relocverify.proof import lift as L
from relocverify.proof import lifted as lifted_module
from relocverify.proof.canonical import NotApplicable, canon_block, ir_facts
from relocverify.proof.lifted import lifted

MASK64 = (1 << 64) - 1
CORPORA = Path(__file__).resolve().parent.parent / "corpora"
T = 0xFFFFFFFFC0001000


def _corpus_hexes() -> list[bytes]:
    out = []
    for name in ("instructions.toml", "adversary.toml", "known_bugs.toml"):
        doc = tomllib.loads((CORPORA / name).read_text())
        for entries in doc.values():
            if isinstance(entries, list):
                out += [bytes.fromhex(e["hex"]) for e in entries if isinstance(e, dict) and "hex" in e]
    return out


CORPUS = _corpus_hexes()
addresses = st.one_of(st.integers(0xFFFFFFFF81000000, 0xFFFFFFFF9FFFFFFF), st.integers(0, MASK64),
                      st.sampled_from([0, T, MASK64 - 7]))


def _outcome(lift_it, canon_it):
    """(size, facts, canonical form) or the exception each step raised, as a comparable value."""
    try:
        block, size, facts = lift_it()
    except L.Gap as exc:
        return ("lift raised", type(exc), str(exc))
    calls = []
    try:
        canonical = canon_it(block, calls)
    except (NotApplicable, L.Gap, KeyError) as exc:
        canonical = ("canonical raised", type(exc), str(exc))
    return size, facts, canonical, tuple(calls)


def _pair(code: bytes, at: int, max_inst=None, facts=False, resolve=None, constant=None):
    """(the reference's outcome, the native walk's)."""
    def logged(calls):
        if resolve is None:
            return None

        def r(v):
            calls.append(v)
            return resolve(v)
        return r

    def ref_lift():
        irsb = L.lift(code, at, max_inst=max_inst)
        return irsb, irsb.size, ir_facts(irsb) if facts else None

    def nat_lift():
        got = lifted(code, at, max_inst=max_inst, constant=constant, facts=facts)
        return got, got.size, got.facts

    ref = _outcome(ref_lift, lambda b, calls: canon_block(b, logged(calls) or (lambda v: v), constant))
    nat = _outcome(nat_lift, lambda b, calls: b.canonical(logged(calls)))
    return ref, nat


def test_the_native_walk_is_built_and_used():
    """CI installs the package with its extension; a plain instruction is read natively."""
    assert lifted_module.NATIVE, "relocverify.proof.irsb_walk is not built: pip install -e . needs a C compiler"
    assert lifted(bytes.fromhex("4889442460"), 0xFFFFFFFF8134A37C, max_inst=1)._native is not None


@pytest.mark.parametrize("code", CORPUS, ids=lambda b: b.hex())
def test_corpus_instructions_read_alike(code):
    at = 0xFFFFFFFF8134A37C
    ref, nat = _pair(code, at, max_inst=1, facts=True)
    assert ref == nat
    jump_back = code + b"\xe9" + ((at + len(code) - (T + len(code) + 5)) & 0xFFFFFFFF).to_bytes(4, "little")
    ref, nat = _pair(jump_back, T, resolve=lambda v: at if v == T else v)
    assert ref == nat


def _qword(code: bytes, base: int):
    """The fast path's folding of a trampoline's own qwords, over any bytes: every 8 bytes inside the code."""
    def constant(address: int):
        off = address - base
        return int.from_bytes(code[off:off + 8], "little") if 0 <= off <= len(code) - 8 else None
    return constant


def _resolver(base: int, a: int, code_len: int):
    """A resolver like the fast path's: T -> A, a refusal for some trampoline-internal targets."""
    def resolve(v: int) -> int:
        if v == base:
            return a
        if base < v < base + code_len and v % 3 == 0:
            raise NotApplicable("internal")
        return v
    return resolve


instruction_bytes = st.one_of(
    st.binary(min_size=1, max_size=16),
    st.builds(lambda c, tail: c + tail, st.sampled_from(CORPUS), st.binary(max_size=6)),
    st.builds(lambda c, i, b: c[:i] + bytes([b]) + c[i + 1:], st.sampled_from(CORPUS), st.integers(0, 14),
              st.integers(0, 255)),
)


@settings(max_examples=1500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(instruction_bytes, addresses)
@example(bytes.fromhex("e9 00 00 00 00"), T)
@example(bytes.fromhex("ff 25 00 00 00 00") + (0xFFFFFFFF81000000).to_bytes(8, "little"), T)
@example(bytes.fromhex("0f 05"), 0)  # syscall: a dirty helper is a gap
@example(bytes.fromhex("f3 a4"), T)  # rep movsb: an exit to itself
def test_any_bytes_read_alike(code, at):
    """One instruction with its facts, and the whole block with the fast path's callbacks."""
    ref, nat = _pair(code, at, max_inst=1, facts=True)
    assert ref == nat
    ref, nat = _pair(code, at, resolve=_resolver(at, 0xFFFFFFFF81000000, len(code)), constant=_qword(code, at))
    assert ref == nat


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from(CORPUS), min_size=2, max_size=6), addresses)
def test_blocks_of_instructions_read_alike(insns, at):
    """Several instructions lifted as one block (a jump probe's piece, a rewritten trampoline)."""
    code = b"".join(insns)
    ref, nat = _pair(code, at, resolve=_resolver(at, 0xFFFFFFFF81000000, len(code)), constant=_qword(code, at))
    assert ref == nat


@pytest.mark.slow
def test_every_instruction_shape_of_the_kernel_reads_alike():
    """Every distinct instance key of the Debian 6.1 cloud kernel: its representative alone with its
    facts, and its plan's trampoline near (a rel32 jump back) and far (``jmp *0(%rip)`` and a qword)."""
    from relocverify.engine.keys import KeyMaker
    from relocverify.image.fetch import fetch
    from relocverify.image.functions import find_functions
    from relocverify.image.loader import load_image
    from relocverify.plan.plan import PlanKind, make_plan
    from relocverify.x86.decode import decode

    image = load_image(fetch("debian-6.1-cloud").vmlinux)
    keys = KeyMaker(T)
    seen: dict[bytes, tuple[bytes, int]] = {}
    for f in find_functions(image):
        section = image.get_section(f.section)
        data = section.data[f.start - section.address:f.start - section.address + f.size]
        for off, n, key in keys.keys(data, f.start):
            seen.setdefault(key, (data[off:off + n], f.start + off))
    assert len(seen) > 30_000
    far = 0x00007F0000001000
    differ, native = [], 0
    for raw, at in seen.values():
        ref, nat = _pair(raw, at, max_inst=1, facts=True)
        if ref != nat:
            differ.append((raw.hex(), hex(at), "alone"))
        native += lifted_module.lifted_one(raw, at)._native is not None if ref[0] != "lift raised" else 0
        decoded = decode(raw, at)
        for tramp in (T, far):
            plan = make_plan(decoded, tramp)
            if plan.kind is PlanKind.REJECT or not plan.trampoline:
                continue
            code = plan.trampoline
            ref, nat = _pair(code, tramp, resolve=_resolver(tramp, at, len(code)), constant=_qword(code, tramp))
            if ref != nat:
                differ.append((raw.hex(), hex(at), hex(tramp)))
    assert not differ, differ[:10]
    assert native > 0.99 * len(seen), "nearly every kernel instruction is read natively"


def test_without_the_native_walk_every_block_reads_through_pyvex(monkeypatch):
    """The pyvex path (no compiler, a stale build) gives the same answers through ``Lifted``."""
    monkeypatch.setattr(lifted_module, "NATIVE", False)
    at = 0xFFFFFFFF8134A37C
    read = 0
    for code in CORPUS[:60]:
        ref, nat = _pair(code, at, max_inst=1, facts=True)
        assert ref == nat
        if ref[0] != "lift raised":
            assert lifted(code, at, max_inst=1)._native is None
            read += 1
    assert read > 40
