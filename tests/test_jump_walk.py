"""engine.jump_walk: a function's jump probes answered in C, held to ``JumpProver.function``.

``JumpProver.packed`` hands a function to the native walk (``jump_walk.c``) when it is built: the
walk finds each instruction's run, asks the range rules from the function's facts
(``PatchRanges.function_facts``, as ``PatchRanges.refusals`` does), takes the shortcuts (a run of
copies whose pieces are known or derived from their int3 proofs, a call refused from its keys' facts)
and calls back into Python for the rest.  Every answer must be ``function``'s: bucket and reason of
every instruction, the same packed row, the same examples, the same proofs made and learned.

And the derivation (``JumpProver._derived``: a copy piece answered from its instruction's int3 proof,
without proving the piece) must claim only what ``piece_proved`` finds: checked on every piece it
answered, over generated functions and the kernel's."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import TEST_KERNELS
from relocverify.engine.jumps import COPY_LANE, JumpProver, _pack_answers, _Walk, copy_piece_key
from relocverify.engine.keys import KeyMaker
from relocverify.engine.native_rows import JUMP_STATUS, JUMP_WALK
from relocverify.engine.pipeline import Prover
from relocverify.image.functions import Function
from relocverify.kernel.patch_range import (FunctionRanges, IndirectJump, PatchRanges, _extable_refusal,
                                            _indirect_refusal)
from relocverify.kernel.sites import kind_key
from relocverify.plan.block import BlockPlan, plan_block
from relocverify.plan.plan import DEFAULT_TRAMP
from relocverify.plan.policy import POLICIES
from relocverify.proof.block import piece_proved
from relocverify.store.cache import CachedFinding
from relocverify.x86.decode import decode

FAR = 0xFFFFFFFF81000000  # kernel text: every block's trampoline is far (``jumps._far``)
NEAR = DEFAULT_TRAMP - 0x8000  # within the clearance: no composition, every run by the slow path


def test_the_jump_walk_is_built():
    assert JUMP_WALK is not None, JUMP_STATUS


class _Given(PatchRanges):
    """``PatchRanges`` whose facts about a function are given, not read from an image: ``refusals``
    (``function``'s path) and the native walk read the same ``function_facts``."""

    def __init__(self, make):
        self.make = make

    def function_facts(self, function: Function) -> FunctionRanges:
        return self.make(function)


# Instructions of every kind the walk tells apart: copies (kinds b and d, with and without a register
# displacement), relative branches, RIP-relative operands, calls, undecodable bytes, a computed exit.
_PIECES = [bytes.fromhex(h) for h in (
    "55", "4889e5", "53", "5d", "90", "0f1f440000", "488b4718", "4c8b4708", "8b4710", "c3", "31c0",
    "4883ec08", "48c7c001000000", "e800000000", "e8f0ffffff", "ffd0", "41ffd3", "7501", "7502", "75fe", "eb01",
    "e901000000", "488b0500000000", "48890d10000000", "ff2500000000", "06", "0f0b", "f0ff00", "488b042500100000",
    "7500", "7400", "7300", "eb00", "488b05f9ffffff", "75fd", "75fc", "74fb")] + [
    # a RIP-relative operand aimed near the trampoline (within the clearance of ``branch_token``)
    b"\x48\x8b\x05" + (DEFAULT_TRAMP - FAR).to_bytes(4, "little")]

_KINDS = ["alternative", "jump_label", "static_call", "fentry", "retpoline", "extable", "bug", "no-such-kind"]


@st.composite
def _functions(draw):
    """A function's bytes and place, and facts about it: sites over parts of it or all of it, an
    exception-table entry, an indirect jump, pointers and branch targets into it."""
    data = b"".join(draw(st.lists(st.sampled_from(_PIECES), min_size=1, max_size=14)))
    start = draw(st.sampled_from([FAR, FAR + 0x123, NEAR]))
    size = len(data) + draw(st.sampled_from([0, 0, 3]))  # padding past the last instruction
    inside = st.integers(start, start + size - 1)
    points = sorted((a, a + n, kind_key(k), k) for a, n, k in draw(st.lists(
        st.tuples(inside, st.integers(1, 8), st.sampled_from(_KINDS)), max_size=3)))
    cover = draw(st.none() | st.sampled_from(_KINDS))
    pointers = sorted(draw(st.lists(st.tuples(inside, st.integers(0xFFFFFFFF82000000, 0xFFFFFFFF82001000)),
                                    max_size=3)))
    targets = sorted(set(draw(st.lists(inside, max_size=4))))
    extable = draw(st.none() | st.just(0xFFFFFFFF83000010))
    indirect = draw(st.none() | st.sampled_from(["jump-table", "register", "thunk"]))
    sites = draw(st.booleans()) or bool(points) or cover is not None or extable is not None

    def make(fn: Function) -> FunctionRanges:
        jump = None if indirect is None else IndirectJump(start + 1, indirect, "jmp *%rax")
        return FunctionRanges(fn, sites, None if cover is None else (kind_key(cover), cover), points if sites else [],
                              None if extable is None or not sites else _extable_refusal(fn, extable), jump,
                              None if jump is None else _indirect_refusal(fn, jump), pointers, targets)

    skip = set(draw(st.lists(inside, max_size=3)))
    return Function("f", start, start + size, ".text"), data, make, skip


def _int3_findings(data: bytes, start: int, found) -> dict[bytes, CachedFinding]:
    """Each instance key's int3 finding, as the proof cache would give it to ``JumpProver._derived``."""
    prover, out = Prover(DEFAULT_TRAMP, 10.0, None), {}
    for off, n, key in found:
        if key not in out:
            f = prover.verify(data[off:off + n], start + off).finding
            out[key] = CachedFinding(False, f.verdict.value, f.reason, f.method, f.plan_kind, f.rule, f.klass)
    return out


def _provers(ranges, findings):
    return [JumpProver(ranges, DEFAULT_TRAMP, 10.0, POLICIES["kernel"], finding=findings.get) for _ in range(2)]


def _same(a: JumpProver, b: JumpProver, fn: Function, data: bytes, found) -> list[tuple[int, str, str]]:
    """``function``'s answers by ``a``, the walk's by ``b``: equal, with the same work done."""
    want = a.function(fn, data, [(o, n) for o, n, _ in found], [k for _, _, k in found])
    got = _Walk(b, fn, data, found, b.ranges.function_facts(fn)).answers()
    assert got == want
    assert (a.composed, a.calls, a.proofs, a.piece_proofs, a.derived) == \
        (b.composed, b.calls, b.proofs, b.piece_proofs, b.derived)
    assert a.pieces == b.pieces and a.proved == b.proved
    return want


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_functions())
def test_the_walk_answers_every_instruction_as_function_does(case):
    """Generated functions, each answered twice (the second time from the pieces the first learned):
    every bucket and reason the same, the same shortcuts taken, the same proofs made."""
    fn, data, make, _ = case
    found = KeyMaker(DEFAULT_TRAMP).keys(data, fn.start)
    a, b = _provers(_Given(make), _int3_findings(data, fn.start, found))
    for _ in range(2):
        _same(a, b, fn, data, found)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_functions())
def test_the_packed_row_is_the_row_of_function_s_answers(case):
    """``packed`` (the walk) and ``_pack_answers`` of ``function``: the same bytes, the same examples,
    with addresses another function owns left out."""
    fn, data, make, skip = case
    found = KeyMaker(DEFAULT_TRAMP).keys(data, fn.start)
    a, b = _provers(_Given(make), _int3_findings(data, fn.start, found))
    want_examples, got_examples = {"eligible": "known before"}, {"eligible": "known before"}
    want = _pack_answers(7, fn, a.function(fn, data, [(o, n) for o, n, _ in found], [k for _, _, k in found]),
                         skip, want_examples)
    assert b.packed(7, fn, data, found, skip, got_examples) == want
    assert got_examples == want_examples


def _derivations(prover: JumpProver) -> list[tuple[bytes, bytes, int]]:
    """Record (token, bytes, address) of every piece ``prover._derived`` answers true."""
    seen, derived = [], prover._derived

    def recording(token, raw, address):
        ok = derived(token, raw, address)
        if ok:
            seen.append((token, raw, address))
        return ok

    prover._derived = recording
    return seen


def _check_derived(seen) -> int:
    """Every derived piece passes ``piece_proved`` in a real block: the instruction at its address and
    nops after it to fill five bytes (a copy piece's answer is its own, whatever follows it)."""
    for token, raw, address in seen:
        run = [decode(raw, address)] + [decode(b"\x90", address + len(raw) + k) for k in range(max(0, 5 - len(raw)))]
        block = plan_block(run, DEFAULT_TRAMP, POLICIES["kernel"])
        assert isinstance(block, BlockPlan), (raw.hex(), hex(address), block)
        assert copy_piece_key(block, 0, DEFAULT_TRAMP, KeyMaker(DEFAULT_TRAMP)) == (token, COPY_LANE)
        assert piece_proved(block, 0), (raw.hex(), hex(address))
    return len(seen)


_COPIES = [bytes.fromhex(h) for h in ("55", "4889e5", "53", "90", "488b4718", "4c8b4708", "8b4710", "31c0",
                                      "4883ec08", "48c7c001000000", "0f1f440000", "4801f8", "f0ff00")]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.sampled_from(_COPIES), min_size=2, max_size=8))
def test_a_derived_piece_is_a_piece_that_passes(pieces):
    """Runs of copies whose int3 proofs are known: every piece answered from its proof passes
    ``piece_proved``, and the answers are those of a prover that proves every piece."""
    data = b"".join(pieces) + b"\xc3" * 5
    fn = Function("f", FAR, FAR + len(data), ".text")
    found = KeyMaker(DEFAULT_TRAMP).keys(data, FAR)
    ranges = _Given(lambda f: FunctionRanges(f, False, None, [], None, None, None, [], []))
    with_proofs = JumpProver(ranges, DEFAULT_TRAMP, 10.0, POLICIES["kernel"],
                             finding=_int3_findings(data, FAR, found).get)
    seen = _derivations(with_proofs)
    without = JumpProver(ranges, DEFAULT_TRAMP, 10.0, POLICIES["kernel"])
    spans, keys = [(o, n) for o, n, _ in found], [k for _, _, k in found]
    assert with_proofs.function(fn, data, spans, keys) == without.function(fn, data, spans, keys)
    assert with_proofs.derived == len(seen)
    _check_derived(seen)


def test_derivation_is_taken():
    """Not vacuous: a prologue's pieces are answered from their int3 proofs, none proved on its own."""
    data = bytes.fromhex("554889e553488b4718" "9090909090" "c3")
    fn = Function("f", FAR, FAR + len(data), ".text")
    found = KeyMaker(DEFAULT_TRAMP).keys(data, FAR)
    ranges = _Given(lambda f: FunctionRanges(f, False, None, [], None, None, None, [], []))
    prover = JumpProver(ranges, DEFAULT_TRAMP, 10.0, POLICIES["kernel"], finding=_int3_findings(data, FAR, found).get)
    answers = prover.function(fn, data, [(o, n) for o, n, _ in found], [k for _, _, k in found])
    assert [b for _, b, _ in answers[:5]] == ["eligible"] * 5
    assert prover.derived == 5 and prover.piece_proofs == 0 and prover.proofs == 0


# --- slow: the real Debian 6.1 cloud kernel ------------------------------------------------------

@pytest.fixture(scope="module")
def kernel(debian_kernels):
    from relocverify.engine.jumps import patch_ranges
    from relocverify.engine.site_memo import cached_sites
    from relocverify.image.functions import find_functions
    from relocverify.image.loader import load_image

    kernel, _ = debian_kernels(TEST_KERNELS[0])
    image = load_image(kernel.vmlinux)
    functions = find_functions(image)
    return image, functions, patch_ranges(image, functions, cached_sites(image, None), "kernel")


@pytest.mark.slow
def test_the_walk_answers_the_kernel_s_functions_as_function_does(kernel):
    """Every 60th function of the kernel (about 800, 44 k instructions) with its real range facts and
    the int3 proofs of its instructions, two provers learning as a worker's does: the walk's answers
    are ``function``'s, and every piece derived from an int3 proof passes ``piece_proved``."""
    image, functions, ranges = kernel
    keys, findings, prover = KeyMaker(DEFAULT_TRAMP), {}, Prover(DEFAULT_TRAMP, 10.0, None)
    a, b = _provers(ranges, findings)
    seen = _derivations(a)
    walked = 0
    for fn in functions[::60]:
        section = image.get_section(fn.section)
        data = section.data[fn.start - section.address:fn.end - section.address]
        found = keys.keys(data, fn.start)
        for off, n, key in found:
            if key not in findings:
                f = prover.verify(data[off:off + n], fn.start + off).finding
                findings[key] = CachedFinding(False, f.verdict.value, f.reason, f.method, f.plan_kind, f.rule, f.klass)
        if found:
            _same(a, b, fn, data, found)
            walked += len(found)
    assert walked > 30_000 and a.composed > 10_000 and a.calls > 1_000
    assert _check_derived(seen) > 500
